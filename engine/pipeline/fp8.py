"""Opt-in FP8 GEMMs for the gen tower, through torchao's float8 (a switchable pass; off by default).

What it changes: the gen tower's per-step GEMMs (fused q|k|v, attention output, the MLP's input GEMM
(fused gate|up, or ReLU²'s up) and its down projection) become scaled float8 (e4m3) GEMMs with
dynamically quantised activations: torchao's `Float8Tensor` (what
`Float8DynamicActivationFloat8WeightConfig` makes), Hopper's FP8 tensor cores through
`torch._scaled_mm`, each activation quantised by torchao's PyTorch ops or by MSLK's one Triton kernel where
`mslk-cuda` is installed (`QUANTISERS`). Which GEMMs, which scaling, which accumulation and which quantiser is an `FP8Policy`
(`COSMOS3_FP8_POLICY`, default per family: `DEFAULT_POLICIES`); a GEMM the policy leaves out reads the bf16 weight.
The text tower (once per request), the embeddings and the output projection stay bf16. The result is
approximate, so it is never on unless asked for (`COSMOS3_FP8=1` or `FastPathOptions(fp8=True)`) and
every result made with it says so: `FP8_LABEL` as the result's `precision`, in its summary (the API's
answer) and sidecar, beside the policy's spelling (`fp8_policy`).

Two ways to hold the weights:
- beside the bf16 ones (`fp8_weights`, built on the first FP8 request, kept on the model's runtime): requests
  without FP8 and the exact path keep running bf16; FP8 adds about half the gen tower's bf16 bytes;
- FP8 only (`build_fp8_transformer`, for a model whose bf16 weights do not fit the GPU: Super on one
  H200): built layer by layer, each layer's bf16 gen weights quantised and freed before the next is
  made, so the bf16 model never exists whole; every path of such a model runs the FP8 GEMMs.

Attention can run in FP8 too (the policy's role "attn", e.g. "row:in+attn"), where a branch has at least
`FP8_ATTENTION_MIN_GEN_TOKENS` gen tokens (shorter calls keep the bf16 attention), on the kernels of
`FP8_ATTENTION_BACKENDS` the host has: FlashAttention-3's FP8 forward (`cosmos3_kernels.attention_fp8_fa3`, optional:
`fa3-fwd`) where it is installed, else cuDNN's FP8 SDPA (`cosmos3_kernels.attention_fp8`, optional:
`nvidia-cudnn-frontend`).

Numeric gate (tests/gpu/test_gpu_fp8.py, full-size random weights on the H200): one step's velocity
against an fp32 forward of the same weights stays within 3x the relative error of diffusers' own
bf16 forward against that fp32 forward. `bench/bench_fp8.py --gate` measures every candidate policy.
"""
from __future__ import annotations

import functools
import importlib.util
from dataclasses import dataclass, field, replace

import torch

from cosmos3_kernels import registry
from cosmos3_kernels.dispatch import choose_fp8_attention

FP8_LABEL = "FP8 (faster, approximate)"
BF16_LABEL = "bf16"

# A layer's GEMMs by role: "qkv" (fused q|k|v), "out" (attention output), "in" (the MLP's input: fused
# gate|up, or ReLU²'s up), "down" (the MLP's output).
GEMMS = ("qkv", "out", "in", "down")
# Every role a policy can name: the GEMMs, and "attn", the attention itself (not a GEMM: `FP8_ATTENTION_BACKENDS`).
ROLES = GEMMS + ("attn",)

# The kernel that quantises each FP8 GEMM's activation (a row's amax, its scale, the e4m3 cast); the GEMM itself
# is `torch._scaled_mm` under both. "torch": torchao's PyTorch ops, six generic kernels a GEMM. "mslk": MSLK's
# fused Triton row kernel, one, through torchao's `KernelPreference.MSLK` (optional: `mslk-cuda`). One rounding
# differs: torchao takes amax / 448 in the activation's dtype (bf16) before widening it, MSLK in fp32, so an
# element can land one e4m3 step apart (tests/gpu/test_gpu_fp8.py; the gate holds either way, docs/perf-log/2026-12-02.md).
# Only MSLK's Triton quantiser is used, so its native library stays unloaded (`engine/__init__.py` says why).
QUANTISERS = ("torch", "mslk")
MSLK_DISTRIBUTION = "mslk-cuda"

