"""QuACK's Hopper GEMMs for the gen tower, each beside its PyTorch reference.

QuACK (`quack-kernels`, Dao-AILab's CuTe DSL kernels; flash-attn-4 installs it) serves two ops here:
- the bf16 projections (`linear_quack`, reference `linear_reference`: cuBLAS via `F.linear`). QuACK gives cuBLAS's
  bytes at every tower shape tested on an H200 and is faster at some: dispatch (`KernelDispatcher.linear`) times
  both per shape and offers a QuACK config only where, on that first call, its output equals `F.linear`'s bit for
  bit, so an exact path stays exact;
- the MLP's input GEMM with its activation in the epilogue (`mlp_in_quack`, reference `mlp_in_reference`):
  SwiGLU over the fused [gate; up] weight (Nano), ReLU^2 (Edge). The activation reads the fp32 accumulator and
  the result is rounded once, where the split path (cuBLAS, then `norms.swiglu`/`norms.relu2`) rounds the GEMM's
  output first, as diffusers does. It saves the split path's write and read-back of the GEMM's output (SwiGLU:
  twice the activation's size). Other bytes, more accurate: dispatch (`KernelDispatcher.mlp_in`) offers it only
  to a caller that allows one rounding (the fast tower, for videos: `engine.pipeline.fast_path.fuses_mlp_activation`)
  and only where its output is no further from the fp32 result than the split path's on that call.

The residual add in QuACK's epilogue is not used: it adds the fp32 accumulator to the residual and rounds once,
where the tower rounds the GEMM's output first; the add + RMSNorm after it reads the stream anyway
(docs/PERFORMANCE.md, "GEMMs: QuACK").

QuACK fingerprints an epilogue's Python code, and takes only code under a `site-packages` (or `dist-packages`)
folder as installed library code. Installed elsewhere (`pip install --target /some/dir`), the fingerprint walks
into the CuTe DSL's internals and its epilogue GEMMs fail to build (`mlp_in_unsupported` then says so).
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


MLP_ACTIVATIONS = ("swiglu", "relu_sq")  # QuACK's names: SwiGLU over [gate; up], and ReLU^2
# Rows of the first call on which dispatch compares the fused op's error against fp32 with the split path's: enough
# for a stable relative L2, few enough that the fp32 GEMM of the comparison stays small at Nano's widths.
ERROR_ROWS = 1024


def mlp_in_reference(x: torch.Tensor, w: torch.Tensor, activation: str, *,
                     out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """What `mlp_in_quack` computes: the activation of ``x @ w^T`` in fp32, rounded once to ``out_dtype`` (x's by
    default). "swiglu": ``silu(gate) * up`` with w's first half of rows the gate's; "relu_sq": ``relu(y)^2``."""
    if activation not in MLP_ACTIVATIONS:
        raise ValueError(f"activation must be one of {MLP_ACTIVATIONS}, got {activation!r}")
    y = x.float() @ w.float().T
    if activation == "swiglu":
        gate, up = y.chunk(2, dim=-1)
        out = F.silu(gate) * up
    else:
        out = torch.relu(y).square()
    return out.to(x.dtype if out_dtype is None else out_dtype)


@functools.lru_cache(maxsize=1)
def _epilogue_entry():
    """(QuACK's GEMM-with-activation entry, why not): imported once, on first use. Importing QuACK's epilogue
    library builds its fingerprints, which is where an install outside site-packages fails (module docstring)."""
    try:
        import quack.epilogue.library  # noqa: F401 - the import is the check
        from quack.gemm_interface import gemm_act
    except Exception as err:  # ImportError, or the fingerprint's TypeError
        return None, f"QuACK's epilogue GEMMs not importable ({type(err).__name__}: {str(err)[:160]})"
    return gemm_act, None


def mlp_in_unsupported(x: torch.Tensor, w: torch.Tensor, activation: str) -> str | None:
    """Why QuACK cannot run the MLP's input GEMM with ``activation`` in its epilogue (None when it can)."""
    if activation not in MLP_ACTIVATIONS:
        return f"activation {activation!r} (QuACK's epilogue here: {', '.join(MLP_ACTIVATIONS)})"
    if activation == "swiglu" and w.dim() == 2 and w.shape[0] % 16:
        return f"N {w.shape[0]}: [gate; up] halves must each be a multiple of 8 (TMA needs 16-byte rows)"
    why = quack_unsupported(x, w)
    if why is not None:
        return why
    return _epilogue_entry()[1]


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


def mlp_in_quack(x: torch.Tensor, w: torch.Tensor, activation: str, *,
                 config: QuackConfig = DEFAULT_QUACK_CONFIGS[0]) -> torch.Tensor:
    """`mlp_in_reference` on QuACK's Hopper GEMM, the activation in its epilogue; the pre-activation is not stored.
    SwiGLU reads the fused weight as it is: ``concat_layout=("B",)`` tells QuACK that B's N columns are [gate; up]
    (it pairs them in its layout, without a copy)."""
    gemm_act, why = _epilogue_entry()
    if gemm_act is None:
        raise RuntimeError(why)
    width = w.shape[0] // 2 if activation == "swiglu" else w.shape[0]
    out = torch.empty(x.shape[0], width, dtype=x.dtype, device=x.device)
    extra = {"concat_layout": ("B",)} if activation == "swiglu" else {}
    gemm_act(x, w.T, activation=activation, postact_out=out, store_preact=False, tuned=False,
             config=_library_config(config), **extra)
    return out
