"""Where a warm video request's time before denoising goes: each pre-denoise stage timed with the GPU synchronised,
then one pass under cProfile (issue 17: the prefill stage's wall time is mostly host work).

    python3 bench/bench_prefill_host.py --family edge --json $OUT/prefill_host.json    # ~1 min on an H200
    python3 bench/bench_prefill_host.py --family edge --threads-ab --passes 6 --json $OUT/prefill_threads_ab.json

Full-size random weights (bench/models.py) and the table's 1.6k-token caption (bench.e2e.long_prompt). One whole
request first (T2V at --size, 832x480/121f unless given, for Nano too: it keeps the run short), so kernels are compiled
and dispatch has measured; then `--passes` timed passes (3) of the stages `engine.pipeline.run` runs before denoising, with
the prefill stage also timed in its parts (`prefill_cache`: the text tower and the K/V buffers; the rest: the
branches' positions) and the tower stage (the gen tower: fused projections, FP8 weights, dispatch), then a fourth
under cProfile (top functions by cumulative and by own time).

`--threads-ab` alternates the passes between PyTorch's default intra-op thread count and one thread. Why: the
branches' positions (diffusers' M-RoPE builders) are CPU tensor ops on ~40k values, above PyTorch's grain for a
parallel region, run once a request after seconds in which no CPU op ran; on this project's CPU machine such an op
(a `cat` or `max` over 3 x 12090 values) took ~6 ms after a 30 ms pause with two threads, and microseconds with one
(docs/perf-log/2026-12-02.md, "The decode's last join, a noise worker measured and dropped").
"""
from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import bench  # noqa: E402, F401 - the engine's start-up settings (bench/__init__.py)

WORKLOADS = {"edge": "edge-t2v-480p", "nano": "nano-t2v-720p"}


def stages_once(model, request, profile: cProfile.Profile | None = None) -> dict:
    """The pre-denoise stages of one request, ms each; the prefill stage also in its parts (its text tower and K/V
    buffers, `prefill_cache`; the rest, the branches' positions), and the tower stage."""
    from bench.e2e import sync
    from engine.pipeline import prefill as prefill_module
    from engine.pipeline import run
    from engine.pipeline.fast_path import FastPathOptions
    from engine.pipeline.state import RunState

    state = RunState(model, request, 1, torch.Generator(device="cpu").manual_seed(1), FastPathOptions.for_model(model),
                     None, lambda step, total: None)
    ms = {}

    def timed(label, fn):
        sync()
        began = time.perf_counter()
        result = fn()
        sync()
        ms[label] = round(1000 * (time.perf_counter() - began), 2)
        return result

    for label, stage in (("conditioning", run.conditioning_stage), ("prompt", run.prompt_stage),
                         ("noise", run.noise_stage), ("layout", run.layout_stage), ("schedule", run.schedule_stage)):
        timed(label, lambda: stage(state))
    parts = {"prefill_cache": prefill_module.prefill_cache}
    for name, part in parts.items():  # the stage's own calls, timed where it makes them
        setattr(prefill_module, name, lambda *a, _name=name, _part=part, **k: timed(_name, lambda: _part(*a, **k)))
    try:
        if profile is not None:
            profile.enable()
        timed("prefill", lambda: run.prefill_stage(state))
        timed("tower", lambda: run.tower_stage(state))
    finally:
        if profile is not None:
            profile.disable()
        for name, part in parts.items():
            setattr(prefill_module, name, part)
    ms["prefill other (positions)"] = round(ms["prefill"] - ms["prefill_cache"], 2)
    return ms


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--family", choices=sorted(WORKLOADS), default="edge")
    parser.add_argument("--size", default="832x480x121", help="WIDTHxHEIGHTxFRAMES of the T2V request")
    parser.add_argument("--passes", type=int, default=3, help="timed passes (of each thread count with --threads-ab)")
    parser.add_argument("--threads-ab", action="store_true",
                        help="alternate passes with PyTorch's intra-op CPU threads at the default and at 1")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    try:
        width, height, frames = (int(v) for v in args.size.split("x"))
    except ValueError:
        parser.error(f"--size must be WIDTHxHEIGHTxFRAMES, e.g. 832x480x121; got {args.size!r}")
    from bench import e2e
    from bench.models import as_loaded_model, build_transformer, build_vae
    from engine.model.tiny import build_tokenizer
    from engine.pipeline.request import validate_request
    from engine.pipeline.run import generate

    model = as_loaded_model(build_transformer(args.family), args.family, vae=build_vae(), tokenizer=build_tokenizer())
    params = dict(e2e.WORKLOADS[WORKLOADS[args.family]][1], prompt=e2e.long_prompt(model), seed=1,
                  width=width, height=height, num_frames=frames)
    result = {"header": e2e.run_header(torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"),
              "warm_up_request": generate(model, params).timings}
    print(json.dumps(result), flush=True)
    request = validate_request(model.info, params["mode"], params)
    default_threads = torch.get_num_threads()
    thread_counts = (default_threads, 1) if args.threads_ab else (default_threads,)
    result["stages_ms"] = []
    for _ in range(args.passes):
        for threads in thread_counts:  # alternated, so both see the same drift
            torch.set_num_threads(threads)
            row = dict(stages_once(model, request), intra_op_threads=threads)
            result["stages_ms"].append(row)
            print("stages ms", json.dumps(row), flush=True)
    torch.set_num_threads(default_threads)
    profile = cProfile.Profile()
    result["profiled_ms"] = stages_once(model, request, profile)
    tables = {}
    for order, count in (("cumulative", 45), ("tottime", 25)):
        text = io.StringIO()
        pstats.Stats(profile, stream=text).sort_stats(order).print_stats(count)
        tables[order] = text.getvalue()
        print(tables[order], flush=True)
    result["profile"] = tables
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