# Below this many gen tokens per branch the FP8 attention is not offered: there its quantisation passes cost more
# than its FP8 tensor cores save. Swept on one H200 (Nano's heads, both branches, quantisation included; `python3
# bench/bench_attention_fp8.py --iters 20 --gen 4096,...,32768`; docs/perf-log/2026-12-02.md, "One FP8 attention kernel at
# every length"): FA3's FP8 forward against bf16's flash-attn-4 took 2.31 against 2.18 ms at 6144 and 3.53
# against 3.68 at 8192, and won at every length above. cuDNN's FP8 SDPA first won at 9216 (4.42 against 4.71; 3.88
# against 3.68 at 8192), so on a host with cuDNN's and not FA3's the calls of 8192-9215 gen tokens lose about 5%.
FP8_ATTENTION_MIN_GEN_TOKENS = 8192

# The kernels the role "attn" runs on: the backends of the op "attention_fp8" in `cosmos3_kernels.registry`, in their
# measured rank (FA3's FP8 forward, then cuDNN's FP8 SDPA; `cosmos3_kernels.attention_fp8_fa3` says why): the first
# this device and host can run takes every FP8 attention call, unless `COSMOS3_FP8_ATTENTION` names one.
FP8_ATTENTION_BACKENDS = registry.names("attention_fp8")


class FP8Unavailable(RuntimeError):
    """FP8 was asked for where it cannot run; the message says what is missing."""


@dataclass(frozen=True)
class FP8Policy:
    """Which GEMMs run in FP8 and how. `granularity`: "row" (a scale per token and per output channel)
    or "tensor" (one scale each); `fast_accum`: Hopper's reduced-precision FP8 accumulation (torchao's
    default) or full fp32 accumulation; `gemms`: the GEMM roles in FP8; `attention`: the attention too (the
    role "attn"); `bf16_edges`: that many first and last layers kept wholly bf16; `quantiser`: the kernel
    that quantises the activations (`QUANTISERS`). Its `name` is its spelling in `COSMOS3_FP8_POLICY`, e.g.
    "row", "row-exact", "row:qkv+in", "row:in+attn", "tensor-exact@2", "row:in+attn/mslk"."""

    granularity: str = "row"
    fast_accum: bool = True
    gemms: frozenset = frozenset(GEMMS)
    bf16_edges: int = 0
    attention: bool = False  # the role "attn": the attention in FP8 (`FP8_ATTENTION_BACKENDS`)
    quantiser: str = "torch"

    def __post_init__(self):
        if self.granularity not in ("row", "tensor"):
            raise ValueError(f"FP8 granularity {self.granularity!r}: allowed 'row' or 'tensor'")
        if self.quantiser not in QUANTISERS:
            raise ValueError(f"FP8 quantiser {self.quantiser!r}: allowed one of {list(QUANTISERS)}")
        if self.quantiser == "mslk" and self.granularity != "row":
            raise ValueError(f"FP8 quantiser 'mslk' quantises by rows; granularity {self.granularity!r} needs 'torch'")
        unknown = set(self.gemms) - set(GEMMS)
        if unknown or not (self.gemms or self.attention):
            raise ValueError(f"FP8 roles {sorted(self.gemms)}: allowed a non-empty subset of {list(ROLES)}")

    @property
    def roles(self) -> tuple:
        return tuple(g for g in GEMMS if g in self.gemms) + (("attn",) if self.attention else ())

    @property
    def name(self) -> str:
        text = self.granularity + ("" if self.fast_accum else "-exact")
        if set(self.gemms) != set(GEMMS) or self.attention:
            text += ":" + "+".join(self.roles)
        text += f"@{self.bf16_edges}" if self.bf16_edges else ""
        return text + ("" if self.quantiser == "torch" else "/" + self.quantiser)

    @classmethod
    def parse(cls, text: str) -> "FP8Policy":
        """`name`'s inverse; a malformed spelling raises ValueError quoting it and the grammar."""
        grammar = ("GRANULARITY[-exact][:ROLE+ROLE...][@EDGES][/QUANTISER] with roles from " + "+".join(ROLES)
                   + " and quantisers from " + "|".join(QUANTISERS)
                   + ", e.g. 'row', 'row-exact:qkv+in', 'row:in+attn', 'tensor@2', 'row:in/mslk'")
        head, slash, quantiser = text.strip().partition("/")
        body, _, edges = head.partition("@")
        body, colon, roles = body.partition(":")
        granularity, _, accum = body.partition("-")
        try:
            if accum not in ("", "exact") or (edges and int(edges) < 0) or (colon and not roles) or (slash and not quantiser):
                raise ValueError
            named = set(roles.split("+")) if roles else set(GEMMS)
            return cls(granularity, accum != "exact", frozenset(named - {"attn"}), int(edges) if edges else 0,
                       attention="attn" in named, quantiser=quantiser or "torch")
        except ValueError as error:
            raise ValueError(f"FP8 policy {text!r} is not valid ({str(error) or 'malformed'}); allowed: {grammar}") from None

    def _edge(self, index: int, count: int) -> bool:
        return index < self.bf16_edges or index >= count - self.bf16_edges

    def gemms_of_layer(self, index: int, count: int) -> frozenset:
        return frozenset() if self._edge(index, count) else self.gemms

    def attention_of_layer(self, index: int, count: int) -> bool:
        return self.attention and not self._edge(index, count)


