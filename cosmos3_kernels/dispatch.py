"""The one place that decides, per op and shape, between a Triton kernel and its PyTorch path.

Why measure instead of assuming: SGLang's fused QK-norm+RoPE path won on Blackwell and lost 3.5% on
Hopper until it was gated (seeds 001/003), and at some shapes cuDNN's SDPA beats any Triton attention.
So in "auto" mode each (op, shape) pair is timed once on the GPU in hand, both paths, and the faster is
cached in the dispatcher instance. Rules, in order:

1. inside ``torch.compile`` tracing: the PyTorch (split) path, always: it is plain tensor ops that the
   compiler can trace and fuse, while the Triton launch wrappers are not;
2. mode "torch" (forced): the PyTorch path;
3. a shape, dtype or device the kernel does not handle: the PyTorch path, with the reason recorded;
4. mode "triton" (forced): the kernel (on a CPU only under ``TRITON_INTERPRET=1``, for tests);
5. "auto" on a CPU: the PyTorch path; "auto" on CUDA: the measured winner, cached per shape. For
   attention the candidates also include flash-attn-4's kernel where it is installed and the GPU is
   SM90+ (``prefix_attention.flash4_unsupported``; ``COSMOS3_FLASH4=0`` leaves it out). The MLP's input GEMM
   with its activation (``mlp_in``) is cuBLAS then the activation's own pass, or, where the caller allows one
   rounding, QuACK's GEMM with the activation in its epilogue where it is installed on an SM90 GPU
   (``gemm.mlp_in_unsupported``; ``COSMOS3_QUACK=0`` leaves it out), a candidate only where it is no further
   from the fp32 result than the split path on that call (``closer_candidates``); it is never forced.

Within a memory budget: each candidate says how many bytes its timing allocates beyond its inputs (`sized`), and
one that would not fit the device's free memory (the driver's, plus the caching allocator's unused blocks, less
``MEMORY_HEADROOM``) is skipped, never run into an out-of-memory error; one that runs out anyway is left out too.
Where none fits, the Triton kernel (which writes in place) is taken unmeasured, and the decision says so. Why:
Super at 720p on one H200 died timing the PyTorch reference of QK-norm+RoPE (fp32 copies of 1.4 GB tensors).

Measured decisions outlive the process where a ``store`` is given (``cosmos3_kernels.persist.DecisionStore``: one
file per GPU, driver, library versions and kernel source, keyed here by op and shape): a restarted process
reads them instead of timing again.

How a candidate is timed (``TIMINGS``, ``COSMOS3_DISPATCH_TIMING``): "graph", the default, replays a CUDA
graph of its calls, since the step runs inside one and pays no Python launch; "eager" times back-to-back
calls, launches included, as the dispatcher did before (kept for the A/B in docs/perf-log/2026-12-02.md).

The engine owns one ``KernelDispatcher`` per loaded model (no module-level state), calls each entry
point once eagerly before any CUDA-graph capture (a capture cannot time anything: an unmeasured shape
then takes the PyTorch path and is not cached), and can list ``decisions()`` for its logs.
"""
from __future__ import annotations

import dataclasses
import enum
import hashlib
import logging
import os
import statistics
from dataclasses import dataclass
from typing import Callable, Hashable

import torch

from cosmos3_kernels import gemm, norms, prefix_attention as attn, qk_norm_rope as qk, shared_gen_attention as sga
from cosmos3_kernels.packed_kv import PackedKVLayout, kv_len_bucket
from cosmos3_kernels.persist import DecisionStore
from cosmos3_kernels.timing import time_ms

log = logging.getLogger("cosmos3_kernels.dispatch")

MODES = ("auto", "triton", "torch")
ENV_VAR = "COSMOS3_KERNELS"
TIMINGS = ("graph", "eager")
TIMING_ENV_VAR = "COSMOS3_DISPATCH_TIMING"


def timing_from_env() -> str:
    """How candidates are timed, from ``COSMOS3_DISPATCH_TIMING``: graph (the default) or eager."""
    return os.environ.get(TIMING_ENV_VAR, "graph")


class Path(str, enum.Enum):
    TRITON = "triton"
    TORCH = "torch"
    FLASH4 = "flash4"  # flash-attn-4's kernel: attention only, never forced
    QUACK = "quack"  # QuACK's GEMM with the MLP's activation in its epilogue: the MLP's input only, never forced


