"""Suite runs: suite x configurations through the job queue, resumable, with automatic checks.

A run is stored before it starts (its items and configurations, frozen), and every finished
(item, configuration) is recorded as it ends, so a run cut short by a restart picks up where it
stopped: `run_suite` skips what is recorded as done. Results land in `outputs/<run id>/<request id>/`
and are registered for review with origin `suite:<run id>`.

Checks beside the ratings, once the generations are done:
- determinism: with `repeat` on, the first item of each configuration runs a second time; the two
  media files must have the same SHA256;
- PSNR, SSIM and LPIPS of every result against the reference configuration's result for the same
  item (`engine.pipeline.quality`, torchmetrics); LPIPS where torchvision and its weights are present,
  otherwise recorded as missing with the reason.
A check that cannot be made is recorded with value None and the reason (a failed task, no reference).
A failed task keeps its message; Resume runs it again.
"""
from __future__ import annotations

import hashlib
import json
import secrets
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from .db import Database, check_reviewer, now
from .suites import Configuration, SuiteItem, build_request, item_from_json, item_to_json

_SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    run_id TEXT PRIMARY KEY,
    suite TEXT NOT NULL,
    items TEXT NOT NULL,
    configs TEXT NOT NULL,
    reference TEXT,
    repeat_check INTEGER NOT NULL,
    created_by TEXT NOT NULL,
    created TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS run_items (
    run_id TEXT NOT NULL,
    item_id TEXT NOT NULL,
    config TEXT NOT NULL,
    attempt INTEGER NOT NULL,
    status TEXT NOT NULL,
    request_id TEXT,
    media TEXT,
    sha256 TEXT,
    message TEXT NOT NULL,
    updated TEXT NOT NULL,
    PRIMARY KEY (run_id, item_id, config, attempt)
);
CREATE TABLE IF NOT EXISTS checks (
    run_id TEXT NOT NULL,
    item_id TEXT NOT NULL,
    config TEXT NOT NULL,
    metric TEXT NOT NULL,
    value REAL,
    detail TEXT NOT NULL,
    PRIMARY KEY (run_id, item_id, config, metric)
);
"""
REFERENCE_METRICS = ("psnr", "ssim", "lpips")
ITEM_KEYS = ("item_id", "config", "attempt", "status", "request_id", "media", "sha256", "message", "updated")


@dataclass(frozen=True)
class Run:
    run_id: str
    suite: str
    items: tuple[SuiteItem, ...]
    configs: tuple[Configuration, ...]
    reference: str | None
    repeat: bool
    created_by: str
    created: str

    def config(self, name: str) -> Configuration:
        return next(c for c in self.configs if c.name == name)

    def tasks(self) -> list[tuple[SuiteItem, Configuration, int]]:
        """Every (item, configuration, attempt): attempt 1 is the determinism repeat of the first item."""
        plan = [(item, config, 0) for item in self.items for config in self.configs]
        if self.repeat:
            plan += [(self.items[0], config, 1) for config in self.configs]
        return plan


_RUN_COLUMNS = "run_id, suite, items, configs, reference, repeat_check, created_by, created"


def _run_of(row: tuple) -> Run:
    items = tuple(item_from_json(v) for v in json.loads(row[2]))
    configs = tuple(Configuration(**v) for v in json.loads(row[3]))
    return Run(row[0], row[1], items, configs, row[4], bool(row[5]), row[6], row[7])


def new_run_id() -> str:
    return "suite-" + time.strftime("%Y%m%d-%H%M%S") + "-" + secrets.token_hex(4)


def sha256_file(path: str | Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


class RunStore:
    def __init__(self, db: Database):
        self.db = db
        db.add_schema(_SCHEMA)

    def create(self, suite: str, items: list[SuiteItem], configs: list[Configuration], *, reference: str | None,
               repeat: bool, reviewer: str) -> Run:
        reviewer = check_reviewer(reviewer)
        if reference is not None and reference not in [c.name for c in configs]:
            raise ValueError(f"The reference {reference!r} is not one of the configurations {[c.name for c in configs]}.")
        run = Run(new_run_id(), suite, tuple(items), tuple(configs), reference, repeat, reviewer, now())
        with self.db.connect() as db:
            db.execute("INSERT INTO runs VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                       (run.run_id, suite, json.dumps([item_to_json(i) for i in items]),
                        json.dumps([c.__dict__ for c in configs]), reference, int(repeat), reviewer, run.created))
        return run

    def run(self, run_id: str) -> Run:
        with self.db.connect() as db:
            row = db.execute(f"SELECT {_RUN_COLUMNS} FROM runs WHERE run_id = ?", (run_id,)).fetchone()
        if row is None:
            raise ValueError(f"No suite run {run_id!r}.")
        return _run_of(row)

    def runs(self) -> list[Run]:
        with self.db.connect() as db:
            rows = db.execute(f"SELECT {_RUN_COLUMNS} FROM runs ORDER BY created, run_id").fetchall()
        return [_run_of(row) for row in rows]

    def done_counts(self) -> dict[str, int]:
        """{run id: generations done} for every run with any, in one query (the Suites table per refresh)."""
        with self.db.connect() as db:
            return dict(db.execute("SELECT run_id, COUNT(*) FROM run_items WHERE status = 'done' GROUP BY run_id"))

    def record(self, run_id: str, item_id: str, config: str, attempt: int, status: str, *,
               request_id: str | None = None, media: str | None = None, sha256: str | None = None,
               message: str = "") -> None:
        with self.db.connect() as db:
            db.execute("INSERT OR REPLACE INTO run_items VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                       (run_id, item_id, config, attempt, status, request_id, media, sha256, message, now()))

    def items(self, run_id: str) -> list[dict]:
        with self.db.connect() as db:
            rows = db.execute(f"SELECT {', '.join(ITEM_KEYS)} FROM run_items WHERE run_id = ? "
                              "ORDER BY item_id, config, attempt", (run_id,)).fetchall()
        return [dict(zip(ITEM_KEYS, row)) for row in rows]

    def done(self, run_id: str) -> dict[tuple[str, str, int], dict]:
        return {(r["item_id"], r["config"], r["attempt"]): r for r in self.items(run_id) if r["status"] == "done"}

    def failed(self, run_id: str) -> list[dict]:
        """The run's failed tasks, with the engine's message (a later success replaces the row)."""
        return [r for r in self.items(run_id) if r["status"] == "failed"]

    def ended(self, run_id: str) -> bool:
        """Every task has run to an end, done or failed (none cancelled or not yet run)."""
        run = self.run(run_id)
        rows = _task_rows(self, run)
        return all(rows.get((i.id, c.name, a), {}).get("status") in ("done", "failed") for i, c, a in run.tasks())

    def progress(self, run_id: str) -> tuple[int, int]:
        return len(self.done(run_id)), len(self.run(run_id).tasks())

    def record_check(self, run_id: str, item_id: str, config: str, metric: str, value: float | None,
                     detail: str = "") -> None:
        with self.db.connect() as db:
            db.execute("INSERT OR REPLACE INTO checks VALUES (?, ?, ?, ?, ?, ?)",
                       (run_id, item_id, config, metric, value, detail))

    def checks(self, run_id: str) -> list[dict]:
        with self.db.connect() as db:
            rows = db.execute("SELECT item_id, config, metric, value, detail FROM checks WHERE run_id = ? "
                              "ORDER BY item_id, config, metric", (run_id,)).fetchall()
        return [dict(zip(("item_id", "config", "metric", "value", "detail"), row)) for row in rows]


def media_of(result) -> str | None:
    outputs = getattr(result, "outputs", {}) or {}
    found = outputs.get("image") or outputs.get("video")
    return str(found) if found else None


def run_suite(runs: RunStore, queue, run_id: str, *, register: Callable | None = None, session_id: str | None = None,
              on_task: Callable[[int, int], None] | None = None, cancel: threading.Event | None = None,
              compare: Callable | None = None) -> tuple[int, int]:
    """Run (or resume) a suite run: every task not yet done (failed ones again), one at a time through the
    queue, then the checks once every task has ended (done or failed). `register(config, result)` makes each
    result reviewable; `compare(reference_media, media)` returns {"psnr", "ssim", "lpips", "lpips_reason"}
    (default: `engine.pipeline.quality.compare_files`). Returns (done, total)."""
    from engine.serving.batch import BatchLine, run_batch

    run = runs.run(run_id)
    done = runs.done(run_id)
    pending = [(item, config, attempt) for item, config, attempt in run.tasks()
               if (item.id, config.name, attempt) not in done]
    total = len(run.tasks())
    lines = [BatchLine(line=n, model=config.model, request=build_request(item, config))
             for n, (item, config, _) in enumerate(pending, start=1)]
    task_of = {line.line: task for line, task in zip(lines, pending)}

    def on_result(line, result):
        item, config, attempt = task_of[line.line]
        media = media_of(result)
        runs.record(run_id, item.id, config.name, attempt, "done", request_id=result.request_id, media=media,
                    sha256=sha256_file(media) if media else None)
        if register is not None:
            register(config, result)

    def on_line(line, _count, _of):
        item, config, attempt = task_of[line.line]
        if line.status != "done":  # failed or cancelled, with the engine's message
            runs.record(run_id, item.id, config.name, attempt, line.status,
                        message=line.message.partition(": ")[2] if line.message.startswith("line ") else line.message)
        if on_task is not None:  # counted in memory: a line is done here exactly when on_result recorded it
            on_task(len(done) + sum(entry.status == "done" for entry in lines), total)

    if lines:
        run_batch(queue, lines, on_result=on_result, on_line=on_line, session_id=session_id, batch_id=run_id,
                  cancel=cancel)
    if runs.ended(run_id):
        record_checks(runs, run, compare)
    return len(runs.done(run_id)), total


def run_state(run: Run, rows: list[dict], running: bool = False) -> str:
    """What the Suites table says of a run: running, finished, failed (how many tasks), or interrupted."""
    if running:
        return "running"
    status = {(r["item_id"], r["config"], r["attempt"]): r["status"] for r in rows}
    tasks = [(item.id, config.name, attempt) for item, config, attempt in run.tasks()]
    failed = sum(status.get(task) == "failed" for task in tasks)
    not_run = sum(status.get(task) not in ("done", "failed") for task in tasks)
    if failed:
        left = f"; {not_run} not run yet" if not_run else ""
        return f"failed: {failed} item{'s' if failed != 1 else ''}{left}; Resume retries them"
    return "finished" if not not_run else "interrupted: resume to finish"


def _task_rows(runs: RunStore, run: Run) -> dict[tuple[str, str, int], dict]:
    return {(r["item_id"], r["config"], r["attempt"]): r for r in runs.items(run.run_id)}


def _why_missing(row: dict | None, what: str) -> str:
    if row is None:
        return f"{what} has not run"
    if row["status"] != "done":
        return f"{what} {row['status']}: {row['message'] or 'no message'}"
    return f"{what} made no media file"


def record_determinism(runs: RunStore, run: Run) -> None:
    """Per configuration: whether the first item's two runs gave byte-identical media (SHA256), or why
    that cannot be said (a run failed, or made no file)."""
    rows = _task_rows(runs, run)
    item = run.items[0]
    for config in run.configs:
        first, again = rows.get((item.id, config.name, 0)), rows.get((item.id, config.name, 1))
        missing = [_why_missing(row, what) for row, what in ((first, f"{item.id!r}"), (again, "its repeat"))
                   if row is None or row["status"] != "done" or not row["sha256"]]
        if missing:
            runs.record_check(run.run_id, item.id, config.name, "deterministic", None,
                              "not checked: " + "; ".join(missing))
            continue
        same = first["sha256"] == again["sha256"]
        detail = (f"same SHA256 {first['sha256'][:16]}" if same else
                  f"differs: SHA256 {first['sha256'][:16]} vs {again['sha256'][:16]}")
        runs.record_check(run.run_id, item.id, config.name, "deterministic", float(same), detail)


def record_references(runs: RunStore, run: Run, compare: Callable) -> None:
    """PSNR, SSIM and LPIPS of every result against the reference configuration's result for its item."""
    rows = _task_rows(runs, run)
    for item in run.items:
        reference = rows.get((item.id, run.reference, 0))
        for config in run.configs:
            current = rows.get((item.id, config.name, 0))
            if config.name == run.reference or current is None or current["status"] != "done":
                continue  # the result's own failure is in the failures table
            if reference is None or reference["status"] != "done" or not reference["media"]:
                scores = {"reason": _why_missing(reference, f"the reference {run.reference!r}")}
            else:
                try:
                    scores = compare(reference["media"], current["media"])
                except ValueError as exc:  # different sizes or frame counts: say so instead of a number
                    scores = {"reason": str(exc)}
            for metric in REFERENCE_METRICS:
                value = scores.get(metric)
                detail = (f"vs {run.reference}" if value is not None else
                          scores.get(f"{metric}_reason") or scores.get("reason") or "not computed")
                runs.record_check(run.run_id, item.id, config.name, metric, value, detail)


def record_checks(runs: RunStore, run: Run, compare: Callable | None = None) -> None:
    """Determinism (with the repeat on) and the reference metrics (with a reference), per item and config."""
    if run.repeat:
        record_determinism(runs, run)
    if run.reference is None:
        return
    if compare is None:
        from engine.pipeline.quality import compare_files as compare
    record_references(runs, run, compare)
