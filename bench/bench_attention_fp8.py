"""FP8 attention against the bf16 attention dispatch picks, at the video shapes, on one GPU (issue 17, point 5).

    python bench/bench_attention_fp8.py --json $OUT/attention_fp8.json     # ~1 min on an H200
    python bench/bench_attention_fp8.py --plans --json $OUT/plans.json     # ~30 s: every cuDNN plan, both storages

Nano's heads (32 query, 8 K/V, head_dim 128), both CFG branches (prefixes 1606 and 59 tokens, as a request with a
1.6k-token prompt and the default negative prompt), gen tokens of 720p/189f (44160), 480p/121f (12090) and the
shortest call the FP8 mode gives the FP8 attention (`FP8_ATTENTION_MIN_GEN_TOKENS`, 8192), or those `--gen` lists:
the bf16 path dispatch chooses (`KernelDispatcher.prefix_attention`, flash-attn-4 where installed) against
`cosmos3_kernels.attention_fp8.CudnnFP8Attention` (its quantisation and dequantisation passes included) and, where `fa3-fwd`
is installed, `cosmos3_kernels.attention_fp8_fa3.FA3FP8Attention` (unpacked, the default, and with the query heads packed
per K/V head) and FA3's own bf16 forward, as the engine calls them, the FP8 ones with v centred (the default) and
not; ms per call (CUDA events, median of --iters), TFLOP/s (4 N L D Hq summed over the branches), and each one's
relative error against fp32 attention on the first --rows queries of each branch, for zero-mean v ("rel_error") and
for v with a common offset per head and channel as the towers have one ("rel_error_v_offset", `V_OFFSET`).

`--plans`: cuDNN's FP8 SDPA alone, one branch (prefix 1606) at each shape: every execution plan cuDNN offers
(heuristics A, B and fallback, all built), for the engine's token-major storage and for heads-major; ms per
call (CUDA events, median of --iters after one call) and each plan's largest difference from the first plan's
output (e4m3 units), on random e4m3 operands (30x a standard normal, descaled by 1/30).
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.e2e import run_header  # noqa: E402
from engine.pipeline.fp8 import FP8_ATTENTION_MIN_GEN_TOKENS  # noqa: E402
from cosmos3_kernels import attention_fp8, attention_fp8_fa3  # noqa: E402
from cosmos3_kernels.dispatch import KernelDispatcher  # noqa: E402
from cosmos3_kernels.packed_kv import PackedKVLayout  # noqa: E402
from cosmos3_kernels.timing import time_ms  # noqa: E402

HEADS, KV_HEADS, HEAD_DIM = 32, 8, 128
PREFIXES = (1606, 59)
SHAPES = {"720p/189f": 44160, "480p/121f": 12090, "FP8 floor": FP8_ATTENTION_MIN_GEN_TOKENS}
# In random-weight towers v's mean over a branch's rows is 0.13-0.44 of its spread per (head, channel) (Edge
# T2I 640x640, Nano T2V 832x480/17f, fp32 on the CPU: bench/bench_fp8_attention_inputs.py; docs/perf-log/2026-12-02.md,
# "Centring v").
V_OFFSET = 0.3


def inputs(gen: int, seed: int = 0, v_offset: float = 0.0):
    """RMS-normed q and k (as after the QK-norm) and Gaussian v in the packed layout; `v_offset` > 0 gives
    each (K/V head, channel) of v a common offset of that standard deviation (V_OFFSET: as in the towers)."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    layout = PackedKVLayout(PREFIXES, gen)

    def normed(*shape):
        x = torch.randn(*shape, generator=g, device="cuda")
        return (x / x.pow(2).mean(-1, keepdim=True).sqrt()).bfloat16()

    kv = torch.stack([normed(layout.rows, KV_HEADS, HEAD_DIM),
                      (torch.randn(layout.rows, KV_HEADS, HEAD_DIM, generator=g, device="cuda")
                       + v_offset * torch.randn(KV_HEADS, HEAD_DIM, generator=g, device="cuda")).bfloat16()])
    return normed(len(PREFIXES), gen, HEADS, HEAD_DIM), kv, layout


