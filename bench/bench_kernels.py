"""Micro-benchmarks: each gen-tower kernel against its PyTorch path, on the GPU in hand.

    python3 bench/bench_kernels.py --out DIR          # the H200 run recorded in docs/perf-log/2026-12-02.md
    TRITON_INTERPRET=1 python3 bench/bench_kernels.py --smoke   # tiny shapes on a CPU: code paths only

Method (docs/perf-log/2026-12-02.md): ceilings measured first in the same process (device-to-device copy,
counting bytes read + written; an 8192^3 bf16 matmul on random data); every variant warmed up, then
timed with CUDA events around ``inner`` back-to-back calls (enough for ~1 ms) and reported as the median
over ``iters`` samples with the 10th-90th percentile spread. Inputs are random, never zeros. Small
shapes stay in L2 between calls for every variant alike.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import bench  # noqa: E402, F401 - the engine's start-up settings (bench/__init__.py)

from cosmos3_kernels import norms, prefix_attention as pa, qk_norm_rope as qk  # noqa: E402
from cosmos3_kernels.dispatch import KernelDispatcher  # noqa: E402
from cosmos3_kernels.packed_kv import PackedKVLayout  # noqa: E402
from cosmos3_kernels.timing import Timing, time_ms  # noqa: E402

MODELS = {"Nano": dict(hq=32, hkv=8, d=128, hidden=4096, inter=12288, flavour="diffusers"),
          "Edge": dict(hq=16, hkv=8, d=128, hidden=2048, inter=9216, flavour="nemotron")}
GEN_TOKENS = (400, 1024, 12090, 44160)
PREFIXES = (1615, 2866)  # the JSON prompt and the JSON negative prompt (CFG branches)
SMOKE_MODELS = {"Tiny": dict(hq=4, hkv=2, d=16, hidden=64, inter=96, flavour="diffusers")}

ATTN_SWEEP = (
    pa.AttentionConfig(128, 128, 8, 3, use_tma=True),
    pa.AttentionConfig(64, 64, 4, 3, use_tma=True),
    pa.AttentionConfig(128, 64, 4, 3, use_tma=True),
    pa.AttentionConfig(128, 128, 8, 2, use_tma=True),
    pa.AttentionConfig(128, 64, 4, 3, use_tma=False),
    pa.AttentionConfig(128, 128, 8, 3, use_tma=False),
    pa.AttentionConfig(64, 64, 4, 3, use_tma=False),
    # Triton's automatic warp specialisation (producer/consumer warp groups, as FA3): issue 17 point 3.
    pa.AttentionConfig(128, 128, 8, 3, use_tma=True, warp_specialize=True),
    pa.AttentionConfig(128, 128, 4, 3, use_tma=True, warp_specialize=True),
    pa.AttentionConfig(128, 64, 4, 3, use_tma=True, warp_specialize=True),
)
# (block_t, num_warps, heads_per_program) for the QK kernel
QK_SWEEP = ((16, 4, 1), (32, 4, 1), (16, 4, 8), (32, 4, 8), (16, 2, 8), (32, 8, 8), (64, 8, 8), (8, 2, 8))


def cfg_label(c: pa.AttentionConfig) -> str:
    return f"{c.block_m}x{c.block_n}w{c.num_warps}s{c.num_stages}{'tma' if c.use_tma else ''}{'ws' if c.warp_specialize else ''}"


@dataclass
class Env:
    smoke: bool
    iters: int
    warmup: int
    results: dict = field(default_factory=dict)


def timed(env: Env, fn: Callable[[], object]) -> Timing:
    """Median per-call time (and p10-p90); CUDA events around a batch of calls sized to ~1 ms (cosmos3_kernels.timing)."""
    if env.smoke:  # CPU code-path check only: one call, the numbers mean nothing
        return time_ms(fn, warmup=0, iters=1)
    return time_ms(fn, warmup=env.warmup, iters=env.iters, inner="auto")


def device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


# --------------------------------------------------------------------------------------------------
# Ceilings
# --------------------------------------------------------------------------------------------------
def measure_ceilings(env: Env) -> dict:
    if env.smoke:
        return {"copy_tb_s": 4.3, "matmul_tflop_s": 790.0, "note": "smoke: assumed"}
    x = torch.randn(2**29, dtype=torch.bfloat16, device="cuda")  # 1 GiB
    y = torch.empty_like(x)
    t = timed(env, lambda: y.copy_(x))
    copy = 2 * x.numel() * 2 / (t.median_ms * 1e-3) / 1e12
    del x, y
    a = torch.randn(8192, 8192, dtype=torch.bfloat16, device="cuda")
    b = torch.randn(8192, 8192, dtype=torch.bfloat16, device="cuda")
    t = timed(env, lambda: a @ b)
    mm = 2 * 8192**3 / (t.median_ms * 1e-3) / 1e12
    return {"copy_tb_s": round(copy, 2), "matmul_tflop_s": round(mm, 1)}


# --------------------------------------------------------------------------------------------------
# QK-norm + RoPE + pack
# --------------------------------------------------------------------------------------------------
def _rope(batch: int, n: int, d: int, dtype) -> tuple[torch.Tensor, torch.Tensor]:
    ang = torch.rand(batch, n, d // 2, device=device()) * 100
    ang = torch.cat([ang, ang], dim=-1)
    return ang.cos().to(dtype), ang.sin().to(dtype)


def split_path_with_cat(q, k, v, qw, kw, cos, sin, k_prefix, v_prefix, eps, flavour):
    """diffusers' step: norm, rotary (batched over branches here, one pass each), then cat per branch."""
    c, s = cos[:, :, None, :], sin[:, :, None, :]
    q_rot = qk.apply_rope_reference(qk.rms_norm_reference(q, qw, eps, flavour), c, s)
    k_rot = qk.apply_rope_reference(qk.rms_norm_reference(k, kw, eps, flavour), c, s)
    packed = [(torch.cat([k_prefix[b], k_rot[b]]), torch.cat([v_prefix[b], v[b]])) for b in range(q.shape[0])]
    return q_rot, packed


