"""Gen-tower attention over the packed ``[prefix | gen]`` K/V buffer, with its PyTorch reference.

Gen queries of every CFG branch attend, with no mask, over their own branch's rows of the packed
buffer (``cosmos3_kernels/packed_kv.py``): prefix lengths differ between branches, the gen length is shared.
Flash attention (online softmax) in one launch for all branches: each program owns BLOCK_M queries of
one head of one branch and walks only that branch's ``prefix_b + N`` keys, so no padded key ever takes
softmax weight, and no per-branch launch or K/V concatenation is needed.

FLOPs: 4 * N * (L_b + N) * D * Hq per branch (two matmuls); K/V bytes are small beside that, so the
kernel is bound by the tensor cores and the exp units, and its ceiling is the measured bf16 matmul rate.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from cosmos3_kernels import registry
from cosmos3_kernels import settings
from cosmos3_kernels.optional import installed, warn_if_installed
from cosmos3_kernels.packed_kv import PackedKVLayout, kv_len_bucket

try:  # host-side TMA descriptors (Triton >= 3.3); the pointer path below works without them
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:  # pragma: no cover - depends on the Triton build
    TensorDescriptor = None

LOG2E = 1.4426950408889634


# --------------------------------------------------------------------------------------------------
# PyTorch reference and PyTorch path
# --------------------------------------------------------------------------------------------------
def prefix_attention_reference(
    q: torch.Tensor,
    kv_buffer: torch.Tensor,
    layout: PackedKVLayout,
    *,
    scale: float | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """SDPA once per branch over that branch's ``[prefix | gen]`` rows; returns [B, N, Hq, D].

    This is also the PyTorch path that dispatch falls back to: SDPA picks its own backend (cuDNN or
    FlashAttention on Hopper). When every branch has the same prefix length, one batched call does it.
    """
    batch, n_gen, hq, head_dim = q.shape
    if out is None:
        out = torch.empty_like(q)
    if layout.uniform_prefix:
        kv_len = layout.kv_len(0)
        kv = kv_buffer[:, : layout.total_rows].unflatten(1, (batch, kv_len))  # [2, B, L+N, Hkv, D]
        o = F.scaled_dot_product_attention(
            q.transpose(1, 2), kv[0].transpose(1, 2), kv[1].transpose(1, 2), scale=scale, enable_gqa=True
        )
        out.copy_(o.transpose(1, 2))
        return out
    for b in range(batch):
        k_b, v_b = layout.branch_kv(kv_buffer, b)
        o = F.scaled_dot_product_attention(
            q[b : b + 1].transpose(1, 2),
            k_b.unsqueeze(0).transpose(1, 2),
            v_b.unsqueeze(0).transpose(1, 2),
            scale=scale,
            enable_gqa=True,
        )
        out[b].copy_(o[0].transpose(0, 1))
    return out


# --------------------------------------------------------------------------------------------------
# Triton kernel
# --------------------------------------------------------------------------------------------------
@triton.jit
def _load_kv_tile(ptr, desc, row0, rows, head_col, s_row, offs_d, kv_end, MASKED: tl.constexpr,
                  USE_TMA: tl.constexpr):
    """A [BLOCK_N, D] tile of one head's K or V rows starting at row0."""
    if USE_TMA:
        # The copy engine fetches the tile; rows past this branch belong to the next branch or lie past
        # the buffer (zero-filled), and the caller masks their scores, so no bounds check is needed here.
        tile = desc.load([row0, head_col])
    else:
        r = (row0 + rows).to(tl.int64)
        p = ptr + r[:, None] * s_row + head_col + offs_d[None, :]
        if MASKED:
            tile = tl.load(p, mask=(row0 + rows < kv_end)[:, None], other=0.0)
        else:
            tile = tl.load(p)
    return tile


