"""The one timing helper: how the kernel dispatcher and every benchmark in bench/ time GPU work.

CUDA events on the current stream around `inner` back-to-back calls, after `warmup` untimed calls
(off the GPU, `time.perf_counter`); every sample (milliseconds per call) is kept, so a caller reports
the median, the spread or quantiles from the same numbers. Why one helper: the dispatcher's choice
between a Triton kernel and its PyTorch path, and the tables in docs/PERFORMANCE.md, are only
comparable when they are measured the same way (the same warm-up, the same clock, the same median).
It lives in cosmos3_kernels/ because cosmos3_kernels/ is the leaf every floor that measures may import.

`graphed=True` times replays of a CUDA graph of the calls instead of the calls themselves. Why: a
kernel that runs inside the engine's step graph pays no Python launch, and at image shapes a Triton or
CuTe DSL launch takes about as long on the host as its kernel on the GPU, so eager back-to-back calls
time partly the host (docs/perf-log/2026-12-02.md, "The clock a request runs at"). The dispatcher times this way.
"""
from __future__ import annotations

import logging
import math
import statistics
import time
from dataclasses import dataclass
from typing import Callable

import torch

from cosmos3_kernels.graphs import capture

log = logging.getLogger(__name__)

# `inner="auto"` runs enough calls per sample to fill about this long, so launch-bound ops are not
# lost in the events' resolution (and at most AUTO_MAX_INNER calls).
AUTO_SAMPLE_MS = 1.0
AUTO_MAX_INNER = 200
# A graphed sample replays one graph of enough calls to fill about this long by the eager estimate (which
# overstates a launch-bound call), so the host's one graph launch per sample is under a percent of it.
GRAPH_SAMPLE_MS = 2.0


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
            before: Callable[[], object] | None = None, graphed: bool = False) -> Timing:
    """Time `fn`: `warmup` untimed calls, then `iters` samples of `inner` calls each ("auto": sized to
    about AUTO_SAMPLE_MS). `before` runs ahead of each sample, untimed (e.g. a barrier across ranks).

    `graphed` (CUDA only; the CPU has no graphs and times the calls): after the warm-up, one CUDA graph of
    `inner` calls ("auto": about GRAPH_SAMPLE_MS of them) is captured, and each sample replays it, so `fn`
    itself runs only `warmup + inner` times. A call that cannot be captured is timed eagerly, with a
    warning: what it costs is still measured, and the step graph's own capture reports the real problem."""
    for _ in range(warmup):
        fn()
    if graphed and torch.cuda.is_available():
        try:
            return _time_graph_replays(fn, iters=iters, inner=inner, before=before)
        except Exception as err:  # noqa: BLE001 - an uncapturable call is still timed, the eager way
            log.warning("timing %r eagerly: it could not be captured in a CUDA graph: %s: %s",
                        fn, type(err).__name__, err)
    clock = _EventClock() if torch.cuda.is_available() else _WallClock()
    if inner == "auto":
        inner = max(1, min(AUTO_MAX_INNER, math.ceil(AUTO_SAMPLE_MS / max(clock.measure(fn, 1), 1e-3))))
    samples = []
    for _ in range(iters):
        if before is not None:
            before()
        samples.append(clock.measure(fn, inner) / inner)
    return Timing(tuple(samples))


def _time_graph_replays(fn, *, iters: int, inner: int | str, before) -> Timing:
    clock = _EventClock()
    if inner == "auto":
        inner = max(1, min(AUTO_MAX_INNER, math.ceil(GRAPH_SAMPLE_MS / max(clock.measure(fn, 1), 1e-3))))

    def calls():  # each call's result is dropped at once, so the next can reuse its memory in the graph's pool
        for _ in range(inner):
            fn()

    graph, _ = capture(calls)
    samples = []
    for _ in range(iters):
        if before is not None:
            before()
        samples.append(clock.measure(graph.replay, 1) / inner)
    del graph  # its private pool (the calls' outputs) goes back to the caching allocator
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
