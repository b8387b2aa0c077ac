"""The one timing helper: how the kernel dispatcher and every benchmark in bench/ time GPU work.

CUDA events on the current stream around `inner` back-to-back calls, after `warmup` untimed calls
(off the GPU, `time.perf_counter`); every sample (milliseconds per call) is kept, so a caller reports
the median, the spread or quantiles from the same numbers. Why one helper: the dispatcher's choice
between a Triton kernel and its PyTorch path, and the tables in docs/PERFORMANCE.md, are only
comparable when they are measured the same way (the same warm-up, the same clock, the same median).
It lives in kernels/ because kernels/ is the leaf every floor that measures may import.
"""
from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass
from typing import Callable

import torch

# `inner="auto"` runs enough calls per sample to fill about this long, so launch-bound ops are not
# lost in the events' resolution (and at most AUTO_MAX_INNER calls).
AUTO_SAMPLE_MS = 1.0
AUTO_MAX_INNER = 200


@dataclass(frozen=True)
class Timing:
    """Milliseconds per call, one entry per sample."""

    samples_ms: tuple[float, ...]

    @property
    def median_ms(self) -> float:
        return statistics.median(self.samples_ms)

    @property
    def min_ms(self) -> float:
        return min(self.samples_ms)

    @property
    def max_ms(self) -> float:
        return max(self.samples_ms)

    def quantile(self, q: float) -> float:
        """The sample at fraction `q` of the sorted samples (nearest rank, no interpolation)."""
        ordered = sorted(self.samples_ms)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    def summary(self) -> dict:
        return {"median_ms": self.median_ms, "min_ms": self.min_ms, "max_ms": self.max_ms, "n": len(self.samples_ms)}

    def fmt(self) -> str:
        """'median (p10-p90)' in ms."""
        return f"{self.median_ms:.3f} ({self.quantile(0.1):.3f}-{self.quantile(0.9):.3f})"


def time_ms(fn: Callable[[], object], *, warmup: int = 1, iters: int = 5, inner: int | str = 1,
            before: Callable[[], object] | None = None) -> Timing:
    """Time `fn`: `warmup` untimed calls, then `iters` samples of `inner` calls each ("auto": sized to
    about AUTO_SAMPLE_MS). `before` runs ahead of each sample, untimed (e.g. a barrier across ranks)."""
    for _ in range(warmup):
        fn()
    clock = _EventClock() if torch.cuda.is_available() else _WallClock()
    if inner == "auto":
        inner = max(1, min(AUTO_MAX_INNER, math.ceil(AUTO_SAMPLE_MS / max(clock.measure(fn, 1), 1e-3))))
    samples = []
    for _ in range(iters):
        if before is not None:
            before()
        samples.append(clock.measure(fn, inner) / inner)
    return Timing(tuple(samples))


class _EventClock:
    def __init__(self):
        torch.cuda.synchronize()
        self.start, self.end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

    def measure(self, fn, calls: int) -> float:
        self.start.record()
        for _ in range(calls):
            fn()
        self.end.record()
        self.end.synchronize()
        return self.start.elapsed_time(self.end)


class _WallClock:
    def measure(self, fn, calls: int) -> float:
        began = time.perf_counter()
        for _ in range(calls):
            fn()
        return (time.perf_counter() - began) * 1000
