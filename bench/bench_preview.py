"""What a live preview costs on the GPU, beside the denoising step it rides on, in one run.

    python bench/bench_preview.py                    # H200: Nano and Edge, image and video shapes
    python bench/bench_preview.py --families edge    # the quicker half
    python bench/bench_preview.py --smoke            # tiny dims on the CPU: checks the script only

For each workload: one denoising step on the fast tower (both CFG branches, as bench_engine times it)
and one preview (`engine.pipeline.preview.preview_image`: the x0 latent pooled 2x, a few latent frames decoded
on their own), both medians of CUDA-event-timed runs on the same random full-size weights. The cost
per run is previews x preview time over steps x step time, with the family's default steps and
`engine.pipeline.preview.preview_steps` (the same plan `generate` uses).
"""
from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.bench_engine import WORKLOADS, timed  # noqa: E402
from bench.models import as_loaded_model, build_transformer, build_vae, step_inputs  # noqa: E402
from engine.model.defaults import FAMILY_TABLE  # noqa: E402
from engine.pipeline.tower import make_gen_tower  # noqa: E402
from engine.pipeline.preview import preview_image, preview_steps  # noqa: E402


def bench_family(family: str, device: str, iters: int, smoke: bool) -> list[dict]:
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    transformer = build_transformer(family, device=device, dtype=dtype)
    model = as_loaded_model(transformer, family)
    vae = build_vae(device, dtype)
    if smoke:
        model.transformer.config.rope_axes_dim = [8, 4, 4]
    rows = []
    for label, width, height, frames in WORKLOADS[family]:
        if smoke:
            width, height, frames = 64, 64, 1 if frames == 1 else 5
        inputs = step_inputs(model, width=width, height=height, frames=frames,
                             prefix_lens=(20, 31) if smoke else (1615, 2866))
        with torch.no_grad():
            tower = make_gen_tower(model, inputs.cache, inputs.branches, layout=inputs.layout)
            step = timed(lambda: inputs.engine_step(tower), 2, iters)
            x0 = inputs.latents.vision
            preview = timed(lambda: preview_image(vae, x0), 1, iters)
        table = FAMILY_TABLE[family]
        steps = (table.image if frames == 1 else table.video).steps
        count = len(preview_steps(steps))
        share = count * preview["median_ms"] / (steps * step["median_ms"])
        row = {"workload": label, "step_ms": step, "preview_ms": preview, "steps": steps, "previews": count,
               "preview_per_step_pct": round(100 * preview["median_ms"] / step["median_ms"], 2),
               "run_cost_pct": round(100 * share, 2), "tower": type(tower).__name__}
        print(json.dumps(row), flush=True)
        rows.append(row)
        del tower, inputs
        gc.collect()
        if device == "cuda":
            torch.cuda.empty_cache()
    del model, transformer, vae
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--families", default="nano,edge")
    parser.add_argument("--iters", type=int, default=5)
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    device = "cuda" if torch.cuda.is_available() and not args.smoke else "cpu"
    if args.smoke:
        from bench import models

        for spec in models.TRANSFORMERS.values():
            spec.update(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                        head_dim=32, intermediate_size=128, vocab_size=1000)
        models.WAN22_VAE.update(base_dim=16, decoder_base_dim=16)
    header = {"date": time.strftime("%Y-%m-%d"), "torch": torch.__version__,
              "gpu": torch.cuda.get_device_name() if device == "cuda" else "cpu (smoke)"}
    print(json.dumps(header), flush=True)
    rows = [row for family in args.families.split(",") for row in bench_family(family, device, args.iters, args.smoke)]
    print("| workload | step (ms) | preview (ms) | preview / step | previews per run | cost per run |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['workload']} | {r['step_ms']['median_ms']:.1f} | {r['preview_ms']['median_ms']:.1f} | "
              f"{r['preview_per_step_pct']:.1f}% | {r['previews']} of {r['steps']} steps | {r['run_cost_pct']:.2f}% |")
    if args.json:
        Path(args.json).write_text(json.dumps({"header": header, "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