# The FP8 mode per family, chosen by measurement (bench/bench_fp8.py --gate, one H200, full-size random
# weights; docs/perf-log/2026-12-02.md): the fastest policy whose velocity error stays within 3x diffusers' bf16 error.
# Nano: the MLP's input GEMM (gate|up) in FP8: 2.90x / 2.78x, a 480p/121f step 808 ms against 903 in bf16
# (all GEMMs in FP8: 4.61x / 5.13x); with it, the attention in FP8 ("row:in+attn", v centred): 2.94x / 2.84x
# with cuDNN's FP8 SDPA forced at the gate's sizes (before v was centred: 3.24x / 3.80x), 2.95x / 2.81x with FA3's
# FP8 forward and MSLK's quantiser; the attention runs from FP8_ATTENTION_MIN_GEN_TOKENS per branch (videos) only.
# Where no FP8 attention can run, the default drops its "attn" role (`policy_for`). Edge: only the
# down projection passes (2.89x; its `in`: 3.17x; in+attn 3.21x); with torchao's quantiser it is slower than bf16
# (313 ms against 255), with MSLK's level (258 against 262, one timed step each; by our reading the
# quantisation of its 9216-wide input was the cost); its FP8 attention alone passes (1.18x) but timed 222.9
# against 230.3 ms in one gate run and 247.9 against 233.9 in another (one timed step each), too close to call,
# so Edge keeps row:down. Where MSLK is installed every default takes its quantiser ("/mslk", `policy_for`):
# the gate moved by at most 0.03x.
# Super shares Nano's architecture (SwiGLU) and takes its policy, attention included (an fp32 Super forward fits no
# GPU, so its gate cannot be measured); built FP8-only, its GEMM weights are fixed at load. The attention in FP8
# takes its 720p step from 21.2 s to 15.3 s: 1280x720/189f on one H200, FA3's FP8 attention against cuDNN's bf16
# SDPA (3-step requests; docs/perf-log/2026-12-04-super-and-restart.md).
DEFAULT_POLICIES = {"nano": "row:in+attn", "super": "row:in+attn", "edge": "row:down"}
DEFAULT_POLICY = "row:in"  # any other family (custom checkpoints)