def bench_qk(env: Env, models: dict, gen_tokens, prefixes, ceilings, launch: dict) -> list[dict]:
    rows = []
    dt = torch.bfloat16
    for name, cfg in models.items():
        for n in gen_tokens:
            batch = len(prefixes)
            layout = PackedKVLayout(prefixes, n)
            hq, hkv, d = cfg["hq"], cfg["hkv"], cfg["d"]
            q = torch.randn(batch, n, hq, d, dtype=dt, device=device())
            k = torch.randn(batch, n, hkv, d, dtype=dt, device=device())
            v = torch.randn(batch, n, hkv, d, dtype=dt, device=device())
            qw = torch.rand(d, device=device()).to(dt) + 0.5
            kw = torch.rand(d, device=device()).to(dt) + 0.5
            cos, sin = _rope(batch, n, d, dt)
            buf = layout.allocate(hkv, d, dtype=dt, device=device()).normal_()
            k_pre = [layout.branch_kv(buf, b)[0][: prefixes[b]].clone() for b in range(batch)]
            v_pre = [layout.branch_kv(buf, b)[1][: prefixes[b]].clone() for b in range(batch)]
            q_out = torch.empty_like(q)
            flav = cfg["flavour"]
            args = (q, k, v, qw, kw, cos, sin, buf, layout)
            t_split = timed(env, lambda: split_path_with_cat(q, k, v, qw, kw, cos, sin, k_pre, v_pre, 1e-6, flav))
            t_torch = timed(env, lambda: qk.qk_norm_rope_pack_reference(*args, eps=1e-6, flavour=flav, q_out=q_out))
            # bytes the op cannot avoid: q, k, v read and written once, cos and sin read once
            act = batch * n * (hq + 2 * hkv) * d * 2
            nbytes = 2 * act + 2 * batch * n * d * 2
            for rnd in (True, False):
                t_fused = timed(env, lambda: qk.qk_norm_rope_pack(*args, eps=1e-6, flavour=flav,
                                                                  round_norm_before_rope=rnd, q_out=q_out, **launch))
                gbs = nbytes / (t_fused.median_ms * 1e-3) / 1e9
                rows.append(dict(
                    model=name, gen=n, branches=batch, rounded=rnd, split_cat=t_split.fmt(), torch_path=t_torch.fmt(),
                    fused=t_fused.fmt(), speedup_vs_split=t_split.median_ms / t_fused.median_ms,
                    speedup_vs_torch_path=t_torch.median_ms / t_fused.median_ms, fused_gb_s=gbs,
                    pct_copy_ceiling=100 * gbs / (ceilings["copy_tb_s"] * 1e3),
                ))
            del q, k, v, buf, k_pre, v_pre, q_out, cos, sin
    return rows


