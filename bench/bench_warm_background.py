"""The background warm-up on the GPU: how long a user job waits when it arrives in the middle of a warm-up.

A `JobQueue` serves the full-size random Edge (bench/models.py; the registry entry is the tiny Edge
checkpoint, for its variant facts) and warms it in the background from `warm_default`, as the app does at
start. Once the warm-up has reached its T2V runs (the longest, 832x480/121f), a user T2I request arrives:
the run in flight is cancelled within a denoise step and the user job runs first. Then the same request
again once the warm-up is done or later (the warm reference). Records the warm-up's progress over time.

    python3 bench/bench_warm_background.py [--json PATH]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import bench  # noqa: E402, F401 - the engine's start-up settings (bench/__init__.py)


USER_PROMPT = "A lighthouse keeper climbs the stairs at dusk. " * 30


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", default=None)
    ap.add_argument("--after-runs", type=int, default=20, help="submit the user job once this many warm runs are done")
    ap.add_argument("--profile-user-job", action="store_true", help="run the user's requests under cProfile (on the "
                    "worker thread) and keep each one's top functions and the dispatch decisions it added")
    ap.add_argument("--cpu-check", action="store_true", help="the tiny Edge on the CPU, the GPU check stubbed: the "
                    "script's own code path only, nothing timed means anything")
    args = ap.parse_args()
    os.environ.pop("COSMOS3_WARMUP", None)  # the family default: Edge warms t2i and t2v

    from bench.models import as_loaded_model, build_transformer, build_vae
    from engine.model.tiny import build_tokenizer, write_family
    from engine.events import Finished, Started
    from engine.serving.queue import JobQueue
    from engine.serving.registry import ModelEntry, ModelRegistry

    tmp = Path(tempfile.mkdtemp())
    tiny = write_family(tmp / "tiny")
    registry = ModelRegistry([ModelEntry("edge", str(tiny["edge"]))])
    loads = []

    def full_size_edge(root):
        began = time.perf_counter()
        model = as_loaded_model(build_transformer("edge"), "edge", vae=build_vae(), tokenizer=build_tokenizer())
        loads.append(time.perf_counter() - began)
        return model

    if args.cpu_check:
        from engine.serving import queue as job_queue

        job_queue.torch_cuda_available = lambda: True
        jobs = JobQueue(registry, tmp / "out")
    else:
        # The queue validates requests against the registry's facts for "edge". The tiny checkpoint's are
        # tiny sizes, so before 2026-12-01 13:00 UTC the "user" request ran at a size the full-size model had
        # never warmed (64x64: its first use compiled Triton kernels). The released facts match the model served.
        from engine.model.variants import VariantInfo

        registry._infos["edge"] = VariantInfo.released("edge")
        jobs = JobQueue(registry, tmp / "out", loader=full_size_edge)
    out = {"timeline": []}
    profiles = []
    if args.profile_user_job:
        import cProfile
        import io
        import pstats

        from engine.pipeline import run as pipeline_run

        plain_generate = pipeline_run.generate

        def generate(model, request, *a, **k):  # the queue imports `generate` from its module on each job
            if request["prompt"] != USER_PROMPT:
                return plain_generate(model, request, *a, **k)
            dispatch = model.runtime.dispatchers.get("auto")
            before = set(dispatch.decisions()) if dispatch is not None else set()
            profiler = cProfile.Profile()
            profiler.enable()
            try:
                return plain_generate(model, request, *a, **k)
            finally:
                profiler.disable()
                text = io.StringIO()
                stats = pstats.Stats(profiler, stream=text)
                stats.sort_stats("cumulative").print_stats(40)
                stats.sort_stats("tottime").print_stats(20)
                dispatch = model.runtime.dispatchers.get("auto")
                added = [str(key) for key in dispatch.decisions() if key not in before] if dispatch is not None else []
                profiles.append({"dispatch_decisions_added": added,
                                 "profile": "\n".join(l[:220] for l in text.getvalue().splitlines() if l.strip())})

        pipeline_run.generate = generate
    t0 = time.perf_counter()
    out["warm_default"] = jobs.warm_default("edge")
    from engine.model.defaults import sampling_defaults

    sizes = [tuple(size) for size in sampling_defaults(registry.info("edge"), "t2i")["resolutions"]]
    width, height = (640, 640) if (640, 640) in sizes else sizes[0]  # the tiny Edge (--cpu-check) has tiny sizes
    request = dict(mode="t2i", prompt=USER_PROMPT, width=width,
                   height=height, seed=1)

    def user_job(label):
        submitted = time.perf_counter()
        handle = jobs.submit("edge", request)
        row = {"label": label, "size": [width, height], "submitted_at_s": submitted - t0,
               "warming_at_submit": jobs.warming()}
        for event in handle.events(timeout=600):
            if isinstance(event, Started):
                row["wait_to_start_s"] = time.perf_counter() - submitted
            if isinstance(event, Finished):
                row["total_s"] = time.perf_counter() - submitted
                row["stage_s"] = dict(getattr(event.result, "timings", {}) or {})  # where the seconds went
            row["last_event"] = type(event).__name__
        print(json.dumps(row), flush=True)
        return row

    while True:
        state = jobs.warming().get("edge")
        out["timeline"].append({"t_s": time.perf_counter() - t0, "warming": state})
        if state is not None and state["done"] >= args.after_runs:
            break
        if state is None and out["timeline"][-1]["t_s"] > 60 and len(out["timeline"]) > 2:
            break  # warm-up over (or never started): measure anyway
        time.sleep(0.25)
    out["mid_warm_up"] = user_job("arrives mid warm-up")
    out["warming_after_mid"] = jobs.warming()
    out["warm_reference"] = user_job("again, warm (warm-up still pending or done)")
    out["load_s"] = loads
    if profiles:
        out["user_job_profiles"] = profiles
        for entry in profiles:
            print(entry["dispatch_decisions_added"], "\n", entry["profile"][:9000], flush=True)
    jobs.close(timeout=30)
    out["closed_at_s"] = time.perf_counter() - t0
    print(json.dumps({k: v for k, v in out.items() if k != "timeline"}, default=str), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