def policy_for(family: str | None = None, spelling: str = "", attention_available: bool = True,
               mslk_available: bool = False) -> FP8Policy:
    """`spelling` when given (`FastPathOptions.fp8_policy`, from `COSMOS3_FP8_POLICY`), else the family's measured
    default: without its "attn" role where the FP8 attention is not `attention_available`, with MSLK's quantiser
    where it is `mslk_available` (a default never asks for what the host lacks; a policy named explicitly is
    checked, and refused, by `check_available`)."""
    if spelling.strip():
        return FP8Policy.parse(spelling.strip())
    default = FP8Policy.parse(DEFAULT_POLICIES.get(family, DEFAULT_POLICY))
    if default.attention and not attention_available:
        default = replace(default, attention=False)
    if mslk_available and default.granularity == "row":
        default = replace(default, quantiser="mslk")
    return default


def host_policy(family: str | None, device, spelling: str = "", backend: str = "") -> FP8Policy:
    """`policy_for` what this device and host can run (`backend`: the FP8 attention kernel named, "" any)."""
    return policy_for(family, spelling, attention_available=attention_unavailable(device, backend) is None,
                      mslk_available=mslk_unavailable(device) is None)


def check_available(device, policy: FP8Policy | None = None, backend: str = "") -> None:
    """Raise `FP8Unavailable` unless this device and environment can run torchao's float8 GEMMs, and, where
    `policy` names attention, an FP8 attention kernel (`attention_backend`, `backend` where named)."""
    device = torch.device(device)
    if device.type != "cuda":
        raise FP8Unavailable(f"FP8 needs a CUDA GPU with FP8 tensor cores (compute capability >= 8.9); "
                             f"this model runs on {device.type!r}.")
    capability = torch.cuda.get_device_capability(device)
    if capability < (8, 9):
        raise FP8Unavailable(f"FP8 needs compute capability >= 8.9 (Ada, Hopper or newer); "
                             f"{torch.cuda.get_device_name(device)} has {capability[0]}.{capability[1]}.")
    try:
        import torchao  # noqa: F401
    except ImportError as error:
        raise FP8Unavailable("FP8 needs the package torchao (requirements.txt); "
                             f"it is not installed: {error}") from error
    if policy is not None and policy.attention:
        why = attention_unavailable(device, backend)
        if why is not None:
            raise FP8Unavailable(f"FP8 policy {policy.name!r} runs attention in FP8, which needs {why}. "
                                 "Leave 'attn' out of the policy (COSMOS3_FP8_POLICY).")
    if policy is not None and policy.quantiser == "mslk":
        why = mslk_unavailable(device)
        if why is not None:
            raise FP8Unavailable(f"FP8 policy {policy.name!r} quantises activations with MSLK's kernel, which needs {why}. "
                                 "Leave '/mslk' out of the policy (COSMOS3_FP8_POLICY).")


def _hopper_missing(device) -> str | None:
    """What `device` lacks to be a CUDA GPU of compute capability 9.0 (Hopper) or newer (None: nothing)."""
    device = torch.device(device)
    if device.type != "cuda":
        return f"a CUDA GPU (this model runs on {device.type!r})"
    capability = torch.cuda.get_device_capability(device)
    if capability < (9, 0):
        return (f"compute capability >= 9.0 (Hopper); {torch.cuda.get_device_name(device)} has "
                f"{capability[0]}.{capability[1]}")
    return None


def attention_backend(device, named: str = "") -> tuple[str | None, str | None]:
    """(the fastest FP8 attention kernel `device` and this host can run, None), only `named`'s where given (a name
    from `FP8_ATTENTION_BACKENDS`: `COSMOS3_FP8_ATTENTION`, checked by `engine.config`); or (None, what the device
    or host lacks for any)."""
    why = _hopper_missing(device)
    if why is not None:
        return None, why
    return choose_fp8_attention(device, named or "auto")


