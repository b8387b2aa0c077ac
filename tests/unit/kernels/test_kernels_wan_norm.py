"""The Wan decoder's fused RMS norm + SiLU kernel (`cosmos3_kernels.wan_norm`) against its reference (CPU: the
Triton interpreter), and that it writes only the interior of its padded buffer."""
import pytest
import torch

from cosmos3_kernels.wan_norm import (add_bias_dup_up_, add_bias_dup_up_phases, add_bias_dup_up_phases_reference,
                               add_bias_dup_up_reference, add_bias_residual_, add_bias_residual_reference,
                               interleave_phases, norm_silu_into, norm_silu_reference)


# The kernel runs where its tensors are: on a GPU machine the conftest leaves the interpreter off.
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.mark.parametrize("channels", [8, 24, 48])
def test_norm_silu_kernel_is_the_reference_and_writes_only_the_interior(channels):
    generator = torch.Generator().manual_seed(channels)
    x = (3 * torch.randn(1, channels, 3, 5, 7, generator=generator)).to(DEVICE, torch.bfloat16)
    x = x.contiguous(memory_format=torch.channels_last_3d)
    gamma = (1 + 0.1 * torch.randn(channels, 1, 1, 1, generator=generator)).to(DEVICE, torch.bfloat16)
    buffer = torch.full((1, channels, 5, 7, 9), 7.0, dtype=torch.bfloat16, device=DEVICE).contiguous(
        memory_format=torch.channels_last_3d)
    interior = buffer[:, :, 2:, 1:6, 1:8]
    norm_silu_into(x, gamma, channels ** 0.5, interior)
    assert torch.equal(interior, norm_silu_reference(x, gamma, channels ** 0.5))
    outside = torch.ones_like(buffer, dtype=torch.bool)
    outside[:, :, 2:, 1:6, 1:8] = False
    assert bool((buffer[outside] == 7.0).all())


@pytest.mark.parametrize("with_bias", [False, True], ids=["plain", "bias"])
def test_norm_silu_in_fp32_rounds_once_and_lands_closer_to_fp32(with_bias):
    # The one-rounding variant (the fast video decode's): within a bf16 step of its fp32 reference everywhere (the
    # kernel's fp32 order differs by ulps), and on average closer to the unrounded value than diffusers' roundings.
    channels = 96
    x = _activation(channels, 4, 11)
    generator = torch.Generator().manual_seed(12)
    gamma = (1 + 0.1 * torch.randn(channels, 1, 1, 1, generator=generator)).to(DEVICE, torch.bfloat16)
    bias = (0.7 * torch.randn(channels, generator=generator)).to(DEVICE, torch.bfloat16) if with_bias else None
    scale = channels ** 0.5
    once, steps = torch.empty_like(x), torch.empty_like(x)
    norm_silu_into(x, gamma, scale, once, bias=bias, one_rounding=True)
    norm_silu_into(x, gamma, scale, steps, bias=bias)
    expected = norm_silu_reference(x, gamma, scale, bias=bias, one_rounding=True)
    exact = torch.nn.functional.silu(torch.nn.functional.normalize(
        x.double() + (0 if bias is None else bias.double().reshape(1, -1, 1, 1, 1)), dim=1)
        * scale * gamma.double().reshape(1, -1, 1, 1, 1))
    step = (expected.double().abs() * 2 ** -7).clamp(min=2 ** -126)  # one bf16 ulp at the value (8 bits of mantissa)
    assert bool(((once.double() - expected.double()).abs() <= step).all())
    assert float((once != expected).double().mean()) < 0.01
    error_once = float((once.double() - exact).abs().mean())
    error_steps = float((steps.double() - exact).abs().mean())
    assert error_once < 0.8 * error_steps


def test_norm_silu_kernel_refuses_channels_first():
    x = torch.randn(1, 8, 2, 3, 3, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="channel stride 1"):
        norm_silu_into(x, torch.ones(8, dtype=torch.bfloat16), 1.0, torch.empty_like(x))


