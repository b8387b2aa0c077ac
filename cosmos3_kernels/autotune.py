"""The one autotuner: times an op's candidate backends at a shape, keeps the fastest, and remembers the choice.

A candidate is a backend of the op (`cosmos3_kernels.registry`) at one launch config; each backend's best config
stands for it, and the fastest backend wins (a tie keeps the one listed first: the op's order, its PyTorch
reference first). The choice is kept per key (the op and its shape, which the caller builds) in memory and, where
a ``store`` is given, on disk (`cosmos3_kernels.persist.DecisionStore`: one file per GPU, driver, library versions
and kernel source), so a restarted process reads it instead of timing again.

Within a memory budget: a candidate says how many bytes its timing allocates beyond its inputs (`sized`), and one
that would not fit the device's free memory (the driver's, plus the caching allocator's unused blocks, less
``MEMORY_HEADROOM``) is skipped, never run into an out-of-memory error; one that runs out anyway is left out too.
Why: Super at 720p on one H200 died timing the PyTorch reference of QK-norm+RoPE (fp32 copies of 1.4 GB tensors).

How a candidate is timed (``TIMINGS``): "graph", the default, replays a CUDA graph of its calls, since the step runs
inside one and pays no Python launch; "eager" times back-to-back calls, launches included (kept for the A/B in
docs/perf-log/2026-12-02.md). Both through `cosmos3_kernels.timing`, the one timing helper.
"""
from __future__ import annotations

import dataclasses
import logging
import statistics
from dataclasses import dataclass, field
from typing import Callable, Hashable, Mapping

import torch

from cosmos3_kernels.persist import DecisionStore
from cosmos3_kernels.timing import time_ms

log = logging.getLogger("cosmos3_kernels.autotune")

TIMINGS = ("graph", "eager")
# Left free when a candidate's timing is checked against the device's memory: cuBLAS and cuDNN workspaces, a graph
# pool's rounding.
MEMORY_HEADROOM = 512 * 2**20
NOT_MEASURED = "not measured: no candidate fits the memory budget"
# The record format of a stored decision, part of its key: a store written by older code (one field per backend)
# is never read as this one.
DECISION_FORMAT = 2
ALTERNATING_ROUNDS = 3  # `Autotuner.measure_alternating`: rounds over the candidates


@dataclass(frozen=True)
class Decision:
    """Which backend runs an op at a shape, and why; `ms`: each measured backend's time (its best config's), empty
    where it chose without measuring; `config`: the chosen backend's launch config (None: its only one)."""

    backend: str
    reason: str
    ms: Mapping[str, float] = field(default_factory=dict)
    config: object = None

    @property
    def chosen_ms(self) -> float | None:
        """The measured time of the backend it chose (None where it chose without measuring)."""
        return self.ms.get(self.backend)


def encode_decision(decision: Decision) -> dict:
    """A `Decision` as plain JSON (`decode_decision` reads it back)."""
    config = decision.config
    if dataclasses.is_dataclass(config):
        config = {"type": type(config).__name__, **dataclasses.asdict(config)}
    return {"format": DECISION_FORMAT, "backend": decision.backend, "reason": decision.reason,
            "ms": dict(decision.ms), "config": config}


def decode_decision(record: dict, config_types: Mapping[str, type] | None = None) -> Decision | None:
    """`encode_decision`'s inverse; None for a record it cannot read (another format, or a config type it lacks)."""
    try:
        if record.get("format") != DECISION_FORMAT:
            return None
        config = record.get("config")
        if isinstance(config, dict):
            config = (config_types or {})[config["type"]](**{k: v for k, v in config.items() if k != "type"})
        ms = {str(name): float(value) for name, value in record["ms"].items()}
        return Decision(str(record["backend"]), str(record["reason"]), ms, config)
    except (AttributeError, KeyError, TypeError, ValueError):
        return None


class OverBudget(RuntimeError):
    """A candidate's timing would not fit the device's free memory (or ran out of it): it is skipped."""


