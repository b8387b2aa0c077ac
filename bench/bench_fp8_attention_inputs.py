"""FP8 attention's error on a tower's own attention inputs, with v centred and not (CPU, fp32, minutes).

The GPU bench (bench_attention_fp8.py) times the op on synthetic inputs; what centring v buys depends on the
inputs, so this one takes them from diffusers' forward of a full-size random-weight tower: every generation
attention call (gen queries over [prompt | gen] keys) of one branch is captured, and
`cosmos3_kernels.attention_fp8.prefix_attention_fp8_reference` (the op's model of cuDNN's roundings) runs on it both
ways, each against fp32 attention (`prefix_attention_reference`). Per layer it also reports how far v's mean
over the keys stands out from v's spread, and how close the exact output lies to that mean, which is what
centring works on (cosmos3_kernels/attention_fp8.py says why).

    python3 bench/bench_fp8_attention_inputs.py --family edge --size 640x640x1 --json $OUT/edge.json
    python3 bench/bench_fp8_attention_inputs.py --family nano --size 832x480x17 --layers 4 --json $OUT/nano.json

`--layers N` builds only the first N layers (Nano's 36 do not fit 24 GiB in fp32); the inputs of layer i do
not depend on the layers after it.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import models  # noqa: E402
from bench.e2e import run_header  # noqa: E402
from cosmos3_kernels.attention_fp8 import prefix_attention_fp8_reference  # noqa: E402
from cosmos3_kernels.packed_kv import PackedKVLayout  # noqa: E402
from cosmos3_kernels.prefix_attention import prefix_attention_reference  # noqa: E402

PROMPT_TOKENS = 301  # the gate's first branch (bench_fp8.GATE_PREFIXES)


def capture_gen_attention(family: str, size: tuple[int, int, int], layers: int | None) -> list[tuple]:
    """(q [N, Hq, D], k [L, Hk, D], v [L, Hk, D]) in fp32 of every generation attention call of one forward."""
    import diffusers.models.transformers.transformer_cosmos3 as cosmos3

    full = models.TRANSFORMERS[family]
    models.TRANSFORMERS[family] = dict(full, num_hidden_layers=layers or full["num_hidden_layers"])
    try:
        transformer = models.build_transformer(family, device="cpu", dtype=torch.float32)
    finally:
        models.TRANSFORMERS[family] = full
    model = models.as_loaded_model(transformer, family)
    captured, original = [], cosmos3.dispatch_attention_fn

    def spy(query, key, value, is_causal=False, **kwargs):
        if not is_causal:  # the generation pathway; the prompt's own causal attention is not FP8's
            captured.append((query[0].float().clone(), key[0].float().clone(), value[0].float().clone()))
        return original(query, key, value, is_causal=is_causal, **kwargs)

    cosmos3.dispatch_attention_fn = spy
    try:
        with torch.no_grad():
            width, height, frames = size
            inputs = models.step_inputs(model, width=width, height=height, frames=frames, prefix_lens=(PROMPT_TOKENS,))
            transformer(**inputs.diffusers_kwargs(inputs.branches[0]))
    finally:
        cosmos3.dispatch_attention_fn = original
    return captured


def layer_errors(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> dict:
    layout = PackedKVLayout((k.shape[0] - q.shape[0],), q.shape[0])
    kv = torch.stack([k, v])
    exact = prefix_attention_reference(q[None], kv, layout)[0]
    v_mean = v.mean(0)

    def error(centred: bool) -> float:
        ours = prefix_attention_fp8_reference(q[None].bfloat16(), kv.bfloat16(), layout, centred=centred)[0]
        return float((ours.float() - exact).norm() / exact.norm())

    groups = q.shape[1] // k.shape[1]
    return {"keys": k.shape[0],
            "v_mean_over_spread": float(v_mean.norm() * math.sqrt(v.shape[0]) / (v - v_mean).norm()),
            "output_off_mean": float((exact - v_mean.repeat_interleave(groups, 0)).norm() / exact.norm()),
            "centred": error(True), "not_centred": error(False)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--family", default="edge", choices=sorted(models.TRANSFORMERS))
    parser.add_argument("--size", default="640x640x1", help="WxHxF of the step")
    parser.add_argument("--layers", type=int, default=None, help="build only the first N layers")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    size = tuple(int(x) for x in args.size.split("x"))
    began = time.perf_counter()
    results = {"header": run_header("cpu"), "family": args.family, "size": list(size), "prompt_tokens": PROMPT_TOKENS,
               "layers": []}
    for index, (q, k, v) in enumerate(capture_gen_attention(args.family, size, args.layers)):
        row = {"layer": index, **layer_errors(q, k, v)}
        results["layers"].append(row)
        print(json.dumps({key: round(val, 4) if isinstance(val, float) else val for key, val in row.items()}), flush=True)
    for key in ("centred", "not_centred"):
        results[f"rms_{key}"] = math.sqrt(sum(r[key] ** 2 for r in results["layers"]) / len(results["layers"]))
    results["wall_s"] = time.perf_counter() - began
    print(json.dumps({k: results[k] for k in ("rms_centred", "rms_not_centred", "wall_s")}), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
