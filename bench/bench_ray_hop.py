"""What a Ray Serve replica adds to each job: wall time from submit to result minus the engine's own
`timings.total`, for the in-process queue and for one replica on a local Ray cluster, tiny Nano T2I.

    python3 bench/bench_ray_hop.py [--jobs 12]

Runs on CPU (the tiny random-weight model); the hop (routing, streamed events, files shipped back) does
not depend on the model's size, except the shipped files' bytes.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import bench  # noqa: E402, F401 - the engine's start-up settings (bench/__init__.py)
os.environ.setdefault("OMP_NUM_THREADS", "1")

from engine.serving.queue import JobQueue  # noqa: E402
from engine.serving.registry import ModelEntry, ModelRegistry  # noqa: E402
from engine.serving.ray_replicas import RayConfig, RayJobQueue  # noqa: E402
from engine.model.tiny import ensure_family  # noqa: E402

REQUEST = {"mode": "t2i", "prompt": "a kite", "width": 64, "height": 64, "steps": 2, "seed": 1}


def overhead(queue, jobs: int) -> tuple[float, float, float]:
    queue.submit("nano", REQUEST).result(300)  # warm-up: the model loads
    extra = []
    for _ in range(jobs):
        start = time.perf_counter()
        result = queue.submit("nano", REQUEST).result(300)
        extra.append(time.perf_counter() - start - result.timings["total"])
    return statistics.median(extra), min(extra), max(extra)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=12)
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="ray-hop-"))
    registry = ModelRegistry([ModelEntry("nano", str(ensure_family(folder / "tiny")["nano"]))])
    local = JobQueue(registry, folder / "local", max_size=4)
    print("in-process queue: median %.4f s (min %.4f, max %.4f)" % overhead(local, args.jobs))
    local.close()
    config = RayConfig(address="local", replicas=1, gpus_per_replica=0, cpus_per_replica=0, num_cpus=2,
                       env={"OMP_NUM_THREADS": "1"})
    replica = RayJobQueue.start(config, registry, folder / "ray", max_size=4)
    print("Ray Serve replica: median %.4f s (min %.4f, max %.4f)" % overhead(replica, args.jobs))
    replica.close()


if __name__ == "__main__":
    main()
