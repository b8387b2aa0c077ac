"""The UI's side of the engine, free of Gradio: submitting jobs, following their events, tracking
each session's running job for Cancel, and turning results into history entries.

Handlers in `layout.py` and the scripting API in `api.py` both go through `StudioService`, so the
UI and `/generate` submit, follow and report jobs the same way.
"""
from __future__ import annotations

import inspect
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.events import Cancelled, Failed, Finished, Progress, Queued, Started
from engine.model.defaults import sampling_limits
from engine.serving.registry import ModelRegistry

from .files import redact, serve_results_from
from .history import HistorySeal

STAGE_LABELS = {
    "load": "Loading the model",
    "conditioning": "Encoding the conditioning input",
    "prompt": "Preparing the prompt",
    "prefill": "Reading the prompt (text tower)",
    "denoise": "Denoising",
    "decode": "Decoding frames",
    "save": "Saving files",
    "retry": "The GPU ran out of memory; freed its cached step graphs and started again",
}


class StudioError(ValueError):
    """A message for the user. `field` says which input it belongs to: a request key as the engine's
    `RequestError.field` names it ("prompt.subjects[0]", "steps", "image", "action.actions"...), or
    one of the UI's own ("resolution", "file", "model", "queue"), or "" for none. `excerpt` shows
    where a caption's JSON broke (its line, a caret under the column)."""

    def __init__(self, message: str, field: str = "", excerpt: str = ""):
        super().__init__(redact(message))  # an engine or OS message may quote a server path: its base name only
        self.field = field
        self.excerpt = excerpt
        self.errors: list[tuple[str, str]] = [(field, message)]  # every refusal: (field, message), first = this

    @classmethod
    def refused(cls, exc: ValueError) -> "StudioError":
        """The engine's refusal as the UI shows it: its words, its field, and the caption's excerpt."""
        from engine.pipeline.captions import CaptionParseError

        cause = exc.__cause__
        excerpt = cause.excerpt() if isinstance(cause, CaptionParseError) else ""
        out = cls(redact(str(exc)), getattr(exc, "field", ""), excerpt)
        each = getattr(exc, "errors", None) or [exc]  # engine.RequestError lists every bad field
        out.errors = [(getattr(e, "field", ""), redact(str(e))) for e in each]
        return out


class JobWasCancelled(Exception):
    """The job stopped because its Cancel was pressed (or its client went away)."""

    def __init__(self, step: int | None = None, total: int | None = None):
        super().__init__("Cancelled.")
        self.step = step
        self.total = total

    def message(self) -> str:
        if self.step is not None and self.total:
            return f"Cancelled after denoising step {self.step} of {self.total}; nothing was saved."
        return "Cancelled before it started; nothing was saved."


@dataclass
class JobStatus:
    """What the UI shows while a job runs; filled from the job's events."""

    position: int | None = None
    stage: str = "queued"
    step: int = 0
    total: int = 0
    elapsed_s: float = 0.0
    eta_s: float | None = None
    denoise_step: int | None = None
    denoise_total: int | None = None

    def describe(self) -> str:
        if self.stage == "queued":
            ahead = self.position or 0
            return "Waiting for the GPU" + (f": {ahead} job{'s' if ahead != 1 else ''} ahead" if ahead else "")
        label = STAGE_LABELS.get(self.stage, self.stage)
        if self.stage == "denoise" and self.total:
            text = f"{label}: step {self.step}/{self.total}"
            if self.eta_s is not None:
                text += f" · about {self.eta_s:.0f} s left"
            return text
        return label


def warming_note(warming: dict) -> str:
    """What the line beside Generate adds while the queue warms models in the background (its
    `warming()`: {model: {"done", "total"}}), e.g. "edge warming up (3 of 36 runs)"; "" when none does.
    A run is one short warm request: two prompt lengths per size."""
    return "; ".join(f"{name} warming up ({progress['done']} of {progress['total']} runs)"
                     for name, progress in warming.items())


