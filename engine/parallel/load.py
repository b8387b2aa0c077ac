"""`engine.load_model`: a checkpoint loaded in this process on one device, or on a group of N GPUs.

It sits on the parallel floor, above the model floor's one-process loader, so that the model floor
never reaches up to the group runtime.
"""
from __future__ import annotations

import os

from ..model.loader import load_in_process
from .runtime import GroupModel, resolve_gpus


def load_model(source: str | os.PathLike, *, gpus: int | str = 1, weights: str | None = None, **in_process):
    """`gpus` (int or "auto") > 1: a group of worker processes, one per GPU (`runtime.GroupModel`; gloo on a
    CPU), weights replicated or sharded (`weights`, else chosen from the fit). Otherwise the checkpoint in
    this process: `load_in_process(source, **in_process)` (device, safety, memory_budget_bytes)."""
    count = resolve_gpus(gpus)
    if count > 1:
        return GroupModel(source, count, weights=weights, per_gpu_bytes=in_process.get("memory_budget_bytes"))
    return load_in_process(source, **in_process)
