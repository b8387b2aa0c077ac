"""Fused residual-add + RMSNorm and the MLP activations (SwiGLU, ReLU^2), with PyTorch references.

Around each gen-tower MLP the split path runs, per layer:

    residual = hidden + attn_out                         # 1 kernel: read 2, write 1
    normed = post_attention_layernorm(residual)          # ~7 kernels over [tokens, hidden]
    act = silu(gate) * up   |   relu(up).square()        # 2 kernels over [tokens, intermediate]

Every one of those reads and writes the whole activation. The fused kernels read each input once and
write each output once: add+norm moves 4 rows instead of ~16, an activation 3 (or 2) instead of 6 (4).
They are memory-bound, so their ceiling is the copy bandwidth. Rounding follows the split path (the
residual sum is rounded to the activation dtype before the norm reads it; SiLU's output is rounded
before the gate multiply), but the reductions and exp run in Triton's order, so results agree to a
rounding step, not bit for bit.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from cosmos3_kernels import registry
from cosmos3_kernels.qk_norm_rope import FLAVOURS, _round_to, rms_norm_reference


# --------------------------------------------------------------------------------------------------
# PyTorch references (the split path)
# --------------------------------------------------------------------------------------------------
def add_rms_norm_reference(
    x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float, flavour: str = "diffusers"
) -> tuple[torch.Tensor, torch.Tensor]:
    """``h = x + residual`` (skipped when residual is None), then RMSNorm(h); returns (normed, h)."""
    hidden = x if residual is None else x + residual
    return rms_norm_reference(hidden, weight, eps, flavour), hidden


def swiglu_reference(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    return F.silu(gate) * up


def relu2_reference(x: torch.Tensor) -> torch.Tensor:
    return torch.relu(x).square()


# --------------------------------------------------------------------------------------------------
# Kernels
# --------------------------------------------------------------------------------------------------
@triton.jit
def _add_rms_norm_kernel(
    x_ptr, r_ptr, w_ptr, out_ptr, h_ptr,
    n_cols, eps,
    s_x, s_r, s_out, s_h,
    BLOCK: tl.constexpr, HAS_RESIDUAL: tl.constexpr, NEMOTRON: tl.constexpr,
):
    # One row per program: a whole hidden row (2048-5120 values) fits in registers, so the sum of
    # squares and the scaling need no second pass over memory.
    DTYPE: tl.constexpr = out_ptr.dtype.element_ty
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    h = tl.load(x_ptr + row * s_x + cols, mask=mask, other=0.0).to(tl.float32)
    if HAS_RESIDUAL:
        h = _round_to(h + tl.load(r_ptr + row * s_r + cols, mask=mask, other=0.0).to(tl.float32), DTYPE)
        tl.store(h_ptr + row * s_h + cols, h.to(DTYPE), mask=mask)
    rstd = tl.math.rsqrt(tl.sum(h * h, axis=0) / n_cols + eps)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    if NEMOTRON:
        y = _round_to(w * (h * rstd), DTYPE)
    else:
        y = _round_to(_round_to(h * rstd, DTYPE) * w, DTYPE)
    tl.store(out_ptr + row * s_out + cols, y.to(DTYPE), mask=mask)


@triton.jit
def _swiglu_kernel(g_ptr, u_ptr, out_ptr, n_cols, s_g, s_u, s_out, BLOCK: tl.constexpr):
    DTYPE: tl.constexpr = out_ptr.dtype.element_ty
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < n_cols
    g = tl.load(g_ptr + row * s_g + cols, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(u_ptr + row * s_u + cols, mask=mask, other=0.0).to(tl.float32)
    act = _round_to(g / (1.0 + tl.exp(-g)), DTYPE)  # F.silu's formula, rounded like its output
    tl.store(out_ptr + row * s_out + cols, _round_to(act * u, DTYPE).to(DTYPE), mask=mask)


@triton.jit
def _relu2_kernel(x_ptr, out_ptr, n_cols, s_x, s_out, BLOCK: tl.constexpr):
    DTYPE: tl.constexpr = out_ptr.dtype.element_ty
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.maximum(tl.load(x_ptr + row * s_x + cols, mask=mask, other=0.0).to(tl.float32), 0.0)
    tl.store(out_ptr + row * s_out + cols, _round_to(x * x, DTYPE).to(DTYPE), mask=mask)


# --------------------------------------------------------------------------------------------------
# Host wrappers
# --------------------------------------------------------------------------------------------------
_ACT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def _rows(t: torch.Tensor, name: str) -> torch.Tensor:
    """View as [rows, cols] without a copy; the last dim must be contiguous."""
    if t.stride(-1) != 1:
        raise ValueError(f"{name} must be contiguous in its last dim, got strides {t.stride()}")
    flat = t.reshape(-1, t.shape[-1]) if t.dim() != 2 else t
    if flat.data_ptr() != t.data_ptr():
        raise ValueError(f"{name} cannot be viewed as rows without a copy (strides {t.stride()})")
    return flat


def add_rms_norm(
    x: torch.Tensor,
    residual: torch.Tensor | None,
    weight: torch.Tensor,
    *,
    eps: float,
    flavour: str = "diffusers",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Fused ``h = x + residual; normed = RMSNorm(h)``; returns (normed, h) like the reference."""
    if flavour not in FLAVOURS:
        raise ValueError(f"flavour must be one of {FLAVOURS}, got {flavour!r}")
    if x.dtype not in _ACT_DTYPES:
        raise ValueError(f"dtype must be one of {_ACT_DTYPES}, got {x.dtype}")
    n_cols = x.shape[-1]
    if tuple(weight.shape) != (n_cols,):
        raise ValueError(f"weight must be [{n_cols}], got {tuple(weight.shape)}")
    if flavour == "diffusers" and weight.dtype != x.dtype:
        raise ValueError(f"diffusers flavour needs the weight in {x.dtype}, got {weight.dtype}")
    if residual is not None and (residual.shape != x.shape or residual.dtype != x.dtype):
        raise ValueError(f"residual must match x {tuple(x.shape)} {x.dtype}, got {tuple(residual.shape)} {residual.dtype}")
    x2 = _rows(x, "x")
    r2 = _rows(residual, "residual") if residual is not None else x2
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    hidden = torch.empty_like(out) if residual is not None else x
    out2, h2 = out.view(-1, n_cols), _rows(hidden, "hidden")
    block = triton.next_power_of_2(n_cols)
    # Why 8 warps for wide rows: 4096 bf16 values = 16 per thread, two 16-byte loads each.
    num_warps = 8 if block >= 4096 else 4
    _add_rms_norm_kernel[(x2.shape[0],)](
        x2, r2, weight, out2, h2, n_cols, float(eps),
        x2.stride(0), r2.stride(0), out2.stride(0), h2.stride(0),
        BLOCK=block, HAS_RESIDUAL=residual is not None, NEMOTRON=flavour == "nemotron", num_warps=num_warps,
    )
    return out, hidden


