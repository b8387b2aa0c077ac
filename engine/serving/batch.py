"""Batch runs: a JSONL file of requests, each with a model name, run through the job queue.

Every line is validated on its own; a bad line is recorded with its message and the batch carries
on. Results land in `outputs/<batch id>/<request id>/` (each handed to `on_result`, which review
mode uses to register it), and the batch folder gets a `report.jsonl` with one entry per input line.
"""
from __future__ import annotations

import json
import threading
import time
import uuid
from dataclasses import asdict, dataclass, field
from typing import Callable

from ..events import JobCancelled
from .queue import JobFailed, JobQueue, QueueFull

MAX_BATCH_LINES = 500
CAPTION_KEYS = ("prompt", "negative_prompt")


@dataclass
class BatchLine:
    line: int
    model: str | None = None
    request: dict | None = None
    status: str = "pending"  # pending | done | failed | cancelled
    message: str = ""
    request_id: str | None = None
    files: dict[str, str] = field(default_factory=dict)


def parse_batch(text: str) -> list[BatchLine]:
    """One JSON object per non-empty line: {"model": NAME, "mode": ..., ...request keys}."""
    lines: list[BatchLine] = []
    for number, raw in enumerate(text.splitlines(), start=1):
        if not raw.strip():
            continue
        entry = BatchLine(line=number)
        lines.append(entry)
        if len(lines) > MAX_BATCH_LINES:
            raise ValueError(f"A batch holds at most {MAX_BATCH_LINES} requests.")
        try:
            value = json.loads(raw)
        except json.JSONDecodeError as exc:
            entry.status, entry.message = "failed", f"line {number}: not valid JSON ({exc.msg}, column {exc.colno})"
            continue
        if not isinstance(value, dict) or not isinstance(value.get("model"), str):
            entry.status, entry.message = "failed", f"line {number}: expected an object with a \"model\" name"
            continue
        entry.model = value.pop("model")
        entry.request = value
    if not lines:
        raise ValueError("The batch file has no requests (one JSON object per line).")
    return lines


def request_for_engine(request: dict) -> dict:
    """The request as the engine takes it: a caption object in `prompt` or `negative_prompt` becomes its
    JSON text. A batch or suite line may hold the caption as an object (JSON Lines nests it naturally);
    the engine takes every prompt as text and parses a JSON caption once, itself."""
    return {key: json.dumps(value, ensure_ascii=False) if key in CAPTION_KEYS and isinstance(value, dict) else value
            for key, value in request.items()}


def new_batch_id() -> str:
    return "batch-" + time.strftime("%Y%m%d-%H%M%S") + "-" + uuid.uuid4().hex[:8]


def _submit_when_there_is_room(queue: JobQueue, entry: BatchLine, session_id, batch_id, cancel) -> object | None:
    """Submit one line, waiting while the queue is full, so a batch never crowds out other users."""
    while True:
        if cancel is not None and cancel.is_set():
            return None
        try:
            return queue.submit(entry.model, request_for_engine(entry.request), session_id=session_id,
                                output_group=batch_id)
        except QueueFull:
            time.sleep(0.5)


def _wait(handle, cancel):
    """The job's result; a set `cancel` cancels the running job (it stops within a step)."""
    if cancel is None:
        return handle.result()
    finished = threading.Event()

    def relay():
        # Passes the cancel on the moment it is set: polling it between waits for the result let a
        # fast job run up to a poll's length of steps after the batch was cancelled.
        while not finished.is_set():
            if cancel.wait(timeout=0.5):
                handle.cancel()
                return

    threading.Thread(target=relay, name="batch-cancel", daemon=True).start()
    try:
        return handle.result()
    finally:
        finished.set()


def run_batch(queue: JobQueue, lines: list[BatchLine], *, on_result: Callable[[BatchLine, object], None] | None = None,
              session_id: str | None = None, batch_id: str | None = None,
              on_line: Callable[[BatchLine, int, int], None] | None = None,
              cancel: threading.Event | None = None) -> tuple[str, list[BatchLine]]:
    """Run the valid lines one after another and write the batch report. Returns (batch id, lines).

    Lines go to the queue one at a time, so other users' jobs take turns with the batch's, and a batch
    of any length fits a bounded queue. Setting `cancel` stops the running line within a step and
    marks the rest cancelled. `on_result(line, result)` is called for every finished line (the
    batch id is `result.output_dir.parent.name`).
    """
    batch_id = batch_id or new_batch_id()
    runnable = [entry for entry in lines if entry.status != "failed"]
    for done, entry in enumerate(runnable, start=1):
        try:
            handle = _submit_when_there_is_room(queue, entry, session_id, batch_id, cancel)
        except ValueError as exc:
            entry.status, entry.message = "failed", f"line {entry.line}: {exc}"
            handle = None
        if handle is not None:
            try:
                result = _wait(handle, cancel)
            except JobCancelled:
                entry.status, entry.message = "cancelled", "cancelled"
            except JobFailed as exc:
                entry.status, entry.message = "failed", f"line {entry.line}: {exc}"
            else:
                entry.status, entry.request_id = "done", result.request_id
                entry.files = {k: str(v) for k, v in result.outputs.items()}
                if on_result is not None:
                    on_result(entry, result)
        elif entry.status == "pending":
            entry.status, entry.message = "cancelled", "the batch was cancelled before this line ran"
        if on_line is not None:
            on_line(entry, done, len(runnable))
    folder = queue.outputs_root / batch_id
    folder.mkdir(parents=True, exist_ok=True)
    report = "".join(json.dumps({k: v for k, v in asdict(e).items() if k != "request"}) + "\n" for e in lines)
    (folder / "report.jsonl").write_text(report, encoding="utf-8")
    return batch_id, lines
