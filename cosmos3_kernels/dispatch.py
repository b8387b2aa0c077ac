"""The gen tower's kernels: each op on the backend measured fastest for its shape on the GPU in hand.

Why measure instead of assuming: SGLang's fused QK-norm+RoPE path won on Blackwell and lost 3.5% on Hopper until it
was gated (seeds 001/003), and at some shapes cuDNN's SDPA beats any Triton attention. So each op's backends are
registered with it (`cosmos3_kernels.registry`: a PyTorch reference, our Triton kernel, flash-attn-4's or QuACK's),
and in "auto" mode the ones that support a call are timed once per (op, shape) by `cosmos3_kernels.autotune`, whose
choice is kept in memory and, with a ``store``, on disk. Rules for an op, in order:

1. inside ``torch.compile`` tracing: the reference, always: plain tensor ops that the compiler can trace and fuse,
   while the Triton launch wrappers are not;
2. mode "torch" (forced): the reference; a forced mode that names no backend of the op (mode "triton" for the MLP's
   input, which has no Triton kernel): the reference too;
3. no other backend supports the call (each backend's `supported` says why), or the device is not CUDA (a Triton
   kernel runs on a CPU only when forced with ``interpret``, Triton's interpreter, for tests): the reference,
   with the reason;
4. mode "triton" (forced): the Triton kernel;
5. "auto": the decision kept for the op and shape; under CUDA-graph capture, which can time nothing, the reference
   (not kept); else every supported backend is timed and the fastest kept. A library's backend (flash-attn-4's
   attention where installed on SM90+, ``COSMOS3_FLASH4=0`` leaves it out; QuACK's GEMM with the MLP's activation
   in its epilogue on SM90, ``COSMOS3_QUACK=0``) is never forced. Where no candidate fits the memory budget, the
   Triton kernel (which writes in place) is taken unmeasured, and the decision says so.

Two ops have rules of their own. The MLP's input with its activation (``mlp_in``) offers QuACK's epilogue only to a
caller that allows one rounding, and only where it is no further from the fp32 result than the split path on that
call (``closer_candidates``); its candidates are timed in alternating rounds. The first layer's attention with its gen
block shared by the branches (``shared_gen_attention``) is taken only where measured faster than that shape's one-call
attention ("regular"). The FP8 attention (``choose_fp8_attention``) is an op of the registry too: a runner per device,
the first backend by the op's measured rank that this device can run, or the one forced.

Settings are the constructor's (mode, timing, interpret): the engine reads them from its configuration. It owns one
``KernelDispatcher`` per loaded model (no module-level state), calls each entry point once eagerly before any CUDA-graph
capture (an unmeasured shape then takes the reference and is not kept), and can list ``decisions()`` for its logs.
"""
from __future__ import annotations

import functools
import hashlib
from typing import Callable, Hashable

import torch

from cosmos3_kernels import attention_fp8, attention_fp8_fa3  # noqa: F401 - they register the FP8 attention's backends
from cosmos3_kernels import gemm, norms, prefix_attention as attn, qk_norm_rope as qk, registry
from cosmos3_kernels import shared_gen_attention as sga  # noqa: F401 - it registers the shared attention's backends
from cosmos3_kernels.autotune import NOT_MEASURED, TIMINGS, Autotuner, Decision, sized
from cosmos3_kernels.packed_kv import PackedKVLayout
from cosmos3_kernels.persist import DecisionStore

MODES = ("auto", "triton", "torch")
# Where the engine reads the settings (named here, read there: this package reads no environment).
ENV_VAR = "COSMOS3_KERNELS"
TIMING_ENV_VAR = "COSMOS3_DISPATCH_TIMING"
REGULAR = "regular"  # the shared first-layer attention's "not shared": the one-call `prefix_attention`
_CONFIG_TYPES = {cls.__name__: cls for cls in (attn.AttentionConfig, attn.Flash4Config, gemm.QuackConfig)}

