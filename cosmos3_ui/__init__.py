"""Cosmos3 Studio's Gradio UI: layout, the caption editor, handlers and the scripting API.

It talks to the engine only through `engine` (registry, queue, defaults, captions) and never
imports torch itself.
"""
from .layout import Studio
from .service import StudioError, StudioService

__all__ = ["Studio", "StudioError", "StudioService", "build_studio"]


def build_studio(registry, job_queue, outputs_root, *, queue_size: int = 16, state_secret: str | None = None) -> Studio:
    """The Studio for a registry and a running `engine.queue.JobQueue`; call `.launch()` on it."""
    return Studio(StudioService(registry, job_queue, outputs_root), queue_size=queue_size, state_secret=state_secret)
