"""The Wan VAE decoder's RMS norm + SiLU in one pass, written straight into a conv's padded input.

Before every 3x3x3 causal conv of the decoder diffusers runs, at full resolution:

    x.float() -> F.normalize over channels -> .to(bf16) -> * sqrt(C) -> * gamma -> (+ 0.0) -> SiLU
    torch.cat([cache, x], time) -> F.pad(..., spatial)

about ten passes over the activation (several in fp32). The kernel reads each position's channels
once and writes SiLU(norm(x)) once, into the interior of a zero-bordered buffer the conv reads
directly (no cat, no pad). Rounding follows diffusers' steps (normalised value, the scale, the gamma
product and the SiLU output are each rounded to the activation dtype), with IEEE division and square
root; the channel sum and exp run in Triton's order, so results agree to a rounding step, not bit for
bit (tests/unit/kernels/test_kernels_wan_norm.py).

Beside it, the adds that end a residual block and an up block, each one pass with the conv's bias folded
in (`add_bias_residual_`, `add_bias_dup_up_`), and the up block's end read from the four sub-pixel phases
of an upsampling conv (`add_bias_dup_up_phases`, which interleaves them as it reads: no pass of its own).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from cosmos3_kernels.qk_norm_rope import _round_to  # round to nearest even by integer ops (the cast truncates or folds)


def _channel_bias(bias: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    return bias.reshape(1, -1, *([1] * (x.dim() - 2)))


def norm_silu_reference(x: torch.Tensor, gamma: torch.Tensor, scale: float,
                        bias: torch.Tensor | None = None, *, one_rounding: bool = False) -> torch.Tensor:
    """diffusers' WanRMS_norm (channel-first, no bias) then SiLU, op for op. x: [B, C, T, H, W]; `bias`:
    the producing conv's bias, added first as PyTorch's conv adds it (in the activation dtype).
    `one_rounding`: the same in fp32 throughout (the bias too), rounded once to x's dtype at the end."""
    if one_rounding:
        y = x.float() + (_channel_bias(bias, x).float() if bias is not None else 0.0)
        y = F.normalize(y, dim=1) * scale * _channel_bias(gamma, x).float()
        return F.silu(y).to(x.dtype)
    if bias is not None:
        x = x + _channel_bias(bias, x)
    normalized = F.normalize(x.float(), dim=1).to(x.dtype)
    return F.silu(normalized * scale * gamma)


@triton.jit
def _positions(n_pos, n_ch, T, H, W, BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr):
    """This program's BLOCK_P positions of a [B, C, T, H, W] activation as (b, t, h, w), every channel of
    each (`ch`), and the mask of those in bounds."""
    pos = tl.program_id(0).to(tl.int64) * BLOCK_P + tl.arange(0, BLOCK_P)
    w = pos % W
    rest = pos // W
    h = rest % H
    rest = rest // H
    t = rest % T
    b = rest // T
    ch = tl.arange(0, BLOCK_C)
    return b, t, h, w, ch, (pos < n_pos)[:, None] & (ch < n_ch)[None, :]


# Triton compiles a kernel once per pattern of its integer arguments (each one's divisibility by 16, and
# whether it is 1). The sizes below only feed index arithmetic, and they change with the resolution and
# the chunk (a first chunk has one frame), so left specialised they made every new video size compile
# its own copies on the user's request (measured on the H200: a 480p decode after a 720p one compiled 33
# more kernels and took 9.8 s instead of 1.65; now 2.6 s, and the warm decode is unchanged). The strides
# keep their specialisation: in the decode's channels-last layout they are multiples of the channel count,
# so theirs does not change with the size, and it is what lets a row load vectorise.
SIZE_ARGS = ["n_pos", "T", "H", "W"]