def error_vs_fp32(out, q, kv, layout, rows: int) -> float:
    """Relative L2 error over the first `rows` queries of every branch against fp32 attention (q [B, N, Hq, D],
    the packed `kv` buffer; GQA: query head h reads K/V head h // (Hq / Hkv))."""
    num = den = 0.0
    groups = q.shape[2] // kv.shape[2]
    for b in range(layout.num_branches):
        k, v = (t.float().transpose(0, 1).repeat_interleave(groups, 0) for t in layout.branch_kv(kv, b))
        scores = q[b, :rows].float().transpose(0, 1) @ k.transpose(1, 2) / math.sqrt(q.shape[-1])
        exact = (torch.softmax(scores, -1) @ v).transpose(0, 1)
        num += float((out[b, :rows].float() - exact).pow(2).sum())
        den += float(exact.pow(2).sum())
    return math.sqrt(num / den)


def plan_rows(iters: int) -> list[dict]:
    """`--plans` (module docstring): one row per (shape, storage, plan)."""
    cudnn = attention_fp8._cudnn()
    handle = cudnn.create_handle()
    cudnn.set_stream(handle=handle, stream=torch.cuda.current_stream().cuda_stream)
    gen = torch.Generator(device="cuda").manual_seed(0)
    rows = []
    for label, n_q in SHAPES.items():
        n_kv = n_q + PREFIXES[0]
        flops = 4 * n_q * n_kv * HEAD_DIM * HEADS
        for heads_major in (False, True):
            graph, t = attention_fp8.sdpa_fp8_graph(cudnn, handle, n_q, n_kv, HEADS, KV_HEADS, HEAD_DIM,
                                                    1 / math.sqrt(HEAD_DIM), heads_major=heads_major)
            graph.validate()
            graph.build_operation_graph()
            graph.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.B, cudnn.heur_mode.FALLBACK])
            graph.check_support()
            graph.build_plans(cudnn.build_plan_policy.ALL)

            def e4m3(count: int, heads: int) -> torch.Tensor:
                x = (torch.randn(count, heads, HEAD_DIM, device="cuda", generator=gen) * 30).to(torch.float8_e4m3fn)
                return x.transpose(0, 1).contiguous() if heads_major else x

            q8, k8, v8 = e4m3(n_q, HEADS), e4m3(n_kv, KV_HEADS), e4m3(n_kv, KV_HEADS)
            o8 = torch.empty_like(q8)
            pack = {t["q"]: q8, t["k"]: k8, t["v"]: v8, t["o"]: o8, t["amax_o"]: torch.zeros(1, 1, 1, 1, device="cuda")}
            for name in attention_fp8.SCALARS[:6]:  # descales of q, k, v at the operands' 30x, the rest 1
                value = 1 / 30 if name in ("descale_q", "descale_k", "descale_v") else 1.0
                pack[t[name]] = torch.full((1, 1, 1, 1), value, device="cuda")
            first = None
            for index in range(graph.get_execution_plan_count()):
                row = {"shape": label, "n_q": n_q, "n_kv": n_kv, "storage": "heads-major" if heads_major else "token-major",
                       "plan": index, "name": graph.get_plan_name_at_index(index)}
                workspace = torch.empty(max(graph.get_workspace_size_plan_at_index(index), 1), dtype=torch.uint8, device="cuda")
                graph.execute_plan_at_index(pack, workspace, index, handle=handle)
                out = o8.float()
                first = out if first is None else first
                ms = time_ms(lambda: graph.execute_plan_at_index(pack, workspace, index, handle=handle),
                             warmup=1, iters=iters).median_ms
                row.update(ms=ms, tflops=flops / ms / 1e9, max_diff_vs_plan0=float((out - first).abs().max()))
                print(json.dumps(row), flush=True)
                rows.append(row)
            del q8, k8, v8, o8, pack
    return rows


