"""`generate`: one request from validated parameters to saved files, as named stages.

    validate -> media (conditioning latents) -> prompt -> noise -> prefill -> denoise -> decode -> save

Each stage is a function over plain data. The numerics follow diffusers' Cosmos3OmniPipeline
(0.42.1) step for step, with four deliberate differences, each tested both ways:
- the text tower runs once per request and branch (`engine.pipeline.transformer.prefill`), not every step;
- JSON captions get metadata injected instead of sentence templates (`engine.pipeline.prompts`);
- an optional guidance interval runs CFG only for timesteps inside it (T2I default [400, 1000]);
- an action request without `fps` takes its domain's typical rate (`engine.model.action`), not 24.
Plain T2V also skips the reference's VAE encode of an all-zero video, which only served for a shape,
and I2V / V2V encode only the frames that condition (the Wan VAE is causal in time, so those latent
frames are the same).
"""
from __future__ import annotations

import copy
import math
import secrets
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
import torch.nn.functional as F
from diffusers.pipelines.cosmos.pipeline_cosmos3_omni import (
    _preprocess_conditioning_image,
    get_3d_mrope_ids_text_tokens,
    get_3d_mrope_ids_vae_tokens,
)
from diffusers.utils.torch_utils import randn_tensor
from diffusers.video_processor import VideoProcessor

from ..model.action import ACTION_DOMAINS, RESOLUTION_TIERS
from ..model.loader import LoadedModel
from ..serving.events import JobCancelled, Progress, SafetyRefusal
from . import outputs as output_files
from . import whole_step
from .decode import decode_uint8
from .fast_path import FastGenTower, FastPathOptions, vae_channels_last
from .fp8 import BF16_LABEL, FP8_LABEL
from .media import load_image, load_video
from ..parallel.group import GroupGenTower, group_prefill
from .preview import Previewer, previewer
from .prompts import build_prompt_texts, tokenize
from .request import Request, validate_request
from .transformer import GenRotary, KVCache, allocate_cache, gen_forward, prefill

VAE_SPATIAL = 16
VAE_TEMPORAL = 4


@dataclass
class GenerationResult:
    frames: np.ndarray  # [T, H, W, 3]: float32 in [0, 1] (exact path) or uint8 (fast path, engine.pipeline.decode)
    actions: np.ndarray | None
    audio: np.ndarray | None  # [channels, samples]
    audio_sample_rate: int | None
    seed: int
    prompt_text: str
    negative_prompt_text: str
    params: dict
    timings: dict
    outputs: dict[str, Path] = field(default_factory=dict)
    output_dir: Path | None = None
    request_id: str | None = None
    precision: str = BF16_LABEL  # or engine.pipeline.fp8.FP8_LABEL: shown wherever the result is

    def summary(self) -> dict:
        """JSON-ready description (the `/generate` result and the sidecar's core)."""
        return {
            "request_id": self.request_id,
            "seed": self.seed,
            "prompt_text": self.prompt_text,
            "negative_prompt_text": self.negative_prompt_text,
            "params": _public_params(self.params),
            "timings": self.timings,
            "precision": self.precision,
            "files": {k: Path(v).name for k, v in self.outputs.items()},
            "frames": list(self.frames.shape),
            "actions": self.actions.tolist() if self.actions is not None else None,
        }


def _public_params(params: dict) -> dict:
    out = dict(params)
    for key in ("image", "video"):
        if out.get(key) is not None and not isinstance(out[key], (str, Path)):
            out[key] = f"<{type(out[key]).__name__}>"
        elif out.get(key) is not None:
            out[key] = Path(out[key]).name
    return out


# ----------------------------------------------------------------------------------------------
# Stage data
# ----------------------------------------------------------------------------------------------


@dataclass
class Conditioning:
    """Clean latents for the conditioned frames, and what is fixed by them."""

    vision_shape: tuple[int, ...]  # [1, 48, T, h, w]
    clean: torch.Tensor | None  # [1, 48, T_c, h, w] clean latents of the first T_c latent frames
    condition_frames: list[int]
    width: int
    height: int
    action_latents: torch.Tensor | None = None  # forward dynamics: padded [chunk, width]
    action_condition_frames: list[int] = field(default_factory=list)
    raw_action_dim: int | None = None
    domain_id: int | None = None


