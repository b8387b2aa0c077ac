"""The checkpoint's reasoner tower (a Transformers VLM at the checkpoint's root): enhance a prompt into
a structured caption, describe an upload, critique a result. It never imports gradio.

`reason(model, request)` runs one request on a loaded checkpoint; `validate_reason_request` turns a
request dict into a typed `ReasonRequest`; `reasoner_status(root)` says whether a checkpoint has a
reasoner and, if not, why. Torch and Transformers are imported on first use.
"""
from importlib import import_module

from .events import ReasonerText
from .request import (REASON_TABLE, SAMPLING_LIMITS, TASKS, ReasonRequest, ReasonRequestError, reason_defaults,
                      validate_reason_request)

_LAZY = {
    "reason": "run", "ReasonResult": "run",
    "EnhanceError": "caption", "CaptionProblem": "caption", "caption_from_answer": "caption",
    "POLICIES": "runtime", "ReasonerUnavailable": "runtime", "choose_policy": "runtime",
    "reasoner_for": "runtime", "reasoner_status": "runtime",
}


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["REASON_TABLE", "SAMPLING_LIMITS", "TASKS", "ReasonRequest", "ReasonRequestError", "ReasonerText",
           "reason_defaults", "validate_reason_request", *_LAZY]
