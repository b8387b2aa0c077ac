"""Blind pairwise review, without Gradio: draw a pair, show it as A and B, record the choices.

What reaches the page is only: the two media files copied to neutral names (`A.png`, `B.mp4`) in a
fresh private folder, the item's prompt and mode, and counts. Configuration names, models, request
ids, parameters and output paths stay on the server; the pair id lives in server-side session state.
"""
from __future__ import annotations

import json
import secrets
import shutil
import tempfile
from dataclasses import dataclass
from itertools import combinations
from pathlib import Path

from ..service import StudioError
from .runs import Run
from .store import ReviewStore


@dataclass(frozen=True)
class BlindView:
    pair_id: str
    media_a: str
    media_b: str
    is_video: bool
    prompt: str
    mode: str
    remaining: int  # pairs of this run the reviewer has not judged yet, this one included


class BlindDesk:
    def __init__(self, store: ReviewStore):
        self.store = store
        self.criteria = store.criteria
        self._folder = Path(tempfile.mkdtemp(prefix="cosmos3-blind-"))

    def run_choices(self) -> list[tuple[str, str]]:
        """(label, run id) of every suite run with at least two configurations; labels name no configuration."""
        out = []
        for run in reversed(self.store.runs.runs()):
            if len(run.configs) >= 2:
                label = f"{run.run_id} · {run.suite} · {len(run.items)} items x {len(run.configs)} configurations"
                out.append((label, run.run_id))
        return out

    def _candidates(self, run: Run, reviewer: str) -> list[tuple[str, tuple, tuple]]:
        run_id = run.run_id
        done = self.store.runs.done(run_id)
        judged = self.store.pairs.judged(run_id, reviewer)
        out = []
        for item in run.items:
            ready = [(c.name, done[(item.id, c.name, 0)]) for c in run.configs if (item.id, c.name, 0) in done]
            for (name_x, x), (name_y, y) in combinations(ready, 2):
                if (item.id, frozenset((name_x, name_y))) not in judged and x["media"] and y["media"]:
                    out.append((item.id, (name_x, x["request_id"], x["media"]), (name_y, y["request_id"], y["media"])))
        return out

    def draw(self, run_id: str | None, reviewer: str) -> BlindView | None:
        """A random pair this reviewer has not judged yet, in random order; None when none is left."""
        if not run_id:
            raise StudioError("Pick a suite run first.", "run")
        try:
            run = self.store.runs.run(run_id)
        except ValueError as exc:
            raise StudioError(str(exc), "run") from None
        candidates = self._candidates(run, reviewer)
        if not candidates:
            return None
        item_id, first, second = candidates[secrets.randbelow(len(candidates))]
        try:
            pair = self.store.pairs.open_pair(run_id, item_id, first[:2], second[:2], reviewer)
        except ValueError as exc:
            raise StudioError(str(exc)) from None
        media = {first[0]: first[2], second[0]: second[2]}
        folder = self._folder / pair.pair_id
        folder.mkdir()
        shown = []
        for letter, config in (("A", pair.config_a), ("B", pair.config_b)):
            source = Path(media[config])
            target = folder / f"{letter}{source.suffix.lower()}"
            shutil.copyfile(source, target)  # bytes only: no name, path or timestamp of the original
            shown.append(str(target))
        item = next(i for i in run.items if i.id == item_id)
        prompt = item.prompt if isinstance(item.prompt, str) else json.dumps(item.prompt, ensure_ascii=False, indent=1)
        return BlindView(pair.pair_id, shown[0], shown[1], shown[0].endswith(".mp4"), prompt, item.mode,
                         len(candidates))

    def reveal(self, pair_id: str | None, reviewer: str) -> str:
        """Which configuration was A and which B, only once this reviewer's vote on the pair is stored:
        the check reads the database, so no page state can reveal a pair before its vote."""
        if not pair_id:
            raise StudioError("Draw a pair and save your choice first.", "pair")
        pair = self.store.pairs.pair(pair_id)
        if pair is None or pair.reviewer != reviewer:
            raise StudioError("This pair is unknown or was drawn for another reviewer; draw your own.", "pair")
        if self.store.pairs.stored_choices(pair_id, reviewer) is None:
            raise StudioError("Save your choice first: a pair is revealed only after your vote is stored.", "pair")
        run = self.store.runs.run(pair.run_id)
        model = {c.name: c.model for c in run.configs}
        return (f"A was {pair.config_a} ({model.get(pair.config_a, '?')}); "
                f"B was {pair.config_b} ({model.get(pair.config_b, '?')}).")

    def judge(self, pair_id: str | None, reviewer: str, choices: dict[str, str | None], note: str | None) -> str:
        if not pair_id:
            raise StudioError("Draw a pair first.", "pair")
        try:
            count = self.store.pairs.judge(pair_id, reviewer, choices, note or "")
        except ValueError as exc:
            raise StudioError(str(exc)) from None
        shutil.rmtree(self._folder / pair_id, ignore_errors=True)
        return f"Recorded {count} of {len(self.criteria)} criteria for this pair. Draw the next one."
