"""The Studio's pages: model picker and variant panel, the tabs, history, and the scripting API; in review
mode a second page (`/review`, Gradio's multi-page routes) holds the review desk's tabs.

Page building lives here; form <-> JSON in `forms`, following jobs in `jobs`, the events of the
generation tabs in `handlers`, decisions in plain modules (`controls`, `requests`, `history`,
`service`) that tests use without a server. All generation events share one Gradio concurrency
pool ("gpu", one slot) in front of the engine's single worker; the light UI events (caption sync,
model switch, previews) skip the queue and are private, so they are not part of the public API.
"""
from __future__ import annotations

import secrets

import gradio as gr

from engine.model.defaults import DEFAULT_ACTION_TIER, FRAME_STEP
from engine.pipeline import captions

from . import controls as C
from . import files
from . import forms as F
from . import history as H
from .assets import CSS_PATH, example_media
from .caption_editor import CaptionEditor
from .common import PRIVATE
from .gallery import ResultsGallery
from .handlers import Handlers
from .jobs import JobFollower
from .parts import ActionTab, ApiBox, GenTab, HistoryBox, Page, ResultBox, SamplingBox, UploadImage
from .reasoner_panel import ActionDescribe, ReasonApi, ReasonerPanel, ReasonerWiring, availability
from .review.tabs import ReviewTabs
from .review_tabs import BatchTab, CompareTab
from .service import StudioError, StudioService, warming_panel, warming_status

REVIEW_PATH = "review"  # the review desk's page, relative to the studio's, so a root path still works

# ==============================================================================================
# Pieces shared by the tabs
# ==============================================================================================


def sampling_box(spec: C.SamplingControls, prefix: str, with_interval: bool) -> SamplingBox:
    notes = C.limit_notes(spec)
    with gr.Accordion("Sampling", open=False, elem_id=f"{prefix}-sampling") as accordion:
        lock_note = gr.Markdown(spec.lock_note, visible=bool(spec.lock_note), elem_classes=["lock-note"])
        with gr.Row():
            steps = gr.Number(spec.steps, label="Steps", info=notes.steps, interactive=not spec.locked,
                              elem_id=f"{prefix}-steps")
            guidance = gr.Number(spec.guidance_scale, label="Guidance scale", info=notes.guidance, step=0.1,
                                 interactive=not spec.locked, elem_id=f"{prefix}-guidance")
            flow_shift = gr.Number(spec.flow_shift, label="Flow shift", info=notes.flow_shift, step=0.5,
                                   interactive=not spec.locked, elem_id=f"{prefix}-shift")
        use_interval = interval_lo = interval_hi = None
        if with_interval:
            with gr.Row(elem_classes=["stack-on-phone"]):
                use_interval = gr.Checkbox(
                    value=spec.guidance_interval is not None, label="Guide only inside a timestep interval",
                    info="Classifier-free guidance runs only for timesteps t in [start, end]; outside it one "
                         "forward per step.",
                    interactive=not spec.locked, elem_id=f"{prefix}-use-interval",
                )
                lo, hi = spec.guidance_interval or C.INTERVAL_FALLBACK
                interval_lo = gr.Number(lo, label="Interval start", info=notes.interval, interactive=not spec.locked,
                                        elem_id=f"{prefix}-interval-lo")
                interval_hi = gr.Number(hi, label="Interval end", interactive=not spec.locked,
                                        elem_id=f"{prefix}-interval-hi")
    with gr.Row(equal_height=True, elem_classes=["seed-row", "stack-on-phone"]):
        # Text, not a number box: a browser holds numbers as doubles and would round a 20-digit seed.
        seed = gr.Textbox("0", label="Seed", info=notes.seed, scale=3, interactive=False, max_lines=1,
                          elem_id=f"{prefix}-seed")
        with gr.Column(scale=1, min_width=130):
            randomize = gr.Checkbox(True, label="Random seed", elem_id=f"{prefix}-randomize")
            reuse = gr.Button("Reuse seed", size="sm", elem_id=f"{prefix}-reuse-seed")
    message = gr.HTML("", elem_id=f"{prefix}-sampling-message", padding=False)
    return SamplingBox(accordion, lock_note, steps, guidance, flow_shift, use_interval, interval_lo, interval_hi, seed,
                       randomize, message, reuse)


