"""The schedule stage (schedulers and the CFG plan) and the denoise stage (the loop).

Per step: the gen tokens (the same for both branches), the gen tower for the branches the plan runs,
each branch's velocity, the guidance combine, the schedulers' steps, progress. Where the fast path's
whole step applies (engine.pipeline.whole_step) the same step runs from static buffers as one graph.
Nothing in the loop reads a tensor back to the host: which rows are noisy was decided at layout, the
timesteps are copied to the host once before the loop.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

from ..model.loader import LoadedModel
from ..events import JobCancelled
from . import pacing, whole_step
from .preview import Previewer
from .state import GenLayout, Latents, RunState, Schedulers
from .transformer import time_embeds


def cfg_plan(timesteps: list[float], guidance: float, interval) -> list[bool]:
    """Per step: run the unconditional branch? Never at guidance 1.0 or outside the interval."""
    if guidance == 1.0:
        return [False] * len(timesteps)
    if interval is None:
        return [True] * len(timesteps)
    lo, hi = interval
    return [lo <= t <= hi for t in timesteps]


def schedule_stage(state: RunState) -> None:
    """The schedulers (the checkpoint's, with the request's flow shift) and the CFG plan. Reads `model`,
    `request`, `latents`; writes `schedulers` and `plan`."""
    model, request, latents = state.model, state.request, state.latents
    info, device = model.info, model.device
    if info.is_distilled:
        scheduler = model.make_scheduler(shift=1.0, use_dynamic_shifting=False, stochastic_sampling=True)
        scheduler.set_timesteps(sigmas=list(info.distilled_sigmas), device=device)
        state.schedulers = Schedulers(scheduler, distilled=True)
    else:
        # The checkpoint's scheduler config is honoured as diffusers reads it (Karras sigmas included); only
        # the request's flow shift replaces its own.
        scheduler = model.make_scheduler(flow_shift=request["flow_shift"])
        if model.native_flow_schedule:
            sigmas = np.linspace(1.0 - 1.0 / scheduler.config.num_train_timesteps, 0.0, request["steps"] + 1)[:-1]
            scheduler.set_timesteps(request["steps"], device=device, sigmas=sigmas)
        else:
            scheduler.set_timesteps(request["steps"], device=device)
        state.schedulers = Schedulers(
            scheduler,
            sound=copy.deepcopy(scheduler) if latents.sound is not None else None,
            action=copy.deepcopy(scheduler) if latents.action is not None else None,
        )
    state.plan = cfg_plan(state.schedulers.vision.timesteps.tolist(), request["guidance_scale"],
                          request["guidance_interval"])


def _time_embeds(transformer, timestep: float, count: int, dtype, device, once: bool = False) -> torch.Tensor:
    """The timestep embedding for `count` tokens that share one timestep.

    With `once`, one row is computed and broadcast. Why: the embedder runs in fp32 (diffusers keeps it
    there), and 1024 identical rows through its 4096x4096 layer cost more than a step's norms; the
    exact path keeps the reference's per-row computation so that it stays bit for bit.
    """
    rows = 1 if once else count
    embeds = time_embeds(transformer, torch.full((rows,), timestep, device=device), dtype)
    return embeds.expand(count, -1) if once else embeds


def gen_tokens(model: LoadedModel, layout: GenLayout, latents: Latents, timestep: float, once: bool) -> torch.Tensor:
    """The gen part of the sequence for this step; the same for both CFG branches. `once`: embed the
    timestep once and broadcast it (the fast path; see `_time_embeds`)."""
    tr = model.transformer
    # The latents live on the tower's device; diffusers' `tr.device` (like `tr.dtype`) walks every submodule.
    dtype, device = tr.dtype, latents.vision.device
    vision, _ = tr._patchify_and_pack_latents([latents.vision.to(dtype)])
    vision = tr.proj_in(vision)
    count = int(layout.vision_noisy_local.numel())
    vision = tr._apply_timestep_embeds_to_noisy_tokens(
        vision, _time_embeds(tr, timestep, count, dtype, device, once), [layout.noisy_frames], [layout.vision_shape])
    parts = [vision]
    if latents.sound is not None:
        sound = tr.audio_proj_in(latents.sound.to(dtype).T) + tr.audio_modality_embed
        sound = tr._apply_timestep_embeds_to_noisy_tokens(
            sound, _time_embeds(tr, timestep, layout.sound_len, dtype, device, once), [layout.sound_noisy],
            [(layout.sound_len, 1, 1)])
        parts.append(sound)
    if latents.action is not None:
        ids = torch.full((layout.action_len,), layout.action_domain, dtype=torch.long, device=latents.action.device)
        action = tr.action_proj_in(latents.action.to(dtype), ids) + tr.action_modality_embed
        if layout.any_noisy_action:
            action = tr._apply_timestep_embeds_to_noisy_tokens(
                action, _time_embeds(tr, timestep, int(layout.action_noisy.numel()), dtype, device, once),
                [layout.action_noisy], [(layout.action_len, 1, 1)])
        parts.append(action)
    return torch.cat(parts, dim=0) if len(parts) > 1 else vision


@dataclass
class Velocity:
    vision: torch.Tensor
    sound: torch.Tensor | None = None
    action: torch.Tensor | None = None


def _keep_noisy(pred: torch.Tensor, keep: torch.Tensor, any_noisy: bool) -> torch.Tensor:
    """The prediction on noisy rows, zero on conditioned ones (`any_noisy` decided at layout)."""
    return pred * keep.to(pred.dtype) if any_noisy else torch.zeros_like(pred)


def velocity(model: LoadedModel, layout: GenLayout, latents: Latents, out: torch.Tensor) -> Velocity:
    """One branch's masked velocity (float32) from its gen-tower output `out` [gen_len, hidden]."""
    tr = model.transformer
    packed = tr.proj_out(out[layout.vision_noisy_local])
    vision = tr._unpatchify_and_unpack_latents(packed, [layout.vision_shape], [layout.noisy_frames],
                                               [tuple(latents.vision.shape[2:])])[0]
    result = Velocity(_keep_noisy(vision, layout.vision_keep, layout.any_noisy_vision).float())
    offset = layout.num_vision
    if latents.sound is not None:
        sound = tr.audio_proj_out(out[offset: offset + layout.sound_len]).T
        result.sound = _keep_noisy(sound, layout.sound_keep, layout.sound_len > 0).float()
        offset += layout.sound_len
    if latents.action is not None:
        rows = offset + layout.action_noisy
        ids = torch.full((rows.numel(),), layout.action_domain, dtype=torch.long, device=rows.device)
        action = torch.zeros((layout.action_len, tr.action_dim), device=out.device, dtype=out.dtype)
        if layout.any_noisy_action:
            action[layout.action_noisy] = tr.action_proj_out(out[rows], ids)
        action = _keep_noisy(action, layout.action_keep, layout.any_noisy_action)
        action[:, layout.raw_action_dim:] = 0
        result.action = action.float()
    return result