def _activation(channels, frames, seed, scale=3.0):
    generator = torch.Generator().manual_seed(seed)
    x = (scale * torch.randn(1, channels, frames, 5, 7, generator=generator)).to(DEVICE, torch.bfloat16)
    return x.contiguous(memory_format=torch.channels_last_3d)


@pytest.mark.parametrize("channels", [8, 24])
def test_norm_silu_kernel_adds_the_convs_bias_first_as_its_own_pass_would(channels):
    x = _activation(channels, 3, channels)
    generator = torch.Generator().manual_seed(100 + channels)
    gamma = (1 + 0.1 * torch.randn(channels, 1, 1, 1, generator=generator)).to(DEVICE, torch.bfloat16)
    bias = (0.7 * torch.randn(channels, generator=generator)).to(DEVICE, torch.bfloat16)
    out = torch.empty_like(x)
    norm_silu_into(x, gamma, channels ** 0.5, out, bias=bias)
    separate = x.clone()
    separate.add_(bias.reshape(1, -1, 1, 1, 1))  # PyTorch's conv bias pass
    expected = norm_silu_reference(separate, gamma, channels ** 0.5)
    assert torch.equal(out, expected)
    assert torch.equal(expected, norm_silu_reference(x, gamma, channels ** 0.5, bias=bias))
    assert not torch.equal(out, norm_silu_reference(x, gamma, channels ** 0.5))  # the bias does count


@pytest.mark.parametrize("channels", [8, 48])
def test_the_bias_and_residual_add_is_the_two_separate_passes_bit_for_bit(channels):
    x = _activation(channels, 2, channels)
    residual = _activation(channels, 2, channels + 1, scale=5.0)
    bias = (0.7 * torch.randn(channels, generator=torch.Generator().manual_seed(channels))).to(DEVICE, torch.bfloat16)
    separate = x.clone()
    separate.add_(bias.reshape(1, -1, 1, 1, 1))
    separate = separate + residual
    fused = x.clone()
    assert add_bias_residual_(fused, bias, residual) is fused  # in place
    assert torch.equal(fused, separate)
    assert torch.equal(fused, add_bias_residual_reference(x, bias, residual))
    # one rounding instead of two would differ somewhere: the test can tell the orders apart
    once = (x.float() + bias.float().reshape(1, -1, 1, 1, 1) + residual.float()).to(torch.bfloat16)
    assert not torch.equal(fused, once)


def test_the_bias_and_residual_add_reads_and_writes_any_layout():
    x = _activation(16, 2, 1)
    bias = torch.linspace(-1, 1, 16).to(DEVICE, torch.bfloat16)
    for residual in (_activation(16, 4, 2)[:, :, 1:3],  # a strided view: another time stride
                     _activation(16, 2, 3).contiguous()):  # channels first
        expected = add_bias_residual_reference(x, bias, residual)
        assert torch.equal(add_bias_residual_(x.clone(), bias, residual), expected)
        first = x.contiguous()
        assert torch.equal(add_bias_residual_(first, bias, residual), expected)


def test_the_bias_folds_refuse_what_they_cannot_read():
    x = _activation(8, 2, 0)
    with pytest.raises(ValueError, match="need equal 5-D shapes"):
        add_bias_residual_(x, torch.zeros(8, dtype=torch.bfloat16, device=DEVICE), x[:, :, :1])
    with pytest.raises(ValueError, match=r"bias: 8 values of torch.bfloat16 needed \(one per channel\), got 4"):
        add_bias_residual_(x, torch.zeros(4, dtype=torch.bfloat16, device=DEVICE), x.clone())
    with pytest.raises(ValueError, match="got 8 of torch.float32"):
        norm_silu_into(x, torch.ones(8, dtype=torch.bfloat16, device=DEVICE), 1.0, torch.empty_like(x),
                       bias=torch.zeros(8, device=DEVICE))


