"""Following a job from the browser: drive it to its end, report its progress, know whose it is,
and cancel it.

Every handler that runs a job (the generation tabs, Compare, Batch, `/generate`) goes through a
`JobFollower`, so they report and cancel the same way.
"""
from __future__ import annotations

import asyncio
import functools
import logging
import re
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any

import anyio
import gradio as gr

from .common import status_html
from .files import redact
from engine.events import Cancelled, Failed, Finished, Preview

from .service import (ActiveJobs, JobStatus, StudioError, StudioService, apply_event, cancel_outcome, warming_note,
                      warming_status)

log = logging.getLogger("cosmos3_ui")


@dataclass
class Watched:
    """One step of a followed job: its status now, and a preview image or the result when one came."""

    status: JobStatus
    preview: Any = None
    result: Any = None
    cancelling: bool = False  # Cancel was pressed: its handler has cleared the progress and preview


def session_of(request: gr.Request | None) -> str:
    """The browser session a Gradio request belongs to (its jobs and its Cancel are per session)."""
    return (request.session_hash if request is not None else None) or "anonymous"


async def job_events(active: ActiveJobs, handle, session: str, ended: str = "The job ended without a result."):
    """Read a job's events on this handler's own task as `session`'s job (so its Cancel reaches it):
    yields (job, event) up to its last event (Finished, Failed or Cancelled).

    The one loop under `JobFollower.watch` and the reasoner's stream. If the handler is cancelled, or
    stops reading before the last event (Gradio closes it at a yield), the engine job is cancelled
    too, so the GPU moves on within one step; a reader that stops after the last event cancels nothing.
    """
    job = active.add(session, handle)
    events = handle.events()
    last = False
    try:
        while not last:
            event = await anyio.to_thread.run_sync(next, events, None, abandon_on_cancel=True)
            if event is None:
                raise StudioError(ended)
            last = isinstance(event, (Finished, Failed, Cancelled))
            yield job, event
    except (asyncio.CancelledError, anyio.get_cancelled_exc_class(), GeneratorExit):
        if not last:
            active.mark_cancelled(job)
        raise
    finally:
        active.remove(session, handle)


class JobFollower:
    """Drives jobs of one `StudioService` on the handler's own task and reports their progress."""

    def __init__(self, service: StudioService):
        self.service = service

    def report(self, progress, status: JobStatus) -> None:
        """Show one job status on Gradio's progress bar (over the result)."""
        if status.stage == "denoise" and status.total:
            progress((status.step, status.total), desc=status.describe(), unit="steps")
        else:
            progress(None, desc=re.sub(r"<[^>]+>", "", self.status_line(status)))

    async def watch(self, handle, session: str, progress):
        """Follow a job's events on this handler's own task: yields a `Watched` for each change worth
        showing, the last one carrying the result.

        Progress is reported from the event handler itself (not from a worker thread), so the bar
        reaches the browser. If Gradio cancels this handler (Cancel, or the client went away) the
        engine job is cancelled too, so the GPU moves on within one step.
        """
        async with aclosing(job_events(self.service.active, handle, session)) as events:
            async for job, event in events:
                if isinstance(event, Preview):
                    yield Watched(job.status, preview=event, cancelling=job.cancel_requested)
                    continue
                result = apply_event(job.status, event)
                if result is not None:
                    yield Watched(job.status, result=result)
                    return
                self.report(progress, job.status)
                yield Watched(job.status, cancelling=job.cancel_requested)

    async def drive(self, handle, session: str, progress):
        """Follow a job to its end and return its result (raises StudioError or JobWasCancelled)."""
        async for watched in self.watch(handle, session, progress):
            if watched.result is not None:
                return watched.result
        raise StudioError("The job ended without a result.")

    async def follow(self, model: str, request: dict, session: str, progress, origin: str = "ui",
                     previews: bool = False):
        """Submit one request and follow it: yields `Watched` updates, the last one with the result
        (recorded for review). Raises StudioError (a refusal or a failure, naming its input) or
        JobWasCancelled."""
        handle = self.service.submit(model, request, session, previews=previews)
        progress(None, desc="Queued")
        async for watched in self.watch(handle, session, progress):
            if watched.result is not None:
                self.service.record(watched.result, model, origin)
            yield watched

    def queued_text(self, ahead: int, model: str | None = None) -> str:
        """"Queued: position 2, about 40 s" for a job with `ahead` jobs before it (the running one
        included); the wait comes from recent job times, and is left out before there are any."""
        try:
            queue = self.service.queue
            eta = (queue.eta_seconds(ahead) if model is None else queue.eta_seconds(ahead, model)) if ahead else None
        except Exception:  # noqa: BLE001 - an estimate only
            eta = None
        return f"Queued: position {ahead + 1}" + (f", about {eta:.0f} s" if eta else "")

    def status_line(self, status: JobStatus) -> str:
        """What the line beside Generate says while a job runs: queue position with its wait, or the stage."""
        text = self.queued_text(status.position or 0) if status.stage == "queued" else status.describe()
        note = warming_note(warming_status(self.service.queue))
        text += f" · {note}" if note else ""
        return status_html(text, "info")

    def cancel_handler(self, status: gr.HTML, progress: gr.HTML | None = None, cleared: dict | None = None):
        """A click handler for a Cancel button that stops this session's job and says so in `status`,
        clearing the `progress` line and whatever `cleared` maps to its emptied value (the preview, the
        result of an earlier run that must not pass for this one's)."""
        line = {progress: ""} if progress is not None else {}
        cleared = {**line, **(cleared or {})}

        def cancel(request: gr.Request):
            job = self.service.active.cancel(session_of(request))
            if job is None:  # nothing of this run to clear: an earlier result stays as it is
                return {status: status_html("No job of yours was running; a waiting one, if any, was removed "
                                            "from the queue.", "info"), **line,
                        **{c: gr.skip() for c in cleared if c not in line}}
            return {status: status_html(cancel_outcome(job), "warn"), **cleared}

        return cancel

    def stop_session(self, request: gr.Request) -> None:
        """The tab was closed or reloaded: stop its engine job so the GPU moves on to the next one."""
        self.service.active.cancel(session_of(request))


def guarded(status: gr.HTML):
    """Turn an unexpected exception in a generate handler (an async generator of updates) into a
    message in `status`.

    The traceback goes to the server log; the user sees what failed, and every input stays as it was.
    """
    def wrap(handler):
        @functools.wraps(handler)
        async def guarded_handler(v: dict, request: gr.Request, progress=gr.Progress()):
            try:
                async for update in handler(v, request, progress):
                    yield update
            except (asyncio.CancelledError, anyio.get_cancelled_exc_class(), GeneratorExit):
                raise
            except Exception as exc:  # noqa: BLE001
                log.exception("generate handler failed")
                message = redact(f"Something went wrong while showing the result ({type(exc).__name__}: {exc}).")
                gr.Warning(message)
                yield {status: status_html(message, "error")}
        return guarded_handler
    return wrap