@dataclass
class Latents:
    vision: torch.Tensor  # float32 [1, 48, T, h, w]
    vision_mask: torch.Tensor  # [T, 1, 1], 1 on conditioned frames
    sound: torch.Tensor | None = None  # [sound_dim, T_s]
    sound_mask: torch.Tensor | None = None
    action: torch.Tensor | None = None  # [chunk, action_dim]
    action_mask: torch.Tensor | None = None


@dataclass
class GenLayout:
    """Where each modality sits in the gen part of one branch's sequence (gen-local indexes)."""

    vision_shape: tuple[int, int, int]  # patch grid (T, h/2, w/2)
    num_vision: int
    noisy_frames: torch.Tensor
    vision_noisy_local: torch.Tensor
    sound_len: int = 0
    action_len: int = 0
    action_noisy: torch.Tensor | None = None

    @property
    def gen_len(self) -> int:
        return self.num_vision + self.sound_len + self.action_len


@dataclass
class Branch:
    """One CFG branch: its text, its positions, and (after prefill) its gen rotary tables."""

    index: int  # row block in the KV cache: 0 = cond, 1 = uncond
    token_ids: list[int]
    position_ids: torch.Tensor
    rotary: GenRotary | None = None


# ----------------------------------------------------------------------------------------------
# Stages
# ----------------------------------------------------------------------------------------------


def make_gen_tower(model: LoadedModel, cache: KVCache, branches: list[Branch]):
    """The exact eager tower, or the fast path where it applies (CUDA, unless switched off)."""
    if model.parallel is not None:
        return GroupGenTower(model, cache)
    options = FastPathOptions.for_model(model)
    if options.enabled:
        return FastGenTower(model, cache, branches, options)
    return EagerGenTower(model, cache, branches)


def resolve_seed(seed: int) -> int:
    return secrets.randbelow(2**31) if seed == -1 else int(seed)


def _encode(model: LoadedModel, pixels: torch.Tensor) -> torch.Tensor:
    """[1, 3, T, H, W] in [-1, 1] -> normalized latents, as diffusers' `_encode_video` does."""
    vae = model.vae
    raw = vae.encode(pixels.to(vae.dtype)).latent_dist.mode()
    mean = torch.tensor(vae.config.latents_mean, dtype=vae.dtype, device=raw.device).view(1, -1, 1, 1, 1)
    inv_std = (1.0 / torch.tensor(vae.config.latents_std, dtype=vae.dtype)).to(raw.device).view(1, -1, 1, 1, 1)
    return ((raw - mean) * inv_std).float()


def _latent_frames(num_frames: int) -> int:
    return (num_frames - 1) // VAE_TEMPORAL + 1


def _action_canvas(frames: list, tier: int, num_frames: int, device) -> tuple[torch.Tensor, int, int, int, int]:
    """Conditioning clip on the tier's canvas: downscale (never up), pad right/bottom, repeat the last frame."""
    processor = VideoProcessor(vae_scale_factor=VAE_SPATIAL, resample="bilinear")
    pixels = processor.preprocess_video(frames).to(device=device, dtype=torch.float32)
    source_h, source_w = pixels.shape[-2:]
    target_h, target_w = VideoProcessor.classify_height_width_bin(
        source_h, source_w, ratios={str(k): v for k, v in RESOLUTION_TIERS[tier].items()}
    )
    if pixels.shape[2] < num_frames:
        pad = pixels[:, :, -1:].expand(-1, -1, num_frames - pixels.shape[2], -1, -1)
        pixels = torch.cat([pixels, pad], dim=2)
    else:
        pixels = pixels[:, :, :num_frames]
    channels = pixels.shape[1]
    scale = min(target_w / source_w, target_h / source_h, 1.0)
    content_h, content_w = max(1, int(scale * source_h + 0.5)), max(1, int(scale * source_w + 0.5))
    flat = pixels.permute(0, 2, 1, 3, 4).reshape(-1, channels, source_h, source_w)
    if (content_h, content_w) != (source_h, source_w):
        flat = F.interpolate(flat, size=(content_h, content_w), mode="bicubic", align_corners=False, antialias=True)
    pad_right, pad_bottom = target_w - content_w, target_h - content_h
    if pad_right or pad_bottom:
        mode = "replicate" if pad_right >= content_w or pad_bottom >= content_h else "reflect"
        flat = F.pad(flat, (0, pad_right, 0, pad_bottom), mode=mode)
    pixels = flat.reshape(1, num_frames, channels, target_h, target_w).permute(0, 2, 1, 3, 4)
    return pixels, target_h, target_w, content_h, content_w


