"""The Studio's components, grouped per tab: what `layout` builds and the other modules read.

Plain dataclasses of Gradio components, so `forms` (form <-> JSON), `handlers` (events) and the
Compare/Review/Batch tabs can use the page's pieces without importing the module that builds it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import gradio as gr

from .caption_editor import CaptionEditor
from .files import redact


class UploadImage(gr.Image):
    """An image upload that hands an undecodable file on as its path, so the request is refused with
    the engine's own message at the field (Gradio's own preprocessing would fail with a bare "Error")."""

    is_template = True  # drawn by the frontend's Image component

    def preprocess(self, payload):
        try:
            return super().preprocess(payload)
        except (OSError, ValueError) as exc:  # PIL's UnidentifiedImageError is an OSError
            if payload is None or getattr(payload, "path", None) is None or self.type != "filepath":
                raise gr.Error(redact(f"{self.label}: the upload could not be read as an image ({exc})."),
                               print_exception=False) from None
            return str(payload.path)


@dataclass
class SamplingBox:
    """Sampling controls shared by every tab. Numbers, not sliders: a slider clamps what is typed into
    it, and a value the model cannot run must be refused, naming its field, never silently changed."""

    accordion: gr.Accordion
    lock_note: gr.Markdown
    steps: gr.Number
    guidance: gr.Number
    flow_shift: gr.Number
    use_interval: gr.Checkbox | None
    interval_lo: gr.Number | None
    interval_hi: gr.Number | None
    seed: gr.Number
    randomize: gr.Checkbox
    message: gr.HTML  # a refusal of one of these controls, shown under them
    reuse: Any = None  # gr.Button "Reuse seed": the seed of this tab's last result, Random off


@dataclass
class ResultBox:
    status: gr.HTML  # beside Generate: how the run ended (or why it did not start)
    progress: gr.HTML  # beside Generate while a job runs: queue position, stage, step and ETA
    generate: gr.Button
    cancel: gr.Button
    live_preview: gr.Checkbox  # previews while denoising, on or off
    live: gr.Image  # the latest preview, shown while the job runs
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
    frames: gr.Number | None
    fps: gr.Number | None
    canvas_message: gr.HTML  # a refusal of the size, frames, fps or sound
    image: gr.Image | None
    video: gr.Video | None
    sound: gr.Checkbox | None
    sampling: SamplingBox
    result: ResultBox
    reasoner: Any = None  # cosmos3_ui.reasoner_panel.ReasonerPanel (Enhance, Describe)
    uploads_box: Any = None  # gr.Accordion around the uploads (History opens it to show what it restored)
    fit: Any = None  # gr.Radio: how an upload meets the canvas (crop, letterbox, resize)
    fit_note: Any = None  # gr.Markdown: what that does to this upload


@dataclass
class ActionTab:
    tab: gr.Tab
    notice: gr.Markdown
    kind: gr.Radio
    kind_note: gr.Markdown
    domain: gr.Dropdown
    domain_note: gr.Markdown
    view_point: gr.Dropdown
    chunk_size: gr.Number
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
    reasoner: Any = None  # cosmos3_ui.reasoner_panel.ActionDescribe


@dataclass
class HistoryBox:
    """The per-browser history: its state, gallery, and the selected result's files and parameters."""

    state: gr.BrowserState
    gallery: gr.Gallery
    note: gr.Markdown
    clear: gr.Button
    files: gr.File
    params: gr.JSON


@dataclass
class ApiBox:
    """Hidden components that carry the public `/generate` endpoint's inputs and outputs."""

    model: gr.Textbox
    request: gr.Textbox
    file: gr.File
    media: gr.File
    result: gr.JSON
    button: gr.Button


@dataclass
class Page:
    """Everything the model picker and the generation tabs are made of."""

    model: gr.Dropdown
    shown_model: gr.State  # the model the controls follow now (a switch compares against it)
    variant: gr.Markdown
    switch_note: gr.Markdown  # what the last model switch changed (empty when nothing did)
    tabs: gr.Tabs
    current_tab: gr.State
    t2i: GenTab
    t2v: GenTab
    action: ActionTab
    history: HistoryBox
    api: ApiBox
    results_gallery: Any = None  # cosmos3_ui.gallery.ResultsGallery
    set_aside: Any = None  # gr.State: {"t2i.steps": 20, ...} values a model switch could not keep, until one can

    def gen_tabs(self) -> tuple[GenTab, GenTab]:
        return self.t2i, self.t2v

    def all_tabs(self) -> tuple:
        return self.t2i, self.t2v, self.action