def sweep_qk(env: Env, models: dict, n: int, prefixes) -> list[dict]:
    cfg = next(iter(models.values()))
    dt = torch.bfloat16
    layout = PackedKVLayout(prefixes, n)
    batch = len(prefixes)
    q = torch.randn(batch, n, cfg["hq"], cfg["d"], dtype=dt, device=device())
    k = torch.randn(batch, n, cfg["hkv"], cfg["d"], dtype=dt, device=device())
    v = torch.randn_like(k)
    w = torch.rand(cfg["d"], device=device()).to(dt) + 0.5
    cos, sin = _rope(batch, n, cfg["d"], dt)
    buf = layout.allocate(cfg["hkv"], cfg["d"], dtype=dt, device=device())
    q_out = torch.empty_like(q)
    out = []
    for block_t, warps, hpp in QK_SWEEP:
        for rnd in (True, False):
            t = timed(env, lambda: qk.qk_norm_rope_pack(q, k, v, w, w, cos, sin, buf, layout, eps=1e-6,
                                                        round_norm_before_rope=rnd, q_out=q_out, block_t=block_t,
                                                        num_warps=warps, heads_per_program=hpp))
            out.append(dict(block_t=block_t, num_warps=warps, heads_per_program=hpp, rounded=rnd, ms=t.fmt(),
                            median_ms=t.median_ms))
    return out


# --------------------------------------------------------------------------------------------------
# Prefix attention
# --------------------------------------------------------------------------------------------------
def _sdpa_branches(q, buf, layout):
    """Per-branch SDPA calls on views of the packed buffer, as the PyTorch path runs them."""
    calls = []
    for b in range(layout.num_branches):
        k_b, v_b = layout.branch_kv(buf, b)
        calls.append((q[b : b + 1].transpose(1, 2), k_b.unsqueeze(0).transpose(1, 2), v_b.unsqueeze(0).transpose(1, 2)))

    def run():
        for qq, kk, vv in calls:
            F.scaled_dot_product_attention(qq, kk, vv, enable_gqa=True)

    return run


def _sdpa_timing(env: Env, backend, run) -> Timing | str:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    if env.smoke and backend is not None:
        return "n/a (smoke)"
    try:
        if backend is None:
            return timed(env, run)
        with sdpa_kernel(getattr(SDPBackend, backend)):
            return timed(env, run)
    except RuntimeError as err:  # a backend that refuses this shape: report it, do not hide it
        return f"n/a ({str(err).splitlines()[0][:60]})"


def bench_attention(env: Env, models: dict, cases, configs, ceilings) -> list[dict]:
    rows = []
    dt = torch.bfloat16
    for name, cfg in models.items():
        for n, prefixes in cases:
            layout = PackedKVLayout(prefixes, n)
            batch = len(prefixes)
            q = torch.randn(batch, n, cfg["hq"], cfg["d"], dtype=dt, device=device())
            buf = torch.randn(2, layout.total_rows, cfg["hkv"], cfg["d"], dtype=dt, device=device())
            out = torch.empty_like(q)
            flops = 4 * n * sum(layout.kv_len(b) for b in range(batch)) * cfg["d"] * cfg["hq"]
            tflops = lambda t: flops / (t.median_ms * 1e-3) / 1e12  # noqa: E731
            per_cfg = {}
            for c in configs:
                try:
                    per_cfg[c] = timed(env, lambda c=c: pa.prefix_attention(q, buf, layout, out=out, config=c))
                except Exception as err:  # noqa: BLE001 - an over-sized config (shared memory) is reported
                    per_cfg[c] = f"failed: {type(err).__name__}"
            ok = {c: t for c, t in per_cfg.items() if isinstance(t, Timing)}
            best = min(ok, key=lambda c: ok[c].median_ms)
            run = _sdpa_branches(q, buf, layout)
            sdpa = {b or "default": _sdpa_timing(env, b, run) for b in (None, "CUDNN_ATTENTION", "FLASH_ATTENTION")}
            row = dict(model=name, gen=n, prefixes=list(prefixes), triton=ok[best].fmt(),
                       triton_tflop_s=tflops(ok[best]), triton_config=asdict(best),
                       pct_matmul_ceiling=100 * tflops(ok[best]) / ceilings["matmul_tflop_s"],
                       sweep={cfg_label(c):
                              (t.median_ms if isinstance(t, Timing) else t) for c, t in per_cfg.items()})
            for label, t in sdpa.items():
                row[f"sdpa_{label}"] = t.fmt() if isinstance(t, Timing) else t
                if isinstance(t, Timing):
                    row[f"sdpa_{label}_tflop_s"] = tflops(t)
                    row[f"triton_vs_{label}"] = t.median_ms / ok[best].median_ms
            why = pa.flash4_unsupported(q)
            if why is None:
                try:
                    t4 = timed(env, lambda: pa.prefix_attention_flash4(q, buf, layout, out=out))
                except Exception as err:  # noqa: BLE001 - a library that refuses this shape is reported
                    why = f"failed: {type(err).__name__}: {str(err).splitlines()[0][:80]}"
            row["flash4"] = why if why is not None else t4.fmt()
            if why is None:
                row["flash4_tflop_s"] = tflops(t4)
                if isinstance(sdpa["CUDNN_ATTENTION"], Timing):
                    row["flash4_vs_CUDNN_ATTENTION"] = sdpa["CUDNN_ATTENTION"].median_ms / t4.median_ms
                # Accuracy under the dispatch's rule (bf16 relative error vs an fp32 reference, <= 1e-2).
                # fp32 SDPA falls back to the math kernel (the whole score matrix): go 2048 queries at a time.
                buf32 = buf.float()
                ref = torch.cat([pa.prefix_attention_reference(q[:, i : i + 2048].float(), buf32, layout)
                                 for i in range(0, n, 2048)], dim=1)
                got = pa.prefix_attention_flash4(q, buf, layout, out=out).float()
                row["flash4_rel_err"] = ((got - ref).norm() / ref.norm()).item()
                tri = pa.prefix_attention(q, buf, layout, out=torch.empty_like(q), config=best).float()
                row["triton_rel_err"] = ((tri - ref).norm() / ref.norm()).item()
                del ref, got, tri, buf32
            rows.append(row)
            del q, buf, out
    return rows


