"""Side-by-side comparison: one prompt and one seed over several models, as plain data.

`plan_compare` turns the settings into one slot per chosen model: either the engine request that
model will run, or the specific reason it cannot (mode not supported, size not offered, frames out
of range...), so one unfit model never sinks the whole comparison. `run_compare` submits the
runnable slots through the shared job queue one after another and yields each outcome as it ends.
The Gradio tab (`review_tabs.CompareTab`) and the tests both use these two functions.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Awaitable, Callable

from . import controls as C
from .service import JobWasCancelled, StudioError, StudioService

EACH_DEFAULT = "each"  # the size choice "each model's default"
COMPARE_MODES = ("t2i", "t2v")


@dataclass
class CompareSettings:
    """What the user chose once for every model."""

    mode: str  # "t2i" | "t2v"
    prompt: str  # as typed (see `requests.caption_text`); each model's engine parses it once
    seed: int  # one seed for every model; never -1 here
    negative: str = ""
    size: str = EACH_DEFAULT  # "WxH", or EACH_DEFAULT for each model's own default size
    frames: int | None = None  # t2v only; None: each model's default
    steps: int | None = None  # None: each model's default; never applied where steps are locked


@dataclass
class Slot:
    model: str
    request: Any = None  # the engine.Request this model runs (validated once, here); None when it cannot
    reason: str | None = None
    notes: list[str] = field(default_factory=list)  # settings this model kept at its own value, and why


@dataclass
class Outcome:
    model: str
    result: Any = None  # engine.pipeline.GenerationResult when it ran
    reason: str | None = None  # why it could not run, or how it failed
    status: str = "done"  # "done" | "skipped" | "failed" | "cancelled"
    notes: list[str] = field(default_factory=list)


def size_choices(models: list[dict], mode: str) -> list[tuple[str, str]]:
    """'Each model's default' and then every size that at least one model offers for `mode`."""
    seen: list[tuple[int, int]] = []
    for model in models:
        defaults = model["defaults"].get(mode)
        for w, h in (defaults or {}).get("resolutions", []):
            if (w, h) not in seen:
                seen.append((w, h))
    return [("Each model's default size", EACH_DEFAULT)] + [(f"{w} x {h}", C.size_label(w, h)) for w, h in seen]


def _slot(service: StudioService, name: str, settings: CompareSettings) -> Slot:
    from engine.pipeline.request import validate_request

    try:
        model = service.describe(name)
    except StudioError as exc:
        return Slot(name, reason=str(exc))
    mode = settings.mode
    reason = C.unsupported_reason(model, mode)
    if reason:
        return Slot(name, reason=reason)
    defaults = model["defaults"][mode]
    notes: list[str] = []
    if settings.size == EACH_DEFAULT:
        width, height = defaults["width"], defaults["height"]
    else:
        try:
            width, height = C.parse_size(settings.size)
        except ValueError as exc:
            return Slot(name, reason=str(exc))
        allowed = [list(s) for s in defaults["resolutions"]]
        if [width, height] not in allowed:
            sizes = ", ".join(C.size_label(w, h) for w, h in allowed)
            return Slot(name, reason=f"{name} does not offer {width}x{height} for {C.MODE_NAMES[mode]}; "
                                     f"it allows {sizes}.")
    request: dict[str, Any] = {"mode": mode, "prompt": settings.prompt, "negative_prompt": settings.negative,
                               "width": width, "height": height, "seed": int(settings.seed)}
    if model["is_distilled"] and settings.negative:
        notes.append("negative prompt not used (distilled)")
    if mode == "t2v" and settings.frames:
        request["num_frames"] = int(settings.frames)
    if settings.steps:
        if defaults["steps_locked"]:
            notes.append(f"steps fixed at {defaults['steps']} (distilled)")
        else:
            request["steps"] = int(settings.steps)
    try:
        validated = validate_request(service.info(name), mode, request)
    except ValueError as exc:
        return Slot(name, reason=str(exc))
    return Slot(name, request=validated, notes=notes)


def plan_compare(service: StudioService, models: list[str], settings: CompareSettings) -> list[Slot]:
    """One slot per chosen model, in the order given. Raises StudioError for settings no model can fix."""
    if settings.mode not in COMPARE_MODES:
        raise StudioError(f"Compare runs text to image or text to video, got mode {settings.mode!r}.")
    chosen = [m for m in dict.fromkeys(models or [])]
    if len(chosen) < 2:
        raise StudioError("Pick at least two models to compare.", "model")
    return [_slot(service, name, settings) for name in chosen]


Follow = Callable[[Any], Awaitable[Any]]


async def run_compare(service: StudioService, slots: list[Slot], session: str,
                      follow: Follow) -> AsyncIterator[tuple[int, Outcome]]:
    """Run the slots one after another through the queue; yield (slot index, outcome) as each ends.

    `follow(handle)` waits for one job (the UI passes its progress-reporting driver) and raises
    StudioError on failure or JobWasCancelled. A cancel stops the comparison: the slots not yet run
    come back as cancelled.
    """
    cancelled = False
    for index, slot in enumerate(slots):
        if slot.request is None:
            yield index, Outcome(slot.model, reason=slot.reason, status="skipped")
            continue
        if cancelled:
            yield index, Outcome(slot.model, reason="Not run: the comparison was cancelled.", status="cancelled")
            continue
        try:
            handle = service.submit(slot.model, slot.request, session)  # the queue keeps this Request as it is
            result = await follow(handle)
        except JobWasCancelled as exc:
            cancelled = True
            yield index, Outcome(slot.model, reason=exc.message(), status="cancelled")
            continue
        except StudioError as exc:
            yield index, Outcome(slot.model, reason=str(exc), status="failed", notes=slot.notes)
            continue
        service.record(result, slot.model, "compare")
        yield index, Outcome(slot.model, result=result, notes=slot.notes)


def outcome_summary(outcome: Outcome) -> dict:
    """What the slot's "Parameters and timings" panel shows."""
    if outcome.result is None:
        return {"model": outcome.model, "status": outcome.status, "reason": outcome.reason}
    result = outcome.result
    return {"model": outcome.model, "request_id": result.request_id, "seed": result.seed,
            "params": result.summary()["params"], "timings": result.timings, "notes": outcome.notes}


def outcome_title(outcome: Outcome) -> str:
    """The slot's heading: model, then seconds and seed, or the reason it did not run."""
    if outcome.result is not None:
        took = outcome.result.timings.get("total")
        p = outcome.result.params
        size = f"{p.get('width')}x{p.get('height')}" + (f", {p.get('num_frames')} frames" if p.get("mode") != "t2i"
                                                         else "")
        text = f"**{outcome.model}** · {size} · {p.get('steps')} steps"
        text += f" · {took:.1f} s" if took is not None else ""
        text += f" · seed {outcome.result.seed}"
        if outcome.notes:
            text += " · " + "; ".join(outcome.notes)
        return text
    label = {"skipped": "cannot run this", "failed": "failed", "cancelled": "cancelled"}.get(outcome.status, "")
    return f"**{outcome.model}** · {label}: {outcome.reason}"
