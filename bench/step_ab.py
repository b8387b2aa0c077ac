"""One whole denoising step of the fast tower under several variants of a pass, in one process, interleaved.

What it is for: a pass that saves a percent of a step cannot be told apart from the clock between two runs, or
two machines (the power cap moves a step by more). So every variant is timed in the same rounds, one sample each
in turn, on full-size random weights, both CFG branches (prefixes 1606/59 as a request with the 1.6k-token caption
and the default negative prompt has them) and the real M-RoPE positions. Each row also gives every variant's
velocity against the first variant's (relative L2), and whatever the caller's `describe` reads off the model
afterwards (dispatch's decisions).
"""
from __future__ import annotations

import gc
import json
import statistics
import time
from typing import Callable

import torch

PREFIXES = (1606, 59)


def parse_shapes(shapes: str) -> list[tuple[str, int, int, int]]:
    """'nano:1280x720x189,edge:832x480x121' -> [(family, width, height, frames), ...]."""
    parsed = []
    for spec in shapes.split(","):
        family, _, size = spec.partition(":")
        try:
            width, height, frames = (int(x) for x in size.split("x"))
        except ValueError:
            raise ValueError(f"step shape {spec!r} is not FAMILY:WIDTHxHEIGHTxFRAMES, e.g. nano:1280x720x189") from None
        parsed.append((family, width, height, frames))
    return parsed


def step_ab_rows(shapes: str, rounds: int, variants: dict[str, Callable], *,
                 describe: Callable[[object], dict] | None = None) -> list[dict]:
    """One row per family and shape. ``variants``: {label: make(model, inputs) -> tower}; the first is the baseline
    that `speedup`, `saved_ms` and `velocity_rel_diff` compare against."""
    from bench.models import as_loaded_model, build_transformer, step_inputs
    from cosmos3_kernels.timing import time_ms

    rows = []
    for family, width, height, frames in parse_shapes(shapes):
        model = as_loaded_model(build_transformer(family), family)
        inputs = step_inputs(model, width=width, height=height, frames=frames, prefix_lens=PREFIXES)
        towers, velocities = {}, {}
        with torch.no_grad():
            for label, make in variants.items():
                towers[label] = make(model, inputs)
                began = time.perf_counter()
                velocities[label] = inputs.engine_step(towers[label])  # dispatch measures, kernels compile
                torch.cuda.synchronize()
                print(json.dumps({"family": family, "tower": label, "first_step_s": time.perf_counter() - began}),
                      flush=True)
                torch.cuda.empty_cache()  # dispatch's timing graphs leave pool segments behind
            samples = {label: [] for label in towers}
            for _ in range(rounds):
                for label, tower in towers.items():
                    samples[label].append(time_ms(lambda: inputs.engine_step(tower), warmup=0, iters=1).median_ms)
        baseline = next(iter(towers))
        ms = {label: statistics.median(v) for label, v in samples.items()}
        row = {"family": family, "shape": f"{width}x{height}x{frames}", "prefixes": list(PREFIXES),
               "gen_tokens": inputs.layout.gen_len, "rounds": rounds, "baseline": baseline, "samples_ms": samples,
               "ms": ms, "speedup": {label: ms[baseline] / t for label, t in ms.items()},
               "saved_ms": {label: ms[baseline] - t for label, t in ms.items()},
               "velocity_rel_diff": {label: [float((a - b).norm() / b.norm())
                                             for a, b in zip(velocities[label], velocities[baseline])]
                                     for label in velocities}}
        if describe is not None:
            row.update(describe(model))
        print(json.dumps(row, default=str), flush=True)
        rows.append(row)
        del towers, inputs, model, velocities
        gc.collect()
        torch.cuda.empty_cache()
    return rows
