"""Review mode, without Gradio: picking a registered result, showing it with its ratings, rating it,
and exporting every rating. Storage is `store.ReviewStore` (SQLite, WAL) under the outputs
folder; this module only shapes what the Review tab shows and turns store refusals into messages.
"""
from __future__ import annotations

import json
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .store import ReviewStore

from ..service import StudioError

SCORE_CHOICES = ("1", "2", "3", "4", "5")
MEDIA_NAMES = ("image.png", "video.mp4")


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

    def __init__(self, store: ReviewStore):
        self.store = store
        self.criteria = store.criteria
        self._exports = Path(tempfile.mkdtemp(prefix="cosmos3-review-exports-"))

    def columns(self) -> list[str]:
        return ["reviewer", *[criterion_label(c) for c in self.criteria], "notes", "updated"]

    def choices(self) -> list[tuple[str, str]]:
        """(label, request id) for every registered result, newest first."""
        out = []
        for row in reversed(self.store.results()):
            label = f"{row['request_id']} · {row['model']} · {row['mode']} · {row['origin']}"
            out.append((label, row["request_id"]))
        return out

    def view(self, request_id: str | None, reviewer: str | None = None) -> ResultView | None:
        if not request_id:
            return None
        found = [r for r in self.store.results() if r["request_id"] == request_id]
        if not found:
            raise StudioError(f"No result {request_id!r} is registered for review; press Refresh.", "result")
        folder = Path(found[0]["folder"])
        media = next((folder / n for n in MEDIA_NAMES if (folder / n).is_file()), None)
        summary = {k: found[0][k] for k in ("request_id", "model", "mode", "origin", "created")}
        sidecar = folder / "params.json"
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
        """Store one reviewer's rating; returns a confirmation, raises StudioError with the store's reason."""
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

    def export(self, kind: str) -> str:
        """Write every rating as CSV or JSONL to a fresh file outside the served outputs; return its path."""
        if kind not in ("csv", "jsonl"):
            raise StudioError(f"Export as csv or jsonl, got {kind!r}.")
        text = self.store.export_csv() if kind == "csv" else self.store.export_jsonl()
        path = self._exports / f"ratings-{time.strftime('%Y%m%d-%H%M%S')}-{time.time_ns() % 10**6:06d}.{kind}"
        path.write_text(text, encoding="utf-8")
        return str(path)
