"""The decode stage: latents to frames (and sound), the guardrail's look at them, the actions.

Why the fast path decodes to 8-bit frames on the GPU (`decode_uint8`): the exact path decodes with `vae.decode`, postprocesses with diffusers' `VideoProcessor` into float32
numpy on the host, and the output stage then turns that into uint8. At 1280x720x189 that float32
copy is 2.1 GB moved to the host and several host passes over it (2.8 s measured on the H200 box).
Here the Wan VAE's own causal loop runs latent frame by latent frame (the decoder's feature cache
carries the temporal context, exactly as `AutoencoderKLWan._decode` does), and each chunk is
unpatchified, clamped, denormalised and rounded to uint8 on the GPU as soon as it is decoded, into
one uint8 buffer copied to the host once (a quarter of the float32 bytes, no host arithmetic).

The uint8 frames are bit for bit what the exact path's float32 frames become in the output stage
(`engine.pipeline.outputs`): the same float32 operations in the same order (tests/unit/pipeline/test_decode.py).

A video goes further on the fast path (`FastPathOptions.vae_fast_decode`, `COSMOS3_VAE_FAST_DECODE=0` turns it
off): the engine walks the decoder itself (`engine.pipeline.causal_decode`) with the norm + SiLU before each
conv fused into one kernel, the convs' biases folded into the kernels around them, and each upsampler's
nearest 2x + 3x3 conv run as four 2x2 sub-pixel convs (`COSMOS3_VAE_SUBPIXEL=0` turns that off), the norm + SiLU
in fp32 with one rounding (`COSMOS3_VAE_NORM_FP32=0`), the plan a measured rule picks (`causal_decode.plan_for`):
1280x720x189 in 5.26 s instead of 9.5 s on the H200. So a video's bytes are close to the exact path's, not equal:
its [-1, 1] output is closer to an fp32 decode than diffusers' bf16 decode is, and its frames stay within 6 of 255
levels of the exact ones (docs/perf-log/2026-12-02.md, VAE decode; tests/gpu/test_gpu_causal_decode.py). Images, and the switch
off, keep the bit-for-bit promise above.
"""
from __future__ import annotations

import contextlib
from typing import Iterable, Iterator

import numpy as np
import torch
from diffusers.models.autoencoders.autoencoder_kl_wan import unpatchify
from diffusers.video_processor import VideoProcessor

from ..model.defaults import VAE_SPATIAL, VAE_TEMPORAL
from ..events import SafetyRefusal
from .causal_decode import DecodePlan, decoded_chunks, plan_for
from .fast_path import vae_channels_last
from .state import RunState


def decode_stage(state: RunState) -> None:
    """Frames and audio from the final latents (a GPU group decodes on rank 0 only), checked by the
    guardrail where one is loaded; an action run's predicted actions. Reads `model`, `latents`, `request`,
    `options`, `layout`; writes `frames`, `audio`, `actions` and the decode's passes to `trace.passes`."""
    model, latents, request = state.model, state.latents, state.request
    if model.parallel is not None and not model.parallel.is_leader:
        state.frames = np.zeros((0, 0, 0, 3), dtype=np.float32)
    else:
        state.frames = safety_check_frames(model, _decode_frames(state))
        if latents.sound is not None:
            decoder_dtype = next(model.sound_tokenizer.parameters()).dtype
            decoded = model.sound_tokenizer.decode(latents.sound.unsqueeze(0).to(decoder_dtype))
            state.audio = decoded.squeeze(0).float().cpu().numpy()
    if request["mode"] == "action" and request["action"]["kind"] in ("policy", "inverse_dynamics"):
        state.actions = latents.action[:, : state.layout.raw_action_dim].float().cpu().numpy()


def _decode_frames(state: RunState) -> np.ndarray:
    vae, options = state.model.vae, state.options
    vision = state.latents.vision
    mean = torch.tensor(vae.config.latents_mean, dtype=vae.dtype, device=vision.device).view(1, -1, 1, 1, 1)
    inv_std = (1.0 / torch.tensor(vae.config.latents_std, dtype=vae.dtype)).to(vision.device).view(1, -1, 1, 1, 1)
    z = vision.to(vae.dtype) / inv_std + mean
    if vae_channels_last(state.model, options):
        z = z.contiguous(memory_format=torch.channels_last_3d)
        state.trace.passes.append("vae_channels_last")
    if options.enabled and options.uint8_frames:  # GPU postprocess, uint8 to the host
        state.trace.passes.append("uint8_frames")
        return decode_uint8(vae, z, plan_for(vae, tuple(z.shape), z.device.type, options))
    decoded = vae.decode(z).sample.float()
    processor = VideoProcessor(vae_scale_factor=VAE_SPATIAL, resample="bilinear")
    return processor.postprocess_video(decoded, output_type="np")[0].astype(np.float32)


def safety_check_frames(model, frames: np.ndarray) -> np.ndarray:
    """With a guardrail loaded, check the decoded frames; it may blur faces, or refuse the whole video."""
    if model.safety_checker is None:
        return frames
    is_uint8 = frames.dtype == np.uint8
    # The checker sees what diffusers hands it (`_apply_video_safety_check`, np output): truncation, not the
    # output stage's rounding, so a borderline frame is judged the same way here and there. The fast path's
    # frames are already uint8 (rounded as written): those bytes are what it checks.
    pixels = frames if is_uint8 else (np.clip(frames, 0.0, 1.0) * 255).astype(np.uint8)
    checked = model.safety_checker.check_video_safety(pixels)
    if checked is None:
        raise SafetyRefusal("The safety checker refused the generated result; nothing was saved.")
    return np.asarray(checked).astype(np.uint8) if is_uint8 else np.asarray(checked).astype(np.float32) / 255.0


