"""The HTTP API's jobs: each one follows an engine job handle and keeps what a poll answers.

An engine job's typed events become the API's states:

    Queued -> "queued";  Started, Progress(load .. denoise) -> "generating";
    Progress(decode, save) -> "encoding";  Finished -> "completed";  Failed -> "failed";
    Cancelled -> "cancelled".

Every job has an owner (the API key's name); `JobBook.get` answers only its owner, so one key can
neither read, download nor cancel another key's job.
"""
from __future__ import annotations

import secrets
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from .events import Cancelled, Failed, Finished, Progress, Queued, Started

ENCODING_STAGES = ("decode", "save")
TERMINAL_STATES = ("completed", "failed", "cancelled")
KEEP_FINISHED = 1000  # finished jobs remembered for polling; the oldest are forgotten first


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
    result: Any = None  # the engine's GenerationResult once completed
    completed_at: int | None = None
    handle: Any = None
    cleanup: list[Path] = field(default_factory=list)  # uploaded inputs, removed when the job ends
    done: threading.Event = field(default_factory=threading.Event)

    def files(self) -> dict[str, Path]:
        if self.result is None:
            return {}
        return {name: Path(path) for name, path in self.result.outputs.items()}

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
        if self.result is not None:
            params = self.result.params
            body["size"] = f"{params.get('width')}x{params.get('height')}"
            frames, fps = params.get("num_frames"), params.get("fps")
            if self.kind == "video" and frames and fps:
                body["seconds"] = round(frames / fps, 3)
            body["result"] = self.result.summary()
        return body


def new_job_id(kind: str) -> str:
    return f"{'video' if kind == 'video' else 'img'}_{secrets.token_hex(12)}"


def apply(job: ApiJob, event) -> None:
    """Advance `job` by one engine event."""
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
        job.status, job.stage, job.progress, job.result = "completed", "done", 100, event.result
    elif isinstance(event, Failed):
        job.status, job.stage = "failed", "done"
        job.error = {"code": event.kind, "message": event.message}
    elif isinstance(event, Cancelled):
        job.status, job.stage = "cancelled", "done"
        job.error = {"code": "cancelled", "message": "Cancelled; nothing was saved."}
    if job.status in TERMINAL_STATES:
        job.completed_at = int(time.time())
        job.eta_s = None


class JobBook:
    """Jobs by id, each followed by a thread of its own until its terminal event."""

    def __init__(self):
        self._lock = threading.Lock()
        self._jobs: dict[str, ApiJob] = {}

    def follow(self, job: ApiJob, on_end: Callable[[ApiJob], None]) -> None:
        with self._lock:
            self._jobs[job.id] = job
        threading.Thread(target=self._follow, args=(job, on_end), name=f"api-{job.id}", daemon=True).start()

    def _follow(self, job: ApiJob, on_end) -> None:
        try:
            for event in job.handle.events():
                apply(job, event)
        except Exception as exc:  # noqa: BLE001 - a broken stream fails this job, never the server
            apply(job, Failed(f"Lost the job's events ({type(exc).__name__}: {exc}).", kind="error"))
        finally:
            if job.status not in TERMINAL_STATES:
                apply(job, Failed("The job ended without a result.", kind="error"))
            for path in job.cleanup:
                path.unlink(missing_ok=True)
            job.done.set()
            on_end(job)
            self._forget_old()

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

    def _forget_old(self) -> None:
        with self._lock:
            finished = [job for job in self._jobs.values() if job.done.is_set()]
            for job in sorted(finished, key=lambda j: j.completed_at or 0)[:max(0, len(finished) - KEEP_FINISHED)]:
                del self._jobs[job.id]
