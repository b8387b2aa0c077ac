"""`engine.load_model`: a checkpoint loaded in this process on one device, or on a group of N GPUs.

It sits on the parallel floor, above the model floor's one-process loader, so that the model floor
never reaches up to the group runtime.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

from ..config import Config, configured
from ..model.loader import load_in_process
from .runtime import GroupModel, resolve_gpus


def load_model(source: str | os.PathLike, *, gpus: int | str = 1, weights: str | None = None, fp8: bool | None = None,
               config: Config | None = None, **in_process):
    """`gpus` (int or "auto") > 1: a group of worker processes, one per GPU (`runtime.GroupModel`; gloo on a
    CPU), weights replicated or sharded (`weights`, else chosen from the fit). Otherwise the checkpoint in
    this process: `load_in_process(source, **in_process)` (device, safety, memory_budget_bytes).
    `fp8` (None: `COSMOS3_FP8`): on one GPU, a model whose bf16 weights do not fit is built FP8-only
    (`engine.pipeline.fp8.build_fp8_transformer`, faster, approximate) where that fits. `config` (None: built
    here from the environment, `engine.config.build_config`) is what the model runs under."""
    config = configured(config)  # before the first kernel compiles: a restart reads what this one wrote
    count = resolve_gpus(gpus)
    if count > 1:
        return GroupModel(source, count, weights=weights, per_gpu_bytes=in_process.get("memory_budget_bytes"),
                          config=config)
    if config.fp8.enabled if fp8 is None else fp8:
        in_process.setdefault("fp8_loader", FP8OnlyLoader.from_config(config))
    from ..pipeline.fast_path import load_kernels
    from ..pipeline.memory import prepare_at_load

    model = load_in_process(source, config=config, **in_process)
    prepare_at_load(model)  # the memory plan, logged; the text tower to the host where large requests need it
    load_kernels(model)  # the kernel libraries' imports, before any request rather than inside the first
    return model


@dataclass(frozen=True)
class FP8OnlyLoader:
    """Builds a checkpoint folder's transformer FP8-only on a device (`engine.pipeline.fp8.build_fp8_transformer`)
    under `policy` (None: `spelling`, `COSMOS3_FP8_POLICY`, or the family's measured default for what the device
    and host can run); the loader sizes the model by the same policy (`policy_for`). `backend`, `pack_gqa`: the
    FP8 attention's (`engine.pipeline.fp8.fp8_attention`)."""

    policy: Any = None
    spelling: str = ""
    backend: str = ""
    pack_gqa: str = ""

    @classmethod
    def from_config(cls, config: Config) -> "FP8OnlyLoader":
        return cls(spelling=config.fp8.policy, backend=config.fp8.attention, pack_gqa=config.fp8.fa3_pack_gqa)

    def policy_for(self, family: str, device):
        from ..pipeline.fp8 import host_policy

        return self.policy if self.policy is not None else host_policy(family, device, self.spelling, self.backend)

    def __call__(self, folder, device, family: str):
        from ..pipeline.fp8 import build_fp8_transformer, check_available, checkpoint_fill

        policy = self.policy_for(family, device)
        check_available(device, policy, self.backend)
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
        return build_fp8_transformer(config, device, checkpoint_fill(folder), policy, backend=self.backend,
                                     pack_gqa=self.pack_gqa)
