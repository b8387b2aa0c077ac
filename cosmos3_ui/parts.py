"""The Studio's components, grouped per tab: what `layout` builds and the other modules read.

Plain dataclasses of Gradio components, so `forms` (form <-> JSON), `handlers` (events) and the
Compare/Review/Batch tabs can use the page's pieces without importing the module that builds it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import gradio as gr

from .caption_editor import CaptionEditor


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
    variant: gr.Markdown
    tabs: gr.Tabs
    current_tab: gr.State
    t2i: GenTab
    t2v: GenTab
    action: ActionTab
    history: HistoryBox
    api: ApiBox

    def gen_tabs(self) -> tuple[GenTab, GenTab]:
        return self.t2i, self.t2v

    def all_tabs(self) -> tuple:
        return self.t2i, self.t2v, self.action
