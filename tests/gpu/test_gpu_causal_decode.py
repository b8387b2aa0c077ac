"""On the GPU, full-size random Wan2.2 VAE: the fast decode through the engine's decode stage.

`engine.pipeline.decode.decode_stage` (what `engine.generate` runs) with the fast path on picks the
measured plan (`causal_decode.VIDEO_PLAN`: the fused norm + SiLU kernel) for a video; its uint8 frames
stay within the stated bound of the same stage with `vae_fast_decode` off (today's bytes, which equal
the exact decode's: tests/gpu/test_gpu_whole_step.py), and its [-1, 1] output within bf16 rounding of
diffusers' decode. Skipped without CUDA:

    python3 -m pytest -q tests/gpu/test_gpu_causal_decode.py
"""
from types import SimpleNamespace

import numpy as np
import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

# Measured at 1280x720x189 and 832x480x121: 4 levels against today's bytes; 2.7e-2 on [-1, 1] against the
# plain decode (channels-last alone: 2.3e-2).
MAX_U8_LEVELS = 6
MAX_ABS_DIFF = 4e-2


@pytest.fixture(scope="module")
def vae():
    from bench.models import build_vae

    yield build_vae("cuda")
    torch.cuda.empty_cache()


def _conv_weights(vae, memory_format: torch.memory_format) -> None:
    """The VAE's 3-D conv weights in `memory_format`: contiguous for diffusers' own decode, channels-last-3d for
    the fast path (cuDNN picks other kernels for each, so the layout moves the bf16 output)."""
    for param in vae.parameters():
        if param.dim() == 5:
            param.data = param.data.contiguous(memory_format=memory_format)


def _stage(vae, vision, fast_decode: bool) -> np.ndarray:
    from engine.model.runtime import ModelRuntime
    from engine.pipeline.decode import decode_stage
    from engine.pipeline.fast_path import FastPathOptions
    from engine.pipeline.state import Latents, RunState

    model = SimpleNamespace(vae=vae, parallel=None, safety_checker=None, runtime=ModelRuntime())
    state = RunState(model=model, request={"mode": "t2v"}, seed=0, generator=None,
                     options=FastPathOptions(enabled=True, vae_fast_decode=fast_decode),
                     latents=Latents(vision=vision, vision_mask=torch.zeros(vision.shape[2], 1, 1)))
    decode_stage(state)
    return state.frames


def test_decode_stage_uses_the_fused_plan_within_the_bound(vae, monkeypatch):
    import engine.pipeline.causal_decode as causal_decode
    from engine.pipeline.causal_decode import VIDEO_PLAN, decoded_chunks

    calls = []
    kernel = causal_decode.norm_silu_into
    monkeypatch.setattr(causal_decode, "norm_silu_into", lambda *a, **k: calls.append(1) or kernel(*a, **k))
    generator = torch.Generator(device="cuda").manual_seed(0)
    vision = torch.randn(1, 48, 6, 30, 52, device="cuda", generator=generator)
    today = _stage(vae, vision, fast_decode=False)
    assert not calls
    fast = _stage(vae, vision, fast_decode=True)
    assert calls  # the fused kernel ran: the rule picked the plan
    assert fast.shape == today.shape == (21, 480, 832, 3) and fast.dtype == np.uint8
    assert np.abs(fast.astype(np.int16) - today).max() <= MAX_U8_LEVELS

    z = vision.to(vae.dtype).contiguous(memory_format=torch.channels_last_3d)  # latents_std 1, mean 0
    with torch.no_grad():
        ours = torch.cat(list(decoded_chunks(vae, z, VIDEO_PLAN)), dim=2).float()
        _conv_weights(vae, torch.contiguous_format)  # the plain decode: contiguous weights and latents
        plain = vae.decode(vision.to(vae.dtype)).sample.float()
    assert (ours - plain).abs().max() <= MAX_ABS_DIFF


def test_an_image_keeps_the_exact_bytes(vae):
    generator = torch.Generator(device="cuda").manual_seed(1)
    vision = torch.randn(1, 48, 1, 40, 40, device="cuda", generator=generator)
    assert np.array_equal(_stage(vae, vision, fast_decode=True), _stage(vae, vision, fast_decode=False))


