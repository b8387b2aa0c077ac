"""The gen tower's fast path: passes applied on top of the exact engine, each one switchable.

- **batched CFG**: both branches go through every projection and MLP as one batch (twice the rows
  per GEMM), and attention takes each branch's own prefix length from the packed cache (varlen), so
  branches of different text lengths are never zero-padded into each other's softmax;
- **kernels**: fused QK-norm + RoPE + K/V pack, prefix attention, residual-add + RMSNorm and the MLP
  activations, each through `cosmos3_kernels.dispatch`, which picks the Triton kernel or the PyTorch path per
  shape by measuring on the GPU in hand;
- **video QK-norm in fp32**: for a video (more than one latent frame) the fused QK-norm + RoPE keeps the
  norm and the rotary in fp32 and rounds once, instead of reproducing every bf16 rounding of diffusers'
  ops (`rounds_qk_norm`): closer to an fp32 forward, and the kernel 1.9x faster at 720p. An image keeps
  the roundings;
- **video MLP activation in the GEMM's epilogue** (`cosmos3_kernels.gemm`): for a video, the SwiGLU (Nano) or ReLU^2
  (Edge) runs on the MLP input GEMM's fp32 accumulator in QuACK's Hopper GEMM and rounds once, where dispatch
  measures that faster than the GEMM then the activation's pass and no further from fp32 (`fuses_mlp_activation`);
- **video residual add in the GEMM**: for a video, the attention-out and down projections add their product to the
  residual stream in cuBLAS's epilogue (`hidden.addmm_`, fp32, one rounding), and the RMS norm then reads the stream
  alone: one pass over the hidden rows fewer per norm (`fuses_residual_add`);
- **fused projections**: one GEMM for q|k|v and one for gate|up per layer; the original Linear
  weights become views of the fused tensors, so no weight is stored twice;
- **VAE channels-last-3d**: the decoder's 3-D convolutions in cuDNN's channels-last layout;
- **uint8 frames** (`engine.pipeline.decode`): the decode's postprocess and 8-bit rounding on the GPU, one uint8
  copy to the host instead of float32 frames;
- **VAE fast decode** (`engine.pipeline.causal_decode`): a video's decoder walked by the engine, the norm + SiLU
  before each conv fused into one kernel writing the conv's padded input (the plan a measured rule picks);
- **CUDA graphs**: the tower's step is captured once per request shape and replayed every step, where
  the step is short enough for launch overhead to matter;
- **whole step** (`engine.pipeline.whole_step`): the gen tokens, tower, velocity, CFG combine and the sampler
  update (`engine.pipeline.scheduler_tables`) run from static device buffers, captured as one graph where CUDA
  graphs apply, and kept across requests of the same shape;
- **first-layer gen attention shared** (`cosmos3_kernels.shared_gen_attention`): every branch feeds the tower the same gen
  tokens, so the first layer's gen-to-gen attention block is the same in every branch; it is computed once and
  joined with each branch's prefix block by their log-sum-exps. From `SHARE_MIN_GEN_TOKENS` gen tokens a branch,
  where dispatch measures it faster (flash-attn-4), and only where the branches' gen positions are shifted alike
  (`gen_positions_shift_alike`); at Nano 720p it halves one of 36 layers' attention;
- **lengths on the device** (with the whole step): the K/V buffers get a capacity of rows and the attention
  reads each branch's start and length from device tensors, so a kept step graph serves any prompt length
  that fits, instead of a capture per new length; attention then runs our Triton kernel or flash-attn-4,
  never SDPA, which slices by host integers.

Off the GPU the engine runs the exact eager tower (`engine.pipeline.tower.EagerGenTower`). Switches
(`engine.config.FastPathConfig`, read once by `engine.config.build_config`; docs/CONFIGURATION.md):
`COSMOS3_FAST=0` (everything off), `COSMOS3_BATCHED_CFG=0`, `COSMOS3_CUDA_GRAPHS=0`,
`COSMOS3_KERNELS=auto|triton|torch`, `COSMOS3_VIDEO_QK_FP32=0`, `COSMOS3_FUSED_PROJECTIONS=0`,
`COSMOS3_VAE_CHANNELS_LAST=0`, `COSMOS3_WHOLE_STEP=0`, `COSMOS3_UINT8_FRAMES=0`, `COSMOS3_VAE_FAST_DECODE=0`,
`COSMOS3_VAE_SUBPIXEL=0`, `COSMOS3_VAE_NORM_FP32=0`, `COSMOS3_LENGTHS_ON_DEVICE=0`,
`COSMOS3_SHARE_FIRST_ATTENTION=0`, `COSMOS3_MLP_EPILOGUE=0`, `COSMOS3_RESIDUAL_EPILOGUE=0` (and `COSMOS3_QUACK=0`,
QuACK left out wherever dispatch would offer it), and the one pass that is off by default and
approximate, `COSMOS3_FP8=1` (`engine.pipeline.fp8`: FP8 GEMMs, and FP8 attention where its policy names "attn");
`bench/bench_engine.py` ablates them.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, fields
from typing import Callable, TypeVar

import torch

from cosmos3_kernels import registry
from cosmos3_kernels.dispatch import KernelDispatcher
from cosmos3_kernels.graphs import capture
from cosmos3_kernels.packed_kv import PackedKVLayout
from cosmos3_kernels.persist import load_triton_key, open_store

from ..config import Config, apply_process_environment, config_of
from .fp8 import tower_weights
from .transformer import KVCache

T = TypeVar("T")

# A capture first returns the allocator's cached blocks to the driver only when less than this share of the
# GPU's memory is free (see `capture_graph`).
CAPTURE_EMPTY_CACHE_BELOW = 0.2

# Why a bound: a graph pays where launches dominate (T2I: ~1k gen tokens, ~15 launches per layer and
# branch). For long videos a step is seconds of attention and a graph only adds a second memory pool.
GRAPH_MAX_GEN_TOKENS = 16384

# The first layer's gen block is shared by the branches from this many gen tokens a branch (videos). Why a bound:
# below it a step is an image's, launch-bound and captured, where the gen block is a small share of the keys
# (Nano T2I: 1024 gen tokens beside a 1.6k-token caption) and the measurement would cost the first request.
SHARE_MIN_GEN_TOKENS = 8192
# How far (in positions) a branch's gen positions may stray from branch 0's plus one shift per axis: float
# positions (fps modulation) round differently at different offsets, by ~1e-4 at the lengths of real captions.
POSITION_SHIFT_TOLERANCE = 1e-3


@dataclass(frozen=True)
class FastPathOptions:
    enabled: bool
    batched_cfg: bool = True
    cuda_graphs: bool = True
    kernels: str = "auto"
    fused_projections: bool = True
    video_qk_fp32: bool = True  # a video's QK-norm + RoPE rounds once (`rounds_qk_norm`)
    vae_channels_last: bool = True
    whole_step: bool = True
    uint8_frames: bool = True
    vae_fast_decode: bool = True  # a step of the uint8 decode: uint8_frames off (COSMOS3_UINT8_FRAMES=0) turns it off too
    vae_subpixel: bool = True  # the fast decode's upsamplers as sub-pixel phase convs (causal_decode.subpixel_weight)
    vae_norm_fp32: bool = True  # the fast decode's norm + SiLU in fp32, rounded once (causal_decode.DecodePlan)
    lengths_on_device: bool = True  # whole-step graphs kept for any prompt length (engine.pipeline.whole_step)
    share_first_attention: bool = True  # the first layer's gen block once for all branches (cosmos3_kernels.shared_gen_attention)
    mlp_epilogue: bool = True  # a video's MLP activation in its input GEMM's epilogue (`fuses_mlp_activation`)
    residual_epilogue: bool = True  # a video's residual add in its output GEMMs' epilogue (`fuses_residual_add`)
    fp8: bool = False  # approximate: off unless asked for (engine.pipeline.fp8)
    fp8_policy: str = ""  # which GEMMs and how (engine.pipeline.fp8.FP8Policy); "": the family's default
    fp8_attention: str = ""  # the FP8 attention kernel (engine.pipeline.fp8.FP8_ATTENTION_BACKENDS); "": the fastest
    fa3_pack_gqa: str = ""  # FA3's GQA packing (engine.pipeline.fp8.fa3_pack_gqa); "": the measured default

    @classmethod
    def from_config(cls, config: Config, device: torch.device) -> "FastPathOptions":
        """The switches `config` (`engine.config.build_config`) asks for, on `device` (off the GPU: off). Every pass
        of `engine.config.FastPathConfig` but its master switch (`fast`, here `enabled`) has a field of its name."""
        fast, fp8 = config.fast_path, config.fp8
        on_gpu = device.type == "cuda"
        passes = {f.name: getattr(fast, f.name) for f in fields(fast) if f.name != "fast"}
        return cls(**{**passes, "cuda_graphs": on_gpu and fast.cuda_graphs}, enabled=on_gpu and fast.fast,
                   kernels=config.kernels.mode, fp8=fp8.enabled, fp8_policy=fp8.policy, fp8_attention=fp8.attention,
                   fa3_pack_gqa=fp8.fa3_pack_gqa)

    @classmethod
    def for_model(cls, model) -> "FastPathOptions":
        return model.fast_path if model.fast_path is not None else cls.from_config(config_of(model), model.device)


def rounds_qk_norm(options: FastPathOptions, latent_frames: int | None) -> bool:
    """Whether the fused QK-norm + RoPE reproduces each bf16 rounding of diffusers' split ops (bit for bit)
    or keeps the norm and rotary in fp32 and rounds once at the store.

    Why per frame count: the roundings (integer round-to-nearest-even and PyTorch's summation order)
    nearly double the kernel's time at video sizes: 46.9 against 25.0 ms of a Nano 720p step on the H200
    (docs/perf-log/2026-12-02.md, "Where a Nano T2V 720p step goes"). At image sizes the kernel is launch-bound
    either way (~50 us), so an image keeps them and a seed's image stays what it was. The single rounding
    is the more accurate of the two (fp32 throughout, as SGLang runs T > 1); a video's fast step is held
    to a tolerance against diffusers, not to its bytes (its CFG is batched and its attention
    flash-attn-4's where installed). `latent_frames=None` (not known): rounded.
    """
    return not options.video_qk_fp32 or latent_frames is None or latent_frames <= 1


def fuses_mlp_activation(options: FastPathOptions, latent_frames: int | None) -> bool:
    """Whether the tower may run the MLP's activation on its input GEMM's fp32 accumulator and round once
    (`cosmos3_kernels.gemm.mlp_in_quack`), where dispatch measures that faster and no less accurate than the split path.

    Why: the split path writes the GEMM's output and reads it back for the activation, a memory-bound pass of
    ~58 ms a Nano 720p step (docs/perf-log/2026-12-02.md, "The MLP's activation in its GEMM"). Why videos only: as with
    the QK-norm (`rounds_qk_norm`), an image keeps diffusers' roundings and a seed's image stays what it was; a
    video's fast step is held to a tolerance against diffusers, and one rounding is the closer to fp32.
    `COSMOS3_MLP_EPILOGUE=0` turns it off. `latent_frames=None` (not known): off."""
    return options.mlp_epilogue and latent_frames is not None and latent_frames > 1


def fuses_residual_add(options: FastPathOptions, latent_frames: int | None) -> bool:
    """Whether the tower may add the attention-out and down projections to the residual stream in the GEMM's
    epilogue (`torch.Tensor.addmm_`: the fp32 product plus the stream, rounded once), and then RMS-norm the stream
    alone.

    Why: diffusers rounds the projection to bf16 and then the sum, so the fused add + RMS norm kernel reads the
    projection and the stream and writes the sum and the normed rows. With the add in cuBLAS's epilogue the GEMM
    reads the stream and writes the sum in place, and the norm reads the sum: one pass over the hidden rows fewer
    per norm, two a layer. Why videos only: as with `fuses_mlp_activation`, an image keeps diffusers' roundings.
    `COSMOS3_RESIDUAL_EPILOGUE=0` turns it off. `latent_frames=None` (not known): off."""
    return options.residual_epilogue and latent_frames is not None and latent_frames > 1


def gen_positions_shift_alike(branches) -> bool:
    """Whether each branch's gen positions are branch 0's plus one shift per M-RoPE axis (within
    `POSITION_SHIFT_TOLERANCE`), so that every gen-to-gen rotary score is the same in all branches: what sharing
    the first layer's gen block rests on. Branches without positions (a GPU group's) do not share. One host read."""
    if len(branches) < 2 or any(getattr(b, "position_ids", None) is None for b in branches):
        return False
    gens = [b.position_ids[:, len(b.token_ids):].double() for b in branches]
    for gen in gens[1:]:
        if gen.shape != gens[0].shape:
            return False
        shift = gen - gens[0]
        if not bool(((shift - shift[:, :1]).abs() <= POSITION_SHIFT_TOLERANCE).all()):
            return False
    return True


def capture_graph(run: Callable[[], T], pool=None) -> tuple[torch.cuda.CUDAGraph, T]:
    """Capture `run()` as a CUDA graph on a side stream; returns (graph, what `run` returned).

    `cosmos3_kernels.graphs.capture`, which leaves the allocator's cache alone (each recapture, one per new prompt
    length and branch count, used to free every cached block, and the next request paid cudaMalloc for all
    of it again), after freeing it here only when the GPU is short of memory, where the graph's private pool
    could otherwise fail to grow. The kernels captured are the same, so the replay's bits are too.
    """
    free, total = torch.cuda.mem_get_info()
    if free < CAPTURE_EMPTY_CACHE_BELOW * total:
        torch.cuda.empty_cache()
    return capture(run, pool=pool)


@dataclass
class FusedProjections:
    """Per gen layer: one [q|k|v] weight and, for SwiGLU, one [gate|up] weight."""

    qkv: list[torch.Tensor]
    gate_up: list[torch.Tensor | None]


def _fuse(linears) -> torch.Tensor:
    """Concatenate Linear weights along the output dim and make each Linear's weight a view of it.

    Why views: the fused GEMM reads one weight instead of three (fewer launches, wider tiles), and the
    model keeps one copy of its weights, so the exact path and diffusers see the same values.
    """
    fused = torch.cat([linear.weight.data for linear in linears], dim=0)
    start = 0
    for linear in linears:
        rows = linear.weight.shape[0]
        linear.weight.data = fused[start:start + rows]
        start += rows
    return fused


def fused_projections(model) -> FusedProjections:
    """Fuse the gen tower's projections once per loaded model (biases are absent in Cosmos3); kept on its runtime."""
    runtime = model.runtime
    if runtime.fused is None:
        qkv, gate_up = [], []
        for layer in model.transformer.layers:
            attn, mlp = layer.self_attn, layer.mlp_moe_gen
            if any(l.bias is not None for l in (attn.add_q_proj, attn.add_k_proj, attn.add_v_proj)):
                raise ValueError("fused projections expect bias-free gen projections")
            qkv.append(_fuse([attn.add_q_proj, attn.add_k_proj, attn.add_v_proj]))
            gate_up.append(_fuse([mlp.gate_proj, mlp.up_proj]) if mlp.hidden_act == "silu" else None)
        runtime.fused = FusedProjections(qkv, gate_up)
    return runtime.fused