# Candidate launch shapes for attention, timed against each other and SDPA on first use of a shape.
# Why these two (H200 sweep, docs/perf-log/2026-12-02.md): 128x128 with 8 warps (two warpgroups, TMA-fed K/V)
# was fastest from 12k gen tokens up; 64x64 with 4 warps was fastest at the T2I shapes (400 and 1024
# gen tokens), where 128-row blocks leave too few programs per SM.
DEFAULT_ATTENTION_CONFIGS = (
    attn.AttentionConfig(block_m=128, block_n=128, num_warps=8, num_stages=3, use_tma=True),
    attn.AttentionConfig(block_m=64, block_n=64, num_warps=4, num_stages=3, use_tma=True),
)


def _bytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _device_key(t: torch.Tensor) -> str:
    if t.device.type == "cuda":
        return f"cuda:{t.device.index if t.device.index is not None else torch.cuda.current_device()}"
    return str(t.device)


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
    return qk.rounding_refused(head_dim, torch.device(device))


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


def choose_fp8_attention(device, forced: str = "auto") -> tuple[str | None, str | None]:
    """(the FP8 attention backend to build for `device`, None), or (None, what the device or host lacks): the first
    of the op's backends by rank that `device` supports, or only the one `forced` names (no fallback). Its rank is a
    measurement made once for every length (`cosmos3_kernels.attention_fp8_fa3`), not timed per shape: one runner
    serves every call of a loaded model. A forced name that is no backend of the op raises ValueError naming both."""
    candidates = registry.backends("attention_fp8") if forced == "auto" else (registry.forced("attention_fp8", forced),)
    lacking = []
    for backend in candidates:
        why = backend.supported(device)
        if why is None:
            return backend.name, None
        lacking.append(why)
    return None, " or ".join(lacking)


