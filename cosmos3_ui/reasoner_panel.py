"""The reasoner in the Studio: Enhance in every generation tab's caption editor, Describe beside the
uploads, streamed text, Cancel, the reasoner's sampling settings, and the `/reason` scripting API.

Jobs go through the same engine queue as generation (`engine.reason`, requests with a `task` key);
the text arrives as `ReasonerText` events and is shown as it comes. Enhance and Describe fill the
caption editor's JSON and form, which stay editable. A checkpoint without a reasoner keeps the
buttons disabled and says why. Self-contained: `layout` only builds and wires it.
"""
from __future__ import annotations

import json
import logging
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import Any

import gradio as gr

from engine.pipeline import captions
from engine.reasoner import REASON_TABLE, SAMPLING_LIMITS, ReasonerText
from engine.reasoner.runtime import reasoner_status
from engine.events import Cancelled, Failed, Finished, JobCancelled, Queued, Started

from .caption_editor import known
from .common import status_html
from .files import redact
from .jobs import JobFollower, job_events, session_of
from .requests import STYLE_JSON
from .service import StudioError, StudioService

log = logging.getLogger("cosmos3_ui")
PRIVATE = "private"


def availability(service: StudioService, model_name: str) -> tuple[bool, str]:
    """Whether the chosen model's checkpoint has a reasoner, and if not, why (shown under the buttons)."""
    try:
        path = service.info(model_name).path
    except (StudioError, AttributeError) as exc:
        return False, f"No reasoner: {exc}"
    ok, why = reasoner_status(path)
    return ok, ("" if ok else why)


@dataclass
class ReasonerPanel:
    """The Enhance box of one generation tab (built inside the current Blocks context)."""

    mode: str
    kind: str
    note: Any = None
    idea: Any = None
    enhance: Any = None
    cancel: Any = None
    stream: Any = None
    status: Any = None
    max_new_tokens: Any = None
    temperature: Any = None
    seed: Any = None
    describe_image: Any = None
    describe_video: Any = None
    events: list = field(default_factory=list)

    @classmethod
    def build(cls, mode: str, kind: str, available: bool, why: str) -> "ReasonerPanel":
        p = cls(mode, kind)
        row = REASON_TABLE["enhance"]
        with gr.Accordion("Reasoner: enhance an idea into a full caption", open=True, elem_id=f"{mode}-reasoner"):
            p.note = gr.Markdown(why, visible=not available, elem_id=f"{mode}-reasoner-note")
            p.idea = gr.Textbox("", label="Idea (a sentence or two)", lines=2, elem_id=f"{mode}-idea",
                                placeholder="e.g. a red kite climbs over a windy beach at noon")
            with gr.Row():
                p.enhance = gr.Button("Enhance", variant="secondary", interactive=available,
                                      elem_id=f"{mode}-enhance")
                p.cancel = gr.Button("Cancel", size="sm", elem_id=f"{mode}-reasoner-cancel")
            p.stream = gr.Textbox("", label="Reasoner output (as it is written)", lines=4, max_lines=12,
                                  interactive=False, elem_id=f"{mode}-reasoner-stream")
            p.status = gr.HTML("", elem_id=f"{mode}-reasoner-status", padding=False)
            with gr.Accordion("Reasoner sampling", open=False):
                lo, hi = SAMPLING_LIMITS.max_new_tokens
                p.max_new_tokens = gr.Slider(lo, hi, value=row.max_new_tokens, step=1, label="Max new tokens",
                                             elem_id=f"{mode}-reasoner-max-tokens")
                lo, hi = SAMPLING_LIMITS.temperature
                p.temperature = gr.Slider(lo, hi, value=row.temperature, step=0.05,
                                          label="Temperature (0 decodes greedily)", elem_id=f"{mode}-reasoner-temp")
                p.seed = gr.Number(-1, label="Seed (-1 picks one)", precision=0, elem_id=f"{mode}-reasoner-seed")
        return p

    def build_describe(self, has_image: bool, has_video: bool, available: bool) -> None:
        """Describe buttons, placed beside the uploads by the caller."""
        with gr.Row():
            if has_image:
                self.describe_image = gr.Button("Describe the image", size="sm", interactive=available,
                                                elem_id=f"{self.mode}-describe-image")
            if has_video:
                self.describe_video = gr.Button("Describe the video", size="sm", interactive=available,
                                                elem_id=f"{self.mode}-describe-video")

    @property
    def buttons(self) -> list:
        return [b for b in (self.enhance, self.describe_image, self.describe_video) if b is not None]