def sized(fn: Callable[[], object], need_bytes: int) -> Callable[[], object]:
    """``fn`` marked with the bytes its call allocates beyond its inputs (checked before it is timed)."""
    fn.need_bytes = int(need_bytes)
    return fn


def free_device_bytes() -> int:
    """What the current CUDA device can still give: the driver's free memory plus the caching allocator's unused
    blocks (which a new tensor reuses)."""
    free, _ = torch.cuda.mem_get_info()
    return free + torch.cuda.memory_reserved() - torch.cuda.memory_allocated()


Candidates = Mapping[str, Mapping[object, Callable[[], object]]]  # {backend: {config: call}}, in the op's order


class Autotuner:
    """Times candidates (`measure`, `measure_alternating`) within the memory budget and keeps decisions by key
    (`cached`, `remember`). `scope` tells apart tuners that offer different candidates for the same key (their
    decisions are not each other's)."""

    def __init__(self, *, timing: str = "graph", warmup: int = 2, iters: int = 5, store: DecisionStore | None = None,
                 free_memory: Callable[[], int] | None = None, scope: str = "",
                 config_types: Mapping[str, type] | None = None) -> None:
        if timing not in TIMINGS:
            raise ValueError(f"timing must be one of {TIMINGS}, got {timing!r}")
        self.timing, self.warmup, self.iters = timing, warmup, iters
        self.store = store  # measured decisions kept across processes (None: this process only)
        self.free_memory = free_memory or free_device_bytes  # bytes a candidate's timing may take
        self.scope = scope
        self.config_types = dict(config_types or {})
        self._decisions: dict[Hashable, Decision] = {}

    # -- the decisions kept ---------------------------------------------------------------------------
    def decisions(self) -> dict[Hashable, Decision]:
        return dict(self._decisions)

    def clear(self) -> None:
        self._decisions.clear()

    def _store_key(self, key: Hashable) -> str:
        # A dtype's repr (torch.bfloat16) reads the same in every process.
        return f"v{DECISION_FORMAT}|{self.timing}|{self.scope}|{key!r}"

    def cached(self, key: Hashable) -> Decision | None:
        """The decision kept for `key` in this process, else one a previous process measured (`store`), else None."""
        decision = self._decisions.get(key)
        if decision is None and self.store is not None:
            record = self.store.get(self._store_key(key))
            decision = decode_decision(record, self.config_types) if record is not None else None
            if decision is not None:
                self._decisions[key] = decision
        return decision

    def remember(self, key: Hashable, decision: Decision) -> Decision:
        """Keep `decision` for `key`; on disk too where it was measured in full (one that skipped a candidate is
        this process's only)."""
        self._decisions[key] = decision
        if self.store is not None and decision.reason == "measured":
            self.store.put(self._store_key(key), encode_decision(decision))
        return decision

    # -- timing within the budget ---------------------------------------------------------------------
    def fits(self, need_bytes: int) -> bool:
        """Whether `need_bytes` more fit the device now, `MEMORY_HEADROOM` left over (always on the CPU)."""
        if need_bytes <= 0 or not torch.cuda.is_available() and self.free_memory is free_device_bytes:
            return True
        return need_bytes + MEMORY_HEADROOM <= self.free_memory()

    def time(self, fn: Callable[[], object]) -> float:
        """Median ms of one candidate, the way ``self.timing`` says; `OverBudget` where its `sized` bytes do not
        fit, or it runs out of memory (the caching allocator's blocks then go back to the driver)."""
        need = getattr(fn, "need_bytes", 0)
        if not self.fits(need):
            raise OverBudget(f"needs {need / 2**30:.2f} GiB, {self.free_memory() / 2**30:.2f} GiB free")
        graphed = self.timing == "graph"
        try:
            # A graph of one short call would time the replay's launch with it: "auto" fills ~2 ms instead.
            return time_ms(fn, warmup=self.warmup, iters=self.iters, inner="auto" if graphed else 1,
                           graphed=graphed).median_ms
        except torch.OutOfMemoryError as err:
            torch.cuda.empty_cache()
            raise OverBudget(f"ran out of memory: {str(err).splitlines()[0][:160]}") from None

    def fastest(self, configs: Mapping[object, Callable[[], object]],
                skip_failures: bool = False) -> tuple[object, float | None]:
        """(config, median ms) of the fastest of ``{config: fn}``, (None, None) if none ran; the first listed wins a
        tie. One over the budget is skipped; with ``skip_failures`` one that raises is logged and left out."""
        best_config, best_ms = None, float("inf")
        for config, fn in configs.items():
            try:
                ms = self.time(fn)
            except OverBudget as err:
                log.warning("kernel candidate %s skipped: over the memory budget (%s)", config, err)
                continue
            except Exception as err:  # noqa: BLE001 - a library config this GPU cannot build is not fatal
                if not skip_failures:
                    raise
                log.warning("kernel candidate %s failed and is left out: %s: %s", config, type(err).__name__, err)
                continue
            if ms < best_ms:
                best_config, best_ms = config, ms
        return (best_config, best_ms) if best_ms < float("inf") else (None, None)  # configs may be None (one)

    def measure(self, candidates: Candidates, *, tolerant: frozenset = frozenset(),
                if_none_fits: tuple[str, object] = ("triton", None)) -> Decision:
        """Time every config of every backend (in order), keep the fastest backend (a tie keeps the earlier).
        Backends in `tolerant` (libraries) may fail to build a config, left out; another's failure raises. Where
        nothing could be timed within the budget, `if_none_fits` (backend, config) is taken unmeasured."""
        times, best = {}, {}
        for name, configs in candidates.items():
            config, ms = self.fastest(configs, skip_failures=name in tolerant)
            if ms is not None:
                times[name], best[name] = ms, config
        if not times:
            return Decision(if_none_fits[0], NOT_MEASURED, config=if_none_fits[1])
        skipped = any(name not in times and name not in tolerant for name in candidates)
        chosen = min(times, key=times.get)  # dicts keep the order: the first of equal times wins
        return Decision(chosen, "measured, some candidates over the memory budget" if skipped else "measured",
                        times, best[chosen])

    def measure_alternating(self, candidates: Candidates, rounds: int = ALTERNATING_ROUNDS,
                            left_out: tuple[str, ...] = ()) -> Decision:
        """As `measure`, over ``rounds`` rounds that time every candidate in turn, the order reversed every other
        round, each candidate's median kept. Why for the MLP input: under the power cap the first candidate timed
        after a pause runs at a higher clock than the next, and the two paths differ by a few percent
        (docs/perf-log/2026-12-02.md, "The MLP's activation in its GEMM"). The first candidate (the reference)
        must run; another that raises is left out (logged). `left_out`: why candidates were dropped before."""
        order = [(name, config) for name, configs in candidates.items() for config in configs]
        samples: dict[tuple, list[float]] = {pair: [] for pair in order}
        for round_ in range(rounds):
            for pair in (order if round_ % 2 == 0 else order[::-1]):
                if pair not in samples:
                    continue
                try:
                    samples[pair].append(self.time(candidates[pair[0]][pair[1]]))
                except Exception as err:  # noqa: BLE001 - a library config this GPU cannot capture is not fatal
                    if pair == order[0]:
                        raise
                    log.warning("kernel candidate %s failed and is left out: %s: %s", pair, type(err).__name__, err)
                    del samples[pair]
        times, best = {}, {}
        for (name, config), ms in samples.items():
            median = statistics.median(ms)
            if median < times.get(name, float("inf")):
                times[name], best[name] = median, config
        chosen = min(times, key=times.get)
        reason = "measured" + (f"; left out: {'; '.join(left_out)}" if left_out else "")
        return Decision(chosen, reason, times, best[chosen])
