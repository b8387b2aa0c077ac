"""Projected serving throughput (requests per hour) per workload and GPU count, from measured step times.

    python3 bench/project_throughput.py [docs/data/bench_engine_2026-11-29.json]

A projection, not a measurement: one request = prefill + steps x the engine's measured step (both CFG
branches) + the measured VAE decode, and N GPUs run N independent replicas (one per GPU group, Ray
Serve routing), so throughput scales linearly with the replica count. Not included: MP4 encoding and
saving (CPU, overlaps the next job's GPU work only across replicas), model load, Ray's per-job hop.
Steps are each variant's defaults (engine.sampling_defaults). Prints a Markdown table.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine import VariantInfo, sampling_defaults  # noqa: E402

GPU_COUNTS = (1, 2, 4, 8)
# workload in the step table -> (family, mode, decode row in the VAE table, decode scale)
WORKLOADS = {
    "Nano T2I 1024x1024": ("nano", "t2i", "image 1024x1024", 1.0),
    "Edge T2I 640x640": ("edge", "t2i", "image 1024x1024", 640 * 640 / (1024 * 1024)),  # decode scaled by pixels
    "Nano T2V 832x480 121f": ("nano", "t2v", "video 832x480 121f", 1.0),
    "Edge T2V 832x480 121f": ("edge", "t2v", "video 832x480 121f", 1.0),
    "Nano T2V 1280x720 189f": ("nano", "t2v", "video 1280x720 189f", 1.0),
}


def project(data: dict) -> list[dict]:
    steps_ms = {row["workload"]: row["rows"]["engine"]["median_ms"] for row in data["steps"]}
    decode_ms = {row["decode"]: row["median_ms"] for row in data["vae"]}
    prefill_s = data["e2e"]["engine_timings"]["prefill"]
    rows = []
    for workload, (family, mode, decode, scale) in WORKLOADS.items():
        if workload not in steps_ms:
            continue
        steps = sampling_defaults(VariantInfo.released(family), mode)["steps"]
        seconds = prefill_s + steps * steps_ms[workload] / 1000 + decode_ms[decode] * scale / 1000
        rows.append({"workload": workload, "steps": steps, "request_s": seconds,
                     "per_hour": {n: n * 3600 / seconds for n in GPU_COUNTS}})
    return rows


def main(path: str = "docs/data/bench_engine_2026-11-29.json") -> None:
    data = json.loads(Path(path).read_text())
    print(f"Projected from `{path}` ({data['header']['gpu']}, {data['header']['date']}); one replica per GPU.\n")
    print("| workload | steps | s / request | " + " | ".join(f"{n} GPU{'s' if n > 1 else ''}" for n in GPU_COUNTS) + " |")
    print("|---|---|---|" + "---|" * len(GPU_COUNTS))
    for row in project(data):
        cells = " | ".join(f"{row['per_hour'][n]:,.0f}" for n in GPU_COUNTS)
        print(f"| {row['workload']} | {row['steps']} | {row['request_s']:.1f} | {cells} |")


if __name__ == "__main__":
    main(*sys.argv[1:])
