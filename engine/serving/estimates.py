"""How long a request should take on one H200, from the current measured figures in docs/data/current.json.

Used to size a ZeroGPU reservation (`@spaces.GPU(duration=...)`) and to give a first ETA before the
queue has timed any job. The step and decode times are those of the workloads named below, read from
docs/data/current.json, the one home of each figure (docs/PERFORMANCE.md is rendered from it), so a new
measurement moves the estimates with the docs. Between measured points the step time is interpolated in
log-log space over gen tokens, which follows the attention-dominated growth of long videos and the flat
launch-bound T2I end.
"""
from __future__ import annotations

import functools
import json
import math
from dataclasses import dataclass
from pathlib import Path

from ..model.variants import VariantInfo

CURRENT_FIGURES = Path(__file__).resolve().parents[2] / "docs" / "data" / "current.json"

# Per family, the workloads whose step (both CFG branches at every step) gives the step time at their gen-token
# count. Edge's image point is its step against diffusers: the end-to-end Edge T2I row runs the default guidance
# interval, one branch on part of its steps, so its mean step is not a two-branch step.
STEP_WORKLOADS = {
    "nano": ("nano-t2i-1024", "nano-t2v-480p", "nano-t2v-720p"),
    "edge": ("step-edge-t2i-640", "edge-t2v-480p"),
}
# The Wan2.2 decode stage by gen-token count; every family decodes with the same VAE.
DECODE_WORKLOADS = ("nano-t2i-1024", "edge-t2v-480p", "nano-t2v-720p")
# Super has ~4x Nano's parameters; until its one-GPU step is measured, scale Nano's steps by its FLOP ratio.
_SUPER_SCALE = 4.3
# Prompt, prefill and saving: a margin over the measured prefill (0.1-0.3 s warm) for a cold text length and the
# file write, which the end-to-end figures leave out.
_FIXED_SECONDS = 3.0


@dataclass(frozen=True)
class StepTimes:
    """Measured (gen tokens, seconds) points, ascending in gen tokens."""

    step_seconds: dict[str, tuple[tuple[int, float], ...]]  # family -> a step with both CFG branches
    decode_seconds: tuple[tuple[int, float], ...]


def _figure(entries: dict, name: str, figure: str, path: Path) -> tuple[int, float]:
    entry = entries.get(name)
    if entry is None:
        raise ValueError(f"{path} has no workload {name!r}, which engine/serving/estimates.py reads; "
                         f"it has: {', '.join(sorted(entries))}")
    if figure not in entry.get("figures", {}) or "gen_tokens" not in entry:
        raise ValueError(f"{path}: workload {name!r} lacks {figure!r} or gen_tokens, which the estimates read")
    seconds = entry["figures"][figure] / (1000.0 if figure.endswith("_ms") else 1.0)
    return int(entry["gen_tokens"]), seconds


def _ascending(points: list[tuple[int, float]], what: str, path: Path) -> tuple[tuple[int, float], ...]:
    points = sorted(points)
    if any(a[0] == b[0] for a, b in zip(points, points[1:])):
        raise ValueError(f"{path}: two {what} points at one gen-token count: {points}")
    return tuple(points)


def load_step_times(path: Path = CURRENT_FIGURES) -> StepTimes:
    """The step and decode points of the workloads named above, from `path` (docs/data/current.json)."""
    entries = {entry["id"]: entry for entry in json.loads(Path(path).read_text(encoding="utf-8"))["workloads"]}
    for names in STEP_WORKLOADS.values():
        for name in names:
            if name in entries and entries[name].get("cfg") != "every step":
                raise ValueError(f"{path}: workload {name!r} runs CFG {entries[name].get('cfg')!r}; a step point "
                                 "needs both branches at every step")
    steps = {family: _ascending([_figure(entries, name, "step_ms", path) for name in names], f"{family} step", path)
             for family, names in STEP_WORKLOADS.items()}
    decode = _ascending([_figure(entries, name, "decode_s", path) for name in DECODE_WORKLOADS], "decode", path)
    return StepTimes(step_seconds=steps, decode_seconds=decode)


@functools.lru_cache(maxsize=1)
def current_step_times() -> StepTimes:
    return load_step_times()


def _interpolate(points, x: float) -> float:
    if x <= points[0][0]:
        return points[0][1] * x / points[0][0] if len(points) > 1 and x > 0 else points[0][1]
    for (x0, y0), (x1, y1) in zip(points, points[1:]):
        if x <= x1:
            t = (math.log(x) - math.log(x0)) / (math.log(x1) - math.log(x0))
            return math.exp(math.log(y0) + t * (math.log(y1) - math.log(y0)))
    (x0, y0), (x1, y1) = points[-2], points[-1]
    slope = (math.log(y1) - math.log(y0)) / (math.log(x1) - math.log(x0))
    return y1 * (x / x1) ** slope


def gen_tokens(width: int, height: int, num_frames: int) -> int:
    latent_frames = (num_frames - 1) // 4 + 1
    return latent_frames * math.ceil(height / 32) * math.ceil(width / 32)


def estimate_seconds(info: VariantInfo, request: dict, times: StepTimes | None = None) -> float:
    """Expected seconds for a validated request (width/height/num_frames/steps/guidance filled in)."""
    times = times or current_step_times()
    tokens = gen_tokens(request["width"], request["height"], request["num_frames"])
    family = info.family if info.family in times.step_seconds else "nano"
    per_step = _interpolate(times.step_seconds[family], tokens)
    if info.family == "super":
        per_step *= _SUPER_SCALE
    if request.get("guidance_scale", 1.0) == 1.0:
        per_step /= 2  # one branch
    return _FIXED_SECONDS + request["steps"] * per_step + _interpolate(times.decode_seconds, tokens)
