"""The prefill stage: each CFG branch's text and positions, the text tower once per branch (its K/V
written into the packed cache), and the gen tower that reads that cache at every step.

The tower is the exact eager one (op for op as diffusers), the fast path where it applies (CUDA,
unless switched off; engine.pipeline.fast_path), or a GPU group's (engine.parallel.group); all three
take the same call, (gen tokens, branch count) -> each branch's output, so the loop does not care.
"""
from __future__ import annotations

import torch

from ..model.loader import LoadedModel
from ..parallel.group import GroupGenTower, group_prefill
from . import whole_step
from .fast_path import FastGenTower, FastPathOptions, fuses_mlp_activation, fuses_residual_add, rounds_qk_norm
from .layout import positions
from .state import Branch, GenLayout, RunState
from .transformer import KVCache, allocate_cache, gen_forward, prefill


def prefill_stage(state: RunState) -> None:
    """Branches (the unconditional one only where some step runs it), their prefill, the gen tower."""
    model, request, layout = state.model, state.request, state.layout
    cond_ids, uncond_ids = state.token_ids
    state.branches = [Branch(0, cond_ids, positions(model, layout, len(cond_ids), request["fps"]))]
    if any(state.plan):
        state.branches.append(Branch(1, uncond_ids, positions(model, layout, len(uncond_ids), request["fps"])))
    state.cache = prefill_cache(model, state.branches, layout, lengths_on_device=whole_step.lengths_on_device(state))
    state.tower = make_gen_tower(model, state.cache, state.branches, state.options, layout)


def prefill_cache(model: LoadedModel, branches: list[Branch], layout: GenLayout, *,
                  lengths_on_device: bool = False) -> KVCache:
    """The text tower once per branch, its K/V written into the packed cache (on a GPU group: each
    rank's head share of the branch it serves, `engine.parallel.group`). `lengths_on_device`: see
    `transformer.KVCache` (decided by `whole_step.lengths_on_device`)."""
    if model.parallel is not None:
        return group_prefill(model, branches, layout.gen_len)
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


def make_gen_tower(model: LoadedModel, cache: KVCache, branches: list[Branch], options: FastPathOptions | None = None,
                   layout: GenLayout | None = None):
    """The exact eager tower, or the fast path where it applies (CUDA, unless switched off).
    `options`: the request's fast-path switches (from the model or its configuration when not given);
    `layout`: the request's gen layout, whose frame count decides where the fast path rounds once
    (`fast_path.rounds_qk_norm`, `fast_path.fuses_mlp_activation`, `fast_path.fuses_residual_add`; without it,
    diffusers' roundings)."""
    options = options if options is not None else FastPathOptions.for_model(model)
    frames = layout.vision_shape[0] if layout is not None else None
    rounding = dict(round_qk_norm=rounds_qk_norm(options, frames),
                    fuse_mlp_activation=fuses_mlp_activation(options, frames),
                    fuse_residual_add=fuses_residual_add(options, frames))
    if model.parallel is not None:
        return GroupGenTower(model, cache, options, **rounding)
    if options.enabled:
        return FastGenTower(model, cache, branches, options, **rounding)
    return EagerGenTower(model, cache, branches)


class EagerGenTower:
    """The gen tower one branch at a time, op for op as diffusers runs it (the exact path)."""

    def __init__(self, model: LoadedModel, cache: KVCache, branches: list[Branch]):
        self.transformer, self.cache, self.branches = model.transformer, cache, branches

    def __call__(self, tokens: torch.Tensor, count: int) -> list[torch.Tensor]:
        return [gen_forward(self.transformer, self.cache, b.index, b.rotary, tokens) for b in self.branches[:count]]
