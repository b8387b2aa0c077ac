"""`generate`: one validated request to saved files, as named stages over one run state.

    conditioning -> prompt -> noise -> layout -> schedule -> memory -> prefill -> tower -> denoise -> decode
    -> outputs

Each stage is a function in the module of its name (`engine.pipeline.conditioning`, `.prompts`,
`.layout`, `.denoise`, `.memory`, `.prefill`, `.tower`, `.decode`, `.outputs`) that takes the request's
`engine.pipeline.state.RunState`, reads what it needs and sets what it makes (each one's docstring says
which fields). What the run did is its public trace (`GenerationResult.trace`, `engine.pipeline.trace`).
The numerics follow diffusers' Cosmos3OmniPipeline (0.42.1) step for step, with four deliberate differences,
each tested both ways:
- the text tower runs once per request and branch (`engine.pipeline.transformer.prefill`), not every step;
- JSON captions get metadata injected instead of sentence templates (`engine.pipeline.prompts`);
- an optional guidance interval runs CFG only for timesteps inside it (T2I default [400, 1000]);
- an action request without `fps` takes its domain's typical rate (`engine.model.action`), not 24.
Plain T2V also skips the reference's VAE encode of an all-zero video, which only served for a shape,
and I2V / V2V encode only the frames that condition (the Wan VAE is causal in time, so those latent
frames are the same).
"""
from __future__ import annotations

import gc
from collections import Counter
import secrets
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from ..model.loader import LoadedModel
from ..events import JobCancelled, Progress
from . import whole_step
from .conditioning import conditioning_stage, noise_stage
from .decode import decode_stage
from .denoise import denoise_stage, schedule_stage
from .fast_path import FastPathOptions
from .fp8 import BF16_LABEL, precision_label, result_attention_kernel, result_policy
from .layout import layout_stage
from .memory import after_prefill, memory_stage
from .outputs import outputs_stage
from .prefill import prefill_stage
from .preview import previewer
from .prompts import prompt_stage, safety_check_prompt
from .request import Request, validate_request
from .state import RunState
from .tower import tower_stage
from .trace import RunTrace, kernel_choices


@dataclass
class GenerationResult:
    frames: np.ndarray  # [T, H, W, 3]: float32 in [0, 1] (exact path) or uint8 (fast path, engine.pipeline.decode)
    actions: np.ndarray | None
    audio: np.ndarray | None  # [channels, samples]
    audio_sample_rate: int | None
    seed: int
    prompt_text: str
    negative_prompt_text: str
    params: dict
    timings: dict
    outputs: dict[str, Path] = field(default_factory=dict)
    output_dir: Path | None = None
    request_id: str | None = None
    precision: str = BF16_LABEL  # or engine.pipeline.fp8.FP8_LABEL: shown wherever the result is
    # The FP8 policy's spelling (engine.pipeline.fp8.FP8Policy.name), None in bf16. Why in the summary: the same
    # seed gives slightly different frames under another policy, and the default's quantiser depends on the host.
    fp8_policy: str | None = None
    fp8_attention: str | None = None  # the FP8 attention kernel (result_attention_kernel), None where bf16
    trace: RunTrace = field(default_factory=RunTrace)  # what ran: tower, passes, whole step, host syncs, kernels

    def summary(self) -> dict:
        """JSON-ready description (the `/generate` result and the sidecar's core)."""
        return {
            "request_id": self.request_id,
            "seed": self.seed,
            "prompt_text": self.prompt_text,
            "negative_prompt_text": self.negative_prompt_text,
            "params": _public_params(self.params),
            "timings": self.timings,
            "precision": self.precision,
            "fp8_policy": self.fp8_policy,
            "fp8_attention": self.fp8_attention,
            "files": {k: Path(v).name for k, v in self.outputs.items()},
            "frames": list(self.frames.shape),
            "actions": self.actions.tolist() if self.actions is not None else None,
        }


def _public_params(params: dict) -> dict:
    out = dict(params)
    for key in ("image", "video"):
        if out.get(key) is not None and not isinstance(out[key], (str, Path)):
            out[key] = f"<{type(out[key]).__name__}>"
        elif out.get(key) is not None:
            out[key] = Path(out[key]).name
    return out


class _Clock:
    def __init__(self, on_progress):
        self.start = time.perf_counter()
        self.timings: dict[str, float] = {}
        self._mark = self.start
        self._on_progress = on_progress

    def lap(self, stage: str) -> None:
        now = time.perf_counter()
        self.timings[stage] = round(now - self._mark, 4)
        self._mark = now

    def report(self, stage: str, step: int, total: int) -> None:
        if self._on_progress is None:
            return
        elapsed = time.perf_counter() - self.start
        stage_elapsed = time.perf_counter() - self._mark
        eta = stage_elapsed / step * (total - step) if step else None
        self._on_progress(Progress(stage=stage, step=step, total=total, elapsed_s=elapsed, eta_s=eta))


