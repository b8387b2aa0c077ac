"""FP8 prefix attention for Hopper through FlashAttention-3's FP8 forward, with its PyTorch reference.

The op is `cosmos3_kernels.attention_fp8`'s (gen queries of each branch over that branch's ``[prefix | gen]`` rows of
the packed buffer), on the same e4m3 operands, quantised by the same kernels with the same per-branch scales
and the same centring of v. What differs is the kernel and so two roundings:

    per branch b:  q8, k8, v8, vbar, bound as in `cosmos3_kernels.attention_fp8`
                   S = (q8 k8^T) * descale_q * descale_k * scale
                   P = exp(S - rowmax(S)) * 2**8;  P8 = e4m3(P)       FA3 offsets the exponent by 8 (our reading
                                                                       of its FP8 softmax), so P spans (0, 256]
                   O = (P8 (v8 * descale_v)) / rowsum(P)
                   out = bf16(O + vbar)                                 FA3 writes bf16: no e4m3 output rounding

Both branches go in one call: FA3's varlen form reads the packed rows as they lie (branch b's keys are rows
``cu_seqlens_k[b]:cu_seqlens_k[b+1]``), with a descale per branch and K/V head.

Why: FlashAttention-3 is the FP8 attention written for Hopper. The registry carries its forward prebuilt for
CUDA 13 against PyTorch's stable ABI, as the wheel `fa3-fwd` (Dao-AILab's Hopper code, forward only, FP8 and
varlen built in). It is optional (requirements-gpu.txt). Where both are installed the FP8 mode takes it
over cuDNN's for every call, as it measured faster at every length (`engine.pipeline.fp8.FP8_ATTENTION_BACKENDS`
says by how much; docs/perf-log/2026-12-02.md, "One FP8 attention kernel at every length").

Why v is still centred: without the output's e4m3 rounding, a common part in v still costs FA3 what it costs
cuDNN. On one H200 at 44160 keys, with the towers' size of common part, the error against fp32 was 2.4e-1
uncentred and 2.2e-3 centred (bf16: 1.7e-3); by our reading the FP8 tensor cores' accumulation of P8 v8 is
where it comes from. `centred=False` keeps the plain op; the benches measure both.
"""
from __future__ import annotations

import functools
import math

import torch
import triton
import triton.language as tl

from cosmos3_kernels.attention_fp8 import (E4M3_MAX, HEAD_DIMS, _branch_operands, check_fp8_call,
                                   prefix_attention_fp8_reference, quantize_e4m3)
from cosmos3_kernels import registry
from cosmos3_kernels.packed_kv import PackedKVLayout

FA3_DISTRIBUTION = "fa3-fwd"
# Whether FA3 packs the query heads that share a K/V head into one tile. Its heuristic packs every varlen call; at
# Nano 720p (44160 gen tokens a branch, 4 query heads per K/V head) an FP8 step took 4014 ms unpacked against
# 4191 with the heuristic and 4201 packed, two alternated runs each on one H200 (docs/perf-log/2026-12-02.md, "FA3's FP8
# forward: the FP8 target met"). The call alone, swept from 4096 to 44160 gen tokens, was faster unpacked at every
# length but 8192, the FP8 attention's shortest (3.53 and 3.83 ms against 3.49 and 3.51 packed, two runs): a
# length rule for one length's 0.3 ms a layer was not worth its branch ("One FP8 attention kernel at every length").
PACK_GQA = False
_BLOCK = 4096
# FA3's FP8 softmax: P = exp2(x - max + 8), so the largest probability of a row is 2**8 before its e4m3 cast.
P_SCALE = 2.0 ** 8


@functools.cache
def _fa3():
    """FA3's op namespace (`torch.ops.fa3_fwd`), or None where `fa3-fwd` is not installed or does not load."""
    try:
        import fa3_fwd._C  # noqa: F401  (registers torch.ops.fa3_fwd)
    except Exception as error:  # ImportError, or the library not loading beside this torch
        from cosmos3_kernels.optional import warn_if_installed

        warn_if_installed(FA3_DISTRIBUTION, error, "cuDNN's FP8 attention (or the bf16 one)")
        return None
    return torch.ops.fa3_fwd


