"""Serving throughput (requests per hour) per workload and GPU count, from measured H200 request times.

    python3 bench/project_throughput.py [E2E_JSON [STEPS_JSON]]

Per request: the measured end-to-end time of `engine.generate` on one H200 (docs/perf-log/2026-12-02.md, "End to
end on one H200", `docs/data/bench_e2e_2026-12-01.json`; the warm run where there is one). A workload
with no end-to-end run is projected from the per-step table (`docs/data/bench_engine_2026-11-29.json`):
prefill + default steps x the measured step + the measured VAE decode. Across GPUs it is a projection:
N GPUs run N independent replicas (one per GPU group, Ray Serve routing), so throughput scales linearly.
Not included: MP4 / PNG encoding and saving (CPU), model loading (once per replica), Ray's per-job hop
(`bench/bench_ray_hop.py`). Prints a Markdown table.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import bench  # noqa: E402, F401 - the engine's start-up settings (bench/__init__.py)

from engine import VariantInfo, sampling_defaults  # noqa: E402

GPU_COUNTS = (1, 2, 4, 8)
E2E = {  # workload id in the e2e file -> what the table calls it
    "edge-t2i-640": "Edge T2I 640x640", "nano-t2i-1024": "Nano T2I 1024x1024",
    "edge-t2v-480p": "Edge T2V 832x480 121f", "nano-t2v-720p": "Nano T2V 1280x720 189f",
}
# step-table workloads without an end-to-end run -> (family, mode, VAE decode row)
STEP_ONLY = {"Nano T2V 832x480 121f": ("nano", "t2v", "video 832x480 121f")}


def measured(e2e: dict) -> list[dict]:
    rows = []
    for run in e2e["e2e"]:
        if run["workload"] in E2E:
            which = "warm" if run.get("warm") else "cold"
            rows.append({"workload": E2E[run["workload"]], "steps": run[which]["steps"],
                         "request_s": run[which]["total_s"], "source": f"measured ({which})"})
    return rows


def projected(steps_data: dict, prefill_s: float) -> list[dict]:
    step_ms = {row["workload"]: row["rows"]["engine"]["median_ms"] for row in steps_data["steps"]}
    decode_ms = {row["decode"]: row["median_ms"] for row in steps_data["vae"]}
    rows = []
    for workload, (family, mode, decode) in STEP_ONLY.items():
        steps = sampling_defaults(VariantInfo.released(family), mode)["steps"]
        seconds = prefill_s + steps * step_ms[workload] / 1000 + decode_ms[decode] / 1000
        rows.append({"workload": workload, "steps": steps, "request_s": seconds, "source": "projected from steps"})
    return rows


def main(e2e_path: str = "docs/data/bench_e2e_2026-12-01.json",
         steps_path: str = "docs/data/bench_engine_2026-11-29.json") -> None:
    e2e = json.loads(Path(e2e_path).read_text())
    rows = measured(e2e)
    # the prefill of the same caption on Nano, measured in the 720p run
    prefill = next(run["cold"]["prefill_s"] for run in e2e["e2e"] if run["workload"] == "nano-t2v-720p")
    rows += projected(json.loads(Path(steps_path).read_text()), prefill)
    print(f"Per request: `{e2e_path}` ({e2e['header']['gpu']}, {e2e['header']['date']}); across GPUs: one "
          "replica per GPU, linear.\n")
    print("| workload | steps | s / request | source | "
          + " | ".join(f"{n} GPU{'s' if n > 1 else ''}" for n in GPU_COUNTS) + " |")
    print("|---|---|---|---|" + "---|" * len(GPU_COUNTS))
    for row in sorted(rows, key=lambda r: r["request_s"]):
        cells = " | ".join(f"{n * 3600 / row['request_s']:,.0f}" for n in GPU_COUNTS)
        print(f"| {row['workload']} | {row['steps']} | {row['request_s']:.2f} | {row['source']} | {cells} |")


if __name__ == "__main__":
    main(*sys.argv[1:])
