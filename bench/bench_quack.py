"""QuACK's GEMMs with fused epilogues against cuBLAS and the engine's separate passes, on one Hopper GPU (issue 17).

    python bench/bench_quack.py --json $OUT/quack.json     # ~1 min on an H200, much of it compiling

QuACK (`quack-kernels`, Dao-AILab's CuTe DSL kernels; flash-attn-4 depends on it) has Hopper GEMMs whose
epilogue applies the MLP's activation to the fp32 accumulator, or adds the GEMM into a tensor in place. In the
fast tower each MLP input GEMM is followed by a memory-bound pass (SwiGLU reads 2 x intermediate and writes
1 x intermediate a token; ReLU^2 reads and writes 1 x intermediate), and the attention-out and down GEMMs by
the fused residual add + RMSNorm, which reads the GEMM's output back. Fusing those saves HBM traffic, and
only pays where QuACK's GEMM keeps up with cuBLAS's.

Sections (rows = both CFG branches' gen tokens: Nano at 720p/189f, 88320; Edge at 480p/121f, 24180):
- `mlp_in`: x @ [gate; up]^T then SwiGLU (Nano), or x @ up^T then ReLU^2 (Edge): cuBLAS then cosmos3_kernels.norms'
  pass, against QuACK's `gemm_act` on the engine's fused [gate; up] weight (`concat_layout=("B",)`), the
  pre-activation not stored (the engine's `cosmos3_kernels.gemm.mlp_in_quack`). QuACK must be installed under a
  `site-packages` folder: installed elsewhere, every `gemm_act` call fails before a kernel runs, and the row
  reports it under "failed" (`cosmos3_kernels.gemm`'s docstring says why; docs/perf-log/2026-12-02.md, "GEMMs: QuACK").
- `residual`: the attention-out and down projections, then RMSNorm of the residual stream: cuBLAS then the
  fused add + RMSNorm, against QuACK's GEMM adding into the residual in place, then RMSNorm alone.
- `plain`: every projection (q|k|v, attention-out, MLP input, down), cuBLAS against QuACK's GEMM.
- `step`: one whole step of the engine's fast tower, interleaved in one process (`bench.step_ab`), at Nano
  1280x720/189f and Edge 832x480/121f (--step-shapes): the MLP's activation as its own pass, then in QuACK's
  epilogue (`FastPathOptions.mlp_epilogue`), then that and the residual add in cuBLAS's epilogue
  (`FastPathOptions.residual_epilogue`). ~4 min on an H200. (Its run at 34b0776 had QuACK's plain GEMMs for the
  projections as a tower; the engine has not used them since, docs/perf-log/2026-12-02.md.)

Every QuACK candidate runs at each of --configs, explicit tile configs (its autotuner would compile ~40 configs
a kernel); the first call's compile time is reported. Errors: relative L2 against the fp32 computation on the
same bf16 inputs, first --rows rows; `same_bits_as_baseline` says whether a candidate's output has the cuBLAS
path's bytes (the engine's exact paths would need that). Timing: each round takes one sample of every candidate
in turn (CUDA events around --inner calls), so a clock drifting under the power cap moves them alike; medians
over --rounds.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.bench_flashinfer import add_common_args, chosen_sections, interleaved  # noqa: E402
from bench.bench_kernels import MODELS, gemm_shapes  # noqa: E402
from bench.e2e import run_header  # noqa: E402
from bench.step_ab import step_ab_rows  # noqa: E402
from cosmos3_kernels import gemm, norms  # noqa: E402
from cosmos3_kernels.graphs import capture  # noqa: E402

SECTIONS = ("mlp_in", "residual", "plain", "step")
ROWS = {"Nano": 88320, "Edge": 24180}  # 2 branches x (720p/189f: 44160 | 480p/121f: 12090) gen tokens
EPS = 1e-6
# tile_m x tile_n, p(ingpong) or c(ooperative), cluster_m x cluster_n. 128x192p2x1 is QuACK's SM90 default.
DEFAULT_CONFIGS = "128x192p2x1,256x192c2x1,256x128c2x1"
CONFIG_SPELLING = re.compile(r"^(\d+)x(\d+)([pc])(\d)x(\d)$")


def parse_config(spelling: str) -> dict:
    """'256x192c2x1' -> GemmConfig's fields (see DEFAULT_CONFIGS)."""
    match = CONFIG_SPELLING.match(spelling)
    if match is None:
        raise ValueError(f"--configs: {spelling!r} is not TILE_MxTILE_N(p|c)CLUSTER_MxCLUSTER_N, e.g. 128x192p2x1")
    tile_m, tile_n, kind, cluster_m, cluster_n = match.groups()
    return dict(tile_m=int(tile_m), tile_n=int(tile_n), pingpong=kind == "p", cluster_m=int(cluster_m),
                cluster_n=int(cluster_n), is_dynamic_persistent=False, device_capacity=9)


