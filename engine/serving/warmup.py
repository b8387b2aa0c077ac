"""Warm a loaded model at every whitelisted size of its default modes, so no user request is cold.

A first request at a new size pays, on the user's time, for what the fast path does once per shape:
Triton kernels compile (or load from Triton's on-disk cache), `kernels.dispatch` times its candidates,
cuDNN and cuBLAS build their plans, the VAE decoder's convolutions pick algorithms, and the step's
CUDA graphs are captured. `warm_up` runs a short request (a few steps, the mode's default frames and
guidance, a prompt of typical caption length) at each whitelisted size, so all of that happens at load
time instead: the job queue does it right after loading a model when `COSMOS3_WARMUP` names the modes
(the job that caused the load shows the "warm-up" stage meanwhile; `preload` warms at start). The
dispatcher's choices and compiled kernels live on the model and in the process, so later requests of
any prompt reuse them. Measured effect: docs/PERFORMANCE.md (bench/bench_engine.py --e2e).
"""
from __future__ import annotations

import os
import threading
import time
from typing import Callable

from ..model.defaults import sampling_defaults

# Long enough that both CFG layouts run (inside and outside a guidance interval: at shift 3 the last
# ~20% of steps fall below t = 400) and each branch layout is measured and captured.
WARM_STEPS = 12
_SENTENCE = ("A weathered lighthouse keeper climbs the spiral stairs at dusk, lantern in hand, "
             "the sea below rough and grey, gulls wheeling past the salt-streaked windows. ")
# Two prompt lengths: a short prose prompt and a long caption (real captions run 1.5k-3k tokens), so
# the dispatcher's per-length buckets and the attention plans of both kinds exist before a user asks.
WARM_PROMPTS = (_SENTENCE, _SENTENCE * 60)


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


def modes_from_env() -> tuple[str, ...]:
    """`COSMOS3_WARMUP=t2i,t2v` (modes to warm at load; unset or empty: none)."""
    return tuple(m.strip() for m in os.environ.get("COSMOS3_WARMUP", "").split(",") if m.strip())


def warm_up(model, modes=("t2i", "t2v"), report: Callable[[int, int], None] | None = None,
            cancel: threading.Event | None = None) -> list[dict]:
    """Run `warm_requests` through `generate`; `report(done, total)` after each. Returns, per request,
    {"mode", "width", "height", "prompt_chars", "seconds"}."""
    from ..pipeline.run import generate

    requests = warm_requests(model.info, modes)
    done = []
    for request in requests:
        if cancel is not None and cancel.is_set():
            break
        began = time.perf_counter()
        generate(model, request)
        done.append({"mode": request["mode"], "width": request["width"], "height": request["height"],
                     "prompt_chars": len(request["prompt"]), "seconds": time.perf_counter() - began})
        if report is not None:
            report(len(done), len(requests))
    return done
