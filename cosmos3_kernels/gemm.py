"""QuACK's Hopper GEMM with the MLP's activation in its epilogue, beside its PyTorch reference.

QuACK (`quack-kernels`, Dao-AILab's CuTe DSL kernels; flash-attn-4 installs it) runs the MLP's input GEMM and its
activation in one kernel (`mlp_in_quack`, reference `mlp_in_reference`): SwiGLU over the fused [gate; up] weight
(Nano), ReLU^2 (Edge). The activation reads the fp32 accumulator and the result is rounded once, where the split
path (cuBLAS, then `norms.swiglu`/`norms.relu2`) rounds the GEMM's output first, as diffusers does. It saves the
split path's write and read-back of the GEMM's output (for SwiGLU twice the activation's size): ~40 ms of a Nano
720p step on the H200; at Edge 480p the op is 1.24x faster alone, but the step's gain (0-8 ms) is within its spread. Other bytes, and more accurate: dispatch
(`KernelDispatcher.mlp_in`) offers it only to a caller that allows one rounding (the fast tower, for videos:
`engine.pipeline.fast_path.fuses_mlp_activation`) and only where its output is no further from the fp32 result
than the split path's on that call.

What QuACK offers that is not used, for measured reasons (docs/perf-log/2026-12-02.md, "GEMMs: QuACK"):
- its plain GEMM for the projections: cuBLAS's bytes at every tower shape, and faster than cuBLAS at some shapes
  when timed alone, but a whole step with it, where dispatch took it, was slower (Nano 720p +9.7 ms, Edge 480p
  +5.8 ms, interleaved in one process);
- the residual add in its epilogue: it adds the fp32 accumulator to the residual and rounds once, where the tower
  rounds the GEMM's output first, and the add + RMSNorm after it reads the stream anyway.

QuACK fingerprints an epilogue's Python code, and takes only code under a `site-packages` (or `dist-packages`)
folder as installed library code. Installed elsewhere (`pip install --target /some/dir`), the fingerprint walks
into the CuTe DSL's internals and its epilogue GEMMs fail to build; `mlp_in_unsupported` then says so.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from cosmos3_kernels import registry
from cosmos3_kernels import settings
from cosmos3_kernels.optional import warn_if_installed

QUACK_ENV_VAR = "COSMOS3_QUACK"
QUACK_DISTRIBUTION = "quack-kernels"
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


def quack_unsupported(x: torch.Tensor, w: torch.Tensor) -> str | None:
    """Why QuACK's GEMM cannot take ``x @ w^T`` (None when it can, QuACK being importable)."""
    if not settings.current().quack:
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
    return None


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
        warn_if_installed(QUACK_DISTRIBUTION, err, "cuBLAS's GEMM then the activation as a kernel of its own")
        return None, f"QuACK's epilogue GEMMs not importable ({type(err).__name__}: {str(err)[:160]})"
    return gemm_act, None


def _load_quack() -> str | None:
    """Import QuACK's epilogue GEMMs now, unless turned off (`registry.load_libraries`)."""
    return f"{QUACK_ENV_VAR}=0" if not settings.current().quack else _epilogue_entry()[1]


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
    from quack.gemm_config import GemmConfig

    return GemmConfig(tile_m=config.tile_m, tile_n=config.tile_n, pingpong=config.pingpong,
                      cluster_m=config.cluster_m, cluster_n=config.cluster_n,
                      is_dynamic_persistent=False, device_capacity=9)


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


# --------------------------------------------------------------------------------------------------
# Backends (cosmos3_kernels.registry)
# --------------------------------------------------------------------------------------------------
def mlp_in_split(x: torch.Tensor, w: torch.Tensor, activation: str, *, swiglu=None, relu2=None,
                 config=None) -> torch.Tensor:
    """The split path: cuBLAS's GEMM, rounded, then the activation's own pass, which rounds as diffusers' ops do
    (`swiglu(gate, up)`, `relu2(y)`: the dispatcher passes its own, dispatched in turn; default the references)."""
    y = F.linear(x, w)
    if activation == "swiglu":
        half = y.shape[-1] // 2
        return (swiglu or (lambda gate, up: F.silu(gate) * up))(y[:, :half], y[:, half:])
    return (relu2 or (lambda t: torch.relu(t).square()))(y)


registry.describe("mlp_in", key=lambda x, w, activation: (x.dtype, tuple(x.shape), tuple(w.shape), activation))
registry.register("mlp_in", "torch", supported=lambda x, w, activation, **kwargs: None, call=mlp_in_split,
                  reference=True)
# Never forced: the epilogue is a library's kernel, not one of ours.
registry.register("mlp_in", "quack", supported=lambda x, w, activation, **kwargs: mlp_in_unsupported(x, w, activation),
                  call=lambda x, w, activation, *, config=None, **kwargs: mlp_in_quack(x, w, activation, config=config),
                  configs="quack", library=True, forcible=False, load=_load_quack)
