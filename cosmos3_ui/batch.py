"""Batch runs from the UI, without Gradio: reading the uploaded JSONL, the per-line status table,
and the call of `engine.serving.batch.run_batch` (which owns the semantics: per-line failures, the batch
folder, `report.jsonl`); each finished line is registered for review through the service.
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Callable

from .requests import api_request
from .service import StudioError, StudioService

if TYPE_CHECKING:
    from engine.serving.batch import BatchLine

MAX_BATCH_BYTES = 4 * 2**20
STATUS_COLUMNS = ["line", "model", "mode", "status", "message", "request_id"]
EXAMPLE_LINE = '{"model": "nano", "mode": "t2i", "prompt": "A red kite over a beach.", "seed": 7}'


def read_batch_file(path: str | None) -> list["BatchLine"]:
    """Parse an uploaded JSONL file; bad lines come back marked failed, a bad file raises StudioError."""
    # engine.serving.batch brings the job queue and the denoising stack (torch): imported on first use only,
    # so the UI starts without them.
    from engine.serving.batch import parse_batch

    if not path:
        raise StudioError("Upload a .jsonl file: one request per line, each with a \"model\" key.", "batch")
    file = Path(path)
    try:
        size = file.stat().st_size
        if size > MAX_BATCH_BYTES:
            raise StudioError(f"The batch file is {size} bytes; at most {MAX_BATCH_BYTES}.", "batch")
        text = file.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise StudioError("The batch file is not UTF-8 text (expected JSON Lines).", "batch") from None
    except OSError as exc:
        raise StudioError(f"The batch file could not be read: {exc}", "batch") from None
    try:
        lines = parse_batch(text)
    except ValueError as exc:
        raise StudioError(str(exc), "batch") from None
    for line in lines:
        if line.status == "failed":
            continue
        try:
            api_request(line.request, None)  # same rule as /generate: a request never names a server file
        except StudioError as exc:
            line.status, line.message = "failed", f"line {line.line}: {exc}"
    return lines


def status_rows(lines: list["BatchLine"]) -> list[list]:
    rows = []
    for line in lines:
        mode = (line.request or {}).get("mode", "") if isinstance(line.request, dict) else ""
        rows.append([line.line, line.model or "", mode, line.status, line.message, line.request_id or ""])
    return rows


def counts(lines: list["BatchLine"]) -> str:
    by_status: dict[str, int] = {}
    for line in lines:
        by_status[line.status] = by_status.get(line.status, 0) + 1
    return ", ".join(f"{n} {status}" for status, n in sorted(by_status.items()))


def run(service: StudioService, lines: list["BatchLine"], session: str,
        on_line: Callable[["BatchLine", int, int], None] | None = None, cancel=None) -> tuple[str, Path]:
    """Run the batch (blocking); returns (batch id, path of report.jsonl). `cancel`: a threading.Event."""
    from engine.serving.batch import run_batch

    def register(line, result):
        service.record(result, line.model, f"batch:{result.output_dir.parent.name}")

    batch_id, _ = run_batch(service.queue, lines, on_result=register, session_id=session, on_line=on_line,
                            cancel=cancel)
    return batch_id, Path(service.queue.outputs_root) / batch_id / "report.jsonl"
