"""What every tab of the Studio shares: the GPU event pool, the private API marker, the seed limit
the status line and following a worker thread's progress."""
from __future__ import annotations

import asyncio
import html
import queue
from collections.abc import AsyncIterator

GPU_POOL = "gpu"  # every event that runs a job shares this one Gradio concurrency slot
# Generate's handlers only follow engine jobs (the engine's bounded queue runs one at a time), so their
# pool has no limit of its own: a click while another job runs reaches the engine's queue at once and
# shows its position there, instead of waiting unseen in Gradio's queue.
FOLLOW_POOL = "follow"
PRIVATE = "private"  # UI events are not public API; only /models and /generate are
UI_SEED_MAX = 2**53 - 1  # browsers hold numbers as doubles; larger seeds would be rounded


def status_html(message: str, kind: str = "info") -> str:
    # A status may quote an exception (a batch or suite run that stopped): never with a server path in it.
    from .files import redact

    return f"<div class='studio-status studio-{kind}' role='status'>{html.escape(redact(message))}</div>"


async def latest_counts(task: asyncio.Future, counts: queue.SimpleQueue, every: float = 0.5) -> AsyncIterator[tuple]:
    """Until `task` (work on an executor thread) ends, yield every `every` seconds the newest item the
    work put on `counts` since the last look, if any. The handler reports it from its own task: Gradio
    progress sent from the worker thread would not reach the browser. Older items are dropped, since only
    the latest count is worth showing."""
    while not task.done():
        await asyncio.wait({task}, timeout=every)
        latest = None
        while not counts.empty():
            latest = counts.get()
        if latest is not None:
            yield latest
