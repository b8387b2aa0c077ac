"""The whole denoising step as one CUDA graph: tokens in, tower, velocity, CFG combine, sampler update.

`FastGenTower` alone captures the tower; around it each step still ran the gen-token embedding, the
velocity unpatchify, the CFG combine and diffusers' scheduler step eagerly, with a host read of the
timestep and Python-side scheduler state: about 9 ms a step on Edge T2I around an 11 ms tower.
Here every per-step input lives in a static device buffer (the sample, the timestep, the guidance
scale, the sampler's coefficient row and history from `engine.pipeline.scheduler_tables`), so the step is
the same kernel sequence every time and one capture per (shape, branch count) replays for every
step. Between replays the host only copies the step's coefficient row (device to device), checks
cancel, and reports progress once the previous step's event has fired, so at most one step is in
flight when a cancel arrives.

Graphs survive across requests of the same shape: the captured step reads the packed K/V buffers,
rotary tables and sampler buffers of its `WholeStep`, and a later request copies its own prefill and
tables into them (`WholeStep.adopt`). By default the K/V cache keeps its lengths on the device
(`lengths_on_device`, `transformer.KVCache`): its buffers have a capacity of rows for every prompt whose
longest branch fits a power-of-two bound (with room for captions up to `KEPT_PROMPT_TOKENS`), the
attention and QK kernels read every start, length and offset from device tensors, and `adopt` rewrites
those, so one capture per size serves any prompt up to that length. Without the lengths on the device
(`COSMOS3_LENGTHS_ON_DEVICE=0`, or where the kernels cannot read them there) a different text length
recaptures; docs/perf-log/2026-12-02.md has both costs. A model keeps up to `MAX_CACHED_STEPS` steps within
`KEPT_STEPS_MEMORY_SHARE` of the GPU's memory, least recently used out first, and gives them all back when a
request runs out of memory (`engine.pipeline.run.generate`); they live on the model's runtime
(`engine.model.runtime.ModelRuntime.kept_steps`).

Bit for bit: each op is the one the eager loop runs, in the same order, so the graph's result equals
the eager fast path's (tests/unit/pipeline/test_whole_step.py on the CPU, tests/gpu/test_gpu_whole_step.py on the H200).
Only vision-only requests (T2I, T2V, I2V, V2V) with a table-supported sampler take this path; sound
and action keep the eager loop.
"""
from __future__ import annotations

import itertools
import threading
import warnings
from dataclasses import dataclass
from typing import Callable

import torch

from cosmos3_kernels.dispatch import lengths_on_device_refused

from ..events import JobCancelled
from ..model.runtime import forget_kept_step_holders, hold_kept_steps, holding_kept_steps
from .fast_path import GRAPH_MAX_GEN_TOKENS, FastGenTower, FastPathOptions, capture_graph
from .pacing import StepPacer
from .scheduler_tables import SamplerState, sampler_for, sampler_supported
from .trace import RunTrace
from .transformer import time_embeds

# Steps kept per loaded model. Each holds its K/V buffers and its graphs' memory pool (Edge T2I 640x640:
# about 1 GiB; measured in docs/perf-log/2026-12-02.md). Why as many as 16: a warm-up captures one step per
# whitelisted image size (9 for Edge, 6 for Nano and Super), and a first request at any of them should
# find its step still kept; with 2 kept, the warm-up's last two sizes were all that survived.
MAX_CACHED_STEPS = 16
# ... and never more than this share of the GPU's memory, all loaded models' kept steps together (the least
# recently used go first), so that kept steps do not crowd out a video request's activations.
KEPT_STEPS_MEMORY_SHARE = 0.15
# Only image-scale steps are kept: up to this many gen tokens over all branches (every whitelisted image
# size with CFG). Why: there a capture (~0.2 s) is half a warm request; a graphed video step runs for
# seconds, where a capture is a few percent, and its K/V capacity costs 2-4 GiB a step (the T2V warm-up's
# kept steps held 19.3 GiB, docs/perf-log/2026-12-02.md).
KEPT_MAX_GEN_TOKENS = 2048
# Room for the text of a kept step's branches: real JSON captions run 1.5k-3k tokens, so with the lengths on
# the device every prompt up to this length shares one capacity, one key and one kept step per size.
KEPT_PROMPT_TOKENS = 3072