def run_buttons(prefix: str) -> tuple:
    with gr.Row(equal_height=True, elem_classes=["run-row"]):
        generate = gr.Button("Generate", variant="primary", scale=3, elem_id=f"{prefix}-generate")
        cancel = gr.Button("Cancel", variant="stop", scale=1, elem_id=f"{prefix}-cancel")
        live_preview = gr.Checkbox(True, label="Live preview", scale=1, min_width=120,
                                   elem_id=f"{prefix}-live-preview")
    # Progress and outcome are separate lines, so a progress message still in flight when Cancel
    # answers can never cover how the run ended.
    progress = gr.HTML("", elem_id=f"{prefix}-progress", js_on_load=None)
    status = gr.HTML("", elem_id=f"{prefix}-status", js_on_load=None)
    return generate, cancel, live_preview, progress, status


def outputs_column(prefix: str, media: str, buttons) -> ResultBox:
    generate, cancel, live_preview, progress, status = buttons
    live = gr.Image(label="Preview while denoising", type="numpy", interactive=False, visible=False, height=240,
                    elem_id=f"{prefix}-live")
    if media == "image":
        output = gr.Image(label="Result", type="filepath", interactive=False, format="png",
                          buttons=["download", "fullscreen"], elem_id=f"{prefix}-output", height=360)
    else:
        output = gr.Video(label="Result", interactive=False, format="mp4", buttons=["download"],
                          elem_id=f"{prefix}-output", height=360, autoplay=True, loop=True)
    used_seed = gr.Textbox(label="Seed used", interactive=False, elem_id=f"{prefix}-used-seed")
    downloads = gr.File(label="Files", file_count="multiple", interactive=False, elem_id=f"{prefix}-files",
                        elem_classes=["result-files"])
    with gr.Accordion("Text sent to the model", open=False, elem_id=f"{prefix}-final-text"):
        preview = gr.Button("Preview with the current settings", size="sm", elem_id=f"{prefix}-preview")
        prompt_view = gr.Textbox(label="Prompt text (metadata included)", lines=4, max_lines=12,
                                 interactive=False, buttons=["copy"], elem_id=f"{prefix}-prompt-text")
        negative_view = gr.Textbox(label="Negative prompt text", lines=2, max_lines=8, interactive=False,
                                   buttons=["copy"], elem_id=f"{prefix}-negative-text")
    with gr.Accordion("Parameters and timings", open=False):
        result_json = gr.JSON(label="Result", elem_id=f"{prefix}-result-json")
    return ResultBox(status, progress, generate, cancel, live_preview, live, output, used_seed, downloads, result_json, preview,
                     prompt_view, negative_view)


# ==============================================================================================
# Text to image / video
# ==============================================================================================


def _negative_box(mode: str, spec: C.SamplingControls) -> tuple[gr.Textbox, gr.Button, gr.HTML]:
    with gr.Accordion("Negative prompt", open=False, elem_id=f"{mode}-negative-box"):
        negative = gr.Textbox(
            "", label="Negative prompt (a JSON caption or prose; empty for none)", lines=4,
            max_lines=14, interactive=spec.negative_enabled, elem_id=f"{mode}-negative",
            info="" if spec.negative_enabled else C.NEGATIVE_UNUSED,
        )
        negative_use = gr.Button("Use the studio's negative caption", size="sm", interactive=spec.negative_enabled)
        negative_message = gr.HTML("", js_on_load=None)
    return negative, negative_use, negative_message


def _conditioning_box(mode: str, spec: C.SamplingControls):
    with gr.Accordion("Start from an image or a video (optional)", open=False, elem_id=f"{mode}-uploads") as box:
        with gr.Row():
            image = UploadImage(label="Conditioning image (image to video)", type="filepath",
                             sources=["upload", "clipboard"], height=180, elem_id=f"{mode}-image")
            video = gr.Video(label="Conditioning video (video to video)", sources=["upload"], height=180,
                             elem_id=f"{mode}-video")
        fit = gr.Radio(C.FIT_CHOICES, value="crop", label="Fit the upload to the resolution",
                       elem_id=f"{mode}-fit")
        fit_note = gr.Markdown(C.fit_note(None, None, "crop"), elem_id=f"{mode}-fit-note")
        sound = gr.Checkbox(False, label="Generate sound", interactive=spec.sound_available,
                            info=spec.sound_reason or "Adds an audio track to the MP4.", elem_id=f"{mode}-sound")
    return image, video, sound, box, fit, fit_note


