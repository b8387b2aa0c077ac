"""The first gen layer's attention with its gen block computed once for all CFG branches, beside its PyTorch reference.

Why it is exact in exact arithmetic: every CFG branch feeds the gen tower the same gen tokens, so at the first
layer every branch projects the same queries, keys and values. What differs is the rotary: a branch's gen
positions are its text length further on, the same shift for every gen token (per M-RoPE axis), and a rotary
score depends only on the difference of two positions. So the gen-to-gen block of the scores, and the values it
weighs, are the same in every branch. A branch's attention over ``[prefix_b | gen]`` splits into that block,
computed once with branch ``source``'s rotated queries and keys, and the branch's own prefix block, joined by
their log-sum-exps (the combine of FlashAttention's split-KV):

    out_b = (exp(lse_gen) * O_gen + exp(lse_pre_b) * O_pre_b) / (exp(lse_gen) + exp(lse_pre_b))

At Nano 720p the gen block is 44160 of a branch's 45766 keys, so two branches' first-layer attention costs about
one branch's. From the second layer on the branches' hidden states differ (their prefixes did), so only the
first layer shares.

What differs from one attention call over each branch: the shared block reads branch ``source``'s rotated q and
k for every branch (the same values up to the rotary's fp32 rounding at other absolute positions), and each
partial output is rounded to the inputs' dtype before the combine (flash-attn-4 writes them so). The combine
runs in fp32 and rounds once. tests/unit/kernels/test_kernels_shared_attention.py holds both against fp32 attention.

Layout: ``o_parts`` [1 + B, N, Hq, D] (part 0 the gen block, part 1 + b branch b's prefix block) and
``lse_parts`` [1 + B, Hq, N] fp32 (natural log; -inf for an empty prefix), as flash-attn-4 returns them per call.
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from cosmos3_kernels import prefix_attention as pa, registry
from cosmos3_kernels.packed_kv import PackedKVLayout, kv_len_bucket


def check_shared_inputs(q: torch.Tensor, kv_buffer: torch.Tensor, layout: PackedKVLayout, source: int = 0) -> None:
    """Raise ValueError where the shared form does not apply: shapes that match the layout, two or more branches,
    host lengths (the blocks are sliced by host integers), and a source branch that exists. (Any float dtype: the
    reference runs the CPU's fp32 towers; flash-attn-4 says what it takes.)"""
    pa.check_packed_attention_shapes(q, kv_buffer, layout)
    if layout.num_branches < 2:
        raise ValueError(f"sharing the gen block needs two or more branches, got {layout.num_branches}")
    if layout.lengths is not None:
        raise ValueError("sharing the gen block slices it by host integers; this layout keeps its lengths on the device")
    if not 0 <= source < layout.num_branches:
        raise ValueError(f"source must be a branch in [0, {layout.num_branches}), got {source}")


def _parts(q: torch.Tensor, kv_buffer: torch.Tensor, layout: PackedKVLayout, source: int):
    """Each part's (queries [N, Hq, D], keys [L, Hkv, D], values): the shared gen block with the source branch's
    queries and rows, then each branch's prefix rows with its own queries."""
    gen = layout.gen_offset(source)
    parts = [(q[source], kv_buffer[0, gen:gen + layout.gen_len], kv_buffer[1, gen:gen + layout.gen_len])]
    for b in range(layout.num_branches):
        start = layout.branch_start(b)
        stop = start + layout.prefix_lens[b]
        parts.append((q[b], kv_buffer[0, start:stop], kv_buffer[1, start:stop]))
    return parts


# --------------------------------------------------------------------------------------------------
# PyTorch reference
# --------------------------------------------------------------------------------------------------
def attention_with_lse_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float
                                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention of q [N, Hq, D] over k, v [L, Hkv, D] in fp32: (output [N, Hq, D] in q's dtype, lse [Hq, N] fp32).
    No keys: a zero output and an lse of -inf (a part that takes no weight in the combine)."""
    n, hq, d = q.shape
    if k.shape[0] == 0:
        return torch.zeros_like(q), torch.full((hq, n), float("-inf"), dtype=torch.float32, device=q.device)
    group = hq // k.shape[1]
    qf = q.float().transpose(0, 1)                                   # [Hq, N, D]
    kf = k.float().repeat_interleave(group, dim=1).transpose(0, 1)   # [Hq, L, D]
    vf = v.float().repeat_interleave(group, dim=1).transpose(0, 1)
    scores = qf @ kf.transpose(1, 2) * scale                         # [Hq, N, L]
    lse = torch.logsumexp(scores, dim=-1)
    out = torch.exp(scores - lse[..., None]) @ vf
    return out.transpose(0, 1).to(q.dtype), lse


def partials_reference(q: torch.Tensor, kv_buffer: torch.Tensor, layout: PackedKVLayout, *, source: int = 0,
                       scale: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The parts flash-attn-4 computes, in fp32 and rounded to q's dtype as it rounds them: (o_parts, lse_parts)."""
    check_shared_inputs(q, kv_buffer, layout, source)
    scale = scale if scale is not None else 1.0 / math.sqrt(q.shape[-1])
    parts = [attention_with_lse_reference(qp, k, v, scale) for qp, k, v in _parts(q, kv_buffer, layout, source)]
    return torch.stack([o for o, _ in parts]), torch.stack([lse for _, lse in parts])


def combine_reference(o_parts: torch.Tensor, lse_parts: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """Each branch's output [B, N, Hq, D] from the shared gen part and its own prefix part, in fp32, rounded once."""
    lse_gen, lse_pre = lse_parts[0], lse_parts[1:]                  # [Hq, N], [B, Hq, N]
    top = torch.maximum(lse_gen, lse_pre)                            # finite: the gen part has keys
    w_gen, w_pre = torch.exp(lse_gen - top), torch.exp(lse_pre - top)
    total = w_gen + w_pre
    w_gen = (w_gen / total).transpose(1, 2)[..., None]               # [B, N, Hq, 1]
    w_pre = (w_pre / total).transpose(1, 2)[..., None]
    result = (o_parts[0].float() * w_gen + o_parts[1:].float() * w_pre).to(o_parts.dtype)
    if out is None:
        return result
    out.copy_(result)
    return out


def shared_gen_attention_reference(q: torch.Tensor, kv_buffer: torch.Tensor, layout: PackedKVLayout, *,
                                   source: int = 0, scale: float | None = None,
                                   out: torch.Tensor | None = None) -> torch.Tensor:
    """The whole op in PyTorch: [B, N, Hq, D]. Memory grows with N x L per head, so it is for the CPU and tests."""
    o_parts, lse_parts = partials_reference(q, kv_buffer, layout, source=source, scale=scale)
    return combine_reference(o_parts, lse_parts, out)


# --------------------------------------------------------------------------------------------------
# Triton combine
# --------------------------------------------------------------------------------------------------
@triton.jit
def _combine_kernel(
    o_ptr, lse_ptr, out_ptr, n,
    s_op, s_on, s_oh,
    s_lp, s_lh,
    s_ob, s_on2, s_oh2,
    HQ: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = pid_bh // HQ
    h = pid_bh % HQ
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, HEAD_DIM)
    inside = rows < n
    lse_gen = tl.load(lse_ptr + h * s_lh + rows, mask=inside, other=0.0)
    lse_pre = tl.load(lse_ptr + (1 + b) * s_lp + h * s_lh + rows, mask=inside, other=0.0)
    top = tl.maximum(lse_gen, lse_pre)
    w_gen = tl.exp(lse_gen - top)
    w_pre = tl.exp(lse_pre - top)
    total = w_gen + w_pre
    w_gen = w_gen / total
    w_pre = w_pre / total
    offsets = rows.to(tl.int64)[:, None] * s_on + h * s_oh + cols[None, :]
    o_gen = tl.load(o_ptr + offsets, mask=inside[:, None], other=0.0).to(tl.float32)
    o_pre = tl.load(o_ptr + (1 + b).to(tl.int64) * s_op + offsets, mask=inside[:, None], other=0.0).to(tl.float32)
    result = o_gen * w_gen[:, None] + o_pre * w_pre[:, None]
    target = out_ptr + b.to(tl.int64) * s_ob + rows.to(tl.int64)[:, None] * s_on2 + h * s_oh2 + cols[None, :]
    tl.store(target, result.to(out_ptr.dtype.element_ty), mask=inside[:, None])


def combine(o_parts: torch.Tensor, lse_parts: torch.Tensor, out: torch.Tensor | None = None,
            block_m: int = 64) -> torch.Tensor:
    """`combine_reference` in one kernel: reads each part once per branch, writes [B, N, Hq, D]."""
    parts, n, hq, d = o_parts.shape
    if lse_parts.shape != (parts, hq, n) or lse_parts.dtype != torch.float32:
        raise ValueError(f"lse_parts must be float32 {(parts, hq, n)} for o_parts {tuple(o_parts.shape)}, "
                         f"got {lse_parts.dtype} {tuple(lse_parts.shape)}")
    if o_parts.stride(-1) != 1 or lse_parts.stride(-1) != 1 or d & (d - 1):
        raise ValueError(f"o_parts and lse_parts need a contiguous last dim and a power-of-two head_dim, got strides "
                         f"{o_parts.stride()} / {lse_parts.stride()}, head_dim {d}")
    branches = parts - 1
    if out is None:
        out = torch.empty((branches, n, hq, d), dtype=o_parts.dtype, device=o_parts.device)
    elif tuple(out.shape) != (branches, n, hq, d) or out.stride(-1) != 1:
        raise ValueError(f"out must be {(branches, n, hq, d)} with a contiguous last dim, got {tuple(out.shape)}")
    grid = (triton.cdiv(n, block_m), branches * hq)
    _combine_kernel[grid](
        o_parts, lse_parts, out, n,
        o_parts.stride(0), o_parts.stride(1), o_parts.stride(2),
        lse_parts.stride(0), lse_parts.stride(1),
        out.stride(0), out.stride(1), out.stride(2),
        HQ=hq, HEAD_DIM=d, BLOCK_M=block_m, num_warps=4,
    )
    return out


# --------------------------------------------------------------------------------------------------
# flash-attn-4's parts
# --------------------------------------------------------------------------------------------------
def shared_unsupported(q: torch.Tensor) -> str | None:
    """Why flash-attn-4 cannot compute the parts for q (None when it can): it must run at all, and the entry
    that takes an lse and an output buffer (`_flash_attn_fwd`) must be there."""
    why = pa.flash4_unsupported(q)
    if why is not None:
        return why
    if q.dtype not in (torch.bfloat16, torch.float16):
        return f"dtype {q.dtype} (flash-attn-4 takes bf16 or fp16)"
    if pa.flash4_forward() is None:
        return "this flash-attn-4 has no _flash_attn_fwd, which returns the log-sum-exp into a caller's buffer"
    return None


def partials_flash4(q: torch.Tensor, kv_buffer: torch.Tensor, layout: PackedKVLayout, *, source: int = 0,
                    scale: float | None = None, config: pa.Flash4Config | None = None
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """The parts on flash-attn-4: one call for the gen block, one per branch's prefix, each writing its output
    and lse into its slot (no copy)."""
    check_shared_inputs(q, kv_buffer, layout, source)
    why = shared_unsupported(q)
    if why is not None:
        raise ValueError(f"flash-attn-4 cannot compute the shared attention's parts: {why}")
    fn = pa.flash4_forward()
    branches, n, hq, d = q.shape
    o_parts = torch.empty((1 + branches, n, hq, d), dtype=q.dtype, device=q.device)
    lse_parts = torch.empty((1 + branches, hq, n), dtype=torch.float32, device=q.device)
    kwargs = pa.flash4_call_kwargs(config)
    softmax_scale = scale if scale is not None else 1.0 / math.sqrt(d)
    for part, (qp, k, v) in enumerate(_parts(q, kv_buffer, layout, source)):
        if k.shape[0] == 0:  # an empty prefix takes no weight
            o_parts[part].zero_()
            lse_parts[part].fill_(float("-inf"))
            continue
        fn(qp.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0), softmax_scale=softmax_scale, causal=False,
           return_lse=True, out=o_parts[part:part + 1], lse=lse_parts[part:part + 1], **kwargs)
    return o_parts, lse_parts


def shared_gen_attention_flash4(q: torch.Tensor, kv_buffer: torch.Tensor, layout: PackedKVLayout, *,
                                source: int = 0, scale: float | None = None, out: torch.Tensor | None = None,
                                config: pa.Flash4Config | None = None) -> torch.Tensor:
    """The op on the GPU: flash-attn-4's parts, then the Triton combine; [B, N, Hq, D]."""
    o_parts, lse_parts = partials_flash4(q, kv_buffer, layout, source=source, scale=scale, config=config)
    return combine(o_parts, lse_parts, out)


# --------------------------------------------------------------------------------------------------
# Backends (cosmos3_kernels.registry). Not shared at all ("regular": the one-call `prefix_attention`) is the
# dispatcher's third choice, timed by that op's own decision.
# --------------------------------------------------------------------------------------------------
def _inputs_refused(q: torch.Tensor, kv_buffer: torch.Tensor, layout: PackedKVLayout, **kwargs) -> str | None:
    try:
        check_shared_inputs(q, kv_buffer, layout)
    except ValueError as err:
        return str(err)
    return None


registry.describe("shared_gen_attention", output="out",
                  key=lambda q, kv_buffer, layout, *, scale=None: (
                      q.dtype, tuple(q.shape), kv_buffer.shape[2], kv_len_bucket(layout.kv_len_limit)))
registry.register("shared_gen_attention", "torch", supported=_inputs_refused, reference=True,
                  call=lambda q, kv_buffer, layout, *, scale=None, out=None, config=None:
                  shared_gen_attention_reference(q, kv_buffer, layout, scale=scale, out=out))
registry.register("shared_gen_attention", "flash4",
                  supported=lambda q, kv_buffer, layout, **kwargs: _inputs_refused(q, kv_buffer, layout)
                  or shared_unsupported(q),
                  call=lambda q, kv_buffer, layout, *, scale=None, out=None, config=None:
                  shared_gen_attention_flash4(q, kv_buffer, layout, scale=scale, out=out, config=config),
                  configs="flash4", fit_configs=lambda configs, q, *args, **kwargs: pa.flash4_configs_for(q, configs),
                  library=True, forcible=False, load=pa.load_flash4)
