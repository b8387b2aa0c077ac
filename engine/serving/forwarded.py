"""Jobs that run somewhere else (a Ray Serve replica, a remote server), seen through the same handle
interface as `engine.JobQueue`'s: `id`, `position()`, `events()`, `cancel()`, `result()`.

A front end (`ray_replicas.RayJobQueue`, `remote.RemoteJobQueue`) validates and counts its jobs here,
then a thread per job forwards what the other side reports as the engine's typed events.
"""
from __future__ import annotations

import itertools
import queue as stdlib_queue
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

from ..pipeline.request import Request
from ..events import TERMINAL_EVENTS, JobEvent, Queued, Started
from .queue import QueueFull, check_output_group, checked_request, drain, result_of, typical_wait


class ForwardedHandle:
    """One job as its submitter sees it. `replica` names where it runs, once it runs."""

    def __init__(self, job_id: str, model_name: str, request: dict, session_id: str | None,
                 output_group: str | None, position: Callable[["ForwardedHandle"], int], validated: Request):
        self.id, self.model_name, self.request = job_id, model_name, request
        self.validated = validated  # the Request `request` made at submit, for the front end to read
        self.session_id, self.output_group = session_id, output_group
        self.replica: str | None = None
        self.started_at: float | None = None
        self._position = position
        self._events: stdlib_queue.Queue = stdlib_queue.Queue()
        self._done = threading.Event()
        self._outcome: JobEvent | None = None
        self._cancel = threading.Event()
        self._on_cancel: Callable[[], None] | None = None
        self._lock = threading.Lock()

    # -- the submitter's side ---------------------------------------------------------------------

    def position(self) -> int:
        return 0 if self.started_at is not None or self._done.is_set() else self._position(self)

    def events(self, timeout: float | None = None) -> Iterator[JobEvent]:
        return drain(self._events, self.id, timeout)

    def cancel(self) -> None:
        """A job that has not started never starts; a running one is told to stop; a finished one is left
        alone (the other side must not delete what it made: a remote studio's DELETE would)."""
        if self._done.is_set():
            return
        with self._lock:
            self._cancel.set()
            hook = self._on_cancel
        if hook is not None:
            hook()

    def cancelled(self) -> bool:
        return self._cancel.is_set()

    def result(self, timeout: float | None = None):
        if not self._done.wait(timeout):
            raise TimeoutError(f"Job {self.id} did not finish within {timeout} s.")
        return result_of(self._outcome)

    # -- the forwarder's side ---------------------------------------------------------------------

    def on_cancel(self, hook: Callable[[], None]) -> None:
        """What `cancel()` does on the other side; run at once if cancel came first."""
        with self._lock:
            self._on_cancel = hook
            already = self._cancel.is_set()
        if already:
            hook()

    def started(self, replica: str) -> None:
        self.replica, self.started_at = replica, time.monotonic()
        self.put(Started(model_name=self.model_name))

    def put(self, event: JobEvent) -> None:
        if self._done.is_set():
            return
        if isinstance(event, TERMINAL_EVENTS):
            self._outcome = event
        self._events.put(event)
        if isinstance(event, TERMINAL_EVENTS):
            self._done.set()

    def done(self) -> bool:
        return self._done.is_set()


@dataclass
class ForwardingBook:
    """The jobs a front end has in flight: validation, the wait-list bound and queue positions."""

    registry: object
    max_size: int
    prefix: str = "job"
    _jobs: list = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _ids: Iterator[int] = field(default_factory=lambda: itertools.count(1))

    def open(self, model_name: str, request: dict, session_id: str | None, output_group: str | None):
        """Validate as `engine.JobQueue.submit` does and return a new handle (not yet forwarded)."""
        check_output_group(output_group)
        validated = checked_request(self.registry, model_name, request)
        with self._lock:
            self._jobs = [job for job in self._jobs if not job.done()]
            waiting = sum(1 for job in self._jobs if job.started_at is None)
            if waiting >= self.max_size:
                raise QueueFull(f"The queue is full ({waiting} jobs waiting, the limit is {self.max_size}); "
                                "try again in a minute.")
            handle = ForwardedHandle(f"{self.prefix}-{next(self._ids)}", model_name, dict(request), session_id,
                                     output_group, self.position, validated)
            self._jobs.append(handle)
        handle.put(Queued(position=self.position(handle)))
        return handle

    def position(self, handle: ForwardedHandle) -> int:
        """Jobs ahead: the waiting ones submitted earlier, plus one if any job is running."""
        with self._lock:
            live = [job for job in self._jobs if not job.done()]
            waiting = [job for job in live if job.started_at is None]
            running = len(live) - len(waiting)
        if handle not in waiting:
            return 0
        return waiting.index(handle) + (1 if running else 0)

    def snapshot(self) -> dict:
        with self._lock:
            live = [job for job in self._jobs if not job.done()]
        running = [job for job in live if job.started_at is not None]
        return {"waiting": len(live) - len(running), "running": len(running),
                "jobs": [{"id": job.id, "model": job.model_name, "replica": job.replica,
                          "state": "running" if job.started_at is not None else "waiting"} for job in live]}

    def live(self) -> list[ForwardedHandle]:
        with self._lock:
            return [job for job in self._jobs if not job.done()]

    def announce_positions(self) -> None:
        """A job started: tell the ones still waiting their new place."""
        for job in self.live():
            if job.started_at is None:
                job.put(Queued(position=self.position(job)))


class ForwardingQueue:
    """The `engine.JobQueue` interface for front ends whose jobs run elsewhere: a subclass says how one
    job is forwarded (`_forward`, run on a thread of its own) and what else its `state` shows."""

    backend = "forwarded"

    def __init__(self, registry, outputs_root, *, max_size: int = 16):
        self.registry = registry
        self.outputs_root = Path(outputs_root)
        self.max_size = max_size
        self._book = ForwardingBook(registry, max_size, prefix=self.backend)
        self._durations: dict[str, float] = {}  # model -> seconds of its last job, for wait estimates

    def submit(self, model_name: str, request: dict, session_id: str | None = None,
               output_group: str | None = None) -> ForwardedHandle:
        handle = self._book.open(model_name, request, session_id, output_group)
        threading.Thread(target=self._forward, args=(handle,), name=f"{self.backend}-{handle.id}", daemon=True).start()
        return handle

    def _forward(self, handle: ForwardedHandle) -> None:
        raise NotImplementedError

    def _finished(self, handle: ForwardedHandle) -> None:
        if handle.started_at is not None:
            self._durations[handle.model_name] = time.monotonic() - handle.started_at

    def eta_seconds(self, position: int, model_name: str | None = None) -> float | None:
        return typical_wait(self._durations, position, model_name)

    def state(self) -> dict:
        return {"backend": self.backend, **self._book.snapshot()}

    def loaded_models(self) -> list[str]:
        return []  # the models load on the other side

    def close(self, timeout: float = 10.0) -> None:
        for handle in self._book.live():
            handle.cancel()