def resolve_seed(seed: int) -> int:
    return secrets.randbelow(2**31) if seed == -1 else int(seed)


@torch.no_grad()
def generate(model: LoadedModel, request: Request | dict, on_progress: Callable[[Progress], None] | None = None,
             cancel: threading.Event | None = None, outputs_root: str | Path | None = None,
             model_name: str | None = None, previews: bool = False) -> GenerationResult:
    """Run one request. Saves files under `outputs_root` when given; a cancelled job writes nothing.
    With `previews`, `on_progress` also gets `Preview` events while denoising.

    `request` is a `Request` from `validate_request` (the queue's, run as it is). A plain dict, for
    scripts, is validated here, exactly once; nothing below validates or parses it again.
    `model` may also be a GPU group (`engine.parallel.runtime.GroupModel`), which runs it on its ranks."""
    if getattr(model, "is_group", False):
        return model.generate(request, on_progress=on_progress, cancel=cancel, outputs_root=outputs_root,
                              model_name=model_name)
    if not isinstance(request, Request):
        request = validate_request(model.info, request.get("mode", "t2i"), request)
    safety_check_prompt(model, request["prompt"])
    seed = resolve_seed(request["seed"])  # once: a retry draws the same noise
    try:
        return _generate(model, request, seed, on_progress, cancel, outputs_root, model_name, previews)
    except torch.OutOfMemoryError:
        # Kept step graphs are a cache (engine.pipeline.whole_step): where some (of any loaded model) held
        # memory, give it back and run the request once more, from the start, with the same seed.
        if not whole_step.release_kept_steps():
            raise
    # Retried outside the handler: inside it the traceback still holds the failed attempt's tensors.
    gc.collect()
    torch.cuda.empty_cache()
    if on_progress is not None:  # so a progress bar going back to step 0 says why
        on_progress(Progress(stage="retry", step=0, total=0, elapsed_s=0.0, eta_s=None))
    return _generate(model, request, seed, on_progress, cancel, outputs_root, model_name, previews)


def _generate(model: LoadedModel, request: Request, seed: int, on_progress, cancel, outputs_root, model_name,
              previews: bool) -> GenerationResult:
    """The stages, top to bottom (see `generate`)."""
    clock = _Clock(on_progress)
    state = RunState(model, request, seed, torch.Generator(device="cpu").manual_seed(seed),
                     FastPathOptions.for_model(model), cancel, lambda step, total: clock.report("denoise", step, total))

    conditioning_stage(state)
    clock.lap("conditioning")
    prompt_stage(state)
    clock.lap("prompt")
    noise_stage(state)
    layout_stage(state)
    schedule_stage(state)
    memory_stage(state)  # a request that cannot fit this GPU is refused here, before any of its GPU work
    prefill_stage(state)
    tower_stage(state)
    after_prefill(state)
    clock.lap("prefill")  # the tower stage's time too: the timings keep the keys estimates and benchmarks read
    state.preview = previewer(model, len(state.plan), on_progress, previews)
    denoise_stage(state)
    clock.lap("denoise")
    _stop_if_cancelled(state)
    decode_stage(state)
    clock.lap("decode")

    result = _result(state, clock.timings)
    if outputs_root is not None:
        _stop_if_cancelled(state)
        outputs_stage(result, outputs_root, model_name=model_name or model.root.name,
                      model_summary=model.info.summary(), fps=request["fps"])
        clock.lap("save")
        result.timings = clock.timings
    result.timings["total"] = round(time.perf_counter() - clock.start, 4)
    return result


def _stop_if_cancelled(state: RunState) -> None:
    if state.cancelled:
        raise JobCancelled()


def _result(state: RunState, timings: dict) -> GenerationResult:
    model, request, cond = state.model, state.request, state.cond
    audio = state.audio
    policy = result_policy(model, state.tower)
    state.trace.kernels = kernel_choices(state.tower)
    state.trace.ops = Counter(state.tower.ops)
    return GenerationResult(
        frames=state.frames, actions=state.actions, audio=audio,
        audio_sample_rate=model.sound_tokenizer.config.sampling_rate if audio is not None else None,
        seed=state.seed, prompt_text=state.texts.prompt_text, negative_prompt_text=state.texts.negative_prompt_text,
        params=dict(request, width=cond.width, height=cond.height, seed=state.seed), timings=timings,
        precision=precision_label(policy), fp8_policy=None if policy is None else policy.name,
        fp8_attention=result_attention_kernel(model, state.tower), trace=state.trace,
    )
