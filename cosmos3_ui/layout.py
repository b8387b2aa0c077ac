"""The Studio's page: model picker and variant panel, the three tabs, history, and the scripting API.

Layout and wiring live here; decisions live in plain modules (`controls`, `requests`, `history`,
`service`) that tests use without a server. All generation events share one Gradio concurrency pool
("gpu", one slot) in front of the engine's single worker; the light UI events (caption sync, model
switch, previews) skip the queue and are private, so they are not part of the public API.
"""
from __future__ import annotations

import asyncio
import functools
import logging
import secrets
from dataclasses import dataclass
from typing import Any

import anyio
import gradio as gr

from engine import captions

from . import controls as C
from . import history as H
from .assets import CSS_PATH, example_media, negative_caption
from .caption_editor import CaptionEditor, error_html
from .common import GPU_POOL, PRIVATE, UI_SEED_MAX, status_html
from .plots import actions_from_file, actions_plot
from .requests import (
    STYLE_JSON,
    ActionInputs,
    Sampling,
    action_request,
    image_request,
    negative_from_text,
    prompt_from_editor,
    video_request,
)
from .review_tabs import BatchTab, CompareTab, ReviewTab
from .service import JobWasCancelled, StudioError, StudioService, apply_event, cancel_outcome

log = logging.getLogger("cosmos3_ui")



@dataclass
class SamplingBox:
    """Sampling controls shared by every tab."""

    lock_note: gr.Markdown
    steps: gr.Slider
    guidance: gr.Slider
    flow_shift: gr.Slider
    use_interval: gr.Checkbox | None
    interval_lo: gr.Number | None
    interval_hi: gr.Number | None
    seed: gr.Number
    randomize: gr.Checkbox


@dataclass
class ResultBox:
    status: gr.HTML
    generate: gr.Button
    cancel: gr.Button
    output: Any
    used_seed: gr.Textbox
    downloads: gr.File
    result_json: gr.JSON
    preview: gr.Button
    prompt_view: gr.Textbox
    negative_view: gr.Textbox


@dataclass
class GenTab:
    mode: str  # "t2i" | "t2v"
    kind: str  # caption schema: "image" | "video"
    tab: gr.Tab
    notice: gr.Markdown
    editor: CaptionEditor
    negative: gr.Textbox
    negative_use: gr.Button
    negative_message: gr.HTML
    resolution: gr.Dropdown
    frames: gr.Slider | None
    fps: gr.Number | None
    image: gr.Image | None
    video: gr.Video | None
    sound: gr.Checkbox | None
    sampling: SamplingBox
    result: ResultBox


@dataclass
class ActionTab:
    tab: gr.Tab
    notice: gr.Markdown
    kind: gr.Radio
    kind_note: gr.Markdown
    domain: gr.Dropdown
    domain_note: gr.Markdown
    view_point: gr.Dropdown
    chunk_size: gr.Slider
    tier: gr.Dropdown
    fps: gr.Number
    instruction: gr.Textbox
    image: gr.Image
    video: gr.Video
    actions_file: gr.File
    upload_message: gr.HTML
    sampling: SamplingBox
    result: ResultBox
    plot: gr.Image
    actions_download: gr.File


