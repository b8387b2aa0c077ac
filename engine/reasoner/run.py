"""`reason(model, request)`: one reasoner request, read top to bottom as named stages.

validate -> media (read the upload, sample video frames) -> ask (task prompt, streamed decode) ->
read (enhance and describe: the caption; critique: the scores) -> result.

Where the backend decodes under a schema (`constrained`, llguidance installed) the answer is valid by
construction and is asked for once; elsewhere ("repair") it is repaired and retried with feedback.
`ReasonResult.decoding` says which ran.
"""
from __future__ import annotations

import random
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from ..events import Progress
from .caption import MAX_ATTEMPTS, CaptionProblem, EnhanceError, caption_from_answer, feedback
from .events import ReasonerText
from .request import ReasonRequest, validate_reason_request
from .tasks import (CRITIQUE_SCHEMA_SYSTEM, CRITIQUE_SYSTEM, caption_system_prompt, critique_text, describe_text,
                    enhance_text, read_scores)


@dataclass
class ReasonResult:
    task: str
    text: str  # the model's final answer, as it wrote it
    caption: dict | None = None  # enhance and describe: the parsed, schema-valid caption
    caption_kind: str | None = None
    scores: dict[str, int | None] = field(default_factory=dict)  # critique: criterion -> 1..5 or None
    repairs: list[str] = field(default_factory=list)  # what was fixed in the answer to get the caption
    attempts: int = 1
    seed: int = 0
    tokens: int = 0
    prompt_tokens: int = 0
    first_token_s: float | None = None
    seconds: float = 0.0
    decoding: str = "repair"  # "constrained:<library>" (decoded under a schema) | "repair" (free text, read after)


@dataclass(frozen=True)
class Media:
    image: Any = None  # PIL image
    video: Any = None  # inputs.VideoClip


def media_stage(request: ReasonRequest, video_config: dict) -> Media:
    from ..pipeline.media import load_image
    from .inputs import sample_video

    if request.image is not None:
        try:
            return Media(image=load_image(request.image))
        except ValueError as exc:
            raise _field_error("image", exc) from exc
    if request.video is not None:
        try:
            frames, fps = _read_video(request.video, request.video_fps)
        except ValueError as exc:
            raise _field_error("video", exc) from exc
        return Media(video=sample_video(frames, fps, video_config))
    return Media()


def _field_error(name: str, exc: Exception):
    from .request import ReasonRequestError

    message = str(exc)
    return ReasonRequestError(name, message if name in message.lower() else f"{name}: {message}")


def _read_video(source, fps_hint: float | None) -> tuple[list, float]:
    """Frames and their rate: a file's own rate, else the request's `video_fps`, else 24."""
    from ..pipeline.media import load_video

    frames = load_video(source)
    fps = fps_hint
    if fps is None and (isinstance(source, str) or hasattr(source, "__fspath__")):
        import av

        try:
            with av.open(str(source)) as container:
                rate = container.streams.video[0].average_rate
                fps = float(rate) if rate else None
        except (av.FFmpegError, IndexError, OSError):
            fps = None
    return frames, float(fps or 24.0)


class _Asker:
    """Runs one chat turn on the backend, streaming text and progress events."""

    def __init__(self, backend, request: ReasonRequest, seed: int, on_progress, cancel):
        self.backend, self.request, self.seed = backend, request, seed
        self.on_progress, self.cancel = on_progress, cancel
        self.started = time.perf_counter()
        self.tokens = self.prompt_tokens = 0
        self.first_token_s: float | None = None
        self._streamed = 0  # tokens this attempt has reported so far

    def _emit(self, text: str, count: int) -> None:
        if self.on_progress is None:
            return
        elapsed = time.perf_counter() - self.started
        self.on_progress(ReasonerText(text=text, tokens=count))
        if count == self._streamed:  # the stream's end flushing held-back text: no new token, no new step
            return
        self._streamed = count
        total = self.request.max_new_tokens
        rate = count / elapsed if elapsed > 0 else None
        self.on_progress(Progress(stage="reason", step=count, total=total, elapsed_s=elapsed,
                                  eta_s=(total - count) / rate if rate else None))

    def __call__(self, system: str | None, text: str, media: Media, schema: dict | None = None) -> str:
        self._streamed = 0
        extra = {} if schema is None else {"schema": schema}  # backends without schemas take no such argument
        out = self.backend.chat(system, text, image=media.image, video=media.video,
                                max_new_tokens=self.request.max_new_tokens, temperature=self.request.temperature,
                                seed=self.seed, on_text=self._emit, cancel=self.cancel, **extra)
        self.tokens += len(out.token_ids)
        self.prompt_tokens = out.prompt_tokens
        if self.first_token_s is None:
            self.first_token_s = out.first_token_s
        return out.text


