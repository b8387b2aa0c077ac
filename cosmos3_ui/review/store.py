"""Durable review data in one SQLite file: results, 1-5 ratings, blind pairwise judgements, suite runs.

The file lives outside every served folder (by default in the app's cache folder, never in the
outputs folder: a later public run on the same outputs must not serve it). WAL mode and a busy
timeout let several reviewers (threads or processes) write at once; every call opens its own
connection, so nothing is shared between threads. `ReviewStore` owns results and ratings;
`store.pairs` (pairwise.py) and `store.runs` (runs.py) own their own tables in the same file.
"""
from __future__ import annotations

import csv
import io
import json
import re
import sqlite3
import time
from pathlib import Path

from engine.pipeline.outputs import SIDECAR_NAME

from .db import MAX_NOTES, Database, check_reviewer, now
from .pairwise import PairStore
from .runs import RunStore

DEFAULT_CRITERIA = ("prompt_adherence", "visual_quality", "temporal_consistency", "physics_plausibility")
DB_NAME = "reviews.sqlite3"
SIDE_FILES = ("-wal", "-shm", "-journal")
REQUEST_ID = re.compile(r"^[0-9]{8}-[0-9]{6}-[0-9a-f]{12}$")
_CRITERION = re.compile(r"^[a-z][a-z0-9_]{0,40}$")

