"""Which launch arguments make our Triton kernels compile a new variant, and what a compile costs.

Triton specialises a kernel on some integer arguments (e.g. whether one is divisible by 16), so a request
whose arguments fall into a new class pays a compile (or a disk-cache load) on the user's time. This calls
the prefix-attention kernel (both default launch configs) and the QK-norm+RoPE+pack kernel at Edge's T2I
shapes, varying the gen-token count (400 = 640x640, divisible by 16; 390 = 832x480) and the text length
(hence the packed buffer's row count, which is the TMA descriptor's shape), and prints each call's wall
time and the kernel's number of compiled variants. Use a fresh TRITON_CACHE_DIR to see compile times.

    TRITON_CACHE_DIR=$(mktemp -d) python3 bench/bench_triton_variants.py
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cosmos3_kernels import prefix_attention as pa, qk_norm_rope as qk  # noqa: E402
from cosmos3_kernels.dispatch import DEFAULT_ATTENTION_CONFIGS  # noqa: E402
from cosmos3_kernels.packed_kv import PackedKVLayout  # noqa: E402

TEXT_LENGTHS = (1077, 1078, 1076, 1092, 161, 162)  # row counts 0, 1, 15, 15, 12, 13 mod 16 at 400 gen tokens
NEGATIVE_LENGTH = 59


def variants(kernel) -> int:
    """Compiled variants of a @triton.jit kernel in this process (all devices)."""
    return sum(len(cache[0]) for cache in kernel.device_caches.values())


def main() -> int:
    if not torch.cuda.is_available():
        sys.exit("bench_triton_variants needs CUDA: it counts compiled GPU kernels")
    dt = torch.bfloat16
    for n_gen in (400, 390):
        q = torch.randn(2, n_gen, 16, 128, device="cuda", dtype=dt)
        k = torch.randn(2, n_gen, 8, 128, device="cuda", dtype=dt)
        v = torch.randn_like(k)
        weight = torch.rand(128, device="cuda", dtype=dt) + 0.5
        cos = torch.randn(2, n_gen, 128, device="cuda", dtype=dt)
        for text in TEXT_LENGTHS:
            layout = PackedKVLayout((text, NEGATIVE_LENGTH), n_gen)
            buffer = layout.allocate(8, 128, dtype=dt, device="cuda").normal_()
            for config in DEFAULT_ATTENTION_CONFIGS:
                began = time.perf_counter()
                pa.prefix_attention(q, buffer, layout, config=config)
                torch.cuda.synchronize()
                print(f"attention n_gen={n_gen} rows={layout.total_rows} rows%16={layout.total_rows % 16} "
                      f"block_m={config.block_m}: {time.perf_counter() - began:.3f} s, "
                      f"variants {variants(pa._prefix_attention_kernel)}", flush=True)
            began = time.perf_counter()
            qk.qk_norm_rope_pack(q, k, v, weight, weight, cos, cos, buffer, layout, eps=1e-6, flavour="nemotron",
                                 round_norm_before_rope=True)
            torch.cuda.synchronize()
            print(f"qk n_gen={n_gen} rows%16={layout.total_rows % 16}: {time.perf_counter() - began:.3f} s, "
                  f"variants {variants(qk._qk_norm_rope_pack_kernel)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