def lengths_on_device(state) -> bool:
    """Whether this request's K/V cache should carry its lengths on the device (`transformer.KVCache`):
    where its step will be a kept graph (as `applies` and `cacheable` say, decided before the tower exists)
    and every attention call can take the lengths from the device (the Triton kernel: CUDA, bf16 or fp16;
    not with the kernels forced to PyTorch). `state`: the request's RunState, before the prefill stage."""
    options, model, latents, schedulers = state.options, state.model, state.latents, state.schedulers
    branches = 2 if any(state.plan) else 1
    if not (options.enabled and options.lengths_on_device and options.cuda_graphs and model.parallel is None
            and _takes_whole_step(options, latents, schedulers) and latents.vision.is_cuda
            and keeps(state.layout.gen_len, branches)
            and sampler_supported(schedulers.vision)):  # else no step is kept, and capacity buys nothing
        return False
    attn = model.transformer.layers[0].self_attn
    return lengths_on_device_refused(latents.vision.device, attn.head_dim, model.dtype, options.kernels) is None


def keeps(gen_len: int, branches: int) -> bool:
    """Whether a step of this many gen tokens per branch is kept across requests (`KEPT_MAX_GEN_TOKENS`)."""
    return gen_len * branches <= min(KEPT_MAX_GEN_TOKENS, GRAPH_MAX_GEN_TOKENS)


def _takes_whole_step(options: FastPathOptions, latents, schedulers) -> bool:
    """The switches on and a vision-only request (sound and action keep the eager loop)."""
    return (options.whole_step and options.batched_cfg and latents.sound is None and latents.action is None
            and schedulers.sound is None and schedulers.action is None)


def applies(model, latents, tower, schedulers) -> bool:
    """Vision-only requests on the fast tower (batched CFG) with a table-supported sampler."""
    return isinstance(tower, FastGenTower) and _takes_whole_step(tower.options, latents, schedulers)


@dataclass
class StepKey:
    shape: tuple
    condition_frames: tuple
    lengths: tuple  # `KVCache.lengths_key`: the exact prefix lengths, or only the capacity when they live on the device
    kind: str
    anchored: bool
    options: FastPathOptions

    def __hash__(self):
        return hash((self.shape, self.condition_frames, self.lengths, self.kind, self.anchored, self.options))


