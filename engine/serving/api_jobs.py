"""The HTTP API's jobs: each one follows an engine job handle and keeps what a poll answers.

An engine job's typed events become the API's states:

    Queued -> "queued";  Started, Progress(load .. denoise) -> "generating";
    Progress(decode, save) -> "encoding";  Finished -> "completed";  Failed -> "failed";
    Cancelled -> "cancelled".

Every job has an owner (the API key's name); `JobBook.get` answers only its owner, so one key can
neither read, download nor cancel another key's job.

The book is kept on disk, one JSON record a job in `<outputs>/.api-jobs/`, rewritten at each change of
state: after a restart the finished and failed jobs are listed and served again (to their owners), and a
job that was waiting or running when the server stopped comes back failed, saying so.
"""
from __future__ import annotations

import json
import logging
import os
import re
import secrets
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from ..events import Cancelled, Failed, Finished, Progress, Queued, Started

ENCODING_STAGES = ("decode", "save")
TERMINAL_STATES = ("completed", "failed", "cancelled")
KEEP_FINISHED = 1000  # finished jobs remembered for polling; the oldest are forgotten first
JOB_ID = re.compile(r"^(video|img)_[0-9a-f]{24}$")
RECORD_FIELDS = ("id", "kind", "owner", "model", "created_at", "status", "stage", "progress", "error",
                 "completed_at", "summary")
SIZE_KEYS = ("mode", "width", "height")  # what a record keeps of the request (never an upload's path)
log = logging.getLogger(__name__)


@dataclass
class ApiJob:
    id: str
    kind: str  # "video" | "image"
    owner: str
    model: str
    request: dict
    created_at: int = field(default_factory=lambda: int(time.time()))
    status: str = "queued"
    stage: str = "queued"
    progress: int = 0
    position: int | None = None
    eta_s: float | None = None
    error: dict | None = None
    summary: dict | None = None  # the engine result's summary (seed, prompt texts, params, timings) once completed
    outputs: dict[str, Path] = field(default_factory=dict)  # the result's files by name
    completed_at: int | None = None
    handle: Any = None
    cleanup: list[Path] = field(default_factory=list)  # uploaded inputs, removed when the job ends
    done: threading.Event = field(default_factory=threading.Event)

    def files(self) -> dict[str, Path]:
        return dict(self.outputs)

    def to_json(self) -> dict:
        """What `GET /v1/videos/{id}` answers."""
        width, height = self.request.get("width"), self.request.get("height")
        body = {
            "id": self.id, "object": self.kind, "model": self.model, "created_at": self.created_at,
            "status": self.status, "stage": self.stage, "progress": self.progress,
            "queue_position": self.position, "eta_seconds": None if self.eta_s is None else round(self.eta_s, 1),
            "size": f"{width}x{height}" if width and height else None,
            "completed_at": self.completed_at, "error": self.error,
            "replica": getattr(self.handle, "replica", None),  # where it runs, with --ray
        }
        if self.summary is not None:
            params = self.summary.get("params") or {}
            body["size"] = f"{params.get('width')}x{params.get('height')}"
            frames, fps = params.get("num_frames"), params.get("fps")
            if self.kind == "video" and frames and fps:
                body["seconds"] = round(frames / fps, 3)
            body["result"] = self.summary
        return body


def new_job_id(kind: str) -> str:
    return f"{'video' if kind == 'video' else 'img'}_{secrets.token_hex(12)}"


def apply(job: ApiJob, event, public_text: Callable[[str], str] = str) -> None:
    """Advance `job` by one engine event; a failure's message is passed through `public_text`."""
    if isinstance(event, Queued):
        job.position = event.position
    elif isinstance(event, Started):
        job.status, job.stage, job.position = "generating", "load", 0
    elif isinstance(event, Progress):
        job.stage, job.eta_s = event.stage, event.eta_s
        if event.stage in ENCODING_STAGES:
            job.status, job.progress = "encoding", max(job.progress, 95)
        else:
            job.status = "generating"
            if event.stage == "denoise" and event.total:
                job.progress = max(job.progress, min(94, int(94 * event.step / event.total)))
    elif isinstance(event, Finished):
        job.status, job.stage, job.progress = "completed", "done", 100
        job.summary = event.result.summary()
        job.outputs = {name: Path(path) for name, path in event.result.outputs.items()}
    elif isinstance(event, Failed):
        job.status, job.stage = "failed", "done"
        job.error = {"code": event.kind, "message": public_text(event.message)}
    elif isinstance(event, Cancelled):
        job.status, job.stage = "cancelled", "done"
        job.error = {"code": "cancelled", "message": "Cancelled; nothing was saved."}
    if job.status in TERMINAL_STATES:
        job.completed_at = int(time.time())
        job.eta_s = None


