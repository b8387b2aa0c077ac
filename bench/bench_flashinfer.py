"""FlashInfer's FA3 prefill kernels against the attention the engine runs, on one Hopper GPU (issue 17, points 3, 5).

    python bench/bench_flashinfer.py --json $OUT/flashinfer.json     # ~5 min on an H200 the first time

FlashInfer (`flashinfer-python`, with `apache-tvm-ffi`; not a requirement of the engine) builds its kernels with
nvcc on first use, about 100 s for each of the two modules below, and keeps them on disk for the next process.
Set FLASHINFER_CUDA_ARCH_LIST=9.0a so that it builds for this GPU only.

`bf16`: FlashInfer's ragged prefill on its `fa3` backend (FlashAttention-3's Hopper kernel), both CFG branches in
one call straight from the engine's packed K/V buffer (its rows are already the ragged layout), against each
flash-attn-4 config dispatch offers and cuDNN through PyTorch SDPA (one call per branch, the engine's PyTorch
path). Nano's and Edge's heads, gen tokens of 720p/189f (44160) and 480p/121f (12090), prefixes 1606 and 59 (a
1.6k-token prompt and the default negative prompt). Error: relative L2 against fp32 attention on the first
--rows queries of every branch (`bench_attention_fp8.error_vs_fp32`).

`fp8`: FlashInfer's single prefill on `fa3` with e4m3 q, k and v (per-head scales) and a bf16 output, against
cuDNN's FP8 SDPA graph with the engine's plan (`cosmos3_kernels.attention_fp8._build_graph`), both on the same operands,
one branch (prefix 1606), Nano's heads. Error as above, against fp32 attention on the dequantised operands.

Timing: each round takes one sample of every candidate in turn (CUDA events around --inner calls), so a clock
that drifts under the power cap moves them alike; the table reports the median over --rounds.
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.bench_attention_fp8 import error_vs_fp32  # noqa: E402
from bench.e2e import run_header  # noqa: E402
from cosmos3_kernels import attention_fp8  # noqa: E402
from cosmos3_kernels import prefix_attention as pa  # noqa: E402
from cosmos3_kernels.packed_kv import PackedKVLayout  # noqa: E402
from cosmos3_kernels.timing import time_ms  # noqa: E402

HEAD_DIM = 128
HEADS = {"nano": (32, 8), "edge": (16, 8)}  # (query heads, K/V heads)
PREFIXES = (1606, 59)
SHAPES = {"720p/189f": 44160, "480p/121f": 12090}
SECTIONS = ("bf16", "fp8")


def attention_flops(gen: int, kv_lens, heads: int) -> int:
    """QK^T and PV over every branch: 4 N L D H (the figure TFLOP/s is counted from, as in bench_kernels)."""
    return sum(4 * gen * kv_len * HEAD_DIM * heads for kv_len in kv_lens)


def interleaved(candidates: dict, rounds: int, inner: int) -> dict:
    """Median ms per call of each candidate, one sample of each per round in turn (module docstring)."""
    samples = {name: [] for name in candidates}
    for _ in range(rounds):
        for name, fn in candidates.items():
            samples[name].append(time_ms(fn, warmup=0, iters=1, inner=inner).median_ms)
    return {name: statistics.median(values) for name, values in samples.items()}


def add_common_args(parser: argparse.ArgumentParser, sections: tuple[str, ...]) -> None:
    """The arguments this bench shares with bench_quack.py: the sections, the interleaved timing, the JSON out."""
    parser.add_argument("--sections", default=",".join(sections), help=f"comma-separated, of {sections}")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--inner", type=int, default=5, help="calls per sample")
    parser.add_argument("--json", default=None)


def chosen_sections(parser: argparse.ArgumentParser, value: str, sections: tuple[str, ...]) -> list[str]:
    """--sections as a list, or the parser's error naming the unknown ones and the allowed ones."""
    chosen = [s for s in value.split(",") if s]
    unknown = sorted(set(chosen) - set(sections))
    if unknown:
        parser.error(f"--sections: unknown {unknown}; allowed: {list(sections)}")
    return chosen