def residual_reference(x: torch.Tensor, w: torch.Tensor, hidden: torch.Tensor, norm_weight: torch.Tensor,
                       eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 (RMSNorm(hidden + x @ w^T), hidden + x @ w^T)."""
    h = hidden.float() + x.float() @ w.float().T
    return h * torch.rsqrt(h.square().mean(-1, keepdim=True) + eps) * norm_weight.float(), h


def relative_error(out: torch.Tensor, reference: torch.Tensor) -> float:
    return ((out.float() - reference).norm() / reference.norm()).item()


def _first_calls(row: dict, candidates: dict, outputs: dict) -> None:
    """Each candidate's first call (its compile, for QuACK) into row["first_call_s"]; one that raises is reported
    in row["failed"] and dropped (QuACK's fused-activation GEMMs do not build from outside a site-packages folder)."""
    row["first_call_s"], row["failed"] = {}, {}
    for name, fn in list(candidates.items()):
        began = time.perf_counter()
        try:
            fn()
            torch.cuda.synchronize()
        except Exception as err:  # noqa: BLE001 - reported in the row
            row["failed"][name] = f"{type(err).__name__}: {err}"[:500]
            del candidates[name]
            outputs.pop(name, None)
            continue
        row["first_call_s"][name] = time.perf_counter() - began


def _captures(fn) -> bool:
    """Whether one call records into a CUDA graph and replays (the engine captures its whole step)."""
    try:
        graph, _ = capture(fn)
        graph.replay()
        torch.cuda.synchronize()
        return True
    except Exception as err:  # noqa: BLE001 - reported, not fatal: the bench still times it eagerly
        print(json.dumps({"capture_failed": f"{type(err).__name__}: {err}"[:300]}), flush=True)
        return False


def _operands(m: int, k: int, n: int) -> tuple[torch.Tensor, torch.Tensor, torch.Generator]:
    """Seeded bf16 x [m, k] and weight [n, k] (scaled as a trained projection's output stays O(1)), and the
    generator, for whatever else a row draws."""
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(m, k, dtype=torch.bfloat16, device="cuda", generator=g)
    w = torch.randn(n, k, dtype=torch.bfloat16, device="cuda", generator=g) / k ** 0.5
    return x, w, g


def _finish(row: dict, candidates: dict, flops: int, rounds: int, inner: int) -> dict:
    ms = interleaved(candidates, rounds, inner)
    row["ms"] = ms
    row["gemm_tflops"] = {name: flops / t / 1e9 for name, t in ms.items()}
    baseline = next(iter(ms))
    row["speedup_vs_baseline"] = {name: ms[baseline] / t for name, t in ms.items()}
    print(json.dumps(row), flush=True)
    return row


def mlp_in_rows(quack, configs: dict, rounds: int, inner: int, error_rows: int) -> list[dict]:
    rows = []
    for model, cfg in MODELS.items():
        m = ROWS[model]
        k, n = gemm_shapes(cfg)["mlp_in"]
        activation = "swiglu" if cfg["flavour"] == "diffusers" else "relu_sq"
        x, w, _ = _operands(m, k, n)
        outputs = {}

        def cublas_then_pass():
            y = F.linear(x, w)
            if activation == "swiglu":
                half = n // 2
                outputs["cuBLAS + Triton pass"] = norms.swiglu(y[:, :half], y[:, half:])
            else:
                outputs["cuBLAS + Triton pass"] = norms.relu2(y)

        candidates = {"cuBLAS + Triton pass": cublas_then_pass}
        row = {"section": "mlp_in", "model": model, "activation": activation, "m": m, "k": k, "n": n, "captures": {}}
        post_n = n // 2 if activation == "swiglu" else n
        for label, config in configs.items():
            name = f"QuACK {label}"
            out = torch.empty(m, post_n, dtype=torch.bfloat16, device="cuda")
            outputs[name] = out
            extra = {"concat_layout": ("B",)} if activation == "swiglu" else {}
            candidates[name] = (lambda config=config, out=out, extra=extra: quack.gemm_act(
                x, w.T, activation=activation, postact_out=out, store_preact=False, tuned=False, config=config,
                **extra))
        _first_calls(row, candidates, outputs)
        for name, fn in candidates.items():
            row["captures"][name] = _captures(fn)
        reference = gemm.mlp_in_reference(x[:error_rows], w, activation, out_dtype=torch.float32)
        row["rel_error_vs_fp32"] = {name: relative_error(out[:error_rows], reference) for name, out in outputs.items()}
        rows.append(_finish(row, candidates, 2 * m * k * n, rounds, inner))
        del x, w, outputs, candidates
        torch.cuda.empty_cache()
    return rows


def residual_rows(quack, configs: dict, rounds: int, inner: int, error_rows: int) -> list[dict]:
    gemm_fn = quack.gemm_tuned.fn  # the untuned entry with an explicit config (gemm_add_inplace has no config)
    rows = []
    for model, cfg in MODELS.items():
        m = ROWS[model]
        for proj in ("out", "down"):
            k, n = gemm_shapes(cfg)[proj]
            x, w, g = _operands(m, k, n)
            hidden0 = torch.randn(m, n, dtype=torch.bfloat16, device="cuda", generator=g)
            norm_weight = (1 + 0.1 * torch.randn(n, device="cuda", generator=g)).to(torch.bfloat16)
            outputs = {}

            def cublas_then_add_norm():
                outputs["cuBLAS + add+RMSNorm"] = norms.add_rms_norm(F.linear(x, w), hidden0, norm_weight, eps=EPS)

            candidates = {"cuBLAS + add+RMSNorm": cublas_then_add_norm}
            residuals = {}
            for label, config in configs.items():
                name = f"QuACK {label} (+= in place) + RMSNorm"
                residuals[name] = hidden0.clone()

                def fused(config=config, name=name):
                    hidden = residuals[name]
                    gemm_fn(x, w.T, hidden, None, add_to_output=True, config=config)
                    outputs[name] = norms.add_rms_norm(hidden, None, norm_weight, eps=EPS)

                candidates[name] = fused
            row = {"section": "residual", "model": model, "proj": proj, "m": m, "k": k, "n": n, "captures": {}}
            _first_calls(row, candidates, outputs)
            # Error after exactly one call each (the in-place candidates add once into a fresh residual).
            for name in [name for name in residuals if name in candidates]:
                residuals[name].copy_(hidden0)
                candidates[name]()
            cublas_then_add_norm()
            ref_normed, ref_hidden = residual_reference(x[:error_rows], w, hidden0[:error_rows], norm_weight, EPS)
            row["rel_error_vs_fp32"] = {
                name: {"normed": relative_error(normed[:error_rows], ref_normed),
                       "residual": relative_error(hidden[:error_rows], ref_hidden)}
                for name, (normed, hidden) in outputs.items()}
            base = outputs["cuBLAS + add+RMSNorm"]
            row["same_bits_as_baseline"] = {name: all(torch.equal(a, b) for a, b in zip(pair, base))
                                            for name, pair in outputs.items()}
            for name, fn in candidates.items():
                row["captures"][name] = _captures(fn)
            rows.append(_finish(row, candidates, 2 * m * k * n, rounds, inner))
            del x, w, hidden0, outputs, candidates, residuals
            torch.cuda.empty_cache()
    return rows


def plain_rows(quack, configs: dict, rounds: int, inner: int, error_rows: int) -> list[dict]:
    gemm_fn = quack.gemm_tuned.fn
    rows = []
    for model, cfg in MODELS.items():
        m = ROWS[model]
        for proj, (k, n) in gemm_shapes(cfg).items():
            x, w, _ = _operands(m, k, n)
            outputs = {"cuBLAS": torch.empty(m, n, dtype=torch.bfloat16, device="cuda")}
            candidates = {"cuBLAS": lambda: torch.matmul(x, w.T, out=outputs["cuBLAS"])}
            for label, config in configs.items():
                name = f"QuACK {label}"
                outputs[name] = torch.empty(m, n, dtype=torch.bfloat16, device="cuda")
                candidates[name] = (lambda config=config, out=outputs[name]: gemm_fn(x, w.T, out, None, config=config))
            row = {"section": "plain", "model": model, "proj": proj, "m": m, "k": k, "n": n, "captures": {}}
            _first_calls(row, candidates, outputs)
            for name, fn in candidates.items():
                row["captures"][name] = _captures(fn)
            reference = x[:error_rows].float() @ w.float().T
            row["rel_error_vs_fp32"] = {name: relative_error(out[:error_rows], reference)
                                        for name, out in outputs.items()}
            row["same_bits_as_baseline"] = {name: torch.equal(out, outputs["cuBLAS"]) for name, out in outputs.items()}
            rows.append(_finish(row, candidates, 2 * m * k * n, rounds, inner))
            del x, w, outputs, candidates
            torch.cuda.empty_cache()
    return rows


def step_rows(shapes: str, rounds: int) -> list[dict]:
    """`step` (module docstring): the MLP's activation as its own pass and the residual add in the fused add +
    RMSNorm (the baseline), then the activation in QuACK's epilogue, then also the residual add in cuBLAS's."""
    from engine.pipeline.fast_path import FastPathOptions
    from engine.pipeline.tower import make_gen_tower

    def tower(mlp: bool, residual: bool = False):
        options = FastPathOptions(enabled=True, mlp_epilogue=mlp, residual_epilogue=residual)
        return lambda model, inputs: make_gen_tower(model, inputs.cache, inputs.branches, options, inputs.layout)

    def describe(model) -> dict:
        dispatcher = model.runtime.dispatchers.get("auto")
        return {"mlp_in": [dict(x=key[3], w=key[4], path=d.backend, reason=d.reason, split_ms=d.ms.get("torch"),
                                quack_ms=d.ms.get("quack"))
                           for key, d in (dispatcher.decisions().items() if dispatcher else ()) if key[0] == "mlp_in"]}

    return step_ab_rows(shapes, rounds, {"split": tower(False), "MLP epilogue": tower(True),
                                         "MLP + residual epilogues": tower(True, True)}, describe=describe)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_args(parser, SECTIONS)
    parser.add_argument("--configs", default=DEFAULT_CONFIGS, help="QuACK tile configs, comma-separated")
    parser.add_argument("--rows", type=int, default=256, help="rows checked against fp32")
    parser.add_argument("--step-shapes", default="nano:1280x720x189,edge:832x480x121",
                        help="`step`: family:WxHxF, comma-separated")
    parser.add_argument("--step-rounds", type=int, default=3)
    args = parser.parse_args(argv)
    sections = chosen_sections(parser, args.sections, SECTIONS)
    try:
        config_fields = {spelling: parse_config(spelling) for spelling in args.configs.split(",") if spelling}
    except ValueError as err:
        parser.error(str(err))
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9:
        parser.error("this bench times QuACK's Hopper (SM90) GEMMs; this machine has "
                     + (torch.cuda.get_device_name() if torch.cuda.is_available() else "no CUDA GPU"))
    try:
        from quack import gemm_interface as quack  # not a requirement of the engine
        from quack.gemm_config import GemmConfig
    except ImportError as err:
        parser.error(f"QuACK is not importable ({err}); install it with: pip install quack-kernels")
    configs = {spelling: GemmConfig(**fields) for spelling, fields in config_fields.items()}
    results = {"header": run_header(torch.cuda.get_device_name()), "configs": list(configs)}
    print(json.dumps(results["header"]), flush=True)
    section_rows = {"mlp_in": mlp_in_rows, "residual": residual_rows, "plain": plain_rows}
    for section in sections:
        if section == "step":
            results[section] = step_rows(args.step_shapes, args.step_rounds)
        else:
            results[section] = section_rows[section](quack, configs, args.rounds, args.inner, args.rows)
        if args.json:  # after each section, so a run cut short keeps what it measured
            Path(args.json).write_text(json.dumps(results, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
