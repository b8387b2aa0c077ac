"""Does the attention kernel a step runs change the time of the rest of the step? An interleaved A/B.

    python bench/bench_attention_in_step.py --json out.json     # Nano T2I 1024x1024, about 2 minutes on an H200

One process, one full-size random Nano, the e2e workload `nano-t2i-1024` (35 steps, CFG every step, a
~1.6k-token caption). Each variant has its own dispatcher and its own kept step graphs, swapped in before
each of its requests, so the variants alternate request by request (A B A B ...) and share the GPU's
thermal and power history:
- "flash4": attention on flash-attn-4 wherever dispatch offers it (whatever its isolated timing);
- "triton": attention on our Triton kernel (flash-attn-4 not offered);
- "auto": dispatch's own choice, as the engine runs (its candidates timed as CUDA-graph replays);
- "auto-eager": dispatch's choice with its candidates timed as back-to-back eager calls, as before
  (`COSMOS3_DISPATCH_TIMING=eager`).
Everything else is dispatch's choice in each variant.

Caution, measured (docs/perf-log/2026-12-02.md, "The clock a request runs at"): sharing the power history also
means one power-hungry variant holds every variant's clock down. With our Triton kernel among the
variants, all of them ran at ~1590 MHz, and flash-attn-4 alone in its own process ran at ~1890. Run one
variant per process (`--variants auto`, then `--variants triton`) to see what each costs a whole request.

Recorded per request: denoise seconds, and while it runs, nvidia-smi's SM clock and power samples (every
50 ms). Then one more request per variant under torch.profiler: GPU time by kernel, so a difference can be
placed (attention alone, or every kernel).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import e2e  # noqa: E402
from bench.models import as_loaded_model, build_transformer, build_vae  # noqa: E402
from cosmos3_kernels import autotune  # noqa: E402

_MEASURE = autotune.Autotuner.measure


def _measure_preferring(path: str):
    """An `Autotuner.measure` that puts attention (the op offering flash-attn-4) on `path` ("flash4", "triton") where
    that backend runs, or leaves dispatch's choice ("auto", "auto-eager": timed eagerly)."""
    def measure(self, candidates, **kwargs):
        if path == "auto-eager":
            self.timing = "eager"
        if path in ("flash4", "triton") and "flash4" in candidates:
            alone = _MEASURE(self, {path: candidates[path]}, **kwargs)
            if alone.backend == path:
                return dataclasses.replace(alone, reason=f"bench: {path} preferred")
        return _MEASURE(self, candidates, **kwargs)
    return measure


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=4, help="requests per variant, interleaved")
    parser.add_argument("--variants", default="flash4,triton,auto")
    parser.add_argument("--workload", default="nano-t2i-1024")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    from engine.model.tiny import build_tokenizer

    family, request, _ = e2e.WORKLOADS[args.workload]
    model = as_loaded_model(build_transformer(family), family, vae=build_vae(), tokenizer=build_tokenizer())
    request = dict(request, prompt=e2e.long_prompt(model), seed=1)
    variants = args.variants.split(",")
    saved = {v: ({}, {}) for v in variants}  # each variant's dispatchers and kept steps
    results = {"header": e2e.run_header(torch.cuda.get_device_name()), "workload": args.workload,
               "requests": [], "profiles": {}}

    def run(variant: str, profile: bool = False) -> dict:
        runtime = model.runtime
        runtime.dispatchers.clear()
        runtime.kept_steps.clear()
        runtime.dispatchers.update(saved[variant][0])
        runtime.kept_steps.update(saved[variant][1])
        autotune.Autotuner.measure = _measure_preferring(variant)
        try:
            if profile:
                row = e2e.profile_request(model, args.workload, log=lambda _: None, top=10)
            else:
                row = e2e.timed_generate(model, request)
        finally:
            autotune.Autotuner.measure = _MEASURE
            saved[variant] = (dict(runtime.dispatchers), dict(runtime.kept_steps))
        return row

    clocks = e2e.ClockSampler()
    try:
        for variant in variants:  # cold: compiles, dispatch measures, the step is captured
            results.setdefault("cold", {})[variant] = run(variant)["denoise_s"]
        for round_ in range(args.rounds):
            for variant in variants if round_ % 2 == 0 else variants[::-1]:
                row = run(variant)
                results["requests"].append({"variant": variant, "round": round_, "began": row["began"],
                                            "ended": row["ended"], "denoise_s": row["denoise_s"], "total_s": row["total_s"]})
                print(json.dumps(results["requests"][-1]), flush=True)
        for variant in variants:
            results["profiles"][variant] = run(variant, profile=True)
    finally:
        samples = clocks.close()
    e2e.annotate_clocks(results["requests"], samples)
    for variant in variants:
        mine = sorted(r["denoise_s"] for r in results["requests"] if r["variant"] == variant)
        paths = [(d.backend, d.config.label if d.backend == "flash4" and d.config else None)
                 for key, d in saved[variant]["auto"].decisions().items() if key[0] == "prefix_attention"]
        profile = results["profiles"][variant]
        results.setdefault("summary", {})[variant] = {
            "denoise_s_median": mine[len(mine) // 2], "denoise_s": mine, "attention": paths,
            "sm_mhz_median": sorted(r.get("sm_mhz_median", 0) for r in results["requests"] if r["variant"] == variant),
            "profiled_kernel_ms": profile["kernel_ms_total"],
            "profiled_top": [(k["kernel"][:60], k["calls"], round(k["ms"], 1)) for k in profile["top"][:6]]}
        print(json.dumps({variant: results["summary"][variant]}), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