@triton.jit
def _dot(a, b, acc, UPCAST: tl.constexpr):
    if UPCAST:
        # Interpreter only: its dot multiplies bf16 storage bits as integers. bf16 -> fp32 is exact and
        # it accumulates in fp32 anyway, so this computes what the GPU computes. Never set on a GPU.
        acc = tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
    else:
        acc = tl.dot(a, b, acc)
    return acc


@triton.jit
def _attend_tile(acc, m_i, l_i, q, k, v, qk_scale, cols, kv_left, MASKED: tl.constexpr, UPCAST: tl.constexpr):
    """One online-softmax step over a [BLOCK_N] tile of keys (exp2 form: the scale folds log2(e))."""
    s = _dot(q, tl.trans(k), None, UPCAST)
    if MASKED:
        s = tl.where((cols < kv_left)[None, :], s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1) * qk_scale)
    # One FMA per score: s * scale - m.
    p = tl.math.exp2(s * qk_scale - m_new[:, None])
    alpha = tl.math.exp2(m_i - m_new)
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None]
    acc = _dot(p.to(v.dtype), v, acc, UPCAST)
    return acc, m_new, l_i


@triton.jit
def _prefix_attention_kernel(
    q_ptr, k_ptr, v_ptr, o_ptr, desc_k, desc_v, kv_start_ptr, kv_len_ptr, order_ptr,
    n_gen, qk_scale,
    s_qb, s_qn, s_qh,
    s_kv_row, s_kv_head,
    s_ob, s_on, s_oh,
    HQ: tl.constexpr, GROUP: tl.constexpr, HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, USE_TMA: tl.constexpr, UPCAST_DOT: tl.constexpr,
    WARP_SPECIALIZE: tl.constexpr,
):
    # Query blocks vary fastest in launch order: the programs in flight together share one (branch,
    # head), so that head's K/V rows are read from HBM about once and then served from L2.
    # Branches launch longest first: CFG branches differ in prefix length (1615 vs 2866 keys at T2I),
    # and the long programs must not be the last wave, or the GPU idles while they finish.
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = tl.load(order_ptr + pid_bh // HQ)
    h = pid_bh % HQ
    hk = h // GROUP  # GQA: GROUP consecutive q heads read one kv head
    kv_start = tl.load(kv_start_ptr + b)
    kv_len = tl.load(kv_len_ptr + b)
    kv_end = kv_start + kv_len
    head_col = hk * s_kv_head

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    rows = tl.arange(0, BLOCK_N)
    m_mask = (offs_m < n_gen)[:, None]
    q_base = q_ptr + b.to(tl.int64) * s_qb + h * s_qh
    q = tl.load(q_base + offs_m.to(tl.int64)[:, None] * s_qn + offs_d[None, :], mask=m_mask, other=0.0)

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)

    # Full tiles first, with no masks in the hot loop; then at most one masked tail tile.
    n_full = (kv_len // BLOCK_N) * BLOCK_N
    # WARP_SPECIALIZE asks Triton to split the loop into producer (TMA loads) and consumer (MMA, softmax)
    # warp groups, FA3's scheme; on Hopper that is Triton's automatic warp specialisation pass.
    for start in tl.range(0, n_full, BLOCK_N, warp_specialize=WARP_SPECIALIZE):
        row0 = kv_start + start
        k = _load_kv_tile(k_ptr, desc_k, row0, rows, head_col, s_kv_row, offs_d, kv_end, False, USE_TMA)
        v = _load_kv_tile(v_ptr, desc_v, row0, rows, head_col, s_kv_row, offs_d, kv_end, False, USE_TMA)
        acc, m_i, l_i = _attend_tile(acc, m_i, l_i, q, k, v, qk_scale, rows, BLOCK_N, False, UPCAST_DOT)
    if n_full < kv_len:
        row0 = kv_start + n_full
        k = _load_kv_tile(k_ptr, desc_k, row0, rows, head_col, s_kv_row, offs_d, kv_end, True, USE_TMA)
        v = _load_kv_tile(v_ptr, desc_v, row0, rows, head_col, s_kv_row, offs_d, kv_end, True, USE_TMA)
        if USE_TMA:
            # Rows past the branch may hold anything (another branch, stale data): zero V so that a
            # NaN there cannot reach acc through 0 * NaN.
            v = tl.where((rows < kv_len - n_full)[:, None], v, 0.0)
        acc, m_i, l_i = _attend_tile(acc, m_i, l_i, q, k, v, qk_scale, rows, kv_len - n_full, True, UPCAST_DOT)

    out = acc / l_i[:, None]
    o_base = o_ptr + b.to(tl.int64) * s_ob + h * s_oh
    tl.store(o_base + offs_m.to(tl.int64)[:, None] * s_on + offs_d[None, :], out.to(o_ptr.dtype.element_ty),
             mask=m_mask)


# --------------------------------------------------------------------------------------------------
# Host wrapper
# --------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class AttentionConfig:
    """Launch shape of the Triton kernel. Defaults are the H200 pick recorded in docs/perf-log/2026-12-02.md."""

    block_m: int = 128
    block_n: int = 128
    num_warps: int = 8
    num_stages: int = 3
    use_tma: bool = True
    warp_specialize: bool = False


def check_packed_attention_shapes(q: torch.Tensor, kv_buffer: torch.Tensor, layout: PackedKVLayout) -> None:
    """Raise ValueError where q [B, N, Hq, D] and the packed buffer do not fit the layout or each other (any dtype:
    what every attention over the packed buffer needs, whatever runs it)."""
    if q.dim() != 4:
        raise ValueError(f"q must be [branches, gen_tokens, q_heads, head_dim], got {tuple(q.shape)}")
    batch, n_gen, hq, head_dim = q.shape
    layout.check_buffer(kv_buffer)
    if layout.num_branches != batch or layout.gen_len != n_gen:
        raise ValueError(f"layout {layout} does not match q {tuple(q.shape)}")
    hkv = kv_buffer.shape[2]
    if kv_buffer.shape[3] != head_dim or hq % hkv:
        raise ValueError(f"q heads {hq} must be a multiple of kv heads {hkv}, head_dim {head_dim} == {kv_buffer.shape[3]}")


def check_prefix_attention_inputs(q: torch.Tensor, kv_buffer: torch.Tensor, layout: PackedKVLayout) -> None:
    """Raise ValueError on shapes the kernel does not handle (shared by wrapper and dispatch)."""
    check_packed_attention_shapes(q, kv_buffer, layout)
    head_dim = q.shape[-1]
    if head_dim < 16 or head_dim > 256 or head_dim & (head_dim - 1):
        raise ValueError(f"head_dim must be a power of two in [16, 256], got {head_dim}")
    if q.dtype != kv_buffer.dtype or q.dtype not in (torch.bfloat16, torch.float16):
        raise ValueError(f"q and kv_buffer must both be bf16 or fp16, got {q.dtype} / {kv_buffer.dtype}")
    if q.stride(-1) != 1:
        raise ValueError(f"q must be contiguous in its last dim, got strides {q.stride()}")


def _interpreting() -> bool:
    return settings.current().interpret


def _tma_ok(kv_buffer: torch.Tensor) -> bool:
    # A TMA descriptor needs a 16-byte aligned base and 16-byte multiples for every stride but the last.
    elt = kv_buffer.element_size()
    return (
        TensorDescriptor is not None
        and kv_buffer.is_contiguous()
        and kv_buffer.data_ptr() % 16 == 0
        and (kv_buffer.stride(1) * elt) % 16 == 0
    )


def prefix_attention(
    q: torch.Tensor,
    kv_buffer: torch.Tensor,
    layout: PackedKVLayout,
    *,
    scale: float | None = None,
    out: torch.Tensor | None = None,
    config: AttentionConfig | None = None,
) -> torch.Tensor:
    """Non-causal GQA flash attention of q [B, N, Hq, D] over each branch's packed K/V; [B, N, Hq, D]."""
    check_prefix_attention_inputs(q, kv_buffer, layout)
    config = config or AttentionConfig()
    batch, n_gen, hq, head_dim = q.shape
    hkv = kv_buffer.shape[2]
    if out is None:
        out = torch.empty_like(q, memory_format=torch.contiguous_format)
    elif tuple(out.shape) != tuple(q.shape) or out.dtype != q.dtype or out.stride(-1) != 1:
        raise ValueError(f"out must be {tuple(q.shape)} {q.dtype} with a contiguous last dim")
    block_n = min(config.block_n, max(16, triton.next_power_of_2(layout.kv_len_limit)))
    block_m = min(config.block_m, max(16, triton.next_power_of_2(n_gen)))
    kv_starts, kv_lens, _, longest_first = layout.index_tensors(q.device)
    k_plane, v_plane = kv_buffer[0], kv_buffer[1]
    use_tma = bool(config.use_tma) and _tma_ok(kv_buffer)
    if use_tma:
        rows = kv_buffer.shape[1]
        width = hkv * head_dim
        desc_k = TensorDescriptor(k_plane, [rows, width], [width, 1], [block_n, head_dim])
        desc_v = TensorDescriptor(v_plane, [rows, width], [width, 1], [block_n, head_dim])
    else:
        desc_k = desc_v = None
    sm_scale = scale if scale is not None else 1.0 / math.sqrt(head_dim)
    grid = (triton.cdiv(n_gen, block_m), batch * hq)
    _prefix_attention_kernel[grid](
        q, k_plane, v_plane, out, desc_k, desc_v, kv_starts, kv_lens, longest_first,
        n_gen, sm_scale * LOG2E,
        q.stride(0), q.stride(1), q.stride(2),
        kv_buffer.stride(1), kv_buffer.stride(2),
        out.stride(0), out.stride(1), out.stride(2),
        HQ=hq, GROUP=hq // hkv, HEAD_DIM=head_dim,
        BLOCK_M=block_m, BLOCK_N=block_n, USE_TMA=use_tma,
        UPCAST_DOT=_interpreting() and q.dtype == torch.bfloat16,
        WARP_SPECIALIZE=bool(config.warp_specialize) and not _interpreting(),
        num_warps=config.num_warps, num_stages=config.num_stages,
    )
    return out


# --------------------------------------------------------------------------------------------------
# FlashAttention-4 (the maintained `flash-attn-4` package, CuTe DSL kernels for SM90 and SM100)
# --------------------------------------------------------------------------------------------------
# Why a library kernel beside ours: at 12k-44k gen tokens cuDNN's SDPA and our Triton kernel both run
# at ~70% of the bf16 matmul rate, and the remaining gap needs a warp-specialised, ping-pong scheduled
# kernel (FA3's design), which flash-attn-4 ships for Hopper. It is optional: when it is not installed,
# or the GPU is not SM90+, dispatch simply does not offer it. The packed buffer is already the varlen
# layout it takes (PackedKVLayout.cu_seqlens), so one call covers every branch with no copy of K/V.
FLASH4_ENV_VAR = "COSMOS3_FLASH4"
FLASH4_CACHE_ENV_VAR = "FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED"


# The library arguments a Flash4Config may set besides the tile (its field names are theirs).
_FLASH4_KNOBS = ("pack_gqa", "mma_pv_is_rs", "intra_wg_overlap")


@dataclass(frozen=True)
class Flash4Config:
    """A launch shape for flash-attn-4's SM90 forward kernel; None leaves a knob to the library's heuristic.

    Why expose them: the library picks 128x128 tiles and packs GQA heads into the query tile for any
    head_dim-128 call, while FA3's C++ build uses 128x176 tiles at head_dim 128 and packs GQA only where
    a query tile would otherwise be short. Which is faster at our shapes is measured (bench_kernels'
    flash4 sweep, docs/perf-log/2026-12-02.md) and dispatch times the candidates in ``DEFAULT_FLASH4_CONFIGS``.
    """

    tile_m: int | None = None
    tile_n: int | None = None
    pack_gqa: bool | None = None
    mma_pv_is_rs: bool | None = None
    intra_wg_overlap: bool | None = None
    # Offered only on GPUs of this compute capability major, where it was measured (the knobs mean
    # different kernels on SM100); None: anywhere flash-attn-4 runs.
    sm: int | None = None

    def __post_init__(self) -> None:
        if (self.tile_m is None) != (self.tile_n is None):
            raise ValueError(f"tile_m and tile_n are set together, got tile_m={self.tile_m}, tile_n={self.tile_n}")
        if self.tile_m is not None and (self.tile_m not in (64, 128, 192) or self.tile_n % 16 or not 16 <= self.tile_n <= 256):
            raise ValueError(f"tile must be tile_m in (64, 128, 192) and tile_n a multiple of 16 in [16, 256], "
                             f"got {self.tile_m}x{self.tile_n}")

    @property
    def label(self) -> str:
        tile = "lib" if self.tile_m is None else f"{self.tile_m}x{self.tile_n}"
        knobs = [f"{name}={getattr(self, name)}" for name in _FLASH4_KNOBS if getattr(self, name) is not None]
        return " ".join([tile, *knobs])


# The library's own choice, and the fastest of 17 launch shapes in our H200 sweep (docs/perf-log/2026-12-02.md,
# flash-attn-4 launch shapes): 192-row query tiles over three MMA warp groups, P through shared memory, GQA
# heads not packed. At 44k gen tokens it took 2.5-3.6% less time than the library's 128x128 in both rounds and,
# with the same 128-key blocks, gives the same bits; at 12k the rounds disagreed. Dispatch times both per
# shape (each is one JIT compile per process, or a load from flash-attn-4's disk cache).
DEFAULT_FLASH4_CONFIGS = (Flash4Config(), Flash4Config(192, 128, pack_gqa=False, mma_pv_is_rs=False, sm=9))


@functools.cache
def _flash4_entry() -> tuple[Callable | None, bool, str | None]:
    """flash-attn-4's forward: (function, takes launch knobs, why not). Import cost is paid once, on first use.

    The knobs (tile shape, GQA packing) and a caller's ``out`` buffer are arguments of the library's
    ``_flash_attn_fwd``, which its public ``flash_attn_varlen_func`` wraps; the version is pinned in
    requirements-gpu.txt, and if that name ever moves we fall back to the public function (library
    defaults, one output copy) rather than fail."""
    if not settings.current().flash4:
        return None, False, f"{FLASH4_ENV_VAR}=0"
    # Its on-disk kernel cache (FLASH4_CACHE_ENV_VAR, read when the library is imported) is turned on at start-up
    # by whoever runs the kernels (`engine.config.apply_process_environment`; bench/bench_flash4_cache.py).
    try:
        from flash_attn.cute import flash_attn_varlen_func
    except Exception as err:  # ImportError, or the CuTe DSL failing to load its compiler libraries
        warn_if_installed(FLASH4_DISTRIBUTION, err, "cuDNN's SDPA or our Triton kernel")
        return None, False, f"flash-attn-4 not importable ({type(err).__name__}: {err})"
    try:
        from flash_attn.cute.interface import _flash_attn_fwd
    except ImportError:
        return flash_attn_varlen_func, False, None
    return _flash_attn_fwd, True, None


def load_flash4() -> str | None:
    """Import flash-attn-4 now (`registry.load_libraries`): None where it loaded, else why it cannot run."""
    return _flash4_entry()[2]


def flash4_forward() -> Callable | None:
    """flash-attn-4's `_flash_attn_fwd` (launch knobs, and a caller's `out` and `lse` buffers), or None where the
    library is missing, refused, or has only its public function (`_flash4_entry`)."""
    fn, takes_knobs, _ = _flash4_entry()
    return fn if takes_knobs else None


FLASH4_DISTRIBUTION = "flash-attn-4"


def flash4_advice() -> str | None:
    """A line for whoever runs the server where flash-attn-4 would help and is not installed: a CUDA GPU of
    SM90 or newer, `COSMOS3_FLASH4` not 0, and no `flash-attn-4` distribution (flash-attn 2 shares its
    `flash_attn` package name, so the distribution is what says which one is there). None otherwise.

    Why say it at start: flash-attn-4 is an optional install, and without it a kept image step's attention
    runs on our Triton kernel, which held a whole Nano T2I request at a ~300 MHz lower clock (1.78 s against
    1.46 s, docs/perf-log/2026-12-02.md). It reads the installed distributions without importing the library, which
    costs seconds."""
    if not torch.cuda.is_available() or not settings.current().flash4:
        return None
    major, minor = torch.cuda.get_device_capability()
    if major < 9 or installed(FLASH4_DISTRIBUTION):
        return None
    return (f"flash-attn-4 is not installed. On this GPU (compute capability {major}.{minor}) it is the fastest "
            f"attention the engine can use, and without it a Nano T2I request ran ~20% slower end to end "
            f"(docs/perf-log/2026-12-02.md). Install it with: pip install -r requirements-gpu.txt "
            f"(or set {FLASH4_ENV_VAR}=0 to silence this).")


def flash4_unsupported(q: torch.Tensor) -> str | None:
    """Why flash-attn-4 cannot run attention for q (None when it can); the buffer and layout are the shared
    checks' business (``check_prefix_attention_inputs``), which every path runs."""
    if q.device.type != "cuda":
        return f"device {q.device} (flash-attn-4 needs CUDA)"
    major, _ = torch.cuda.get_device_capability(q.device)
    if major < 9:
        return f"compute capability {major}.x (flash-attn-4 needs SM90 or newer)"
    if q.shape[-1] % 8:
        return f"head_dim {q.shape[-1]} is not a multiple of 8"
    _, _, why = _flash4_entry()
    return why


def usable_flash4_configs(configs: tuple[Flash4Config, ...], sm_major: int, takes_knobs: bool) -> tuple[Flash4Config, ...]:
    """The configs to offer on a GPU of compute capability `sm_major`: those measured for it (or for any), and
    only the library's own choice when its launch knobs cannot be passed (`_flash4_entry`)."""
    return tuple(c for c in configs if (c.sm is None or c.sm == sm_major) and (takes_knobs or not flash4_call_kwargs(c)))


def flash4_configs_for(q: torch.Tensor, configs: tuple[Flash4Config, ...]) -> tuple[Flash4Config, ...]:
    """`usable_flash4_configs` for the GPU and library that q would run on (none where flash-attn-4 cannot)."""
    if flash4_unsupported(q) is not None:
        return ()
    major, _ = torch.cuda.get_device_capability(q.device)
    return usable_flash4_configs(configs, major, _flash4_entry()[1])


def flash4_call_kwargs(config: Flash4Config | None) -> dict:
    """The keyword arguments a config adds to the library call (none for the library's own choice)."""
    if config is None:
        return {}
    kwargs = {name: getattr(config, name) for name in _FLASH4_KNOBS if getattr(config, name) is not None}
    if config.tile_m is not None:
        kwargs["tile_mn"] = (config.tile_m, config.tile_n)
    return kwargs


def prefix_attention_flash4(
    q: torch.Tensor,
    kv_buffer: torch.Tensor,
    layout: PackedKVLayout,
    *,
    scale: float | None = None,
    out: torch.Tensor | None = None,
    config: Flash4Config | None = None,
) -> torch.Tensor:
    """The same op as ``prefix_attention`` through flash-attn-4's varlen forward; returns [B, N, Hq, D]."""
    check_prefix_attention_inputs(q, kv_buffer, layout)
    why = flash4_unsupported(q)
    if why is not None:
        raise ValueError(f"flash-attn-4 cannot run this call: {why}")
    fn, takes_knobs, _ = _flash4_entry()
    kwargs = flash4_call_kwargs(config)
    if kwargs and not takes_knobs:
        raise ValueError(f"flash-attn-4 config {config.label} needs the library's _flash_attn_fwd, "
                         "which this flash-attn-4 version does not have; use Flash4Config() or the pinned version")
    batch, n_gen, hq, head_dim = q.shape
    cu_q, cu_k = layout.cu_seqlens(q.device)
    # The library writes straight into a contiguous `out` (no copy of [B*N, Hq, D]); it asserts that one is
    # q's shape and dtype, so any other `out` (e.g. fp32) gets the library's result copied in, as before.
    direct = (takes_knobs and out is not None and out.is_contiguous() and out.dtype == q.dtype
              and out.shape == q.shape and out.device == q.device)
    if direct:
        kwargs["out"] = out.view(batch * n_gen, hq, head_dim)
    result = fn(
        q.reshape(batch * n_gen, hq, head_dim), kv_buffer[0], kv_buffer[1],
        cu_seqlens_q=cu_q, cu_seqlens_k=cu_k,
        max_seqlen_q=n_gen, max_seqlen_k=layout.kv_len_limit,
        softmax_scale=scale if scale is not None else 1.0 / math.sqrt(head_dim), causal=False, **kwargs,
    )
    if direct:
        return out
    o = result[0] if isinstance(result, tuple) else result
    if out is None:
        return o.view(batch, n_gen, hq, head_dim)
    out.copy_(o.view(batch, n_gen, hq, head_dim))
    return out


# --------------------------------------------------------------------------------------------------
# Backends (cosmos3_kernels.registry), in the op's order: a tie in time keeps SDPA
# --------------------------------------------------------------------------------------------------
def _inputs_refused(q: torch.Tensor, kv_buffer: torch.Tensor, layout: PackedKVLayout, **kwargs) -> str | None:
    try:
        check_prefix_attention_inputs(q, kv_buffer, layout)
    except ValueError as err:
        return str(err)
    return None


def _sdpa_refused(q: torch.Tensor, kv_buffer: torch.Tensor, layout: PackedKVLayout, **kwargs) -> str | None:
    # SDPA slices each branch by host integers, which a step graph's replay for another prompt would not change.
    return ("slices each branch by host lengths, and the lengths are on the device (a kernel that reads them there "
            "must run: Triton's or flash-attn-4's)" if layout.lengths is not None else None)


def _flash4_refused(q: torch.Tensor, kv_buffer: torch.Tensor, layout: PackedKVLayout, **kwargs) -> str | None:
    return _inputs_refused(q, kv_buffer, layout) or flash4_unsupported(q)


# Prefix lengths change with every prompt: the longest key run is bucketed by powers of two, so a new prompt re-uses
# the measurement of a similar one.
registry.describe("prefix_attention", output="out",
                  key=lambda q, kv_buffer, layout, *, scale=None: (
                      q.dtype, tuple(q.shape), kv_buffer.shape[2], layout.uniform_prefix,
                      kv_len_bucket(layout.kv_len_limit), layout.lengths is not None))
registry.register("prefix_attention", "torch", supported=_sdpa_refused, reference=True,
                  # SDPA's output and the copies of its transposed operands: about three times q.
                  need_bytes=lambda q, *args, **kwargs: 3 * q.numel() * q.element_size(),
                  call=lambda q, kv_buffer, layout, *, scale=None, out=None, config=None:
                  prefix_attention_reference(q, kv_buffer, layout, scale=scale, out=out))
registry.register("prefix_attention", "triton", supported=_inputs_refused, configs="attention",
                  call=lambda *args, **kwargs: prefix_attention(*args, **kwargs))
registry.register("prefix_attention", "flash4", supported=_flash4_refused,
                  call=lambda *args, **kwargs: prefix_attention_flash4(*args, **kwargs),
                  configs="flash4", fit_configs=lambda configs, q, *args, **kwargs: flash4_configs_for(q, configs),
                  library=True, forcible=False, load=load_flash4)