@dataclass(frozen=True)
class Decision:
    """Which path ran and why; the timings are set when it was measured."""

    path: Path
    reason: str
    triton_ms: float | None = None
    torch_ms: float | None = None
    config: attn.AttentionConfig | None = None
    flash4_ms: float | None = None
    flash4_config: attn.Flash4Config | None = None
    quack_ms: float | None = None
    quack_config: gemm.QuackConfig | None = None

    @property
    def chosen_ms(self) -> float | None:
        """The measured time of the path it chose (None where it chose without measuring)."""
        return {Path.TRITON: self.triton_ms, Path.TORCH: self.torch_ms, Path.FLASH4: self.flash4_ms,
                Path.QUACK: self.quack_ms}[self.path]


@dataclass(frozen=True)
class SharingDecision:
    """Whether the first layer's attention computes its gen block once for all branches
    (``cosmos3_kernels.shared_gen_attention``), and on what: ``path`` FLASH4 (flash-attn-4's parts, the Triton combine),
    TORCH (the PyTorch reference: the CPU), or None (not shared: ``prefix_attention`` as at every other layer)."""

    path: Path | None
    reason: str
    shared_ms: float | None = None
    regular_ms: float | None = None
    flash4_config: attn.Flash4Config | None = None


SPLIT = "split"  # the MLP input's split path, as a key among QuACK's configs
# Left free when a candidate's timing is checked against the device's memory: cuBLAS and cuDNN workspaces, a graph
# pool's rounding.
MEMORY_HEADROOM = 512 * 2**20
NOT_MEASURED = "not measured: no candidate fits the memory budget"


class OverBudget(RuntimeError):
    """A candidate's timing would not fit the device's free memory (or ran out of it): it is skipped."""


def sized(fn: Callable[[], object], need_bytes: int) -> Callable[[], object]:
    """``fn`` marked with the bytes its call allocates beyond its inputs (checked before it is timed)."""
    fn.need_bytes = int(need_bytes)
    return fn


def free_device_bytes() -> int:
    """What the current CUDA device can still give: the driver's free memory plus the caching allocator's unused
    blocks (which a new tensor reuses)."""
    free, _ = torch.cuda.mem_get_info()
    return free + torch.cuda.memory_reserved() - torch.cuda.memory_allocated()


_CONFIG_TYPES = {cls.__name__: cls for cls in (attn.AttentionConfig, attn.Flash4Config, gemm.QuackConfig)}


def encode_decision(decision) -> dict:
    """A `Decision` or `SharingDecision` as plain JSON (`decode_decision` reads it back)."""
    out = {"kind": type(decision).__name__}
    for f in dataclasses.fields(decision):
        value = getattr(decision, f.name)
        if isinstance(value, Path):
            value = value.value
        elif dataclasses.is_dataclass(value):
            value = {"type": type(value).__name__, **dataclasses.asdict(value)}
        out[f.name] = value
    return out


def decode_decision(record: dict):
    """`encode_decision`'s inverse; None for a record it cannot read (a stored file from other code)."""
    try:
        cls = {"Decision": Decision, "SharingDecision": SharingDecision}[record["kind"]]
        values = {}
        for f in dataclasses.fields(cls):
            value = record.get(f.name)
            if f.name == "path" and value is not None:
                value = Path(value)
            elif isinstance(value, dict):
                value = _CONFIG_TYPES[value["type"]](**{k: v for k, v in value.items() if k != "type"})
            values[f.name] = value
        return cls(**values)
    except (KeyError, TypeError, ValueError):
        return None
ALTERNATING_ROUNDS = 3  # `_time_alternating`: rounds over the MLP input's candidates


# Candidate launch shapes for attention, timed against each other and SDPA on first use of a shape.
# Why these two (H200 sweep, docs/perf-log/2026-12-02.md): 128x128 with 8 warps (two warpgroups, TMA-fed K/V)
# was fastest from 12k gen tokens up; 64x64 with 4 warps was fastest at the T2I shapes (400 and 1024
# gen tokens), where 128-row blocks leave too few programs per SM.
DEFAULT_ATTENTION_CONFIGS = (
    attn.AttentionConfig(block_m=128, block_n=128, num_warps=8, num_stages=3, use_tma=True),
    attn.AttentionConfig(block_m=64, block_n=64, num_warps=4, num_stages=3, use_tma=True),
)


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


def lengths_on_device_refused(device: torch.device, head_dim: int, dtype: torch.dtype, mode: str) -> str | None:
    """None where the gen tower's kernels can all take the K/V lengths from the device (`PackedKVLayout.lengths`),
    else why not: that needs the Triton QK kernel (bit-exact rounding: CUDA, head_dim 128, a reduction order
    it reproduces) and the Triton or flash-attn-4 attention (bf16 or fp16)."""
    if mode == "torch":
        return "the kernels are forced to the PyTorch path"
    if torch.device(device).type != "cuda":
        return f"device {device} (the kernels that read lengths on the device need CUDA)"
    if dtype not in (torch.bfloat16, torch.float16):
        return f"dtype {dtype} (the attention kernels take bf16 or fp16)"
    return _rounding_refused(head_dim, torch.device(device))