# flash-attn-4's SM90 launch shapes (issue 17, point 3): the library's default (128x128 tiles, GQA heads
# packed into the query tile) against FA3's C++ choice for head_dim 128 (128x176) and neighbours, each
# with and without GQA packing. A shape the kernel cannot build is reported as failed, not hidden.
FLASH4_SWEEP = (
    pa.Flash4Config(),
    pa.Flash4Config(pack_gqa=False),
    pa.Flash4Config(128, 176),
    pa.Flash4Config(128, 176, pack_gqa=False),
    pa.Flash4Config(128, 160, pack_gqa=False),
    pa.Flash4Config(128, 144, pack_gqa=False),
    pa.Flash4Config(128, 192, pack_gqa=False),
    pa.Flash4Config(128, 176, pack_gqa=False, mma_pv_is_rs=False),
    pa.Flash4Config(192, 128, pack_gqa=False, mma_pv_is_rs=False),
    pa.Flash4Config(128, 128, pack_gqa=False, intra_wg_overlap=False),
    # Round 2, around the round-1 winner (192x128 with P from shared memory, GQA unpacked: three MMA warp
    # groups of 64 query rows each): its neighbours in tile_n, with GQA packing, RS and no overlap.
    pa.Flash4Config(192, 128, mma_pv_is_rs=False),
    pa.Flash4Config(192, 96, pack_gqa=False, mma_pv_is_rs=False),
    pa.Flash4Config(192, 112, pack_gqa=False, mma_pv_is_rs=False),
    pa.Flash4Config(192, 144, pack_gqa=False, mma_pv_is_rs=False),
    pa.Flash4Config(192, 160, pack_gqa=False, mma_pv_is_rs=False),
    pa.Flash4Config(192, 128, pack_gqa=False, mma_pv_is_rs=True),
    pa.Flash4Config(192, 128, pack_gqa=False, mma_pv_is_rs=False, intra_wg_overlap=False),
)


def bench_flash4_configs(env: Env, models: dict, cases, configs) -> list[dict]:
    """Each flash-attn-4 config at each case: median ms, TFLOP/s, and the relative difference from the
    library default's output (both bf16; dispatch's fp32 bound is checked per config by the GPU tests)."""
    rows = []
    dt = torch.bfloat16
    for name, cfg in models.items():
        for n, prefixes in cases:
            layout = PackedKVLayout(prefixes, n)
            q = torch.randn(len(prefixes), n, cfg["hq"], cfg["d"], dtype=dt, device=device())
            buf = torch.randn(2, layout.total_rows, cfg["hkv"], cfg["d"], dtype=dt, device=device())
            why = pa.flash4_unsupported(q)
            if why is not None:
                rows.append(dict(model=name, gen=n, prefixes=list(prefixes), flash4=why))
                continue
            flops = 4 * n * sum(layout.kv_len(b) for b in range(len(prefixes))) * cfg["d"] * cfg["hq"]
            baseline = pa.prefix_attention_flash4(q, buf, layout).float()
            out = torch.empty_like(q)
            row = dict(model=name, gen=n, prefixes=list(prefixes), configs={})
            for c in configs:
                began = time.perf_counter()
                try:
                    pa.prefix_attention_flash4(q, buf, layout, out=out, config=c)
                    torch.cuda.synchronize()
                    first_s = time.perf_counter() - began  # includes the JIT compile of a new config
                    t = timed(env, lambda c=c: pa.prefix_attention_flash4(q, buf, layout, out=out, config=c))
                except Exception as err:  # noqa: BLE001 - a tile the kernel cannot build is a result
                    row["configs"][c.label] = f"failed: {type(err).__name__}: {str(err).splitlines()[0][:100]}"
                    continue
                diff = ((out.float() - baseline).norm() / baseline.norm()).item()
                row["configs"][c.label] = dict(ms=t.median_ms, p10_p90=t.fmt(), tflop_s=flops / (t.median_ms * 1e-3) / 1e12,
                                               rel_diff_vs_lib=diff, first_call_s=first_s)
                print(name, n, c.label, row["configs"][c.label], flush=True)
            ok = {k: v for k, v in row["configs"].items() if isinstance(v, dict)}
            if ok:
                best = min(ok, key=lambda k: ok[k]["ms"])
                row["best"] = best
                row["best_vs_lib"] = ok["lib"]["ms"] / ok[best]["ms"] if "lib" in ok else None
            rows.append(row)
            del q, buf, out, baseline
    return rows


