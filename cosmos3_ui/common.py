"""What every tab of the Studio shares: the GPU event pool, the private API marker, the seed limit
and the status line."""
from __future__ import annotations

import html

GPU_POOL = "gpu"  # every event that runs a job shares this one Gradio concurrency slot
PRIVATE = "private"  # UI events are not public API; only /models and /generate are
UI_SEED_MAX = 2**53 - 1  # browsers hold numbers as doubles; larger seeds would be rounded


def status_html(message: str, kind: str = "info") -> str:
    return f"<div class='studio-status studio-{kind}' role='status'>{html.escape(message)}</div>"