def attention_unavailable(device, named: str = "") -> str | None:
    """What this device or host lacks for the FP8 attention (`named`'s where given; None: nothing)."""
    return attention_backend(device, named)[1]


@functools.cache
def _mslk_installed() -> bool:
    """Looked up once per process: `host_policy` asks on every FP8 request."""
    return importlib.util.find_spec("mslk") is not None


def mslk_unavailable(device) -> str | None:
    """What this device or host lacks for MSLK's activation quantiser (None: nothing)."""
    why = _hopper_missing(device)  # Hopper: torchao's own condition for KernelPreference.MSLK
    if why is None and not _mslk_installed():
        why = f"the package {MSLK_DISTRIBUTION} (requirements-gpu.txt), which is not installed"
    return why


def quantize_weight(weight: torch.Tensor, policy: FP8Policy) -> torch.Tensor:
    """One bf16 weight [out, in] -> torchao's float8 weight tensor (F.linear on it quantises the
    activation as the policy says and runs the FP8 GEMM). The same tensor torchao's
    `Float8DynamicActivationFloat8WeightConfig` puts on a Linear, built directly so that the
    accumulation switch and the granularity come from the policy."""
    from torchao.float8.inference import Float8MMConfig
    from torchao.quantization import Float8Tensor, PerRow, PerTensor
    from torchao.quantization.quantize_.common import KernelPreference
    from torchao.quantization.quantize_.workflows.float8.float8_tensor import QuantizeTensorToFloat8Kwargs

    granularity = PerRow() if policy.granularity == "row" else PerTensor()
    # The weight's preference picks the GEMM: TORCH, `torch._scaled_mm` under every quantiser, as the gate measured
    # it (torchao's AUTO would take MSLK's own GEMMs wherever MSLK is installed). The activation's picks its quantiser.
    quantiser = KernelPreference.MSLK if policy.quantiser == "mslk" else KernelPreference.TORCH
    activation = QuantizeTensorToFloat8Kwargs(torch.float8_e4m3fn, granularity, kernel_preference=quantiser)
    return Float8Tensor.from_hp(weight.detach(), float8_dtype=torch.float8_e4m3fn, granularity=granularity,
                                mm_config=Float8MMConfig(use_fast_accum=policy.fast_accum),
                                kernel_preference=KernelPreference.TORCH, act_quant_kwargs=activation)


@dataclass
class FP8Weights:
    """The weights the FP8 gen tower reads, per layer: float8 where the policy says, else the bf16 one.
    `resident`: the model holds no other copy (built FP8-only), so every path must read these."""

    policy: FP8Policy
    qkv: list
    gate_up: list
    per_layer: list[dict] = field(default_factory=list)  # {"to_add_out", "down_proj", and for ReLU² "up_proj"}
    resident: bool = False
    # The FP8 attention's runner (`fp8_attention`) where the policy names "attn" (kept from an earlier policy too:
    # `attends_in_fp8` asks the policy, so a runner the policy does not name is never called)
    attention: object = None

    def attends_in_fp8(self, index: int, count: int, layout) -> bool:
        """Whether layer `index` of `count` runs its attention in FP8 over `layout` (a `PackedKVLayout`): long
        enough branches, and host lengths (the FP8 kernels quantise per branch by them; a kept step graph's device
        lengths are read by the bf16 kernels only)."""
        return (self.attention is not None and layout.gen_len >= FP8_ATTENTION_MIN_GEN_TOKENS
                and layout.lengths is None and self.policy.attention_of_layer(index, count))


def fp8_attention(policy: FP8Policy, device, centred: bool = True, backend: str = "", pack_gqa: str = ""):
    """The FP8 attention a policy's weights carry (one per loaded model), or None where the policy leaves it out:
    `attention_backend`'s kernel (`backend`'s where named); cuDNN's where none can run, whose call then says why
    (`check_available` refuses such a policy before it gets here). `pack_gqa`: `fa3_pack_gqa`'s spelling."""
    if not policy.attention:
        return None
    name = attention_backend(device, backend)[0] or "cudnn"
    knobs = {"pack_gqa": fa3_pack_gqa(pack_gqa)} if name == "fa3" else {}  # FA3's own
    return registry.backend("attention_fp8", name).call(centred=centred, **knobs)


