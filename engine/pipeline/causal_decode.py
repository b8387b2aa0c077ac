"""The Wan VAE decoder's causal loop, walked by the engine: several latent frames a step, fused work.

diffusers' `AutoencoderKLWan._decode` feeds the decoder one latent frame at a time; every causal 3-D
conv keeps its last two input frames in a feature cache (`feat_cache`), so a frame sees its past
without the whole clip in memory. This module walks the same modules with the same weights in the same
order, with the cache made explicit per conv, and three switchable changes (a `DecodePlan`):

- **temporal chunking** (`chunk`): after the first latent frame (which must stay alone: its upsample
  time conv is skipped, the "Rep" rule, and its residual shortcut drops the frames before it), `chunk`
  latent frames go through each conv at once. Every other op is frame-local and every causal conv
  sees the same zero-padded-then-cached past, so this is the same computation, in bigger convolutions;
- **fused norm + SiLU** (`elementwise="triton"`): the RMS norm and SiLU before each 3x3x3 conv are one
  Triton kernel (`cosmos3_kernels.wan_norm`) that writes straight into the conv's zero-bordered input buffer, so
  the cache concatenation and the spatial padding copy nothing but the two cached frames (one read and
  one write of the activation instead of about ten full-resolution passes); `elementwise="compile"`
  is the same fusion by `torch.compile` (measured slower, and it compiles for about a minute);
- **stacked time taps** (`conv="2d"`): a 3x3x3 conv as a 3x3 conv2d over the three time taps stacked
  into channels (cuDNN's 2-D NHWC kernels instead of its 3-D ones);
- **the norm in fp32** (`norm_fp32`, with the Triton kernel): the fused norm + SiLU keeps fp32 throughout and
  rounds once, where diffusers rounds the normalised value, the scale and gamma products and the SiLU output
  each to bf16. Reproducing those roundings (integer round-to-nearest-even and IEEE divisions per value) made
  the kernel issue-bound at about 1 TB/s; one rounding is also the closer to an fp32 decode. Not the same
  bytes: a documented difference, like the sub-pixel upsamplers below;
- **folded biases** (`fold_bias`, with the Triton kernels): a residual block's two 3x3x3 convs run
  without their biases; the first's is added as the next norm reads it, the second's with the residual
  add (`cosmos3_kernels.wan_norm`). PyTorch adds a cuDNN conv's bias in a pass of its own, so this saves a read
  and a write of the activation per conv, and rounds where that pass rounds: the same bytes as without.
  In an up block the same plan adds the upsampler conv's bias with the `avg_shortcut` residual in one
  kernel that reads the shortcut's input where diffusers' `DupUp3D` would have repeated and unfolded it
  (two copies and a mixed-layout add fewer), and the time conv's bias as its two halves are interleaved
  into frames, written channels-last (diffusers' stack writes them channels-first, which costs the
  following upsample and conv2d a layout conversion each). Still the same bytes;
- **sub-pixel upsampling** (`upsample="subpixel"`, with the fused kernels): an upsampler's 2x nearest
  upsample then 3x3 conv is four 2x2 convs over the low-resolution input, one per output pixel phase
  (`subpixel_weight`), run as one conv2d with four times the output channels. That is 16 weight taps per
  four output pixels instead of 36: 56% fewer of the upsample convs' FLOPs, and no upsampled copy of the
  input. The phases are interleaved by the kernel that ends the up block (`add_bias_dup_up_phases`), or
  by one copy (`interleave_phases`) where there is no such kernel. Its weights are sums of the 3x3 conv's
  weights rounded once to bf16, so this plan is not the same bytes: it is a documented difference,
  gated against an fp32 decode (docs/perf-log/2026-12-02.md, VAE decode).

Why the cache is always two zero frames at first: diffusers pads the first chunk's input with zeros
(no cache yet) and a one-frame chunk's cache with a zero frame ("Rep" for the upsample's time conv),
so a cache that starts as two zero frames gives each conv exactly the input diffusers gives it.
`DecodePlan()` (one frame a step, eager ops, conv3d) is diffusers' decode op for op
(tests/unit/pipeline/test_causal_decode.py checks it bit for bit); the others are bf16-close, measured in
docs/perf-log/2026-12-02.md (VAE decode). The fast path uses `VIDEO_PLAN` for videos (`plan_for`, the measured rule).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Iterator, NamedTuple

import torch
import torch.nn.functional as F

from cosmos3_kernels.wan_norm import (add_bias_dup_up_, add_bias_dup_up_phases, add_bias_residual_, interleave_phases,
                               norm_silu_into, norm_silu_reference)

ELEMENTWISE = ("eager", "compile", "triton")
CONVS = ("3d", "2d")
UPSAMPLES = ("nearest", "subpixel")


@dataclass(frozen=True)
class DecodePlan:
    chunk: int = 1  # latent frames per causal step after the first
    elementwise: str = "eager"
    conv: str = "3d"
    fold_bias: bool = False  # a residual block's conv biases into its kernels (needs elementwise="triton")
    upsample: str = "nearest"  # "subpixel": an upsampler's nearest 2x + 3x3 conv as four 2x2 phase convs
    norm_fp32: bool = False  # the fused norm + SiLU in fp32, rounded once (needs elementwise="triton")

    def __post_init__(self):
        if (self.chunk < 1 or self.elementwise not in ELEMENTWISE or self.conv not in CONVS
                or self.upsample not in UPSAMPLES):
            raise ValueError(f"DecodePlan: chunk >= 1, elementwise in {ELEMENTWISE}, conv in {CONVS}, upsample in "
                             f"{UPSAMPLES}; got {self}")
        if self.fold_bias and self.elementwise != "triton":
            raise ValueError(f"DecodePlan: fold_bias needs elementwise='triton' (its kernels add the biases); got {self}")
        if self.norm_fp32 and self.elementwise != "triton":
            raise ValueError(f"DecodePlan: norm_fp32 needs elementwise='triton' (its kernel runs it); got {self}")
        if self.upsample == "subpixel" and self.elementwise == "eager":
            raise ValueError(f"DecodePlan: upsample='subpixel' needs a fused plan (elementwise 'triton' or "
                             f"'compile'); got {self}")


# Output row 2i + a of a 2x nearest upsample then a 3x3 conv (padding 1) reads upsampled rows 2i + a - 1,
# 2i + a, 2i + a + 1, which are input rows (2i + a - 1) // 2, i, (2i + a + 1) // 2. A 2x2 conv with padding 1
# puts input rows i + a - 1 and i + a under its two taps at output row i + a, so phase a's taps are these sums
# of the 3x3 kernel's rows (the same for columns).
_PHASE_TAPS = (((1.0, 0.0, 0.0), (0.0, 1.0, 1.0)),   # a = 0: row i - 1 <- tap 0; row i <- taps 1 + 2
               ((1.0, 1.0, 0.0), (0.0, 0.0, 1.0)))   # a = 1: row i <- taps 0 + 1; row i + 1 <- tap 2


def subpixel_weight(weight: torch.Tensor) -> torch.Tensor:
    """A 3x3 conv's weight [O, I, 3, 3] after a 2x nearest upsample, as the four output phases' 2x2 kernels
    [4O, I, 2, 2] (block 2a + b: output pixels (2i + a, 2j + b)), each tap's sum taken in fp32 (or wider) and
    rounded once to the weight's dtype."""
    if weight.dim() != 4 or tuple(weight.shape[2:]) != (3, 3):
        raise ValueError(f"subpixel_weight: a 3x3 conv weight [O, I, 3, 3] is needed; got {tuple(weight.shape)}")
    exact = torch.promote_types(weight.dtype, torch.float32)  # sums of a few bf16 values: exact in fp32
    taps = torch.tensor(_PHASE_TAPS, dtype=exact, device=weight.device)  # [phase, 2, 3]
    phases = torch.einsum("aur,bvs,oirs->aboiuv", taps, taps, weight.to(exact))
    return phases.reshape(4 * weight.shape[0], weight.shape[1], 2, 2).to(weight.dtype)


