"""The tower stage: the gen tower that reads the prefilled K/V cache at every denoising step.

Three towers take the same call, `tower(gen tokens, branch count) -> each branch's final-normed output`
(`engine.pipeline.state.GenTower`), so the loop does not care which one runs:
- `EagerGenTower`: op for op as diffusers runs it (the exact path, and the default off the GPU);
- `engine.pipeline.fast_path.FastGenTower`: the fast path's passes (CUDA, unless switched off), with its
  fused projections, FP8 weights and kernel dispatcher taken from the model's runtime;
- a GPU group's tower (`engine.parallel.group.GroupGenTower`), which a rank's `model.parallel` makes
  (`engine.pipeline.state.TowerGroup`). The pipeline never imports the parallel floor: the group hands the
  pipeline its prefill and its tower through that protocol.
"""
from __future__ import annotations

from collections import Counter

import torch

from ..model.loader import LoadedModel
from .fast_path import FastGenTower, FastPathOptions, fuses_mlp_activation, fuses_residual_add, rounds_qk_norm
from .state import Branch, GenLayout, GenTower, RunState, TowerGroup
from .transformer import KVCache, gen_forward


def tower_stage(state: RunState) -> None:
    """Reads `model`, `cache`, `branches`, `options`, `layout`; writes `tower` and the trace's tower kind and
    passes. Building the fast tower is where the model's runtime gains its fused projections, FP8 weights and
    kernel dispatcher on a first request (`engine.model.runtime.ModelRuntime`)."""
    state.tower = make_gen_tower(state.model, state.cache, state.branches, state.options, state.layout)
    state.trace.tower = state.tower.kind
    state.trace.passes = list(state.tower.passes)


def make_gen_tower(model: LoadedModel, cache: KVCache, branches: list[Branch], options: FastPathOptions | None = None,
                   layout: GenLayout | None = None) -> GenTower:
    """The exact eager tower, the fast path where it applies (CUDA, unless switched off), or the GPU group's.
    `options`: the request's fast-path switches (from the model's configuration when not given);
    `layout`: the request's gen layout, whose frame count decides where the fast path rounds once
    (`fast_path.rounds_qk_norm`, `fast_path.fuses_mlp_activation`, `fast_path.fuses_residual_add`; without it,
    diffusers' roundings)."""
    options = options if options is not None else FastPathOptions.for_model(model)
    frames = layout.vision_shape[0] if layout is not None else None
    rounding = dict(round_qk_norm=rounds_qk_norm(options, frames),
                    fuse_mlp_activation=fuses_mlp_activation(options, frames),
                    fuse_residual_add=fuses_residual_add(options, frames))
    if model.parallel is not None:
        group: TowerGroup = model.parallel
        return group.gen_tower(model, cache, options, **rounding)
    if options.enabled:
        return FastGenTower(model, cache, branches, options, **rounding)
    return EagerGenTower(model, cache, branches)


class EagerGenTower:
    """The gen tower one branch at a time, op for op as diffusers runs it (the exact path)."""

    kind = "eager"
    passes: tuple[str, ...] = ()

    def __init__(self, model: LoadedModel, cache: KVCache, branches: list[Branch]):
        self.transformer, self.cache, self.branches = model.transformer, cache, branches
        self.ops: Counter = Counter()  # no optional ops: the exact path has none

    def __call__(self, tokens: torch.Tensor, count: int) -> list[torch.Tensor]:
        return [gen_forward(self.transformer, self.cache, b.index, b.rotary, tokens) for b in self.branches[:count]]