def gen_tab(mode: str, label: str, model: dict, reasoner: tuple[bool, str] = (False, "")) -> GenTab:
    spec = C.sampling_controls(model, mode)
    kind = captions.kind_for_mode(mode)
    with gr.Tab(label, id=mode, interactive=spec.available, elem_id=f"tab-{mode}") as tab:
        notice = gr.Markdown(spec.reason or "", visible=not spec.available, elem_classes=["notice"])
        with gr.Row(equal_height=False):
            with gr.Column(scale=6):
                editor = CaptionEditor(kind, elem_prefix=mode)
                panel = ReasonerPanel.build(mode, kind, *reasoner)  # Enhance (cosmos3_ui/reasoner_panel.py)
                negative, negative_use, negative_message = _negative_box(mode, spec)
                with gr.Row():
                    resolution = gr.Dropdown(
                        spec.resolution_choices, value=spec.resolution, label="Resolution (W x H)",
                        info="Exactly the sizes this model allows.", interactive=True, elem_id=f"{mode}-resolution",
                    )
                    frames = fps = None
                    if mode == "t2v":
                        notes = C.limit_notes(spec)
                        frames = gr.Number(spec.frames, label="Frames", info=notes.frames, step=FRAME_STEP,
                                           elem_id=f"{mode}-frames")
                        fps = gr.Number(spec.fps, label="FPS", info=notes.fps, elem_id=f"{mode}-fps")
                canvas_message = gr.HTML("", elem_id=f"{mode}-canvas-message", padding=False)
                image = video = sound = uploads = fit = fit_note = None
                if mode == "t2v":
                    image, video, sound, uploads, fit, fit_note = _conditioning_box(mode, spec)
                    panel.build_describe(True, True, reasoner[0])
                sampling = sampling_box(spec, mode, with_interval=mode == "t2i")
                buttons = run_buttons(mode)
            with gr.Column(scale=5):
                result = outputs_column(mode, "image" if mode == "t2i" else "video", buttons)
    editor.wire()
    gen = GenTab(mode, kind, tab, notice, editor, negative, negative_use, negative_message, resolution, frames,
                 fps, canvas_message, image, video, sound, sampling, result)
    gen.reasoner, gen.uploads_box, gen.fit, gen.fit_note = panel, uploads, fit, fit_note
    return gen


# ==============================================================================================
# Action
# ==============================================================================================


def action_examples(inputs: list) -> None:
    frame, clip, actions = (example_media(n) for n in ("tabletop_first_frame.png", "tabletop_push.mp4",
                                                       "umi_push_right.json"))
    if not (frame and clip and actions):
        return
    tier = min(value for _, value in C.tier_choices())  # the quickest tier; chunk and fps: the domain's own

    def row(kind: str, domain: str, image, video, actions_file, instruction: str) -> list:
        spec = C.domain_controls(domain)
        return [kind, domain, image, video, actions_file, instruction, spec.chunk_size, tier, spec.fps]

    gr.Examples(
        examples=[
            row("policy", "umi", frame, None, None, "push the red cube towards the plate"),
            row("forward_dynamics", "umi", frame, None, actions, ""),
            row("inverse_dynamics", "bridge_orig_lerobot", None, clip, None, ""),
        ],
        inputs=inputs, label="Examples (a tabletop drawn for this app)", cache_examples=False,
        examples_per_page=3, elem_id="action-examples",
    )


