"""The conditioning stage (user media -> clean latents, canvas) and the noise stage (initial latents).

I2V encodes only pixel frame 0 and V2V only the frames that condition: the Wan VAE is causal in time,
so those latent frames are the same as encoding the whole clip. Plain T2V encodes nothing (the
reference's VAE encode of an all-zero video only served for a shape).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from diffusers.pipelines.cosmos.pipeline_cosmos3_omni import _preprocess_conditioning_image
from diffusers.utils.torch_utils import randn_tensor
from diffusers.video_processor import VideoProcessor

from ..model.action import ACTION_DOMAINS, RESOLUTION_TIERS
from ..model.defaults import VAE_SPATIAL, VAE_TEMPORAL
from ..model.loader import LoadedModel
from .media import fit_image, load_image, load_video
from .state import Conditioning, Latents, RunState


def conditioning_stage(state: RunState) -> None:
    """Encode the conditioning media; decide the canvas and which latent frames are fixed. Reads `model`,
    `request`; writes `cond`."""
    model, request = state.model, state.request
    device = model.device
    mode, frames = request["mode"], request["num_frames"]
    width, height = request["width"], request["height"]
    if mode == "action":
        state.cond = _action_conditioning(model, request)
        return
    shape = (1, model.vae.config.z_dim, latent_frames(frames), height // VAE_SPATIAL, width // VAE_SPATIAL)
    if mode == "i2v":
        image = _preprocess_conditioning_image(fitted_image(request), height=height, width=width)
        # Latent frame 0 of the causal VAE depends on pixel frame 0 alone: encode just that frame.
        clean = encode(model, image.to(device=device, dtype=torch.float32).unsqueeze(2))
        state.cond = Conditioning(shape, clean, [0], width, height)
    elif mode == "v2v":
        condition_frames = [0, 1]
        keep = max(condition_frames) * VAE_TEMPORAL + 1
        processor = VideoProcessor(vae_scale_factor=VAE_SPATIAL, resample="bilinear")
        frames = load_video(request["video"], max_frames=keep)
        if request.fit != "resize":  # the reference resizes; crop and letterbox fit each frame first
            frames = [fit_image(frame, width, height, request.fit) for frame in frames]
        clip = processor.preprocess_video(frames, height=height, width=width)
        clip = clip[:, :, :keep].to(device=device, dtype=torch.float32)
        if clip.shape[2] < keep:
            clip = torch.cat([clip, clip[:, :, -1:].expand(-1, -1, keep - clip.shape[2], -1, -1)], dim=2)
        state.cond = Conditioning(shape, encode(model, clip), condition_frames, width, height)
    else:
        state.cond = Conditioning(shape, None, [], width, height)


def fitted_image(request):
    """The I2V conditioning image as the request's `fit` says: "crop" is the reference's own cover and
    centre-crop (done by its preprocessing), letterbox and resize are fitted here first."""
    image = load_image(request["image"])
    if request.fit == "crop":
        return image
    return fit_image(image, request["width"], request["height"], request.fit)


def encode(model: LoadedModel, pixels: torch.Tensor) -> torch.Tensor:
    """[1, 3, T, H, W] in [-1, 1] -> normalized latents, as diffusers' `_encode_video` does."""
    vae = model.vae
    raw = vae.encode(pixels.to(vae.dtype)).latent_dist.mode()
    mean = torch.tensor(vae.config.latents_mean, dtype=vae.dtype, device=raw.device).view(1, -1, 1, 1, 1)
    inv_std = (1.0 / torch.tensor(vae.config.latents_std, dtype=vae.dtype)).to(raw.device).view(1, -1, 1, 1, 1)
    return ((raw - mean) * inv_std).float()


def latent_frames(num_frames: int) -> int:
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


def _action_conditioning(model: LoadedModel, request) -> Conditioning:
    action = request["action"]
    kind, chunk = action["kind"], action["chunk_size"]
    domain = ACTION_DOMAINS[action["domain"]]
    num_frames = chunk + 1
    frames = [load_image(request["image"])] if request["image"] is not None else load_video(request["video"], num_frames)
    pixels, target_h, target_w, content_h, content_w = _action_canvas(frames, action["resolution_tier"], num_frames, model.device)
    latent_t = latent_frames(num_frames)
    if kind == "inverse_dynamics":
        condition_frames = list(range(latent_t))
        clean = encode(model, pixels)
    else:
        condition_frames = [0]
        clean = encode(model, pixels[:, :, :1])
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
    return Conditioning(shape, clean, condition_frames, target_w, target_h, action_latents=action_latents,
                        action_condition_frames=action_condition_frames, raw_action_dim=domain.raw_dim,
                        domain_id=domain.domain_id)


def noise_stage(state: RunState) -> None:
    """Initial latents, drawn in the reference's order: vision, then sound, then action. Reads `model`,
    `request`, `cond`, `generator` (drawing from it); writes `latents`."""
    model, request, cond, generator = state.model, state.request, state.cond, state.generator
    device = model.device
    noise = randn_tensor(cond.vision_shape, generator=generator, device=device, dtype=torch.float32)
    mask = torch.zeros((cond.vision_shape[2], 1, 1), device=device, dtype=torch.float32)
    for frame in cond.condition_frames:
        mask[frame] = 1.0
    latents = Latents(vision=noise, vision_mask=mask)
    if cond.clean is not None:
        latents.clean = torch.zeros(cond.vision_shape, device=device, dtype=torch.float32)
        latents.clean[:, :, : cond.clean.shape[2]] = cond.clean
        latents.vision = mask * latents.clean + (1.0 - mask) * noise
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
    state.latents = latents