# --------------------------------------------------------------------------------------------------
# Residual add + RMSNorm, activations
# --------------------------------------------------------------------------------------------------
def bench_norms(env: Env, models: dict, token_counts, ceilings) -> list[dict]:
    rows = []
    dt = torch.bfloat16
    for name, cfg in models.items():
        for tokens in token_counts:
            x = torch.randn(tokens, cfg["hidden"], dtype=dt, device=device())
            r = torch.randn_like(x)
            w = torch.rand(cfg["hidden"], device=device()).to(dt) + 0.5
            f = cfg["flavour"]
            t_ref = timed(env, lambda: norms.add_rms_norm_reference(x, r, w, 1e-6, f))
            t_fused = timed(env, lambda: norms.add_rms_norm(x, r, w, eps=1e-6, flavour=f))
            nbytes = 4 * x.numel() * 2  # read x, r; write h, normed
            rows.append(dict(op=f"add+RMSNorm ({f})", model=name, shape=[tokens, cfg["hidden"]], torch_path=t_ref.fmt(),
                             fused=t_fused.fmt(), speedup=t_ref.median_ms / t_fused.median_ms,
                             fused_gb_s=nbytes / (t_fused.median_ms * 1e-3) / 1e9))
            del x, r
        tokens = token_counts[0]
        g = torch.randn(tokens, 2 * cfg["inter"], dtype=dt, device=device())
        gate, up = g[:, : cfg["inter"]], g[:, cfg["inter"] :]
        for op, ref, fused, nbytes in (
            ("SwiGLU", lambda: norms.swiglu_reference(gate, up), lambda: norms.swiglu(gate, up), 3 * gate.numel() * 2),
            ("ReLU^2", lambda: norms.relu2_reference(up), lambda: norms.relu2(up), 2 * up.numel() * 2),
        ):
            t_ref, t_fused = timed(env, ref), timed(env, fused)
            rows.append(dict(op=op, model=name, shape=[tokens, cfg["inter"]], torch_path=t_ref.fmt(), fused=t_fused.fmt(),
                             speedup=t_ref.median_ms / t_fused.median_ms,
                             fused_gb_s=nbytes / (t_fused.median_ms * 1e-3) / 1e9))
        del g
    return rows


# --------------------------------------------------------------------------------------------------
# The tower's GEMMs, per BLAS library
# --------------------------------------------------------------------------------------------------
def gemm_shapes(cfg: dict) -> dict[str, tuple[int, int]]:
    """(in, out) features of each gen-layer projection as the fast path runs it (q|k|v and gate|up fused)."""
    hidden, d = cfg["hidden"], cfg["d"]
    qkv = (cfg["hq"] + 2 * cfg["hkv"]) * d
    mlp_in = 2 * cfg["inter"] if cfg["flavour"] == "diffusers" else cfg["inter"]  # SwiGLU's gate|up, or ReLU^2's up
    return {"qkv": (hidden, qkv), "out": (cfg["hq"] * d, hidden), "mlp_in": (hidden, mlp_in),
            "down": (cfg["inter"], hidden)}


def _tune(x: torch.Tensor, w: torch.Tensor) -> dict:
    """TunableOp (enabled) tunes F.linear(x, w)'s shape on this call, timing each candidate its own way: how long
    that took, and the implementation it kept."""
    torch.cuda.tunable.tuning_enable(True)
    began = time.perf_counter()
    F.linear(x, w)
    torch.cuda.synchronize()
    took = time.perf_counter() - began
    torch.cuda.tunable.tuning_enable(False)
    # Its results name a GEMM by (N, M, K), as cuBLAS sees F.linear's x @ w.T.
    (m, k), n = x.shape, w.shape[0]
    chosen = [r for r in torch.cuda.tunable.get_results() if r[1].startswith(f"tn_{n}_{m}_{k}_")]
    return {"tunableop_tuning_s": round(took, 2), "tunableop_choice": chosen[0][2] if chosen else None}


