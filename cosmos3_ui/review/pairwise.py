"""Blind pairwise judgements: the hidden A/B mapping and each reviewer's A / B / tie per criterion.

A pair is drawn for one signed-in reviewer: one suite item run under two configurations, shown in a
random order. Which configuration is A stays in this table (server-side, with the reviewer and the
time); the page only ever holds an opaque pair id in server-side session state. A judgement is
stored against the pair and resolved to configuration names only when the leaderboard or an export
reads it.
"""
from __future__ import annotations

import csv
import io
import json
import secrets
from dataclasses import dataclass

from .db import MAX_NOTES, Database, check_reviewer, now

CHOICES = ("A", "B", "tie")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS pairs (
    pair_id TEXT PRIMARY KEY,
    run_id TEXT NOT NULL,
    item_id TEXT NOT NULL,
    config_a TEXT NOT NULL,
    config_b TEXT NOT NULL,
    request_a TEXT NOT NULL,
    request_b TEXT NOT NULL,
    reviewer TEXT NOT NULL,
    created TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS judgements (
    pair_id TEXT NOT NULL,
    reviewer TEXT NOT NULL,
    choices TEXT NOT NULL,
    note TEXT NOT NULL,
    created TEXT NOT NULL,
    PRIMARY KEY (pair_id, reviewer)
);
"""


@dataclass(frozen=True)
class Pair:
    """A drawn pair, as the server knows it (never sent to the page as such)."""

    pair_id: str
    run_id: str
    item_id: str
    config_a: str
    config_b: str
    request_a: str
    request_b: str
    reviewer: str


@dataclass(frozen=True)
class Outcome:
    """One criterion of one judgement, resolved: `score_a` is 1 (A won), 0 (B won) or 0.5 (tie)."""

    run_id: str
    item_id: str
    reviewer: str
    criterion: str
    config_a: str
    config_b: str
    score_a: float


class PairStore:
    def __init__(self, db: Database, criteria: tuple[str, ...]):
        self.db = db
        self.criteria = tuple(criteria)
        db.add_schema(_SCHEMA)

    def open_pair(self, run_id: str, item_id: str, first: tuple[str, str], second: tuple[str, str],
                  reviewer: str) -> Pair:
        """Store a pair of (configuration, request id) in a random order; returns it with a fresh id."""
        reviewer = check_reviewer(reviewer)
        a, b = (first, second) if secrets.randbelow(2) == 0 else (second, first)
        pair = Pair(secrets.token_urlsafe(12), run_id, item_id, a[0], b[0], a[1], b[1], reviewer)
        with self.db.connect() as db:
            db.execute("INSERT INTO pairs VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                       (pair.pair_id, run_id, item_id, pair.config_a, pair.config_b, pair.request_a, pair.request_b,
                        reviewer, now()))
        return pair

    def pair(self, pair_id: str) -> Pair | None:
        with self.db.connect() as db:
            row = db.execute("SELECT pair_id, run_id, item_id, config_a, config_b, request_a, request_b, reviewer "
                             "FROM pairs WHERE pair_id = ?", (pair_id,)).fetchone()
        return Pair(*row) if row else None

    def judge(self, pair_id: str, reviewer: str, choices: dict[str, str | None], note: str = "") -> int:
        """Store (or replace) the reviewer's choices for a pair drawn for them; returns how many criteria."""
        reviewer = check_reviewer(reviewer)
        pair = self.pair(pair_id) if isinstance(pair_id, str) else None
        if pair is None:
            raise ValueError("This pair is unknown or has expired; draw a new pair.")
        if pair.reviewer != reviewer:
            raise ValueError("This pair was drawn for another reviewer; draw your own.")
        picked = {c: v for c, v in choices.items() if v not in (None, "")}
        unknown = sorted(set(picked) - set(self.criteria))
        if unknown:
            raise ValueError(f"Unknown criteria {unknown}; this review uses {list(self.criteria)}.")
        bad = {c: v for c, v in picked.items() if v not in CHOICES}
        if bad:
            raise ValueError(f"Choices must be one of {list(CHOICES)}; got {bad}.")
        if not picked:
            raise ValueError("Choose A, B or tie for at least one criterion.")
        if len(note) > MAX_NOTES:
            raise ValueError(f"The note is {len(note)} characters long; at most {MAX_NOTES}.")
        with self.db.connect() as db:
            db.execute("INSERT INTO judgements VALUES (?, ?, ?, ?, ?) ON CONFLICT(pair_id, reviewer) DO UPDATE SET "
                       "choices = excluded.choices, note = excluded.note, created = excluded.created",
                       (pair_id, reviewer, json.dumps(picked, sort_keys=True), note, now()))
        return len(picked)

    def stored_choices(self, pair_id: str, reviewer: str) -> dict[str, str] | None:
        """The reviewer's stored choices for a pair, or None when no vote is stored (the reveal's gate)."""
        with self.db.connect() as db:
            row = db.execute("SELECT choices FROM judgements WHERE pair_id = ? AND reviewer = ?",
                             (pair_id, reviewer)).fetchone()
        return json.loads(row[0]) if row else None

    def judgements(self, run_id: str | None = None) -> list[dict]:
        """Every judgement with its hidden mapping resolved (for the leaderboard and exports)."""
        query = ("SELECT p.pair_id, p.run_id, p.item_id, p.config_a, p.config_b, p.request_a, p.request_b, "
                 "j.reviewer, j.choices, j.note, j.created FROM judgements j JOIN pairs p USING (pair_id)")
        args: tuple = ()
        if run_id is not None:
            query += " WHERE p.run_id = ?"
            args = (run_id,)
        with self.db.connect() as db:
            rows = db.execute(query + " ORDER BY j.created, p.pair_id", args).fetchall()
        keys = ("pair_id", "run_id", "item_id", "config_a", "config_b", "request_a", "request_b", "reviewer",
                "choices", "note", "created")
        out = [dict(zip(keys, row)) for row in rows]
        for row in out:
            row["choices"] = json.loads(row["choices"])
        return out

    def outcomes(self, run_id: str | None = None, criterion: str | None = None) -> list[Outcome]:
        score = {"A": 1.0, "B": 0.0, "tie": 0.5}
        out = []
        for row in self.judgements(run_id):
            for name, choice in sorted(row["choices"].items()):
                if criterion is None or name == criterion:
                    out.append(Outcome(row["run_id"], row["item_id"], row["reviewer"], name, row["config_a"],
                                       row["config_b"], score[choice]))
        return out

    def judged(self, run_id: str, reviewer: str) -> set[tuple[str, frozenset]]:
        """(item id, {config, config}) the reviewer has already judged in this run."""
        return {(row["item_id"], frozenset((row["config_a"], row["config_b"])))
                for row in self.judgements(run_id) if row["reviewer"] == reviewer}

    # -- exports --------------------------------------------------------------------------------

    def export_jsonl(self, run_id: str | None = None) -> str:
        return "".join(json.dumps(row, sort_keys=True) + "\n" for row in self.judgements(run_id))

    def export_csv(self, run_id: str | None = None) -> str:
        columns = ["pair_id", "run_id", "item_id", "reviewer", "config_a", "config_b", *self.criteria, "note",
                   "created", "request_a", "request_b"]
        buffer = io.StringIO()
        writer = csv.DictWriter(buffer, fieldnames=columns, extrasaction="ignore")
        writer.writeheader()
        for row in self.judgements(run_id):
            writer.writerow({**row, **{c: row["choices"].get(c, "") for c in self.criteria}})
        return buffer.getvalue()