def unavailable(device) -> str | None:
    """What `device` or this host lacks for FA3's FP8 forward (None: nothing)."""
    device = torch.device(device)
    if device.type != "cuda":
        return f"device {device} (FA3's FP8 attention needs CUDA)"
    major, minor = torch.cuda.get_device_capability(device)
    if (major, minor) != (9, 0):
        return f"compute capability {major}.{minor} (FA3's FP8 kernels are built for Hopper, 9.0, only)"
    if _fa3() is None:
        return f"{FA3_DISTRIBUTION} is not installed or does not load (opt in: pip install fa3-fwd==0.0.3; requirements-gpu.txt says why it is not installed by default)"
    return None


def unsupported(q: torch.Tensor, kv_buffer: torch.Tensor) -> str | None:
    """Why this call cannot run on FA3's FP8 forward (None when it can), beyond `check_prefix_attention_inputs`."""
    why = unavailable(q.device)
    if why is None and q.shape[-1] not in HEAD_DIMS:
        why = f"head_dim {q.shape[-1]} (measured and allowed: {HEAD_DIMS})"
    if why is None and q.dtype != torch.bfloat16:
        why = f"dtype {q.dtype} (FA3's FP8 forward writes bf16; allowed: torch.bfloat16)"
    return why


def prefix_attention_fp8_fa3_reference(q: torch.Tensor, kv_buffer: torch.Tensor, layout: PackedKVLayout, *,
                                       scale: float | None = None, out: torch.Tensor | None = None,
                                       centred: bool = True) -> torch.Tensor:
    """The op in the module docstring, in fp32 from the e4m3 operands; returns [B, N, Hq, D] in q's dtype."""
    return prefix_attention_fp8_reference(q, kv_buffer, layout, scale=scale, out=out, centred=centred,
                                          probability_scale=P_SCALE, e4m3_output=False)