async def follow_reasoner(service: StudioService, model: str, request: dict, session: str, stages: bool = False):
    """Submit a reasoner request and yield ("text", so_far) while it streams, then ("done", result).
    Refusals and failures raise StudioError; a cancelled job yields ("cancelled", (text so far, tokens)).
    With `stages`, it also yields ("queued", jobs ahead) and ("started", None) when the worker takes the
    job, and each piece of text as ("writing", (so_far, tokens)) instead, for a status line."""
    handle = service.submit(model, request, session)
    text = ""
    async with aclosing(job_events(service.active, handle, session, "The reasoner job ended without a result.")) \
            as events:
        async for job, event in events:
            if isinstance(event, ReasonerText):
                text = "" if event.restart else text + event.text
                job.status.stage, job.status.step = "reason", event.tokens  # what Cancel reports
                # Once Cancel is pressed its note owns the status line: text still in flight only fills the box.
                writing = stages and not job.cancel_requested
                yield ("writing", (text, event.tokens)) if writing else ("text", text)
            elif isinstance(event, (Queued, Started)) and stages:
                yield ("queued", event.position) if isinstance(event, Queued) else ("started", None)
            elif isinstance(event, Finished):
                yield "done", event.result
            elif isinstance(event, Failed):
                raise StudioError(event.message, event.field)
            elif isinstance(event, Cancelled):
                yield "cancelled", (text, job.status.step)


def cancelled_note(tokens: int, unchanged: str) -> str:
    """The one status line of a cancelled reasoner job, whichever of Cancel's handler and the job's own
    handler reports it last."""
    return f"Cancelled after {tokens} token{'' if tokens == 1 else 's'}; {unchanged} is unchanged."


def reasoner_line(jobs, what: str, value, reads: str) -> str:
    """The reasoner's one status line for an event of `follow_reasoner`: queued (position and wait),
    reading (`reads`: what it looks at first), writing (tokens so far)."""
    if what == "queued":
        return status_html(jobs.queued_text(value or 0), "info")
    if what == "started":
        return status_html(f"Reading {reads} ...", "info")
    tokens = value[1]
    return status_html(f"Writing: {tokens} token{'' if tokens == 1 else 's'} so far ...", "info")


async def reasoner_updates(service: StudioService, model: str, request: dict, session: str, box, unchanged: str,
                           done, jobs=None):
    """The updates of one reasoner run shown in `box` (its `stream` and `status`): the status line from
    queued through reading and writing, the text as it is written, then `done(result)`; a cancelled run
    keeps its text and says `unchanged` is unchanged, a refused or failed one says why in the status."""
    jobs = jobs or JobFollower(service)
    reads = "the " + next((k for k in ("image", "video") if request.get(k)), "prompt")
    yield {box.stream: "", box.status: status_html("Sending the job to the reasoner's queue ...", "info")}
    try:
        async for what, value in follow_reasoner(service, model, request, session, stages=True):
            if what in ("queued", "started"):
                yield {box.status: reasoner_line(jobs, what, value, reads)}
            elif what == "writing":
                yield {box.stream: value[0], box.status: reasoner_line(jobs, what, value, reads)}
            elif what == "text":  # after Cancel: the text only
                yield {box.stream: value}
            elif what == "cancelled":
                text, tokens = value
                yield {box.stream: text, box.status: status_html(cancelled_note(tokens, unchanged), "warn")}
            else:
                yield done(value)
    except StudioError as exc:
        yield {box.status: status_html(str(exc), "error")}


def done_note(result) -> str:
    """The status line of a finished Enhance or Describe: tokens, time, seed, and any retries or repairs."""
    return (f"Done: {result.tokens} tokens in {result.seconds:.1f} s, seed {result.seed}"
            + (f", {result.attempts} attempts" if result.attempts > 1 else "")
            + (f"; repaired: {'; '.join(result.repairs)}" if result.repairs else "") + ".")


def reasoner_cancel_outcome(job, unchanged: str, timeout: float = 20.0) -> str:
    """Wait (at most `timeout`) for a cancelled reasoner job to end and say how it ended; `unchanged`
    names what the job would have filled."""
    if job is None:
        return "No reasoner job of yours was running."
    try:
        job.handle.result(timeout=timeout)
    except JobCancelled:
        return cancelled_note(job.status.step, unchanged)
    except TimeoutError:
        return "Cancelling: the reasoner has not stopped yet."
    except Exception as exc:  # noqa: BLE001 - a failure is an ending too
        return f"The reasoner job ended with an error before Cancel reached it: {redact(str(exc))}"
    return "The reasoner job had already finished when Cancel reached it."