class KernelDispatcher:
    """Each op of the gen tower on its chosen backend; see the module docstring for the rules. `interpret`: Triton's
    interpreter is on (``TRITON_INTERPRET=1``), so a forced Triton kernel may run on the CPU (tests)."""

    def __init__(
        self,
        mode: str = "auto",
        *,
        timing: str = "graph",
        interpret: bool = False,
        warmup: int = 2,
        iters: int = 5,
        attention_configs: tuple[attn.AttentionConfig, ...] = DEFAULT_ATTENTION_CONFIGS,
        flash4_configs: tuple[attn.Flash4Config, ...] = attn.DEFAULT_FLASH4_CONFIGS,
        quack_configs: tuple[gemm.QuackConfig, ...] = gemm.DEFAULT_QUACK_CONFIGS,
        store: DecisionStore | None = None,
        free_memory: Callable[[], int] | None = None,
    ) -> None:
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        if not attention_configs:
            raise ValueError("attention_configs must name at least one AttentionConfig")
        self.mode, self.interpret = mode, interpret
        self.attention_configs = tuple(attention_configs)
        self.flash4_configs = tuple(flash4_configs)
        self.quack_configs = tuple(quack_configs)
        # Stored decisions are this dispatcher's only if it offered the same candidates (benchmarks pass their own).
        scope = hashlib.sha256(repr((self.attention_configs, self.flash4_configs,
                                     self.quack_configs)).encode()).hexdigest()[:12]
        self.tuner = Autotuner(timing=timing, warmup=warmup, iters=iters, store=store, free_memory=free_memory,
                               scope=scope, config_types=_CONFIG_TYPES)

    @property
    def timing(self) -> str:
        return self.tuner.timing

    def decisions(self) -> dict[Hashable, Decision]:
        """A copy of the measured (kept) decisions, keyed by op and shape."""
        return self.tuner.decisions()

    def clear(self) -> None:
        self.tuner.clear()

    def configs(self, backend: registry.Backend, *args, **kwargs) -> tuple:
        """The launch configs `backend` is timed over for this call ((None,): its one launch)."""
        if backend.configs is None:
            return (None,)
        listed = getattr(self, f"{backend.configs}_configs")
        return tuple(backend.fit_configs(listed, *args, **kwargs)) if backend.fit_configs else listed

    # ---------------------------------------------------------------------------------------------
    # The rule chain shared by the ops
    # ---------------------------------------------------------------------------------------------
    def choose(self, op: str, *args, **kwargs) -> Decision:
        """The backend `op` runs these inputs on (its inputs as its entry point takes them, less the output)."""
        if op == "shared_gen_attention":
            return self._choose_sharing(*args, **kwargs)
        reference = registry.reference(op).name
        if torch.compiler.is_compiling():
            return Decision(reference, "compiling: split path is compile-safe")
        if self.mode == "torch":
            return Decision(reference, "forced")
        forced = None if self.mode == "auto" else self.mode
        if forced is not None and forced not in registry.forcible(op):
            return Decision(reference, f"unsupported: {op} has no {forced} kernel (mode {forced} forces the kernels "
                                       "that exist)")
        probe = args[0]
        kernels = [b for b in registry.backends(op) if not b.reference and forced in (None, b.name)]
        reasons = {b.name: self._refused(b, probe, forced, args, kwargs) for b in kernels}
        usable = [b for b in kernels if reasons[b.name] is None]
        if not usable:
            return Decision(reference, f"unsupported: {reasons[kernels[0].name]}")
        if forced is not None:
            return Decision(forced, "forced", config=self.configs(usable[0], *args, **kwargs)[0])
        key = (op, _device_key(probe), *registry.shape(op).key(*args, **kwargs))
        kept = self.tuner.cached(key)
        if kept is not None:
            return kept
        if torch.cuda.is_current_stream_capturing():
            return Decision(reference, "capturing: not measured; call once before capture")
        measure = self._measure_mlp_in if op == "mlp_in" else self._measure
        return self.tuner.remember(key, measure(op, usable, args, kwargs))

    def _refused(self, backend: registry.Backend, probe: torch.Tensor, forced: str | None, args, kwargs) -> str | None:
        why = backend.supported(*args, **kwargs)
        if why is None and probe.device.type != "cuda" and not (forced is not None and self.interpret):
            why = f"device {probe.device} (Triton needs CUDA or TRITON_INTERPRET=1)"
        return why

    def _measure(self, op: str, usable: list, args: tuple, kwargs: dict) -> Decision:
        """Every supported backend timed (the reference too where it supports the call), each over its configs;
        the fastest kept (`Autotuner.measure`). Outputs go to a scratch tensor where the op writes one."""
        in_place = (usable[0].name, (self.configs(usable[0], *args, **kwargs) or (None,))[0])  # where nothing fits
        outputs, output = {}, registry.shape(op).output
        if output is not None:
            if not self.tuner.fits(_bytes(args[0])):
                return Decision(in_place[0], NOT_MEASURED, config=in_place[1])
            outputs = {output: torch.empty_like(args[0])}  # never time in place: the input must stay
        reference = registry.reference(op)
        offered = ([reference] if reference.supported(*args, **kwargs) is None else []) + usable
        candidates = {
            b.name: {cfg: sized(functools.partial(b.call, *args, config=cfg, **kwargs, **outputs),
                                b.need_bytes(*args, **kwargs) if b.need_bytes else 0)
                     for cfg in self.configs(b, *args, **kwargs)}
            for b in offered
        }
        return self.tuner.measure(candidates, tolerant=frozenset(b.name for b in offered if b.library),
                                  if_none_fits=in_place)

    # ---------------------------------------------------------------------------------------------
    # Entry points
    # ---------------------------------------------------------------------------------------------
    def run(self, op: str, args: tuple, kwargs: dict, **outputs) -> object:
        """`op` on the backend `choose` picks for its inputs (`args`, `kwargs`), writing into `outputs` (its ``out``
        or ``q_out``, where given)."""
        decision = self.choose(op, *args, **kwargs)
        backend = registry.backend(op, decision.backend)
        if backend.reference:
            why = backend.supported(*args, **kwargs)
            if why is not None:  # the reference was taken only because nothing else could run
                raise ValueError(f"{op}: dispatch chose the PyTorch path ({decision.reason}), which cannot run this "
                                 f"call: it {why}")
        return backend.call(*args, config=decision.config, **kwargs, **outputs)

    def qk_norm_rope_pack(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_weight: torch.Tensor,
                          k_weight: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, kv_buffer: torch.Tensor,
                          layout: PackedKVLayout, *, eps: float, flavour: str = "diffusers",
                          round_norm_before_rope: bool = False, q_out: torch.Tensor | None = None) -> torch.Tensor:
        """Per-head RMSNorm + rotary on q [B,N,Hq,D] and k [B,N,Hkv,D]; k, v into ``kv_buffer``'s gen rows.

        Returns the rotated q ([B, N, Hq, D]; in ``q_out`` if given). With ``round_norm_before_rope`` the
        result equals the split PyTorch path bit for bit in bf16, on either path.
        """
        return self.run("qk_norm_rope", (q, k, v, q_weight, k_weight, cos, sin, kv_buffer, layout),
                         dict(eps=eps, flavour=flavour, round_norm_before_rope=round_norm_before_rope), q_out=q_out)

    def prefix_attention(self, q: torch.Tensor, kv_buffer: torch.Tensor, layout: PackedKVLayout, *,
                         scale: float | None = None, out: torch.Tensor | None = None) -> torch.Tensor:
        """Gen queries q [B, N, Hq, D] over each branch's ``[prefix | gen]`` rows; returns [B, N, Hq, D]."""
        return self.run("prefix_attention", (q, kv_buffer, layout), dict(scale=scale), out=out)

    def add_rms_norm(self, x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, *, eps: float,
                     flavour: str = "diffusers") -> tuple[torch.Tensor, torch.Tensor]:
        """``h = x + residual`` then RMSNorm(h); returns ``(normed, h)``."""
        return self.run("add_rms_norm", (x, residual, weight), dict(eps=eps, flavour=flavour))

    def swiglu(self, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        return self.run("swiglu", (gate, up), {})

    def relu2(self, x: torch.Tensor) -> torch.Tensor:
        return self.run("relu2", (x,), {})

    # ---------------------------------------------------------------------------------------------
    # The MLP's input GEMM with its activation: cuBLAS then the activation's pass, or QuACK's epilogue
    # ---------------------------------------------------------------------------------------------
    def _mlp_in_split(self, x: torch.Tensor, w: torch.Tensor, activation: str) -> torch.Tensor:
        return gemm.mlp_in_split(x, w, activation, swiglu=self.swiglu, relu2=self.relu2)

    def _measure_mlp_in(self, op: str, usable: list, args: tuple, kwargs: dict) -> Decision:
        """The library configs no further from fp32 than the split path (`closer_candidates`), each timed against
        it in alternating rounds; the fastest is kept, and a tie keeps the split path."""
        x, w, activation = args
        # The split path's GEMM output and its activation; QuACK writes the activation only.
        if not self.tuner.fits(2 * x.shape[0] * w.shape[0] * x.element_size()):
            return Decision("torch", NOT_MEASURED)
        rows = min(x.shape[0], gemm.ERROR_ROWS)
        split = functools.partial(self._mlp_in_split, x, w, activation)
        candidates, left_out = {"torch": {None: split}}, []
        for backend in usable:
            candidates[backend.name], dropped = closer_candidates(
                {cfg: functools.partial(backend.call, x, w, activation, config=cfg) for cfg in self.configs(backend)},
                split, lambda: gemm.mlp_in_reference(x[:rows], w, activation, out_dtype=torch.float32), rows)
            left_out += dropped
        return self.tuner.measure_alternating(candidates, left_out=tuple(left_out))

    def mlp_in(self, x: torch.Tensor, w: torch.Tensor, activation: str, *, one_rounding: bool) -> torch.Tensor:
        """The MLP's activation of ``x @ w^T`` (x [M, K]; w [N, K], for "swiglu" the fused [gate; up] weight, gate's
        rows first): ``silu(gate) * up`` [M, N/2], or ``relu(y)^2`` [M, N] for "relu_sq". With ``one_rounding`` the
        caller accepts the activation on the fp32 accumulator, rounded once (`gemm.mlp_in_reference`), where dispatch
        measures it faster and no less accurate; else the GEMM's output is rounded first, as in diffusers. An FP8
        twin of w runs the split path through its own library."""
        if activation not in gemm.MLP_ACTIVATIONS:
            raise ValueError(f"activation must be one of {gemm.MLP_ACTIVATIONS}, got {activation!r}")
        if one_rounding:
            decision = self.choose("mlp_in", x, w, activation)
            if decision.backend != "torch":
                return registry.backend("mlp_in", decision.backend).call(x, w, activation, config=decision.config)
        return self._mlp_in_split(x, w, activation)

    # ---------------------------------------------------------------------------------------------
    # The first layer's attention, its gen block shared by the branches
    # ---------------------------------------------------------------------------------------------
    def _choose_sharing(self, q: torch.Tensor, kv_buffer: torch.Tensor, layout: PackedKVLayout, *,
                        scale: float | None = None) -> Decision:
        """Rules: not while compiling, nor where the shared form does not apply (`sga.check_shared_inputs`); on the
        CPU the PyTorch reference (tests: the model is tiny there); on CUDA only in "auto" mode with flash-attn-4,
        the one kernel here that returns the log-sum-exp the combine needs, and only where it is measured faster
        than this shape's `prefix_attention` (the time its own decision measured for its choice)."""
        op = "shared_gen_attention"
        if torch.compiler.is_compiling():
            return Decision(REGULAR, "compiling")
        why = registry.reference("shared_gen_attention").supported(q, kv_buffer, layout)
        if why is not None:
            return Decision(REGULAR, f"unsupported: {why}")
        if q.device.type != "cuda":
            return Decision("torch", "cpu: the reference")
        if self.mode != "auto":
            return Decision(REGULAR, f"mode {self.mode}: forced paths run the attention of every other layer")
        shared = registry.backend("shared_gen_attention", "flash4")
        why = shared.supported(q, kv_buffer, layout)
        if why is not None:
            return Decision(REGULAR, f"unsupported: {why}")
        key = (op, _device_key(q), *registry.shape(op).key(q, kv_buffer, layout))
        kept = self.tuner.cached(key)
        if kept is not None:
            return kept
        if torch.cuda.is_current_stream_capturing():
            return Decision(REGULAR, "capturing: not measured; call once before capture")
        if not self.tuner.fits(2 * _bytes(q)):
            return Decision(REGULAR, NOT_MEASURED)
        scratch = torch.empty_like(q)
        # The one-call attention's own decision timed its chosen path the same way: that time is the bar.
        regular_ms = self.choose("prefix_attention", q, kv_buffer, layout, scale=scale).chosen_ms
        if regular_ms is None:
            regular_ms = self.tuner.time(lambda: self.prefix_attention(q, kv_buffer, layout, scale=scale, out=scratch))
        configs = {cfg: functools.partial(shared.call, q, kv_buffer, layout, scale=scale, out=scratch, config=cfg)
                   for cfg in self.configs(shared, q, kv_buffer, layout)}
        cfg, shared_ms = self.tuner.fastest(configs, skip_failures=True)
        faster = shared_ms is not None and shared_ms < regular_ms
        ms = {REGULAR: regular_ms, **({shared.name: shared_ms} if shared_ms is not None else {})}
        return self.tuner.remember(key, Decision(shared.name if faster else REGULAR, "measured", ms,
                                                 cfg if faster else None))

    def shared_gen_attention(self, q: torch.Tensor, kv_buffer: torch.Tensor, layout: PackedKVLayout, *,
                             scale: float | None = None, out: torch.Tensor | None = None) -> torch.Tensor:
        """The first layer's attention, q [B, N, Hq, D] over each branch's rows, with the gen block of branch 0
        for every branch (``cosmos3_kernels.shared_gen_attention``: only where every branch's gen tokens are the same
        and their positions shifted alike) where `choose` says so, else `prefix_attention`."""
        decision = self.choose("shared_gen_attention", q, kv_buffer, layout, scale=scale)
        if decision.backend == REGULAR:
            return self.prefix_attention(q, kv_buffer, layout, scale=scale, out=out)
        return registry.backend("shared_gen_attention", decision.backend).call(
            q, kv_buffer, layout, scale=scale, out=out, config=decision.config)
