"""How long flash-attn-4's first call takes in a fresh process, with and without its on-disk kernel cache.

flash-attn-4 compiles each kernel variant (JIT, CuTe DSL) on first use in a process. Its cache
(`FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED=1`, folder `FLASH_ATTENTION_CUTE_DSL_CACHE_DIR`) keeps the compiled
kernels on disk, so a restarted server loads them instead. This runs three fresh processes over one empty
cache folder: cache off, cache on and empty (compiles and writes), cache on and filled (loads). Each times the
first and second call of every config in `DEFAULT_FLASH4_CONFIGS` at one Nano shape.

    python3 bench/bench_flash4_cache.py [--json PATH]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def child() -> None:
    """In a fresh process: time the first two calls of each default config (import included in the first)."""
    began = time.perf_counter()
    import torch

    sys.path.insert(0, str(ROOT))
    from cosmos3_kernels import prefix_attention as pa
    from cosmos3_kernels.packed_kv import PackedKVLayout

    layout = PackedKVLayout((1615, 2866), 12090)
    q = torch.randn(2, 12090, 32, 128, dtype=torch.bfloat16, device="cuda")
    buf = torch.randn(2, layout.total_rows, 8, 128, dtype=torch.bfloat16, device="cuda")
    out = torch.empty_like(q)
    torch.cuda.synchronize()
    rows = {"torch_ready_s": time.perf_counter() - began}
    for config in pa.DEFAULT_FLASH4_CONFIGS:
        calls = []
        for _ in range(2):
            t0 = time.perf_counter()
            pa.prefix_attention_flash4(q, buf, layout, out=out, config=config)
            torch.cuda.synchronize()
            calls.append(time.perf_counter() - t0)
        rows[config.label] = {"first_call_s": calls[0], "second_call_s": calls[1]}
    print(json.dumps(rows))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", default=None)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child()
        return 0
    sys.path.insert(0, str(ROOT))
    from cosmos3_kernels import prefix_attention as pa  # torch and triton only: flash-attn-4 is imported in the children

    results = {}
    with tempfile.TemporaryDirectory() as cache:
        for label, enabled in (("cache off", "0"), ("cache on, empty", "1"), ("cache on, filled", "1")):
            env = dict(os.environ, FLASH_ATTENTION_CUTE_DSL_CACHE_DIR=cache)
            env[pa.FLASH4_CACHE_ENV_VAR] = enabled  # the engine's default is on; each process here says which
            done = subprocess.run([sys.executable, __file__, "--child"], env=env, capture_output=True, text=True)
            if done.returncode != 0:
                results[label] = f"failed: {done.stderr.strip().splitlines()[-1] if done.stderr.strip() else done.returncode}"
            else:
                results[label] = json.loads(done.stdout.strip().splitlines()[-1])
            print(label, results[label], flush=True)
        results["cache_files"] = sum(1 for p in Path(cache).rglob("*") if p.is_file())
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
