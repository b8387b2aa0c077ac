"""The prefill stage: each CFG branch's text and positions, and the text tower once per branch (its K/V
written into the packed cache that the gen tower, made by the next stage (`engine.pipeline.tower`), reads at
every step). On a GPU group the group prefills (`engine.pipeline.tower.TowerGroup`).
"""
from __future__ import annotations

import torch

from ..model.loader import LoadedModel
from . import whole_step
from .layout import positions
from .state import Branch, GenLayout, RunState
from .transformer import KVCache, allocate_cache, prefill


def prefill_stage(state: RunState) -> None:
    """Reads `model`, `request`, `layout`, `token_ids`, `plan`, `options`; writes `branches` (the unconditional
    one only where some step runs it) and `cache` (their prefill)."""
    model, request, layout = state.model, state.request, state.layout
    cond_ids, uncond_ids = state.token_ids
    state.branches = [Branch(0, cond_ids, positions(model, layout, len(cond_ids), request["fps"]))]
    if any(state.plan):
        state.branches.append(Branch(1, uncond_ids, positions(model, layout, len(uncond_ids), request["fps"])))
    state.cache = prefill_cache(model, state.branches, layout, lengths_on_device=whole_step.lengths_on_device(state))


def prefill_cache(model: LoadedModel, branches: list[Branch], layout: GenLayout, *,
                  lengths_on_device: bool = False) -> KVCache:
    """The text tower once per branch, its K/V written into the packed cache (on a GPU group: each
    rank's head share of the branch it serves, `engine.parallel.group`). `lengths_on_device`: see
    `transformer.KVCache` (decided by `whole_step.lengths_on_device`)."""
    if model.parallel is not None:
        return model.parallel.prefill(model, branches, layout.gen_len)
    # The loaded model's device: diffusers' `ModelMixin.device` walks every submodule for offload hooks, ~6 ms a read
    # on a full-size tower (a warm Edge T2V request's prefill, H200, docs/perf-log/2026-12-02.md). The dtype is still read
    # from the tower: the loaded model's records the load's dtype, which a tower converted after loading (an
    # FP8-only build's tests) does not keep.
    cache = allocate_cache(model.transformer, tuple(len(b.token_ids) for b in branches), layout.gen_len,
                           lengths_on_device=lengths_on_device, prompt_room=whole_step.KEPT_PROMPT_TOKENS,
                           device=model.device)
    for branch in branches:
        ids = torch.tensor(branch.token_ids, dtype=torch.long, device=model.device)
        branch.rotary = prefill(model.transformer, cache, branch.index, ids, branch.position_ids)
    return cache