def _filled_editor(editor, caption: dict) -> dict:
    """The caption editor showing `caption`: JSON style, JSON text and form, all still editable."""
    text = captions.pretty(caption)
    out = {editor.style: STYLE_JSON, editor.code: text, editor.parsed: known(text, caption), editor.message: "",
           editor.json_group: gr.update(visible=True), editor.prose: gr.update(visible=False)}
    out.update(editor.shown_updates(caption))  # filled, and open again if broken JSON had locked it
    return out


@dataclass
class ActionDescribe:
    """Describe beside the Action tab's uploads: the caption's gist goes into the instruction box."""

    describe_image: Any
    describe_video: Any
    stream: Any
    status: Any
    note: Any
    cancel: Any = None
    events: list = field(default_factory=list)

    @classmethod
    def build(cls, available: bool, why: str) -> "ActionDescribe":
        with gr.Row():
            image = gr.Button("Describe the image", size="sm", interactive=available, elem_id="action-describe-image")
            video = gr.Button("Describe the video", size="sm", interactive=available, elem_id="action-describe-video")
            cancel = gr.Button("Cancel", size="sm", elem_id="action-reasoner-cancel")
        note = gr.Markdown(why, visible=not available, elem_id="action-reasoner-note")
        stream = gr.Textbox("", label="Reasoner output", lines=2, max_lines=8, interactive=False,
                            elem_id="action-reasoner-stream")
        return cls(image, video, stream, gr.HTML("", elem_id="action-reasoner-status", padding=False), note, cancel)

    @property
    def buttons(self) -> list:
        return [self.describe_image, self.describe_video]


def instruction_from(caption: dict) -> str:
    """One line for the Action tab's instruction box: the caption's first action, else its first subject."""
    for key, inner in (("actions", "description"), ("subjects", "description")):
        items = caption.get(key)
        if isinstance(items, list) and items and isinstance(items[0], dict) and items[0].get(inner):
            return str(items[0][inner])
    return str(caption.get("background_setting", ""))


class ReasonerWiring:
    """Events of every panel, the model-picker follow-up, and `/reason`."""

    def __init__(self, service: StudioService, jobs, page):
        self.service, self.jobs, self.page = service, jobs, page

    def wire(self) -> None:
        for tab in self.page.gen_tabs():
            panel = getattr(tab, "reasoner", None)
            if panel is not None:
                self._wire_panel(tab, panel)
        action = getattr(self.page.action, "reasoner", None)
        if action is not None:
            self._wire_action(self.page.action, action)
        for box in [t.reasoner for t in self.page.gen_tabs() if t.reasoner is not None] + ([action] if action else []):
            self._follow_model(box)

    def _follow_model(self, box) -> None:
        service = self.service

        def on_model(name):
            ok, why = availability(service, name)
            return {box.note: gr.update(value=why, visible=not ok), **{b: gr.update(interactive=ok) for b in box.buttons}}

        self.page.model.change(on_model, inputs=self.page.model, outputs=[box.note, *box.buttons], queue=False,
                               api_visibility=PRIVATE)

    def _wire_action(self, tab, box: ActionDescribe) -> None:
        service = self.service

        def runner(source: str):
            async def run(model, upload, request: gr.Request = None):
                if not upload:
                    yield {box.status: status_html(f"Upload a {source} first, then press Describe.", "warn")}
                    return
                req = {"task": "describe", "mode": "action", source: upload}

                def done(result):
                    return {box.stream: result.text, tab.instruction: instruction_from(result.caption),
                            box.status: status_html("Described; edit the instruction as needed.", "ok")}

                async for update in reasoner_updates(service, model, req, session_of(request), box, "the instruction",
                                                     done):
                    yield update
            return run

        for button, source, component in ((box.describe_image, "image", tab.image),
                                          (box.describe_video, "video", tab.video)):
            box.events.append(button.click(runner(source), inputs=[self.page.model, component],
                                           outputs=[box.stream, box.status, tab.instruction], api_visibility=PRIVATE))
        self._wire_cancel(box, "the instruction")

    def _wire_cancel(self, box, unchanged: str) -> None:
        """Cancel stops this session's reasoner job (the engine checks before each token) and ends the
        streaming handler; the status says after how many tokens."""
        service = self.service

        def cancel(request: gr.Request = None):
            job = service.active.cancel(session_of(request))
            return status_html(reasoner_cancel_outcome(job, unchanged), "warn")

        box.cancel.click(cancel, outputs=box.status, cancels=box.events, queue=False, api_visibility=PRIVATE)

    def _wire_panel(self, tab, panel: ReasonerPanel) -> None:
        editor = tab.editor
        outputs = [panel.stream, panel.status, editor.style, editor.code, editor.parsed, editor.message,
                   editor.json_group, editor.prose, editor.form_lock, *editor.form_components]
        service = self.service

        def runner(task: str, source=None):
            async def run(model, idea, max_new, temperature, seed, upload=None, request: gr.Request = None):
                req = {"task": task, "mode": tab.mode, "prompt": idea or "", "max_new_tokens": int(max_new),
                       "temperature": float(temperature), "seed": int(seed if seed is not None else -1)}
                if task == "describe" and not upload:
                    yield {panel.status: status_html(f"Upload a {source} first, then press Describe.", "warn")}
                    return
                if upload:  # Enhance's optional first frame, or what Describe looks at
                    req["image" if task == "enhance" else source] = upload

                def done(result):
                    return {panel.stream: result.text, panel.status: status_html(done_note(result), "ok"),
                            **_filled_editor(editor, result.caption)}

                async for update in reasoner_updates(service, model, req, session_of(request), panel,
                                                     "the caption editor", done):
                    yield update
            return run

        sampling = [self.page.model, panel.idea, panel.max_new_tokens, panel.temperature, panel.seed]
        first_frame = [tab.image] if tab.image is not None else []
        panel.events.append(panel.enhance.click(runner("enhance"), inputs=sampling + first_frame, outputs=outputs,
                                                api_visibility=PRIVATE))
        for button, source, component in ((panel.describe_image, "image", tab.image),
                                          (panel.describe_video, "video", tab.video)):
            if button is not None and component is not None:
                panel.events.append(button.click(runner("describe", source), inputs=sampling + [component],
                                                 outputs=outputs, api_visibility=PRIVATE))
        self._wire_cancel(panel, "the caption editor")