_RESULT_KEYS = ("request_id", "model", "mode", "origin", "folder", "created")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS results (
    request_id TEXT PRIMARY KEY,
    model TEXT NOT NULL,
    mode TEXT NOT NULL,
    origin TEXT NOT NULL,
    folder TEXT NOT NULL,
    created TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS ratings (
    request_id TEXT NOT NULL,
    reviewer TEXT NOT NULL,
    scores TEXT NOT NULL,
    notes TEXT NOT NULL,
    updated TEXT NOT NULL,
    PRIMARY KEY (request_id, reviewer)
);
"""


def parse_criteria(text: str | None) -> tuple[str, ...]:
    """`"a,b,c"` -> ("a", "b", "c"); None or empty -> the defaults."""
    if not text:
        return DEFAULT_CRITERIA
    names = tuple(name.strip() for name in text.split(",") if name.strip())
    bad = [n for n in names if not _CRITERION.match(n)]
    if bad or not names:
        raise ValueError(f"Criteria must be lowercase names like 'visual_quality', comma-separated; got {bad or text!r}.")
    return names


def check_db_location(db_path: Path, served: list[Path]) -> None:
    """Refuse a database inside a served folder (its WAL and SHM files would be served too)."""
    resolved = db_path.resolve()
    for folder in served:
        folder = Path(folder).resolve()
        if resolved == folder or folder in resolved.parents:
            raise ValueError(f"The review database {str(db_path)!r} is inside the served folder {str(folder)!r}; "
                             "put it elsewhere (--review-db), so that no URL can ever return it.")


def adopt_legacy_db(outputs_root: Path, db_path: Path) -> Path | None:
    """Move a database that earlier versions kept in the outputs folder out of it (once).

    SQLite's backup API copies it consistently (WAL included) to `db_path`, or beside it when
    `db_path` already exists (nothing is merged or lost); then the old files are removed, so a later
    public run on the same outputs folder has nothing to serve. Returns where it went, or None.
    """
    legacy = Path(outputs_root) / DB_NAME
    if not legacy.is_file():
        return None
    target = db_path if not db_path.exists() else db_path.with_name(
        f"{db_path.stem}-from-outputs-{time.strftime('%Y%m%d-%H%M%S')}{db_path.suffix}")
    target.parent.mkdir(parents=True, exist_ok=True)
    source, copy = sqlite3.connect(legacy), sqlite3.connect(target)
    try:
        source.backup(copy)
    finally:
        source.close()
        copy.close()
    for suffix in ("", *SIDE_FILES):
        Path(f"{legacy}{suffix}").unlink(missing_ok=True)
    return target


class ReviewStore:
    """Results registered for review and their 1-5 ratings; `pairs` and `runs` share the file."""

    def __init__(self, db_path: str | Path, criteria: tuple[str, ...] = DEFAULT_CRITERIA):
        self.path = Path(db_path)
        self.criteria = tuple(criteria)
        self.db = Database(self.path, _SCHEMA)
        self.pairs = PairStore(self.db, self.criteria)
        self.runs = RunStore(self.db)

    def _connect(self):
        return self.db.connect()

    def register_result(self, request_id: str, folder: str | Path, *, model: str, mode: str, origin: str) -> None:
        """Make a saved result reviewable (idempotent)."""
        self.register_results([(request_id, folder, model, mode, origin)])

    def register_results(self, results: list[tuple[str, str | Path, str, str, str]]) -> None:
        """Make saved results reviewable, each (request id, folder, model, mode, origin), in one transaction
        (idempotent): a first scan of an outputs folder registers thousands at once."""
        for request_id, *_ in results:
            self._check_id(request_id)
        created = now()
        rows = [(rid, model, mode, origin, str(Path(folder).resolve()), created) for rid, folder, model, mode, origin in results]
        with self._connect() as db:
            db.execute("BEGIN")  # autocommit connections: without it every row is its own commit
            db.executemany("INSERT OR IGNORE INTO results VALUES (?, ?, ?, ?, ?, ?)", rows)
            db.execute("COMMIT")

    def rate(self, request_id: str, reviewer: str, scores: dict[str, int], notes: str = "") -> None:
        """Store (or replace) one reviewer's scores and notes for one result."""
        self._check_id(request_id)
        reviewer = check_reviewer(reviewer)
        unknown = sorted(set(scores) - set(self.criteria))
        if unknown:
            raise ValueError(f"Unknown criteria {unknown}; this review uses {list(self.criteria)}.")
        for criterion, score in scores.items():
            if isinstance(score, bool) or not isinstance(score, int) or not 1 <= score <= 5:
                raise ValueError(f"Score for {criterion!r} must be an integer from 1 to 5, got {score!r}.")
        if not scores and not notes.strip():
            raise ValueError("Give at least one score or a note.")
        if len(notes) > MAX_NOTES:
            raise ValueError(f"Notes are {len(notes)} characters long; at most {MAX_NOTES}.")
        with self._connect() as db:
            if db.execute("SELECT 1 FROM results WHERE request_id = ?", (request_id,)).fetchone() is None:
                raise ValueError(f"No result {request_id!r} is registered for review.")
            db.execute(
                "INSERT INTO ratings VALUES (?, ?, ?, ?, ?) ON CONFLICT(request_id, reviewer) DO UPDATE SET "
                "scores = excluded.scores, notes = excluded.notes, updated = excluded.updated",
                (request_id, reviewer, json.dumps(scores, sort_keys=True), notes, now()),
            )

    def ratings(self, request_id: str | None = None) -> list[dict]:
        query = ("SELECT r.request_id, r.reviewer, r.scores, r.notes, r.updated, s.model, s.mode, s.origin, s.folder "
                 "FROM ratings r JOIN results s USING (request_id)")
        args: tuple = ()
        if request_id is not None:
            query += " WHERE r.request_id = ?"
            args = (request_id,)
        with self._connect() as db:
            rows = db.execute(query + " ORDER BY r.request_id, r.reviewer", args).fetchall()
        out = []
        for rid, reviewer, scores, notes, updated, model, mode, origin, folder in rows:
            out.append({"request_id": rid, "reviewer": reviewer, "scores": json.loads(scores), "notes": notes,
                        "updated": updated, "model": model, "mode": mode, "origin": origin, "folder": folder,
                        "files": sorted(p.name for p in Path(folder).glob("*") if p.is_file()),
                        "sidecar": str(Path(folder) / SIDECAR_NAME)})
        return out

    def results(self) -> list[dict]:
        with self._connect() as db:
            rows = db.execute(f"SELECT {', '.join(_RESULT_KEYS)} FROM results ORDER BY created").fetchall()
        return [dict(zip(_RESULT_KEYS, row)) for row in rows]

    def result(self, request_id: str) -> dict | None:
        """One registered result (as in `results()`), or None."""
        with self._connect() as db:
            row = db.execute(f"SELECT {', '.join(_RESULT_KEYS)} FROM results WHERE request_id = ?",
                             (request_id,)).fetchone()
        return dict(zip(_RESULT_KEYS, row)) if row else None

    # -- exports --------------------------------------------------------------------------------

    def export_jsonl(self) -> str:
        return "".join(json.dumps(row, sort_keys=True) + "\n" for row in self.ratings())

    def export_csv(self) -> str:
        columns = ["request_id", "reviewer", *self.criteria, "notes", "updated", "model", "mode", "origin", "folder",
                   "sidecar"]
        buffer = io.StringIO()
        writer = csv.DictWriter(buffer, fieldnames=columns, extrasaction="ignore")
        writer.writeheader()
        for row in self.ratings():
            writer.writerow({**row, **{c: row["scores"].get(c, "") for c in self.criteria}})
        return buffer.getvalue()

    @staticmethod
    def read_csv(text: str, criteria: tuple[str, ...] = DEFAULT_CRITERIA) -> list[dict]:
        rows = []
        for record in csv.DictReader(io.StringIO(text)):
            scores = {c: int(record.pop(c)) for c in criteria if record.get(c)}
            for c in criteria:
                record.pop(c, None)
            rows.append({**record, "scores": scores})
        return rows

    @staticmethod
    def read_jsonl(text: str) -> list[dict]:
        return [json.loads(line) for line in text.splitlines() if line.strip()]

    @staticmethod
    def _check_id(request_id: str) -> None:
        if not isinstance(request_id, str) or not REQUEST_ID.match(request_id):
            raise ValueError(f"{request_id!r} is not a result id (like 20261129-101500-0123456789ab).")