def _upsamples_by_phases(upsample, conv) -> bool:
    """Whether an upsampler is the 2x nearest upsample then 3x3 'same' conv that `subpixel_weight` rewrites."""
    scale = upsample.scale_factor
    scale = tuple(float(s) for s in scale) if isinstance(scale, (tuple, list)) else (float(scale),) * 2
    return (scale == (2.0, 2.0) and upsample.mode in ("nearest", "nearest-exact")
            and isinstance(conv, torch.nn.Conv2d) and tuple(conv.kernel_size) == (3, 3)
            and tuple(conv.stride) == (1, 1) and tuple(conv.padding) == (1, 1) and tuple(conv.dilation) == (1, 1)
            and conv.groups == 1 and conv.padding_mode == "zeros")


class Phases(NamedTuple):
    """An upsampler's output as its four sub-pixel phases [B, 4C, T, H + 1, W + 1]
    (`cosmos3_kernels.wan_norm.interleave_phases`)."""

    tensor: torch.Tensor


def supports(vae) -> bool:
    """The walker knows diffusers' Wan decoder (2.1 and 2.2 up blocks); anything else decodes as before."""
    decoder = getattr(vae, "decoder", None)
    return type(decoder).__name__ == "WanDecoder3d" and not getattr(vae, "use_tiling", False)


