"""A gallery of this browser's results: the History strip's entries as large tiles, each opening in a
full preview with its model, mode and seed; picking one restores it as History does.

Its own module (History's entries and their checks stay in `history`): it reads the History state,
draws it, and hands a pick to the same restore.
"""
from __future__ import annotations

from dataclasses import dataclass

import gradio as gr

from . import history as H
from .common import PRIVATE


@dataclass
class ResultsGallery:
    """The gallery view: large tiles of every result this browser keeps."""

    box: gr.Accordion
    gallery: gr.Gallery

    @classmethod
    def build(cls) -> "ResultsGallery":
        with gr.Accordion("Gallery of your results", open=False, elem_id="results-gallery-box") as box:
            gallery = gr.Gallery(label="Your results (newest first)", columns=[2, 3, 4], height="auto",
                                 allow_preview=True, preview=False, object_fit="contain", interactive=False,
                                 show_label=True, buttons=["download", "fullscreen"], elem_id="results-gallery")
        return cls(box, gallery)

    def wire(self, history_state, seal, restore, restore_outputs: list) -> None:
        """Follow the History state; a tile picked restores its result (as a History pick does)."""

        def on_history(history):
            return H.gallery_items(H.clean(history or [], seal))

        history_state.change(on_history, inputs=history_state, outputs=self.gallery, queue=False,
                             api_visibility=PRIVATE)
        self.box.expand(on_history, inputs=history_state, outputs=self.gallery, queue=False, api_visibility=PRIVATE)

        def on_select(history, evt: gr.SelectData):
            entry = H.entry_at(H.clean(history or [], seal), evt.index if evt is not None else None)
            return restore(entry) if entry is not None else {}

        self.gallery.select(on_select, inputs=history_state, outputs=restore_outputs, queue=False,
                            api_visibility=PRIVATE)
