"""The layout stage: where each modality sits in the gen sequence, which rows are noisy, and each
branch's M-RoPE positions.

Which rows are noisy follows from the request (the conditioned frames), so it is decided here, once,
as index tensors, keep-masks and plain booleans: the loop multiplies by a mask and never asks the
device whether any row is noisy (a host sync on every velocity before).
"""
from __future__ import annotations

import math

import torch
from diffusers.pipelines.cosmos.pipeline_cosmos3_omni import get_3d_mrope_ids_text_tokens, get_3d_mrope_ids_vae_tokens

from ..model.defaults import VAE_TEMPORAL
from ..model.loader import LoadedModel
from .state import Conditioning, GenLayout, Latents, RunState


def layout_stage(state: RunState) -> None:
    """Reads `model`, `latents`, `cond`; writes `layout` (`gen_layout`)."""
    state.layout = gen_layout(state.model, state.latents, state.cond)


def gen_layout(model: LoadedModel, latents: Latents, cond: Conditioning) -> GenLayout:
    """The gen layout of `latents` under `cond` (also what bench/models.py builds a step from)."""
    p = model.transformer.config.latent_patch_size
    _, _, t, h, w = latents.vision.shape
    ph, pw = math.ceil(h / p), math.ceil(w / p)
    fixed = set(cond.condition_frames)
    noisy = [i for i in range(t) if i not in fixed]
    stride = ph * pw
    local = [f * stride + j for f in noisy for j in range(stride)]
    device = model.device
    layout = GenLayout(
        vision_shape=(t, ph, pw), num_vision=t * stride,
        noisy_frames=torch.tensor(noisy, dtype=torch.long, device=device),
        vision_noisy_local=torch.tensor(local, dtype=torch.long, device=device),
        vision_keep=1.0 - latents.vision_mask, any_noisy_vision=bool(noisy),
        action_domain=cond.domain_id, raw_action_dim=cond.raw_action_dim,
    )
    if latents.sound is not None:
        layout.sound_len = latents.sound.shape[1]
        layout.sound_noisy = torch.arange(layout.sound_len, device=device)
        layout.sound_keep = (1.0 - latents.sound_mask).T
    if latents.action is not None:
        layout.action_len = latents.action.shape[0]
        fixed_actions = set(cond.action_condition_frames)
        noisy_actions = [i for i in range(layout.action_len) if i not in fixed_actions]
        layout.action_noisy = torch.tensor(noisy_actions, dtype=torch.long, device=device)
        layout.action_keep = 1.0 - latents.action_mask
        layout.any_noisy_action = bool(noisy_actions)
    return layout


def positions(model: LoadedModel, layout: GenLayout, und_len: int, fps: float) -> torch.Tensor:
    """[3, und_len + gen_len] M-RoPE positions for one branch (the reference's builders)."""
    config = model.transformer.config
    text_ids, next_offset = get_3d_mrope_ids_text_tokens(und_len, 0, use_float_positions=config.enable_fps_modulation)
    start = next_offset + config.unified_3d_mrope_temporal_modality_margin
    effective_fps = fps if config.enable_fps_modulation else None
    t, ph, pw = layout.vision_shape
    segments = [text_ids, get_3d_mrope_ids_vae_tokens(
        t, ph, pw, start, reset_spatial_indices=config.unified_3d_mrope_reset_spatial_ids, fps=effective_fps,
        base_fps=float(config.base_fps), temporal_compression_factor=VAE_TEMPORAL)[0]]
    if layout.sound_len:
        sound_fps = float(config.sound_latent_fps) if config.enable_fps_modulation else None
        segments.append(get_3d_mrope_ids_vae_tokens(
            layout.sound_len, 1, 1, start, reset_spatial_indices=config.unified_3d_mrope_reset_spatial_ids,
            fps=sound_fps, base_fps=float(config.base_fps), temporal_compression_factor=1)[0])
    if layout.action_len:
        segments.append(get_3d_mrope_ids_vae_tokens(
            layout.action_len, 1, 1, start, reset_spatial_indices=config.unified_3d_mrope_reset_spatial_ids,
            fps=effective_fps, base_fps=float(config.base_fps), temporal_compression_factor=1,
            base_temporal_compression_factor=VAE_TEMPORAL, start_frame_offset=1)[0])
    return torch.cat(segments, dim=1).to(model.device)
