"""FP8 prefix attention for Hopper through cuDNN's FP8 SDPA, with its PyTorch reference.

The op is `prefix_attention`'s (gen queries of each branch over that branch's ``[prefix | gen]`` rows of the
packed buffer, `cosmos3_kernels/packed_kv.py`), computed on float8 e4m3 operands:

    per branch b:  vbar = mean of v over the branch's rows               one per K/V head and channel (fp32)
                   q8, k8 = e4m3(x * 448 / amax(x))                     one scale per tensor (cuDNN's contract)
                   v8 = e4m3((v - vbar) * 448 / bound),  bound = amax(v) + amax(vbar) >= amax(v - vbar)
                   S = (q8 k8^T) * descale_q * descale_k * scale
                   P = exp(S - rowmax(S));  P8 = e4m3(P * 448)   the probabilities, on cuDNN's fixed 448 scale
                   O = (P8 / 448) (v8 * descale_v) / rowsum(P)
                   out = bf16(fma(e4m3(O * scale_o), 1 / scale_o, vbar)),  scale_o = OUTPUT_HEADROOM * 448 / bound

Why the output is e4m3 too: cuDNN 9.19 runs FP8 SDPA with a bf16 output on Blackwell only; on Hopper it
writes e4m3, so the result is rounded a last time. |O| <= bound (each row of O is a convex combination of
the rows of v - vbar), so scale_o cannot overflow; `OUTPUT_HEADROOM` leaves room for P's rounding, which can
push a row's weights a few percent past one.

Why v is centred: each row of softmax weights sums to one, so attending over v - vbar and adding vbar back
is the same attention in exact arithmetic. In fp8 it is not: a diffusion tower's attention averages over
thousands of keys, so its output sits close to vbar, and the output's last e4m3 rounding (3 mantissa bits)
then costs ~2.7% of the whole output; centred, it costs that share of what is left after vbar (a fifth to
two fifths of the output in the towers measured). On the attention inputs of random-weight towers (fp32 on the
CPU, bench/bench_fp8_attention_inputs.py): 2.95e-2 -> 1.51e-2 from fp32 attention over Edge T2I 640x640's
layers, 2.83e-2 -> 1.16e-2 over Nano T2V 832x480/17f's first four; in the FP8 gate, the attention alone in FP8
(row:attn) went from 1.96x / 2.82x bf16's velocity error to 1.13x / 1.12x (docs/perf-log/2026-12-02.md, "Centring v").
`centred=False` keeps the plain op (the benches measure both). Centring k instead (exact too, a shift of each
score row) gained nothing there, so it is not done.

Why cuDNN: flash-attn-4's FP8 forward is SM100-only, and cuDNN's is a maintained FP8 attention for Hopper from the
registry (`nvidia-cudnn-frontend`, over the cuDNN that PyTorch ships). Where `fa3-fwd` is installed the FP8 mode
takes FlashAttention-3's FP8 forward instead, for every call (`cosmos3_kernels.attention_fp8_fa3`, which shares this
module's quantisation and reference): it measured faster at every length
(`engine.pipeline.fp8.FP8_ATTENTION_BACKENDS`; docs/perf-log/2026-12-02.md, "One FP8 attention kernel at every length").
This one stays for hosts without FA3 and for GPUs past Hopper. Measured on one H200 with both CFG branches and this
module's quantisation (bench/bench_attention_fp8.py; docs/perf-log/2026-12-02.md, "FP8 attention through cuDNN" and
"Centring v"): 79.8 ms against flash-attn-4's bf16 94.8 ms at Nano 720p/189f (44160 gen tokens), 1.19x; 7.36 against
8.24 ms at 480p/121f (12090), 1.12x. It is approximate (every operand keeps 3 mantissa bits), so it runs only where
the FP8 mode's policy names it (`engine.pipeline.fp8`).

The quantisation is ours (Triton, one pass each way, scales read on the device, so the call has no host
sync and can be captured); the amax and mean reductions are PyTorch's.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass
import torch
import triton
import triton.language as tl

from cosmos3_kernels import registry
from cosmos3_kernels.packed_kv import PackedKVLayout
from cosmos3_kernels.prefix_attention import check_prefix_attention_inputs

E4M3_MAX = 448.0
# O * scale_o stays within half of e4m3's range (see the module docstring); e4m3's relative precision is the same
# at any scale in its normal range, so the headroom costs nothing measurable.
OUTPUT_HEADROOM = 0.5
HEAD_DIMS = (128,)  # measured; cuDNN's FP8 SDPA takes others, untried here
_BLOCK = 4096

# Per call, one fp32 scalar each, in this order (cuDNN's operand names; `_scalars` fills them).
SCALARS = ("descale_q", "descale_k", "descale_v", "descale_s", "scale_s", "scale_o", "descale_o", "amax_o")


# --------------------------------------------------------------------------------------------------
# Quantisation: Triton kernels and their PyTorch references
# --------------------------------------------------------------------------------------------------
def amax(x: torch.Tensor) -> torch.Tensor:
    """max |x| as a one-element fp32 tensor on x's device (never zero, so a scale from it is finite)."""
    return torch.linalg.vector_norm(x, float("inf"), dtype=torch.float32).reshape(1).clamp_min_(1e-12)