def fa3_pack_gqa(spelling: str = "") -> bool | None:
    """`COSMOS3_FA3_PACK_GQA` (for benchmarks; `engine.config` checks the spelling): 1 or 0 turns FA3's packing of
    the query heads per K/V head on or off, auto leaves it to FA3's heuristic; "", the measured default
    (`cosmos3_kernels.attention_fp8_fa3.PACK_GQA`)."""
    from cosmos3_kernels.attention_fp8_fa3 import PACK_GQA

    choices = {"": PACK_GQA, "1": True, "0": False, "auto": None}
    if spelling not in choices:
        raise ValueError(f"FA3 pack_gqa {spelling!r}: allowed '1', '0', 'auto' (FA3's own heuristic), or '' "
                         f"(the measured default, {PACK_GQA})")
    return choices[spelling]


def _layer_weights(layer, qkv: torch.Tensor, gate_up, gemms: frozenset, quantize) -> tuple:
    """One layer's (qkv, gate_up, per-layer dict), float8 where `gemms` says."""
    attn, mlp = layer.self_attn, layer.mlp_moe_gen

    def pick(role, weight):
        return quantize(weight) if role in gemms and weight is not None else weight

    per_layer = {"to_add_out": pick("out", attn.to_add_out.weight), "down_proj": pick("down", mlp.down_proj.weight)}
    if mlp.hidden_act != "silu":
        per_layer["up_proj"] = pick("in", mlp.up_proj.weight)
    return pick("qkv", qkv), pick("in", gate_up), per_layer


def fp8_weights(model, fused, policy: FP8Policy, backend: str = "", pack_gqa: str = "") -> FP8Weights:
    """Quantise once per loaded model and policy and keep the result on its runtime; the bf16 weights are
    untouched, so a request without FP8 (or the exact path) still runs bf16. `fused`: the model's fused
    projections (`engine.pipeline.fast_path.fused_projections`), quantised as they are. `backend`, `pack_gqa`:
    the FP8 attention's (`fp8_attention`)."""
    runtime = model.runtime
    held = runtime.fp8_weights
    if held is not None and (held.resident or held.policy == policy):
        return held
    check_available(model.device, policy, backend)
    # The FP8 attention's state (cuDNN's graphs, about 1 s to build per shape) outlives a change of policy (a server
    # whose requests name policies of their own, COSMOS3_FP8_POLICY aside).
    attention = held.attention if held is not None else None
    if attention is None:
        attention = fp8_attention(policy, model.device, backend=backend, pack_gqa=pack_gqa)
    runtime.fp8_weights = None  # a previous policy's tensors go before the new ones are made
    layers = model.transformer.layers
    weights = FP8Weights(policy, [], [], attention=attention)
    for index, layer in enumerate(layers):
        qkv, gate_up, per_layer = _layer_weights(layer, fused.qkv[index], fused.gate_up[index],
                                                 policy.gemms_of_layer(index, len(layers)),
                                                 lambda w: quantize_weight(w, policy))
        weights.qkv.append(qkv)
        weights.gate_up.append(gate_up)
        weights.per_layer.append(per_layer)
    runtime.fp8_weights = weights
    return weights


def tower_weights(model, options, fused) -> FP8Weights | None:
    """The FP8 weights a request's gen tower reads: the model's own when it holds only FP8 weights,
    else built (or reused) when the request's options ask for FP8, else None (bf16). `fused()`: the model's
    fused bf16 projections (called only when they are needed)."""
    held = model.runtime.fp8_weights
    if held is not None and held.resident:
        return held
    if not options.fp8:
        return None
    policy = host_policy(model.info.family, model.device, options.fp8_policy, options.fp8_attention)
    return fp8_weights(model, fused(), policy, options.fp8_attention, options.fa3_pack_gqa)