@dataclass
class ReasonApi:
    model: Any
    request: Any
    file: Any
    result: Any
    button: Any

    @classmethod
    def build(cls) -> "ReasonApi":
        with gr.Column(visible=False):
            return cls(gr.Textbox(label="model_name"), gr.Textbox(label="request_json"),
                       gr.File(label="file", file_count="single"), gr.JSON(label="result_json"),
                       gr.Button("reason"))

    def wire(self, service: StudioService) -> None:
        async def reason(model_name: str, request_json: str, file=None, request: gr.Request = None):
            try:
                req = json.loads(request_json or "{}")
            except json.JSONDecodeError as exc:
                raise gr.Error(f"request_json is not JSON: {exc}", print_exception=False) from None
            if not isinstance(req, dict):
                raise gr.Error("request_json must be a JSON object.", print_exception=False)
            for key in ("image", "video"):
                if isinstance(req.get(key), str):
                    raise gr.Error(f"{key} may not name a file; upload it as `file`.", print_exception=False)
            path = getattr(file, "path", None) or (file if isinstance(file, str) else None)
            if path:
                target = "video" if str(path).lower().endswith((".mp4", ".mov", ".webm", ".mkv", ".avi", ".gif")) \
                    else "image"
                req[target] = path
            try:
                async for what, value in follow_reasoner(service, model_name, req, session_of(request)):
                    if what == "cancelled":
                        raise gr.Error("The reasoner job was cancelled.", print_exception=False)
                    if what == "done":
                        return {"task": value.task, "text": value.text, "caption": value.caption,
                                "caption_kind": value.caption_kind, "scores": value.scores,
                                "repairs": value.repairs, "attempts": value.attempts, "seed": value.seed,
                                "tokens": value.tokens, "prompt_tokens": value.prompt_tokens,
                                "first_token_s": value.first_token_s, "seconds": round(value.seconds, 3)}
            except StudioError as exc:
                raise gr.Error(str(exc), print_exception=False) from None
            raise gr.Error("The reasoner job ended without a result.", print_exception=False)

        self.button.click(reason, inputs=[self.model, self.request, self.file], outputs=self.result,
                          api_name="reason",
                          api_description="Run the checkpoint's reasoner. `request_json`: {task: enhance|describe|"
                                          "critique, prompt, mode, max_new_tokens, temperature, seed, criteria}; "
                                          "`file`: the image or video to look at. Returns text, caption (enhance, "
                                          "describe), scores (critique), seed and timings.")
