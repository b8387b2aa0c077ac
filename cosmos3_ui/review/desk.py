"""Review mode, without Gradio: listing every result in the outputs folder, showing one with its
ratings, rating it under the signed-in reviewer's name, and exporting. Storage is
`store.ReviewStore` (SQLite, WAL, outside every served folder); this module only shapes what the
Review tab shows and turns store refusals into messages.
"""
from __future__ import annotations

import json
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.pipeline.outputs import SIDECAR_NAME

from .listing import MEDIA_NAMES, Listed, sync_outputs
from .store import ReviewStore
from .thumbnails import Thumbnails

from ..service import StudioError

SCORE_CHOICES = ("1", "2", "3", "4", "5")
GALLERY_SIZE = 120
PROMPT_CHARS = 60


def reviewer_of(request) -> str:
    """The signed-in user's name from a `gr.Request` (the login); never a value the page sends.
    Review mode always has a login, so an empty name is refused."""
    name = getattr(request, "username", None) or ""
    if not name:
        raise StudioError("Sign in to review: review data is saved under your login name.")
    return name


def criterion_label(name: str) -> str:
    return name.replace("_", " ").capitalize()


@dataclass
class ResultView:
    """One registered result as the Review tab shows it."""

    request_id: str
    media: str | None
    is_video: bool
    summary: dict
    rows: list[list[Any]]  # ratings table rows: reviewer, one score per criterion, notes, updated
    own_scores: dict[str, int] = field(default_factory=dict)  # the current reviewer's earlier rating, if any
    own_notes: str = ""


class ReviewDesk:
    """The Review tab's logic over one store; every call reads the store afresh (several reviewers)."""

    def __init__(self, store: ReviewStore, outputs_root: str | Path):
        self.store = store
        self.outputs_root = Path(outputs_root)
        self.criteria = store.criteria
        self._exports = Path(tempfile.mkdtemp(prefix="cosmos3-review-exports-"))
        self.thumbnails = Thumbnails()
        self.listed: list[Listed] = []

    def refresh(self) -> list[Listed]:
        """Scan the outputs folder: every result made there, in review mode or not, becomes reviewable."""
        self.listed = sync_outputs(self.store, self.outputs_root)
        return self.listed

    def gallery(self) -> list[tuple[str, str, str]]:
        """(request id, thumbnail, caption) for the newest reviewable results; the caption starts with the id."""
        out = []
        for entry in [e for e in self.listed if e.reviewable][:GALLERY_SIZE]:
            prompt = entry.prompt if len(entry.prompt) <= PROMPT_CHARS else entry.prompt[:PROMPT_CHARS - 1] + "…"
            thumb = self.thumbnails.of(entry.request_id, entry.media)
            if thumb is not None:
                out.append((entry.request_id, str(thumb), f"{entry.request_id} · {entry.model} · {entry.mode} · {prompt}"))
        return out

    def unreviewable(self) -> list[list[str]]:
        """[folder, why] for every result folder that cannot be reviewed."""
        return [[str(e.folder.relative_to(self.outputs_root.resolve())), e.reason] for e in self.listed
                if not e.reviewable]

    def columns(self) -> list[str]:
        return ["reviewer", *[criterion_label(c) for c in self.criteria], "notes", "updated"]

    def choices(self) -> list[tuple[str, str]]:
        """(label, request id) for every registered result, newest first."""
        out = []
        prompts = {e.request_id: e.prompt for e in self.listed}
        for row in reversed(self.store.results()):
            prompt = prompts.get(row["request_id"], "")[:PROMPT_CHARS]
            label = f"{row['request_id']} · {row['model']} · {row['mode']} · {row['origin']}" + (f" · {prompt}" if prompt else "")
            out.append((label, row["request_id"]))
        return out

    def view(self, request_id: str | None, reviewer: str | None = None) -> ResultView | None:
        if not request_id:
            return None
        found = self.store.result(request_id)
        if found is None:
            raise StudioError(f"No result {request_id!r} is registered for review; press Refresh.", "result")
        folder = Path(found["folder"])
        media = next((folder / n for n in MEDIA_NAMES if (folder / n).is_file()), None)
        summary = {k: found[k] for k in ("request_id", "model", "mode", "origin", "created")}
        sidecar = folder / SIDECAR_NAME
        if sidecar.is_file():
            try:
                params = json.loads(sidecar.read_text(encoding="utf-8"))
                summary["params"] = params.get("params", params)
                summary["timings"] = params.get("timings")
                summary["seed"] = params.get("seed")
            except (OSError, ValueError):
                summary["params"] = "params.json could not be read"
        rows, own_scores, own_notes = [], {}, ""
        for rating in self.store.ratings(request_id):
            rows.append([rating["reviewer"], *[rating["scores"].get(c, "") for c in self.criteria], rating["notes"],
                         rating["updated"]])
            if reviewer and rating["reviewer"] == reviewer.strip():
                own_scores, own_notes = rating["scores"], rating["notes"]
        return ResultView(request_id, str(media) if media else None, bool(media and media.suffix == ".mp4"), summary,
                          rows, own_scores, own_notes)

    def rate(self, request_id: str | None, reviewer: str | None, scores: dict[str, Any], notes: str | None) -> str:
        """Store one reviewer's rating; returns a confirmation, raises StudioError with the store's reason.

        `reviewer` is the signed-in user (`gr.Request.username`), never a value the page sends."""
        if not request_id:
            raise StudioError("Pick a result to rate first.", "result")
        picked: dict[str, int] = {}
        for criterion, value in scores.items():
            if value in (None, ""):
                continue
            try:
                picked[criterion] = int(value)
            except (TypeError, ValueError):
                raise StudioError(f"Score for {criterion_label(criterion)} must be 1 to 5, got {value!r}.") from None
        try:
            self.store.rate(request_id, reviewer or "", picked, notes or "")
        except ValueError as exc:
            raise StudioError(str(exc)) from None
        return (f"Saved {(reviewer or '').strip()}'s rating of {request_id} "
                f"({len(picked)} of {len(self.criteria)} criteria scored) at {time.strftime('%H:%M:%S')}.")

    def export(self, kind: str, what: str = "ratings") -> str:
        """Write every rating (or blind judgement) as CSV or JSONL to a fresh file outside the served
        outputs, for the signed-in reviewer who asked; return its path."""
        if kind not in ("csv", "jsonl"):
            raise StudioError(f"Export as csv or jsonl, got {kind!r}.")
        if what not in ("ratings", "judgements"):
            raise StudioError(f"Export ratings or judgements, got {what!r}.")
        source = self.store if what == "ratings" else self.store.pairs
        text = source.export_csv() if kind == "csv" else source.export_jsonl()
        return str(self.write_export(f"{what}.{kind}", text))

    def write_export(self, name: str, text: str) -> Path:
        stem, _, suffix = name.rpartition(".")
        folder = Path(tempfile.mkdtemp(prefix="export-", dir=self._exports))  # one folder per request: no clashes
        path = folder / f"{stem}-{time.strftime('%Y%m%d-%H%M%S')}.{suffix}"
        path.write_text(text, encoding="utf-8")
        return path