def _result_weights(model, tower) -> FP8Weights | None:
    """The FP8 weights a request ran with: its tower's, or the FP8-only model's; None for bf16 (FP8 weights kept
    beside the bf16 ones for other requests do not count)."""
    if getattr(tower, "fp8", None) is not None:
        return tower.fp8
    held = model.runtime.fp8_weights
    return held if held is not None and held.resident else None


def result_policy(model, tower) -> FP8Policy | None:
    """The FP8 policy a request ran under, None for bf16."""
    weights = _result_weights(model, tower)
    return None if weights is None else weights.policy


def result_attention_kernel(model, tower) -> str | None:
    """The FP8 attention kernel a request's attention ran on ("fa3", "cudnn"), None where it stayed bf16. Why in the
    summary: the two kernels round differently, so the same seed and policy give slightly different frames."""
    weights = _result_weights(model, tower)
    cache = getattr(tower, "cache", None)
    if weights is None or weights.attention is None or cache is None:
        return None
    count = len(weights.qkv)
    if not any(weights.attends_in_fp8(index, count, cache.layout) for index in range(count)):
        return None
    return weights.attention.name


def precision_label(policy: FP8Policy | None) -> str:
    """The label a result carries for the policy it ran under (`result_policy`)."""
    return BF16_LABEL if policy is None else FP8_LABEL


# -- an FP8-only model, built layer by layer ---------------------------------------------------------


def _materialise(module, device, fill, prefix: str) -> None:
    """Allocate `module`'s parameters (its children's included) on `device` and fill them."""
    module.to_empty(device=device, recurse=True)
    with torch.no_grad():
        for name, param in module.named_parameters():
            fill(prefix + name, param)


def _build_layer(layer, index: int, count: int, policy: FP8Policy, device, fill, quantize) -> tuple:
    """Layer `index` in bf16 on `device`, its gen GEMMs quantised, its bf16 gen weights dropped: the
    modules' weights become views of the quantised fused tensors (torchao slices keep their scales)."""
    _materialise(layer, device, fill, f"layers.{index}.")
    attn, mlp = layer.self_attn, layer.mlp_moe_gen
    gemms = policy.gemms_of_layer(index, count)
    qkv_parts = [attn.add_q_proj, attn.add_k_proj, attn.add_v_proj]
    in_parts = [mlp.gate_proj, mlp.up_proj] if mlp.hidden_act == "silu" else []
    qkv = torch.cat([m.weight.data for m in qkv_parts])
    gate_up = torch.cat([m.weight.data for m in in_parts]) if in_parts else None
    qkv, gate_up, per_layer = _layer_weights(layer, qkv, gate_up, gemms, quantize)
    with torch.no_grad():
        for parts, fused in ((qkv_parts, qkv), (in_parts, gate_up)):
            start = 0
            for module in parts:
                rows = module.weight.shape[0]
                module.weight = torch.nn.Parameter(fused[start:start + rows], requires_grad=False)
                start += rows
        modules = {"to_add_out": attn.to_add_out, "down_proj": mlp.down_proj, "up_proj": mlp.up_proj}
        for name, weight in per_layer.items():
            modules[name].weight = torch.nn.Parameter(weight, requires_grad=False)
    return qkv, gate_up, per_layer


def use_expandable_segments() -> None:
    """From now on the CUDA caching allocator maps its segments page by page (PyTorch's expandable segments).
    Why, for a model whose text tower leaves the GPU between prefills (`engine.pipeline.memory.TextTower`): its
    weights were allocated among the gen tower's, so once they leave, the freed room lies in holes of segments that
    stay in use; a step's 8.4 GiB GEMM output then found no block and the H200 ran out of memory with 60.9 GiB
    reserved and unused (Super 720p). With expandable segments a free hole's pages go back to the driver
    (`empty_cache`) and new blocks map fresh ones. Called before such a model is built (`build_fp8_transformer`),
    so no other model's run changes."""
    torch.cuda.memory._set_allocator_settings("expandable_segments:True")