def _rounding_refused(head_dim: int, device: torch.device) -> str | None:
    """None where the QK kernel's bit-exact rounding applies on this CUDA device, else why not: it adds the
    variance in PyTorch's order, verified at head_dim 128, and needs this build's order to be one it reproduces."""
    if head_dim != 128:
        return f"bit-exact rounding is verified for head_dim 128 only, got {head_dim}"
    if qk.torch_reduce_order(device) is None:
        return "this PyTorch build reduces in an order the kernel does not reproduce"
    return None


def closer_candidates(candidates: dict, split: Callable[[], torch.Tensor], exact: Callable[[], torch.Tensor],
                      rows: int) -> tuple[dict, list[str]]:
    """The candidates whose first ``rows`` output rows are no further from ``exact()`` (fp32, those rows) than the
    split path's, in relative L2 on this call, and why each other one was left out (a candidate that raises too).
    What lets a path that rounds once replace one that rounds after every op: it must not be the less accurate."""
    reference = exact()

    def error(out: torch.Tensor) -> float:
        return ((out[:rows].float() - reference).norm() / reference.norm()).item()

    bar = error(split())
    kept, left_out = {}, []
    for key, fn in candidates.items():
        label = getattr(key, "label", str(key))
        try:
            got = fn()
        except Exception as err:  # noqa: BLE001 - a library config this GPU cannot build is not fatal
            left_out.append(f"{label}: {type(err).__name__}: {err}"[:200])
            continue
        if error(got) <= bar:
            kept[key] = fn
        else:
            left_out.append(f"{label}: further from fp32 than the split path ({bar:.3e})")
    return kept, left_out


def _bytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _device_key(t: torch.Tensor) -> str:
    if t.device.type == "cuda":
        return f"cuda:{t.device.index if t.device.index is not None else torch.cuda.current_device()}"
    return str(t.device)