def bf16_rows(flashinfer, rounds: int, inner: int, error_rows: int) -> list[dict]:
    """`bf16` (module docstring): one row per (model, shape)."""
    workspace = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    rows = []
    for model, (hq, hkv) in HEADS.items():
        for label, gen in SHAPES.items():
            layout = PackedKVLayout(PREFIXES, gen)
            g = torch.Generator(device="cuda").manual_seed(0)
            q = torch.randn(len(PREFIXES), gen, hq, HEAD_DIM, dtype=torch.bfloat16, device="cuda", generator=g)
            kv = torch.randn(2, layout.rows, hkv, HEAD_DIM, dtype=torch.bfloat16, device="cuda", generator=g)
            cu_q, cu_k = layout.cu_seqlens(q.device)
            q_rows = q.view(-1, hq, HEAD_DIM)
            row = {"model": model, "shape": label, "gen_tokens": gen, "prefixes": list(PREFIXES)}
            outputs = {name: torch.empty_like(q) for name in ("flash-attn-4", "cuDNN", "FlashInfer FA3")}
            candidates = {}
            for config in pa.flash4_configs_for(q, pa.DEFAULT_FLASH4_CONFIGS):
                candidates[f"flash-attn-4 {config.label}"] = (
                    lambda config=config: pa.prefix_attention_flash4(q, kv, layout, out=outputs["flash-attn-4"], config=config))

            def cudnn_pair():
                with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
                    for b in range(layout.num_branches):
                        k, v = (t.transpose(0, 1).unsqueeze(0) for t in layout.branch_kv(kv, b))
                        o = F.scaled_dot_product_attention(q[b:b + 1].transpose(1, 2), k, v, enable_gqa=True)
                        outputs["cuDNN"][b].copy_(o[0].transpose(0, 1))

            candidates["cuDNN (SDPA per branch)"] = cudnn_pair
            began = time.perf_counter()
            wrapper = flashinfer.BatchPrefillWithRaggedKVCacheWrapper(workspace, "NHD", backend="fa3")
            wrapper.plan(cu_q, cu_k, hq, hkv, HEAD_DIM, causal=False, q_data_type=torch.bfloat16,
                         kv_data_type=torch.bfloat16)
            fi_out = outputs["FlashInfer FA3"].view(-1, hq, HEAD_DIM)
            candidates["FlashInfer FA3 (ragged)"] = lambda: wrapper.run(q_rows, kv[0], kv[1], out=fi_out)
            candidates["FlashInfer FA3 (ragged)"]()
            torch.cuda.synchronize()
            row["flashinfer_first_call_s"] = time.perf_counter() - began  # its JIT build, where not on disk yet
            for fn in candidates.values():  # flash-attn-4's configs compile on their first call
                fn()
            torch.cuda.synchronize()
            row["rel_error_vs_fp32"] = {name: error_vs_fp32(out, q, kv, layout, error_rows) for name, out in outputs.items()}
            ms = interleaved(candidates, rounds, inner)
            flops = attention_flops(gen, [layout.kv_len(b) for b in range(layout.num_branches)], hq)
            row["ms"] = ms
            row["tflops"] = {name: flops / t / 1e9 for name, t in ms.items()}
            fastest_flash4 = min((t for name, t in ms.items() if name.startswith("flash-attn-4")), default=None)
            if fastest_flash4 is not None:
                row["flashinfer_vs_fastest_flash4"] = fastest_flash4 / ms["FlashInfer FA3 (ragged)"]
            row["flashinfer_vs_cudnn"] = ms["cuDNN (SDPA per branch)"] / ms["FlashInfer FA3 (ragged)"]
            print(json.dumps(row), flush=True)
            rows.append(row)
            del q, kv, outputs, wrapper
            torch.cuda.empty_cache()
    return rows