def _action_inputs_column(domain_spec: C.DomainControls, first_domain: str, notes: C.LimitNotes) -> dict:
    kind = gr.Radio(C.kind_choices(), value="policy", label="Task", elem_id="action-kind")
    kind_note = gr.Markdown(C.kind_inputs("policy").note)
    with gr.Row():
        domain = gr.Dropdown(C.domain_choices(), value=first_domain, label="Embodiment domain",
                             elem_id="action-domain")
        view_point = gr.Dropdown(C.view_choices(), value="ego_view", label="View point", elem_id="action-view")
    domain_note = gr.Markdown(domain_spec.note)
    gr.Markdown(C.unsupported_domains_note(), elem_classes=["lock-note"])
    with gr.Row():
        chunk_size = gr.Number(domain_spec.chunk_size, step=FRAME_STEP, label="Chunk size (action steps)", info=notes.chunk,
                               elem_id="action-chunk")
        tier = gr.Dropdown(C.tier_choices(), value=DEFAULT_ACTION_TIER, label="Resolution tier",
                           info="The canvas closest in aspect to the input; inputs are only downscaled.",
                           elem_id="action-tier")
        fps = gr.Number(domain_spec.fps, label="FPS", info=notes.fps, elem_id="action-fps")
    instruction = gr.Textbox("", label="Instruction (optional)", lines=2, placeholder="e.g. put the spoon in the pot",
                             elem_id="action-instruction")
    with gr.Row():
        image = UploadImage(label="First frame (image)", type="filepath", sources=["upload", "clipboard"], height=180,
                         elem_id="action-image")
        video = gr.Video(label="Video", sources=["upload"], height=180, elem_id="action-video")
        actions_file = gr.File(label="Actions file (JSON, CSV or NPY)", file_types=[".json", ".csv", ".npy"],
                               visible=False, elem_id="action-actions-file")
    upload_message = gr.HTML("", js_on_load=None)
    action_examples([kind, domain, image, video, actions_file, instruction, chunk_size, tier, fps])
    return dict(kind=kind, kind_note=kind_note, domain=domain, domain_note=domain_note, view_point=view_point,
                chunk_size=chunk_size, tier=tier, fps=fps, instruction=instruction, image=image, video=video,
                actions_file=actions_file, upload_message=upload_message)


def action_tab(model: dict, reasoner: tuple[bool, str] = (False, "")) -> ActionTab:
    spec = C.sampling_controls(model, "action")
    first_domain = "bridge_orig_lerobot"
    with gr.Tab("Action", id="action", interactive=spec.available, elem_id="tab-action") as tab:
        notice = gr.Markdown(spec.reason or "", visible=not spec.available, elem_classes=["notice"])
        with gr.Row(equal_height=False):
            with gr.Column(scale=6):
                fields = _action_inputs_column(C.domain_controls(first_domain), first_domain, C.limit_notes(spec))
                describe = ActionDescribe.build(*reasoner)  # Describe the uploads (cosmos3_ui/reasoner_panel.py)
                sampling = sampling_box(spec, "action", with_interval=False)
                buttons = run_buttons("action")
            with gr.Column(scale=5):
                result = outputs_column("action", "video", buttons)
                plot = gr.Image(label="Actions over time", interactive=False, type="numpy", height=260,
                                elem_id="action-plot")
                actions_download = gr.File(label="Actions (JSON)", interactive=False, elem_id="action-json",
                                           elem_classes=["result-files"])
    return ActionTab(tab=tab, notice=notice, sampling=sampling, result=result, plot=plot,
                     actions_download=actions_download, reasoner=describe, **fields)


# ==============================================================================================
# History and the API's hidden components
# ==============================================================================================


def history_section(state_secret: str) -> HistoryBox:
    with gr.Accordion("History (kept in this browser only)", open=True, elem_id="history"):
        # Gradio hands the BrowserState's secret to every browser: it gets a key derived from the app's, and
        # entries are sealed with another (cosmos3_ui.history.HistorySeal) that stays on the server.
        state = gr.BrowserState([], storage_key="cosmos3-studio-history", secret=H.browser_state_secret(state_secret))
        gallery = gr.Gallery(label="Results", columns=6, height=220, allow_preview=False, object_fit="cover",
                             interactive=False, fit_columns=False, elem_id="history-gallery")
        with gr.Row():
            note = gr.Markdown("Click a result to restore its model, settings and outputs.")
            clear = gr.Button("Clear history", size="sm", scale=0, elem_id="history-clear")
        with gr.Row():
            files = gr.File(label="Files of the selected result", file_count="multiple", interactive=False,
                            elem_id="history-files", elem_classes=["result-files"])
            params = gr.JSON(label="Its parameters", elem_id="history-params")
    return HistoryBox(state, gallery, note, clear, files, params)


def api_section() -> ApiBox:
    with gr.Column(visible=False):
        return ApiBox(model=gr.Textbox(label="model_name"), request=gr.Textbox(label="request_json"),
                      file=gr.File(label="file", file_count="single"), media=gr.File(label="media_file"),
                      result=gr.JSON(label="result_json"), button=gr.Button("generate"))