def quantize_e4m3_reference(x: torch.Tensor, x_amax: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """(x - bias) * (448 / amax) rounded to e4m3 (nearest, saturating at +-448); `bias` [heads, head_dim] fp32
    broadcasts over x's leading dims."""
    scale = torch.full_like(x_amax, E4M3_MAX) / x_amax
    wide = x.float() if bias is None else x.float() - bias
    return (wide * scale).clamp_(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)


def dequantize_e4m3_reference(x8: torch.Tensor, descale: torch.Tensor, dtype=torch.bfloat16,
                              bias: torch.Tensor | None = None) -> torch.Tensor:
    """x8 * descale (+ bias, rounded once: an e4m3 value times an fp32 one is exact in float64), in `dtype`."""
    if bias is None:
        return (x8.float() * descale).to(dtype)
    return (x8.double() * descale.double() + bias.double()).float().to(dtype)


@triton.jit
def _quantize_kernel(x_ptr, out_ptr, amax_ptr, bias_ptr, n, period, TARGET: tl.constexpr, HAS_BIAS: tl.constexpr,
                     BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    # Correctly rounded division, as PyTorch's: Triton's plain `/` on fp32 is an approximate one.
    scale = tl.math.div_rn(tl.full((), TARGET, tl.float32), tl.load(amax_ptr))
    x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    if HAS_BIAS:  # one value per (head, channel): the bias repeats every `period` elements of a token-major tensor
        x = x - tl.load(bias_ptr + offs % period, mask=mask, other=0.0)
    y = tl.minimum(tl.maximum(x * scale, -TARGET), TARGET)
    tl.store(out_ptr + offs, y.to(tl.float8e4nv), mask=mask)


@triton.jit
def _dequantize_kernel(x_ptr, out_ptr, descale_ptr, bias_ptr, n, period, HAS_BIAS: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    if HAS_BIAS:  # one rounding, as the reference's float64 sum of the exact product rounds once
        y = tl.fma(x, tl.load(descale_ptr), tl.load(bias_ptr + offs % period, mask=mask, other=0.0))
    else:
        y = x * tl.load(descale_ptr)
    tl.store(out_ptr + offs, y.to(out_ptr.dtype.element_ty), mask=mask)


def _bias_args(bias: torch.Tensor | None, x: torch.Tensor) -> tuple:
    if bias is None:
        return x, 1, False  # a placeholder pointer the kernel never reads
    if not bias.is_contiguous() or bias.dtype != torch.float32 or bias.numel() == 0 or x.numel() % bias.numel():
        raise ValueError(f"the bias must be a contiguous fp32 [heads, head_dim] tensor that tiles {tuple(x.shape)}, "
                         f"got {bias.dtype} {tuple(bias.shape)}")
    return bias, bias.numel(), True


def quantize_e4m3(x: torch.Tensor, x_amax: torch.Tensor, out: torch.Tensor | None = None,
                  bias: torch.Tensor | None = None) -> torch.Tensor:
    """`quantize_e4m3_reference` in one pass (x contiguous; `x_amax` a one-element fp32 device tensor)."""
    if not x.is_contiguous():
        raise ValueError(f"quantize_e4m3 takes a contiguous tensor, got strides {x.stride()} for shape {tuple(x.shape)}")
    out = torch.empty(x.shape, dtype=torch.float8_e4m3fn, device=x.device) if out is None else out
    n = x.numel()
    bias_ptr, period, has_bias = _bias_args(bias, x)
    _quantize_kernel[(triton.cdiv(n, _BLOCK),)](x, out, x_amax, bias_ptr, n, period, TARGET=E4M3_MAX,
                                                HAS_BIAS=has_bias, BLOCK=_BLOCK)
    return out


def dequantize_e4m3(x8: torch.Tensor, descale: torch.Tensor, out: torch.Tensor,
                    bias: torch.Tensor | None = None) -> torch.Tensor:
    """`dequantize_e4m3_reference` into `out` (both contiguous, same element count)."""
    if not (x8.is_contiguous() and out.is_contiguous()) or x8.numel() != out.numel():
        raise ValueError(f"dequantize_e4m3 takes contiguous tensors of one size, got {tuple(x8.shape)} -> {tuple(out.shape)}")
    n = x8.numel()
    bias_ptr, period, has_bias = _bias_args(bias, x8)
    _dequantize_kernel[(triton.cdiv(n, _BLOCK),)](x8, out, descale, bias_ptr, n, period, HAS_BIAS=has_bias, BLOCK=_BLOCK)
    return out


def _scalars(q_amax: torch.Tensor, k_amax: torch.Tensor, v_amax: torch.Tensor) -> torch.Tensor:
    """The call's fp32 scalars in `SCALARS` order, computed on the device (no host sync)."""
    out_scale = OUTPUT_HEADROOM * E4M3_MAX
    # Constants filled on the device (a host tensor's copy could not be captured in a CUDA graph).
    return torch.cat([q_amax / E4M3_MAX, k_amax / E4M3_MAX, v_amax / E4M3_MAX, torch.full_like(v_amax, 1.0 / E4M3_MAX),
                      torch.full_like(v_amax, E4M3_MAX), torch.full_like(v_amax, out_scale) / v_amax,
                      v_amax / out_scale, torch.zeros_like(v_amax)])


@dataclass(frozen=True)
class BranchOperands:
    """One branch's operands as contiguous [rows, heads, head_dim] tensors and what quantises them."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    amaxes: tuple  # q's, k's, and the bound on |v - v_mean| (v's own amax when not centred)
    v_mean: torch.Tensor | None  # [K/V heads, head_dim] fp32, subtracted from v before quantisation
    out_bias: torch.Tensor | None  # v_mean per query head [heads, head_dim], added back to the output

    @property
    def scalars(self) -> torch.Tensor:
        """cuDNN's fp32 scalars for this branch (`SCALARS` order), made on the device when asked: FA3's path takes
        only the amaxes."""
        return _scalars(*self.amaxes)


def _branch_operands(q: torch.Tensor, kv_buffer: torch.Tensor, layout: PackedKVLayout, branch: int,
                     centred: bool) -> BranchOperands:
    k, v = layout.branch_kv(kv_buffer, branch)
    q_b, k, v = (t.contiguous() for t in (q[branch], k, v))  # views of contiguous buffers: no copy
    amaxes = [amax(q_b), amax(k), amax(v)]
    v_mean = out_bias = None
    if centred:
        v_mean = v.mean(0, dtype=torch.float32)
        amaxes[2] = amaxes[2] + amax(v_mean)  # bounds |v - v_mean| without a pass over v - v_mean
        out_bias = v_mean.repeat_interleave(q_b.shape[1] // k.shape[1], 0)
    return BranchOperands(q_b, k, v, tuple(amaxes), v_mean, out_bias)


# --------------------------------------------------------------------------------------------------
# PyTorch reference of the whole op
# --------------------------------------------------------------------------------------------------
def prefix_attention_fp8_reference(
    q: torch.Tensor,
    kv_buffer: torch.Tensor,
    layout: PackedKVLayout,
    *,
    scale: float | None = None,
    out: torch.Tensor | None = None,
    centred: bool = True,
    probability_scale: float = E4M3_MAX,
    e4m3_output: bool = True,
) -> torch.Tensor:
    """The op in the module docstring, in fp32 from the e4m3 operands; returns [B, N, Hq, D] in q's dtype.
    `centred=False`: v quantised as it is (no mean taken out, none added back). The other two describe the kernel
    (`cosmos3_kernels.attention_fp8_fa3` models FA3 with them): the scale a row's largest probability is rounded at (cuDNN's
    448), and whether the output is rounded to e4m3 before it is dequantised (cuDNN on Hopper) or kept in fp32 until
    its one rounding to q's dtype."""
    batch, n_gen, hq, head_dim = q.shape
    scale = scale if scale is not None else 1.0 / math.sqrt(head_dim)
    out = torch.empty_like(q) if out is None else out
    for branch in range(batch):
        ops = _branch_operands(q, kv_buffer, layout, branch, centred)
        s = ops.scalars
        q8 = quantize_e4m3_reference(ops.q, ops.amaxes[0])
        k8 = quantize_e4m3_reference(ops.k, ops.amaxes[1])
        v8 = quantize_e4m3_reference(ops.v, ops.amaxes[2], ops.v_mean)
        groups = hq // k8.shape[1]
        qf = q8.float().transpose(0, 1) * s[0]                                     # [Hq, N, D]
        kf = k8.float().transpose(0, 1).repeat_interleave(groups, 0) * s[1]        # [Hq, L, D]
        vf = v8.float().transpose(0, 1).repeat_interleave(groups, 0) * s[2]
        scores = qf @ kf.transpose(1, 2) * scale
        p = torch.exp(scores - scores.amax(-1, keepdim=True))
        p8 = (p * probability_scale).to(torch.float8_e4m3fn).float() * (1.0 / probability_scale)  # as cuDNN's descale_s
        o = (p8 @ vf) / p.sum(-1, keepdim=True)
        if e4m3_output:
            o8 = (o * s[5]).clamp_(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn).transpose(0, 1)   # [N, Hq, D]
            out[branch] = dequantize_e4m3_reference(o8, s[6], q.dtype, ops.out_bias)
        else:
            out[branch] = dequantize_e4m3_reference(o.transpose(0, 1), torch.ones_like(s[6]), q.dtype, ops.out_bias)
    return out


# --------------------------------------------------------------------------------------------------
# cuDNN
# --------------------------------------------------------------------------------------------------
CUDNN_DISTRIBUTION = "nvidia-cudnn-frontend"


@functools.cache
def _cudnn():
    """cuDNN's Python frontend, or None where it is not installed (it is optional: requirements-gpu.txt)."""
    try:
        import cudnn
    except Exception:  # ImportError, or its compiled module failing to load the cuDNN library
        return None
    return cudnn


def unavailable(device) -> str | None:
    """What `device` or this host lacks for cuDNN's FP8 SDPA (None: nothing)."""
    device = torch.device(device)
    if device.type != "cuda":
        return f"device {device} (cuDNN's FP8 attention needs CUDA)"
    major, minor = torch.cuda.get_device_capability(device)
    if major < 9:
        return f"compute capability {major}.{minor} (cuDNN's FP8 attention needs Hopper, 9.0, or newer)"
    if _cudnn() is None:
        return f"{CUDNN_DISTRIBUTION} is not installed (pip install -r requirements-gpu.txt)"
    return None


def unsupported(q: torch.Tensor, kv_buffer: torch.Tensor) -> str | None:
    """Why this call cannot run on cuDNN's FP8 SDPA (None when it can), beyond the shapes and dtypes every
    prefix-attention path checks (`check_prefix_attention_inputs`)."""
    why = unavailable(q.device)
    if why is None and q.shape[-1] not in HEAD_DIMS:
        why = f"head_dim {q.shape[-1]} (measured and allowed: {HEAD_DIMS})"
    return why


def check_fp8_call(q: torch.Tensor, kv_buffer: torch.Tensor, layout: PackedKVLayout, unsupported_by) -> None:
    """Raise ValueError, saying why, on a call an FP8 attention cannot run: the shapes every prefix-attention path
    checks, what `unsupported_by(q, kv_buffer)` (the kernel's own check) names, and device lengths (each branch is
    quantised by host integers)."""
    check_prefix_attention_inputs(q, kv_buffer, layout)
    why = unsupported_by(q, kv_buffer)
    if why is not None:
        raise ValueError(f"FP8 attention cannot run this call: {why}")
    if layout.lengths is not None:
        raise ValueError("FP8 attention quantises each branch by host integers; a layout with its lengths on the "
                         "device (a step graph kept across prompt lengths) needs the bf16 attention")


class CudnnFP8Attention:
    """The op through cuDNN's FP8 SDPA, one call per branch; cuDNN graphs are built on a shape's first call
    (about 1 s each) and kept per (queries, keys, heads, head_dim, scale). Each call sets the handle to the
    current stream, so a call made under CUDA-graph capture is captured. `centred=False`: v as it is (module
    docstring)."""

    name = "cudnn"  # what a result's summary says ran (engine.pipeline.fp8.result_attention_kernel)

    def __init__(self, centred: bool = True) -> None:
        self.centred = centred
        self._graphs: dict[tuple, tuple] = {}
        self._handles: dict[int, object] = {}

    def __call__(self, q: torch.Tensor, kv_buffer: torch.Tensor, layout: PackedKVLayout, *,
                 scale: float | None = None, out: torch.Tensor | None = None) -> torch.Tensor:
        check_fp8_call(q, kv_buffer, layout, unsupported)
        batch, n_gen, hq, head_dim = q.shape
        scale = scale if scale is not None else 1.0 / math.sqrt(head_dim)
        out = torch.empty_like(q) if out is None else out
        cudnn = _cudnn()
        handle = self._handle(q.device)
        cudnn.set_stream(handle=handle, stream=torch.cuda.current_stream(q.device).cuda_stream)
        for branch in range(batch):
            ops = _branch_operands(q, kv_buffer, layout, branch, self.centred)
            q8, k8 = quantize_e4m3(ops.q, ops.amaxes[0]), quantize_e4m3(ops.k, ops.amaxes[1])
            v8 = quantize_e4m3(ops.v, ops.amaxes[2], bias=ops.v_mean)
            o8 = torch.empty_like(q8)
            graph, tensors, workspace = self._graph(q.device, n_gen, k8.shape[0], hq, k8.shape[1], head_dim, scale)
            pack = {tensors["q"]: q8, tensors["k"]: k8, tensors["v"]: v8, tensors["o"]: o8}
            scalars = ops.scalars
            pack.update({tensors[name]: scalars[i:i + 1].view(1, 1, 1, 1)
                         for i, name in enumerate(SCALARS) if name in tensors})
            graph.execute(pack, workspace, handle=handle)
            target = out[branch]
            descale_o = scalars[6:7]
            if target.is_contiguous():
                dequantize_e4m3(o8, descale_o, target, bias=ops.out_bias)
            else:
                target.copy_(dequantize_e4m3(o8, descale_o, torch.empty_like(ops.q), bias=ops.out_bias))
        return out

    def _handle(self, device: torch.device):
        index = device.index if device.index is not None else torch.cuda.current_device()
        if index not in self._handles:
            with torch.cuda.device(index):
                self._handles[index] = _cudnn().create_handle()
        return self._handles[index]

    def _graph(self, device, n_q: int, n_kv: int, hq: int, hk: int, head_dim: int, scale: float):
        key = (str(device), n_q, n_kv, hq, hk, head_dim, scale)
        if key not in self._graphs:
            self._graphs[key] = _build_graph(_cudnn(), self._handle(device), device, n_q, n_kv, hq, hk, head_dim, scale)
        return self._graphs[key]


def _build_graph(cudnn, handle, device, n_q: int, n_kv: int, hq: int, hk: int, head_dim: int, scale: float):
    """cuDNN's FP8 SDPA graph over contiguous token-major e4m3 operands, built with the heuristic's first plan.
    Why that plan: of the three cuDNN 9.19 offers on an H200 it was the fastest at 44k tokens (38.6-39.3 ms a
    branch against 44.2-44.7) and within 2% at 12k (`bench/bench_attention_fp8.py --plans`; docs/perf-log/2026-12-02.md)."""
    graph, tensors = sdpa_fp8_graph(cudnn, handle, n_q, n_kv, hq, hk, head_dim, scale)
    graph.build([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
    workspace = torch.empty(max(graph.get_workspace_size(), 1), dtype=torch.uint8, device=device)
    return graph, tensors, workspace


def sdpa_fp8_graph(cudnn, handle, n_q: int, n_kv: int, hq: int, hk: int, head_dim: int, scale: float,
                   heads_major: bool = False):
    """cuDNN's FP8 SDPA graph, defined and not yet built, and its tensors by name ("o" and "amax_o" among them).
    The e4m3 operands are stored token-major, [rows, heads, head_dim] (the engine's), or heads-major,
    [heads, rows, head_dim] (`heads_major`: only the benchmark uses it, and it was not faster)."""
    fp8, f32 = cudnn.data_type.FP8_E4M3, cudnn.data_type.FLOAT
    graph = cudnn.pygraph(io_data_type=fp8, intermediate_data_type=f32, compute_data_type=f32, handle=handle)

    def geometry(rows: int, heads: int) -> dict:  # cuDNN's logical [batch, heads, rows, head_dim] over the storage
        size = rows * heads * head_dim
        strides = (size, rows * head_dim, head_dim, 1) if heads_major else (size, head_dim, heads * head_dim, 1)
        return {"dim": (1, heads, rows, head_dim), "stride": strides}

    tensors = {"q": graph.tensor(name="q", data_type=fp8, **geometry(n_q, hq)),
               "k": graph.tensor(name="k", data_type=fp8, **geometry(n_kv, hk)),
               "v": graph.tensor(name="v", data_type=fp8, **geometry(n_kv, hk))}
    one = {"dim": (1, 1, 1, 1), "stride": (1, 1, 1, 1)}
    tensors.update({name: graph.tensor(name=name, data_type=f32, **one) for name in SCALARS if name not in ("descale_o", "amax_o")})
    o, _stats, _amax_s, amax_o = graph.sdpa_fp8(
        q=tensors["q"], k=tensors["k"], v=tensors["v"],
        descale_q=tensors["descale_q"], descale_k=tensors["descale_k"], descale_v=tensors["descale_v"],
        descale_s=tensors["descale_s"], scale_s=tensors["scale_s"], scale_o=tensors["scale_o"],
        is_inference=True, attn_scale=scale, use_causal_mask=False, name="prefix_attention_fp8",
    )
    o.set_output(True).set_data_type(fp8).set_dim(geometry(n_q, hq)["dim"]).set_stride(geometry(n_q, hq)["stride"])
    amax_o.set_output(True).set_data_type(f32).set_dim(one["dim"]).set_stride(one["stride"])
    tensors["o"], tensors["amax_o"] = o, amax_o  # descale_o is ours (the dequantisation reads it), not cuDNN's
    return graph, tensors


# The op "attention_fp8" (cosmos3_kernels.registry): a runner (`CudnnFP8Attention`) for a device, chosen by rank
# (`cosmos3_kernels.dispatch.choose_fp8_attention`); cuDNN's ranks after FA3's (attention_fp8_fa3 says why).
registry.register("attention_fp8", "cudnn", supported=lambda device: unavailable(device), rank=1,
                  call=lambda centred=True: CudnnFP8Attention(centred=centred))
