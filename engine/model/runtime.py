"""`ModelRuntime`: everything the engine builds for one loaded model and keeps across its requests.

One object on `LoadedModel.runtime`, in place of caches hung on the model or kept in module globals, so a
reader finds every piece of per-model state, and what drops it, here:

- `fused`: the gen tower's fused q/k/v and gate/up weights (its Linears become views of them). Made by the first
  fast-path request (`engine.pipeline.fast_path.fused_projections`); kept while the model is.
- `dispatchers`: one kernel dispatcher per kernels mode, with its measured choices. Made by the first fast-path
  request (`fast_path.dispatcher_for`); kept while the model is.
- `fp8_weights`: the FP8 GEMM weights and the FP8 attention's state. Made by an FP8-only load, or by the first FP8
  request (`engine.pipeline.fp8.fp8_weights`); replaced on a change of FP8 policy (the attention's state carries
  over); an FP8-only model's never.
- `vae_channels_last`: whether the VAE's 3-D conv weights are in channels-last-3d (`fast_path.vae_channels_last`);
  a layout, set once.
- `kept_steps`: whole-step graphs and their buffers, least recently used first (`engine.pipeline.whole_step`).
  Dropped past `MAX_CACHED_STEPS` or the memory share (`whole_step.trim_kept_steps`), and every model's at once
  when a request runs out of memory (`whole_step.release_kept_steps`).
- `unipc_tables`: the UniPC sampler's coefficient tables by schedule
  (`engine.pipeline.scheduler_tables.shared_unipc_table`); least recently used out past `MAX_TABLES`.

A model switch drops the `LoadedModel`, and its runtime with it: the only other reference to a runtime is the
weak registry of those holding kept steps (`holding_kept_steps`), which the memory budget and the out-of-memory
release read across models, because all models share one GPU's memory.

The model floor does not import the pipeline, so the pipeline's types are named in the annotations (and in
the list above), not imported.
"""
from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Callable, Hashable, TypeVar

T = TypeVar("T")

# UniPC tables kept per model: a schedule is fixed by its sigmas, step count, orders and corrector settings, so
# every request at the same step count and shift shares one table.
MAX_TABLES = 16


class TableCache:
    """A small least-recently-used map that two threads may use at once (a warm-up and a request)."""

    def __init__(self, limit: int = MAX_TABLES):
        self.limit = limit
        self._items: OrderedDict[Hashable, object] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._items)

    def get_or_build(self, key: Hashable, build: Callable[[], T]) -> T:
        """The kept value for `key`, else `build()` kept; built outside the lock (two first requests at once only
        build it twice)."""
        with self._lock:
            if key in self._items:
                self._items.move_to_end(key)
                return self._items[key]
        value = build()
        with self._lock:
            self._items[key] = value
            while len(self._items) > self.limit:
                self._items.popitem(last=False)
        return value


@dataclass(eq=False)  # compared and hashed by identity: the weak registry holds runtimes
class ModelRuntime:
    """One loaded model's caches (see the module docstring for each one's lifetime)."""

    fused: "FusedProjections | None" = None  # engine.pipeline.fast_path.FusedProjections
    dispatchers: "dict[str, KernelDispatcher]" = field(default_factory=dict)  # cosmos3_kernels.dispatch, per mode
    fp8_weights: "FP8Weights | None" = None  # engine.pipeline.fp8.FP8Weights
    vae_channels_last: bool = False
    # engine.pipeline.whole_step.StepKey -> WholeStep, least recently used first
    kept_steps: "OrderedDict[StepKey, WholeStep]" = field(default_factory=OrderedDict)
    unipc_tables: TableCache = field(default_factory=TableCache)


_HOLDING_KEPT_STEPS: "weakref.WeakSet[ModelRuntime]" = weakref.WeakSet()


def hold_kept_steps(runtime: ModelRuntime) -> None:
    """Register a runtime that keeps whole steps, for the budget and the release across models (weakly: a
    model that goes leaves the registry with its runtime)."""
    _HOLDING_KEPT_STEPS.add(runtime)


def holding_kept_steps() -> list[ModelRuntime]:
    """Every live runtime registered by `hold_kept_steps`."""
    return list(_HOLDING_KEPT_STEPS)


def forget_kept_step_holders() -> None:
    _HOLDING_KEPT_STEPS.clear()