def to_uint8(decoded: torch.Tensor) -> torch.Tensor:
    """[-1, 1] decoder output [C, T, H, W] -> uint8 [T, H, W, C]: diffusers' denormalise, then round half up.

    The same float32 ops as `VaeImageProcessor.denormalize` (x * 0.5 + 0.5, clamp) followed by the
    output stage's `clip(x, 0, 1) * 255 + 0.5` and truncation.
    """
    frames = (decoded.float() * 0.5 + 0.5).clamp(0, 1)
    return (frames.clamp(0, 1) * 255.0 + 0.5).to(torch.uint8).permute(1, 2, 3, 0)


@torch.no_grad()
def decode_uint8(vae, z: torch.Tensor, plan: DecodePlan | None = None) -> np.ndarray:
    """Decode normalised-back latents `z` [1, C, T, h, w] to uint8 frames [T', H, W, 3] on the host.

    `plan` None: diffusers' decoder, one latent frame a step (the exact path's bytes); a `DecodePlan`:
    the engine's walk of the same decoder (`engine.pipeline.causal_decode`), bf16-close.
    """
    chunks = diffusers_chunks(vae, z) if plan is None else decoded_chunks(vae, z, plan)
    with contextlib.closing(chunks):  # a failed decode frees the decoder's cache now, not at garbage collection
        return frames_to_host((to_uint8(out[0]) for out in chunks), decoded_frames(z.shape[2]))


def decoded_frames(latent_frames: int) -> int:
    """How many frames the decoder makes of `latent_frames`: the first latent frame one, each later one
    `VAE_TEMPORAL` (the causal rule `AutoencoderKLWan._decode` follows; `frames_to_host` checks what it gave)."""
    return 1 + (latent_frames - 1) * VAE_TEMPORAL if latent_frames else 0


def frames_to_host(chunks: Iterable[torch.Tensor], frames: int) -> np.ndarray:
    """uint8 frame chunks [t, H, W, 3], in order, into one host array of `frames` frames.

    Why chunk by chunk, and each chunk written to its place as the next one decodes: one copy of the whole
    clip from the GPU into pageable memory ran at ~1.3 GB/s on the H200 box (0.11 s at 832x480/121f, and the
    clip is 3.6x that at 720p/189f), after the last conv; joining chunks at the end is a host pass over the
    whole clip (145 MB at 832x480/121f, 522 MB at 720p/189f, into freshly faulted pages) after the GPU is done.
    Here each chunk goes to page-locked memory asynchronously as it is produced (the copy engine runs while
    the GPU decodes the next chunk), and the host moves the previous chunk into the result while the GPU
    works on this one, so only the last chunk is copied after the decoder finishes.
    """
    out: np.ndarray | None = None
    filled = 0
    in_flight: tuple[torch.Tensor, torch.cuda.Event, int] | None = None  # (pinned chunk, its copy's event, where)
    for chunk in chunks:
        if out is None:
            out = np.empty((frames, *chunk.shape[1:]), dtype=np.uint8)
        if chunk.dtype != torch.uint8 or tuple(chunk.shape[1:]) != out.shape[1:] or filled + chunk.shape[0] > frames:
            raise ValueError(f"frames_to_host: chunk {tuple(chunk.shape)} {chunk.dtype} after {filled} frames does not "
                             f"fit {frames} uint8 frames of {out.shape[1:]}")
        if chunk.is_cuda:
            pinned = torch.empty(chunk.shape, dtype=chunk.dtype, pin_memory=True)
            pinned.copy_(chunk, non_blocking=True)  # stream-ordered before `chunk`'s memory is reused
            copied = torch.cuda.Event()
            copied.record()
            _land(in_flight, out)  # the previous chunk, while the GPU decodes this one
            in_flight = (pinned, copied, filled)
        else:
            out[filled:filled + chunk.shape[0]] = chunk.numpy()
        filled += chunk.shape[0]
    _land(in_flight, out)
    if out is None:
        raise ValueError("frames_to_host: the decoder gave no frames")
    if filled != frames:
        raise ValueError(f"frames_to_host: the decoder gave {filled} frames, {frames} were expected")
    return out


def _land(in_flight: tuple[torch.Tensor, torch.cuda.Event, int] | None, out: np.ndarray) -> None:
    """Wait for one chunk's copy to page-locked memory, then put it in its place in `out`."""
    if in_flight is None:
        return
    pinned, copied, start = in_flight
    copied.synchronize()
    out[start:start + pinned.shape[0]] = pinned.numpy()


def diffusers_chunks(vae, z: torch.Tensor) -> Iterator[torch.Tensor]:
    """diffusers' decode loop (`AutoencoderKLWan._decode`), one latent frame a step with its feature cache:
    the clamped [-1, 1] output [B, 3, frames, H, W] of each step, as `causal_decode.decoded_chunks` gives it."""
    patch = vae.config.patch_size
    vae.clear_cache()
    try:
        x = vae.post_quant_conv(z)
        for i in range(x.shape[2]):
            vae._conv_idx = [0]
            out = vae.decoder(x[:, :, i:i + 1], feat_cache=vae._feat_map, feat_idx=vae._conv_idx, first_chunk=i == 0)
            if patch is not None:
                out = unpatchify(out, patch_size=patch)
            yield torch.clamp(out, min=-1.0, max=1.0)
    finally:
        vae.clear_cache()
