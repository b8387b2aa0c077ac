"""A reasoner request, validated once into a typed value.

`validate_reason_request(params)` refuses bad input with `ReasonRequestError(field, message)`, an
`engine.RequestError` like a generation request's: `.field` is the request key at fault and the
message names it, quoting what was received and what is allowed. Limits and defaults live in `REASON_TABLE`
and `SAMPLING_LIMITS`, which the UI reads instead of repeating them.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..pipeline.request import RequestError

TASKS = ("enhance", "describe", "critique")
CAPTION_KINDS = ("image", "video")
# Review criteria the critique answers when the request names none.
DEFAULT_CRITERIA = ("prompt_adherence", "physics_plausibility")
MAX_PROMPT_CHARS = 20_000
MAX_SEED = 2**53 - 1


@dataclass(frozen=True)
class SamplingLimits:
    max_new_tokens: tuple[int, int] = (1, 4096)
    temperature: tuple[float, float] = (0.0, 2.0)
    seed: tuple[int, int] = (-1, MAX_SEED)


SAMPLING_LIMITS = SamplingLimits()


@dataclass(frozen=True)
class TaskDefaults:
    max_new_tokens: int
    temperature: float  # 0 decodes greedily
    needs_prompt: bool
    needs_media: bool
    label: str


# One row per task: what it needs and how it samples by default. Enhance and describe get the longest
# budget: their caption schema sizes each text from it (engine.reasoner.schema), and a real model stops
# well before it (~4 characters a token against the schema's worst case of one). Describe and critique
# decode greedily by default so the same upload gives the same text.
REASON_TABLE: dict[str, TaskDefaults] = {
    "enhance": TaskDefaults(4096, 0.7, needs_prompt=True, needs_media=False, label="Enhance"),
    "describe": TaskDefaults(4096, 0.0, needs_prompt=False, needs_media=True, label="Describe"),
    "critique": TaskDefaults(768, 0.0, needs_prompt=True, needs_media=True, label="Critique"),
}


class ReasonRequestError(RequestError):
    """A reasoner request the engine refuses; `.field` is the request key at fault ("" for the
    request as a whole), as for every `engine.RequestError`."""


@dataclass(frozen=True)
class ReasonRequest:
    task: str
    prompt: str
    image: Any  # a path, PIL image or [H, W, 3] array; None when absent
    video: Any  # a path, frame list or [T, H, W, 3] array; None when absent
    video_fps: float | None  # for frame arrays; files carry their own
    caption_kind: str  # "image" | "video": the schema an enhanced caption follows
    criteria: tuple[str, ...]
    max_new_tokens: int
    temperature: float
    seed: int

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


_KEYS = ("task", "prompt", "image", "video", "video_fps", "mode", "caption_kind", "criteria", "max_new_tokens",
         "temperature", "seed")


def _int(params: dict, key: str, default: int, lo: int, hi: int) -> int:
    value = params.get(key, default)
    if value is None:
        value = default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != int(value):
        raise ReasonRequestError(key, f"{key} must be a whole number in {lo}..{hi}, got {value!r}.")
    if not lo <= int(value) <= hi:
        raise ReasonRequestError(key, f"{key} must be in {lo}..{hi}, got {int(value)}.")
    return int(value)


def _float(params: dict, key: str, default: float, lo: float, hi: float) -> float:
    value = params.get(key, default)
    if value is None:
        value = default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
        raise ReasonRequestError(key, f"{key} must be a number in {lo}..{hi}, got {value!r}.")
    if not lo <= float(value) <= hi:
        raise ReasonRequestError(key, f"{key} must be in {lo}..{hi}, got {value!r}.")
    return float(value)


def _caption_kind(params: dict) -> str:
    kind = params.get("caption_kind")
    mode = params.get("mode")
    if kind is None and mode is not None:
        if not isinstance(mode, str):
            raise ReasonRequestError("mode", f"mode must be a generation mode such as 't2v', got {mode!r}.")
        kind = "image" if mode == "t2i" else "video"
    kind = kind or "video"
    if kind not in CAPTION_KINDS:
        raise ReasonRequestError("caption_kind", f"caption_kind must be one of {list(CAPTION_KINDS)}, got {kind!r}.")
    return kind


def _criteria(params: dict) -> tuple[str, ...]:
    value = params.get("criteria")
    if value is None:
        return DEFAULT_CRITERIA
    if isinstance(value, str):
        value = [part.strip() for part in value.split(",")]
    if not isinstance(value, (list, tuple)) or not value or not all(isinstance(v, str) and v.strip() for v in value):
        raise ReasonRequestError("criteria", f"criteria must be a non-empty list of names, got {value!r}.")
    if len(value) > 12:
        raise ReasonRequestError("criteria", f"criteria may name at most 12 criteria, got {len(value)}.")
    return tuple(v.strip() for v in value)


def validate_reason_request(params: dict, info=None) -> ReasonRequest:
    """Check a reasoner request and fill in the task's defaults. With the checkpoint's `info`
    (engine.inspect_checkpoint), one without a reasoner is refused at once, saying why. A ReasonRequest
    given back in is returned as it is (the queue validates once at submit; `reason` runs exactly that)."""
    if info is not None:
        from .runtime import reasoner_status

        present, why = reasoner_status(info.path)
        if not present:
            raise ReasonRequestError("", why)
    if isinstance(params, ReasonRequest):
        return params
    if not isinstance(params, Mapping):
        raise ReasonRequestError("", f"A reasoner request must be a JSON object, got {type(params).__name__}.")
    unknown = sorted(set(params) - set(_KEYS))
    if unknown:
        raise ReasonRequestError(unknown[0], f"Unknown reasoner request key {unknown[0]!r}; allowed: {list(_KEYS)}.")
    task = params.get("task")
    if task not in REASON_TABLE:
        raise ReasonRequestError("task", f"task must be one of {list(TASKS)}, got {task!r}.")
    row = REASON_TABLE[task]
    prompt = params.get("prompt") or ""
    if not isinstance(prompt, str):
        raise ReasonRequestError("prompt", f"prompt must be text, got {type(prompt).__name__}.")
    if len(prompt) > MAX_PROMPT_CHARS:
        raise ReasonRequestError("prompt", f"prompt is {len(prompt)} characters long; at most {MAX_PROMPT_CHARS}.")
    if row.needs_prompt and not prompt.strip():
        what = "the idea to enhance" if task == "enhance" else "the prompt the result was generated from"
        raise ReasonRequestError("prompt", f"{task} needs a prompt ({what}); got an empty one.")
    image, video = params.get("image"), params.get("video")
    if image is not None and video is not None:
        raise ReasonRequestError("video", "image and video were both given; a reasoner request looks at one "
                                          "of them (image, or video).")
    if row.needs_media and image is None and video is None:
        raise ReasonRequestError("image", f"{task} needs an image or a video to look at; got neither "
                                          "(give image, or video).")
    if task == "enhance" and video is not None:
        raise ReasonRequestError("video", "video is not taken by enhance: it takes a prompt and an optional first "
                                          "frame (image).")
    limits = SAMPLING_LIMITS
    fps = params.get("video_fps")
    if fps is not None:
        fps = _float(params, "video_fps", 24.0, 0.1, 240.0)
    kind = _caption_kind(params)
    budget = _int(params, "max_new_tokens", row.max_new_tokens, *limits.max_new_tokens)
    if task != "critique":
        from .schema import SchemaBudgetError, caption_schema

        try:
            caption_schema(kind, budget)
        except SchemaBudgetError as exc:
            raise ReasonRequestError("max_new_tokens", str(exc)) from None
    return ReasonRequest(
        task=task, prompt=prompt.strip(), image=image, video=video, video_fps=fps,
        caption_kind=kind, criteria=_criteria(params), max_new_tokens=budget,
        temperature=_float(params, "temperature", row.temperature, *limits.temperature),
        seed=_int(params, "seed", -1, *limits.seed),
    )


def reason_defaults(task: str) -> dict:
    """Defaults and limits of one task, for forms."""
    if task not in REASON_TABLE:
        raise ReasonRequestError("task", f"task must be one of {list(TASKS)}, got {task!r}.")
    row = REASON_TABLE[task]
    return {"max_new_tokens": row.max_new_tokens, "temperature": row.temperature, "seed": -1,
            "limits": {"max_new_tokens": list(SAMPLING_LIMITS.max_new_tokens),
                       "temperature": list(SAMPLING_LIMITS.temperature), "seed": list(SAMPLING_LIMITS.seed)}}