class JobBook:
    """Jobs by id, each followed by a thread of its own until its terminal event, each recorded in
    `folder` (when given) as it changes state. `outputs_root` is where result files must lie to be
    served from a record; `public_text` cleans a failure's message of server paths."""

    def __init__(self, folder: Path | None = None, outputs_root: Path | None = None,
                 public_text: Callable[[str], str] = str):
        self._lock = threading.Lock()
        self._jobs: dict[str, ApiJob] = {}
        self.folder, self.outputs_root, self.public_text = folder, outputs_root, public_text
        if folder is not None and folder.is_dir():
            for job in load_records(folder, outputs_root):
                self._jobs[job.id] = job

    def follow(self, job: ApiJob, on_end: Callable[[ApiJob], None]) -> None:
        with self._lock:
            self._jobs[job.id] = job
        self.save(job)
        threading.Thread(target=self._follow, args=(job, on_end), name=f"api-{job.id}", daemon=True).start()

    def _follow(self, job: ApiJob, on_end) -> None:
        try:
            for event in job.handle.events():
                status = job.status
                apply(job, event, self.public_text)
                if job.status != status:
                    self.save(job)
        except Exception as exc:  # noqa: BLE001 - a broken stream fails this job, never the server
            apply(job, Failed(f"Lost the job's events ({type(exc).__name__}: {exc}).", kind="error"), self.public_text)
        finally:
            if job.status not in TERMINAL_STATES:
                apply(job, Failed("The job ended without a result.", kind="error"))
            self.save(job)
            for path in job.cleanup:
                path.unlink(missing_ok=True)
            job.done.set()
            on_end(job)
            self._forget_old()

    def save(self, job: ApiJob) -> None:
        if self.folder is not None:
            write_record(self.folder, self.outputs_root, job)

    def get(self, job_id: str, owner: str) -> ApiJob | None:
        """The job if `owner` owns it; None otherwise (another key's job looks like no job at all)."""
        with self._lock:
            job = self._jobs.get(job_id)
        return job if job is not None and job.owner == owner else None

    def owned(self, owner: str, kind: str) -> list[ApiJob]:
        with self._lock:
            return [job for job in self._jobs.values() if job.owner == owner and job.kind == kind]

    def forget(self, job_id: str) -> None:
        with self._lock:
            self._jobs.pop(job_id, None)
        if self.folder is not None:
            (self.folder / f"{job_id}.json").unlink(missing_ok=True)

    def _forget_old(self) -> None:
        with self._lock:
            finished = [job for job in self._jobs.values() if job.done.is_set()]
            old = sorted(finished, key=lambda j: j.completed_at or 0)[:max(0, len(finished) - KEEP_FINISHED)]
        for job in old:
            self.forget(job.id)


def write_record(folder: Path, outputs_root: Path | None, job: ApiJob) -> None:
    """Write the job's record (atomically: a crash mid-write leaves the previous one)."""
    record = {name: getattr(job, name) for name in RECORD_FIELDS}
    record["request"] = {key: job.request[key] for key in SIZE_KEYS if key in job.request}
    record["files"] = {name: _relative(path, outputs_root) for name, path in job.outputs.items()}
    record["uploads"] = [_relative(path, outputs_root) for path in job.cleanup]
    target = folder / f"{job.id}.json"
    staging = folder / f".{job.id}.{secrets.token_hex(4)}.tmp"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        staging.write_text(json.dumps(record, default=str), encoding="utf-8")
        os.replace(staging, target)
    except OSError as exc:  # a full or read-only disk costs the record, never the job
        staging.unlink(missing_ok=True)
        log.error("Could not record API job %s: %s", job.id, exc)


def _relative(path: Path, root: Path | None) -> str | None:
    """`path` relative to the outputs folder (records stay valid when the folder moves), None if outside."""
    try:
        return Path(path).resolve().relative_to(root.resolve()).as_posix() if root is not None else None
    except ValueError:
        return None


def _inside(root: Path, relative) -> Path | None:
    """root/relative if that names a file inside `root` (a record's paths are checked, never trusted)."""
    if not isinstance(relative, str) or not relative or relative.startswith("/"):
        return None
    path = (root / relative).resolve()
    return path if path.is_relative_to(root.resolve()) and path.is_file() else None


def load_records(folder: Path, outputs_root: Path | None) -> list[ApiJob]:
    """The jobs recorded in `folder`. One that had not ended is marked failed (and its record rewritten),
    and its uploaded inputs are removed: the server stopped while it waited or ran, and nothing will
    finish it. (One server per outputs folder: a second one would take the first's live jobs for dead.)"""
    jobs = []
    for record_file in sorted(folder.glob("*.json")):
        try:
            record = json.loads(record_file.read_text(encoding="utf-8"))
            job = ApiJob(**{name: record[name] for name in RECORD_FIELDS}, request=dict(record.get("request") or {}))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log.error("Skipping the unreadable API job record %s: %s", record_file.name, exc)
            continue
        if not JOB_ID.match(job.id) or record_file.stem != job.id or job.kind not in ("video", "image"):
            log.error("Skipping the API job record %s: its id does not match", record_file.name)
            continue
        if outputs_root is not None:
            found = {name: _inside(outputs_root, rel) for name, rel in (record.get("files") or {}).items()}
            job.outputs = {name: path for name, path in found.items() if path is not None}
        if job.status not in TERMINAL_STATES:
            job.error = {"code": "interrupted",
                         "message": f"The server stopped while this job was {job.status} (a restart or a crash); "
                                    "it did not finish and nothing was saved. Submit it again."}
            job.status, job.stage, job.completed_at = "failed", "done", int(time.time())
            write_record(folder, outputs_root, job)
            for upload in record.get("uploads") or [] if outputs_root is not None else []:
                if (path := _inside(outputs_root, upload)) is not None:
                    path.unlink(missing_ok=True)
        job.done.set()
        jobs.append(job)
    return jobs
