"""Model critiques in review mode: the checkpoint's reasoner describes a result and answers the review
criteria. Kept beside the human ratings (same database file, its own table), always marked as the
model's, never a rating: nothing here reads or writes the `ratings` table.

The review store is helper `review`'s (cosmos3_ui/review/); this module only adds a table through the
store's public `db.add_schema` and a box in the Review tab (three wiring lines in review/tabs.py).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import gradio as gr

from engine.pipeline.outputs import IMAGE_NAME, SIDECAR_NAME, VIDEO_NAME

from .common import status_html
from .jobs import session_of
from .reasoner_panel import follow_reasoner
from .review.db import now
from .service import StudioError, StudioService

_SCHEMA = """
CREATE TABLE IF NOT EXISTS model_critiques (
    request_id TEXT NOT NULL,
    reasoner TEXT NOT NULL,
    text TEXT NOT NULL,
    scores TEXT NOT NULL,
    created TEXT NOT NULL,
    PRIMARY KEY (request_id, reasoner)
);
"""
MEDIA = (VIDEO_NAME, IMAGE_NAME)


class CritiqueStore:
    """Model critiques of registered results, in the review store's file."""

    def __init__(self, store):
        self.store = store
        store.db.add_schema(_SCHEMA)

    def save(self, request_id: str, reasoner: str, text: str, scores: dict) -> None:
        with self.store.db.connect() as db:
            db.execute("INSERT INTO model_critiques VALUES (?, ?, ?, ?, ?) ON CONFLICT(request_id, reasoner) DO UPDATE "
                       "SET text = excluded.text, scores = excluded.scores, created = excluded.created",
                       (request_id, reasoner, text, json.dumps(scores, sort_keys=True), now()))

    def for_result(self, request_id: str) -> list[dict]:
        with self.store.db.connect() as db:
            rows = db.execute("SELECT reasoner, text, scores, created FROM model_critiques WHERE request_id = ? "
                              "ORDER BY created", (request_id,)).fetchall()
        return [{"by": "model", "reasoner": r, "text": t, "scores": json.loads(s), "created": c}
                for r, t, s, c in rows]


def critique_request(store, request_id: str, criteria: tuple[str, ...]) -> tuple[str, dict]:
    """(model name, reasoner request) for a registered result: its media, the prompt it came from."""
    found = store.result(request_id)
    if found is None:
        raise StudioError(f"No result {request_id!r} is registered for review; press Refresh.", "result")
    folder = Path(found["folder"])
    media = next((folder / name for name in MEDIA if (folder / name).is_file()), None)
    if media is None:
        raise StudioError(f"Result {request_id!r} has no {' or '.join(MEDIA)} to critique.", "result")
    prompt = ""
    sidecar = folder / SIDECAR_NAME
    if sidecar.is_file():
        try:
            params = json.loads(sidecar.read_text(encoding="utf-8"))
            prompt = params.get("prompt_text") or (params.get("params") or {}).get("prompt") or ""
        except (OSError, ValueError):
            prompt = ""
    if not prompt:
        raise StudioError(f"Result {request_id!r} has no readable prompt in params.json to judge it against.", "result")
    key = "video" if media.suffix == ".mp4" else "image"
    return found["model"], {"task": "critique", "prompt": prompt, key: str(media), "criteria": list(criteria),
                               "temperature": 0.0}


def critique_markdown(critiques: list[dict]) -> str:
    if not critiques:
        return "_No model critique yet._"
    parts = []
    for c in critiques:
        scores = ", ".join(f"{k}: {v if v is not None else 'no score'}" for k, v in c["scores"].items())
        parts.append(f"**Model critique** (the reasoner of `{c['reasoner']}`, {c['created']}; not a rating)\n\n"
                     f"{c['text']}\n\n_Scores read from it:_ {scores}")
    return "\n\n---\n\n".join(parts)


class CritiqueBox:
    """The Review tab's "Critique with the reasoner" box (built inside the tab)."""

    def __init__(self):
        with gr.Accordion("Model critique (the reasoner's view, never a rating)", open=True):
            self.button = gr.Button("Critique with the reasoner", size="sm", elem_id="review-critique")
            self.stream = gr.Textbox("", label="Reasoner output", lines=3, interactive=False,
                                     elem_id="review-critique-stream")
            self.shown = gr.Markdown("", elem_id="review-critiques")
            self.status = gr.HTML("", elem_id="review-critique-status")

    def wire(self, pick, store, service: StudioService) -> None:
        critiques = CritiqueStore(store)

        def on_pick(request_id):
            return critique_markdown(critiques.for_result(request_id)) if request_id else ""

        pick.change(on_pick, inputs=pick, outputs=self.shown, queue=False, api_visibility="private")

        async def on_critique(request_id, request: gr.Request = None) -> Any:
            try:
                model, req = critique_request(store, request_id or "", store.criteria)
                yield {self.status: status_html("Queued for the reasoner ...", "info"), self.stream: ""}
                async for what, value in follow_reasoner(service, model, req, session_of(request)):
                    if what == "text":
                        yield {self.stream: value}
                    elif what == "cancelled":
                        yield {self.status: status_html("Cancelled; nothing was stored.", "warn")}
                    else:
                        critiques.save(request_id, model, value.text, value.scores)
                        yield {self.stream: value.text, self.shown: critique_markdown(critiques.for_result(request_id)),
                               self.status: status_html("Stored beside the ratings, marked as the model's.", "ok")}
            except StudioError as exc:
                yield {self.status: status_html(str(exc), "error")}

        self.button.click(on_critique, inputs=pick, outputs=[self.stream, self.shown, self.status],
                          api_visibility="private")