def warming_status(queue) -> dict:
    """The queue's `warming()`: only the local queue warms (and says so cheaply); a forwarding queue
    (Ray, a remote engine) has no `warming` and shows nothing."""
    warming = getattr(queue, "warming", None)
    return warming() if callable(warming) else {}


def warming_panel(warming: dict) -> str:
    """The note under the model picker while models warm up in the background; "" when none does."""
    note = warming_note(warming)
    if not note:
        return ""
    return (f"{note[0].upper()}{note[1:]} in the background. A size not warmed yet may take longer the first "
            "time; your jobs always go first.")


@dataclass
class ActiveJob:
    handle: Any
    status: JobStatus = field(default_factory=JobStatus)
    cancel_requested: bool = False
    ended_at: float | None = None


RECENT_CANCEL_S = 30.0


class ActiveJobs:
    """Per-session running jobs, so that a session's Cancel reaches its own job and no one else's.

    A job that stopped because its handler was cancelled (Gradio's `cancels=`, or the client went
    away) stays findable for a short while, so the Cancel button can still report how it ended
    whichever of the two arrives first.
    """

    def __init__(self):
        self._lock = threading.Lock()
        self._jobs: dict[str, ActiveJob] = {}
        self._recent: dict[str, ActiveJob] = {}
        self.cancelled_ids: list[str] = []  # for tests and logs: jobs stopped through Cancel

    def add(self, session: str, handle) -> ActiveJob:
        job = ActiveJob(handle)
        with self._lock:
            self._jobs[session] = job
            self._recent.pop(session, None)
        return job

    def remove(self, session: str, handle) -> None:
        with self._lock:
            current = self._jobs.get(session)
            if current is not None and current.handle is handle:
                del self._jobs[session]
                if current.cancel_requested:
                    current.ended_at = time.monotonic()
                    self._recent[session] = current

    def get(self, session: str) -> ActiveJob | None:
        with self._lock:
            return self._jobs.get(session)

    def mark_cancelled(self, job: ActiveJob) -> None:
        """The handler of `job` was cancelled: stop the engine job and remember it."""
        if not job.cancel_requested:
            job.cancel_requested = True
            self.cancelled_ids.append(job.handle.id)
        job.handle.cancel()

    def cancel(self, session: str) -> ActiveJob | None:
        """Cancel this session's running job; or find the one it cancelled a moment ago."""
        with self._lock:
            job = self._jobs.get(session)
            if job is None:
                recent = self._recent.get(session)
                if recent is not None and time.monotonic() - (recent.ended_at or 0.0) < RECENT_CANCEL_S:
                    return recent
                return None
        self.mark_cancelled(job)
        return job

    def count(self) -> int:
        with self._lock:
            return len(self._jobs)


def cancel_outcome(job: ActiveJob, timeout: float = 20.0) -> str:
    """Wait (at most `timeout`) for a cancelled job to end and say how it ended."""
    from engine.events import JobCancelled

    try:
        job.handle.result(timeout=timeout)
    except JobCancelled:
        return JobWasCancelled(job.status.denoise_step, job.status.denoise_total).message()
    except TimeoutError:
        return "Cancelling: the job has not stopped yet."
    except Exception as exc:  # noqa: BLE001 - a failure is an ending too
        return f"The job ended with an error before Cancel reached it: {redact(str(exc))}"
    return "The job had already finished when Cancel reached it; its result is in the history."


def apply_event(status: JobStatus, event) -> Any:
    """Update `status` from one job event. Returns the result on Finished; raises on the others."""
    if isinstance(event, Queued):
        status.position = event.position
        status.stage = "queued"
    elif isinstance(event, Started):
        status.position = 0
        status.stage = "load"
    elif isinstance(event, Progress):
        status.stage = event.stage
        status.step, status.total = event.step, event.total
        status.elapsed_s, status.eta_s = event.elapsed_s, event.eta_s
        if event.stage == "denoise":
            status.denoise_step, status.denoise_total = event.step, event.total
    elif isinstance(event, Finished):
        status.stage = "done"
        return event.result
    elif isinstance(event, Failed):
        message = redact(event.message)  # an I/O failure names its folder: never the server's path
        raise StudioError(message, event.field if event.kind == "invalid" else "")
    elif isinstance(event, Cancelled):
        raise JobWasCancelled(status.denoise_step, status.denoise_total)
    return None


