"""Warm a loaded model at every whitelisted size of its family's slow-to-start modes, so no user request is cold.

A first request at a new size pays, on the user's time, for what the fast path does once per shape:
Triton kernels compile (or load from Triton's on-disk cache), `cosmos3_kernels.dispatch` times its candidates,
cuDNN and cuBLAS build their plans, the VAE decoder's convolutions pick algorithms, and the step's
CUDA graphs are captured. A warm-up runs a short request (a few steps, the mode's default frames and
guidance, a prompt of typical caption length) at each whitelisted size, so all of that happens before
a user asks. The dispatcher's choices and compiled kernels live on the model and in the process, so
later requests of any prompt reuse them. Measured effect: docs/perf-log/2026-12-02.md (bench/bench_engine.py --e2e).

After a restart the compiled kernels and the dispatch decisions come from the kernel cache folder
(`cosmos3_kernels.persist`, `COSMOS3_KERNEL_CACHE`), so the same warm requests then replay only what a process
must do itself: CUDA graph captures, cuDNN's plans and the VAE's algorithm choices (the kernel libraries' imports are
paid at load, `engine.pipeline.fast_path.load_kernels`). What a restarted process's first request costs, with and
without this warm-up before it: docs/PERFORMANCE.md, "The first request of a restarted process".

Which modes: `DEFAULT_MODES` per family (the measured reasons are beside it); `COSMOS3_WARMUP=t2i,t2v`
names them instead, and `COSMOS3_WARMUP=off` (or `none`, `0`, empty) turns warm-up off. Where: only on
a CUDA host, never for a GPU group and never on the CPU (so CI and the tiny CPU app never warm).
When: the job queue (`engine.serving.queue.JobQueue`) plans a model's warm requests right after it
loads it and runs them on its GPU worker one at a time, in the background, only while no user job
waits: a user job that arrives cancels the warm request in flight and runs first, and warm-up resumes
after it. So nobody waits for a warm-up; `JobQueue.state()["warming"]` shows how far it got, and
`JobQueue.warm_default` loads and warms a model at start, before any user asks.
"""
from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Callable

from ..model.defaults import sampling_defaults

# Long enough that both CFG layouts run (inside and outside a guidance interval: at shift 3 the last
# ~20% of steps fall below t = 400) and each branch layout is measured and captured.
WARM_STEPS = 12
_SENTENCE = ("A weathered lighthouse keeper climbs the spiral stairs at dusk, lantern in hand, "
             "the sea below rough and grey, gulls wheeling past the salt-streaked windows. ")
# Two prompt lengths: a short prose prompt and a long one (~900 tokens of Cosmos3's Qwen3 tokenizer, ~2.6k of
# the offline test tokenizer), so the text tower's attention plans of both kinds exist before a user asks.
# Both fit a kept step's room for text (`whole_step.KEPT_PROMPT_TOKENS`) under either tokenizer, so each
# size keeps one step for both, which later prompts up to that room replay.
WARM_PROMPTS = (_SENTENCE, _SENTENCE * 25)


# What to warm when COSMOS3_WARMUP is unset. The rule: warm a mode whose first request (of the process,
# or at a size not used before) takes more than 1.5x a warm one. Measured on an H200 (docs/perf-log/2026-12-02.md):
# - Edge T2I at a new size: 10.6x warm without warm-up, 1.43x after it. Edge T2V 832x480/121f, the
#   first request of a process: 24.4 s against 13 s warm (1.88x); after a T2V warm-up (80 s for Edge's
#   9 sizes x 2 prompts) 1.02x. Both modes are warmed.
# - Nano T2I: 5.16 s cold against 2.09 s warm (2.5x), so it is warmed. Nano T2V 720p: 208.2 s cold
#   against 195.4 s warm (1.07x: the compiles are amortised over a 200 s request), while warming its six
#   T2V sizes would hold the GPU for ~6-7 minutes. Not warmed.
# - Super: not measured; T2I only, on Nano's reasoning (an image request is short, so its compiles
#   dominate it; a video request is long enough to amortise them). In bf16 Super runs on a GPU group,
#   which is never warmed; in FP8 (COSMOS3_FP8=1) it fits one H200, and this entry applies.
# A family not listed here ("custom") is not warmed: nothing was measured for it.
DEFAULT_MODES: dict[str, tuple[str, ...]] = {
    "edge": ("t2i", "t2v"),
    "nano": ("t2i",),
    "super": ("t2i",),
}


def modes_for(family: str, asked: tuple[str, ...] | None) -> tuple[str, ...]:
    """The modes to warm for a model of `family`: what `COSMOS3_WARMUP` asked (`engine.config.WarmupConfig.modes`), else the
    family's default."""
    return asked if asked is not None else DEFAULT_MODES.get(family, ())


