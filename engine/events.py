"""Typed events a job sends from the GPU worker to whoever is watching it (the UI, the CLI).

Each job has its own event stream; there is no global one. The module sits under no floor and imports nothing
of the engine: the pipeline raises and reports with these types, the serving floor queues them, and the UI reads
them, so it is the vocabulary they share rather than a part of any one of them.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Union


@dataclass(frozen=True)
class Queued:
    position: int  # jobs ahead of this one, the running one included


@dataclass(frozen=True)
class Started:
    model_name: str


@dataclass(frozen=True)
class Progress:
    stage: str  # "load" | "prompt" | "prefill" | "denoise" | "decode" | "save" | "retry" (out of memory: again)
    step: int
    total: int
    elapsed_s: float
    eta_s: float | None


@dataclass(frozen=True)
class Preview:
    """A cheap look at the current clean-image estimate while denoising: uint8 [H, W, 3] (a video
    shows a strip of a few frames side by side). Sent every few steps when previews are on."""

    step: int
    total: int
    image: Any


@dataclass(frozen=True)
class Finished:
    result: Any  # engine.pipeline.GenerationResult


@dataclass(frozen=True)
class Failed:
    message: str
    kind: str = "error"  # "invalid" | "refused" | "oom" | "load" | "io" | "error"
    field: str = ""  # for "invalid": the request key at fault (RequestError.field), e.g. "image"


@dataclass(frozen=True)
class Cancelled:
    pass


class JobCancelled(Exception):
    """The job's cancel flag was set; nothing was written."""


class SafetyRefusal(ValueError):
    """The Cosmos guardrail refused a prompt or a generated video; nothing was saved."""


JobEvent = Union[Queued, Started, Progress, Preview, Finished, Failed, Cancelled]
TERMINAL_EVENTS = (Finished, Failed, Cancelled)