def guided(cond: torch.Tensor | None, uncond: torch.Tensor | None, scale: float) -> torch.Tensor | None:
    if cond is None or uncond is None:
        return cond
    return uncond + scale * (cond - uncond)


def denoise_stage(state: RunState) -> None:
    """The loop; `state.plan[i]` says whether step i runs the unconditional branch (see `cfg_plan`).
    With `state.preview`, a cheap image of the x0 estimate goes out at its planned steps. Reads `model`,
    `request`, `layout`, `cond`, `schedulers`, `plan`, `tower`, `options`, `generator`, `cancel`, `report`,
    `preview`; writes `latents` (stepped in place) and the loop's part of `trace`."""
    whole = whole_step.prepare(state)
    if whole is not None:  # the fast path's step as one graph (engine.pipeline.whole_step)
        report = state.report if state.preview is None else _previewing(state.report, state.preview, whole)
        state.latents.vision = whole_step.denoise(whole, state.plan, report, state.cancel, state.trace)
        return
    timesteps = state.schedulers.vision.timesteps
    values = timesteps.tolist()  # one host copy before the loop, none per step
    sigmas = state.schedulers.vision.sigmas.tolist() if state.preview is not None else None
    # One step queued ahead of the GPU at most: a cancel stops the GPU's work too, and progress is honest.
    pacer = pacing.StepPacer.for_tensor(state.latents.vision, state.report, len(timesteps))
    for i, t in enumerate(timesteps):
        if state.cancelled:
            raise JobCancelled()
        cond_v, uncond_v = _branch_velocities(state, values[i], state.plan[i])
        vision_v = guided(cond_v.vision, uncond_v.vision, state.request["guidance_scale"])
        if state.preview is not None and state.preview.due(i + 1):
            pacer.settle()
            state.preview.show(i + 1, state.latents.vision - sigmas[i] * vision_v)  # x0 = x_t - sigma * v
        _scheduler_steps(state, t, vision_v, cond_v, uncond_v)
        pacer.launched(i)
    pacer.finish()
    state.trace.host_syncs += pacer.syncs