def _launch(x: torch.Tensor) -> tuple[tuple[int], dict]:
    """Grid and launch options for a kernel over x's positions, all channels of a position in one program."""
    b, c, t, h, w = x.shape
    block_c = triton.next_power_of_2(c)
    block_p = max(1, min(64, 4096 // block_c))
    grid = (triton.cdiv(b * t * h * w, block_p),)
    return grid, dict(BLOCK_P=block_p, BLOCK_C=block_c, num_warps=4 if block_c * block_p <= 2048 else 8)


@triton.jit(do_not_specialize=SIZE_ARGS)
def _norm_silu_kernel(
    x_ptr, g_ptr, bias_ptr, out_ptr,
    n_pos, n_ch, T, H, W,
    sxb, sxt, sxh, sxw, sob, sot, soh, sow,
    scale,
    BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr, HAS_BIAS: tl.constexpr, ONE_ROUNDING: tl.constexpr,
):
    # BLOCK_P positions per program, all channels of each (channels are contiguous: channels-last).
    DTYPE: tl.constexpr = out_ptr.dtype.element_ty
    b, t, h, w, ch, mask = _positions(n_pos, n_ch, T, H, W, BLOCK_P, BLOCK_C)
    x_off = (b * sxb + t * sxt + h * sxh + w * sxw)[:, None] + ch[None, :]
    x = tl.load(x_ptr + x_off, mask=mask, other=0.0).to(tl.float32)
    gamma = tl.load(g_ptr + ch, mask=ch < n_ch, other=0.0).to(tl.float32)
    if ONE_ROUNDING:
        # fp32 throughout, one rounding at the store: the exact-rounding steps below (integer round-to-nearest-even
        # and IEEE division per element) are what made this kernel issue-bound at ~1 TB/s.
        if HAS_BIAS:
            x = x + tl.load(bias_ptr + ch, mask=ch < n_ch, other=0.0).to(tl.float32)[None, :]
        factor = scale / tl.maximum(tl.sqrt(tl.sum(x * x, axis=1)), 1e-12)  # one division a position
        y = x * factor[:, None] * gamma[None, :]
        y = _round_to(y / (1.0 + tl.exp(-y)), DTYPE)  # (the interpreter's store cast would truncate)
    else:
        if HAS_BIAS:  # the conv's bias, rounded in as its own pass would
            x = _round_to(x + tl.load(bias_ptr + ch, mask=ch < n_ch, other=0.0).to(tl.float32)[None, :], DTYPE)
        norm = tl.maximum(tl.sqrt_rn(tl.sum(x * x, axis=1)), 1e-12)  # F.normalize: x / max(||x||, eps)
        y = _round_to(tl.div_rn(x, norm[:, None]), DTYPE)
        y = _round_to(y * scale, DTYPE)
        y = _round_to(y * gamma[None, :], DTYPE)
        y = _round_to(tl.div_rn(y, 1.0 + tl.exp(-y)), DTYPE)
    out_off = (b * sob + t * sot + h * soh + w * sow)[:, None] + ch[None, :]
    tl.store(out_ptr + out_off, y.to(DTYPE), mask=mask)


def norm_silu_into(x: torch.Tensor, gamma: torch.Tensor, scale: float, out: torch.Tensor,
                   bias: torch.Tensor | None = None, *, one_rounding: bool = False) -> torch.Tensor:
    """out[...] = SiLU(WanRMS_norm(x + bias)); x and out [B, C, T, H, W] with channels contiguous (stride 1).

    `out` may be a strided view (the interior of a padded buffer). gamma: C values (any shape); bias: C
    values or None. `one_rounding`: fp32 throughout and one rounding (`norm_silu_reference`'s), instead of
    diffusers' roundings.
    """
    if x.shape != out.shape or x.stride(1) != 1 or out.stride(1) != 1 or x.dtype != out.dtype:
        raise ValueError(f"norm_silu_into: x {tuple(x.shape)} {x.stride()} {x.dtype} and out "
                         f"{tuple(out.shape)} {out.stride()} {out.dtype} need equal shapes, dtypes and "
                         "channel stride 1 (channels-last-3d)")
    b, c, t, h, w = x.shape
    gamma = gamma.reshape(-1).contiguous()
    grid, launch = _launch(x)
    _norm_silu_kernel[grid](
        x, gamma, gamma if bias is None else _bias_values(bias, c, x.dtype), out, b * t * h * w, c, t, h, w,
        x.stride(0), x.stride(2), x.stride(3), x.stride(4),
        out.stride(0), out.stride(2), out.stride(3), out.stride(4),
        float(scale), HAS_BIAS=bias is not None, ONE_ROUNDING=one_rounding, **launch,
    )
    return out


def _bias_values(bias: torch.Tensor, channels: int, dtype: torch.dtype) -> torch.Tensor:
    if bias.numel() != channels or bias.dtype != dtype:
        raise ValueError(f"bias: {channels} values of {dtype} needed (one per channel), got "
                         f"{bias.numel()} of {bias.dtype}")
    return bias.reshape(-1).contiguous()


def add_bias_residual_reference(x: torch.Tensor, bias: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
    """(x + bias) + residual as PyTorch runs a residual block's end: the conv's bias pass, then the add."""
    return (x + _channel_bias(bias, x)) + residual


@triton.jit(do_not_specialize=SIZE_ARGS)
def _add_bias_residual_kernel(
    x_ptr, bias_ptr, r_ptr,
    n_pos, n_ch, T, H, W,
    sxb, sxc, sxt, sxh, sxw, srb, src, srt, srh, srw,
    BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr,
):
    DTYPE: tl.constexpr = x_ptr.dtype.element_ty
    b, t, h, w, ch, mask = _positions(n_pos, n_ch, T, H, W, BLOCK_P, BLOCK_C)
    x_off = (b * sxb + t * sxt + h * sxh + w * sxw)[:, None] + (ch * sxc)[None, :]
    r_off = (b * srb + t * srt + h * srh + w * srw)[:, None] + (ch * src)[None, :]
    x = tl.load(x_ptr + x_off, mask=mask, other=0.0).to(tl.float32)
    bias = tl.load(bias_ptr + ch, mask=ch < n_ch, other=0.0).to(tl.float32)
    y = _round_to(x + bias[None, :], DTYPE)
    y = _round_to(y + tl.load(r_ptr + r_off, mask=mask, other=0.0).to(tl.float32), DTYPE)
    tl.store(x_ptr + x_off, y.to(DTYPE), mask=mask)


def add_bias_residual_(x: torch.Tensor, bias: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
    """x = (x + bias) + residual in place, one pass, each add rounded to x's dtype (the reference's two
    passes bit for bit). x and residual [B, C, T, H, W], any strides (channels-last-3d is the fast layout;
    x must not overlap itself); bias: C values."""
    if x.shape != residual.shape or x.dim() != 5 or x.dtype != residual.dtype:
        raise ValueError(f"add_bias_residual_: x {tuple(x.shape)} {x.dtype} and residual "
                         f"{tuple(residual.shape)} {residual.dtype} need equal 5-D shapes and dtypes")
    b, c, t, h, w = x.shape
    grid, launch = _launch(x)
    _add_bias_residual_kernel[grid](
        x, _bias_values(bias, c, x.dtype), residual, b * t * h * w, c, t, h, w,
        *x.stride(), *residual.stride(), **launch,
    )
    return x


def add_bias_dup_up_reference(x: torch.Tensor, bias: torch.Tensor | None, skip: torch.Tensor, shortcut,
                              first_chunk: bool) -> torch.Tensor:
    """A Wan2.2 up block's end as diffusers runs it: the upsampler conv's bias pass, then the residual add of
    its `avg_shortcut` (a `DupUp3D`: channels repeated and unfolded into time and space) of the block's input."""
    if bias is not None:
        x = x + _channel_bias(bias, x)
    return x + shortcut(skip, first_chunk=first_chunk)


@triton.jit(do_not_specialize=SIZE_ARGS + ["skip_t"])
def _add_bias_dup_up_kernel(
    x_ptr, bias_ptr, s_ptr, out_ptr,
    n_pos, n_ch, T, H, W,
    sxb, sxc, sxt, sxh, sxw, ssb, ssc, sst, ssh, ssw, sob, soc, sot, soh, sow,
    skip_t, FT: tl.constexpr, FS: tl.constexpr, REPEATS: tl.constexpr,
    BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr, HAS_BIAS: tl.constexpr, PHASES: tl.constexpr,
):
    DTYPE: tl.constexpr = out_ptr.dtype.element_ty
    b, t, h, w, ch, mask = _positions(n_pos, n_ch, T, H, W, BLOCK_P, BLOCK_C)
    out_off = (b * sob + t * sot + h * soh + w * sow)[:, None] + (ch * soc)[None, :]
    if PHASES:  # x holds the four sub-pixel phases (`interleave_phases`): (h, w) reads phase (h % 2, w % 2)
        ph = h % 2
        pw = w % 2
        x_pos = b * sxb + t * sxt + (h // 2 + ph) * sxh + (w // 2 + pw) * sxw
        x_off = x_pos[:, None] + (((ph * 2 + pw) * n_ch)[:, None] + ch[None, :]) * sxc
    else:
        x_off = (b * sxb + t * sxt + h * sxh + w * sxw)[:, None] + (ch * sxc)[None, :]
    # DupUp3D: output (co, t * FT + a, h * FS + p, w * FS + q) reads input channel
    # (((co * FT + a) * FS + p) * FS + q) // REPEATS at (t, h, w); a first chunk drops its first FT - 1 frames.
    full_t = t + skip_t
    a = full_t % FT
    p = h % FS
    q = w % FS
    j = ((ch[None, :] * FT + a[:, None]) * FS + p[:, None]) * FS + q[:, None]
    s_off = (b * ssb + (full_t // FT) * sst + (h // FS) * ssh + (w // FS) * ssw)[:, None] + (j // REPEATS) * ssc
    y = tl.load(x_ptr + x_off, mask=mask, other=0.0).to(tl.float32)
    if HAS_BIAS:
        y = _round_to(y + tl.load(bias_ptr + ch, mask=ch < n_ch, other=0.0).to(tl.float32)[None, :], DTYPE)
    y = _round_to(y + tl.load(s_ptr + s_off, mask=mask, other=0.0).to(tl.float32), DTYPE)
    tl.store(out_ptr + out_off, y.to(DTYPE), mask=mask)


def _check_dup_up(x_shape: tuple, dtype: torch.dtype, skip: torch.Tensor, shortcut, first_chunk: bool, name: str):
    """The shortcut's (factor_t, factor_s, repeats, skip_t), where x [B, Cout, T', H', W'] is its output for skip."""
    ft, fs = int(shortcut.factor_t), int(shortcut.factor_s)
    repeats = int(shortcut.repeats)
    b, c, t, h, w = x_shape
    skip_t = ft - 1 if first_chunk else 0
    expected = (b, shortcut.in_channels, (t + skip_t) // ft, h // fs, w // fs)
    if (tuple(skip.shape) != expected or (t + skip_t) % ft or h % fs or w % fs
            or c != shortcut.out_channels or c * ft * fs * fs != repeats * shortcut.in_channels or dtype != skip.dtype):
        raise ValueError(f"{name}: x {tuple(x_shape)} {dtype} is not the shortcut's output for skip "
                         f"{tuple(skip.shape)} {skip.dtype} (expected skip {expected}; factor_t {ft}, factor_s {fs}, "
                         f"repeats {repeats}, first_chunk {first_chunk})")
    return ft, fs, repeats, skip_t


def add_bias_dup_up_(x: torch.Tensor, bias: torch.Tensor | None, skip: torch.Tensor, shortcut,
                     first_chunk: bool) -> torch.Tensor:
    """x = (x + bias) + shortcut(skip) in place, one pass, for `shortcut` a diffusers `DupUp3D`: the kernel
    reads `skip` where the shortcut's repeat and unfold would have put each value, so neither copy is made.
    Each add rounds to x's dtype, as the reference's passes do (bit for bit). x [B, Cout, T', H', W'], skip
    [B, Cin, T, H, W]; any strides (channels-last-3d is the fast layout)."""
    if x.dim() != 5:
        raise ValueError(f"add_bias_dup_up_: x must be [B, C, T, H, W]; got shape {tuple(x.shape)}")
    ft, fs, repeats, skip_t = _check_dup_up(tuple(x.shape), x.dtype, skip, shortcut, first_chunk, "add_bias_dup_up_")
    b, c, t, h, w = x.shape
    grid, launch = _launch(x)
    _add_bias_dup_up_kernel[grid](
        x, x if bias is None else _bias_values(bias, c, x.dtype), skip, x, b * t * h * w, c, t, h, w,
        *x.stride(), *skip.stride(), *x.stride(), skip_t, FT=ft, FS=fs, REPEATS=repeats,
        HAS_BIAS=bias is not None, PHASES=False, **launch,
    )
    return x


def interleave_phases(phases: torch.Tensor) -> torch.Tensor:
    """The four sub-pixel phases of a 2x upsampled image as that image, channels-last.

    phases [B, 4C, T, H + 1, W + 1]: channel block 2a + b holds phase (a, b), whose value for output pixel
    (2i + a, 2j + b) sits at (i + a, j + b) (a 2x2 conv with padding 1 over the low-resolution input,
    `engine.pipeline.causal_decode.subpixel_weight`). Returns [B, C, T, 2H, 2W]."""
    b, c4, t, hp, wp = phases.shape
    c, h, w = c4 // 4, hp - 1, wp - 1
    out = torch.empty((b, c, t, 2 * h, 2 * w), dtype=phases.dtype, device=phases.device,
                      memory_format=torch.channels_last_3d)
    for a in range(2):
        for q in range(2):
            block = phases[:, (2 * a + q) * c:(2 * a + q + 1) * c, :, a:a + h, q:q + w]
            out[:, :, :, a::2, q::2].copy_(block)
    return out


def add_bias_dup_up_phases_reference(phases: torch.Tensor, bias: torch.Tensor | None, skip: torch.Tensor, shortcut,
                                     first_chunk: bool) -> torch.Tensor:
    """`add_bias_dup_up_reference` on the image that `phases` interleave into."""
    return add_bias_dup_up_reference(interleave_phases(phases), bias, skip, shortcut, first_chunk)


def add_bias_dup_up_phases(phases: torch.Tensor, bias: torch.Tensor | None, skip: torch.Tensor, shortcut,
                           first_chunk: bool) -> torch.Tensor:
    """`add_bias_dup_up_` on the image that `phases` [B, 4C, T, H + 1, W + 1] interleave into
    (`interleave_phases`), read where each pixel's phase holds it and written once, channels-last, to a new
    [B, C, T, 2H, 2W] tensor: the interleave costs no pass of its own. Bit for bit the reference."""
    if phases.dim() != 5 or phases.shape[1] % 4:
        raise ValueError(f"add_bias_dup_up_phases: phases must be [B, 4C, T, H + 1, W + 1]; got {tuple(phases.shape)}")
    b, c4, t, hp, wp = phases.shape
    shape = (b, c4 // 4, t, 2 * (hp - 1), 2 * (wp - 1))
    ft, fs, repeats, skip_t = _check_dup_up(shape, phases.dtype, skip, shortcut, first_chunk, "add_bias_dup_up_phases")
    out = torch.empty(shape, dtype=phases.dtype, device=phases.device, memory_format=torch.channels_last_3d)
    c, h, w = shape[1], shape[3], shape[4]
    grid, launch = _launch(out)
    _add_bias_dup_up_kernel[grid](
        phases, phases if bias is None else _bias_values(bias, c, phases.dtype), skip, out, b * t * h * w, c, t, h, w,
        *phases.stride(), *skip.stride(), *out.stride(), skip_t, FT=ft, FS=fs, REPEATS=repeats,
        HAS_BIAS=bias is not None, PHASES=True, **launch,
    )
    return out


__all__ = ["add_bias_dup_up_", "add_bias_dup_up_phases", "add_bias_dup_up_phases_reference",
           "add_bias_dup_up_reference", "add_bias_residual_", "add_bias_residual_reference", "interleave_phases",
           "norm_silu_into", "norm_silu_reference"]