@pytest.mark.parametrize("in_ch,out_ch,factor_t,factor_s,first_chunk", [
    (16, 8, 2, 2, False), (16, 8, 2, 2, True),  # an upsample3d block's shortcut (time and space)
    (8, 8, 1, 2, False),                        # an upsample2d block's (space only)
    (12, 6, 2, 2, True),                        # repeats 4 (6 * 8 / 12): an output channel's taps span inputs
])
def test_the_dup_up_shortcut_is_read_in_place_and_added_as_diffusers_adds_it(in_ch, out_ch, factor_t, factor_s, first_chunk):
    from diffusers.models.autoencoders.autoencoder_kl_wan import DupUp3D

    shortcut = DupUp3D(in_ch, out_ch, factor_t, factor_s)
    frames = 2
    skip = _activation(in_ch, frames, 7)[:, :, :, :3, :4].contiguous(memory_format=torch.channels_last_3d)
    out_t = frames * factor_t - (factor_t - 1 if first_chunk else 0)
    generator = torch.Generator().manual_seed(in_ch + out_ch)
    x = (3 * torch.randn(1, out_ch, out_t, 3 * factor_s, 4 * factor_s, generator=generator)).to(DEVICE, torch.bfloat16)
    x = x.contiguous(memory_format=torch.channels_last_3d)
    bias = (0.5 * torch.randn(out_ch, generator=generator)).to(DEVICE, torch.bfloat16)
    for b in (bias, None):
        expected = add_bias_dup_up_reference(x, b, skip, shortcut, first_chunk)
        fused = x.clone()
        assert add_bias_dup_up_(fused, b, skip, shortcut, first_chunk) is fused
        assert torch.equal(fused, expected)


def test_interleave_phases_puts_each_phase_where_its_pixels_are():
    # Phase (a, b)'s value for output pixel (2i + a, 2j + b) sits at (i + a, j + b) of channel block 2a + b.
    c, t, h, w = 3, 2, 3, 4
    phases = torch.randn(1, 4 * c, t, h + 1, w + 1, generator=torch.Generator().manual_seed(0))
    image = interleave_phases(phases)
    assert image.shape == (1, c, t, 2 * h, 2 * w) and image.is_contiguous(memory_format=torch.channels_last_3d)
    for y in range(2 * h):
        for x in range(2 * w):
            a, b = y % 2, x % 2
            block = phases[0, (2 * a + b) * c:(2 * a + b + 1) * c, :, y // 2 + a, x // 2 + b]
            assert torch.equal(image[0, :, :, y, x], block)


@pytest.mark.parametrize("in_ch,out_ch,factor_t,first_chunk", [
    (16, 8, 2, False), (16, 8, 2, True),  # an upsample3d block's end (the time conv doubled the frames)
    (8, 8, 1, False),                     # an upsample2d block's
])
def test_the_dup_up_add_reads_the_upsampler_phases_as_their_interleave_bit_for_bit(in_ch, out_ch, factor_t,
                                                                                    first_chunk):
    from diffusers.models.autoencoders.autoencoder_kl_wan import DupUp3D

    shortcut = DupUp3D(in_ch, out_ch, factor_t, 2)
    frames, h, w = 2, 3, 4
    skip = _activation(in_ch, frames, 5)[:, :, :, :h, :w].contiguous(memory_format=torch.channels_last_3d)
    out_t = frames * factor_t - (factor_t - 1 if first_chunk else 0)
    generator = torch.Generator().manual_seed(in_ch + factor_t)
    # As the engine makes them: a conv2d's channels-last output [N, 4C, H + 1, W + 1] viewed as 5-D.
    flat = (3 * torch.randn(out_t, 4 * out_ch, h + 1, w + 1, generator=generator)).to(DEVICE, torch.bfloat16)
    flat = flat.contiguous(memory_format=torch.channels_last)
    phases = flat.view(1, out_t, 4 * out_ch, h + 1, w + 1).permute(0, 2, 1, 3, 4)
    bias = (0.5 * torch.randn(out_ch, generator=generator)).to(DEVICE, torch.bfloat16)
    for b in (bias, None):
        expected = add_bias_dup_up_phases_reference(phases, b, skip, shortcut, first_chunk)
        fused = add_bias_dup_up_phases(phases, b, skip, shortcut, first_chunk)
        assert fused.shape == (1, out_ch, out_t, 2 * h, 2 * w)
        assert fused.is_contiguous(memory_format=torch.channels_last_3d)
        assert torch.equal(fused, expected)


def test_the_phases_add_refuses_what_is_not_four_phases():
    from diffusers.models.autoencoders.autoencoder_kl_wan import DupUp3D

    shortcut = DupUp3D(16, 8, 1, 2)
    skip = torch.zeros(1, 16, 2, 4, 6, dtype=torch.bfloat16, device=DEVICE)
    with pytest.raises(ValueError, match=r"phases must be \[B, 4C, T, H \+ 1, W \+ 1\]; got \(1, 30, 2, 5, 7\)"):
        add_bias_dup_up_phases(torch.zeros(1, 30, 2, 5, 7, dtype=torch.bfloat16, device=DEVICE), None, skip, shortcut,
                               False)
    with pytest.raises(ValueError, match=r"expected skip \(1, 16, 2, 3, 4\)"):  # phases for a 6x8 image, not 8x12
        add_bias_dup_up_phases(torch.zeros(1, 32, 2, 4, 5, dtype=torch.bfloat16, device=DEVICE), None, skip, shortcut,
                               False)


def test_the_dup_up_add_refuses_a_skip_that_is_not_the_shortcuts_input():
    from diffusers.models.autoencoders.autoencoder_kl_wan import DupUp3D

    shortcut = DupUp3D(16, 8, 2, 2)
    x = _activation(8, 4, 0)[:, :, :, :4, :6]
    with pytest.raises(ValueError, match=r"expected skip \(1, 16, 2, 2, 3\)"):
        add_bias_dup_up_(x, None, torch.zeros(1, 16, 2, 2, 2, dtype=torch.bfloat16, device=DEVICE), shortcut, False)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="counts compiled kernels: needs CUDA")