class WholeStep:
    """Static buffers and graphs for one request shape; `run(count)` does one step in place."""

    def __init__(self, model, layout, tower: FastGenTower, sampler: SamplerState, sample: torch.Tensor,
                 vision_mask: torch.Tensor, clean: torch.Tensor | None, timestep: torch.Tensor):
        self.model, self.layout, self.tower, self.sampler = model, layout, tower, sampler
        self.sample = sample.clone()              # [1, 48, T, h, w] float32, updated in place
        self.vision_mask = vision_mask.clone()
        self.clean = None if clean is None else clean.clone()
        self.t = timestep.clone()                 # 0-d float32
        self.scale = torch.zeros((), device=sample.device, dtype=torch.float32)
        self.use_graphs = tower.use_graphs and sample.is_cuda
        self._graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self._pool = None
        self._pool_bytes = 0  # measured after each capture (the pool grows only while capturing)
        self.timesteps: torch.Tensor | None = None  # this request's, set by `prepare`
        self.key: StepKey | None = None             # its key among the model's kept steps, set by `prepare`
        self.last_use = -1                          # when it was last looked up (`_lookup`), for trimming

    @property
    def captured_counts(self) -> set[int]:
        """Branch counts whose step is captured as a graph."""
        return set(self._graphs)

    @property
    def bytes(self) -> int:
        """GPU memory this step keeps while it is kept: its K/V buffers and its graphs' memory pool."""
        return sum(b.numel() * b.element_size() for b in self.tower.cache.buffers) + self._pool_bytes

    # -- the step, op for op as the eager loop runs it ---------------------------------------

    def _tokens(self) -> torch.Tensor:
        tr = self.model.transformer
        dtype = tr.dtype
        vision, _ = tr._patchify_and_pack_latents([self.sample.to(dtype)])
        vision = tr.proj_in(vision)
        count = int(self.layout.vision_noisy_local.numel())
        # The timestep embedding once, broadcast (as the fast path's `_time_embeds(once=True)`).
        embeds = time_embeds(tr, self.t.reshape(1), dtype).expand(count, -1)
        return tr._apply_timestep_embeds_to_noisy_tokens(
            vision, embeds, [self.layout.noisy_frames], [self.layout.vision_shape])

    def _velocity(self, out: torch.Tensor) -> torch.Tensor:
        tr, layout = self.model.transformer, self.layout
        packed = tr.proj_out(out[layout.vision_noisy_local])
        vision = tr._unpatchify_and_unpack_latents(packed, [layout.vision_shape], [layout.noisy_frames],
                                                   [tuple(self.sample.shape[2:])])[0]
        if not layout.any_noisy_vision:  # decided at layout; a later request of this key has the same frames
            return torch.zeros_like(vision).float()
        return (vision * (1.0 - self.vision_mask).to(vision.dtype)).float()

    def _step(self, count: int) -> None:
        outs = self.tower.run(self._tokens(), 0, count)
        velocity = self._velocity(outs[0])
        if count == 2:
            uncond = self._velocity(outs[1])
            velocity = uncond + self.scale * (velocity - uncond)
        sampler = self.sampler
        sample = self.sample.float() if sampler.kind == "distilled" else self.sample
        stepped = sampler.step(velocity.unsqueeze(0), sample.unsqueeze(0)).squeeze(0)
        if sampler.kind == "distilled" and self.clean is not None:
            clean = torch.zeros_like(stepped)
            clean[:, :, : self.clean.shape[2]] = self.clean
            stepped = self.vision_mask * clean + (1.0 - self.vision_mask) * stepped
        self.sample.copy_(stepped)

    # -- capture and replay -----------------------------------------------------------------

    def _state(self) -> list[torch.Tensor]:
        s = self.sampler
        return [t for t in (self.sample, s.m_prev, s.m_prev2, s.last) if t is not None]

    def _capture(self, count: int) -> None:
        """Capture the step at `count` branches; if capture fails, say so once and stay eager."""
        try:
            self._record(count)
        except torch.OutOfMemoryError:
            raise  # not a capture problem: `generate` gives the kept steps back and runs the request again
        except RuntimeError as error:  # e.g. an op that syncs with the host: eager is still correct
            warnings.warn(f"whole-step CUDA graph capture failed ({error}); this shape runs eagerly", stacklevel=2)
            self.use_graphs = False

    def _record(self, count: int) -> None:
        saved = [t.clone() for t in self._state()]
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # eager warm-up (dispatch measures, kernels compile), then undone
            self._step(count)
        torch.cuda.current_stream().wait_stream(side)
        for tensor, value in zip(self._state(), saved):
            tensor.copy_(value)
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        self._graphs[count], _ = capture_graph(lambda: self._step(count), pool=self._pool)
        self._pool_bytes = pool_bytes(self._pool)

    def run(self, count: int) -> str:
        """One step: a replay, after capturing at the first step of each branch count. The capture's
        eager warm-up run (state restored after it) is where dispatch measures and kernels compile, so
        no step is spent eagerly on the user's time. Returns what ran: "eager", "replay" or "record" (a
        capture, then its replay), for the run's trace."""
        if not self.use_graphs:
            self._step(count)
            return "eager"
        if count in self._graphs:
            self._graphs[count].replay()
            return "replay"
        self._capture(count)
        return "record" if self.run(count) == "replay" else "eager"

    # -- a later request of the same shape ---------------------------------------------------

    def adopt(self, tower: FastGenTower, sampler: SamplerState, sample, vision_mask, clean) -> None:
        """Copy a new request's prefill, rotary tables, start sample and sampler into the static buffers
        (and, with the lengths on the device, its prompt lengths)."""
        for static, fresh in zip(self.tower.cache.buffers, tower.cache.buffers):
            static.copy_(fresh)
        if self.tower.cache.layout.lengths is not None:
            self.tower.cache.adopt_lengths(tower.cache)
        self.tower.cos.copy_(tower.cos)
        self.tower.sin.copy_(tower.sin)
        self.sample.copy_(sample)
        self.vision_mask.copy_(vision_mask)
        if clean is not None:
            self.clean.copy_(clean)
        static = self.sampler
        static.table = sampler.table
        static.noises = sampler.noises
        for buffer in (static.m_prev, static.m_prev2, static.last):
            if buffer is not None:
                buffer.zero_()


def pool_bytes(pool) -> int:
    """Bytes of the allocator's segments that belong to the graph memory pool `pool` (0 where unknown)."""
    try:
        segments = torch.cuda.memory_snapshot()
    except (RuntimeError, AssertionError):
        return 0
    return sum(s["total_size"] for s in segments if tuple(s.get("segment_pool_id", ())) == tuple(pool))


def cacheable(tower: FastGenTower) -> bool:
    """Keep the step across requests where it holds graphs (on the CPU nothing is worth keeping) and is
    image-scale (`keeps`)."""
    return tower.use_graphs and keeps(tower.cache.layout.gen_len, tower.cache.layout.num_branches)


# A use counter for least-recently-used order across models (the kept steps themselves live on each model's
# runtime, engine.model.runtime.ModelRuntime.kept_steps).
_USES = itertools.count()