def _branch_velocities(state: RunState, timestep: float, with_uncond: bool) -> tuple[Velocity, Velocity]:
    """Each branch's velocity at this step (the unconditional one only where the plan runs it)."""
    model, layout, latents = state.model, state.layout, state.latents
    tokens = gen_tokens(model, layout, latents, timestep, state.options.enabled)
    count = 2 if with_uncond else 1
    outs = state.tower(tokens, count)
    cond_v = velocity(model, layout, latents, outs[0])
    uncond_v = velocity(model, layout, latents, outs[1]) if with_uncond else Velocity(None)
    state.trace.tower_steps.append(count)
    state.trace.velocities += count
    return cond_v, uncond_v


def _scheduler_steps(state: RunState, t: torch.Tensor, vision_v: torch.Tensor, cond_v: Velocity,
                     uncond_v: Velocity) -> None:
    """Each modality's sampler step; the distilled sampler re-anchors the conditioned frames after it."""
    schedulers, latents, scale = state.schedulers, state.latents, state.request["guidance_scale"]
    if schedulers.distilled:
        stepped = schedulers.vision.step(vision_v.unsqueeze(0), t, latents.vision.float().unsqueeze(0),
                                         generator=state.generator, return_dict=False)[0].squeeze(0)
        if latents.clean is not None:
            stepped = latents.vision_mask * latents.clean + (1.0 - latents.vision_mask) * stepped
        latents.vision = stepped
    else:
        latents.vision = schedulers.vision.step(vision_v.unsqueeze(0), t, latents.vision.unsqueeze(0),
                                                return_dict=False)[0].squeeze(0)
    if schedulers.sound is not None:
        sound_v = guided(cond_v.sound, uncond_v.sound, scale)
        latents.sound = schedulers.sound.step(sound_v.unsqueeze(0), t, latents.sound.unsqueeze(0),
                                              return_dict=False)[0].squeeze(0)
    if schedulers.action is not None and state.layout.any_noisy_action:
        action_v = guided(cond_v.action, uncond_v.action, scale)
        latents.action = schedulers.action.step(action_v.unsqueeze(0), t, latents.action.unsqueeze(0),
                                                return_dict=False)[0].squeeze(0)
        latents.action[:, state.layout.raw_action_dim:] = 0


def _previewing(report: Callable[[int, int], None], preview: Previewer, whole) -> Callable[[int, int], None]:
    """The whole-step loop's progress callback, sending previews too: UniPC keeps the last x0 in its
    history; the distilled sampler keeps none, so its preview shows the current sample."""
    def report_and_preview(step: int, total: int) -> None:
        report(step, total)
        if preview.due(step):
            held = whole.sampler.m_prev  # built on the sample unsqueezed: [1, 1, C, T, h, w], the same values
            preview.show(step, held.view(whole.sample.shape) if held is not None else whole.sample)
    return report_and_preview
