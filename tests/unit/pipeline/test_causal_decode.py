"""The engine's walk of the Wan decoder (`engine.pipeline.causal_decode`) against diffusers' decode (CPU).

- `DecodePlan()` (one latent frame a step, diffusers' ops) is diffusers' `vae.decode` bit for bit;
- temporal chunking is the same computation in bigger convs: equal within fp32 rounding in fp32, and
  in bf16 the frames stay within a few 8-bit levels;
- the fused norm + SiLU kernel (`cosmos3_kernels.wan_norm`, under the Triton interpreter here) and the
  stacked-time-tap conv2d are bf16-close (the kernel against its reference: tests/unit/kernels/test_kernels_wan_norm.py).
"""
import copy

import numpy as np
import pytest
import torch

import engine
from engine.pipeline.causal_decode import DecodePlan, decoded_chunks, latent_steps


@pytest.fixture(scope="module")
def vae(tiny_family):
    return engine.load_model(tiny_family["nano"], device="cpu").vae


def _latents(vae, frames: int, dtype, seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(1, vae.config.z_dim, frames, 2, 3, generator=generator).to(dtype)


def _walk(vae, z, plan) -> torch.Tensor:
    with torch.no_grad():
        return torch.cat(list(decoded_chunks(vae, z, plan)), dim=2)


def test_latent_steps_put_the_first_frame_alone():
    assert latent_steps(1, 4) == [(0, 1)]
    assert latent_steps(48, 4)[:3] == [(0, 1), (1, 5), (5, 9)] and latent_steps(48, 4)[-1] == (45, 48)
    assert latent_steps(6, 1) == [(i, i + 1) for i in range(6)]
    assert sum(stop - start for start, stop in latent_steps(31, 8)) == 31


def test_default_plan_is_diffusers_decode_bit_for_bit(vae):
    z = _latents(vae, 5, vae.dtype)
    with torch.no_grad():
        expected = vae.decode(z).sample
    ours = _walk(vae, z, DecodePlan())
    assert ours.shape == expected.shape == (1, 3, 17, 32, 48)
    assert torch.equal(ours, expected)


@pytest.mark.parametrize("chunk", [2, 8])
def test_temporal_chunking_is_the_same_decode(vae, chunk):
    z = _latents(vae, 4, vae.dtype, seed=chunk)
    with torch.no_grad():
        expected = vae.decode(z).sample
    ours = _walk(vae, z, DecodePlan(chunk=chunk))
    assert ours.shape == expected.shape
    assert (ours - expected).abs().max() < 1e-4


def test_plan_refuses_what_it_cannot_do():
    with pytest.raises(ValueError, match="chunk >= 1"):
        DecodePlan(chunk=0)
    with pytest.raises(ValueError, match="elementwise"):
        DecodePlan(elementwise="cuda")
    with pytest.raises(ValueError, match="upsample in \\('nearest', 'subpixel'\\); got .*upsample='bilinear'"):
        DecodePlan(elementwise="triton", upsample="bilinear")
    with pytest.raises(ValueError, match="upsample='subpixel' needs a fused plan"):
        DecodePlan(upsample="subpixel")
    with pytest.raises(ValueError, match="norm_fp32 needs elementwise='triton'"):
        DecodePlan(elementwise="compile", norm_fp32=True)


@pytest.mark.parametrize("h,w", [(1, 1), (3, 5), (6, 4)])
def test_subpixel_phases_are_the_upsample_then_conv(h, w):
    """Four 2x2 convs over the low-resolution input are a 2x nearest upsample then the 3x3 conv, borders
    included (fp64: equal to its rounding, so any misplaced tap or phase fails)."""
    import torch.nn.functional as F

    from engine.pipeline.causal_decode import subpixel_weight
    from cosmos3_kernels.wan_norm import interleave_phases

    generator = torch.Generator().manual_seed(h * w)
    x = torch.randn(2, 5, h, w, generator=generator, dtype=torch.float64)
    weight = torch.randn(7, 5, 3, 3, generator=generator, dtype=torch.float64)
    expected = F.conv2d(F.interpolate(x, scale_factor=2.0, mode="nearest-exact"), weight, padding=1)
    phases = F.conv2d(x, subpixel_weight(weight), padding=1)  # [2, 28, h + 1, w + 1]
    ours = interleave_phases(phases.unsqueeze(2)).squeeze(2)
    assert ours.shape == expected.shape == (2, 7, 2 * h, 2 * w)
    assert (ours - expected).abs().max() < 1e-12
    with pytest.raises(ValueError, match=r"a 3x3 conv weight \[O, I, 3, 3\] is needed; got \(7, 5, 1, 1\)"):
        subpixel_weight(weight[:, :, :1, :1])


@pytest.mark.parametrize("fold_bias", [True, False], ids=["folded", "unfolded"])
def test_subpixel_upsampling_is_the_same_decode_in_fp32(vae, fold_bias):
    """The decode with its upsamplers as sub-pixel phase convs equals the nearest-upsample decode to fp32
    rounding: through the kernel that interleaves as it ends the up block (folded), and through the copy."""
    import engine.pipeline.causal_decode as causal_decode

    z = _latents(vae, 3, vae.dtype, seed=7)
    nearest = _walk(vae, z, DecodePlan(elementwise="triton", fold_bias=fold_bias))
    phase_convs = []
    conv = causal_decode.CausalDecoder._phase_conv

    def counting(self, *args):
        phase_convs.append(1)
        return conv(self, *args)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(causal_decode.CausalDecoder, "_phase_conv", counting)
        subpixel = _walk(vae, z, DecodePlan(elementwise="triton", fold_bias=fold_bias, upsample="subpixel"))
    upsamplers = sum(getattr(b, "upsampler", None) is not None for b in vae.decoder.up_blocks)
    assert upsamplers and len(phase_convs) == upsamplers * len(latent_steps(3, 1))
    assert subpixel.shape == nearest.shape
    assert (subpixel - nearest).abs().max() < 1e-4


@pytest.fixture(scope="module")
def vae_bf16(vae):
    """The fast path's VAE: a bf16 copy with channels-last conv weights (the fp32 `vae` stays as loaded)."""
    bf16 = copy.deepcopy(vae).to(torch.bfloat16)
    for param in bf16.parameters():
        if param.dim() == 5:
            param.data = param.data.contiguous(memory_format=torch.channels_last_3d)
    return bf16


@pytest.mark.parametrize("plan", [DecodePlan(chunk=2), DecodePlan(chunk=2, elementwise="triton"),
                                  DecodePlan(chunk=2, conv="2d"),
                                  DecodePlan(elementwise="triton", fold_bias=True, upsample="subpixel"),
                                  DecodePlan(elementwise="triton", fold_bias=True, norm_fp32=True)],
                         ids=["chunk2", "triton+chunk2", "conv2d+chunk2", "triton+fold+subpixel", "triton+fold+norm_fp32"])
def test_fast_plans_stay_close_in_bf16(vae_bf16, plan):
    z = _latents(vae_bf16, 4, torch.bfloat16, seed=3).contiguous(memory_format=torch.channels_last_3d)
    with torch.no_grad():
        expected = vae_bf16.decode(z).sample.float()
    ours = _walk(vae_bf16, z, plan).float()
    assert ours.shape == expected.shape
    # bf16-sized: the fast path's channels-last layout alone moves this decode by ~2.5e-2 on the H200.
    assert (ours - expected).abs().max() <= 4e-2
    to_u8 = lambda x: np.round((x.clamp(-1, 1) * 0.5 + 0.5).numpy() * 255)  # noqa: E731
    assert np.abs(to_u8(ours) - to_u8(expected)).max() <= 6


def test_the_switch_and_the_rule_pick_the_plan(vae, monkeypatch):
    from engine.config import build_config
    from engine.pipeline.causal_decode import VIDEO_PLAN, plan_for
    from engine.pipeline.fast_path import FastPathOptions

    video, image = (1, 48, 5, 45, 80), (1, 48, 1, 64, 64)
    on = FastPathOptions(enabled=True)
    assert on.vae_fast_decode and plan_for(vae, video, "cuda", on) == VIDEO_PLAN
    assert plan_for(vae, image, "cuda", on) is None  # one latent frame: nothing to chunk, diffusers' loop
    assert plan_for(vae, video, "cpu", on) is None  # the fast paths are never required off the GPU
    assert plan_for(vae, video, "cuda", FastPathOptions(enabled=False)) is None
    assert VIDEO_PLAN.upsample == "subpixel" and VIDEO_PLAN.norm_fp32
    monkeypatch.setenv("COSMOS3_VAE_SUBPIXEL", "0")
    nearest = FastPathOptions.from_config(build_config(), torch.device("cuda"))
    assert plan_for(vae, video, "cuda", nearest) == DecodePlan(elementwise="triton", fold_bias=True, norm_fp32=True)
    monkeypatch.setenv("COSMOS3_VAE_NORM_FP32", "0")
    rounded = FastPathOptions.from_config(build_config(), torch.device("cuda"))
    assert plan_for(vae, video, "cuda", rounded) == DecodePlan(elementwise="triton", fold_bias=True)
    monkeypatch.setenv("COSMOS3_VAE_FAST_DECODE", "0")
    off = FastPathOptions.from_config(build_config(), torch.device("cuda"))
    assert not off.vae_fast_decode and plan_for(vae, video, "cuda", off) is None


def test_uint8_decode_with_the_plan_stays_within_the_stated_bound(vae):
    """The fast path's uint8 frames: the rule's plan within a few levels of the exact bytes; no plan = exact."""
    from diffusers.video_processor import VideoProcessor

    from engine.pipeline.causal_decode import VIDEO_PLAN
    from engine.pipeline.decode import decode_uint8
    from engine.pipeline.outputs import frames_to_uint8

    z = _latents(vae, 3, vae.dtype, seed=5)
    with torch.no_grad():
        decoded = vae.decode(z).sample.float()
    expected = frames_to_uint8(VideoProcessor(vae_scale_factor=16).postprocess_video(decoded, output_type="np")[0])
    assert np.array_equal(decode_uint8(vae, z), expected)
    ours = decode_uint8(vae, z, VIDEO_PLAN)
    assert ours.shape == expected.shape and ours.dtype == np.uint8
    assert np.abs(ours.astype(np.int16) - expected).max() <= 1  # the tiny VAE on the CPU: agree to a rounding step


def _conv_bias_as_its_own_pass(monkeypatch):
    """F.conv3d and F.conv2d as PyTorch runs them with cuDNN: the conv without its bias, then
    `output.add_(bias)` (on the CPU the bias is added inside the conv, in fp32, so the two ways differ there
    by a rounding)."""
    functional = torch.nn.functional
    for name in ("conv3d", "conv2d"):
        conv = getattr(functional, name)

        def separate(x, weight, bias=None, *args, _conv=conv):
            out = _conv(x, weight, None, *args)
            return out if bias is None else out.add_(bias.reshape(1, -1, *([1] * (out.dim() - 2))))

        monkeypatch.setattr(functional, name, separate)


def test_folded_biases_give_the_unfolded_bytes_where_the_conv_adds_its_bias_in_a_pass(vae_bf16, monkeypatch):
    import engine.pipeline.causal_decode as causal_decode

    _conv_bias_as_its_own_pass(monkeypatch)
    calls = {"norm with bias": 0, "bias + residual": 0, "bias + shortcut": 0}
    norm = causal_decode.norm_silu_into
    residual, shortcut = causal_decode.add_bias_residual_, causal_decode.add_bias_dup_up_

    def counting_norm(*args, bias=None, **kwargs):
        calls["norm with bias"] += bias is not None
        return norm(*args, bias=bias, **kwargs)

    def counting(name, kernel):
        def run(*args):
            calls[name] += 1
            return kernel(*args)
        return run

    monkeypatch.setattr(causal_decode, "norm_silu_into", counting_norm)
    monkeypatch.setattr(causal_decode, "add_bias_residual_", counting("bias + residual", residual))
    monkeypatch.setattr(causal_decode, "add_bias_dup_up_", counting("bias + shortcut", shortcut))
    z = _latents(vae_bf16, 3, torch.bfloat16, seed=4).contiguous(memory_format=torch.channels_last_3d)
    unfolded = _walk(vae_bf16, z, DecodePlan(elementwise="triton"))
    assert calls == {"norm with bias": 0, "bias + residual": 0, "bias + shortcut": 0}
    folded = _walk(vae_bf16, z, DecodePlan(elementwise="triton", fold_bias=True))
    decoder = vae_bf16.decoder
    resnets = sum(len(b.resnets) for b in [decoder.mid_block, *decoder.up_blocks])
    shortcuts = sum(getattr(b, "avg_shortcut", None) is not None for b in decoder.up_blocks)
    steps = len(latent_steps(3, 1))
    assert shortcuts and calls == {"norm with bias": resnets * steps, "bias + residual": resnets * steps,
                                   "bias + shortcut": shortcuts * steps}  # every block folded
    assert torch.equal(folded, unfolded)


def test_folding_needs_the_fused_kernels():
    with pytest.raises(ValueError, match="fold_bias needs elementwise='triton'"):
        DecodePlan(fold_bias=True)
    with pytest.raises(ValueError, match="fold_bias needs elementwise='triton'"):
        DecodePlan(elementwise="compile", fold_bias=True)