def fp8_rows(flashinfer, rounds: int, inner: int, error_rows: int) -> list[dict]:
    """`fp8` (module docstring): one row per shape."""
    hq, hkv = HEADS["nano"]
    cudnn = attention_fp8._cudnn()
    handle = cudnn.create_handle()
    cudnn.set_stream(handle=handle, stream=torch.cuda.current_stream().cuda_stream)
    rows = []
    for label, gen in SHAPES.items():
        n_kv = gen + PREFIXES[0]
        g = torch.Generator(device="cuda").manual_seed(0)

        def e4m3(count: int, heads: int):  # one scale a tensor, amax onto e4m3's largest value
            x = torch.randn(count, heads, HEAD_DIM, device="cuda", generator=g)
            scale = x.abs().amax() / 448.0
            return (x / scale).to(torch.float8_e4m3fn), scale

        (q8, sq), (k8, sk), (v8, sv) = e4m3(gen, hq), e4m3(n_kv, hkv), e4m3(n_kv, hkv)
        row = {"shape": label, "gen_tokens": gen, "prefix": PREFIXES[0]}
        fi_scales = {"scale_q": sq.expand(hq).contiguous(), "scale_k": sk.expand(hkv).contiguous(),
                     "scale_v": sv.expand(hkv).contiguous()}
        outputs = {}

        def flashinfer_call():
            outputs["FlashInfer FA3"] = flashinfer.single_prefill_with_kv_cache(
                q8, k8, v8, o_dtype=torch.bfloat16, backend="fa3", **fi_scales)

        began = time.perf_counter()
        flashinfer_call()
        torch.cuda.synchronize()
        row["flashinfer_first_call_s"] = time.perf_counter() - began
        graph, tensors, workspace = attention_fp8._build_graph(cudnn, handle, q8.device, gen, n_kv, hq, hkv, HEAD_DIM,
                                                                1 / math.sqrt(HEAD_DIM))
        o8 = torch.empty_like(q8)
        one = lambda value: torch.full((1, 1, 1, 1), float(value), device="cuda")  # noqa: E731
        # The output's scale is 1: this section times the kernel. Attention over random operands gives small
        # outputs, many in e4m3's subnormal range at that scale, so cuDNN's error column here is not the engine's:
        # its output scale and the centring of v are measured by bench_attention_fp8.py.
        pack = {tensors["q"]: q8, tensors["k"]: k8, tensors["v"]: v8, tensors["o"]: o8, tensors["amax_o"]: one(0),
                tensors["descale_q"]: one(sq), tensors["descale_k"]: one(sk), tensors["descale_v"]: one(sv),
                tensors["descale_s"]: one(1 / 448), tensors["scale_s"]: one(448), tensors["scale_o"]: one(1)}
        candidates = {"FlashInfer FA3": flashinfer_call,
                      "cuDNN FP8 (engine's plan)": lambda: graph.execute(pack, workspace, handle=handle)}
        candidates["cuDNN FP8 (engine's plan)"]()
        torch.cuda.synchronize()
        # Against fp32 attention over the dequantised operands, as one branch of the packed layout.
        branch = PackedKVLayout((PREFIXES[0],), gen)
        q_wide, kv_wide = (q8[:error_rows].float() * sq)[None], torch.stack([k8.float() * sk, v8.float() * sv])
        row["rel_error_vs_fp32"] = {
            "FlashInfer FA3": error_vs_fp32(outputs["FlashInfer FA3"][None], q_wide, kv_wide, branch, error_rows),
            "cuDNN FP8 (engine's plan)": error_vs_fp32(o8[None], q_wide, kv_wide, branch, error_rows)}
        row["out_dtype"] = {"FlashInfer FA3": str(outputs["FlashInfer FA3"].dtype), "cuDNN FP8 (engine's plan)": str(o8.dtype)}
        ms = interleaved(candidates, rounds, inner)
        row["ms"] = ms
        row["tflops"] = {name: attention_flops(gen, [n_kv], hq) / t / 1e9 for name, t in ms.items()}
        row["flashinfer_vs_cudnn"] = ms["cuDNN FP8 (engine's plan)"] / ms["FlashInfer FA3"]
        print(json.dumps(row), flush=True)
        rows.append(row)
        del q8, k8, v8, o8, pack, outputs, q_wide, kv_wide
        torch.cuda.empty_cache()
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_args(parser, SECTIONS)
    parser.add_argument("--rows", type=int, default=256, help="queries per branch checked against fp32")
    args = parser.parse_args(argv)
    sections = chosen_sections(parser, args.sections, SECTIONS)
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9:
        parser.error("FlashInfer's fa3 backend runs on Hopper (compute capability 9.x); this machine has "
                     + (torch.cuda.get_device_name() if torch.cuda.is_available() else "no CUDA GPU"))
    began = time.perf_counter()
    try:
        import flashinfer  # not a requirement of the engine
    except ImportError as err:
        parser.error(f"FlashInfer is not importable ({err}); install it with: pip install flashinfer-python apache-tvm-ffi")

    results = {"header": run_header(torch.cuda.get_device_name()), "flashinfer_import_s": time.perf_counter() - began}
    print(json.dumps(results["header"]), flush=True)
    section_rows = {"bf16": bf16_rows, "fp8": fp8_rows}
    for section in sections:
        results[section] = section_rows[section](flashinfer, args.rounds, args.inner, args.rows)
        if args.json:  # after each section, so a run cut short keeps what it measured
            Path(args.json).write_text(json.dumps(results, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