# ==============================================================================================
# The Studio
# ==============================================================================================


class Studio:
    """Builds the Blocks for one `StudioService` and launches it."""

    def __init__(self, service: StudioService, *, queue_size: int = 16, state_secret: str | None = None,
                 title: str = "Cosmos3 Studio", review_desk=None, auth: list[tuple[str, str]] | None = None,
                 max_upload_bytes: int | None = None):
        self.service = service
        self.jobs = JobFollower(service)
        self.queue_size = queue_size
        self.max_upload_bytes = max_upload_bytes or files.DEFAULT_MAX_UPLOAD_BYTES
        self.state_secret = state_secret or secrets.token_hex(32)
        service.history_seal = H.HistorySeal.from_secret(self.state_secret)
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
        self.http_routes: list = []  # extra FastAPI routes served beside the UI (the /v1 HTTP API)
        self.blocks = self._build()

    def _build(self) -> gr.Blocks:
        first = self.service.describe(self.default_model)
        with gr.Blocks(title=self.title, analytics_enabled=False, delete_cache=files.CACHE_CLEANUP) as blocks:
            gr.Markdown(
                "# Cosmos3 Studio\nGenerate images, videos and robot actions with NVIDIA Cosmos3. "
                "Controls follow the chosen model: only what it supports is offered.",
                elem_id="studio-header",
            )
            if self.review_desk is not None:
                gr.HTML(f'<a href="{REVIEW_PATH}" id="to-review-desk">Review desk: rate, blind pairs, suites, '
                        'leaderboard, batch, compare &rarr;</a>', elem_id="studio-to-review")
            with gr.Row(equal_height=False, elem_id="model-row"):
                with gr.Column(scale=1, min_width=260):
                    model = gr.Dropdown(C.model_choices(self.service.describe_all()), value=self.default_model,
                                        label="Model", interactive=True, elem_id="model-picker")
                    switch_note = gr.Markdown("", elem_id="switch-note")
                    # Background warm-up (engine.serving.warmup): shown while it runs, polled only then.
                    self.warming = gr.Markdown("", visible=False, elem_id="warming-note")
                    self.warming_timer = gr.Timer(2.0, active=False)
                variant = gr.Markdown(C.variant_markdown(first), elem_id="variant-panel")
            shown_model = gr.State(self.default_model)
            current_tab = gr.State("t2i")
            with gr.Tabs(selected="t2i", elem_id="mode-tabs", overflow_behavior="wrap") as tabs:
                reasoner = availability(self.service, self.default_model)
                t2i = gen_tab("t2i", "Text to Image", first, reasoner)
                t2v = gen_tab("t2v", "Text to Video", first, reasoner)
                action = action_tab(first, reasoner)
                # Compare sits on the studio page only when there is no review desk to hold it.
                self.compare_tab = CompareTab(self.service, self.jobs).build() if self.review_desk is None else None
            history = history_section(self.state_secret)
            self.page = Page(model, shown_model, variant, switch_note, tabs, current_tab, t2i, t2v, action, history,
                             api_section(), results_gallery=ResultsGallery.build(), set_aside=gr.State({}))
            self.reason_api = ReasonApi.build()
            self._wire(blocks)
        self.review_tab = self.batch_tab = None
        if self.review_desk is not None:
            with blocks.route("Review desk", REVIEW_PATH):
                self._review_page(blocks)
        return blocks

    def _review_page(self, blocks: gr.Blocks) -> None:
        """The review desk's own page: its tabs only (no model picker, no history), linked to the studio."""
        gr.HTML('<a href="./" id="to-studio">&larr; Studio: generate images, videos and actions</a>',
                elem_id="review-to-studio")
        gr.Markdown("# Cosmos3 Studio: review desk\nRate results, judge blind pairs, run prompt suites and "
                    "batches, compare models, and read the leaderboard.", elem_id="review-header")
        # The desk opens on Blind: the only tab whose content names no model or configuration (a tab's
        # lists are filled when it is selected, and Gradio selects the opening tab on load).
        with gr.Tabs(selected="blind", elem_id="review-tabs"):
            self.review_tab = ReviewTabs(self, self.review_desk).build()
            self.batch_tab = BatchTab(self.service, self.jobs).build()
            self.compare_tab = CompareTab(self.service, self.jobs).build()
        self.review_tab.wire(blocks)
        self.batch_tab.wire()
        self.compare_tab.wire(None)  # results go to the Review tab's list, not to a browser history

    def model_updates(self, name: str, current_tab: str | None = None) -> dict:
        """Everything that follows the model: the variant panel and every tab's controls."""
        return F.model_updates(self.page, self.service.describe(name), current_tab)

    def _wire(self, blocks: gr.Blocks) -> None:
        page = self.page
        first = self.service.describe(self.default_model)

        # Gradio reads an empty dict as one output value, not as "no updates".
        unchanged = {page.variant: gr.skip()}

        def on_model(v: dict):
            shown = v[page.shown_model]
            if v[page.model] == shown:
                return unchanged  # the controls follow this model already (a repeated event, or the same pick)
            try:
                model = self.service.describe(v[page.model])
            except StudioError as exc:
                gr.Warning(str(exc))
                return unchanged
            old = self.service.describe(shown) if shown in self.service.model_names() else None
            return F.switch_updates(page, old, model, v, v[page.current_tab])

        # Gradio's dropdown sends `input` twice for one pick, both with the form as it was; the first
        # call gives the size and steps controls the new model's choices and bounds, so Gradio's own
        # check would refuse the second one's old values and the page would show that refusal instead
        # of the switch. The switch checks every value against the new model itself (F.switch_updates),
        # so it reads them raw.
        page.model.input(on_model, inputs=set(F.switch_inputs(page)), outputs=F.model_outputs(page, first),
                         queue=False, preprocess=False, api_visibility=PRIVATE)
        for tab in page.all_tabs():
            tab_id = tab.mode if isinstance(tab, GenTab) else "action"
            tab.tab.select(lambda t=tab_id: t, outputs=page.current_tab, queue=False, api_visibility=PRIVATE)
            # The seed box is editable only when it is used; restores turn Random off and fill it.
            box = tab.sampling
            box.randomize.change(lambda random: gr.update(interactive=not random), inputs=box.randomize,
                                 outputs=box.seed, queue=False, api_visibility=PRIVATE)
        handlers = Handlers(blocks, page, self.service, self.jobs)
        for tab in page.gen_tabs():
            handlers.wire_gen_tab(tab)
        handlers.wire_action_tab()
        handlers.wire_history(F.restore_outputs(page, first))
        handlers.wire_api()
        ReasonerWiring(self.service, self.jobs, page).wire()
        self.reason_api.wire(self.service)
        if self.compare_tab is not None:
            self.compare_tab.wire(page.history)
        blocks.load(self.warming_updates, outputs=[self.warming, self.warming_timer], queue=False,
                    api_visibility=PRIVATE)
        self.warming_timer.tick(self.warming_updates, outputs=[self.warming, self.warming_timer], queue=False,
                                api_visibility=PRIVATE)
        # The tab was closed or reloaded: Gradio only marks a running handler dead, so stop the engine
        # job too and let the GPU move on to the next one.
        blocks.unload(self.jobs.stop_session)

    def warming_updates(self) -> tuple:
        """The warm-up note and its poll: visible and polling while a model warms, hidden and idle after."""
        text = warming_panel(warming_status(self.service.queue))
        return gr.update(value=text, visible=bool(text)), gr.Timer(active=bool(text))

    def launch(self, *, host: str = "127.0.0.1", port: int = 7860, prevent_thread_lock: bool = False,
               quiet: bool = False, **extra):
        self.blocks.queue(max_size=self.queue_size, default_concurrency_limit=4)
        return self.blocks.launch(
            server_name=host, server_port=port, prevent_thread_lock=prevent_thread_lock, quiet=quiet,
            theme=gr.themes.Soft(primary_hue="green", neutral_hue="slate"), css_paths=[CSS_PATH],
            show_error=False, ssr_mode=False,
            footer_links=["api", "settings"], auth=self.auth, auth_message=self._login_message(),
            **files.launch_options(self.service.outputs_root, {"routes": list(self.http_routes)},
                                   max_file_size=self.max_upload_bytes), **extra,
        )

    def _login_message(self) -> str | None:
        if not self.auth:
            return None
        return "Cosmos3 Studio: log in to review." if self.review_desk is not None else "Cosmos3 Studio: log in."

    def close(self) -> None:
        self.blocks.close()
