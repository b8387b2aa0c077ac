"""Fused per-head QK RMSNorm + NeoX rotary + K/V packing for the gen tower, with its PyTorch reference.

What the split path (diffusers' ``Cosmos3AttnProcessor``) does every step, per layer:

    q = norm_added_q(q); k = norm_added_k(k)            # RMSNorm over head_dim, ~8 kernels each
    q = q * cos + rotate_half(q) * sin                  # 5 kernels each (mul, neg, cat, mul, add)
    all_k = cat([k_prefix, k]); all_v = cat([v_prefix, v])   # re-copies the whole prefix every step

Each of those kernels reads and writes the full activation, so the split path moves the q/k activations
through HBM roughly 20 times, plus a copy of the prefix. The fused kernel reads q, k, v and the cos/sin
tables once, writes q and the gen rows of the packed ``[prefix | gen]`` K/V buffer once, and never
touches the prefix (see ``cosmos3_kernels/packed_kv.py``). Bytes moved (Nano, 44160 gen tokens, one branch):
q 2x362 MB, k and v 2x90 MB each, cos/sin 23 MB: ~1.1 GB, ~0.26 ms at the 4.3 TB/s copy ceiling.

Bit-exactness (``round_norm_before_rope=True``): the split path in bf16 rounds after every op. The
kernel reproduces each rounding (norm output, each rotary product, the sum) with round-to-nearest-even,
and it adds the 128 squares of the variance in exactly the order that PyTorch's CUDA reduction uses.
That order depends on the PyTorch build (vectorised loads or not, warp shuffles ascending or
descending), so ``torch_reduce_order`` probes it once per device and the kernel takes it as a
compile-time parameter. Without the option, norm and rotary stay in fp32 and round once at the store:
more accurate than the split path, not identical to it.
"""
from __future__ import annotations

import enum
import math

import torch
import triton
import triton.language as tl

from cosmos3_kernels import registry
from cosmos3_kernels.packed_kv import PackedKVLayout

FLAVOURS = ("diffusers", "nemotron")


class ReduceOrder(enum.IntEnum):
    """Order in which a row of 128 squares is summed (see ``torch_reduce_order``).

    STRIDED: lane l of a warp first adds elements l, l+32, l+64, l+96 in sequence.
    VEC4:    lane l first adds the four contiguous elements 4l..4l+3 in sequence (vectorised loads).
    ADJACENT / HALVES: the 32 lane partials are then combined by warp shuffles with offsets 1, 2, 4, ...
    (neighbours first) or 16, 8, 4, ... (lane j with lane j+16 first).
    """

    STRIDED_ADJACENT = 0
    STRIDED_HALVES = 1
    VEC4_ADJACENT = 2
    VEC4_HALVES = 3


# Used where no probe is possible (CPU, the interpreter): the order of recent CUDA builds.
DEFAULT_REDUCE_ORDER = ReduceOrder.VEC4_HALVES