def latent_steps(frames: int, chunk: int) -> list[tuple[int, int]]:
    """(start, stop) latent frame ranges: the first frame alone, then `chunk` at a time."""
    steps = [(0, 1)] if frames else []
    steps += [(start, min(start + chunk, frames)) for start in range(1, frames, chunk)]
    return steps


def _memory_format(x: torch.Tensor) -> torch.memory_format:
    return torch.channels_last_3d if not x.is_contiguous() and x.is_contiguous(
        memory_format=torch.channels_last_3d) else torch.contiguous_format


def _norm_silu(norm, act, x: torch.Tensor) -> torch.Tensor:
    """diffusers' WanRMS_norm then the block's SiLU, op for op (fp32 normalize, bf16 scale and gamma)."""
    return act(norm(x))


def _norm_silu_join(x: torch.Tensor, cache: torch.Tensor, gamma: torch.Tensor, scale: float, pad: int) -> torch.Tensor:
    """cat([cache, pad(SiLU(RMSnorm(x)))]) over time: the conv's whole input, written once (compiled)."""
    y = norm_silu_reference(x, gamma, scale)
    return torch.cat([cache, F.pad(y, (pad, pad, pad, pad, 0, 0))], dim=2)


_compiled_join = None


def _fused_join():
    global _compiled_join
    if _compiled_join is None:
        import torch._dynamo

        # One graph per (shape, channels): about six shapes per chunk length at a size.
        config = torch._dynamo.config
        name = "recompile_limit" if hasattr(config, "recompile_limit") else "cache_size_limit"
        setattr(config, name, max(getattr(config, name), 64))
        _compiled_join = torch.compile(_norm_silu_join, dynamic=False)
    return _compiled_join