def _lookup(model, key: StepKey, build: Callable[[], WholeStep]) -> tuple[WholeStep, bool]:
    runtime = model.runtime
    cache = runtime.kept_steps
    hold_kept_steps(runtime)
    reused = key in cache
    if reused:
        step = cache.pop(key)  # put back last: most recently used
    else:
        while len(cache) >= MAX_CACHED_STEPS:
            cache.pop(next(iter(cache)))
        step = build()
    cache[key] = step
    step.last_use = next(_USES)
    return step, reused


def _kept() -> list[tuple[dict, object, "WholeStep"]]:
    """(the holding runtime's kept steps, key, step) for every kept step of every model, least recently used first."""
    kept = [(runtime.kept_steps, key, step) for runtime in holding_kept_steps()
            for key, step in runtime.kept_steps.items()]
    return sorted(kept, key=lambda entry: entry[2].last_use)


def trim_kept_steps(budget: int) -> list:
    """Drop the least recently used kept steps, of any loaded model, until the rest fit `budget` bytes; the
    most recently used one always stays (it was just used). Returns the dropped keys."""
    kept = _kept()
    total = sum(step.bytes for _, _, step in kept)
    dropped = []
    for cache, key, step in kept[:-1]:
        if total <= budget:
            break
        del cache[key]
        total -= step.bytes
        dropped.append(key)
    return dropped


def kept_steps_budget(device: torch.device) -> int:
    """`KEPT_STEPS_MEMORY_SHARE` of the GPU's memory, in bytes."""
    return int(KEPT_STEPS_MEMORY_SHARE * torch.cuda.get_device_properties(device).total_memory)


def release_kept_steps() -> int:
    """Drop every kept step of every loaded model (their buffers and graph pools go back to the allocator once
    nothing else holds them); returns how many there were."""
    count = 0
    for runtime in holding_kept_steps():
        count += len(runtime.kept_steps)
        runtime.kept_steps.clear()
    forget_kept_step_holders()
    return count


def prepare(state) -> WholeStep | None:
    """The request's `WholeStep` (reused when one of the same shape exists), or None where it does not apply.
    `state`: the request's `engine.pipeline.state.RunState`, after the prefill stage."""
    model, request, latents, layout = state.model, state.request, state.latents, state.layout
    tower, schedulers, cond = state.tower, state.schedulers, state.cond
    if not applies(model, latents, tower, schedulers):
        return None
    sampler = sampler_for(schedulers.vision, latents.vision.unsqueeze(0), state.generator, model.runtime.unipc_tables)
    if sampler is None:
        return None
    anchored = sampler.kind == "distilled" and bool(cond.condition_frames) and cond.clean is not None
    clean = cond.clean if anchored else None
    key = StepKey(tuple(latents.vision.shape), tuple(cond.condition_frames), tower.cache.lengths_key, sampler.kind, anchored,
                  tower.options)
    timesteps = schedulers.vision.timesteps.to(device=latents.vision.device, dtype=torch.float32)

    def build() -> WholeStep:
        return WholeStep(model, layout, tower, sampler, latents.vision, latents.vision_mask, clean, timesteps[0])

    step, reused = _lookup(model, key, build) if cacheable(tower) else (build(), False)
    if reused:
        step.adopt(tower, sampler, latents.vision, latents.vision_mask, clean)
    step.timesteps = timesteps
    step.key = key
    state.trace.whole_step = "reused" if reused else "built"
    state.trace.passes.append("whole_step")
    step.scale.fill_(float(request["guidance_scale"]))
    return step


def denoise(step: WholeStep, plan: list[bool], report: Callable[[int, int], None],
            cancel: threading.Event | None, trace: RunTrace | None = None) -> torch.Tensor:
    """The loop over replays; returns the final sample. Progress is reported as steps complete; `trace` (the
    run's) counts the graphs recorded and replayed and the host's waits."""
    trace = trace if trace is not None else RunTrace()
    total = step.sampler.steps
    pacer = StepPacer.for_tensor(step.sample, report, total)  # one step queued ahead, and progress honest
    for i in range(total):
        if cancel is not None and cancel.is_set():
            raise JobCancelled()
        step.sampler.load_row(i)
        step.t.copy_(step.timesteps[i])
        ran = step.run(2 if plan[i] else 1)
        trace.graph_records += ran == "record"
        trace.graph_replays += ran in ("record", "replay")
        trace.tower_steps.append(2 if plan[i] else 1)
        pacer.launched(i)
    pacer.finish()
    trace.host_syncs += pacer.syncs
    if step.use_graphs and step.model.runtime.kept_steps.get(step.key) is step:
        trim_kept_steps(kept_steps_budget(step.sample.device))
    return step.sample.clone()