def add_branch_bias_reference(x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """x [B, N, H, D] plus bias [B, H, D] (fp32) broadcast over N: summed in fp32, rounded once to x's dtype."""
    return (x.float() + bias[:, None]).to(x.dtype)


@triton.jit
def _add_branch_bias_kernel(x_ptr, bias_ptr, per_branch, period, BLOCK: tl.constexpr):
    branch = tl.program_id(1)
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < per_branch
    at = x_ptr + branch.to(tl.int64) * per_branch + offs
    wide = tl.load(at, mask=mask, other=0.0).to(tl.float32)
    wide += tl.load(bias_ptr + branch * period + offs % period, mask=mask, other=0.0)
    tl.store(at, wide.to(x_ptr.dtype.element_ty), mask=mask)


def add_branch_bias_(x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """`add_branch_bias_reference` in place: one read and one write of x. Why a kernel: timed alone and eagerly at
    Nano 720p on an H200, the call with PyTorch's broadcast add of the fp32 bias into bf16 took 77.1 ms against 74.6
    uncentred; this kernel took 0.35 ms a call in the FP8 step's profile (docs/perf-log/2026-12-02.md, "FA3's FP8 forward")."""
    batch, n, heads, head_dim = x.shape
    if (not (x.is_contiguous() and bias.is_contiguous()) or bias.shape != (batch, heads, head_dim)
            or bias.dtype != torch.float32):
        raise ValueError(f"add_branch_bias_ takes a contiguous [B, N, H, D] tensor and a contiguous fp32 [B, H, D] "
                         f"bias, got {tuple(x.shape)} and {bias.dtype} {tuple(bias.shape)}")
    per_branch = n * heads * head_dim
    grid = (triton.cdiv(per_branch, _BLOCK), batch)
    _add_branch_bias_kernel[grid](x, bias, per_branch, heads * head_dim, BLOCK=_BLOCK)
    return x


def varlen_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, offsets: tuple,
                   max_q: int, max_k: int, scale: float, descales: tuple = (None, None, None),
                   pack_gqa: bool | None = PACK_GQA) -> torch.Tensor:
    """FA3's varlen forward into `out` ([rows, heads, head_dim] each; `offsets`: `PackedKVLayout.cu_seqlens`):
    FP8 with `descales` ([branches, K/V heads] fp32 each, q's, k's, v's) or bf16 without. Everything else is off: no
    causal mask, window, softcap, paged or appended K/V, and one split."""
    cu_q, cu_k = offsets
    return _fa3().fwd(q, k, v, None, None, None, out, cu_q, cu_k, None, None, None, max_q, max_k,
                      None, None, None, None, None, None, *descales, scale, False, -1, -1, 0, 0.0, True, None, 1,
                      pack_gqa, 0)[0]


class FA3FP8Attention:
    """The op through FA3's FP8 varlen forward, both branches in one call. The row offsets it hands FA3 are the
    layout's cached ones (`PackedKVLayout.cu_seqlens`), made on a layout's first call (which must not be under
    CUDA-graph capture, as with cuDNN's graph build); later calls, captured or not, launch with no host sync.
    `centred=False`: v as it is."""

    name = "fa3"  # what a result's summary says ran (engine.pipeline.fp8.result_attention_kernel)

    def __init__(self, centred: bool = True, pack_gqa: bool | None = PACK_GQA) -> None:
        self.centred = centred
        self.pack_gqa = pack_gqa  # None: FA3's own heuristic

    def __call__(self, q: torch.Tensor, kv_buffer: torch.Tensor, layout: PackedKVLayout, *,
                 scale: float | None = None, out: torch.Tensor | None = None) -> torch.Tensor:
        check_fp8_call(q, kv_buffer, layout, unsupported)
        batch, n_gen, hq, head_dim = q.shape
        hk = kv_buffer.shape[2]
        scale = scale if scale is not None else 1.0 / math.sqrt(head_dim)
        rows = layout.total_rows
        q8 = torch.empty(batch, n_gen, hq, head_dim, dtype=torch.float8_e4m3fn, device=q.device)
        k8 = torch.empty(rows, hk, head_dim, dtype=torch.float8_e4m3fn, device=q.device)
        v8 = torch.empty_like(k8)
        amaxes, biases = [], []
        for branch in range(batch):
            ops = _branch_operands(q, kv_buffer, layout, branch, self.centred)
            start, stop = layout.branch_start(branch), layout.branch_start(branch) + layout.kv_len(branch)
            quantize_e4m3(ops.q, ops.amaxes[0], out=q8[branch])
            quantize_e4m3(ops.k, ops.amaxes[1], out=k8[start:stop])
            quantize_e4m3(ops.v, ops.amaxes[2], out=v8[start:stop], bias=ops.v_mean)
            amaxes.append(torch.cat(ops.amaxes))
            biases.append(ops.out_bias)
        # [3, B, Hk]: descale_q, descale_k, descale_v per branch, repeated over the K/V heads (FA3's shape)
        descales = (torch.stack(amaxes, 1) / E4M3_MAX)[:, :, None].expand(3, batch, hk).contiguous()
        result = torch.empty(batch * n_gen, hq, head_dim, dtype=torch.bfloat16, device=q.device)
        varlen_forward(q8.view(batch * n_gen, hq, head_dim), k8, v8, result, layout.cu_seqlens(q.device),
                       n_gen, layout.max_kv_len, scale, tuple(descales), self.pack_gqa)
        result = result.view(batch, n_gen, hq, head_dim)
        if self.centred:  # vbar back, per branch and query head: summed in fp32, one rounding to bf16
            add_branch_bias_(result, torch.stack(biases))
        if out is None:
            return result
        out.copy_(result)
        return out


# The op "attention_fp8" (cosmos3_kernels.registry): a runner for a device, chosen by rank, not timed per shape
# (`cosmos3_kernels.dispatch.choose_fp8_attention`). FA3's ranks first, as measured on one H200 (Nano's heads, both
# CFG branches, quantisation included; docs/perf-log/2026-12-02.md, "One FP8 attention kernel at every length"): it
# took 3.6-12.8% less time than cuDNN's FP8 SDPA (which on Hopper also rounds its output to e4m3) in each of 15 rows,
# three runs, 11 lengths from 4096 to 44160 gen tokens per branch (720p/189f: 70.4 against 79.6 ms; 480p/121f: 6.80
# against 7.05), and a 480p/121f FP8 step took 639 and 630 ms against 668 and 663 (bench_engine.py --fp8-step
# 832x480x121 --fp8-attention fa3,cudnn,fa3,cudnn). `pack_gqa`: None leaves it to FA3's heuristic.
registry.register("attention_fp8", "fa3", supported=lambda device: unavailable(device), rank=0,
                  call=lambda centred=True, pack_gqa=PACK_GQA: FA3FP8Attention(centred=centred, pack_gqa=pack_gqa))