def conditioning_stage(model: LoadedModel, request: dict) -> Conditioning:
    """Encode the conditioning media; decide the canvas and which latent frames are fixed."""
    device = model.device
    mode, frames = request["mode"], request["num_frames"]
    width, height = request["width"], request["height"]
    if mode == "action":
        return _action_conditioning(model, request)
    latent_t = _latent_frames(frames)
    shape = (1, model.vae.config.z_dim, latent_t, height // VAE_SPATIAL, width // VAE_SPATIAL)
    if mode == "i2v":
        image = _preprocess_conditioning_image(load_image(request["image"]), height=height, width=width)
        # Latent frame 0 of the causal VAE depends on pixel frame 0 alone: encode just that frame.
        clean = _encode(model, image.to(device=device, dtype=torch.float32).unsqueeze(2))
        return Conditioning(shape, clean, [0], width, height)
    if mode == "v2v":
        condition_frames = [0, 1]
        keep = max(condition_frames) * VAE_TEMPORAL + 1
        processor = VideoProcessor(vae_scale_factor=VAE_SPATIAL, resample="bilinear")
        clip = processor.preprocess_video(load_video(request["video"], max_frames=keep), height=height, width=width)
        clip = clip[:, :, :keep].to(device=device, dtype=torch.float32)
        if clip.shape[2] < keep:
            clip = torch.cat([clip, clip[:, :, -1:].expand(-1, -1, keep - clip.shape[2], -1, -1)], dim=2)
        return Conditioning(shape, _encode(model, clip), condition_frames, width, height)
    return Conditioning(shape, None, [], width, height)


def _action_conditioning(model: LoadedModel, request: dict) -> Conditioning:
    action = request["action"]
    kind, chunk = action["kind"], action["chunk_size"]
    domain = ACTION_DOMAINS[action["domain"]]
    num_frames = chunk + 1
    frames = [load_image(request["image"])] if request["image"] is not None else load_video(request["video"], num_frames)
    pixels, target_h, target_w, content_h, content_w = _action_canvas(frames, action["resolution_tier"], num_frames, model.device)
    latent_t = _latent_frames(num_frames)
    if kind == "inverse_dynamics":
        condition_frames = list(range(latent_t))
        clean = _encode(model, pixels)
    else:
        condition_frames = [0]
        clean = _encode(model, pixels[:, :, :1])
    content_lh, content_lw = max(content_h // VAE_SPATIAL, 1), max(content_w // VAE_SPATIAL, 1)
    clean = clean[:, :, :, :content_lh, :content_lw].contiguous()
    shape = (1, model.vae.config.z_dim, latent_t, content_lh, content_lw)
    action_width = model.transformer.config.action_dim
    action_latents, action_condition_frames = None, []
    if kind == "forward_dynamics":
        rows = torch.tensor(action["actions"], dtype=torch.float32, device=model.device)
        if rows.shape[0] < chunk:
            rows = torch.cat([rows, rows[-1:].expand(chunk - rows.shape[0], -1)], dim=0)
        rows = rows[:chunk]
        action_latents = F.pad(rows, (0, action_width - rows.shape[1]))
        action_condition_frames = list(range(chunk))
    conditioning = Conditioning(shape, clean, condition_frames, target_w, target_h)
    conditioning.action_latents = action_latents
    conditioning.action_condition_frames = action_condition_frames
    conditioning.raw_action_dim = domain.raw_dim
    conditioning.domain_id = domain.domain_id
    return conditioning


def noise_stage(model: LoadedModel, request: dict, cond: Conditioning, generator: torch.Generator) -> Latents:
    """Initial latents, drawn in the reference's order: vision, then sound, then action."""
    device = model.device
    noise = randn_tensor(cond.vision_shape, generator=generator, device=device, dtype=torch.float32)
    mask = torch.zeros((cond.vision_shape[2], 1, 1), device=device, dtype=torch.float32)
    for frame in cond.condition_frames:
        mask[frame] = 1.0
    vision = noise
    if cond.clean is not None:
        clean = torch.zeros(cond.vision_shape, device=device, dtype=torch.float32)
        clean[:, :, : cond.clean.shape[2]] = cond.clean
        vision = mask * clean + (1.0 - mask) * noise
    latents = Latents(vision=vision, vision_mask=mask)
    if request["sound"]:
        config = model.transformer.config
        samples = int(request["num_frames"] / request["fps"] * model.sound_tokenizer.config.sampling_rate)
        hop = model.sound_tokenizer._hop_size
        sound_len = (samples + hop - 1) // hop
        latents.sound = randn_tensor((config.sound_dim, sound_len), generator=generator, device=device, dtype=torch.float32)
        latents.sound_mask = torch.zeros((sound_len, 1), device=device, dtype=torch.float32)
    if request["mode"] == "action":
        chunk = request["action"]["chunk_size"]
        width = model.transformer.config.action_dim
        clean_actions = cond.action_latents if cond.action_latents is not None else torch.zeros(chunk, width, device=device)
        action_mask = torch.zeros((chunk, 1), device=device, dtype=torch.float32)
        for frame in cond.action_condition_frames:
            action_mask[frame] = 1.0
        action_noise = randn_tensor((chunk, width), generator=generator, device=device, dtype=torch.float32)
        actions = action_mask * clean_actions + (1.0 - action_mask) * action_noise
        actions[:, cond.raw_action_dim:] = 0
        latents.action, latents.action_mask = actions, action_mask
    return latents


def safety_check_prompt(model: LoadedModel, prompt: str) -> None:
    """With a guardrail loaded, refuse an unsafe prompt before any GPU work."""
    if model.safety_checker is not None and not model.safety_checker.check_text_safety(prompt):
        raise SafetyRefusal("The safety checker refused this prompt; nothing was generated.")


def safety_check_frames(model: LoadedModel, frames: np.ndarray) -> np.ndarray:
    """With a guardrail loaded, check the decoded frames; it may blur faces, or refuse the whole video."""
    if model.safety_checker is None:
        return frames
    is_uint8 = frames.dtype == np.uint8
    # The checker sees what diffusers hands it (`_apply_video_safety_check`, np output): truncation, not the
    # output stage's rounding, so a borderline frame is judged the same way here and there. The fast path's
    # frames are already uint8 (engine.pipeline.decode, rounded as written): those bytes are what it checks.
    pixels = frames if is_uint8 else (np.clip(frames, 0.0, 1.0) * 255).astype(np.uint8)
    checked = model.safety_checker.check_video_safety(pixels)
    if checked is None:
        raise SafetyRefusal("The safety checker refused the generated result; nothing was saved.")
    return np.asarray(checked).astype(np.uint8) if is_uint8 else np.asarray(checked).astype(np.float32) / 255.0


def _prompt_stage(model: LoadedModel, request: Request, cond: Conditioning) -> tuple[Any, list[int], list[int]]:
    texts = build_prompt_texts(model.info, request.replace(width=cond.width, height=cond.height))
    is_image = request["num_frames"] == 1
    cond_ids = tokenize(model.tokenizer, texts.prompt_text, is_image=is_image, use_system_prompt=texts.use_system_prompt)
    uncond_ids = tokenize(model.tokenizer, texts.negative_prompt_text, is_image=is_image,
                          use_system_prompt=texts.use_system_prompt)
    return texts, cond_ids, uncond_ids


def layout_stage(model: LoadedModel, latents: Latents, cond: Conditioning) -> GenLayout:
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
    )
    if latents.sound is not None:
        layout.sound_len = latents.sound.shape[1]
    if latents.action is not None:
        layout.action_len = latents.action.shape[0]
        fixed_actions = set(cond.action_condition_frames)
        layout.action_noisy = torch.tensor(
            [i for i in range(layout.action_len) if i not in fixed_actions], dtype=torch.long, device=device
        )
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


def prefill_stage(model: LoadedModel, branches: list[Branch], layout: GenLayout) -> KVCache:
    """The text tower once per branch, its K/V written into the packed cache (on a GPU group: each
    rank's head share of the branch it serves, `engine.parallel.group`)."""
    if model.parallel is not None:
        return group_prefill(model, branches, layout.gen_len)
    cache = allocate_cache(model.transformer, tuple(len(b.token_ids) for b in branches), layout.gen_len)
    for branch in branches:
        ids = torch.tensor(branch.token_ids, dtype=torch.long, device=model.device)
        branch.rotary = prefill(model.transformer, cache, branch.index, ids, branch.position_ids)
    return cache


class EagerGenTower:
    """The gen tower one branch at a time, op for op as diffusers runs it (the exact path)."""

    def __init__(self, model: LoadedModel, cache: KVCache, branches: list[Branch]):
        self.transformer, self.cache, self.branches = model.transformer, cache, branches

    def __call__(self, tokens: torch.Tensor, count: int) -> list[torch.Tensor]:
        return [gen_forward(self.transformer, self.cache, b.index, b.rotary, tokens) for b in self.branches[:count]]


def _time_embeds(transformer, timestep: float, count: int, dtype, once: bool = False) -> torch.Tensor:
    """The timestep embedding for `count` tokens that share one timestep.

    With `once`, one row is computed and broadcast. Why: the embedder runs in fp32 (diffusers keeps it
    there), and 1024 identical rows through its 4096x4096 layer cost more than a step's norms; the
    exact path keeps the reference's per-row computation so that it stays bit for bit.
    """
    rows = 1 if once else count
    steps = torch.full((rows,), timestep, device=transformer.device) * transformer.config.timestep_scale
    embedder_dtype = next(transformer.time_embedder.parameters()).dtype
    embeds = transformer.time_embedder(transformer.time_proj(steps).to(embedder_dtype)).to(dtype)
    return embeds.expand(count, -1) if once else embeds


def gen_tokens(model: LoadedModel, layout: GenLayout, latents: Latents, timestep: float, domain_id) -> torch.Tensor:
    """The gen part of the sequence for this step; the same for both CFG branches."""
    tr = model.transformer
    dtype = tr.dtype
    once = FastPathOptions.for_model(model).enabled
    vision, shapes = tr._patchify_and_pack_latents([latents.vision.to(dtype)])
    vision = tr.proj_in(vision)
    count = int(layout.vision_noisy_local.numel())
    vision = tr._apply_timestep_embeds_to_noisy_tokens(
        vision, _time_embeds(tr, timestep, count, dtype, once), [layout.noisy_frames], [layout.vision_shape])
    parts = [vision]
    if latents.sound is not None:
        sound = tr.audio_proj_in(latents.sound.to(dtype).T) + tr.audio_modality_embed
        noisy = torch.arange(layout.sound_len, device=sound.device)
        sound = tr._apply_timestep_embeds_to_noisy_tokens(
            sound, _time_embeds(tr, timestep, layout.sound_len, dtype, once), [noisy], [(layout.sound_len, 1, 1)])
        parts.append(sound)
    if latents.action is not None:
        ids = torch.full((layout.action_len,), domain_id, dtype=torch.long, device=latents.action.device)
        action = tr.action_proj_in(latents.action.to(dtype), ids) + tr.action_modality_embed
        if layout.action_noisy.numel() > 0:
            action = tr._apply_timestep_embeds_to_noisy_tokens(
                action, _time_embeds(tr, timestep, int(layout.action_noisy.numel()), dtype, once),
                [layout.action_noisy], [(layout.action_len, 1, 1)])
        parts.append(action)
    return torch.cat(parts, dim=0) if len(parts) > 1 else vision


@dataclass
class Velocity:
    vision: torch.Tensor
    sound: torch.Tensor | None = None
    action: torch.Tensor | None = None


def _masked(pred: torch.Tensor, noisy_mask: torch.Tensor) -> torch.Tensor:
    return pred * noisy_mask if noisy_mask.sum() > 0 else torch.zeros_like(pred)


def velocity(model: LoadedModel, layout: GenLayout, latents: Latents, out: torch.Tensor, domain_id,
             raw_action_dim) -> Velocity:
    """One branch's masked velocity (float32) from its gen-tower output `out` [gen_len, hidden]."""
    tr = model.transformer
    packed = tr.proj_out(out[layout.vision_noisy_local])
    vision = tr._unpatchify_and_unpack_latents(packed, [layout.vision_shape], [layout.noisy_frames],
                                               [tuple(latents.vision.shape[2:])])[0]
    velocity = Velocity(_masked(vision, (1.0 - latents.vision_mask).to(vision.dtype)).float())
    offset = layout.num_vision
    if latents.sound is not None:
        sound = tr.audio_proj_out(out[offset: offset + layout.sound_len]).T
        velocity.sound = _masked(sound, (1.0 - latents.sound_mask).T.to(sound.dtype)).float()
        offset += layout.sound_len
    if latents.action is not None:
        rows = offset + layout.action_noisy
        ids = torch.full((rows.numel(),), domain_id, dtype=torch.long, device=rows.device)
        action = torch.zeros((layout.action_len, tr.action_dim), device=out.device, dtype=out.dtype)
        if rows.numel():
            action[layout.action_noisy] = tr.action_proj_out(out[rows], ids)
        action = _masked(action, (1.0 - latents.action_mask).to(action.dtype))
        action[:, raw_action_dim:] = 0
        velocity.action = action.float()
    return velocity


def guided(cond: torch.Tensor | None, uncond: torch.Tensor | None, scale: float) -> torch.Tensor | None:
    if cond is None or uncond is None:
        return cond
    return uncond + scale * (cond - uncond)


def cfg_plan(timesteps: list[float], guidance: float, interval) -> list[bool]:
    """Per step: run the unconditional branch? Never at guidance 1.0 or outside the interval."""
    if guidance == 1.0:
        return [False] * len(timesteps)
    if interval is None:
        return [True] * len(timesteps)
    lo, hi = interval
    return [lo <= t <= hi for t in timesteps]


@dataclass
class Schedulers:
    vision: Any
    sound: Any = None
    action: Any = None
    distilled: bool = False


def scheduler_stage(model: LoadedModel, request: dict, latents: Latents) -> Schedulers:
    info = model.info
    device = model.device
    if info.is_distilled:
        scheduler = model.make_scheduler(shift=1.0, use_dynamic_shifting=False, stochastic_sampling=True)
        scheduler.set_timesteps(sigmas=list(info.distilled_sigmas), device=device)
        return Schedulers(scheduler, distilled=True)
    # The checkpoint's scheduler config is honoured as diffusers reads it (Karras sigmas included); only the
    # request's flow shift replaces its own.
    scheduler = model.make_scheduler(flow_shift=request["flow_shift"])
    if model.native_flow_schedule:
        sigmas = np.linspace(1.0 - 1.0 / scheduler.config.num_train_timesteps, 0.0, request["steps"] + 1)[:-1]
        scheduler.set_timesteps(request["steps"], device=device, sigmas=sigmas)
    else:
        scheduler.set_timesteps(request["steps"], device=device)
    return Schedulers(
        scheduler,
        sound=copy.deepcopy(scheduler) if latents.sound is not None else None,
        action=copy.deepcopy(scheduler) if latents.action is not None else None,
    )


def denoise_stage(model: LoadedModel, request: dict, latents: Latents, layout: GenLayout, tower,
                  schedulers: Schedulers, plan: list[bool], cond: Conditioning, generator: torch.Generator,
                  report: Callable[[int, int], None], cancel: threading.Event | None,
                  preview: Previewer | None = None) -> Latents:
    """The loop; `plan[i]` says whether step i runs the unconditional branch (see `cfg_plan`).
    With `preview`, a cheap image of the x0 estimate goes out at its planned steps (engine.pipeline.preview)."""
    whole = whole_step.prepare(model, request, latents, layout, tower, schedulers, cond, generator)
    if whole is not None:  # the fast path's step as one graph (engine.pipeline.whole_step)
        if preview is not None:
            report = _previewing(report, preview, whole)
        latents.vision = whole_step.denoise(whole, plan, report, cancel)
        return latents
    timesteps = schedulers.vision.timesteps
    values = timesteps.tolist()  # one host copy before the loop, none per step
    sigmas = schedulers.vision.sigmas.tolist() if preview is not None else None
    scale = request["guidance_scale"]
    has_noisy_action = latents.action_mask is not None and latents.action_mask.sum() < latents.action_mask.numel()
    for i, t in enumerate(timesteps):
        if cancel is not None and cancel.is_set():
            raise JobCancelled()
        tokens = gen_tokens(model, layout, latents, values[i], cond.domain_id)
        outs = tower(tokens, 2 if plan[i] else 1)
        cond_v = velocity(model, layout, latents, outs[0], cond.domain_id, cond.raw_action_dim)
        uncond_v = Velocity(None)
        if plan[i]:
            uncond_v = velocity(model, layout, latents, outs[1], cond.domain_id, cond.raw_action_dim)
        vision_v = guided(cond_v.vision, uncond_v.vision, scale)
        if preview is not None and preview.due(i + 1):
            preview.show(i + 1, latents.vision - sigmas[i] * vision_v)  # x0 = x_t - sigma * v
        if schedulers.distilled:
            stepped = schedulers.vision.step(vision_v.unsqueeze(0), t, latents.vision.float().unsqueeze(0),
                                             generator=generator, return_dict=False)[0].squeeze(0)
            if cond.condition_frames and cond.clean is not None:
                clean = torch.zeros_like(stepped)
                clean[:, :, : cond.clean.shape[2]] = cond.clean
                stepped = latents.vision_mask * clean + (1.0 - latents.vision_mask) * stepped
            latents.vision = stepped
        else:
            latents.vision = schedulers.vision.step(vision_v.unsqueeze(0), t, latents.vision.unsqueeze(0),
                                                    return_dict=False)[0].squeeze(0)
        if schedulers.sound is not None:
            sound_v = guided(cond_v.sound, uncond_v.sound, scale)
            latents.sound = schedulers.sound.step(sound_v.unsqueeze(0), t, latents.sound.unsqueeze(0),
                                                  return_dict=False)[0].squeeze(0)
        if schedulers.action is not None and has_noisy_action:
            action_v = guided(cond_v.action, uncond_v.action, scale)
            latents.action = schedulers.action.step(action_v.unsqueeze(0), t, latents.action.unsqueeze(0),
                                                    return_dict=False)[0].squeeze(0)
            latents.action[:, cond.raw_action_dim:] = 0
        report(i + 1, len(timesteps))
    return latents


def _previewing(report: Callable[[int, int], None], preview: Previewer, whole) -> Callable[[int, int], None]:
    """The whole-step loop's progress callback, sending previews too: UniPC keeps the last x0 in its
    history; the distilled sampler keeps none, so its preview shows the current sample."""
    def report_and_preview(step: int, total: int) -> None:
        report(step, total)
        if preview.due(step):
            held = whole.sampler.m_prev
            preview.show(step, held if held is not None else whole.sample)
    return report_and_preview


def decode_stage(model: LoadedModel, latents: Latents) -> tuple[np.ndarray, np.ndarray | None]:
    if model.parallel is not None and not model.parallel.is_leader:
        return np.zeros((0, 0, 0, 3), dtype=np.float32), None  # a GPU group decodes on rank 0
    vae = model.vae
    mean = torch.tensor(vae.config.latents_mean, dtype=vae.dtype, device=latents.vision.device).view(1, -1, 1, 1, 1)
    inv_std = (1.0 / torch.tensor(vae.config.latents_std, dtype=vae.dtype)).to(latents.vision.device).view(1, -1, 1, 1, 1)
    z = latents.vision.to(vae.dtype) / inv_std + mean
    if vae_channels_last(model):
        z = z.contiguous(memory_format=torch.channels_last_3d)
    options = FastPathOptions.for_model(model)
    if options.enabled and options.uint8_frames:  # GPU postprocess, uint8 to the host (engine.pipeline.decode)
        frames = decode_uint8(vae, z)
    else:
        decoded = vae.decode(z).sample.float()
        processor = VideoProcessor(vae_scale_factor=VAE_SPATIAL, resample="bilinear")
        frames = processor.postprocess_video(decoded, output_type="np")[0].astype(np.float32)
    audio = None
    if latents.sound is not None:
        decoder_dtype = next(model.sound_tokenizer.parameters()).dtype
        audio = model.sound_tokenizer.decode(latents.sound.unsqueeze(0).to(decoder_dtype)).squeeze(0).float().cpu().numpy()
    return frames, audio


# ----------------------------------------------------------------------------------------------
# The request, end to end
# ----------------------------------------------------------------------------------------------


class _Clock:
    def __init__(self, on_progress):
        self.start = time.perf_counter()
        self.timings: dict[str, float] = {}
        self._mark = self.start
        self._on_progress = on_progress

    def lap(self, stage: str) -> None:
        now = time.perf_counter()
        self.timings[stage] = round(now - self._mark, 4)
        self._mark = now

    def report(self, stage: str, step: int, total: int) -> None:
        if self._on_progress is None:
            return
        elapsed = time.perf_counter() - self.start
        stage_elapsed = time.perf_counter() - self._mark
        eta = stage_elapsed / step * (total - step) if step else None
        self._on_progress(Progress(stage=stage, step=step, total=total, elapsed_s=elapsed, eta_s=eta))


@torch.no_grad()
def generate(model: LoadedModel, request: Request | dict, on_progress: Callable[[Progress], None] | None = None,
             cancel: threading.Event | None = None, outputs_root: str | Path | None = None,
             model_name: str | None = None, previews: bool = False) -> GenerationResult:
    """Run one request. Saves files under `outputs_root` when given; a cancelled job writes nothing.
    With `previews`, `on_progress` also gets `Preview` events while denoising.

    `request` is a `Request` from `validate_request` (the queue's, run as it is). A plain dict, for
    scripts, is validated here, exactly once; nothing below validates or parses it again.
    `model` may also be a GPU group (`engine.parallel.runtime.GroupModel`), which runs it on its ranks."""
    if getattr(model, "is_group", False):
        return model.generate(request, on_progress=on_progress, cancel=cancel, outputs_root=outputs_root,
                              model_name=model_name)
    if not isinstance(request, Request):
        request = validate_request(model.info, request.get("mode", "t2i"), request)
    safety_check_prompt(model, request["prompt"])
    seed = resolve_seed(request["seed"])
    generator = torch.Generator(device="cpu").manual_seed(seed)
    clock = _Clock(on_progress)

    cond = conditioning_stage(model, request)
    clock.lap("conditioning")
    texts, cond_ids, uncond_ids = _prompt_stage(model, request, cond)
    clock.lap("prompt")
    latents = noise_stage(model, request, cond, generator)
    layout = layout_stage(model, latents, cond)
    schedulers = scheduler_stage(model, request, latents)
    plan = cfg_plan(schedulers.vision.timesteps.tolist(), request["guidance_scale"], request["guidance_interval"])
    branches = [Branch(0, cond_ids, positions(model, layout, len(cond_ids), request["fps"]))]
    if any(plan):
        branches.append(Branch(1, uncond_ids, positions(model, layout, len(uncond_ids), request["fps"])))
    cache = prefill_stage(model, branches, layout)
    tower = make_gen_tower(model, cache, branches)
    clock.lap("prefill")
    latents = denoise_stage(model, request, latents, layout, tower, schedulers, plan, cond, generator,
                            lambda step, total: clock.report("denoise", step, total), cancel,
                            previewer(model, len(plan), on_progress, previews))
    clock.lap("denoise")
    if cancel is not None and cancel.is_set():
        raise JobCancelled()
    frames, audio = decode_stage(model, latents)
    frames = safety_check_frames(model, frames)
    actions = None
    if request["mode"] == "action" and request["action"]["kind"] in ("policy", "inverse_dynamics"):
        actions = latents.action[:, : cond.raw_action_dim].float().cpu().numpy()
    clock.lap("decode")

    final = dict(request, width=cond.width, height=cond.height, seed=seed)
    result = GenerationResult(
        frames=frames, actions=actions, audio=audio,
        audio_sample_rate=model.sound_tokenizer.config.sampling_rate if audio is not None else None,
        seed=seed, prompt_text=texts.prompt_text, negative_prompt_text=texts.negative_prompt_text,
        params=final, timings=clock.timings, precision=FP8_LABEL if getattr(tower, "fp8", None) is not None else BF16_LABEL,
    )
    if outputs_root is not None:
        if cancel is not None and cancel.is_set():
            raise JobCancelled()
        result.request_id = output_files.new_request_id()
        # Actions go in their own file; the sidecar lists it.
        sidecar = {k: v for k, v in result.summary().items() if k not in ("actions", "files")}
        # The registered name, never the source: a sidecar carries no server path (issue 19).
        sidecar["model"] = {"name": model_name or model.root.name, **model.info.summary()}
        sidecar["created"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        result.outputs = output_files.save_result(
            Path(outputs_root), result.request_id, frames=frames, fps=request["fps"], actions=actions, audio=audio,
            sample_rate=result.audio_sample_rate, sidecar=sidecar)
        result.output_dir = Path(outputs_root) / result.request_id
        clock.lap("save")
        result.timings = clock.timings
    result.timings["total"] = round(time.perf_counter() - clock.start, 4)
    return result
