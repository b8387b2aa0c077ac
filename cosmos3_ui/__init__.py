"""Cosmos3 Studio's Gradio UI: layout, the caption editor, handlers, the scripting API, and the
Compare, Review and Batch tabs.

It talks to the engine only through `engine` (registry, queue, defaults, captions) and
never imports torch itself.
"""
from .layout import Studio
from .service import StudioError, StudioService

__all__ = ["Studio", "StudioError", "StudioService", "build_studio"]


def build_studio(registry, job_queue, outputs_root, *, queue_size: int = 16, state_secret: str | None = None,
                 reviews=None, auth: list[tuple[str, str]] | None = None,
                 max_upload_bytes: int | None = None) -> Studio:
    """The Studio for a registry and a running `engine.serving.queue.JobQueue`; call `.launch()` on it.

    With `reviews` (a `cosmos3_ui.review.ReviewStore`) the review desk is added as a page of its own
    (/review: Blind, Review, Suites, Leaderboard, Batch, Compare) and every finished result is registered for
    review; that needs `auth` (a list of (user, password)).
    `max_upload_bytes`: the largest upload accepted (default `files.DEFAULT_MAX_UPLOAD_BYTES`).
    """
    service = StudioService(registry, job_queue, outputs_root)
    desk = None
    if reviews is not None:
        from .review import ReviewDesk

        service.reviews = reviews
        desk = ReviewDesk(reviews, outputs_root)
    return Studio(service, queue_size=queue_size, state_secret=state_secret, review_desk=desk, auth=auth,
                  max_upload_bytes=max_upload_bytes)
