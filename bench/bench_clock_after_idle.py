"""How fast is a warm request when it finds the GPU idle, and when requests run back to back?

    python3 bench/bench_clock_after_idle.py --json out.json     # Nano T2I 1024x1024, about 2 minutes on an H200

Sustained bf16 work holds an H200 at its 700 W power limit, and the SM clock it settles at sets a
GEMM-bound request's time (docs/perf-log/2026-12-02.md, "The clock a request runs at"). One process, one
full-size random Nano, the e2e workload `nano-t2i-1024` (35 steps, CFG every step, a ~1.6k-token caption),
warmed by one request. Then rounds of: a pause of `--idle` seconds with the GPU idle, then `--burst`
requests back to back. Each request records its denoise time and the median SM clock and power that
nvidia-smi sampled while it ran (every 50 ms; with the GPU's temperature, and the share of samples whose
clock the power cap or a thermal slowdown held), so the first request after a pause (what a lone user of
an idle server gets) and the later ones (a busy server) are told apart. `--idle 0 --burst 40` is one
sustained series: does the clock fall as the chip warms?
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import e2e  # noqa: E402
from bench.models import as_loaded_model, build_transformer, build_vae  # noqa: E402


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workload", default="nano-t2i-1024")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--idle", type=float, default=15.0, help="seconds the GPU idles before each burst")
    parser.add_argument("--burst", type=int, default=5, help="requests back to back after each pause")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    from engine.model.tiny import build_tokenizer

    family, request, _ = e2e.WORKLOADS[args.workload]
    model = as_loaded_model(build_transformer(family), family, vae=build_vae(), tokenizer=build_tokenizer())
    request = dict(request, prompt=e2e.long_prompt(model), seed=1)
    results = {"header": e2e.run_header(torch.cuda.get_device_name()), "workload": args.workload,
               "idle_s": args.idle, "burst": args.burst, "requests": []}
    clocks = e2e.ClockSampler()
    try:
        results["cold_denoise_s"] = e2e.timed_generate(model, request)["denoise_s"]
        for round_ in range(args.rounds):
            time.sleep(args.idle)
            for position in range(args.burst):
                row = e2e.timed_generate(model, request)
                results["requests"].append({"round": round_, "position": position, "began": row["began"],
                                            "ended": row["ended"], "denoise_s": row["denoise_s"],
                                            "total_s": row["total_s"]})
    finally:
        samples = clocks.close()
    e2e.annotate_clocks(results["requests"], samples)
    dispatcher = model.runtime.dispatchers.get("auto")  # which kernel each op took, and how dispatch timed them
    results["dispatch_timing"] = getattr(dispatcher, "timing", None)
    results["kernel_paths"] = sorted({(key[0], decision.backend) for key, decision in
                                      (dispatcher.decisions().items() if dispatcher else ())})
    for row in results["requests"]:
        print(json.dumps({k: row.get(k) for k in ("round", "position", "denoise_s", "total_s", "sm_mhz_median",
                                                  "power_w_median", "temp_c_median", "power_capped_share",
                                                  "thermal_share")}), flush=True)
    for label, rows in (("first after idle", [r for r in results["requests"] if r["position"] == 0]),
                        ("back to back", [r for r in results["requests"] if r["position"] > 0])):
        if rows:
            results.setdefault("summary", {})[label] = {
                "n": len(rows), "denoise_s_median": statistics.median(r["denoise_s"] for r in rows),
                "denoise_s": sorted(r["denoise_s"] for r in rows),
                "sm_mhz_median": statistics.median(r.get("sm_mhz_median") or 0 for r in rows)}
    print(json.dumps(results.get("summary")), flush=True)
    print(json.dumps({"dispatch_timing": results["dispatch_timing"], "kernel_paths": results["kernel_paths"]}), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