def fa3_bf16(q, kv, layout):
    """FA3's bf16 varlen forward over the packed buffer as it lies (both branches, one call), for comparison."""
    batch, n_gen, hq, head_dim = q.shape
    rows = layout.total_rows
    out = torch.empty(batch * n_gen, hq, head_dim, dtype=q.dtype, device=q.device)
    attention_fp8_fa3.varlen_forward(q.reshape(batch * n_gen, hq, head_dim), kv[0, :rows], kv[1, :rows], out,
                                     layout.cu_seqlens(q.device), n_gen, layout.max_kv_len,
                                     1 / math.sqrt(head_dim), pack_gqa=None)
    return out.view(batch, n_gen, hq, head_dim)


def op_rows(iters: int, error_rows: int, shapes: dict) -> list[dict]:
    """The default section (module docstring): one row per shape, every path as the engine calls it."""
    rows = []
    dispatch = KernelDispatcher("auto")
    centred, uncentred = attention_fp8.CudnnFP8Attention(), attention_fp8.CudnnFP8Attention(centred=False)
    paths = {"bf16 (dispatch)": lambda q, kv, layout: dispatch.prefix_attention(q, kv, layout),
             "FP8 (cuDNN)": centred, "FP8 (cuDNN, v not centred)": uncentred}
    why_not_fa3 = attention_fp8_fa3.unavailable("cuda")
    if why_not_fa3 is None:
        paths.update({"bf16 (FA3)": fa3_bf16, "FP8 (FA3)": attention_fp8_fa3.FA3FP8Attention(),
                      "FP8 (FA3, v not centred)": attention_fp8_fa3.FA3FP8Attention(centred=False),
                      "FP8 (FA3, packed)": attention_fp8_fa3.FA3FP8Attention(pack_gqa=True)})
    else:
        print(json.dumps({"FA3 left out": why_not_fa3}), flush=True)
    for label, gen in shapes.items():
        q, kv, layout = inputs(gen)
        offset = inputs(gen, seed=1, v_offset=V_OFFSET)
        flops = sum(4 * gen * layout.kv_len(b) * HEAD_DIM * HEADS for b in range(layout.num_branches))
        row = {"shape": label, "gen_tokens": gen, "prefixes": list(PREFIXES)}
        for name, path in paths.items():
            out = path(q, kv, layout)  # dispatch measures its candidates, cuDNN builds its graphs
            ms = time_ms(lambda: path(q, kv, layout), warmup=1, iters=iters).median_ms
            row[name] = {"ms": ms, "tflops": flops / ms / 1e9, "rel_error": error_vs_fp32(out, q, kv, layout, error_rows),
                         "rel_error_v_offset": error_vs_fp32(path(*offset), *offset, error_rows)}
        chosen = [d for key, d in dispatch.decisions().items() if key[0] == "prefix_attention" and key[3][1] == gen]
        row["bf16 path"] = chosen[0].backend if chosen else None
        row["speedup"] = row["bf16 (dispatch)"]["ms"] / row["FP8 (cuDNN)"]["ms"]
        if "FP8 (FA3)" in row:
            row["FA3 FP8 over cuDNN FP8"] = row["FP8 (cuDNN)"]["ms"] / row["FP8 (FA3)"]["ms"]
        rows.append(row)
        print(json.dumps(row, default=str), flush=True)
        del q, kv, offset
        torch.cuda.empty_cache()
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iters", type=int, default=5)
    parser.add_argument("--rows", type=int, default=512)
    parser.add_argument("--plans", action="store_true", help="every cuDNN FP8 SDPA plan instead (module docstring)")
    parser.add_argument("--gen", default=None, help="gen tokens per branch, comma-separated, instead of SHAPES")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    shapes = {f"{n} gen": int(n) for n in args.gen.split(",")} if args.gen else SHAPES
    results = {"header": run_header(torch.cuda.get_device_name())}
    print(json.dumps(results["header"]), flush=True)
    if args.plans:
        results["plans"] = plan_rows(args.iters)
    else:
        results["rows"] = op_rows(args.iters, args.rows, shapes)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
