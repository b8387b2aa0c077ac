"""The reasoner's own job event: text as it is decoded. It travels through the same job queue and
event stream as the generator's events (`engine.events`), beside `Progress(stage="reason")`."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ReasonerText:
    text: str  # the new text since the previous event
    tokens: int  # tokens decoded so far in this attempt
    restart: bool = False  # a new attempt begins (enhance retries): drop the text shown so far
