"""The first request of a new process, after an earlier process ran the same size: what a restart keeps (issue 47).

Per workload, over one kernel cache folder that starts empty (`COSMOS3_KERNEL_CACHE`, `cosmos3_kernels.persist`):
- process 1: its first request compiles every kernel and measures every dispatch choice, and writes both into the
  folder; its second request is warm;
- process 2, after it: its first request reads the compiled kernels and the decisions; its second is warm. This
  first request against that warm one is the figure (the target: <= 1.3x);
- with `--profile-cold`, one more process like the second, whose first request runs under cProfile (its row gets
  the top functions; its times include the profiler's overhead);
- with `--fresh-process-warm-up`, one more process that runs the app's start-up warm-up before its first request
  (the row gets the warm-up's seconds);
- with `--fresh-process-baseline`, a last process keeps the compiled kernels but not the decisions (the compilers'
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
# With --profile-cold, a third process over the same cache runs its first request under cProfile, so the second
# process's figures carry no profiler overhead.
PROFILED = "third process, first request profiled"
# With --fresh-process-warm-up, a process over the same cache that first runs the app's start-up warm-up
# (`engine.serving.warmup.warm_up` over the workload's mode, as `JobQueue.warm_default` does before users arrive),
# then the request: what a user who arrives after the warm-up waits, and how long the warm-up held the GPU.
AFTER_WARM_UP = "a process after its start-up warm-up"


def _environments(cache: str, args) -> list[tuple[str, dict]]:
    clean = {k: v for k, v in os.environ.items() if k not in COMPILER_CACHES and k != CACHE_ENV}
    kept = dict(clean, **{CACHE_ENV: cache})
    runs = [("first process", kept), ("second process", kept)]
    if args.profile_cold:
        runs.append((PROFILED, kept))
    if args.fresh_process_warm_up:
        runs.append((AFTER_WARM_UP, kept))
    if args.fresh_process_baseline:
        compilers = {variable: str(Path(cache) / sub) for variable, sub in COMPILER_CACHES.items()}
        runs.append(("kernels kept, decisions not", dict(clean, **compilers, **{CACHE_ENV: "off"})))
    return runs


def _process(name: str, label: str, env: dict, args, out: Path) -> dict:
    """One `bench_engine.py` process: the workload cold then warm, or (AFTER_WARM_UP) the start-up warm-up first."""
    run = ["--warm-up-first", name] if label == AFTER_WARM_UP else ["--e2e", name, "--cold-only", "none"]
    command = [sys.executable, str(BENCH), *run, "--json", str(out), "--prompt-tokens", str(args.prompt_tokens)] + (
        ["--steps", args.steps] if args.steps else []) + (["--profile-cold"] if label == PROFILED else [])
    began = time.perf_counter()
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    record = {"process_s": time.perf_counter() - began, "returncode": done.returncode}
    if done.returncode != 0 or not out.is_file():
        record["failed"] = (done.stderr or done.stdout).strip()[-1500:]
        return record
    results = json.loads(out.read_text())
    if label == AFTER_WARM_UP:
        row = results["warm_up_first"][0]
        record.update(first=row["first after warm-up"], warm=row["warm"], warm_up_s=row["warm_up_s"],
                      warm_requests=len(row["sizes"]))
    else:
        row = results["e2e"][0]
        record.update(first=row["cold"], warm=row.get("warm"), prompt_tokens=row["prompt_tokens"])
    if record["warm"]:
        record["first_over_warm"] = record["first"]["total_s"] / record["warm"]["total_s"]
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
            for number, (label, env) in enumerate(_environments(cache, args)):
                row[label] = _process(name, label, env, args, Path(cache) / f"process_{number}.json")
                if label == "first process":
                    row["cache_after_first_process"] = _cache_contents(cache)
                print(json.dumps({name: {label: row[label]}}, default=str), flush=True)
                save()
    print(table(results))
    save()
    return 0


def table(results: dict) -> str:
    """Per workload and process: the first request, the warm one, their ratio against the target."""
    lines = ["| workload | process | first request s | warm s | first / warm | process s | start-up warm-up s |",
             "|---|---|---|---|---|---|---|"]
    for row in results["fresh_process"]:
        for label, record in row.items():
            if not isinstance(record, dict) or "process_s" not in record:
                continue
            if "failed" in record:
                lines.append(f"| {row['workload']} | {label} | failed | | | {record['process_s']:.1f} | |")
                continue
            ratio = record.get("first_over_warm")
            status = "" if ratio is None else f"{ratio:.2f}x" + (
                f" ({'met' if ratio <= TARGET_RATIO else 'missed'}: <= {TARGET_RATIO}x)" if label == "second process" else "")
            warm = record["warm"]["total_s"] if record.get("warm") else float("nan")
            warm_up = f"{record['warm_up_s']:.1f}" if "warm_up_s" in record else ""
            lines.append(f"| {row['workload']} | {label} | {record['first']['total_s']:.2f} | {warm:.2f} | {status} | "
                         f"{record['process_s']:.1f} | {warm_up} |")
    return "\n".join(lines)