def test_a_new_video_size_compiles_no_new_kernel():
    # Each decode kernel must compile once per channel layout, not once per resolution or chunk length:
    # a first request at a new video size would otherwise pay seconds of compiles (Triton specialises an
    # integer argument on its divisibility by 16 and on being 1).
    from cosmos3_kernels import wan_norm

    def compiled(kernel) -> int:
        return sum(len(caches[0]) for caches in kernel.device_caches.values())

    channels = 64
    gamma = torch.ones(channels, device="cuda", dtype=torch.bfloat16)
    bias = torch.randn(channels, device="cuda", dtype=torch.bfloat16)
    dup = torch.nn.Module()
    dup.factor_t, dup.factor_s, dup.repeats, dup.in_channels, dup.out_channels = 2, 2, 4, 2 * channels, channels
    counts = []
    # Heights and widths divisible by 16 and not, one frame (a first chunk) and several.
    for t, h, w in ((1, 90, 160), (4, 60, 104), (2, 46, 82), (4, 96, 96)):
        x = torch.randn(1, channels, t, h, w, device="cuda", dtype=torch.bfloat16).contiguous(
            memory_format=torch.channels_last_3d)
        out = torch.empty_like(x)
        wan_norm.norm_silu_into(x, gamma, 8.0, out, bias=bias)
        wan_norm.add_bias_residual_(out, bias, x)
        for first_chunk in (True, False):  # a first chunk's shortcut drops its first frame
            skip = torch.randn(1, 2 * channels, t, h // 2, w // 2, device="cuda", dtype=torch.bfloat16).contiguous(
                memory_format=torch.channels_last_3d)
            target = torch.randn(1, channels, 2 * t - first_chunk, h, w, device="cuda", dtype=torch.bfloat16).contiguous(
                memory_format=torch.channels_last_3d)
            wan_norm.add_bias_dup_up_(target, bias, skip, dup, first_chunk)
        counts.append(tuple(compiled(k) for k in (wan_norm._norm_silu_kernel, wan_norm._add_bias_residual_kernel,
                                                   wan_norm._add_bias_dup_up_kernel)))
    assert counts[-1] == counts[0], counts