def swiglu(gate: torch.Tensor, up: torch.Tensor, *, block: int = 2048) -> torch.Tensor:
    """``silu(gate) * up``; gate and up may be strided views of one fused gate/up projection."""
    if gate.shape != up.shape or gate.dtype != up.dtype or gate.dtype not in _ACT_DTYPES:
        raise ValueError(f"gate/up must match, got {tuple(gate.shape)} {gate.dtype} / {tuple(up.shape)} {up.dtype}")
    g2, u2 = _rows(gate, "gate"), _rows(up, "up")
    out = torch.empty(gate.shape, dtype=gate.dtype, device=gate.device)
    o2 = out.view(-1, gate.shape[-1])
    n_cols = gate.shape[-1]
    block = min(block, triton.next_power_of_2(n_cols))
    _swiglu_kernel[(g2.shape[0], triton.cdiv(n_cols, block))](
        g2, u2, o2, n_cols, g2.stride(0), u2.stride(0), o2.stride(0), BLOCK=block, num_warps=4,
    )
    return out


def relu2(x: torch.Tensor, *, block: int = 2048) -> torch.Tensor:
    """``relu(x) ** 2`` in one pass."""
    if x.dtype not in _ACT_DTYPES:
        raise ValueError(f"dtype must be one of {_ACT_DTYPES}, got {x.dtype}")
    x2 = _rows(x, "x")
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    o2 = out.view(-1, x.shape[-1])
    n_cols = x.shape[-1]
    block = min(block, triton.next_power_of_2(n_cols))
    _relu2_kernel[(x2.shape[0], triton.cdiv(n_cols, block))](
        x2, o2, n_cols, x2.stride(0), o2.stride(0), BLOCK=block, num_warps=4,
    )
    return out


# --------------------------------------------------------------------------------------------------
# Backends (cosmos3_kernels.registry): the references widen to fp32, a few fp32 copies of the input at their peak;
# the kernels write their outputs only.
# --------------------------------------------------------------------------------------------------
def _layout_refused(x: torch.Tensor, *more: torch.Tensor | None) -> str | None:
    if x.dtype in _ACT_DTYPES and all(t is None or t.stride(-1) == 1 for t in (x, *more)):
        return None
    return f"dtype {x.dtype} or layout (last dim must be contiguous)"


def _add_rms_norm_refused(x, residual, weight, *, eps, flavour="diffusers"):
    why = _layout_refused(x, residual)
    if why is None and flavour != "nemotron" and weight.dtype != x.dtype:
        why = f"dtype {x.dtype} or layout (last dim must be contiguous)"
    return why


def _always(*args, **kwargs) -> None:
    return None


def _kernel_bytes(x, *args, **kwargs) -> int:
    return 2 * x.numel() * x.element_size()


def _reference_bytes(x, *args, **kwargs) -> int:
    return 12 * x.numel()


registry.describe("add_rms_norm", key=lambda x, residual, weight, *, eps, flavour="diffusers": (
    x.dtype, tuple(x.shape), residual is None, flavour))
registry.describe("swiglu", key=lambda gate, up: (gate.dtype, tuple(gate.shape)))
registry.describe("relu2", key=lambda x: (x.dtype, tuple(x.shape)))
registry.register("add_rms_norm", "torch", supported=_always, reference=True, need_bytes=_reference_bytes,
                  call=lambda x, residual, weight, *, eps, flavour="diffusers", config=None:
                  add_rms_norm_reference(x, residual, weight, eps, flavour))
registry.register("add_rms_norm", "triton", supported=_add_rms_norm_refused, need_bytes=_kernel_bytes,
                  call=lambda x, residual, weight, *, eps, flavour="diffusers", config=None:
                  add_rms_norm(x, residual, weight, eps=eps, flavour=flavour))
registry.register("swiglu", "torch", supported=_always, reference=True, need_bytes=_reference_bytes,
                  call=lambda gate, up, *, config=None: swiglu_reference(gate, up))
registry.register("swiglu", "triton", supported=lambda gate, up: _layout_refused(gate, up), need_bytes=_kernel_bytes,
                  call=lambda gate, up, *, config=None: swiglu(gate, up))
registry.register("relu2", "torch", supported=_always, reference=True, need_bytes=_reference_bytes,
                  call=lambda x, *, config=None: relu2_reference(x))
registry.register("relu2", "triton", supported=lambda x: _layout_refused(x), need_bytes=_kernel_bytes,
                  call=lambda x, *, config=None: relu2(x))