def vae_channels_last(model, options: FastPathOptions) -> bool:
    """Put the VAE's 3-D conv weights in channels-last-3d once, where the fast path allows it.

    Why: measured on the H200 (docs/perf-log/2026-12-02.md, VAE decode), cuDNN's channels-last kernels decode
    832x480x121 in 2.44 s instead of 2.67 s (1.09x), within 2.5e-2 of the plain decode on its [-1, 1]
    output; an image decode gains nothing either way.
    """
    if not (options.enabled and options.vae_channels_last):
        return False
    if not model.runtime.vae_channels_last:
        for param in model.vae.parameters():
            if param.dim() == 5:
                param.data = param.data.contiguous(memory_format=torch.channels_last_3d)
        model.runtime.vae_channels_last = True
    return True


def dispatcher_for(model, mode: str) -> KernelDispatcher:
    """One dispatcher per loaded model and mode, so measured choices persist across requests."""
    cached = model.runtime.dispatchers.get(mode)
    if cached is None:
        # Measured choices are kept on disk for the next process (cosmos3_kernels.persist), where the cache is on.
        store, config = None, config_of(model)
        if mode == "auto" and model.device is not None and torch.device(model.device).type == "cuda":
            apply_process_environment(config)  # a model built without `engine.load_model` (benchmarks)
            store = open_store(config.kernel_cache_dir(), model.device)
        cached = model.runtime.dispatchers[mode] = KernelDispatcher(
            mode, timing=config.kernels.dispatch_timing, interpret=config.host.triton_interpret, store=store)
    return cached


