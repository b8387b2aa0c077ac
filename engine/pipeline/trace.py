"""What one run did, in public: `GenerationResult.trace`.

Which tower ran and which fast-path passes it applied, what the eager loop ran at each step, how often the
host waited on the device, whether the whole step was built or a kept one reused, how often its graphs were
recorded and replayed, and the kernels dispatch chose. Tests and benchmarks read this instead of spying on
private calls (a refactor that keeps the behaviour keeps the trace), and a user can see why two runs of one
seed differ (another pass, another kernel).
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from cosmos3_kernels.dispatch import REGULAR


@dataclass
class RunTrace:
    """One run's record, filled in by the stages as they run (the run state's `trace`)."""

    tower: str = ""  # "eager" | "fast" | "group" (engine.pipeline.state.GenTower.kind)
    # The fast-path passes applied: the tower's (FastGenTower.passes), then "whole_step", the decode's
    passes: list[str] = field(default_factory=list)
    tower_steps: list[int] = field(default_factory=list)  # each step's branch count through the tower (either loop)
    velocities: int = 0  # eager loop: velocities computed (one per branch and step)
    ops: Counter = field(default_factory=Counter)  # fast tower: how often each optional op ran ("residual_add_in_gemm")
    host_syncs: int = 0  # waits of the host on the device inside the denoising loop (engine.pipeline.pacing)
    whole_step: str | None = None  # "built" | "reused" (a kept step), None where the eager loop ran
    graph_records: int = 0  # whole-step CUDA graphs captured in this run
    graph_replays: int = 0  # and replayed
    kernels: dict[str, list[str]] = field(default_factory=dict)  # op -> the paths dispatch holds for it after the run


def kernel_choices(tower) -> dict[str, list[str]]:
    """op -> the paths the tower's kernel dispatcher has chosen for it (every shape), where it has one."""
    dispatch = getattr(tower, "dispatch", None)
    if dispatch is None:
        return {}
    chosen: dict[str, set[str]] = {}
    for key, decision in dispatch.decisions().items():
        op = key[0] if isinstance(key, tuple) else str(key)
        backend = decision.backend  # REGULAR: a sharing decision that does not share
        chosen.setdefault(op, set()).add("not shared" if backend == REGULAR else backend)
    return {op: sorted(paths) for op, paths in sorted(chosen.items())}