def warm_requests(info, modes=("t2i", "t2v")) -> list[dict]:
    """Short requests (two prompt lengths) per whitelisted size of each default mode this checkpoint offers."""
    requests = []
    for mode in modes:
        if mode not in info.modes:
            continue
        defaults = sampling_defaults(info, mode)
        steps = defaults["steps"] if defaults["steps_locked"] else min(WARM_STEPS, defaults["steps"])
        for width, height in defaults["resolutions"]:
            for prompt in WARM_PROMPTS:
                requests.append(dict(mode=mode, prompt=prompt, width=width, height=height, steps=steps,
                                     num_frames=defaults["num_frames"], seed=0))
    return requests


def warm_one(model, request: dict, cancel: threading.Event | None = None) -> dict:
    """Run one warm request through `generate` (nothing is saved). With `cancel` set it stops within a
    step and raises `JobCancelled`. Returns {"mode", "width", "height", "prompt_chars", "seconds"}."""
    from ..pipeline.run import generate
    from ..events import JobCancelled

    if cancel is not None and cancel.is_set():  # a user job came first: not even the prompt and prefill run
        raise JobCancelled()
    began = time.perf_counter()
    generate(model, request, cancel=cancel)
    return {"mode": request["mode"], "width": request["width"], "height": request["height"],
            "prompt_chars": len(request["prompt"]), "seconds": time.perf_counter() - began}


def warm_up(model, modes=("t2i", "t2v"), report: Callable[[int, int], None] | None = None,
            cancel: threading.Event | None = None) -> list[dict]:
    """All of `warm_requests` in a row, on the calling thread (benchmarks and scripts; the job queue runs
    them one at a time in the background instead); `report(done, total)` after each. Returns `warm_one`'s
    record per request."""
    requests = warm_requests(model.info, modes)
    done = []
    for request in requests:
        if cancel is not None and cancel.is_set():
            break
        done.append(warm_one(model, request, cancel=cancel))
        if report is not None:
            report(len(done), len(requests))
    return done


@dataclass(frozen=True)
class WarmStep:
    """One piece of background warm work: a warm request for a loaded model, or (request None) loading
    the model first, which then plans its warm requests (`JobQueue.warm_default`)."""

    model_name: str
    request: dict | None = None


class WarmBacklog:
    """The job queue's warm work not yet done, in order, with done/total per model for `state()`.

    Plain bookkeeping: the queue calls it under its own lock, and its single worker runs the steps."""

    def __init__(self):
        self._steps: deque[WarmStep] = deque()
        self._progress: dict[str, dict[str, int]] = {}

    def __bool__(self) -> bool:
        return bool(self._steps)

    def load(self, model_name: str, total: int) -> None:
        """Load the model, then warm it (`total` requests, as `plan` will get). It counts as warming from
        now on, loading included: the UI's note shows, and its poll runs, from the start."""
        self._steps.append(WarmStep(model_name))
        self._progress.setdefault(model_name, {"done": 0, "total": total})  # a warm-up under way keeps its count

    def plan(self, model_name: str, requests: list[dict]) -> None:
        """A model was just loaded: these are its warm requests (any left from an earlier load are replaced)."""
        self.drop(model_name)
        if requests:
            self._steps.extend(WarmStep(model_name, request) for request in requests)
            self._progress[model_name] = {"done": 0, "total": len(requests)}

    def next(self) -> WarmStep:
        return self._steps.popleft()

    def put_back(self, step: WarmStep) -> None:
        """A step cancelled for a user job: still to do, and first when the GPU is idle again."""
        if step.request is None or step.model_name in self._progress:
            self._steps.appendleft(step)

    def finished(self, step: WarmStep) -> None:
        """A step ran (well or not: a failed warm request only costs warmth, it is not retried)."""
        progress = self._progress.get(step.model_name)
        if progress is None:
            return
        if step.request is None:  # a load: if it planned nothing (it failed, or nothing to warm), nothing warms
            if not any(s.model_name == step.model_name for s in self._steps):
                del self._progress[step.model_name]
            return
        progress["done"] += 1
        if progress["done"] >= progress["total"]:
            del self._progress[step.model_name]

    def drop(self, model_name: str) -> None:
        """The model left memory (evicted): its warm work is moot."""
        self._steps = deque(s for s in self._steps if s.model_name != model_name)
        self._progress.pop(model_name, None)

    def clear(self) -> None:
        self._steps.clear()
        self._progress.clear()

    def status(self) -> dict[str, dict[str, int]]:
        """{model: {"done", "total"}} for each model still warming; empty when idle."""
        return {name: dict(progress) for name, progress in self._progress.items()}