class KernelDispatcher:
    """Triton-or-PyTorch choice for the gen tower's kernels; see the module docstring for the rules."""

    def __init__(
        self,
        mode: str = "auto",
        *,
        warmup: int = 2,
        iters: int = 5,
        attention_configs: tuple[attn.AttentionConfig, ...] = DEFAULT_ATTENTION_CONFIGS,
        flash4_configs: tuple[attn.Flash4Config, ...] = attn.DEFAULT_FLASH4_CONFIGS,
        quack_configs: tuple[gemm.QuackConfig, ...] = gemm.DEFAULT_QUACK_CONFIGS,
        timing: str = "graph",
        store: DecisionStore | None = None,
        free_memory: Callable[[], int] | None = None,
    ) -> None:
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        if timing not in TIMINGS:
            raise ValueError(f"timing must be one of {TIMINGS}, got {timing!r}")
        if not attention_configs:
            raise ValueError("attention_configs must name at least one AttentionConfig")
        self.mode = mode
        self.warmup = warmup
        self.iters = iters
        self.attention_configs = tuple(attention_configs)
        self.flash4_configs = tuple(flash4_configs)
        self.quack_configs = tuple(quack_configs)
        self.timing = timing
        self.store = store  # measured decisions kept across processes (None: this process only)
        # Stored decisions are this dispatcher's only if it offered the same candidates (benchmarks pass their own).
        self._candidates_key = hashlib.sha256(repr((self.attention_configs, self.flash4_configs,
                                                    self.quack_configs)).encode()).hexdigest()[:12]
        self.free_memory = free_memory or free_device_bytes  # bytes a candidate's timing may take
        self._decisions: dict[Hashable, Decision] = {}
        self._sharing: dict[Hashable, SharingDecision] = {}

    @classmethod
    def from_env(cls, **kwargs) -> "KernelDispatcher":
        """Mode from ``COSMOS3_KERNELS`` (auto | triton | torch), default auto: the ablation switch; how
        candidates are timed from ``COSMOS3_DISPATCH_TIMING`` (graph | eager), default graph."""
        kwargs.setdefault("timing", timing_from_env())
        return cls(os.environ.get(ENV_VAR, "auto"), **kwargs)

    def decisions(self) -> dict[Hashable, Decision | SharingDecision]:
        """A copy of the measured (cached) decisions, keyed by op and shape."""
        return {**self._decisions, **self._sharing}

    def clear(self) -> None:
        self._decisions.clear()
        self._sharing.clear()

    # ---------------------------------------------------------------------------------------------
    # The rule chain shared by every op
    # ---------------------------------------------------------------------------------------------
    def _decide(
        self,
        key: tuple,
        device_tensor: torch.Tensor,
        unsupported: str | None,
        timers: Callable[[], Decision] | None,
    ) -> Decision:
        if torch.compiler.is_compiling():
            return Decision(Path.TORCH, "compiling: split path is compile-safe")
        if self.mode == "torch":
            return Decision(Path.TORCH, "forced")
        on_cuda = device_tensor.device.type == "cuda"
        if unsupported is None and not on_cuda and not (self.mode == "triton" and _interpreting()):
            unsupported = f"device {device_tensor.device} (Triton needs CUDA or TRITON_INTERPRET=1)"
        if unsupported is not None:
            return Decision(Path.TORCH, f"unsupported: {unsupported}")
        if self.mode == "triton":
            return Decision(Path.TRITON, "forced", config=self.attention_configs[0])
        if not on_cuda:  # pragma: no cover - unreachable: a CPU tensor is unsupported in auto mode
            return Decision(Path.TORCH, "cpu")
        cached = self._decisions.get(key) or self._restored(key, Decision)
        if cached is not None:
            self._decisions[key] = cached
            return cached
        if torch.cuda.is_current_stream_capturing():
            return Decision(Path.TORCH, "capturing: not measured; call once before capture")
        assert timers is not None
        decision = timers()
        self._decisions[key] = decision
        self._keep(key, decision)
        return decision

    def _store_key(self, key: tuple) -> str:
        # A dtype's repr (torch.bfloat16) reads the same in every process.
        return f"{self.timing}|{self._candidates_key}|{key!r}"

    def _restored(self, key: tuple, kind: type):
        """The decision a previous process measured for `key` (`store`), or None."""
        if self.store is None:
            return None
        record = self.store.get(self._store_key(key))
        decision = decode_decision(record) if record is not None else None
        return decision if isinstance(decision, kind) else None

    def _keep(self, key: tuple, decision) -> None:
        """Write a measured decision to the store; one taken without measuring all it could is not kept."""
        if self.store is not None and decision.reason == "measured":
            self.store.put(self._store_key(key), encode_decision(decision))

    def fits(self, need_bytes: int) -> bool:
        """Whether `need_bytes` more fit the device now, `MEMORY_HEADROOM` left over (always on the CPU)."""
        if need_bytes <= 0 or not torch.cuda.is_available() and self.free_memory is free_device_bytes:
            return True
        return need_bytes + MEMORY_HEADROOM <= self.free_memory()

    def _time(self, fn: Callable[[], object]) -> float:
        """Median ms of one candidate, the way ``self.timing`` says; `OverBudget` where its `sized` bytes do not
        fit, or it runs out of memory (the caching allocator's blocks then go back to the driver)."""
        need = getattr(fn, "need_bytes", 0)
        if not self.fits(need):
            raise OverBudget(f"needs {need / 2**30:.2f} GiB, {self.free_memory() / 2**30:.2f} GiB free")
        graphed = self.timing == "graph"
        try:
            # A graph of one short call would time the replay's launch with it: "auto" fills ~2 ms instead.
            return time_ms(fn, warmup=self.warmup, iters=self.iters, inner="auto" if graphed else 1,
                           graphed=graphed).median_ms
        except torch.OutOfMemoryError as err:
            torch.cuda.empty_cache()
            raise OverBudget(f"ran out of memory: {str(err).splitlines()[0][:160]}") from None

    def _fastest(self, candidates: dict, skip_failures: bool = False) -> tuple[object, float | None]:
        """(key, median ms) of the fastest of ``{key: fn}``, (None, None) if none ran; the first listed wins a
        tie. With ``skip_failures`` a candidate that raises is logged and left out."""
        best_key, best_ms = None, float("inf")
        for key, fn in candidates.items():
            try:
                ms = self._time(fn)
            except OverBudget as err:
                log.warning("kernel candidate %s skipped: over the memory budget (%s)", key, err)
                continue
            except Exception as err:  # noqa: BLE001 - a library config this GPU cannot build is not fatal
                if not skip_failures:
                    raise
                log.warning("kernel candidate %s failed and is left out: %s: %s", key, type(err).__name__, err)
                continue
            if ms < best_ms:
                best_key, best_ms = key, ms
        return (best_key, best_ms) if best_ms < float("inf") else (None, None)  # keys may be None (one config)

    def _measure(self, run_triton: dict, run_torch: Callable[[], object] | None, run_flash4: dict | None = None) -> Decision:
        """Time every Triton candidate, the PyTorch path (unless None: not a candidate) and each flash-attn-4
        config if offered; keep the fastest. A candidate over the memory budget is skipped (`_time`); where none
        fits, the first Triton candidate is taken unmeasured (it writes in place)."""
        torch_ms = None
        if run_torch is not None:
            try:
                torch_ms = self._time(run_torch)
            except OverBudget as err:
                log.warning("the PyTorch path is skipped: over the memory budget (%s)", err)
        best_cfg, best_ms = self._fastest(run_triton)
        # A library kernel may refuse a launch shape on a GPU it was not measured on: left out, not fatal.
        flash4_cfg, flash4_ms = self._fastest(run_flash4 or {}, skip_failures=True)
        if torch_ms is None and best_ms is None and flash4_ms is None:
            return Decision(Path.TRITON, NOT_MEASURED, config=next(iter(run_triton), None))
        skipped = (run_torch is not None and torch_ms is None) or best_ms is None
        path = min(  # in this order, so that a tie keeps PyTorch
            ((Path.TORCH, torch_ms), (Path.TRITON, best_ms), (Path.FLASH4, flash4_ms)),
            key=lambda c: float("inf") if c[1] is None else c[1],
        )[0]
        return Decision(path, "measured, some candidates over the memory budget" if skipped else "measured",
                        triton_ms=best_ms, torch_ms=torch_ms, config=best_cfg, flash4_ms=flash4_ms,
                        flash4_config=flash4_cfg)

    # ---------------------------------------------------------------------------------------------
    # QK-norm + RoPE + K/V pack
    # ---------------------------------------------------------------------------------------------
    def choose_qk_norm_rope(
        self,
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
    ) -> Decision:
        unsupported = None
        try:
            qk.check_qk_norm_rope_inputs(q, k, v, q_weight, k_weight, cos, sin, kv_buffer, layout, flavour)
        except ValueError as err:
            unsupported = str(err)
        if unsupported is None and round_norm_before_rope and q.device.type == "cuda" and not torch.compiler.is_compiling():
            unsupported = _rounding_refused(q.shape[-1], q.device)
        # With the lengths on the device the PyTorch path is no candidate: it writes k and v at host offsets.
        device_lengths = layout.lengths is not None
        key = (
            "qk_norm_rope", _device_key(q), q.dtype, tuple(q.shape), k.shape[2], flavour,
            bool(round_norm_before_rope), cos.dim() == 3 and cos.shape[0] > 1, device_lengths,
        )

        def timers() -> Decision:
            if not self.fits(_bytes(q)):
                return Decision(Path.TRITON, NOT_MEASURED)
            scratch = torch.empty_like(q)  # never time in place: q must stay the input
            args = (q, k, v, q_weight, k_weight, cos, sin, kv_buffer, layout)
            kw = dict(eps=eps, flavour=flavour, q_out=scratch)

            def run_triton():
                qk.qk_norm_rope_pack(*args, round_norm_before_rope=round_norm_before_rope, **kw)

            def run_torch():
                qk.qk_norm_rope_pack_reference(*args, **kw)

            # The reference norms and rotates q and k in fp32 and bf16 temporaries: ~16 bytes an element at its peak.
            torch_need = 16 * (q.numel() + k.numel())
            return self._measure({None: run_triton}, None if device_lengths else sized(run_torch, torch_need))

        return self._decide(key, q, unsupported, timers)

    def qk_norm_rope_pack(
        self,
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
    ) -> torch.Tensor:
        """Per-head RMSNorm + rotary on q [B,N,Hq,D] and k [B,N,Hkv,D]; k, v into ``kv_buffer``'s gen rows.

        Returns the rotated q ([B, N, Hq, D]; in ``q_out`` if given). With ``round_norm_before_rope`` the
        result equals the split PyTorch path bit for bit in bf16, on either path.
        """
        decision = self.choose_qk_norm_rope(
            q, k, v, q_weight, k_weight, cos, sin, kv_buffer, layout,
            eps=eps, flavour=flavour, round_norm_before_rope=round_norm_before_rope,
        )
        args = (q, k, v, q_weight, k_weight, cos, sin, kv_buffer, layout)
        if decision.path is Path.TRITON:
            return qk.qk_norm_rope_pack(
                *args, eps=eps, flavour=flavour, round_norm_before_rope=round_norm_before_rope, q_out=q_out
            )
        if layout.lengths is not None:
            raise ValueError(f"QK-norm + RoPE + pack with the lengths on the device needs the Triton kernel, which "
                             f"reads the gen offsets there; dispatch chose the PyTorch path ({decision.reason})")
        return qk.qk_norm_rope_pack_reference(*args, eps=eps, flavour=flavour, q_out=q_out)

    # ---------------------------------------------------------------------------------------------
    # Prefix attention
    # ---------------------------------------------------------------------------------------------
    def choose_prefix_attention(
        self, q: torch.Tensor, kv_buffer: torch.Tensor, layout: PackedKVLayout, *, scale: float | None = None
    ) -> Decision:
        unsupported = None
        try:
            attn.check_prefix_attention_inputs(q, kv_buffer, layout)
        except ValueError as err:
            unsupported = str(err)
        # Prefix lengths change with every prompt: bucket the longest key run by powers of two so a
        # new prompt re-uses the measurement of a similar one.
        # With the lengths on the device (`PackedKVLayout.lengths`, a step graph kept for any prompt length)
        # the PyTorch path is no candidate: SDPA slices each branch by host integers, which a replay for
        # another prompt would not change.
        device_lengths = layout.lengths is not None
        key = (
            "prefix_attention", _device_key(q), q.dtype, tuple(q.shape), kv_buffer.shape[2],
            layout.uniform_prefix, kv_len_bucket(layout.kv_len_limit), device_lengths,
        )

        def timers() -> Decision:
            if not self.fits(_bytes(q)):
                return Decision(Path.TRITON, NOT_MEASURED, config=self.attention_configs[0])
            scratch = torch.empty_like(q)
            candidates = {
                cfg: (lambda cfg=cfg: attn.prefix_attention(q, kv_buffer, layout, scale=scale, out=scratch, config=cfg))
                for cfg in self.attention_configs
            }
            run_flash4 = {
                cfg: (lambda cfg=cfg: attn.prefix_attention_flash4(q, kv_buffer, layout, scale=scale, out=scratch,
                                                                   config=cfg))
                for cfg in attn.flash4_configs_for(q, self.flash4_configs)
            }
            # SDPA's output and the copies of its transposed operands: about three times q.
            reference = sized(lambda: attn.prefix_attention_reference(q, kv_buffer, layout, scale=scale, out=scratch),
                              3 * _bytes(q))
            return self._measure(candidates, None if device_lengths else reference, run_flash4)

        return self._decide(key, q, unsupported, timers)

    def prefix_attention(
        self,
        q: torch.Tensor,
        kv_buffer: torch.Tensor,
        layout: PackedKVLayout,
        *,
        scale: float | None = None,
        out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Gen queries q [B, N, Hq, D] over each branch's ``[prefix | gen]`` rows; returns [B, N, Hq, D]."""
        decision = self.choose_prefix_attention(q, kv_buffer, layout, scale=scale)
        if decision.path is Path.TRITON:
            return attn.prefix_attention(q, kv_buffer, layout, scale=scale, out=out, config=decision.config)
        if decision.path is Path.FLASH4:
            return attn.prefix_attention_flash4(q, kv_buffer, layout, scale=scale, out=out, config=decision.flash4_config)
        if layout.lengths is not None:
            raise ValueError(f"prefix attention with the lengths on the device needs a kernel that reads them (Triton "
                             f"or flash-attn-4); dispatch chose the PyTorch path ({decision.reason})")
        return attn.prefix_attention_reference(q, kv_buffer, layout, scale=scale, out=out)

    # ---------------------------------------------------------------------------------------------
    # The first layer's attention, its gen block shared by the branches
    # ---------------------------------------------------------------------------------------------
    def choose_shared_gen_attention(
        self, q: torch.Tensor, kv_buffer: torch.Tensor, layout: PackedKVLayout, *, scale: float | None = None
    ) -> SharingDecision:
        """Rules: not while compiling, nor where the shared form does not apply (`sga.check_shared_inputs`); on
        the CPU the PyTorch reference (tests: the model is tiny there); on CUDA only in "auto" mode with
        flash-attn-4, the one kernel here that returns the log-sum-exp the combine needs, and only where it is
        measured faster than this shape's `prefix_attention` (the time its own decision measured for its choice)."""
        if torch.compiler.is_compiling():
            return SharingDecision(None, "compiling")
        try:
            sga.check_shared_inputs(q, kv_buffer, layout)
        except ValueError as err:
            return SharingDecision(None, f"unsupported: {err}")
        if q.device.type != "cuda":
            return SharingDecision(Path.TORCH, "cpu: the reference")
        if self.mode != "auto":
            return SharingDecision(None, f"mode {self.mode}: forced paths run the attention of every other layer")
        why = sga.shared_unsupported(q)
        if why is not None:
            return SharingDecision(None, f"unsupported: {why}")
        key = ("shared_gen_attention", _device_key(q), q.dtype, tuple(q.shape), kv_buffer.shape[2],
               kv_len_bucket(layout.kv_len_limit))
        cached = self._sharing.get(key)
        if cached is not None:
            return cached
        restored = self._restored(key, SharingDecision)
        if restored is not None:
            self._sharing[key] = restored
            return restored
        if torch.cuda.is_current_stream_capturing():
            return SharingDecision(None, "capturing: not measured; call once before capture")
        if not self.fits(2 * _bytes(q)):
            return SharingDecision(None, NOT_MEASURED)
        scratch = torch.empty_like(q)
        # The one-call attention's own decision timed its chosen path the same way: that time is the bar.
        regular_ms = self.choose_prefix_attention(q, kv_buffer, layout, scale=scale).chosen_ms
        if regular_ms is None:
            regular_ms = self._time(lambda: self.prefix_attention(q, kv_buffer, layout, scale=scale, out=scratch))
        shared = {
            cfg: (lambda cfg=cfg: sga.shared_gen_attention_flash4(q, kv_buffer, layout, scale=scale, out=scratch,
                                                                  config=cfg))
            for cfg in attn.flash4_configs_for(q, self.flash4_configs)
        }
        cfg, shared_ms = self._fastest(shared, skip_failures=True)
        faster = shared_ms is not None and shared_ms < regular_ms
        decision = SharingDecision(Path.FLASH4 if faster else None, "measured", shared_ms=shared_ms,
                                   regular_ms=regular_ms, flash4_config=cfg if faster else None)
        self._sharing[key] = decision
        self._keep(key, decision)
        return decision

    def shared_gen_attention(
        self,
        q: torch.Tensor,
        kv_buffer: torch.Tensor,
        layout: PackedKVLayout,
        *,
        scale: float | None = None,
        out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """The first layer's attention, q [B, N, Hq, D] over each branch's rows, with the gen block of branch 0
        for every branch (``cosmos3_kernels.shared_gen_attention``: only where every branch's gen tokens are the same
        and their positions shifted alike) where `choose_shared_gen_attention` says so, else `prefix_attention`."""
        decision = self.choose_shared_gen_attention(q, kv_buffer, layout, scale=scale)
        if decision.path is Path.FLASH4:
            return sga.shared_gen_attention_flash4(q, kv_buffer, layout, scale=scale, out=out,
                                                   config=decision.flash4_config)
        if decision.path is Path.TORCH:
            return sga.shared_gen_attention_reference(q, kv_buffer, layout, scale=scale, out=out)
        return self.prefix_attention(q, kv_buffer, layout, scale=scale, out=out)

    # ---------------------------------------------------------------------------------------------
    # Residual add + RMSNorm, activations
    # ---------------------------------------------------------------------------------------------
    def _elementwise(self, name, triton_fn, torch_fn, probe: torch.Tensor, supported: bool, key_extra=()):
        unsupported = None
        if not supported:
            unsupported = f"dtype {probe.dtype} or layout (last dim must be contiguous)"
        key = (name, _device_key(probe), probe.dtype, tuple(probe.shape), *key_extra)
        # The references widen to fp32: a few fp32 copies of the probe; the kernels write their outputs only.
        kernel, reference = sized(triton_fn, 2 * _bytes(probe)), sized(torch_fn, 12 * probe.numel())
        decision = self._decide(key, probe, unsupported, lambda: self._measure({None: kernel}, reference))
        return (triton_fn if decision.path is Path.TRITON else torch_fn)()

    def add_rms_norm(
        self,
        x: torch.Tensor,
        residual: torch.Tensor | None,
        weight: torch.Tensor,
        *,
        eps: float,
        flavour: str = "diffusers",
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``h = x + residual`` then RMSNorm(h); returns ``(normed, h)``."""
        ok = (
            x.dtype in (torch.bfloat16, torch.float16, torch.float32)
            and x.stride(-1) == 1
            and (residual is None or residual.stride(-1) == 1)
            and (flavour == "nemotron" or weight.dtype == x.dtype)
        )
        return self._elementwise(
            "add_rms_norm",
            lambda: norms.add_rms_norm(x, residual, weight, eps=eps, flavour=flavour),
            lambda: norms.add_rms_norm_reference(x, residual, weight, eps, flavour),
            x, ok, (residual is None, flavour),
        )

    def swiglu(self, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        ok = gate.dtype in (torch.bfloat16, torch.float16, torch.float32) and gate.stride(-1) == 1 and up.stride(-1) == 1
        return self._elementwise(
            "swiglu", lambda: norms.swiglu(gate, up), lambda: norms.swiglu_reference(gate, up), gate, ok
        )

    def relu2(self, x: torch.Tensor) -> torch.Tensor:
        ok = x.dtype in (torch.bfloat16, torch.float16, torch.float32) and x.stride(-1) == 1
        return self._elementwise("relu2", lambda: norms.relu2(x), lambda: norms.relu2_reference(x), x, ok)

    # ---------------------------------------------------------------------------------------------
    # The MLP's input GEMM with its activation: cuBLAS then the activation's pass, or QuACK's epilogue
    # ---------------------------------------------------------------------------------------------
    def _mlp_in_split(self, x: torch.Tensor, w: torch.Tensor, activation: str) -> torch.Tensor:
        """cuBLAS's GEMM, rounded, then the activation's own pass (which rounds as diffusers' ops do)."""
        y = torch.nn.functional.linear(x, w)
        if activation == "swiglu":
            half = y.shape[-1] // 2
            return self.swiglu(y[:, :half], y[:, half:])
        return self.relu2(y)

    def choose_mlp_in(self, x: torch.Tensor, w: torch.Tensor, activation: str) -> Decision:
        """The split path (TORCH) or QuACK's GEMM with the activation in its epilogue (QUACK), for a caller that
        allows one rounding (`mlp_in` without ``one_rounding`` never asks). Forced modes keep the split path: the
        epilogue is a library's kernel, not one of ours."""
        key = ("mlp_in", _device_key(x), x.dtype, tuple(x.shape), tuple(w.shape), activation)
        unsupported = gemm.mlp_in_unsupported(x, w, activation)
        if unsupported is None and self.mode == "triton":
            unsupported = "no Triton kernel for a GEMM (mode triton forces the kernels that exist)"

        def measure() -> Decision:
            # The split path's GEMM output and its activation; QuACK writes the activation only.
            if not self.fits(2 * x.shape[0] * w.shape[0] * x.element_size()):
                return Decision(Path.TORCH, NOT_MEASURED)
            rows = min(x.shape[0], gemm.ERROR_ROWS)
            return self._measure_closer(
                {cfg: (lambda cfg=cfg: gemm.mlp_in_quack(x, w, activation, config=cfg)) for cfg in self.quack_configs},
                lambda: self._mlp_in_split(x, w, activation),
                lambda: gemm.mlp_in_reference(x[:rows], w, activation, out_dtype=torch.float32), rows)

        return self._decide(key, x, unsupported, measure)

    def _measure_closer(self, candidates: dict, split: Callable[[], torch.Tensor], exact: Callable[[], torch.Tensor],
                        rows: int) -> Decision:
        """The library configs no further from fp32 than the split path (`closer_candidates`), each timed against
        it; the fastest is kept, and a tie keeps the split path."""
        kept, left_out = closer_candidates(candidates, split, exact, rows)
        times = self._time_alternating({SPLIT: split, **kept})
        split_ms = times.pop(SPLIT)
        best = min(times, key=times.get) if times else None
        best_ms = times.get(best)
        path = Path.QUACK if best_ms is not None and best_ms < split_ms else Path.TORCH
        reason = "measured" + (f"; left out: {'; '.join(left_out)}" if left_out else "")
        return Decision(path, reason, torch_ms=split_ms, quack_ms=best_ms, quack_config=best)

    def _time_alternating(self, fns: dict, rounds: int = ALTERNATING_ROUNDS) -> dict:
        """{key: median ms} over ``rounds`` rounds that time every candidate in turn, the order reversed every other
        round. Why for the MLP input: under the power cap the first candidate timed after a pause runs at a higher
        clock than the next, and the two paths differ by a few percent (docs/perf-log/2026-12-02.md, "The MLP's activation
        in its GEMM"). A candidate after the first that raises is left out (logged)."""
        samples = {key: [] for key in fns}
        for round_ in range(rounds):
            for key in (list(samples) if round_ % 2 == 0 else list(samples)[::-1]):
                if key not in samples:
                    continue
                try:
                    samples[key].append(self._time(fns[key]))
                except Exception as err:  # noqa: BLE001 - a library config this GPU cannot capture is not fatal
                    if key == next(iter(fns)):
                        raise
                    log.warning("kernel candidate %s failed and is left out: %s: %s", key, type(err).__name__, err)
                    del samples[key]
        return {key: statistics.median(ms) for key, ms in samples.items()}

    def mlp_in(self, x: torch.Tensor, w: torch.Tensor, activation: str, *, one_rounding: bool) -> torch.Tensor:
        """The MLP's activation of ``x @ w^T`` (x [M, K]; w [N, K], for "swiglu" the fused [gate; up] weight, gate's
        rows first): ``silu(gate) * up`` [M, N/2], or ``relu(y)^2`` [M, N] for "relu_sq". With ``one_rounding`` the
        caller accepts the activation on the fp32 accumulator, rounded once (`gemm.mlp_in_reference`), where dispatch
        measures it faster and no less accurate; else the GEMM's output is rounded first, as in diffusers. An FP8
        twin of w runs the split path through its own library."""
        if activation not in gemm.MLP_ACTIVATIONS:
            raise ValueError(f"activation must be one of {gemm.MLP_ACTIVATIONS}, got {activation!r}")
        if one_rounding:
            decision = self.choose_mlp_in(x, w, activation)
            if decision.path is Path.QUACK:
                return gemm.mlp_in_quack(x, w, activation, config=decision.quack_config)
        return self._mlp_in_split(x, w, activation)