# --------------------------------------------------------------------------------------------------
# PyTorch reference: exactly the diffusers ops
# --------------------------------------------------------------------------------------------------
def _tree_sum_torch(x: torch.Tensor, adjacent: bool) -> torch.Tensor:
    while x.shape[-1] > 1:
        if adjacent:
            pairs = x.unflatten(-1, (x.shape[-1] // 2, 2))
            x = pairs[..., 0] + pairs[..., 1]
        else:
            halves = x.unflatten(-1, (2, x.shape[-1] // 2))
            x = halves[..., 0, :] + halves[..., 1, :]
    return x


def sum_of_squares_emulated(x: torch.Tensor, order: ReduceOrder) -> torch.Tensor:
    """Sum of squares over the last dim in the given lane order, with one fp32 op at a time.

    Each step is an elementwise fp32 add, so the result is the same on any device. The Triton kernel
    adds in the same order, which is what makes it comparable bit for bit on the CPU as well.
    """
    head_dim = x.shape[-1]
    if head_dim % 4 or head_dim & (head_dim - 1):
        raise ValueError(f"head_dim must be a power of two >= 4, got {head_dim}")
    sq = x.to(torch.float32) * x.to(torch.float32)
    quarters = sq.unflatten(-1, (4, head_dim // 4))
    s = [quarters[..., c, :] for c in range(4)]
    order = ReduceOrder(order)
    if order in (ReduceOrder.STRIDED_ADJACENT, ReduceOrder.STRIDED_HALVES):
        lanes = ((s[0] + s[1]) + s[2]) + s[3]
        return _tree_sum_torch(lanes, order == ReduceOrder.STRIDED_ADJACENT)
    chained = []
    for part in s:
        e = part.unflatten(-1, (part.shape[-1] // 4, 4))
        chained.append(((e[..., 0] + e[..., 1]) + e[..., 2]) + e[..., 3])
    if order == ReduceOrder.VEC4_ADJACENT:
        t = [_tree_sum_torch(c, True) for c in chained]
        return (t[0] + t[1]) + (t[2] + t[3])
    return _tree_sum_torch((chained[0] + chained[2]) + (chained[1] + chained[3]), False)


def _variance(x: torch.Tensor, reduce_order: ReduceOrder | None) -> torch.Tensor:
    if reduce_order is None:
        return x.to(torch.float32).pow(2).mean(-1, keepdim=True)  # what diffusers runs
    return sum_of_squares_emulated(x, reduce_order) * (1.0 / x.shape[-1])


def rms_norm_reference(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    flavour: str = "diffusers",
    reduce_order: ReduceOrder | None = None,
) -> torch.Tensor:
    """diffusers ``RMSNorm`` (flavour "diffusers") or ``Cosmos3NemotronRMSNorm`` ("nemotron"), op for op.

    ``reduce_order`` replaces ``mean`` by an emulated summation order (tests only); None is diffusers.
    """
    if flavour == "diffusers":
        variance = _variance(x, reduce_order)
        hidden = x * torch.rsqrt(variance + eps)
        if weight.dtype in (torch.float16, torch.bfloat16):
            hidden = hidden.to(weight.dtype)
        return hidden * weight
    if flavour == "nemotron":
        input_dtype = x.dtype
        hidden = x.float()
        variance = _variance(hidden, reduce_order)
        hidden = hidden * torch.rsqrt(variance + eps)
        return (weight.float() * hidden).to(input_dtype)
    raise ValueError(f"flavour must be one of {FLAVOURS}, got {flavour!r}")


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rope_reference(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """NeoX rotate-half rotary, as diffusers writes it; cos/sin broadcast over the head dim."""
    return x * cos + rotate_half(x) * sin


def _rope_tables_for_heads(table: torch.Tensor, batch: int) -> torch.Tensor:
    """[N, D] or [B|1, N, D] -> [B|1, N, 1, D] so it broadcasts over [B, N, H, D]."""
    if table.dim() == 2:
        return table[None, :, None, :]
    return table[:, :, None, :]


def qk_norm_rope_pack_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_weight: torch.Tensor,
    k_weight: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    kv_buffer: torch.Tensor,
    layout: PackedKVLayout,
    *,
    eps: float,
    flavour: str = "diffusers",
    q_out: torch.Tensor | None = None,
    reduce_order: ReduceOrder | None = None,
) -> torch.Tensor:
    """The split path: norm, rotary, then the gen rows of K/V copied into the packed buffer.

    Compile-safe (plain tensor ops), and the reference the fused kernel is checked against.
    """
    batch = q.shape[0]
    q_rot = apply_rope_reference(
        rms_norm_reference(q, q_weight, eps, flavour, reduce_order),
        _rope_tables_for_heads(cos, batch),
        _rope_tables_for_heads(sin, batch),
    )
    k_rot = apply_rope_reference(
        rms_norm_reference(k, k_weight, eps, flavour, reduce_order),
        _rope_tables_for_heads(cos, batch),
        _rope_tables_for_heads(sin, batch),
    )
    n_gen = layout.gen_len
    for b in range(batch):
        off = layout.gen_offset(b)
        kv_buffer[0, off : off + n_gen].copy_(k_rot[b])
        kv_buffer[1, off : off + n_gen].copy_(v[b])
    if q_out is None:
        return q_rot
    q_out.copy_(q_rot)
    return q_out


# --------------------------------------------------------------------------------------------------
# Which order does this PyTorch build reduce in?
# --------------------------------------------------------------------------------------------------
_PROBED_ORDERS: dict[str, ReduceOrder | None] = {}


def torch_reduce_order(device: torch.device | str) -> ReduceOrder | None:
    """The order in which ``x.float().pow(2).mean(-1)`` adds a row of 128 on ``device``; None if unknown.

    Probed once per device on data whose magnitudes span 12 binades, where every candidate order gives
    a different sum on most rows, then memoised. On the CPU PyTorch uses none of these orders (and the
    CPU path never runs the kernel outside tests), so the answer there is None.
    Call it before CUDA-graph capture: the probe synchronises once.
    """
    device = torch.device(device)
    if device.type != "cuda":
        return None
    key = str(device if device.index is not None else torch.device("cuda", torch.cuda.current_device()))
    if key not in _PROBED_ORDERS:
        gen = torch.Generator(device="cpu").manual_seed(20261129)
        scale = torch.exp2(torch.randint(-6, 7, (512, 128), generator=gen).float())
        probe = (torch.randn(512, 128, generator=gen) * scale).to(torch.bfloat16).to(key)
        torch_sum = probe.to(torch.float32).pow(2).mean(-1, keepdim=True) * 128.0  # exact: a power of two
        found = None
        for order in ReduceOrder:
            if torch.equal(sum_of_squares_emulated(probe, order), torch_sum):
                found = order
                break
        _PROBED_ORDERS[key] = found
    return _PROBED_ORDERS[key]


# --------------------------------------------------------------------------------------------------
# Triton kernel
# --------------------------------------------------------------------------------------------------
@triton.jit
def _round_fp16(x):
    """fp32 -> nearest-even fp16 value, as fp32, with integer ops (normal and subnormal range)."""
    mag = tl.abs(x).to(tl.int32, bitcast=True)
    # Normal range: keep 10 mantissa bits; a carry into the exponent is the right answer; past 65504: inf.
    normal = ((mag + ((mag >> 13) & 1) + 0xFFF) >> 13) << 13
    normal = tl.where(normal > 0x477FE000, 0x7F800000, normal)
    # Below 2**-14: multiples of 2**-24. sig >> shift counts them; round the dropped bits to nearest even.
    sig = (mag & 0x7FFFFF) | 0x800000
    shift = tl.minimum(126 - (mag >> 23), 25)
    quanta = sig >> shift
    rem = sig - (quanta << shift)
    half = (sig * 0 + 1) << (shift - 1)
    quanta += ((rem > half) | ((rem == half) & ((quanta & 1) == 1))).to(tl.int32)
    r = tl.where(mag < 0x38800000, quanta.to(tl.float32) * 5.9604644775390625e-08,
                 normal.to(tl.float32, bitcast=True))
    r = tl.where(x < 0, -r, r)
    return tl.where(x != x, x, r)


@triton.jit
def _round_to(x, DTYPE: tl.constexpr):
    """Round fp32 ``x`` to DTYPE (round to nearest even) and return it as fp32.

    Integer ops, not a cast round trip: on the GPU the compiler folds ``fp32 -> fp16 -> fp32`` away
    (seen on the H200: fp16 results off by one ulp), and the interpreter's fp32 -> bf16 cast truncates.
    """
    if DTYPE == tl.bfloat16:
        bits = x.to(tl.uint32, bitcast=True)
        bits = ((bits + ((bits >> 16) & 1) + 0x7FFF) >> 16) << 16
        y = tl.where(x != x, x, bits.to(tl.float32, bitcast=True))
    elif DTYPE == tl.float16:
        y = _round_fp16(x)
    else:
        y = x
    return y


@triton.jit
def _halve(x, BLOCK_T: tl.constexpr, WIDTH: tl.constexpr, ADJACENT: tl.constexpr):
    """One warp-shuffle step of a lane reduction: [BLOCK_T, WIDTH] -> [BLOCK_T, WIDTH // 2]."""
    if ADJACENT:  # lane 2j + lane 2j+1
        a, b = tl.split(tl.reshape(x, [BLOCK_T, WIDTH // 2, 2]))
    else:  # lane j + lane j + WIDTH/2
        a, b = tl.split(tl.permute(tl.reshape(x, [BLOCK_T, 2, WIDTH // 2]), (0, 2, 1)))
    return a + b


@triton.jit
def _lane_tree(x, BLOCK_T: tl.constexpr, WIDTH: tl.constexpr, LOG2_WIDTH: tl.constexpr, ADJACENT: tl.constexpr):
    for i in tl.static_range(LOG2_WIDTH):
        x = _halve(x, BLOCK_T, WIDTH >> i, ADJACENT)
    return tl.reshape(x, [BLOCK_T, 1])


@triton.jit
def _chain4(s, BLOCK_T: tl.constexpr, WIDTH: tl.constexpr):
    """Per lane, ((e0 + e1) + e2) + e3 over the four contiguous elements 4l..4l+3."""
    lo, hi = tl.split(tl.reshape(s, [BLOCK_T, WIDTH // 4, 2, 2]))
    e0, e2 = tl.split(lo)
    e1, e3 = tl.split(hi)
    return ((e0 + e1) + e2) + e3


@triton.jit
def _sum_of_squares(s0, s1, s2, s3, BLOCK_T: tl.constexpr, QW: tl.constexpr, LOG2_QW: tl.constexpr,
                    ORDER: tl.constexpr):
    """Row sums of the four quarter tiles of squares, added in ``ReduceOrder`` ORDER; [BLOCK_T, 1]."""
    if ORDER < 2:
        lanes = ((s0 + s1) + s2) + s3
        total = _lane_tree(lanes, BLOCK_T, QW, LOG2_QW, ORDER == 0)
    else:
        l0 = _chain4(s0, BLOCK_T, QW)
        l1 = _chain4(s1, BLOCK_T, QW)
        l2 = _chain4(s2, BLOCK_T, QW)
        l3 = _chain4(s3, BLOCK_T, QW)
        if ORDER == 2:
            t0 = _lane_tree(l0, BLOCK_T, QW // 4, LOG2_QW - 2, True)
            t1 = _lane_tree(l1, BLOCK_T, QW // 4, LOG2_QW - 2, True)
            t2 = _lane_tree(l2, BLOCK_T, QW // 4, LOG2_QW - 2, True)
            t3 = _lane_tree(l3, BLOCK_T, QW // 4, LOG2_QW - 2, True)
            total = (t0 + t1) + (t2 + t3)
        else:
            total = _lane_tree((l0 + l2) + (l1 + l3), BLOCK_T, QW // 4, LOG2_QW - 2, False)
    return total


@triton.jit
def _weighted(y, w, NEMOTRON: tl.constexpr, ROUND: tl.constexpr, DTYPE: tl.constexpr):
    """Apply the norm weight to y = x * rstd, rounding where the split path rounds."""
    if ROUND:
        if NEMOTRON:  # (weight.float() * hidden).to(input_dtype)
            n = _round_to(w * y, DTYPE)
        else:  # hidden.to(weight.dtype) * weight
            n = _round_to(_round_to(y, DTYPE) * w, DTYPE)
    else:
        n = y * w
    return n


@triton.jit
def _rot(a, a_cos, b, b_sin, SIGN: tl.constexpr, ROUND: tl.constexpr, DTYPE: tl.constexpr):
    """a * cos + (SIGN * b) * sin, with the split path's three roundings when ROUND."""
    if ROUND:
        out = _round_to(_round_to(a * a_cos, DTYPE) + _round_to((SIGN * b) * b_sin, DTYPE), DTYPE)
    else:
        out = a * a_cos + (SIGN * b) * b_sin
    return out


@triton.jit
def _norm_rope_head(src, dst, w_ptr, c0, c1, c2, c3, z0, z1, z2, z3, tmask, eps,
                    HEAD_DIM: tl.constexpr, QW: tl.constexpr, LOG2_QW: tl.constexpr, BLOCK_T: tl.constexpr,
                    NEMOTRON: tl.constexpr, ROUND_NORM: tl.constexpr, REDUCE_ORDER: tl.constexpr,
                    DTYPE: tl.constexpr):
    """RMSNorm + rotary of one head's [BLOCK_T, HEAD_DIM] tile, handled as four quarter tiles.

    Rotate-half pairs quarter 0 with 2 and 1 with 3, and for head_dim 128 the quarters are exactly the
    32 "lanes" of PyTorch's reduction, so neither needs a gather or a shuffle across quarters.
    """
    x0 = tl.load(src, mask=tmask, other=0.0).to(tl.float32)
    x1 = tl.load(src + QW, mask=tmask, other=0.0).to(tl.float32)
    x2 = tl.load(src + 2 * QW, mask=tmask, other=0.0).to(tl.float32)
    x3 = tl.load(src + 3 * QW, mask=tmask, other=0.0).to(tl.float32)
    ss = _sum_of_squares(x0 * x0, x1 * x1, x2 * x2, x3 * x3, BLOCK_T, QW, LOG2_QW, REDUCE_ORDER)
    rstd = tl.math.rsqrt(ss * (1.0 / HEAD_DIM) + eps)
    n0 = _weighted(x0 * rstd, tl.load(w_ptr).to(tl.float32), NEMOTRON, ROUND_NORM, DTYPE)
    n1 = _weighted(x1 * rstd, tl.load(w_ptr + QW).to(tl.float32), NEMOTRON, ROUND_NORM, DTYPE)
    n2 = _weighted(x2 * rstd, tl.load(w_ptr + 2 * QW).to(tl.float32), NEMOTRON, ROUND_NORM, DTYPE)
    n3 = _weighted(x3 * rstd, tl.load(w_ptr + 3 * QW).to(tl.float32), NEMOTRON, ROUND_NORM, DTYPE)
    # rotate_half(x) = [-x_hi, x_lo]; rounded values convert exactly, whatever mode the cast uses.
    tl.store(dst, _round_to(_rot(n0, c0, n2, z0, -1.0, ROUND_NORM, DTYPE), DTYPE).to(DTYPE), mask=tmask)
    tl.store(dst + QW, _round_to(_rot(n1, c1, n3, z1, -1.0, ROUND_NORM, DTYPE), DTYPE).to(DTYPE), mask=tmask)
    tl.store(dst + 2 * QW, _round_to(_rot(n2, c2, n0, z2, 1.0, ROUND_NORM, DTYPE), DTYPE).to(DTYPE), mask=tmask)
    tl.store(dst + 3 * QW, _round_to(_rot(n3, c3, n1, z3, 1.0, ROUND_NORM, DTYPE), DTYPE).to(DTYPE), mask=tmask)


@triton.jit
def _qk_norm_rope_pack_kernel(
    q_ptr, k_ptr, v_ptr, q_w_ptr, k_w_ptr, cos_ptr, sin_ptr, q_out_ptr, kv_ptr, gen_off_ptr,
    n_tokens, eps,
    s_qb, s_qn, s_qh,
    s_kb, s_kn, s_kh,
    s_vb, s_vn, s_vh,
    s_cb, s_cn,
    s_ob, s_on, s_oh,
    s_kv_plane, s_kv_row, s_kv_head,
    HQ: tl.constexpr, HKV: tl.constexpr, HEAD_DIM: tl.constexpr, LOG2_QW: tl.constexpr,
    BLOCK_T: tl.constexpr, HEADS_PER_PROGRAM: tl.constexpr,
    NEMOTRON: tl.constexpr, ROUND_NORM: tl.constexpr, REDUCE_ORDER: tl.constexpr,
):
    # Program = (HEADS_PER_PROGRAM heads of one kind: q, k or v) x (BLOCK_T tokens) x (one branch).
    # Why several heads per program: the cos/sin rows are then loaded once and reused from registers
    # for every head, instead of once per head (as many bytes again as the head itself, from L2).
    QW: tl.constexpr = HEAD_DIM // 4
    DTYPE: tl.constexpr = q_out_ptr.dtype.element_ty
    head0 = tl.program_id(0) * HEADS_PER_PROGRAM
    tok = tl.program_id(1) * BLOCK_T + tl.arange(0, BLOCK_T)
    b = tl.program_id(2).to(tl.int64)
    tmask = (tok < n_tokens)[:, None]
    tok64 = tok.to(tl.int64)[:, None]
    col = tl.arange(0, QW)[None, :]
    gen_row = tl.load(gen_off_ptr + b).to(tl.int64) + tok64

    if head0 >= HQ + HKV:
        # V needs no math: copy its gen rows into plane 1 of the packed buffer.
        src = v_ptr + b * s_vb + tok64 * s_vn + (head0 - HQ - HKV) * s_vh + col
        dst = kv_ptr + s_kv_plane + gen_row * s_kv_row + (head0 - HQ - HKV) * s_kv_head + col
        for i in range(HEADS_PER_PROGRAM):
            for c in tl.static_range(4):
                tl.store(dst + i * s_kv_head + c * QW, tl.load(src + i * s_vh + c * QW, mask=tmask), mask=tmask)
    else:
        cs = cos_ptr + b * s_cb + tok64 * s_cn + col
        sn = sin_ptr + b * s_cb + tok64 * s_cn + col
        c0 = tl.load(cs, mask=tmask, other=0.0).to(tl.float32)
        c1 = tl.load(cs + QW, mask=tmask, other=0.0).to(tl.float32)
        c2 = tl.load(cs + 2 * QW, mask=tmask, other=0.0).to(tl.float32)
        c3 = tl.load(cs + 3 * QW, mask=tmask, other=0.0).to(tl.float32)
        z0 = tl.load(sn, mask=tmask, other=0.0).to(tl.float32)
        z1 = tl.load(sn + QW, mask=tmask, other=0.0).to(tl.float32)
        z2 = tl.load(sn + 2 * QW, mask=tmask, other=0.0).to(tl.float32)
        z3 = tl.load(sn + 3 * QW, mask=tmask, other=0.0).to(tl.float32)
        if head0 < HQ:
            src = q_ptr + b * s_qb + tok64 * s_qn + head0 * s_qh + col
            dst = q_out_ptr + b * s_ob + tok64 * s_on + head0 * s_oh + col
            src_step = s_qh
            dst_step = s_oh
            w_ptr = q_w_ptr + col
        else:
            src = k_ptr + b * s_kb + tok64 * s_kn + (head0 - HQ) * s_kh + col
            dst = kv_ptr + gen_row * s_kv_row + (head0 - HQ) * s_kv_head + col
            src_step = s_kh
            dst_step = s_kv_head
            w_ptr = k_w_ptr + col
        for i in range(HEADS_PER_PROGRAM):
            _norm_rope_head(src + i * src_step, dst + i * dst_step, w_ptr, c0, c1, c2, c3, z0, z1, z2, z3, tmask,
                            eps, HEAD_DIM, QW, LOG2_QW, BLOCK_T, NEMOTRON, ROUND_NORM, REDUCE_ORDER, DTYPE)


# --------------------------------------------------------------------------------------------------
# Host wrapper
# --------------------------------------------------------------------------------------------------
SUPPORTED_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def check_qk_norm_rope_inputs(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_weight: torch.Tensor,
    k_weight: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    kv_buffer: torch.Tensor,
    layout: PackedKVLayout,
    flavour: str,
) -> None:
    """Raise ValueError on anything the fused kernel does not handle (shared by wrapper and dispatch)."""
    if flavour not in FLAVOURS:
        raise ValueError(f"flavour must be one of {FLAVOURS}, got {flavour!r}")
    if q.dim() != 4:
        raise ValueError(f"q must be [branches, gen_tokens, q_heads, head_dim], got {tuple(q.shape)}")
    batch, n_gen, _, head_dim = q.shape
    hkv = k.shape[2] if k.dim() == 4 else -1
    if tuple(k.shape) != (batch, n_gen, hkv, head_dim) or tuple(v.shape) != tuple(k.shape):
        raise ValueError(f"k and v must be [{batch}, {n_gen}, kv_heads, {head_dim}], got {tuple(k.shape)}, {tuple(v.shape)}")
    if head_dim < 16 or head_dim & (head_dim - 1):
        raise ValueError(f"head_dim must be a power of two >= 16, got {head_dim}")
    if layout.num_branches != batch or layout.gen_len != n_gen:
        raise ValueError(f"layout {layout} does not match {batch} branches of {n_gen} gen tokens")
    layout.check_buffer(kv_buffer)
    if tuple(kv_buffer.shape[2:]) != (hkv, head_dim):
        raise ValueError(f"kv_buffer heads/dim {tuple(kv_buffer.shape[2:])} != ({hkv}, {head_dim})")
    dtype = q.dtype
    if dtype not in SUPPORTED_DTYPES:
        raise ValueError(f"dtype must be one of {SUPPORTED_DTYPES}, got {dtype}")
    for name, t in (("k", k), ("v", v), ("kv_buffer", kv_buffer), ("cos", cos), ("sin", sin)):
        if t.dtype != dtype:
            raise ValueError(f"{name} dtype {t.dtype} != q dtype {dtype}")
    for name, w in (("q_weight", q_weight), ("k_weight", k_weight)):
        if tuple(w.shape) != (head_dim,):
            raise ValueError(f"{name} must be [{head_dim}], got {tuple(w.shape)}")
        if flavour == "diffusers" and w.dtype != dtype:
            # diffusers' RMSNorm returns the weight's dtype; a mixed pair changes the output dtype.
            raise ValueError(f"diffusers flavour needs {name} in {dtype}, got {w.dtype}")
    if cos.shape != sin.shape or cos.stride() != sin.stride():
        raise ValueError(f"cos and sin must share shape and strides, got {tuple(cos.shape)} / {tuple(sin.shape)}")
    if cos.dim() == 2:
        ok = tuple(cos.shape) == (n_gen, head_dim)
    else:
        ok = cos.dim() == 3 and cos.shape[0] in (1, batch) and tuple(cos.shape[1:]) == (n_gen, head_dim)
    if not ok:
        raise ValueError(f"cos/sin must be [{n_gen}, {head_dim}] or [1|{batch}, {n_gen}, {head_dim}], got {tuple(cos.shape)}")
    for name, t in (("q", q), ("k", k), ("v", v), ("cos", cos), ("q_weight", q_weight), ("k_weight", k_weight)):
        if t.stride(-1) != 1:
            raise ValueError(f"{name} must be contiguous in its last dim, got strides {t.stride()}")


def qk_norm_rope_pack(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_weight: torch.Tensor,
    k_weight: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    kv_buffer: torch.Tensor,
    layout: PackedKVLayout,
    *,
    eps: float,
    flavour: str = "diffusers",
    round_norm_before_rope: bool = False,
    q_out: torch.Tensor | None = None,
    reduce_order: ReduceOrder | None = None,
    block_t: int = 16,
    num_warps: int = 4,
    heads_per_program: int = 8,
) -> torch.Tensor:
    """One launch: RMSNorm + rotary on q and k, k and v written into the gen rows of ``kv_buffer``.

    q: [B, N, Hq, D]; k, v: [B, N, Hkv, D] (any strides with a contiguous last dim, e.g. views of a
    fused QKV projection); cos, sin: [N, D] or [B|1, N, D] in the activation dtype; kv_buffer:
    [2, layout.total_rows, Hkv, D]. Returns q rotated, in ``q_out`` if given (``q_out=q`` is allowed).
    """
    check_qk_norm_rope_inputs(q, k, v, q_weight, k_weight, cos, sin, kv_buffer, layout, flavour)
    batch, n_gen, hq, head_dim = q.shape
    hkv = k.shape[2]
    if q_out is None:
        q_out = torch.empty(batch, n_gen, hq, head_dim, dtype=q.dtype, device=q.device)
    elif tuple(q_out.shape) != tuple(q.shape) or q_out.dtype != q.dtype or q_out.stride(-1) != 1:
        raise ValueError(f"q_out must be {tuple(q.shape)} {q.dtype} with a contiguous last dim")
    if reduce_order is None:
        reduce_order = torch_reduce_order(q.device) if round_norm_before_rope else None
        reduce_order = DEFAULT_REDUCE_ORDER if reduce_order is None else reduce_order
    _, _, gen_offsets, _ = layout.index_tensors(q.device)
    cos_b_stride = 0 if cos.dim() == 2 or cos.shape[0] == 1 else cos.stride(0)
    # A program's heads must all be q, all k or all v: the group size divides both head counts.
    hpp = math.gcd(math.gcd(hq, hkv), max(1, heads_per_program))
    grid = ((hq + 2 * hkv) // hpp, triton.cdiv(n_gen, block_t), batch)
    _qk_norm_rope_pack_kernel[grid](
        q, k, v, q_weight, k_weight, cos, sin, q_out, kv_buffer, gen_offsets,
        n_gen, float(eps),
        q.stride(0), q.stride(1), q.stride(2),
        k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2),
        cos_b_stride, cos.stride(-2),
        q_out.stride(0), q_out.stride(1), q_out.stride(2),
        kv_buffer.stride(0), kv_buffer.stride(1), kv_buffer.stride(2),
        HQ=hq, HKV=hkv, HEAD_DIM=head_dim, LOG2_QW=int(math.log2(head_dim // 4)),
        BLOCK_T=block_t, HEADS_PER_PROGRAM=hpp, NEMOTRON=flavour == "nemotron", ROUND_NORM=bool(round_norm_before_rope),
        REDUCE_ORDER=int(reduce_order), num_warps=num_warps,
    )
    return q_out


# --------------------------------------------------------------------------------------------------
# Backends (cosmos3_kernels.registry)
# --------------------------------------------------------------------------------------------------
def rounding_refused(head_dim: int, device: torch.device) -> str | None:
    """None where the kernel's bit-exact rounding applies on this CUDA device, else why not: it adds the variance
    in PyTorch's order, verified at head_dim 128, and needs this build's order to be one it reproduces."""
    if head_dim != 128:
        return f"bit-exact rounding is verified for head_dim 128 only, got {head_dim}"
    if torch_reduce_order(device) is None:
        return "this PyTorch build reduces in an order the kernel does not reproduce"
    return None


def _kernel_refused(q, k, v, q_weight, k_weight, cos, sin, kv_buffer, layout, *, eps, flavour="diffusers",
                    round_norm_before_rope=False, q_out=None) -> str | None:
    try:
        check_qk_norm_rope_inputs(q, k, v, q_weight, k_weight, cos, sin, kv_buffer, layout, flavour)
    except ValueError as err:
        return str(err)
    if round_norm_before_rope and q.device.type == "cuda" and not torch.compiler.is_compiling():
        return rounding_refused(q.shape[-1], q.device)
    return None


def _reference_refused(*args, **kwargs) -> str | None:
    layout = args[8]
    return ("writes k and v at host offsets, and the lengths are on the device (the Triton kernel reads them there)"
            if layout.lengths is not None else None)


def _run_reference(*args, eps, flavour="diffusers", round_norm_before_rope=False, q_out=None, config=None):
    return qk_norm_rope_pack_reference(*args, eps=eps, flavour=flavour, q_out=q_out)


def _run_kernel(*args, eps, flavour="diffusers", round_norm_before_rope=False, q_out=None, config=None):
    return qk_norm_rope_pack(*args, eps=eps, flavour=flavour, round_norm_before_rope=round_norm_before_rope,
                             q_out=q_out)


# The reference norms and rotates q and k in fp32 and bf16 temporaries: ~16 bytes an element at its peak.
registry.describe("qk_norm_rope", output="q_out",
                  key=lambda q, k, v, q_weight, k_weight, cos, sin, kv_buffer, layout, *, eps, flavour="diffusers",
                  round_norm_before_rope=False: (q.dtype, tuple(q.shape), k.shape[2], flavour,
                                                 bool(round_norm_before_rope), cos.dim() == 3 and cos.shape[0] > 1,
                                                 layout.lengths is not None))
registry.register("qk_norm_rope", "torch", supported=_reference_refused, call=_run_reference, reference=True,
                  need_bytes=lambda q, k, *args, **kwargs: 16 * (q.numel() + k.numel()))
registry.register("qk_norm_rope", "triton", supported=_kernel_refused, call=_run_kernel)