def caption_stage(ask: _Asker, request: ReasonRequest, media: Media, first_text: str) -> tuple[dict, str, list, int]:
    """Ask for a caption; repair what can be repaired, retry with feedback, at most MAX_ATTEMPTS asks."""
    system = caption_system_prompt(request.caption_kind)
    problems: list[CaptionProblem] = []
    text = first_text
    answer = ""
    for attempt in range(1, MAX_ATTEMPTS + 1):
        if attempt > 1 and ask.on_progress is not None:
            ask.on_progress(ReasonerText(text="", tokens=0, restart=True))
        answer = ask(system, text, media)
        try:
            caption, repairs = caption_from_answer(answer, request.caption_kind)
        except CaptionProblem as problem:
            problems.append(problem)
            text = first_text + "\n\n" + feedback(problem, answer)
            continue
        return caption, answer, repairs, attempt
    raise EnhanceError(request.caption_kind, problems, answer)


def constrained_caption_stage(ask: _Asker, request: ReasonRequest, media: Media,
                              first_text: str) -> tuple[dict, str, list, int]:
    """Ask once, decoding under the caption schema sized to the budget: the answer is a caption."""
    from .schema import caption_schema

    decoded = caption_schema(request.caption_kind, request.max_new_tokens)
    answer = ask(caption_system_prompt(request.caption_kind, decoded), first_text, media, schema=decoded.schema)
    try:
        caption, repairs = caption_from_answer(answer, request.caption_kind)
    except CaptionProblem as problem:  # a schema-valid answer always reads; this names what did not
        raise EnhanceError(request.caption_kind, [problem], answer) from problem
    return caption, answer, repairs, 1


def critique_stage(ask: _Asker, request: ReasonRequest, media: Media, decoding: str) -> tuple[str, dict, str]:
    """The critique's text, its scores and how it was decoded. Under the critique schema where the
    backend constrains and the budget holds the schema; as free text, read line by line, otherwise."""
    import json

    from .schema import SchemaBudgetError, critique_schema, scores_from_critique

    text = critique_text(request.prompt, request.criteria, media.video is not None)
    decoded = None
    if decoding != "repair":
        try:
            decoded = critique_schema(request.criteria, request.max_new_tokens)
        except SchemaBudgetError:
            decoded = None  # too few tokens for the schema: a short free-text critique instead
    if decoded is None:
        answer = ask(CRITIQUE_SYSTEM, text, media)
        return answer, read_scores(answer, request.criteria), "repair"
    answer = ask(CRITIQUE_SCHEMA_SYSTEM, text, media, schema=decoded.schema)
    return answer, scores_from_critique(json.loads(answer), request.criteria), decoding


def reason(model, request: dict | ReasonRequest, on_progress: Callable | None = None,
           cancel: threading.Event | None = None, backend=None) -> ReasonResult:
    """Run a reasoner request on a loaded checkpoint (`engine.load_model`). `backend` replaces the
    checkpoint's Transformers reasoner (tests script one)."""
    from .runtime import reasoner_for

    req = request if isinstance(request, ReasonRequest) else validate_reason_request(request)
    if backend is None:
        if on_progress is not None:
            on_progress(Progress(stage="load", step=0, total=1, elapsed_s=0.0, eta_s=None))
        backend = reasoner_for(model)
    media = media_stage(req, backend.video_config())
    seed = req.seed if req.seed >= 0 else random.SystemRandom().randrange(2**31)
    ask = _Asker(backend, req, seed, on_progress, cancel)
    # Scripted test backends and other stand-ins without `decoding` take free text.
    decoding = backend.decoding() if hasattr(backend, "decoding") else "repair"
    result = ReasonResult(task=req.task, text="", seed=seed, decoding=decoding)
    if req.task == "critique":
        result.text, result.scores, result.decoding = critique_stage(ask, req, media, decoding)
    else:
        first = (enhance_text(req.prompt, media.image is not None) if req.task == "enhance"
                 else describe_text(req.prompt, media.video is not None))
        stage = caption_stage if decoding == "repair" else constrained_caption_stage
        result.caption, result.text, result.repairs, result.attempts = stage(ask, req, media, first)
        result.caption_kind = req.caption_kind
    result.tokens, result.prompt_tokens = ask.tokens, ask.prompt_tokens
    result.first_token_s = ask.first_token_s
    result.seconds = time.perf_counter() - ask.started
    return result