class Studio:
    """Builds the Blocks for one `StudioService` and launches it."""

    def __init__(self, service: StudioService, *, queue_size: int = 16, state_secret: str | None = None,
                 title: str = "Cosmos3 Studio", review_desk=None, auth: list[tuple[str, str]] | None = None):
        self.service = service
        self.queue_size = queue_size
        self.state_secret = state_secret or secrets.token_hex(32)
        self.title = title
        # Review mode (Review and Batch tabs) only behind a login: app.py refuses to start it without one.
        if review_desk is not None and not auth:
            raise ValueError("Review mode needs a login (auth); it must never be open to the public.")
        self.review_desk = review_desk
        self.auth = auth or None
        names = service.model_names()
        if not names:
            raise ValueError("No models are registered; give at least one --model NAME=SOURCE.")
        self.default_model = names[0]
        self.blocks = self._build()

    # ==========================================================================================
    # Building
    # ==========================================================================================

    def _build(self) -> gr.Blocks:
        first = self.service.describe(self.default_model)
        with gr.Blocks(title=self.title, analytics_enabled=False) as blocks:
            gr.Markdown(
                "# Cosmos3 Studio\nGenerate images, videos and robot actions with NVIDIA Cosmos3. "
                "Controls follow the chosen model: only what it supports is offered.",
                elem_id="studio-header",
            )
            with gr.Row(equal_height=False):
                self.model = gr.Dropdown(
                    C.model_choices(self.service.describe_all()), value=self.default_model, label="Model",
                    interactive=True, scale=1, elem_id="model-picker",
                )
                self.variant = gr.Markdown(C.variant_markdown(first), elem_id="variant-panel")
            self.current_tab = gr.State("t2i")
            with gr.Tabs(selected="t2i", elem_id="mode-tabs") as self.tabs:
                self.t2i = self._gen_tab("t2i", "Text to Image", first)
                self.t2v = self._gen_tab("t2v", "Text to Video", first)
                self.action = self._action_tab(first)
                self.compare_tab = CompareTab(self).build()
                self.review_tab = self.batch_tab = None
                if self.review_desk is not None:
                    self.review_tab = ReviewTab(self, self.review_desk).build()
                    self.batch_tab = BatchTab(self).build()
            self._history_section()
            self._api_section()
            self._wire(blocks)
        return blocks

    def _sampling_box(self, spec: C.SamplingControls, prefix: str, with_interval: bool) -> SamplingBox:
        with gr.Accordion("Sampling", open=False, elem_id=f"{prefix}-sampling"):
            lock_note = gr.Markdown(spec.lock_note, visible=bool(spec.lock_note), elem_classes=["lock-note"])
            with gr.Row():
                steps = gr.Slider(1, 200, value=spec.steps, step=1, label="Steps", interactive=not spec.locked,
                                  elem_id=f"{prefix}-steps")
                guidance = gr.Slider(0.0, 30.0, value=spec.guidance_scale, step=0.1, label="Guidance scale",
                                     interactive=not spec.locked, elem_id=f"{prefix}-guidance")
                flow_shift = gr.Slider(0.5, 50.0, value=spec.flow_shift, step=0.5, label="Flow shift",
                                       interactive=not spec.locked, elem_id=f"{prefix}-shift")
            use_interval = interval_lo = interval_hi = None
            if with_interval:
                with gr.Row():
                    use_interval = gr.Checkbox(
                        value=spec.guidance_interval is not None, label="Guide only inside a timestep interval",
                        info="Classifier-free guidance runs only for timesteps t in [start, end] (0..1000); "
                             "outside it one forward per step.",
                        interactive=not spec.locked, elem_id=f"{prefix}-use-interval",
                    )
                    lo, hi = spec.guidance_interval or (400.0, 1000.0)
                    interval_lo = gr.Number(lo, label="Interval start", minimum=0, maximum=1000,
                                            interactive=not spec.locked, elem_id=f"{prefix}-interval-lo")
                    interval_hi = gr.Number(hi, label="Interval end", minimum=0, maximum=1000,
                                            interactive=not spec.locked, elem_id=f"{prefix}-interval-hi")
        with gr.Row(equal_height=True):
            seed = gr.Number(0, label="Seed", precision=0, minimum=0, maximum=UI_SEED_MAX, scale=3,
                             interactive=False, elem_id=f"{prefix}-seed")
            randomize = gr.Checkbox(True, label="Random seed", scale=1, elem_id=f"{prefix}-randomize")
        return SamplingBox(lock_note, steps, guidance, flow_shift, use_interval, interval_lo, interval_hi, seed,
                           randomize)

    def _buttons(self, prefix: str) -> tuple[gr.Button, gr.Button, gr.HTML]:
        with gr.Row():
            generate = gr.Button("Generate", variant="primary", scale=3, elem_id=f"{prefix}-generate")
            cancel = gr.Button("Cancel", variant="stop", scale=1, elem_id=f"{prefix}-cancel")
        status = gr.HTML("", elem_id=f"{prefix}-status", js_on_load=None)
        return generate, cancel, status

    def _outputs_column(self, prefix: str, media: str, buttons) -> ResultBox:
        generate, cancel, status = buttons
        if media == "image":
            output = gr.Image(label="Result", type="filepath", interactive=False, format="png",
                              buttons=["download", "fullscreen"], elem_id=f"{prefix}-output", height=360)
        else:
            output = gr.Video(label="Result", interactive=False, format="mp4", buttons=["download"],
                              elem_id=f"{prefix}-output", height=360, autoplay=True, loop=True)
        used_seed = gr.Textbox(label="Seed used", interactive=False, elem_id=f"{prefix}-used-seed")
        downloads = gr.File(label="Files", file_count="multiple", interactive=False, elem_id=f"{prefix}-files")
        with gr.Accordion("Text sent to the model", open=False, elem_id=f"{prefix}-final-text"):
            preview = gr.Button("Preview with the current settings", size="sm", elem_id=f"{prefix}-preview")
            prompt_view = gr.Textbox(label="Prompt text (metadata included)", lines=4, max_lines=12,
                                     interactive=False, buttons=["copy"], elem_id=f"{prefix}-prompt-text")
            negative_view = gr.Textbox(label="Negative prompt text", lines=2, max_lines=8, interactive=False,
                                       buttons=["copy"], elem_id=f"{prefix}-negative-text")
        with gr.Accordion("Parameters and timings", open=False):
            result_json = gr.JSON(label="Result", elem_id=f"{prefix}-result-json")
        return ResultBox(status, generate, cancel, output, used_seed, downloads, result_json, preview, prompt_view,
                         negative_view)

    def _gen_tab(self, mode: str, label: str, model: dict) -> GenTab:
        spec = C.sampling_controls(model, mode)
        kind = captions.kind_for_mode(mode)
        with gr.Tab(label, id=mode, interactive=spec.available, elem_id=f"tab-{mode}") as tab:
            notice = gr.Markdown(spec.reason or "", visible=not spec.available, elem_classes=["notice"])
            with gr.Row(equal_height=False):
                with gr.Column(scale=6):
                    editor = CaptionEditor(kind, elem_prefix=mode)
                    with gr.Accordion("Negative prompt", open=False, elem_id=f"{mode}-negative-box"):
                        negative = gr.Textbox(
                            "", label="Negative prompt (a JSON caption or prose; empty for none)", lines=4,
                            max_lines=14, interactive=spec.negative_enabled, elem_id=f"{mode}-negative",
                            info=None if spec.negative_enabled else "Distilled checkpoints do not use a negative prompt.",
                        )
                        negative_use = gr.Button("Use the studio's negative caption", size="sm",
                                                 interactive=spec.negative_enabled)
                        negative_message = gr.HTML("", js_on_load=None)
                    with gr.Row():
                        resolution = gr.Dropdown(
                            spec.resolution_choices, value=spec.resolution, label="Resolution (W x H)",
                            info="Exactly the sizes this model allows.", interactive=True,
                            elem_id=f"{mode}-resolution",
                        )
                        frames = fps = None
                        if mode == "t2v":
                            lo, hi = spec.frames_range
                            frames = gr.Slider(lo, hi, value=spec.frames, step=4, label="Frames (4k+1)",
                                               elem_id=f"{mode}-frames")
                            fps = gr.Number(spec.fps, label="FPS", minimum=1, maximum=120, elem_id=f"{mode}-fps")
                    image = video = sound = None
                    if mode == "t2v":
                        with gr.Accordion("Start from an image or a video (optional)", open=False):
                            with gr.Row():
                                image = gr.Image(label="Conditioning image (image to video)", type="filepath",
                                                 sources=["upload", "clipboard"], height=180,
                                                 elem_id=f"{mode}-image")
                                video = gr.Video(label="Conditioning video (video to video)", sources=["upload"],
                                                 height=180, elem_id=f"{mode}-video")
                            sound = gr.Checkbox(False, label="Generate sound", interactive=spec.sound_available,
                                                info=spec.sound_reason or "Adds an audio track to the MP4.",
                                                elem_id=f"{mode}-sound")
                    sampling = self._sampling_box(spec, mode, with_interval=mode == "t2i")
                    buttons = self._buttons(mode)
                with gr.Column(scale=5):
                    result = self._outputs_column(mode, "image" if mode == "t2i" else "video", buttons)
        editor.wire()
        return GenTab(mode, kind, tab, notice, editor, negative, negative_use, negative_message, resolution, frames,
                      fps, image, video, sound, sampling, result)

    def _action_tab(self, model: dict) -> ActionTab:
        spec = C.sampling_controls(model, "action")
        first_domain = "bridge_orig_lerobot"
        domain_spec = C.domain_controls(first_domain)
        with gr.Tab("Action", id="action", interactive=spec.available, elem_id="tab-action") as tab:
            notice = gr.Markdown(spec.reason or "", visible=not spec.available, elem_classes=["notice"])
            with gr.Row(equal_height=False):
                with gr.Column(scale=6):
                    kind = gr.Radio(C.kind_choices(), value="policy", label="Task", elem_id="action-kind")
                    kind_note = gr.Markdown(C.kind_inputs("policy").note)
                    with gr.Row():
                        domain = gr.Dropdown(C.domain_choices(), value=first_domain, label="Embodiment domain",
                                             elem_id="action-domain")
                        view_point = gr.Dropdown(C.view_choices(), value="ego_view", label="View point",
                                                 elem_id="action-view")
                    domain_note = gr.Markdown(domain_spec.note)
                    gr.Markdown(C.unsupported_domains_note(), elem_classes=["lock-note"])
                    with gr.Row():
                        chunk_size = gr.Slider(C.ACTION_CHUNK_UI_RANGE[0], C.ACTION_CHUNK_UI_RANGE[1],
                                               value=domain_spec.chunk_size, step=4,
                                               label="Chunk size", info="Action steps; the video has chunk + 1 frames.",
                                               elem_id="action-chunk")
                        tier = gr.Dropdown(C.tier_choices(), value=256, label="Resolution tier",
                                           info="The canvas closest in aspect to the input; inputs are only "
                                                "downscaled.", elem_id="action-tier")
                        fps = gr.Number(domain_spec.fps, label="FPS", minimum=1, maximum=120, elem_id="action-fps")
                    instruction = gr.Textbox("", label="Instruction (optional)", lines=2,
                                             placeholder="e.g. put the spoon in the pot",
                                             elem_id="action-instruction")
                    with gr.Row():
                        image = gr.Image(label="First frame (image)", type="filepath", sources=["upload", "clipboard"],
                                         height=180, elem_id="action-image")
                        video = gr.Video(label="Video", sources=["upload"], height=180, elem_id="action-video")
                        actions_file = gr.File(label="Actions file (JSON, CSV or NPY)",
                                               file_types=[".json", ".csv", ".npy"], visible=False,
                                               elem_id="action-actions-file")
                    upload_message = gr.HTML("", js_on_load=None)
                    self._action_examples([kind, domain, image, video, actions_file, instruction, chunk_size, tier, fps])
                    sampling = self._sampling_box(spec, "action", with_interval=False)
                    buttons = self._buttons("action")
                with gr.Column(scale=5):
                    result = self._outputs_column("action", "video", buttons)
                    plot = gr.Image(label="Actions over time", interactive=False, type="numpy", height=260,
                                    elem_id="action-plot")
                    actions_download = gr.File(label="Actions (JSON)", interactive=False, elem_id="action-json")
        return ActionTab(tab, notice, kind, kind_note, domain, domain_note, view_point, chunk_size, tier, fps,
                         instruction, image, video, actions_file, upload_message, sampling, result, plot,
                         actions_download)

    @staticmethod
    def _action_examples(inputs: list) -> None:
        frame, clip, actions = (example_media(n) for n in ("tabletop_first_frame.png", "tabletop_push.mp4",
                                                           "umi_push_right.json"))
        if not (frame and clip and actions):
            return
        gr.Examples(
            examples=[
                ["policy", "umi", frame, None, None, "push the red cube towards the plate", 16, 256, 20.0],
                ["forward_dynamics", "umi", frame, None, actions, "", 16, 256, 20.0],
                ["inverse_dynamics", "bridge_orig_lerobot", None, clip, None, "", 16, 256, 5.0],
            ],
            inputs=inputs, label="Examples (a tabletop drawn for this app)", cache_examples=False,
            examples_per_page=3, elem_id="action-examples",
        )

    def _history_section(self) -> None:
        with gr.Accordion("History (kept in this browser only)", open=True, elem_id="history"):
            self.history_state = gr.BrowserState([], storage_key="cosmos3-studio-history", secret=self.state_secret)
            self.gallery = gr.Gallery(label="Results", columns=6, height=220, allow_preview=False,
                                      object_fit="cover", interactive=False, fit_columns=False,
                                      elem_id="history-gallery")
            with gr.Row():
                self.history_note = gr.Markdown("Click a result to restore its model, settings and outputs.")
                self.history_clear = gr.Button("Clear history", size="sm", scale=0, elem_id="history-clear")
            with gr.Row():
                self.history_files = gr.File(label="Files of the selected result", file_count="multiple",
                                             interactive=False, elem_id="history-files")
                self.history_params = gr.JSON(label="Its parameters", elem_id="history-params")

    def _api_section(self) -> None:
        # Hidden components that carry the public `/generate` endpoint's inputs and outputs.
        with gr.Column(visible=False):
            self.api_model = gr.Textbox(label="model_name")
            self.api_request = gr.Textbox(label="request_json")
            self.api_file = gr.File(label="file", file_count="single")
            self.api_media = gr.File(label="media_file")
            self.api_result = gr.JSON(label="result_json")
            self.api_button = gr.Button("generate")

    # ==========================================================================================
    # Control updates
    # ==========================================================================================

    def _sampling_updates(self, box: SamplingBox, spec: C.SamplingControls) -> dict:
        locked = spec.locked or not spec.available
        out = {
            box.lock_note: gr.update(value=spec.lock_note, visible=bool(spec.lock_note)),
            box.steps: gr.update(value=spec.steps, interactive=not locked),
            box.guidance: gr.update(value=spec.guidance_scale, interactive=not locked),
            box.flow_shift: gr.update(value=spec.flow_shift, interactive=not locked),
        }
        if box.use_interval is not None:
            lo, hi = spec.guidance_interval or (400.0, 1000.0)
            out[box.use_interval] = gr.update(value=spec.guidance_interval is not None, interactive=not locked,
                                                visible=spec.show_interval)
            out[box.interval_lo] = gr.update(value=lo, interactive=not locked, visible=spec.show_interval)
            out[box.interval_hi] = gr.update(value=hi, interactive=not locked, visible=spec.show_interval)
        return out

    def _gen_tab_updates(self, tab: GenTab, model: dict) -> dict:
        spec = C.sampling_controls(model, tab.mode)
        out = {
            tab.tab: gr.update(interactive=spec.available),
            tab.notice: gr.update(value=spec.reason or "", visible=not spec.available),
            tab.resolution: gr.update(choices=spec.resolution_choices, value=spec.resolution,
                                        interactive=spec.available),
            tab.negative: gr.update(interactive=spec.negative_enabled,
                                     info=None if spec.negative_enabled else
                                     "Distilled checkpoints do not use a negative prompt."),
            tab.negative_use: gr.update(interactive=spec.negative_enabled),
            tab.result.generate: gr.update(interactive=spec.available),
            **self._sampling_updates(tab.sampling, spec),
        }
        if tab.frames is not None and spec.frames_range:
            lo, hi = spec.frames_range
            out[tab.frames] = gr.update(minimum=lo, maximum=hi, step=4, value=spec.frames)
            out[tab.fps] = gr.update(value=spec.fps)
        if tab.sound is not None:
            out[tab.sound] = gr.update(value=False, interactive=spec.sound_available,
                                         info=spec.sound_reason or "Adds an audio track to the MP4.")
        return out

    def _action_updates(self, model: dict) -> dict:
        spec = C.sampling_controls(model, "action")
        tab = self.action
        return {
            tab.tab: gr.update(interactive=spec.available),
            tab.notice: gr.update(value=spec.reason or "", visible=not spec.available),
            tab.result.generate: gr.update(interactive=spec.available),
            **self._sampling_updates(tab.sampling, spec),
        }

    def model_updates(self, name: str, current_tab: str | None = None) -> dict:
        """Everything that follows the model: the variant panel and every tab's controls."""
        model = self.service.describe(name)
        out = {self.variant: C.variant_markdown(model)}
        out.update(self._gen_tab_updates(self.t2i, model))
        out.update(self._gen_tab_updates(self.t2v, model))
        out.update(self._action_updates(model))
        available = C.tab_availability(model)
        if current_tab and not getattr(available, current_tab)[0]:
            out[self.tabs] = gr.update(selected="t2i")
            out[self.current_tab] = "t2i"
        return out

    def _model_outputs(self) -> list:
        # Every component `model_updates` may touch (a superset is fine for dict returns).
        dummy = self.service.describe(self.default_model)
        keys = set(self.model_updates(self.default_model, "action").keys())
        keys |= set(self._action_updates(dummy).keys())
        keys |= {self.tabs, self.current_tab}
        return list(keys)

    # ==========================================================================================
    # Wiring
    # ==========================================================================================

    def _wire(self, blocks: gr.Blocks) -> None:
        model_outputs = self._model_outputs()

        def on_model(name, current_tab):
            try:
                return self.model_updates(name, current_tab)
            except StudioError as exc:
                gr.Warning(str(exc))
                return {}

        self.model.input(on_model, inputs=[self.model, self.current_tab], outputs=model_outputs, queue=False,
                         api_visibility=PRIVATE)
        for tab_id, tab in (("t2i", self.t2i.tab), ("t2v", self.t2v.tab), ("action", self.action.tab)):
            tab.select(lambda t=tab_id: t, outputs=self.current_tab, queue=False, api_visibility=PRIVATE)

        for box in (self.t2i.sampling, self.t2v.sampling, self.action.sampling):
            # The seed box is editable only when it is used; restores turn Random off and fill it.
            box.randomize.change(lambda random: gr.update(interactive=not random), inputs=box.randomize,
                                 outputs=box.seed, queue=False, api_visibility=PRIVATE)
        for tab in (self.t2i, self.t2v):
            self._wire_gen_tab(tab)
        self._wire_action_tab()
        self._wire_history(blocks)
        self._wire_api()
        self.compare_tab.wire()
        if self.review_tab is not None:
            self.review_tab.wire(blocks)
            self.batch_tab.wire()

        def on_unload(request: gr.Request):
            # The tab was closed or reloaded: Gradio only marks a running handler dead, so stop the
            # engine job too and let the GPU move on to the next one.
            self.service.active.cancel(self._session(request))

        blocks.unload(on_unload)

    # -- shared pieces -----------------------------------------------------------------------------

    def _report(self, progress, status) -> None:
        if status.stage == "denoise" and status.total:
            progress((status.step, status.total), desc=status.describe(), unit="steps")
        elif status.stage == "queued":
            eta = None
            try:
                eta = self.service.queue.eta_seconds(status.position or 0)
            except Exception:  # noqa: BLE001 - an estimate only
                eta = None
            desc = status.describe() + (f" · about {eta:.0f} s" if eta else "")
            progress(None, desc=desc)
        else:
            progress(None, desc=status.describe())

    async def _drive(self, handle, session: str, progress):
        """Follow a job's events on this handler's own task, reporting progress as they come.

        Progress is reported from the event handler itself (not from a worker thread), so the bar
        reaches the browser. If Gradio cancels this handler (Cancel, or the client went away) the
        engine job is cancelled too, so the GPU moves on within one step.
        """
        job = self.service.active.add(session, handle)
        events = handle.events()
        try:
            while True:
                event = await anyio.to_thread.run_sync(next, events, None, abandon_on_cancel=True)
                if event is None:
                    raise StudioError("The job ended without a result.")
                result = apply_event(job.status, event)
                if result is not None:
                    return result
                self._report(progress, job.status)
        except (asyncio.CancelledError, anyio.get_cancelled_exc_class()):
            self.service.active.mark_cancelled(job)
            raise
        finally:
            self.service.active.remove(session, handle)

    async def _submit_and_follow(self, tab, box: ResultBox, model: str, build_request, request: gr.Request, progress):
        """Submit one job and follow it to its end: (result, None), or (None, the updates that say why not).

        Refusals go next to the inputs they concern; the inputs themselves are never touched.
        """
        try:
            handle = self.service.submit(model, build_request(), self._session(request))
        except StudioError as exc:
            gr.Warning(str(exc))
            return None, self._error_updates(tab, exc)
        progress(None, desc="Queued")
        try:
            result = await self._drive(handle, self._session(request), progress)
        except JobWasCancelled as exc:
            return None, {box.status: status_html(exc.message(), "warn")}
        except StudioError as exc:
            gr.Warning(str(exc))
            return None, self._error_updates(tab, exc)
        self.service.record(result, model, "ui")
        return result, None

    def _cancel_handler(self, result: ResultBox):
        def cancel(request: gr.Request):
            job = self.service.active.cancel(self._session(request))
            if job is None:
                return {result.status: status_html("No job of yours was running; a waiting one, if any, was removed "
                                               "from the queue.", "info")}
            return {result.status: status_html(cancel_outcome(job), "warn")}

        return cancel

    def _guarded(self, tab):
        """Turn an unexpected exception in a generate handler into a message next to the button.

        The traceback goes to the server log; the user sees what failed, and every input stays as it was.
        """
        def wrap(handler):
            @functools.wraps(handler)
            async def guarded(v: dict, request: gr.Request, progress=gr.Progress()):
                try:
                    return await handler(v, request, progress)
                except (asyncio.CancelledError, anyio.get_cancelled_exc_class()):
                    raise
                except Exception as exc:  # noqa: BLE001
                    log.exception("generate handler failed")
                    message = f"Something went wrong while showing the result ({type(exc).__name__}: {exc})."
                    gr.Warning(message)
                    return {tab.result.status: status_html(message, "error")}
            return guarded
        return wrap

    @staticmethod
    def _session(request: gr.Request | None) -> str:
        return (request.session_hash if request is not None else None) or "anonymous"

    def _result_updates(self, box: ResultBox, result, model: str) -> dict:
        summary = dict(result.summary(), model=model)
        files = [str(p) for k, p in result.outputs.items() if k in ("image", "video", "actions", "sidecar")]
        media = result.outputs.get("image") or result.outputs.get("video")
        took = result.timings.get("total")
        return {
            box.status: status_html(f"Done in {took:.1f} s · seed {result.seed}" if took else f"Done · seed {result.seed}",
                                "ok"),
            box.output: str(media) if media else None,
            box.used_seed: str(result.seed),
            box.downloads: files,
            box.result_json: summary,
            box.prompt_view: result.prompt_text,
            box.negative_view: result.negative_prompt_text,
        }

    def _history_updates(self, history: list) -> dict:
        return {self.history_state: history, self.gallery: H.gallery_items(history)}

    def _preview(self, model: str, request: dict) -> tuple[str, str]:
        from engine.defaults import validate_request
        from engine.prompts import preview_prompt_texts

        info = self.service.info(model)
        try:
            validated = validate_request(info, request["mode"], request)
        except ValueError as exc:
            raise StudioError(str(exc)) from None
        return preview_prompt_texts(info, validated)

    # -- text to image / video -------------------------------------------------------------------

    def _gen_inputs(self, tab: GenTab) -> list:
        s = tab.sampling
        items = [self.model, *tab.editor.inputs, tab.negative, tab.resolution, s.steps, s.guidance, s.flow_shift,
                 s.seed, s.randomize]
        for optional in (s.use_interval, s.interval_lo, s.interval_hi, tab.frames, tab.fps, tab.image, tab.video,
                         tab.sound):
            if optional is not None:
                items.append(optional)
        return items

    def _gen_request(self, tab: GenTab, v: dict) -> dict:
        s = tab.sampling
        style, code, prose = (v[c] for c in tab.editor.inputs)
        prompt, _warnings = prompt_from_editor(style, code, prose, tab.kind)
        negative = negative_from_text(v[tab.negative], tab.kind)
        sampling = Sampling(
            resolution=v[tab.resolution], steps=v[s.steps], guidance_scale=v[s.guidance], flow_shift=v[s.flow_shift],
            seed=v[s.seed], randomize=v[s.randomize],
        )
        if tab.mode == "t2i":
            sampling.use_interval = bool(v[s.use_interval])
            sampling.interval_lo, sampling.interval_hi = v[s.interval_lo], v[s.interval_hi]
            return image_request(prompt, negative, sampling)
        sampling.frames, sampling.fps = v[tab.frames], v[tab.fps]
        return video_request(prompt, negative, sampling, image=v[tab.image] or None, video=v[tab.video] or None,
                             sound=bool(v[tab.sound]))

    def _error_updates(self, tab, exc: StudioError) -> dict:
        message = str(exc)
        out = {tab.result.status: status_html(message, "error")}
        if isinstance(tab, GenTab):
            if exc.field == "caption":
                out[tab.editor.message] = error_html(message)
            elif exc.field == "negative":
                out[tab.negative_message] = error_html(message)
        elif exc.field in ("image", "video", "actions"):
            out[tab.upload_message] = error_html(message)
        return out

    def _clear_errors(self, tab) -> dict:
        if isinstance(tab, GenTab):
            return {tab.negative_message: ""}
        return {tab.upload_message: ""}

    def _wire_gen_tab(self, tab: GenTab) -> None:
        inputs = self._gen_inputs(tab)
        box = tab.result
        outputs = [box.status, box.output, box.used_seed, box.downloads, box.result_json, box.prompt_view,
                   box.negative_view, tab.editor.message, tab.negative_message, self.history_state, self.gallery]

        @self._guarded(tab)
        async def generate(v: dict, request: gr.Request, progress=gr.Progress()):
            model = v[self.model]
            result, shown = await self._submit_and_follow(tab, box, model, lambda: self._gen_request(tab, v),
                                                          request, progress)
            if result is None:
                return shown
            style, code, prose = (v[c] for c in tab.editor.inputs)
            ui = {"editor": {"style": style, "json": code, "prose": prose}, "negative": v[tab.negative]}
            entry = H.make_entry(model=model, tab=tab.mode, result=result, ui=ui)
            history = H.add(v[self.history_state], entry)
            out = self._result_updates(box, result, model)
            out.update(self._clear_errors(tab))
            out.update(self._history_updates(history))
            return out

        event = box.generate.click(
            generate, inputs={*inputs, self.history_state}, outputs=outputs, concurrency_id=GPU_POOL,
            concurrency_limit=1, trigger_mode="once", api_visibility=PRIVATE, show_progress="full",
            show_progress_on=[box.output], api_name=f"ui_{tab.mode}_generate",
        )
        box.cancel.click(self._cancel_handler(box), outputs=[box.status], cancels=[event], queue=False,
                         api_visibility=PRIVATE, api_name=f"ui_{tab.mode}_cancel")

        def preview(v: dict):
            try:
                engine_request = self._gen_request(tab, dict(v))
                for key in ("image", "video"):
                    engine_request.pop(key, None)
                if engine_request["mode"] in ("i2v", "v2v"):
                    engine_request["mode"] = "t2v"
                prompt_text, negative_text = self._preview(v[self.model], engine_request)
            except StudioError as exc:
                return self._error_updates(tab, exc)
            return {box.prompt_view: prompt_text, box.negative_view: negative_text,
                    box.status: status_html("Preview of the text the model will receive.", "info")}

        box.preview.click(preview, inputs=set(inputs), outputs=outputs, queue=False, api_visibility=PRIVATE,
                          api_name=f"ui_{tab.mode}_preview")

        def use_negative():
            return negative_caption(tab.kind)

        tab.negative_use.click(use_negative, outputs=tab.negative, queue=False, api_visibility=PRIVATE)

    # -- action ------------------------------------------------------------------------------------

    def _action_inputs(self) -> list:
        a, s = self.action, self.action.sampling
        return [self.model, a.kind, a.domain, a.view_point, a.chunk_size, a.tier, a.fps, a.instruction, a.image,
                a.video, a.actions_file, s.steps, s.guidance, s.flow_shift, s.seed, s.randomize]

    def _action_request(self, v: dict) -> dict:
        a, s = self.action, self.action.sampling
        file_value = v[a.actions_file]
        inputs = ActionInputs(
            kind=v[a.kind], domain=v[a.domain], view_point=v[a.view_point], chunk_size=v[a.chunk_size],
            resolution_tier=v[a.tier], instruction=v[a.instruction], image=v[a.image] or None,
            video=v[a.video] or None,
            actions_file=(file_value if isinstance(file_value, str) else getattr(file_value, "name", None))
            if C.kind_inputs(v[a.kind]).actions else None,
        )
        if not C.kind_inputs(inputs.kind).image:
            inputs.image = None
        sampling = Sampling(fps=v[a.fps], steps=v[s.steps], guidance_scale=v[s.guidance], flow_shift=v[s.flow_shift],
                            seed=v[s.seed], randomize=v[s.randomize])
        return action_request(inputs, sampling)

    def _wire_action_tab(self) -> None:
        a = self.action
        box = a.result
        inputs = self._action_inputs()
        outputs = [box.status, box.output, box.used_seed, box.downloads, box.result_json, box.prompt_view,
                   box.negative_view, a.plot, a.actions_download, a.upload_message, self.history_state, self.gallery]

        def on_kind(kind):
            need = C.kind_inputs(kind)
            return {
                a.kind_note: need.note,
                a.image: gr.update(visible=need.image),
                a.actions_file: gr.update(visible=need.actions),
            }

        # `.change` (not `.input`) so that examples and history restores update the uploads shown too.
        a.kind.change(on_kind, inputs=a.kind, outputs=[a.kind_note, a.image, a.actions_file], queue=False,
                      api_visibility=PRIVATE)

        def on_domain_note(domain):
            return C.domain_controls(domain).note

        a.domain.change(on_domain_note, inputs=a.domain, outputs=a.domain_note, queue=False, api_visibility=PRIVATE)

        def on_domain(domain):
            # Only a user's pick resets chunk and fps to the domain's typical clip; examples set their own.
            spec = C.domain_controls(domain)
            return {a.chunk_size: spec.chunk_size, a.fps: spec.fps}

        a.domain.input(on_domain, inputs=a.domain, outputs=[a.chunk_size, a.fps], queue=False, api_visibility=PRIVATE)

        @self._guarded(a)
        async def generate(v: dict, request: gr.Request, progress=gr.Progress()):
            model = v[self.model]
            result, shown = await self._submit_and_follow(a, box, model, lambda: self._action_request(v),
                                                          request, progress)
            if result is None:
                return shown
            ui = {"action": {"kind": v[a.kind], "domain": v[a.domain], "view_point": v[a.view_point],
                             "chunk_size": v[a.chunk_size], "tier": v[a.tier], "fps": v[a.fps],
                             "instruction": v[a.instruction]}}
            entry = H.make_entry(model=model, tab="action", result=result, ui=ui)
            history = H.add(v[self.history_state], entry)
            out = self._result_updates(box, result, model)
            out.update(self._action_result_updates(result.outputs.get("actions"), v[a.domain], result.params))
            out.update(self._clear_errors(a))
            out.update(self._history_updates(history))
            return out

        event = box.generate.click(
            generate, inputs={*inputs, self.history_state}, outputs=outputs, concurrency_id=GPU_POOL,
            concurrency_limit=1, trigger_mode="once", api_visibility=PRIVATE, show_progress="full",
            show_progress_on=[box.output], api_name="ui_action_generate",
        )
        box.cancel.click(self._cancel_handler(box), outputs=[box.status], cancels=[event], queue=False,
                         api_visibility=PRIVATE, api_name="ui_action_cancel")

        def preview(v: dict):
            try:
                engine_request = self._action_request(dict(v))
                prompt_text, negative_text = self._preview(v[self.model], engine_request)
            except StudioError as exc:
                return self._error_updates(a, exc)
            return {box.prompt_view: prompt_text, box.negative_view: negative_text,
                    box.status: status_html("Preview of the caption the engine builds (canvas from the tier's default; "
                                        "the run uses the input's aspect).", "info")}

        box.preview.click(preview, inputs=set(inputs), outputs=outputs, queue=False, api_visibility=PRIVATE,
                          api_name="ui_action_preview")

    def _action_result_updates(self, actions_path, domain: str, params: dict) -> dict:
        a = self.action
        if not actions_path:
            return {a.plot: None, a.actions_download: None}
        array = actions_from_file(actions_path)
        plot = actions_plot(array, domain=domain, fps=params.get("fps")) if array is not None else None
        return {a.plot: plot, a.actions_download: str(actions_path)}

    # -- history -----------------------------------------------------------------------------------

    def _restore(self, entry: dict) -> dict:
        model = entry["model"]
        if model not in self.service.model_names():
            return {self.history_note: f"That result came from model {model!r}, which this server does not serve."}
        out = self.model_updates(model)
        out[self.model] = model
        tab_id = entry["tab"]
        out[self.tabs] = gr.update(selected=tab_id)
        out[self.current_tab] = tab_id
        params = entry.get("summary", {}).get("params", {})
        ui = entry.get("ui", {})
        if tab_id in ("t2i", "t2v"):
            tab = self.t2i if tab_id == "t2i" else self.t2v
            box, s = tab.result, tab.sampling
            editor = ui.get("editor", {})
            out.update(tab.editor.restore(editor.get("style", STYLE_JSON), editor.get("json", ""),
                                          editor.get("prose", "")))
            out[tab.negative] = ui.get("negative", "")
            out[tab.resolution] = C.size_label(params.get("width", 0), params.get("height", 0))
            if tab.frames is not None:
                out[tab.frames] = params.get("num_frames")
                out[tab.fps] = params.get("fps")
            if tab.sound is not None and params.get("sound"):
                out[tab.sound] = True
            if s.use_interval is not None:
                interval = params.get("guidance_interval")
                out[s.use_interval] = gr.update(value=interval is not None)
                if interval:
                    out[s.interval_lo], out[s.interval_hi] = interval
        else:
            tab = self.action
            box, s = tab.result, tab.sampling
            action_ui = ui.get("action", {})
            for key, component in (("kind", tab.kind), ("domain", tab.domain), ("view_point", tab.view_point),
                                   ("chunk_size", tab.chunk_size), ("tier", tab.tier), ("fps", tab.fps),
                                   ("instruction", tab.instruction)):
                if key in action_ui:
                    out[component] = action_ui[key]
            files = entry.get("files", {})
            out.update(self._action_result_updates(files.get("actions"), action_ui.get("domain", ""), params))
        for key, component in (("steps", s.steps), ("guidance_scale", s.guidance), ("flow_shift", s.flow_shift)):
            if params.get(key) is not None:
                out[component] = params[key]
        out[s.seed] = entry.get("seed", 0)
        out[s.randomize] = False
        summary = entry.get("summary", {})
        out[box.output] = H.media_path(entry)
        out[box.used_seed] = str(entry.get("seed", ""))
        out[box.downloads] = H.download_paths(entry)
        out[box.result_json] = dict(summary, model=model)
        out[box.prompt_view] = summary.get("prompt_text", "")
        out[box.negative_view] = summary.get("negative_prompt_text", "")
        note = "Restored the settings of this result with its seed (Random seed is off)."
        if params.get("image") or params.get("video"):
            note += " Upload the conditioning file again to rerun it."
        out[box.status] = status_html(note, "info")
        out[self.history_note] = f"Restored: {H.caption_of(entry)} ({entry.get('created', '')})."
        out[self.history_files] = H.download_paths(entry)
        out[self.history_params] = summary.get("params", {})
        return out

    def _restore_outputs(self) -> list:
        keys = set(self._model_outputs())
        keys |= {self.model, self.tabs, self.current_tab, self.history_note, self.history_files, self.history_params}
        for tab in (self.t2i, self.t2v):
            keys |= set(tab.editor.outputs) | {tab.negative, tab.resolution}
            keys |= {c for c in (tab.frames, tab.fps, tab.sound) if c is not None}
        a = self.action
        keys |= {a.kind, a.domain, a.view_point, a.chunk_size, a.tier, a.fps, a.instruction, a.plot,
                 a.actions_download}
        for tab in (self.t2i, self.t2v, self.action):
            s, box = tab.sampling, tab.result
            keys |= {s.steps, s.guidance, s.flow_shift, s.seed, s.randomize, box.output, box.used_seed, box.downloads,
                     box.result_json, box.prompt_view, box.negative_view, box.status}
            keys |= {c for c in (s.use_interval, s.interval_lo, s.interval_hi) if c is not None}
        return list(keys)

    def _wire_history(self, blocks: gr.Blocks) -> None:
        owns = self.service.owns

        def on_load(history):
            history = H.clean(history, owns)
            return {self.history_state: history, self.gallery: H.gallery_items(history)}

        blocks.load(on_load, inputs=self.history_state, outputs=[self.history_state, self.gallery], queue=False,
                    api_visibility=PRIVATE)

        def on_select(history, evt: gr.SelectData):
            entry = H.entry_at(H.clean(history, owns), evt.index if evt is not None else None)
            if entry is None:
                return {self.history_note: "That result is no longer available."}
            return self._restore(entry)

        self.gallery.select(on_select, inputs=self.history_state, outputs=self._restore_outputs(), queue=False,
                            api_visibility=PRIVATE)

        def on_clear():
            return {self.history_state: [], self.gallery: [], self.history_files: None, self.history_params: None,
                    self.history_note: "History cleared (the files stay on the server)."}

        self.history_clear.click(on_clear, outputs=[self.history_state, self.gallery, self.history_files,
                                                    self.history_params, self.history_note],
                                 queue=False, api_visibility=PRIVATE)

    # -- scripting API -----------------------------------------------------------------------------

    def _wire_api(self) -> None:
        from .api import generate_api, models_api

        service = self.service

        def models() -> list[dict]:
            """Every served model: {name, label, family, is_edge, is_distilled, modes, defaults}.

            `defaults` maps each supported mode to its sampling defaults and limits."""
            return models_api(service)

        gr.api(models, api_name="models", queue=False)

        async def generate(model_name: str, request_json: str, file=None, request: gr.Request = None,
                           progress=gr.Progress()):
            return await generate_api(self, model_name, request_json, file, self._session(request), progress)

        self.api_button.click(
            generate, inputs=[self.api_model, self.api_request, self.api_file],
            outputs=[self.api_media, self.api_result], api_name="generate", concurrency_id=GPU_POOL,
            concurrency_limit=1,
            api_description="Run one request. `request_json` is the engine's request (mode, prompt, width, height, "
                            "num_frames, fps, steps, guidance_scale, guidance_interval, flow_shift, seed, sound, "
                            "action); `file` is the image, video or actions file its mode needs. Returns the image "
                            "or video (or the actions JSON) and a JSON with seed, prompt_text, params and timings.",
        )

    # ==========================================================================================
    # Launching
    # ==========================================================================================

    def launch(self, *, host: str = "127.0.0.1", port: int = 7860, prevent_thread_lock: bool = False,
               quiet: bool = False, **extra):
        self.blocks.queue(max_size=self.queue_size, default_concurrency_limit=4)
        return self.blocks.launch(
            server_name=host, server_port=port, prevent_thread_lock=prevent_thread_lock, quiet=quiet,
            theme=gr.themes.Soft(primary_hue="green", neutral_hue="slate"), css_paths=[CSS_PATH],
            allowed_paths=[str(self.service.outputs_root)], show_error=False, ssr_mode=False,
            footer_links=["api", "settings"], auth=self.auth, auth_message=self._login_message(), **extra,
        )

    def _login_message(self) -> str | None:
        if not self.auth:
            return None
        return "Cosmos3 Studio: log in to review." if self.review_desk is not None else "Cosmos3 Studio: log in."

    def close(self) -> None:
        self.blocks.close()
