"""QuACK's Hopper GEMMs for the gen tower's bf16 projections, beside their reference (cuBLAS via `F.linear`).

QuACK (`quack-kernels`, Dao-AILab's CuTe DSL kernels; flash-attn-4 installs it) measured faster than cuBLAS at
the tower's shapes on an H200 (bench/bench_quack.py, docs/PERFORMANCE.md "QuACK's GEMMs"): the q|k|v projection
1.04x at Nano 720p and 1.06x at Edge 480p, and with the residual add in its epilogue, so that the add + RMSNorm
after it no longer reads the GEMM's output back, the attention-out projection and its norm 1.08-1.12x. Two ops:

    linear(x, w)                = x @ w^T
    linear_add(x, w, residual)  = residual + x @ w^T        (a new tensor; the residual is only read)

The dispatcher (`kernels.dispatch`) offers a QuACK config for a shape only where, on that first call, it gives
the reference's bytes exactly: `F.linear` then, for `linear_add`, PyTorch's bf16 add (the sum rounded once more,
as the fused add + RMSNorm rounds it). So an exact path stays exact, and a config that rounds differently is
left out rather than trusted. Its GEMMs with a fused activation (`gemm_act`: SwiGLU, ReLU^2) would save more,
but fail to build with QuACK 0.6.5 over nvidia-cutlass-dsl 4.8.1 (the log is in docs/data), so the activations
keep their own pass (`kernels.norms`).
"""
from __future__ import annotations

import functools
import os
from dataclasses import dataclass

import torch
import torch.nn.functional as F

QUACK_ENV_VAR = "COSMOS3_QUACK"
QUACK_DTYPES = (torch.bfloat16, torch.float16)


@dataclass(frozen=True)
class QuackConfig:
    """A QuACK tile config for Hopper: CTA tile, pingpong (two consumer warpgroups take turns) or cooperative,
    and the thread-block cluster."""

    tile_m: int = 128
    tile_n: int = 192
    pingpong: bool = True
    cluster_m: int = 2
    cluster_n: int = 1

    @property
    def label(self) -> str:
        kind = "p" if self.pingpong else "c"
        return f"{self.tile_m}x{self.tile_n}{kind}{self.cluster_m}x{self.cluster_n}"


# QuACK's own SM90 default, the fastest of three configs in every row bench_quack measured; one config keeps the
# first request's compile to one kernel per op (~2-3 s each; later shapes reuse it).
DEFAULT_QUACK_CONFIGS = (QuackConfig(),)


def linear_reference(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return F.linear(x, w)


def linear_add_reference(x: torch.Tensor, w: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
    return F.linear(x, w) + residual


@functools.lru_cache(maxsize=1)
def _quack_entry():
    """(QuACK's untuned GEMM entry, its GemmConfig class, why not): imported once, on first use."""
    try:
        from quack.gemm_config import GemmConfig
        from quack.gemm_interface import gemm_tuned
    except Exception as err:  # ImportError, or the CuTe DSL failing to load its compiler libraries
        return None, None, f"QuACK not importable ({type(err).__name__}: {err})"
    # `gemm_tuned` is QuACK's autotuned GEMM; `.fn` is the function under the autotuner, which takes an explicit
    # config (its autotuner would compile ~40 configs a kernel on the user's request).
    return gemm_tuned.fn, GemmConfig, None


def quack_unsupported(x: torch.Tensor, w: torch.Tensor) -> str | None:
    """Why QuACK cannot run ``x @ w^T`` (None when it can)."""
    if os.environ.get(QUACK_ENV_VAR, "1") == "0":
        return f"{QUACK_ENV_VAR}=0"
    if type(w) not in (torch.Tensor, torch.nn.Parameter):
        return f"weight is a {type(w).__name__} (a tensor subclass, e.g. an FP8 twin, runs through its own library)"
    if x.dtype not in QUACK_DTYPES or w.dtype != x.dtype:
        return f"dtypes {x.dtype} x {w.dtype} (QuACK here takes bf16 or fp16, both alike)"
    if x.dim() != 2 or w.dim() != 2 or x.shape[1] != w.shape[1]:
        return f"x {tuple(x.shape)} and w {tuple(w.shape)} (x [M, K] and w [N, K])"
    if not x.is_contiguous() or not w.is_contiguous():
        return f"x strides {x.stride()}, w strides {w.stride()} (both must be contiguous rows)"
    if x.shape[1] % 8 or w.shape[0] % 8:
        return f"K {x.shape[1]} or N {w.shape[0]} not a multiple of 8 (TMA needs 16-byte rows)"
    if x.device.type != "cuda":
        return f"device {x.device} (QuACK needs CUDA)"
    major, minor = torch.cuda.get_device_capability(x.device)
    if major != 9:
        return f"compute capability {major}.{minor} (these configs are QuACK's Hopper kernels, measured on SM90)"
    return _quack_entry()[2]


def _library_config(config: QuackConfig):
    _, gemm_config, _ = _quack_entry()
    return gemm_config(tile_m=config.tile_m, tile_n=config.tile_n, pingpong=config.pingpong,
                       cluster_m=config.cluster_m, cluster_n=config.cluster_n,
                       is_dynamic_persistent=False, device_capacity=9)


def linear_quack(x: torch.Tensor, w: torch.Tensor, *, config: QuackConfig = DEFAULT_QUACK_CONFIGS[0]) -> torch.Tensor:
    """``x @ w^T`` ([M, K] x [N, K] -> [M, N]) on QuACK's Hopper GEMM."""
    gemm, _, why = _quack_entry()
    if gemm is None:
        raise RuntimeError(why)
    out = torch.empty(x.shape[0], w.shape[0], dtype=x.dtype, device=x.device)
    gemm(x, w.T, out, None, config=_library_config(config))
    return out


def linear_add_quack(x: torch.Tensor, w: torch.Tensor, residual: torch.Tensor, *,
                     config: QuackConfig = DEFAULT_QUACK_CONFIGS[0]) -> torch.Tensor:
    """``residual + x @ w^T`` with the add in the GEMM's epilogue (the residual is read, not written)."""
    gemm, _, why = _quack_entry()
    if gemm is None:
        raise RuntimeError(why)
    if residual.shape != (x.shape[0], w.shape[0]) or residual.dtype != x.dtype or not residual.is_contiguous():
        raise ValueError(f"residual must be contiguous {x.dtype} [{x.shape[0]}, {w.shape[0]}], got "
                         f"{tuple(residual.shape)} {residual.dtype} strides {residual.stride()}")
    out = torch.empty_like(residual)
    gemm(x, w.T, out, residual, config=_library_config(config))
    return out