class StudioService:
    """Models, submission and job tracking for one running app."""

    def __init__(self, registry: ModelRegistry, job_queue, outputs_root: str | Path):
        self.registry = registry
        self.queue = job_queue
        self.outputs_root = serve_results_from(outputs_root)
        self.active = ActiveJobs()
        self.reviews = None  # a cosmos3_ui.review.ReviewStore in review mode: finished results are registered
        # Seals the history entries browsers keep; the Studio replaces it with one from the app's key file.
        self.history_seal = HistorySeal.fresh()
        self._described: dict[str, dict] = {}
        # Remote queues (Ray replicas) stream no previews; only ask a queue that offers them.
        self._queue_previews = "previews" in inspect.signature(job_queue.submit).parameters
        self._lock = threading.Lock()

    # -- models ---------------------------------------------------------------------------------

    def model_names(self) -> list[str]:
        return self.registry.names()

    def describe(self, name: str) -> dict:
        """`registry.describe`, cached: it reads config files only, once per model."""
        if not isinstance(name, str) or name not in self.registry.names():
            raise StudioError(f"Unknown model {name!r}; registered models: {self.registry.names()}.", "model")
        with self._lock:
            if name not in self._described:
                described = self.registry.describe(name)
                # The engine's limits per tab mode (frozen `engine.Limits`): what the controls offer.
                info = self.registry.info(name)
                described["limits"] = {mode: sampling_limits(info, mode) for mode in ("t2i", "t2v", "action")}
                self._described[name] = described
            return self._described[name]

    def describe_all(self) -> list[dict]:
        return [self.describe(name) for name in self.registry.names()]

    def info(self, name: str):
        self.describe(name)
        return self.registry.info(name)

    def models_api(self) -> list[dict]:
        """The `/models` payload: {name, label, family, is_edge, is_distilled, modes, defaults}."""
        out = []
        for model in self.describe_all():
            out.append({
                "name": model["name"],
                "label": model.get("label", ""),
                "family": model["family"],
                "is_edge": model["is_edge"],
                "is_distilled": model["is_distilled"],
                "distilled_sigmas": model.get("distilled_sigmas"),
                "is_tiny": model.get("is_tiny", False),
                "modes": model["modes"],
                "defaults": model["defaults"],
            })
        return out

    # -- jobs -----------------------------------------------------------------------------------

    def submit(self, model_name: str, request, session: str, previews: bool = False):
        """Queue a request (a dict, or an `engine.Request` already validated): the queue validates it
        once and keeps the `Request`. A refusal comes back as StudioError carrying the engine's field.
        With `previews` the job sends a cheap preview image every few denoising steps."""
        from engine.serving.queue import QueueFull

        self.describe(model_name)
        try:
            if previews and self._queue_previews:
                return self.queue.submit(model_name, request, session_id=session, previews=True)
            return self.queue.submit(model_name, request, session_id=session)
        except QueueFull as exc:
            raise StudioError(str(exc), "queue") from None
        except ValueError as exc:  # engine.RequestError: its message and .field
            raise StudioError.refused(exc) from None

    def record(self, result, model_name: str, origin: str) -> None:
        """Make a finished result reviewable (review mode only). `origin`: "ui", "api", "compare"."""
        if self.reviews is None or not result.request_id or result.output_dir is None:
            return
        self.reviews.register_result(result.request_id, result.output_dir, model=model_name,
                                     mode=result.params.get("mode", ""), origin=origin)

    # -- files ----------------------------------------------------------------------------------

    def owns(self, path: str | Path) -> bool:
        """Whether `path` is a file inside the outputs root (history entries are checked with it)."""
        try:
            resolved = Path(path).resolve()
        except (OSError, ValueError, TypeError):
            return False
        return resolved.is_file() and self.outputs_root in resolved.parents