def load_kernels(model) -> dict[str, str | None]:
    """At load, on a CUDA device with the fast path on: the model's dispatcher (with the decisions the kernel cache
    kept) and every kernel library dispatch may choose, imported (`cosmos3_kernels.registry.load_libraries`).
    Measured on the H200 with the GPU extras: flash-attn-4's and QuACK's imports were most of a restarted
    process's first request (Nano T2I 1024: 6.0 s against 1.6 s warm; docs/perf-log/2026-12-04-super-and-restart.md).
    Triton's own per-process cache key is computed here too (`cosmos3_kernels.persist.load_triton_key`).
    The libraries only where dispatch is in "auto": a forced mode runs our own kernels, never a library's.
    Returns "op/backend" (and "triton/cache key") -> None where it loaded, else why not (empty where nothing was
    prepared)."""
    options = FastPathOptions.for_model(model)
    if not options.enabled or model.device is None or torch.device(model.device).type != "cuda":
        return {}
    dispatcher_for(model, options.kernels)
    said = {"triton/cache key": load_triton_key()}
    if options.kernels == "auto":
        said.update(registry.load_libraries())
    return said


class FastGenTower:
    """Gen tower over the packed cache with batched CFG, dispatched kernels and optional CUDA graphs
    (`engine.pipeline.state.GenTower`). `passes` names the passes it applies and `ops` counts the optional ops its
    eager runs took, for the run's trace (`engine.pipeline.trace.RunTrace`)."""

    kind = "fast"

    def __init__(self, model, cache: KVCache, branches, options: FastPathOptions, *, round_qk_norm: bool,
                 fuse_mlp_activation: bool = False, fuse_residual_add: bool = False):
        tr = model.transformer
        self.transformer = tr
        self.cache = cache
        self.options = options
        self.dispatch = dispatcher_for(model, options.kernels)
        self.flavour = "nemotron" if tr.config.hidden_act == "relu2" else "diffusers"
        self.round_qk_norm = round_qk_norm  # `rounds_qk_norm`: diffusers' roundings, or fp32 and one rounding
        self.fuse_mlp_activation = fuse_mlp_activation  # `fuses_mlp_activation`: the MLP's may round once
        self.fuse_residual_add = fuse_residual_add  # `fuses_residual_add`: the output GEMMs add to the stream
        # Per-branch rotary tables [B, N, D]: positions differ between branches by their text lengths.
        self.cos = torch.stack([b.rotary.cos.squeeze(1) for b in branches])
        self.sin = torch.stack([b.rotary.sin.squeeze(1) for b in branches])
        # FP8 GEMMs (engine.pipeline.fp8) read their own fused, quantised weights; a model built FP8-only
        # has no others.
        self.fp8 = tower_weights(model, options, lambda: fused_projections(model))
        if self.fp8 is not None:
            self.fused = self.fp8
        else:
            self.fused = fused_projections(model) if options.fused_projections else None
        # Every branch gets the same gen tokens (`run`), so the first layer's gen block is shared where the
        # positions allow it (checked only where the pass could apply: the check reads the device once).
        self.shares_gen_block = (options.share_first_attention and cache.layout.gen_len >= SHARE_MIN_GEN_TOKENS
                                 and gen_positions_shift_alike(branches))
        device = model.device if model.device is not None else tr.device  # (tr.device is slow: see prefill_cache)
        self.use_graphs = (options.cuda_graphs and device.type == "cuda"
                           and cache.layout.gen_len * len(branches) <= GRAPH_MAX_GEN_TOKENS)
        self._graphs: dict[tuple[int, int], tuple] = {}
        self.passes = self._passes(cache)
        self.ops: Counter = Counter()

    def _passes(self, cache: KVCache) -> tuple[str, ...]:
        applied = {"batched_cfg": self.options.batched_cfg,
                   "fused_projections": self.fused is not None and self.fp8 is None, "fp8": self.fp8 is not None, "video_qk_fp32": not self.round_qk_norm,
                   "mlp_epilogue": self.fuse_mlp_activation, "residual_epilogue": self.fuse_residual_add,
                   "share_first_attention": self.shares_gen_block, "cuda_graphs": self.use_graphs,
                   "lengths_on_device": cache.layout.lengths is not None}
        return tuple(name for name, on in applied.items() if on)

    # -- the tower, eager ----------------------------------------------------------------------

    def _layouts(self, count: int) -> list[tuple[int, int]]:
        """(first branch, branch count) groups one step runs: one batch, or one branch at a time."""
        if self.options.batched_cfg or count == 1:
            return [(0, count)]
        return [(b, 1) for b in range(count)]

    def _slice(self, first: int, count: int) -> tuple[PackedKVLayout, list[torch.Tensor]]:
        layout = self.cache.layout
        if first == 0:
            return self.cache.leading(count)
        start = layout.branch_start(first)
        sub = PackedKVLayout(layout.prefix_lens[first:first + count], layout.gen_len)
        return sub, [buffer[:, start:start + sub.total_rows] for buffer in self.cache.buffers]

    @torch.no_grad()
    def run(self, tokens: torch.Tensor, first: int, count: int) -> torch.Tensor:
        """Final-normed gen output [count, N, hidden] for branches first..first+count-1."""
        tr, d, flavour = self.transformer, self.dispatch, self.flavour
        layout, buffers = self._slice(first, count)
        n, width = tokens.shape
        cos, sin = self.cos[first:first + count], self.sin[first:first + count]
        layers = tr.layers
        x = tokens.unsqueeze(0).expand(count, n, width).reshape(count * n, width)
        if self.fuse_residual_add and x.data_ptr() == tokens.data_ptr():
            x = x.clone()  # the stream is added to in place: never into the caller's tokens
        norm = layers[0].input_layernorm_moe_gen
        normed, hidden = d.add_rms_norm(x, None, norm.weight, eps=norm.eps, flavour=flavour)
        for index, layer in enumerate(layers):
            attn = layer.self_attn
            heads, kv_heads, head_dim = attn.num_attention_heads, attn.num_key_value_heads, attn.head_dim
            if self.fused is not None:
                qkv = torch.nn.functional.linear(normed, self.fused.qkv[index])
                q_width, kv_width = heads * head_dim, kv_heads * head_dim
                q = qkv[:, :q_width].view(count, n, heads, head_dim)
                k = qkv[:, q_width:q_width + kv_width].view(count, n, kv_heads, head_dim)
                v = qkv[:, q_width + kv_width:].view(count, n, kv_heads, head_dim)
            else:
                q = attn.add_q_proj(normed).view(count, n, heads, head_dim)
                k = attn.add_k_proj(normed).view(count, n, kv_heads, head_dim)
                v = attn.add_v_proj(normed).view(count, n, kv_heads, head_dim)
            q = d.qk_norm_rope_pack(
                q, k, v, attn.norm_added_q.weight, attn.norm_added_k.weight, cos, sin, buffers[index], layout,
                eps=attn.norm_added_q.eps, flavour=flavour, round_norm_before_rope=self.round_qk_norm,
            )
            if self.fp8 is not None and self.fp8.attends_in_fp8(index, len(layers), layout):
                out = self.fp8.attention(q, buffers[index], layout)
                self.ops["fp8_attention"] += 1
            elif index == 0 and self._shares_first_attention(layout, count):
                out = d.shared_gen_attention(q, buffers[index], layout)
                self.ops["shared_gen_attention"] += 1
            else:
                out = d.prefix_attention(q, buffers[index], layout)
            post = layer.post_attention_layernorm_moe_gen
            normed, hidden = self._project_add_norm(index, "to_add_out", attn.to_add_out,
                                                    out.reshape(count * n, heads * head_dim), hidden, post)
            mlp = layer.mlp_moe_gen
            if mlp.hidden_act == "silu" and self.fused is not None:
                act = d.mlp_in(normed, self.fused.gate_up[index], "swiglu", one_rounding=self.fuse_mlp_activation)
            elif mlp.hidden_act == "silu":
                act = d.swiglu(mlp.gate_proj(normed), mlp.up_proj(normed))
            elif self.fp8 is None and mlp.up_proj.bias is None:
                act = d.mlp_in(normed, mlp.up_proj.weight, "relu_sq", one_rounding=self.fuse_mlp_activation)
            else:
                act = d.relu2(self._linear(index, "up_proj", mlp.up_proj, normed))
            following = layers[index + 1].input_layernorm_moe_gen if index + 1 < len(layers) else tr.norm_moe_gen
            normed, hidden = self._project_add_norm(index, "down_proj", mlp.down_proj, act, hidden, following)
        return normed.view(count, n, width)

    def _project_add_norm(self, index: int, name: str, module, x: torch.Tensor, hidden: torch.Tensor,
                          norm) -> tuple[torch.Tensor, torch.Tensor]:
        """hidden + module(x), then `norm` of it: (normed, the new stream). With `fuse_residual_add` (and a bf16
        weight without a bias) the GEMM adds its fp32 product to the stream in place and rounds once."""
        d = self.dispatch
        if self.fuse_residual_add and self.fp8 is None and module.bias is None:
            hidden = self._add_product(hidden, x, module.weight)
            self.ops["residual_add_in_gemm"] += 1
            return d.add_rms_norm(hidden, None, norm.weight, eps=norm.eps, flavour=self.flavour)
        out = self._linear(index, name, module, x)
        return d.add_rms_norm(out, hidden, norm.weight, eps=norm.eps, flavour=self.flavour)

    @staticmethod
    def _add_product(hidden: torch.Tensor, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """hidden += x @ weight^T, in cuBLAS's epilogue (beta = 1): the stream is read and written by the GEMM."""
        return hidden.addmm_(x, weight.t())

    def _shares_first_attention(self, layout: PackedKVLayout, count: int) -> bool:
        """Whether this run's first layer may share its gen block (dispatch still measures whether it pays): a
        tower that may (`shares_gen_block`: a video's gen length, positions shifted alike), two or more branches,
        host lengths."""
        return self.shares_gen_block and count >= 2 and layout.lengths is None

    def _linear(self, index: int, name: str, module, x: torch.Tensor) -> torch.Tensor:
        """Layer `index`'s GEMM, or its FP8 twin when the FP8 pass is on (the module keeps its bf16 weight)."""
        if self.fp8 is not None:
            return torch.nn.functional.linear(x, self.fp8.per_layer[index][name])
        return module(x)

    # -- CUDA graphs ---------------------------------------------------------------------------

    def _graphed(self, tokens: torch.Tensor, first: int, count: int) -> torch.Tensor:
        key = (first, count)
        if key not in self._graphs:
            # The eager run measures every dispatch choice and compiles every kernel; a capture can do neither.
            eager = self.run(tokens, first, count)
            static_in = tokens.clone()
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                self.run(static_in, first, count)
            torch.cuda.current_stream().wait_stream(side)
            # Each graph keeps its own memory pool: with CFG run branch by branch, one graph's output must
            # survive the other's replay.
            graph, static_out = capture_graph(lambda: self.run(static_in, first, count))
            self._graphs[key] = (graph, static_in, static_out)
            return eager
        graph, static_in, static_out = self._graphs[key]
        static_in.copy_(tokens)
        graph.replay()
        return static_out

    def __call__(self, tokens: torch.Tensor, count: int) -> list[torch.Tensor]:
        outs: list[torch.Tensor] = []
        for first, group in self._layouts(count):
            result = self._graphed(tokens, first, group) if self.use_graphs else self.run(tokens, first, group)
            outs.extend(result.unbind(0))
        return outs
