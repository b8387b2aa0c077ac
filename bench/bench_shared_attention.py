"""The first layer's attention with its gen block shared by the CFG branches, against one call over every branch.

    python bench/bench_shared_attention.py --json $OUT/shared_attention.json     # ~1 min on an H200

`cosmos3_kernels.shared_gen_attention` computes the gen-to-gen block once (flash-attn-4, the branch-0 queries and keys),
each branch's prefix block on its own, and joins them with a Triton combine. Against it: flash-attn-4 over both
branches in one varlen call, as every other layer runs (each config dispatch offers). Nano's and Edge's heads,
gen tokens of 720p/189f (44160) and 480p/121f (12090), prefixes 1606 and 59. The operands are the first layer's:
every branch holds the same gen queries, keys and values. Error: relative L2 against fp32 attention over each
branch's own rows, on the first --rows queries of every branch (`bench_attention_fp8.error_vs_fp32`).

Timing: interleaved rounds, as in bench_flashinfer.py. A step shares one layer, so `saved_ms_per_step` is the
fastest one-call time less the fastest shared time.

`step`: one whole denoising step of the engine's fast tower with the pass off and on
(`FastPathOptions.share_first_attention`), interleaved in one process (`bench.step_ab`): full-size random Nano at
1280x720/189f and Edge at 832x480/121f (--step-shapes). Also the two velocities' relative difference. ~3 min on an
H200.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.bench_attention_fp8 import error_vs_fp32  # noqa: E402
from bench.bench_flashinfer import (HEAD_DIM, HEADS, PREFIXES, SHAPES, add_common_args, attention_flops,  # noqa: E402
                                    chosen_sections, interleaved)
from bench.e2e import run_header  # noqa: E402
from bench.step_ab import step_ab_rows  # noqa: E402
from cosmos3_kernels import prefix_attention as pa, shared_gen_attention as sga  # noqa: E402
from cosmos3_kernels.packed_kv import PackedKVLayout  # noqa: E402

SECTIONS = ("first_layer", "step")
STEP_SHAPES = "nano:1280x720x189,edge:832x480x121"


def first_layer_operands(layout: PackedKVLayout, hq: int, hkv: int, seed: int = 0, device: str = "cuda"):
    """q [B, N, Hq, D] and the packed buffer as the first layer has them: one gen block in every branch."""
    g = torch.Generator(device=device).manual_seed(seed)
    n = layout.gen_len
    q = torch.randn(1, n, hq, HEAD_DIM, dtype=torch.bfloat16, device=device, generator=g)
    q = q.expand(layout.num_branches, -1, -1, -1).contiguous()
    kv = torch.randn(2, layout.rows, hkv, HEAD_DIM, dtype=torch.bfloat16, device=device, generator=g)
    gen0 = layout.gen_offset(0)
    for b in range(1, layout.num_branches):
        gen = layout.gen_offset(b)
        kv[:, gen:gen + n] = kv[:, gen0:gen0 + n]
    return q, kv


def first_layer_rows(rounds: int, inner: int, error_rows: int) -> list[dict]:
    """`first_layer` (module docstring): one row per (model, shape)."""
    rows = []
    probe = torch.empty(1, 1, 1, HEAD_DIM, dtype=torch.bfloat16, device="cuda")
    why = sga.shared_unsupported(probe)
    if why is not None:
        raise SystemExit(f"the shared attention cannot run here: {why}")
    configs = pa.flash4_configs_for(probe, pa.DEFAULT_FLASH4_CONFIGS)
    for model, (hq, hkv) in HEADS.items():
        for label, gen in SHAPES.items():
            layout = PackedKVLayout(PREFIXES, gen)
            q, kv = first_layer_operands(layout, hq, hkv)
            outputs = {"one call": torch.empty_like(q), "shared": torch.empty_like(q)}
            candidates = {}
            for config in configs:
                candidates[f"one call {config.label}"] = (
                    lambda config=config: pa.prefix_attention_flash4(q, kv, layout, out=outputs["one call"], config=config))
                candidates[f"shared {config.label}"] = (
                    lambda config=config: sga.shared_gen_attention_flash4(q, kv, layout, out=outputs["shared"], config=config))
            for fn in candidates.values():  # compiles, and leaves each output written by its last config
                fn()
            torch.cuda.synchronize()
            row = {"model": model, "shape": label, "gen_tokens": gen, "prefixes": list(PREFIXES)}
            row["rel_error_vs_fp32"] = {name: error_vs_fp32(out, q, kv, layout, error_rows) for name, out in outputs.items()}
            ms = interleaved(candidates, rounds, inner)
            flops = attention_flops(gen, [layout.kv_len(b) for b in range(layout.num_branches)], hq)
            row["ms"] = ms
            row["tflops_of_the_unshared_work"] = {name: flops / t / 1e9 for name, t in ms.items()}
            one = min(t for name, t in ms.items() if name.startswith("one call"))
            shared = min(t for name, t in ms.items() if name.startswith("shared"))
            row["fastest_one_call_ms"], row["fastest_shared_ms"] = one, shared
            row["speedup"] = one / shared
            row["saved_ms_per_step"] = one - shared
            print(json.dumps(row), flush=True)
            rows.append(row)
            del q, kv, outputs
            torch.cuda.empty_cache()
    return rows


def step_rows(shapes: str, rounds: int) -> list[dict]:
    """`step` (module docstring): one row per family and shape, the pass off first (the baseline)."""
    from engine.pipeline.fast_path import FastPathOptions
    from engine.pipeline.tower import make_gen_tower

    def tower(share: bool):
        return lambda model, inputs: make_gen_tower(model, inputs.cache, inputs.branches,
                                                    FastPathOptions(enabled=True, share_first_attention=share),
                                                    inputs.layout)

    def describe(model) -> dict:
        dispatch = model.runtime.dispatchers.get("auto")
        return {"dispatch": [
            dict(key=str(k), path=d.backend, reason=d.reason, shared_ms=d.ms.get("flash4"),
                 regular_ms=d.ms.get("regular"), config=d.config.label if d.config else None)
            for k, d in (dispatch.decisions().items() if dispatch else ()) if k[0] == "shared_gen_attention"]}

    return step_ab_rows(shapes, rounds, {"one call": tower(False), "shared": tower(True)}, describe=describe)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_args(parser, SECTIONS)
    parser.add_argument("--rows", type=int, default=256, help="queries per branch checked against fp32")
    parser.add_argument("--step-shapes", default=STEP_SHAPES, help="`step`: family:WxHxF, comma-separated")
    parser.add_argument("--step-rounds", type=int, default=3)
    args = parser.parse_args(argv)
    sections = chosen_sections(parser, args.sections, SECTIONS)
    if not torch.cuda.is_available():
        parser.error("the shared attention's kernels need a CUDA GPU with flash-attn-4; this machine has none")
    results = {"header": run_header(torch.cuda.get_device_name())}
    print(json.dumps(results["header"]), flush=True)
    runs = {"first_layer": lambda: first_layer_rows(args.rounds, args.inner, args.rows),
            "step": lambda: step_rows(args.step_shapes, args.step_rounds)}
    for section in sections:
        results[section] = runs[section]()
        if args.json:
            Path(args.json).write_text(json.dumps(results, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