def bench_gemms(env: Env, models: dict, row_counts, ceilings) -> list[dict]:
    """Each projection at each row count (both CFG branches' tokens), under cuBLAS, under cuBLASLt
    (`torch.backends.cuda.preferred_blas_library`) and under PyTorch's TunableOp (`torch.cuda.tunable`),
    which times every implementation it has registered for the shape on its first call and keeps the fastest
    (on torch 2.11's CUDA build that was cuBLAS's default alone, docs/perf-log/2026-12-02.md): is the GEMM term of a
    step at the matmul ceiling, does the other library's heuristic pick a faster kernel, and would a search
    find one? Same inputs; same output bits are not assumed (`same_bits` says)."""
    rows = []
    dt = torch.bfloat16
    on_cuda = device() == "cuda"
    libraries = ("cublas", "cublaslt", "tunableop") if on_cuda else ("cpu",)  # --smoke: the code path only
    before = torch.backends.cuda.preferred_blas_library() if on_cuda else None
    if on_cuda:  # TunableOp reads no earlier tunings (an empty file of its own) and writes there at exit
        import tempfile

        torch.cuda.tunable.set_filename(tempfile.mkstemp(prefix="tunableop_", suffix=".csv")[1])
    try:
        for name, cfg in models.items():
            for m in row_counts:
                for proj, (k, n) in gemm_shapes(cfg).items():
                    x = torch.randn(m, k, dtype=dt, device=device())
                    w = torch.randn(n, k, dtype=dt, device=device()) / k ** 0.5
                    row = dict(model=name, proj=proj, m=m, k=k, n=n)
                    results = {}
                    for library in libraries:
                        if on_cuda:
                            torch.backends.cuda.preferred_blas_library(before if library == "tunableop" else library)
                            torch.cuda.tunable.enable(library == "tunableop")
                        if library == "tunableop":
                            row.update(_tune(x, w))
                        t = timed(env, lambda: F.linear(x, w))
                        results[library] = F.linear(x, w)
                        row[f"{library}_ms"] = round(t.median_ms, 4)
                        row[f"{library}_tflop_s"] = round(2 * m * k * n / (t.median_ms * 1e-3) / 1e12, 1)
                    outputs = list(results.values())
                    row["same_bits"] = all(torch.equal(outputs[0], o) for o in outputs[1:])
                    row["of_ceiling"] = round(max(row[f"{lib}_tflop_s"] for lib in libraries)
                                              / ceilings["matmul_tflop_s"], 3)
                    print("gemm", row, flush=True)
                    rows.append(row)
                    del x, w, results
    finally:
        if on_cuda:
            torch.cuda.tunable.enable(False)
            torch.backends.cuda.preferred_blas_library(before)
    return rows


# --------------------------------------------------------------------------------------------------
# Dispatch as the engine would see it
# --------------------------------------------------------------------------------------------------
def bench_dispatch(env: Env, models: dict, cases, configs) -> list[dict]:
    if env.smoke:
        return []
    out = []
    d = KernelDispatcher("auto", attention_configs=configs)
    dt = torch.bfloat16
    for name, cfg in models.items():
        for n, prefixes in cases:
            layout = PackedKVLayout(prefixes, n)
            b = len(prefixes)
            q = torch.randn(b, n, cfg["hq"], cfg["d"], dtype=dt, device="cuda")
            k = torch.randn(b, n, cfg["hkv"], cfg["d"], dtype=dt, device="cuda")
            w = torch.rand(cfg["d"], device="cuda").to(dt) + 0.5
            cos, sin = _rope(b, n, cfg["d"], dt)
            buf = layout.allocate(cfg["hkv"], cfg["d"], dtype=dt, device="cuda").normal_()
            for op, dec in (
                ("qk_norm_rope", d.choose("qk_norm_rope", q, k, k, w, w, cos, sin, buf, layout, eps=1e-6,
                                          flavour=cfg["flavour"], round_norm_before_rope=True)),
                ("prefix_attention", d.choose("prefix_attention", q, buf, layout)),
            ):
                out.append(dict(model=name, gen=n, prefixes=list(prefixes), op=op, path=dec.backend,
                                reason=dec.reason, triton_ms=dec.ms.get("triton"), torch_ms=dec.ms.get("torch"),
                                flash4_ms=dec.ms.get("flash4"),
                                config=asdict(dec.config) if dec.config else None))
            del q, k, buf
    return out


