"""One vs two GPUs: per-step and prefill times, velocity agreement, Super sharded over the group.

    python bench/bench_parallel.py --out DIR        # on nvidia-h200-x2 (2 GPUs, NCCL)

Two ranks (one process per GPU, NCCL, `engine.parallel`), full-size random weights built on each
GPU (bench/models.py; the same seed on both ranks, so replicated weights agree). Per workload:
- 1 GPU: rank 0 alone runs the engine's step (fast path, both CFG branches batched) and the
  single-branch step;
- 2 GPUs: CFG-parallel (each rank one branch, whole sequence) and, for single-branch steps,
  Ulysses 2 (each rank half the tokens, half the heads);
- agreement: the 2-GPU velocities against rank 0's 1-GPU ones (relative L2 error; bf16 noise is ~1e-2).
Super (5120 / 64 layers / 64 heads, ~65B) is built sharded with FSDP2 (meta device, then each rank
fills only its rows) and timed CFG-parallel. Also the all-to-all and all-gather bandwidth, for the
4/8-GPU projection. Medians of CUDA-event-timed steps after one warm-up; one JSON file per run.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import bench  # noqa: E402, F401 - the engine's start-up settings (bench/__init__.py)

from cosmos3_kernels.timing import time_ms  # noqa: E402

NANO_WORKLOADS = [("Nano T2V 1280x720 189f", 1280, 720, 189), ("Nano T2V 832x480 121f", 832, 480, 121),
                  ("Nano T2I 1024x1024", 1024, 1024, 1)]
EDGE_WORKLOADS = [("Edge T2V 832x480 121f", 832, 480, 121)]
SUPER_WORKLOADS = [("Super T2V 832x480 121f", 832, 480, 121), ("Super T2V 1280x720 189f", 1280, 720, 189)]
SUPER = dict(hidden_size=5120, num_hidden_layers=64, num_attention_heads=64, num_key_value_heads=8, head_dim=128,
             intermediate_size=25600, rms_norm_eps=1e-6, rope_theta=5000000.0, hidden_act="silu",
             qk_norm_for_text=True, use_und_k_norm_for_gen=False, vocab_size=151936, action_gen=False,
             sound_gen=False, latent_channel=48, latent_patch_size=2, patch_latent_dim=192)


def timed_ms(fn, iters: int) -> float:
    """Median ms of `fn` on every rank, the ranks started together by a barrier before each sample
    (cosmos3_kernels.timing, after one warm-up call: dispatch measurements, graphs, allocator)."""
    return time_ms(fn, warmup=1, iters=iters, before=dist.barrier).median_ms


def rel_err(ours, theirs) -> float:
    return max(float((a.float() - b.float()).norm() / b.float().norm()) for a, b in zip(ours, theirs))


def bandwidth(rank: int, world: int) -> dict:
    """Bus bandwidth of all_to_all_single and all_gather over 256 MiB bf16 (nccl-tests' busbw)."""
    numel = 128 * 2**20
    x = torch.randn(numel, device="cuda", dtype=torch.bfloat16)
    out = torch.empty_like(x)
    a2a = timed_ms(lambda: dist.all_to_all_single(out, x), 5)
    parts = [torch.empty(numel // world, device="cuda", dtype=torch.bfloat16) for _ in range(world)]
    gather = timed_ms(lambda: dist.all_gather(parts, x[: numel // world]), 5)
    size = numel * 2
    factor = (world - 1) / world
    return {"all_to_all_busbw_GBps": size * factor / a2a / 1e6, "all_gather_busbw_GBps": size * factor / gather / 1e6,
            "bytes": size}


def replicated_family(family: str, workloads, context, report) -> None:
    from bench.models import as_loaded_model, build_transformer

    transformer = build_transformer(family, device=f"cuda:{context.rank}")
    model = as_loaded_model(transformer, family)
    for label, width, height, frames in workloads:
        row = {"workload": label}
        iters = 2 if frames > 121 else 3
        if context.rank == 0:
            model.parallel = None
            times, (reference, reference_solo) = measure(model, width, height, frames, iters, timed_ms_local)
            row.update(zip(ONE_GPU_KEYS, times))
            gc.collect()
            torch.cuda.empty_cache()
        dist.barrier()
        model.parallel = context
        times, (ours, ours_solo) = measure(model, width, height, frames, iters, timed_ms)
        row.update(zip(TWO_GPU_KEYS, times))
        if context.rank == 0:
            row["velocity_rel_err_cfg"] = rel_err(ours, reference)
            row["velocity_rel_err_solo"] = rel_err(ours_solo, reference_solo)
            row["scaling_cfg"] = row["step_1gpu_ms"] / (2 * row["step_2gpu_cfg_ms"])
            row["scaling_solo"] = row["solo_1gpu_ms"] / (2 * row["solo_2gpu_ulysses_ms"])
            report(row)
        del ours, ours_solo
        gc.collect()
        torch.cuda.empty_cache()
        dist.barrier()
    del model, transformer
    gc.collect()
    torch.cuda.empty_cache()


ONE_GPU_KEYS = ("prefill_1gpu_ms", "step_1gpu_ms", "solo_1gpu_ms", "peak_1gpu_GiB")
TWO_GPU_KEYS = ("prefill_2gpu_ms", "step_2gpu_cfg_ms", "solo_2gpu_ulysses_ms", "peak_2gpu_GiB")


def timed_prefill(model, width: int, height: int, frames: int):
    """The step inputs (prompt prefill included) and the ms they took, the GPU synchronized around them."""
    from bench.models import step_inputs

    torch.cuda.synchronize()
    began = time.perf_counter()
    inputs = step_inputs(model, width=width, height=height, frames=frames)
    torch.cuda.synchronize()
    return inputs, (time.perf_counter() - began) * 1000


def measure(model, width: int, height: int, frames: int, iters: int, timer):
    """One configuration as `model.parallel` is set: (prefill ms, engine-step ms, single-branch-step ms,
    peak GiB) in the order of ONE_GPU_KEYS / TWO_GPU_KEYS, and both steps' velocities (for the agreement).
    `timer` is timed_ms (all ranks together) or timed_ms_local (this rank alone); the inputs are freed on
    return."""
    torch.cuda.reset_peak_memory_stats()
    inputs, prefill_ms = timed_prefill(model, width, height, frames)
    step = timer(lambda: inputs.engine_step(), iters)
    solo = timer(lambda: _solo(inputs), iters)
    velocities = inputs.engine_step(), _solo(inputs)
    peak = torch.cuda.max_memory_allocated() / 2**30
    return (prefill_ms, step, solo, peak), velocities


def timed_ms_local(fn, iters: int) -> float:
    """Median ms of `fn` on this rank alone (cosmos3_kernels.timing, after one warm-up call)."""
    return time_ms(fn, warmup=1, iters=iters).median_ms


def _solo(inputs):
    """A single-branch step (guidance 1.0, distilled, or outside the guidance interval)."""
    from engine.pipeline.denoise import gen_tokens, velocity
    from engine.pipeline.fast_path import FastPathOptions
    from engine.pipeline.tower import make_gen_tower

    options = FastPathOptions.for_model(inputs.model)
    tower = make_gen_tower(inputs.model, inputs.cache, inputs.branches, options, inputs.layout)
    tokens = gen_tokens(inputs.model, inputs.layout, inputs.latents, inputs.timestep, options.enabled)
    return [velocity(inputs.model, inputs.layout, inputs.latents, out).vision for out in tower(tokens, 1)]


def super_sharded(context, report, workloads) -> None:
    from bench.models import as_loaded_model
    from engine.parallel.sharding import build_sharded_transformer, random_filler
    from engine.pipeline.fast_path import FastPathOptions

    torch.cuda.reset_peak_memory_stats()
    began = time.perf_counter()
    transformer = build_sharded_transformer(SUPER, context, torch.bfloat16, random_filler(context.rank, context.device))
    torch.cuda.synchronize()
    build_s = time.perf_counter() - began
    model = as_loaded_model(transformer, "super", fast_path=FastPathOptions(enabled=False))
    model.parallel = context
    weights_gib = torch.cuda.memory_allocated() / 2**30
    for label, width, height, frames in workloads:
        inputs, prefill = timed_prefill(model, width, height, frames)
        step = timed_ms(lambda: inputs.engine_step(), 1 if frames > 121 else 2)
        peak = torch.tensor([torch.cuda.max_memory_allocated() / 2**30], device=context.device)
        peaks = [torch.zeros_like(peak) for _ in range(context.world)]
        dist.all_gather(peaks, peak)
        if context.rank == 0:
            report({"workload": label, "scheme": "CFG 2, FSDP2 weights", "build_s": build_s,
                    "weights_per_gpu_GiB": weights_gib, "prefill_2gpu_ms": prefill, "step_2gpu_cfg_ms": step,
                    "peak_per_gpu_GiB": [round(float(p), 1) for p in peaks]})
        del inputs
        gc.collect()
        torch.cuda.empty_cache()


def rank_main(rank: int, world: int, port: int, out: str, sections: list[str]) -> None:
    from engine.parallel.group import GroupContext

    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=timedelta(minutes=9), device_id=torch.device("cuda", rank))
    context = GroupContext.create(rank, world, torch.device("cuda", rank))
    results = {"torch": torch.__version__, "gpu": torch.cuda.get_device_name(0), "world": world, "rows": []}
    path = Path(out) / "bench_parallel.json"

    def report(row):
        row = {k: (round(v, 4) if isinstance(v, float) else v) for k, v in row.items()}
        print(json.dumps(row), flush=True)
        results["rows"].append(row)
        path.write_text(json.dumps(results, indent=1))

    steps = {"bandwidth": lambda: report({"workload": "bandwidth", **bandwidth(rank, world)}),
             "nano": lambda: replicated_family("nano", NANO_WORKLOADS, context, report),
             "edge": lambda: replicated_family("edge", EDGE_WORKLOADS, context, report),
             "super": lambda: super_sharded(context, report, SUPER_WORKLOADS)}
    for name in sections:
        try:
            steps[name]()
        except Exception as exc:  # noqa: BLE001 - one section failing leaves the others' numbers
            if rank == 0:
                report({"workload": name, "error": f"{type(exc).__name__}: {exc}"[:800]})
            raise
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="outputs/bench")
    parser.add_argument("--sections", default="bandwidth,nano,super,edge")
    args = parser.parse_args()
    Path(args.out).mkdir(parents=True, exist_ok=True)
    world = torch.cuda.device_count()
    from engine.parallel.runtime import free_port

    torch.multiprocessing.spawn(rank_main, args=(world, free_port(), args.out, args.sections.split(",")),
                                nprocs=world)


if __name__ == "__main__":
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    main()
