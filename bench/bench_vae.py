"""Wan2.2 VAE decode at full size: the plain diffusers decode against cheap speedups, same latents.

    python bench/bench_vae.py          # on the GPU, about 2 minutes

Variants: cuDNN autotuning (`torch.backends.cudnn.benchmark`), channels-last-3d weights and input, and
both. Each is timed (median of 3 CUDA-event runs after one warm-up) and compared with the plain decode
(max abs difference on the [-1, 1] output), so a speedup that changes the picture shows up here.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.models import build_vae  # noqa: E402
from kernels.timing import time_ms  # noqa: E402

CASES = (("image 1024x1024", 1, 1024, 1024), ("video 832x480 121f", 121, 480, 832))


def _set_format(module, channels_last: bool) -> None:
    """Conv3d weights to channels-last-3d (or back); other parameters keep their layout."""
    layout = torch.channels_last_3d if channels_last else torch.contiguous_format
    for param in module.parameters():
        if param.dim() == 5:
            param.data = param.data.contiguous(memory_format=layout)


def _time(fn, iters=3):
    """Median ms of `fn` after one warm-up (kernels.timing), and its last output."""
    held = {}
    timing = time_ms(lambda: held.__setitem__("out", fn()), warmup=1, iters=iters)
    return timing.median_ms, held["out"]


@torch.no_grad()
def main() -> int:
    vae = build_vae("cuda")
    rows = []
    for label, frames, height, width in CASES:
        generator = torch.Generator(device="cuda").manual_seed(0)
        latent = torch.randn(1, 48, (frames - 1) // 4 + 1, height // 16, width // 16, device="cuda",
                             dtype=vae.dtype, generator=generator)
        iters = 3 if frames == 1 else 2
        torch.backends.cudnn.benchmark = False
        _set_format(vae, False)
        plain_ms, plain = _time(lambda: vae.decode(latent).sample, iters)
        plain = plain.float()
        rows.append({"decode": label, "variant": "plain", "ms": plain_ms, "max_abs_diff": 0.0})
        for variant, benchmark, channels_last in (("cudnn.benchmark", True, False), ("channels_last_3d", False, True),
                                                  ("both", True, True)):
            torch.backends.cudnn.benchmark = benchmark
            _set_format(vae, channels_last)
            z = latent.contiguous(memory_format=torch.channels_last_3d) if channels_last else latent
            ms, out = _time(lambda: vae.decode(z).sample, iters)
            rows.append({"decode": label, "variant": variant, "ms": ms,
                         "max_abs_diff": float((out.float() - plain).abs().max())})
            print(json.dumps(rows[-1]), flush=True)
        del latent, plain
        torch.cuda.empty_cache()
    print("| decode | variant | ms | speedup | max abs diff vs plain |\n|---|---|---|---|---|")
    base = {r["decode"]: r["ms"] for r in rows if r["variant"] == "plain"}
    for r in rows:
        print(f"| {r['decode']} | {r['variant']} | {r['ms']:.1f} | {base[r['decode']] / r['ms']:.2f}x | {r['max_abs_diff']:.1e} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