# --------------------------------------------------------------------------------------------------
# Report
# --------------------------------------------------------------------------------------------------
def markdown(results: dict) -> str:
    c = results["ceilings"]
    lines = [f"Ceilings measured in this run: copy {c['copy_tb_s']} TB/s, bf16 matmul {c['matmul_tflop_s']} TFLOP/s.", ""]
    if results.get("qk_launch"):
        lines += [f"QK kernel launch (fastest in the sweep at the longest shape): {results['qk_launch']}", ""]
    lines += ["**QK-norm + RoPE + pack** (bf16, 2 CFG branches, prefixes 1615/2866; ms median (p10-p90))", "",
              "| model | gen tokens | rounded | split: norm, rope, cat | torch: norm, rope, copy | fused Triton | x split | x torch | GB/s | % copy ceiling |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    for r in results["qk"]:
        lines.append(f"| {r['model']} | {r['gen']} | {r['rounded']} | {r['split_cat']} | {r['torch_path']} | {r['fused']} | "
                     f"{r['speedup_vs_split']:.2f} | {r['speedup_vs_torch_path']:.2f} | {r['fused_gb_s']:.0f} | {r['pct_copy_ceiling']:.0f}% |")
    lines += ["", "**Prefix attention** (bf16, head_dim 128; ms median (p10-p90); TFLOP/s = 4·N·ΣL·D·Hq / t)", "",
              "| model | gen | prefixes | Triton (one launch) | TFLOP/s | SDPA default | cuDNN | FA2 | FA4 (flash-attn-4) | FA4 TFLOP/s | Triton vs cuDNN | FA4 vs cuDNN | config |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results["attention"]:
        cfgd = r["triton_config"]
        cfg = cfg_label(pa.AttentionConfig(**cfgd))
        vs = lambda k: f"{r[k]:.2f}x" if k in r else "n/a"  # noqa: E731
        lines.append(f"| {r['model']} | {r['gen']} | {'/'.join(map(str, r['prefixes']))} | {r['triton']} | {r['triton_tflop_s']:.0f} | "
                     f"{r['sdpa_default']} | {r['sdpa_CUDNN_ATTENTION']} | {r['sdpa_FLASH_ATTENTION']} | "
                     f"{r.get('flash4', 'n/a')} | {r.get('flash4_tflop_s', 0):.0f} | "
                     f"{vs('triton_vs_CUDNN_ATTENTION')} | {vs('flash4_vs_CUDNN_ATTENTION')} | {cfg} |")
    lines += ["", "**Residual add + RMSNorm, activations** (bf16)", "",
              "| op | model | shape | torch path | fused | speedup | GB/s |", "|---|---|---|---|---|---|---|"]
    for r in results["norms"]:
        lines.append(f"| {r['op']} | {r['model']} | {r['shape'][0]}x{r['shape'][1]} | {r['torch_path']} | {r['fused']} | "
                     f"{r['speedup']:.2f} | {r['fused_gb_s']:.0f} |")
    if results.get("dispatch"):
        lines += ["", "**Dispatch decisions (auto mode, measured on this GPU)**", "",
                  "| model | gen | prefixes | op | path | triton ms | torch ms | flash4 ms | reason |", "|---|---|---|---|---|---|---|---|---|"]
        for r in results["dispatch"]:
            ms = lambda v: "-" if v is None else f"{v:.3f}"  # noqa: E731
            lines.append(f"| {r['model']} | {r['gen']} | {'/'.join(map(str, r['prefixes']))} | {r['op']} | {r['path']} | "
                         f"{ms(r['triton_ms'])} | {ms(r['torch_ms'])} | {ms(r.get('flash4_ms'))} | {r['reason']} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=None, help="folder for results.json and results.md")
    ap.add_argument("--smoke", action="store_true", help="tiny shapes on any device, one call each")
    ap.add_argument("--iters", type=int, default=15)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--sections", default="ceilings,sweep,qk,attention,norms,dispatch",
                    help="any of ceilings,sweep,qk,attention,flash4,norms,gemm,dispatch (flash4: the launch-shape sweep; "
                         "gemm: each projection under cuBLAS, cuBLASLt and TunableOp)")
    ap.add_argument("--flash4-configs", default=None, help="indices into FLASH4_SWEEP to run, e.g. 0,8,10-16")
    args = ap.parse_args()
    from engine.config import apply_process_environment, build_config

    apply_process_environment(build_config())  # the kernels' settings: TRITON_INTERPRET, COSMOS3_QUACK, COSMOS3_FLASH4
    if not args.smoke and not torch.cuda.is_available():
        sys.exit("bench_kernels needs CUDA (use --smoke for a CPU code-path check)")
    env = Env(smoke=args.smoke, iters=args.iters, warmup=args.warmup)
    sections = set(args.sections.split(","))
    models = SMOKE_MODELS if args.smoke else MODELS
    gen = (20, 33) if args.smoke else GEN_TOKENS
    prefixes = (5, 19) if args.smoke else PREFIXES
    attn_cases = ([(20, (5, 19)), (33, (7,))] if args.smoke else
                  [(400, PREFIXES), (1024, PREFIXES), (12090, (1615,)), (12090, PREFIXES), (44160, (1615,)),
                   (44160, PREFIXES)])
    configs = tuple(pa.AttentionConfig(16, 16, 4, 2, t) for t in (False, True)) if args.smoke else ATTN_SWEEP
    results: dict = {
        "date": datetime.date.today().isoformat(),
        "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
        "torch": torch.__version__, "triton": __import__("triton").__version__,
        "cuda": torch.version.cuda, "command": " ".join([os.path.basename(sys.executable)] + sys.argv),
        "reduce_order": str(qk.torch_reduce_order(device())),
    }
    print(json.dumps(results), flush=True)

    def dump() -> None:  # after every section, so a later failure loses nothing
        if args.out:
            args.out.mkdir(parents=True, exist_ok=True)
            (args.out / "results.json").write_text(json.dumps(results, indent=1, default=str))

    results["ceilings"] = measure_ceilings(env) if "ceilings" in sections else measure_ceilings(Env(True, 1, 0))
    print("ceilings", results["ceilings"], flush=True)
    results["qk_launch"] = {}
    if "sweep" in sections:
        results["qk_sweep_short"] = sweep_qk(env, models, gen[1], prefixes)
        print("qk sweep short", results["qk_sweep_short"], flush=True)
        results["qk_sweep"] = sweep_qk(env, models, gen[-1], prefixes)
        print("qk sweep", results["qk_sweep"], flush=True)
        best = min((r for r in results["qk_sweep"] if r["rounded"]), key=lambda r: r["median_ms"])
        results["qk_launch"] = dict(block_t=best["block_t"], num_warps=best["num_warps"],
                                    heads_per_program=best["heads_per_program"])
        dump()
    results["qk"] = bench_qk(env, models, gen, prefixes, results["ceilings"], results["qk_launch"]) \
        if "qk" in sections else []
    dump()
    results["attention"] = []
    if "attention" in sections:
        # Full sweep on the first model; the second reuses its three fastest configs.
        first, *rest = models.items()
        results["attention"] += bench_attention(env, dict([first]), attn_cases, configs, results["ceilings"])
        score = {c: 0.0 for c in configs}
        for r in results["attention"]:
            for c in configs:
                t = r["sweep"][cfg_label(c)]
                score[c] += t if isinstance(t, float) else float("inf")
        configs = tuple(sorted(configs, key=score.get)[:3])
        if rest:
            results["attention"] += bench_attention(env, dict(rest), attn_cases, configs, results["ceilings"])
        dump()
    if "flash4" in sections:
        flash4_cases = [(44160, PREFIXES), (12090, PREFIXES), (12090, (1615,))] if not args.smoke else [(20, (5, 19))]
        sweep = FLASH4_SWEEP
        if args.flash4_configs:  # a subset by index, e.g. "0,8,10-16"
            picked = set()
            for part in args.flash4_configs.split(","):
                lo, _, hi = part.partition("-")
                picked.update(range(int(lo), int(hi or lo) + 1))
            sweep = tuple(c for i, c in enumerate(FLASH4_SWEEP) if i in picked)
        results["flash4_configs"] = bench_flash4_configs(env, models, flash4_cases, sweep)
        dump()
    results["norms"] = bench_norms(env, models, (2 * 12090, 2 * 44160) if not args.smoke else (40,), results["ceilings"]) \
        if "norms" in sections else []
    dump()
    if "gemm" in sections:
        results["gemm"] = bench_gemms(env, models, (64,) if args.smoke else (2 * 1024, 2 * 12090, 2 * 44160),
                                      results["ceilings"])
        dump()
    disp_cases = [(1024, PREFIXES), (12090, PREFIXES), (44160, PREFIXES)] if not args.smoke else []
    results["dispatch"] = bench_dispatch(env, models, disp_cases, configs[:2]) if "dispatch" in sections else []
    dump()
    md = markdown(results)
    print(md, flush=True)
    if args.out:
        (args.out / "results.md").write_text(md + "\n")


if __name__ == "__main__":
    main()
