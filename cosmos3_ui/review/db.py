"""The review file's plumbing, shared by the stores that keep their tables in it (`store.ReviewStore`,
`pairwise.PairStore`, `runs.RunStore`): connections, the reviewer's name, timestamps, note length."""
from __future__ import annotations

import sqlite3
import time
from contextlib import contextmanager
from pathlib import Path

MAX_NOTES = 5000
MAX_REVIEWER = 100


def now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S")


def check_reviewer(reviewer: str | None) -> str:
    """The signed-in user's name, as stored; refuses an anonymous or oversized one."""
    name = (reviewer or "").strip()
    if not name or len(name) > MAX_REVIEWER:
        raise ValueError(f"Review data is saved under the signed-in user's name (1-{MAX_REVIEWER} characters); "
                         f"got {reviewer!r}. Sign in again.")
    return name


class Database:
    """One SQLite file; each call gets its own short-lived connection."""

    def __init__(self, path: str | Path, schema: str):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.connect() as db:
            db.execute("PRAGMA journal_mode=WAL")
            db.executescript(schema)

    @contextmanager
    def connect(self):
        db = sqlite3.connect(self.path, timeout=30.0, isolation_level=None)
        try:
            db.execute("PRAGMA busy_timeout=30000")
            yield db
        finally:
            db.close()

    def add_schema(self, schema: str) -> None:
        with self.connect() as db:
            db.executescript(schema)