def test_gpu_chunks_reach_the_host_whole_while_the_decoder_reuses_its_buffer():
    """`frames_to_host` puts each chunk in place while the next one is produced: a producer that overwrites one
    GPU buffer per chunk (after a long kernel, so the copy of the chunk before is still queued) loses none."""
    from engine.pipeline.decode import frames_to_host

    counts = (1, 4, 4, 4)
    busy = torch.randn(4096, 4096, device="cuda")

    def reused_buffer():
        buffer = torch.empty((4, 480, 832, 3), dtype=torch.uint8, device="cuda")
        for i, count in enumerate(counts):
            for _ in range(4):  # GPU work queued ahead of the fill
                busy @ busy
            buffer[:count].fill_(10 + i)
            yield buffer[:count]

    frames = frames_to_host(reused_buffer(), sum(counts))
    assert frames.shape == (13, 480, 832, 3)
    expected = np.repeat(np.array([10 + i for i, n in enumerate(counts)]), counts)
    assert np.array_equal(frames.reshape(13, -1).min(axis=1), expected)
    assert np.array_equal(frames.reshape(13, -1).max(axis=1), expected)


def test_folded_biases_change_no_byte_on_cudnn(vae):
    """The fast plan folds the residual blocks' conv biases into its kernels; cuDNN convs add their bias in a
    pass of their own, rounded to bf16, and the kernels round where that pass does: the same output."""
    from engine.pipeline.causal_decode import VIDEO_PLAN, DecodePlan, decoded_chunks

    assert VIDEO_PLAN.fold_bias
    generator = torch.Generator(device="cuda").manual_seed(2)
    z = torch.randn(1, 48, 4, 30, 52, device="cuda", generator=generator).to(vae.dtype)
    z = z.contiguous(memory_format=torch.channels_last_3d)
    with torch.no_grad():
        folded = torch.cat(list(decoded_chunks(vae, z, DecodePlan(elementwise="triton", fold_bias=True))), dim=2)
        unfolded = torch.cat(list(decoded_chunks(vae, z, DecodePlan(elementwise="triton"))), dim=2)
    assert torch.equal(folded, unfolded)


# The video plan's two approximations, the sub-pixel upsamplers (their weights are sums of the 3x3 weights rounded
# once to bf16) and the norm in fp32 (one rounding), are held to the fp32 decode: the plan's error there stays
# within this multiple of diffusers' own bf16 decode's.
VIDEO_PLAN_ERROR_VS_BF16 = 1.25


def test_the_video_plan_stays_as_close_to_fp32_as_diffusers_bf16_decode(vae):
    import copy
    from dataclasses import replace

    from engine.pipeline.causal_decode import VIDEO_PLAN, decoded_chunks

    assert VIDEO_PLAN.upsample == "subpixel" and VIDEO_PLAN.norm_fp32
    generator = torch.Generator(device="cuda").manual_seed(3)
    vision = torch.randn(1, 48, 3, 30, 52, device="cuda", generator=generator)
    plans = {"video plan": VIDEO_PLAN, "nearest": replace(VIDEO_PLAN, upsample="nearest"),
             "norm rounded": replace(VIDEO_PLAN, norm_fp32=False),
             "neither": replace(VIDEO_PLAN, upsample="nearest", norm_fp32=False)}
    with torch.no_grad():
        exact = copy.deepcopy(vae).float().decode(vision).sample
        _conv_weights(vae, torch.contiguous_format)  # diffusers' decode
        outputs = {"plain": vae.decode(vision.to(vae.dtype)).sample.float()}
        _conv_weights(vae, torch.channels_last_3d)  # the fast path's layout
        z = vision.to(vae.dtype).contiguous(memory_format=torch.channels_last_3d)
        for name, plan in plans.items():
            outputs[name] = torch.cat(list(decoded_chunks(vae, z, plan)), dim=2).float()
    rms = {name: float((out - exact).pow(2).mean().sqrt()) for name, out in outputs.items()}
    print(f"RMS error against the fp32 decode: {rms}")
    assert rms["video plan"] <= VIDEO_PLAN_ERROR_VS_BF16 * rms["plain"]
    assert (outputs["video plan"] - outputs["plain"]).abs().max() <= MAX_ABS_DIFF
