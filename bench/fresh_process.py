"""The first request of a new process, after an earlier process ran the same size: what a restart keeps (issue 47).

Per workload, over one kernel cache folder that starts empty (`COSMOS3_KERNEL_CACHE`, `cosmos3_kernels.persist`):
- process 1: its first request compiles every kernel and measures every dispatch choice, and writes both into the
  folder; its second request is warm;
- process 2, after it: its first request reads the compiled kernels and the decisions; its second is warm. This
  first request against that warm one is the figure (the target: <= 1.3x);
- with `--fresh-process-baseline`, process 3 keeps the compiled kernels but not the decisions (the compilers'
  folders point into the cache, `COSMOS3_KERNEL_CACHE=off`): a restart as it was before the decisions were kept.
Each process is `bench_engine.py --e2e WORKLOAD --cold-only none` (cold, then warm); `process_s` is its whole life
(imports, the random-weight build, both requests).

    python3 bench/bench_engine.py --fresh-process edge-t2v-480p,nano-t2i-1024 --json $OUT/fresh.json
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from bench.e2e import run_header
from cosmos3_kernels.persist import CACHE_ENV, COMPILER_CACHES

BENCH = Path(__file__).resolve().parent / "bench_engine.py"
TARGET_RATIO = 1.3


def _environments(cache: str, baseline: bool) -> list[tuple[str, dict]]:
    clean = {k: v for k, v in os.environ.items() if k not in COMPILER_CACHES and k != CACHE_ENV}
    runs = [("first process", dict(clean, **{CACHE_ENV: cache})), ("second process", dict(clean, **{CACHE_ENV: cache}))]
    if baseline:
        kept = {variable: str(Path(cache) / sub) for variable, sub in COMPILER_CACHES.items()}
        runs.append(("kernels kept, decisions not", dict(clean, **kept, **{CACHE_ENV: "off"})))
    return runs


def _process(name: str, env: dict, args, out: Path) -> dict:
    command = [sys.executable, str(BENCH), "--e2e", name, "--cold-only", "none", "--json", str(out),
               "--prompt-tokens", str(args.prompt_tokens)] + (["--steps", args.steps] if args.steps else [])
    began = time.perf_counter()
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    record = {"process_s": time.perf_counter() - began, "returncode": done.returncode}
    if done.returncode != 0 or not out.is_file():
        record["failed"] = (done.stderr or done.stdout).strip()[-1500:]
        return record
    row = json.loads(out.read_text())["e2e"][0]
    record.update(first=row["cold"], warm=row.get("warm"), prompt_tokens=row["prompt_tokens"])
    if record["warm"]:
        record["first_over_warm"] = row["cold"]["total_s"] / row["warm"]["total_s"]
    return record


def _cache_contents(cache: str) -> dict:
    root = Path(cache)
    out = {sub: sum(1 for p in (root / sub).rglob("*") if p.is_file()) for sub in COMPILER_CACHES.values()}
    decisions = list((root / "dispatch").glob("decisions-*.json"))
    out["dispatch_decisions"] = sum(len(json.loads(p.read_text())["decisions"]) for p in decisions)
    return out


def main_fresh(args) -> int:
    results = {"header": run_header(torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"),
               "fresh_process": []}

    def save():
        if args.json:
            Path(args.json).write_text(json.dumps(results, indent=2, default=str))

    for name in [n for n in args.fresh_process.split(",") if n]:
        row = {"workload": name}
        results["fresh_process"].append(row)
        with tempfile.TemporaryDirectory() as cache:
            for label, env in _environments(cache, args.fresh_process_baseline):
                row[label] = _process(name, env, args, Path(cache) / f"{label.replace(' ', '_')}.json")
                if label == "first process":
                    row["cache_after_first_process"] = _cache_contents(cache)
                print(json.dumps({name: {label: row[label]}}, default=str), flush=True)
                save()
    print(table(results))
    save()
    return 0


def table(results: dict) -> str:
    """Per workload and process: the first request, the warm one, their ratio against the target."""
    lines = ["| workload | process | first request s | warm s | first / warm | process s |", "|---|---|---|---|---|---|"]
    for row in results["fresh_process"]:
        for label, record in row.items():
            if not isinstance(record, dict) or "process_s" not in record:
                continue
            if "failed" in record:
                lines.append(f"| {row['workload']} | {label} | failed | | | {record['process_s']:.1f} |")
                continue
            ratio = record.get("first_over_warm")
            status = "" if ratio is None else f"{ratio:.2f}x" + (
                f" ({'met' if ratio <= TARGET_RATIO else 'missed'}: <= {TARGET_RATIO}x)" if label == "second process" else "")
            warm = record["warm"]["total_s"] if record.get("warm") else float("nan")
            lines.append(f"| {row['workload']} | {label} | {record['first']['total_s']:.2f} | {warm:.2f} | {status} | "
                         f"{record['process_s']:.1f} |")
    return "\n".join(lines)