def build_fp8_transformer(config: dict, device, fill, policy: FP8Policy, *, quantize=None, backend: str = "",
                          pack_gqa: str = ""):
    """A Cosmos3 transformer whose gen tower holds only the policy's FP8 weights, never whole in bf16:
    built on the meta device, then the non-layer modules and one layer at a time allocated on `device`,
    filled by `fill(name, param)` (a checkpoint's tensors or random ones) and, layer by layer, quantised
    (`quantize(weight)`, default `quantize_weight` under `policy`). Peak memory: the model so far plus one
    layer in bf16. Returns (transformer, FP8Weights); the weights go on the loaded model's runtime
    (`engine.model.runtime.ModelRuntime.fp8_weights`). `backend`, `pack_gqa`: the FP8 attention's (`fp8_attention`)."""
    from accelerate import init_empty_weights
    from diffusers import Cosmos3OmniTransformer

    quantize = quantize or (lambda w: quantize_weight(w, policy))
    device = torch.device(device)
    if device.type == "cuda":  # its text tower may leave the GPU between prefills (engine.pipeline.memory)
        use_expandable_segments()
    with init_empty_weights(include_buffers=False):
        transformer = Cosmos3OmniTransformer.from_config(config)
    transformer.to(torch.bfloat16)
    transformer.time_embedder.float()  # diffusers keeps it in fp32 (`_keep_in_fp32_modules`)
    buffers = {name: buffer.clone() for name, buffer in transformer.named_buffers()}
    for name, module in transformer.named_children():
        if name != "layers":
            _materialise(module, device, fill, name + ".")
    weights = FP8Weights(policy, [], [], resident=True,
                         attention=fp8_attention(policy, device, backend=backend, pack_gqa=pack_gqa))
    count = len(transformer.layers)
    for index, layer in enumerate(transformer.layers):
        qkv, gate_up, per_layer = _build_layer(layer, index, count, policy, device, fill, quantize)
        weights.qkv.append(qkv)
        weights.gate_up.append(gate_up)
        weights.per_layer.append(per_layer)
    left = [name for name, param in transformer.named_parameters() if param.is_meta]
    if left:  # a parameter outside the children walked above: fail here, not at the first request
        raise RuntimeError(f"the FP8-only build left parameters unallocated: {left[:5]}")
    with torch.no_grad():
        for name, buffer in transformer.named_buffers():
            buffer.copy_(buffers[name].to(buffer.device))
    return transformer.eval(), weights


def random_fill(device, std: float = 0.02, seed: int = 0):
    """Random weights for benchmarks, drawn on `device`: norm weights near one, so no weight path can hide."""
    generator = torch.Generator(device=device).manual_seed(seed)

    def fill(name: str, param: torch.Tensor) -> None:
        values = torch.randn(param.shape, generator=generator, device=param.device, dtype=torch.float32)
        values = values.mul_(0.05 if "norm" in name and name.endswith("weight") else std)
        if "norm" in name and name.endswith("weight"):
            values.add_(1.0)
        param.copy_(values)

    return fill


def checkpoint_fill(folder):
    """Fill from a diffusers checkpoint folder's safetensors, one tensor at a time."""
    from pathlib import Path

    from safetensors import safe_open

    index = {}
    for file in sorted(Path(folder).glob("*.safetensors")):
        with safe_open(file, framework="pt") as handle:
            index.update({key: file for key in handle.keys()})

    def fill(name: str, param: torch.Tensor) -> None:
        if name not in index:
            raise KeyError(f"{str(folder)!r} has no tensor {name!r}")
        with safe_open(index[name], framework="pt", device=str(param.device)) as handle:
            param.copy_(handle.get_tensor(name).to(param.dtype))

    return fill