class CausalDecoder:
    """One decode's walk over `vae.decoder`; `step` takes latent frames (after `post_quant_conv`)."""

    def __init__(self, vae, plan: DecodePlan):
        self.decoder, self.plan = vae.decoder, plan
        self.cache: dict[torch.nn.Module, torch.Tensor] = {}  # per causal conv: its padded last two input frames
        self.started: set[torch.nn.Module] = set()  # upsample3d modules past their first ("Rep") chunk
        self.stacked: dict[torch.nn.Module, torch.Tensor] = {}  # conv2d weights: stacked time taps, sub-pixel phases
        self.buffers: dict[tuple, torch.Tensor] = {}  # "triton": zero-bordered conv inputs, one per shape

    def step(self, x: torch.Tensor, first: bool) -> torch.Tensor:
        d = self.decoder
        x = self.conv(d.conv_in, x)
        x = self.mid_block(d.mid_block, x)
        for block in d.up_blocks:
            x = self.up_block(block, x, first)
        return self.norm_conv(d.norm_out, d.nonlinearity, d.conv_out, x)

    # -- blocks, as diffusers orders them -------------------------------------------------------

    def residual(self, block, x: torch.Tensor) -> torch.Tensor:
        h = block.conv_shortcut(x)  # Identity or a 1x1x1 conv: no temporal context, no cache
        if self._folds(block):
            x = self.norm_conv(block.norm1, block.nonlinearity, block.conv1, x, bias=False)
            x = self.norm_conv(block.norm2, block.nonlinearity, block.conv2, x, bias=False, bias_in=block.conv1.bias)
            return add_bias_residual_(x, block.conv2.bias, h)
        x = self.norm_conv(block.norm1, block.nonlinearity, block.conv1, x)
        # (diffusers' dropout sits between norm2 and conv2: the identity in eval mode, where decode runs)
        x = self.norm_conv(block.norm2, block.nonlinearity, block.conv2, x)
        return x + h

    def _folds(self, block) -> bool:
        """Whether this residual block takes the folded biases: the plan says so, and both convs are causal
        3x3x3 convs with biases that the fused norm path runs (`norm_conv`)."""
        return self.plan.fold_bias and all(isinstance(conv.bias, torch.Tensor) and self._fused_norm(norm, conv)
                   for norm, conv in ((block.norm1, block.conv1), (block.norm2, block.conv2)))

    def mid_block(self, block, x: torch.Tensor) -> torch.Tensor:
        x = self.residual(block.resnets[0], x)
        for attention, resnet in zip(block.attentions, block.resnets[1:]):
            x = self.residual(resnet, attention(x) if attention is not None else x)
        return x

    def up_block(self, block, x: torch.Tensor, first: bool) -> torch.Tensor:
        shortcut = getattr(block, "avg_shortcut", None)  # Wan2.2's residual up block
        skip = x
        for resnet in block.resnets:
            x = self.residual(resnet, x)
        upsampler = getattr(block, "upsampler", None)
        if upsampler is None and getattr(block, "upsamplers", None) is not None:
            upsampler = block.upsamplers[0]
        fold = shortcut is not None and self._folds_shortcut(shortcut, upsampler)
        if upsampler is not None:
            x = self.resample(upsampler, x, bias=not fold)
        if fold:  # the upsampler conv's bias and the shortcut in one pass (interleaving the phases as it reads)
            bias = None if upsampler is None else upsampler.resample[1].bias
            if isinstance(x, Phases):
                return add_bias_dup_up_phases(x.tensor, bias, skip, shortcut, first)
            return add_bias_dup_up_(x, bias, skip, shortcut, first)
        return x if shortcut is None else x + shortcut(skip, first_chunk=first)

    def _folds_shortcut(self, shortcut, upsampler) -> bool:
        """Whether an up block ends in one kernel (`add_bias_dup_up_`): the plan folds, the shortcut is a
        `DupUp3D`, and the upsampler (if any) is an upsampling conv the fast path runs itself."""
        if not self.plan.fold_bias or type(shortcut).__name__ != "DupUp3D":
            return False
        return upsampler is None or self._runs_upsample_conv(upsampler)

    def _runs_upsample_conv(self, up) -> bool:
        """Whether `resample` runs this upsampler's conv itself (and so can leave its bias out)."""
        conv = up.resample[1] if up.mode.startswith("upsample") else None
        return isinstance(conv, torch.nn.Conv2d) and conv.padding_mode == "zeros"

    def resample(self, up, x: torch.Tensor, bias: bool = True) -> torch.Tensor | Phases:
        """diffusers' WanResample (upsampling) on x; without the conv's bias where `bias` is False (the caller
        adds it: `up_block`, only when `_runs_upsample_conv` holds, with the kernel that also interleaves a
        sub-pixel plan's output, returned then as its `Phases`)."""
        b, c, t, h, w = x.shape
        if up.mode == "upsample3d":
            if up not in self.started:  # diffusers' "Rep": the first chunk skips the time conv
                self.started.add(up)
            elif self.plan.fold_bias:
                x = self._time_frames(self.conv(up.time_conv, x, bias=False), up.time_conv.bias)
            else:
                y = self.conv(up.time_conv, x).reshape(b, 2, c, t, h, w)
                x = torch.stack((y[:, 0], y[:, 1]), 3).reshape(b, c, t * 2, h, w)
        t = x.shape[2]
        x = x.permute(0, 2, 1, 3, 4).reshape(b * t, c, h, w)
        if self.plan.elementwise != "eager" and up.mode.startswith("upsample"):
            # Nearest upsampling copies values, so bf16 gives diffusers' fp32 round trip bit for bit.
            upsample, conv = up.resample
            if self.plan.upsample == "subpixel" and _upsamples_by_phases(upsample, conv):
                out = self._phase_conv(conv, x).view(b, t, 4 * conv.out_channels, h + 1, w + 1).permute(0, 2, 1, 3, 4)
                if not bias:
                    return Phases(out)
                out = interleave_phases(out)
                return out + conv.bias.view(1, -1, 1, 1, 1) if conv.bias is not None else out
            x = F.interpolate(x, scale_factor=upsample.scale_factor, mode=upsample.mode)
            x = conv(x) if bias else F.conv2d(x, conv.weight, None, conv.stride, conv.padding, conv.dilation, conv.groups)
        else:
            x = up.resample(x)
        return x.view(b, t, x.size(1), x.size(2), x.size(3)).permute(0, 2, 1, 3, 4)

    @staticmethod
    def _time_frames(y: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """The time conv's output [b, 2c, t, h, w] (without its bias) as 2t frames [b, c, 2t, h, w]: frame 2i + k
        is channels [kc, (k+1)c) of step i plus their bias, as diffusers' reshape and stack order them, each
        value rounded once as the bias pass rounds it; written channels-last."""
        b, c2, t, h, w = y.shape
        c = c2 // 2
        out = torch.empty((b, c, 2 * t, h, w), dtype=y.dtype, device=y.device, memory_format=torch.channels_last_3d)
        for k in range(2):
            half = y[:, k * c:(k + 1) * c]
            if bias is None:
                out[:, :, k::2].copy_(half)
            else:
                torch.add(half, bias[k * c:(k + 1) * c].view(1, -1, 1, 1, 1), out=out[:, :, k::2])
        return out

    def _phase_conv(self, conv, x: torch.Tensor) -> torch.Tensor:
        """The four sub-pixel phases of conv(upsample(x)), without its bias: [N, 4O, H + 1, W + 1]."""
        weight = self.stacked.get(conv)
        if weight is None:
            weight = subpixel_weight(conv.weight).contiguous(memory_format=torch.channels_last)
            self.stacked[conv] = weight
        return F.conv2d(x, weight, None, 1, 1)

    # -- causal convolutions ---------------------------------------------------------------------

    def _fused_norm(self, norm, conv) -> bool:
        """Whether `norm_conv` runs this norm and conv fused (else diffusers' ops); a norm with a bias is not
        in Wan's decoder, so it keeps diffusers' ops."""
        return not (self.plan.elementwise == "eager" or conv._padding[4] == 0 or isinstance(norm.bias, torch.Tensor))

    def norm_conv(self, norm, act, conv, x: torch.Tensor, bias: bool = True,
                  bias_in: torch.Tensor | None = None) -> torch.Tensor:
        """conv(SiLU(norm(x + bias_in))) with the conv's cache; without its bias when `bias` is False (the
        caller adds it). `bias_in` and `bias=False` only where `_fused_norm` holds (`residual` checks)."""
        if not self._fused_norm(norm, conv):
            return self.conv(conv, _norm_silu(norm, act, x))
        pad = conv._padding[0]
        cache = self._cache(conv, x, pad)
        gamma = norm.gamma
        if self.plan.elementwise == "compile":
            return self._conv_joined(conv, _fused_join()(x, cache, gamma, float(norm.scale), pad), bias)
        b, c, t, h, w = x.shape
        frames = cache.shape[2]
        key = (b, c, frames + t, h + 2 * pad, w + 2 * pad, x.dtype)
        joined = self.buffers.get(key)
        if joined is None:  # borders stay zero: only the cache frames and the interior are written
            joined = x.new_zeros(key[:5]).contiguous(memory_format=torch.channels_last_3d)
            self.buffers[key] = joined
        joined[:, :, :frames].copy_(cache)
        norm_silu_into(x.contiguous(memory_format=torch.channels_last_3d), gamma, float(norm.scale),
                       joined[:, :, frames:, pad:pad + h, pad:pad + w], bias=bias_in,
                       one_rounding=self.plan.norm_fp32)
        return self._conv_joined(conv, joined, bias)

    def conv(self, conv, x: torch.Tensor, bias: bool = True) -> torch.Tensor:
        """A WanCausalConv3d on x with its cached past: diffusers' cat + zero pad, then conv3d (without its
        bias where `bias` is False: the caller adds it)."""
        if conv._padding[4] == 0:
            if not bias:  # only the time conv drops its bias, and it always has a causal past
                raise ValueError(f"CausalDecoder.conv: bias=False needs a conv with a time padding; got {conv}")
            return conv(x)
        pad = conv._padding[0]
        joined = torch.cat([self._cache(conv, x, pad), F.pad(x, (pad, pad, pad, pad, 0, 0))], dim=2)
        return self._conv_joined(conv, joined, bias)

    def _cache(self, conv, x: torch.Tensor, pad: int) -> torch.Tensor:
        cache = self.cache.get(conv)
        if cache is None:
            b, c, _, h, w = x.shape
            shape = (b, c, conv._padding[4], h + 2 * pad, w + 2 * pad)
            cache = x.new_zeros(shape).contiguous(memory_format=_memory_format(x))
        return cache

    def _conv_joined(self, conv, joined: torch.Tensor, bias: bool = True) -> torch.Tensor:
        """Conv over the padded [cache, x] input (without its bias where `bias` is False); the new cache is
        its last frames."""
        self.cache[conv] = joined[:, :, -conv._padding[4]:].clone()
        if self.plan.conv == "2d" and tuple(conv.kernel_size) == (3, 3, 3) and tuple(conv.stride) == (1, 1, 1):
            return self._conv_stacked(conv, joined, bias)
        return F.conv3d(joined, conv.weight, conv.bias if bias else None, conv.stride, 0, conv.dilation, conv.groups)

    def _conv_stacked(self, conv, joined: torch.Tensor, bias: bool = True) -> torch.Tensor:
        """3x3x3 conv = 3x3 conv2d over [x_t-2, x_t-1, x_t] stacked on channels (one gather copy)."""
        weight = self.stacked.get(conv)
        if weight is None:  # [out, in, kt, kh, kw] -> [out, kt*in, kh, kw], NHWC like the input
            out_c, in_c = conv.weight.shape[:2]
            weight = conv.weight.permute(0, 2, 1, 3, 4).reshape(out_c, 3 * in_c, 3, 3)
            weight = weight.contiguous(memory_format=torch.channels_last)
            self.stacked[conv] = weight
        b, c, tp, hp, wp = joined.shape
        t = tp - 2
        taps = joined.unfold(2, 3, 1)  # [b, c, t, hp, wp, 3]
        stacked = taps.permute(0, 2, 3, 4, 5, 1).reshape(b * t, hp, wp, 3 * c).permute(0, 3, 1, 2)
        out = F.conv2d(stacked, weight, conv.bias if bias else None)
        return out.view(b, t, out.shape[1], out.shape[2], out.shape[3]).permute(0, 2, 1, 3, 4)


# The measured rule (docs/perf-log/2026-12-02.md, VAE decode; `python3 bench/bench_vae.py` on the H200, 2026-12-01):
# the decode stage at 1280x720/189f took 9.11 s today (channels-last, one latent frame a step), 6.93 s with
# the fused norm + SiLU kernel, 7.07 s with it and 4 frames a step, 10.01 s with 4 frames a step alone, 7.93 s
# with the stacked-tap conv2d, 8.22 s with torch.compile's fusion (plus 55 s of compiling); at 832x480/121f
# 2.53 s today, 1.89 s fused. So a video decodes one latent frame a step with the fused kernel; an image
# (one latent frame, not measured) keeps diffusers' decoder and its bit-for-bit bytes. The folded biases
# change no byte (they round where PyTorch's bias pass rounds) and took the same stage to 5.86 s at 720p and
# 1.65 s at 480p (b126671, docs/perf-log/2026-12-02.md). The sub-pixel upsamplers take 121 of the 891 TFLOP of an
# 832x480/121f decode down to 54 and drop three upsampled copies a step (FlopCounterMode on the Wan2.2
# decoder); `COSMOS3_VAE_SUBPIXEL=0` keeps the nearest upsample and the bytes above. The norm in fp32 drops the
# per-value rounding steps that made its kernel issue-bound (`COSMOS3_VAE_NORM_FP32=0` keeps them). With both the
# stage took 5.26 s at 720p and 1.46 s at 480p against 5.89 and 1.65 s without (3cf6648), and its output lands
# closer to an fp32 decode than diffusers' bf16 decode does (RMS 3.60e-3 against 4.06e-3).
VIDEO_PLAN = DecodePlan(elementwise="triton", fold_bias=True, upsample="subpixel", norm_fp32=True)


def plan_for(vae, latent_shape: tuple, device_type: str, options) -> DecodePlan | None:
    """The fast path's decode plan for latents of `latent_shape` [B, C, T, h, w]; None = diffusers' loop."""
    if not (options.enabled and options.vae_fast_decode) or device_type != "cuda":
        return None
    if latent_shape[2] < 2 or not supports(vae):
        return None
    return replace(VIDEO_PLAN, upsample=VIDEO_PLAN.upsample if options.vae_subpixel else "nearest",
                   norm_fp32=VIDEO_PLAN.norm_fp32 and options.vae_norm_fp32)


def decoded_chunks(vae, z: torch.Tensor, plan: DecodePlan) -> Iterator[torch.Tensor]:
    """Normalised-back latents [1, C, T, h, w] -> the decoder's clamped output, one causal step at a time.

    Each item is [B, 3, frames, H, W] on [-1, 1] (unpatchified), in the order diffusers' decode
    concatenates them.
    """
    from diffusers.models.autoencoders.autoencoder_kl_wan import unpatchify

    patch = vae.config.patch_size
    x = vae.post_quant_conv(z)
    walker = CausalDecoder(vae, plan)
    for start, stop in latent_steps(x.shape[2], plan.chunk):
        out = walker.step(x[:, :, start:stop], first=start == 0)
        if patch is not None:
            out = unpatchify(out, patch_size=patch)
        yield torch.clamp(out, min=-1.0, max=1.0)


__all__ = ["VIDEO_PLAN", "CausalDecoder", "DecodePlan", "Phases", "decoded_chunks", "latent_steps", "plan_for",
           "subpixel_weight", "supports"]
