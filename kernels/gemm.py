"""QuACK's Hopper GEMM for the gen tower's bf16 projections, beside its reference (cuBLAS via `F.linear`).

QuACK (`quack-kernels`, Dao-AILab's CuTe DSL kernels; flash-attn-4 installs it) gives cuBLAS's bytes at every
tower shape tested on an H200, and is faster at some of them: dispatch (`KernelDispatcher.linear`) times both
per shape and offers a QuACK config only where, on that first call, its output equals `F.linear`'s bit for bit,
so an exact path stays exact (bench/bench_quack.py and docs/PERFORMANCE.md, "QuACK's GEMMs", have the numbers).

Two things QuACK offers are not used, for measured reasons:
- the residual add in the GEMM's epilogue (the attention-out and down projections, 1.01-1.12x with the add +
  RMSNorm after it, in bench_quack's `residual` rows): it adds the fp32 accumulator to the residual and rounds
  once, where the tower rounds the GEMM's output first, as diffusers does; other bytes (tests/test_kernels_gemm.py
  shows it), so not on the exact path;
- the fused activations (`gemm_act`: SwiGLU, ReLU^2): they fail to build with QuACK 0.6.5 over
  nvidia-cutlass-dsl 4.8.1 (docs/data/bench_quack_2026-12-02_mlp_in_failure.log).
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
