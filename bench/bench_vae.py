"""Wan2.2 VAE decode at full size: the plain diffusers decode against speedups, same latents, one process.

    python bench/bench_vae.py --sections cheap                  # cudnn.benchmark / channels-last (2 min)
    python bench/bench_vae.py --json $OUT/vae_stage.json        # the decode stage (about 4 min)
    python bench/bench_vae.py --sections engine --json $OUT/vae_engine.json   # through the decode stage
    python bench/bench_vae.py --tiny --json /tmp/vae.json       # the same code on the CPU, a tiny VAE

`cheap`: cuDNN autotuning (`torch.backends.cudnn.benchmark`), channels-last-3d weights and input, and
both, each timed (median of 3 CUDA-event runs after one warm-up) against the plain decode (max abs
difference on the [-1, 1] output).

`stage` (the default): the decode stage, latents to uint8 frames in host memory, at 1280x720/189f and
832x480/121f: the plain decode and today's channels-last path (`engine.pipeline.decode.decode_uint8`)
against the engine's causal walker (`engine.pipeline.causal_decode`) with temporal chunking, fused
norm + SiLU (a Triton kernel writing the conv's padded input, or torch.compile) and stacked-time-tap conv2d. Per variant: a warm-up on a short clip that
has every chunk shape of the full clip (its wall time, minus a second call's, is the compile time;
its [-1, 1] output gives the max abs difference against the plain decode), then the full clip timed
(`cosmos3_kernels.timing`), its uint8 bytes compared with the plain decode's and today's. A torch.profiler
table (top 15 by GPU time) of one steady causal step of today's path and of the fastest variant.

`engine`: the engine's decode stage (`engine.pipeline.decode.decode_stage`, what `engine.generate` runs)
with the fast decode on (the measured rule's plan) and off, first call and warm, bytes compared.
"""
from __future__ import annotations

import argparse
import copy
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.model.runtime import ModelRuntime  # noqa: E402
from bench.models import build_vae  # noqa: E402
from engine.pipeline.causal_decode import DecodePlan, decoded_chunks, latent_steps  # noqa: E402
from engine.pipeline.decode import decode_uint8, diffusers_chunks  # noqa: E402
from cosmos3_kernels.timing import time_ms  # noqa: E402

CASES = (("image 1024x1024", 1, 1024, 1024), ("video 832x480 121f", 121, 480, 832))
FIRST_CASE_SHARE = 0.8
STAGE_CASES = {"720p": (189, 720, 1280), "480p": (121, 480, 832)}
TINY = dict(base_dim=8, decoder_base_dim=8)  # --tiny: the full layout with narrow channels, for CPU runs
# (name, channels-last weights, plan (None = today's decode_uint8), cudnn.benchmark), in the order they run.
VARIANTS = (
    ("channels_last", True, None, False),
    ("triton+fold", True, DecodePlan(elementwise="triton", fold_bias=True), False),
    ("triton+fold+subpixel", True, DecodePlan(elementwise="triton", fold_bias=True, upsample="subpixel"), False),
    ("triton+fold+subpixel+norm_fp32", True,
     DecodePlan(elementwise="triton", fold_bias=True, upsample="subpixel", norm_fp32=True), False),
    ("triton+chunk4", True, DecodePlan(chunk=4, elementwise="triton"), False),
    ("triton", True, DecodePlan(elementwise="triton"), False),
    ("chunk4", True, DecodePlan(chunk=4), False),
    ("triton+conv2d+chunk4", True, DecodePlan(chunk=4, elementwise="triton", conv="2d"), False),
    ("compile+chunk4", True, DecodePlan(chunk=4, elementwise="compile"), False),
    ("triton+chunk8", True, DecodePlan(chunk=8, elementwise="triton"), False),
    ("conv2d", True, DecodePlan(conv="2d"), False),
    ("compile", True, DecodePlan(elementwise="compile"), False),
    ("triton+conv2d+chunk4+benchmark", True, DecodePlan(chunk=4, elementwise="triton", conv="2d"), True),
    ("plain", False, None, False),  # today's loop on contiguous weights (the short-clip references always are)
)
TINY_LATENT_FRAMES = 6  # --tiny: a few latent frames (the CPU convolves slowly), still every step shape


def _set_format(module, channels_last: bool) -> None:
    """Conv3d weights to channels-last-3d (or back); other parameters keep their layout."""
    layout = torch.channels_last_3d if channels_last else torch.contiguous_format
    for param in module.parameters():
        if param.dim() == 5:
            param.data = param.data.contiguous(memory_format=layout)


def _time(fn, iters=3):
    """Median ms of `fn` after one warm-up (cosmos3_kernels.timing), and its last output."""
    held = {}
    timing = time_ms(lambda: held.__setitem__("out", fn()), warmup=1, iters=iters)
    return timing.median_ms, held["out"]


@torch.no_grad()
def cheap(device: str, tiny: bool) -> list[dict]:
    vae = build_vae(device, **(TINY if tiny else {}))
    rows = []
    for label, frames, height, width in CASES:
        generator = torch.Generator(device=device).manual_seed(0)
        latent = torch.randn(1, 48, (frames - 1) // 4 + 1, height // 16, width // 16, device=device,
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
    torch.backends.cudnn.benchmark = False
    print("| decode | variant | ms | speedup | max abs diff vs plain |\n|---|---|---|---|---|")
    base = {r["decode"]: r["ms"] for r in rows if r["variant"] == "plain"}
    for r in rows:
        print(f"| {r['decode']} | {r['variant']} | {r['ms']:.1f} | {base[r['decode']] / r['ms']:.2f}x | {r['max_abs_diff']:.1e} |")
    return rows


# -- the decode stage ----------------------------------------------------------------------------


def _sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def float_frames(vae, z: torch.Tensor, plan: DecodePlan | None) -> torch.Tensor:
    """The decoder's clamped [-1, 1] output [1, 3, T, H, W] (diffusers' vae.decode for plan None)."""
    if plan is None:
        return vae.decode(z).sample
    return torch.cat(list(decoded_chunks(vae, z, plan)), dim=2)


def short_length(latent_frames: int, chunk: int) -> int:
    """The shortest clip with every causal step shape of the full clip (first, steady, remainder)."""
    rest = (latent_frames - 1) % chunk
    return min(latent_frames, 1 + chunk + rest)


def _profile_table(fn, device: str) -> tuple[str, list[dict]]:
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    with profile(activities=activities) as prof:
        fn()
        _sync()
    averages = prof.key_averages()
    key = "self_device_time_total" if device == "cuda" else "self_cpu_time_total"
    table = averages.table(sort_by=key, row_limit=15, max_name_column_width=70)
    rows = sorted(averages, key=lambda e: -getattr(e, key, 0.0))[:15]
    return table, [{"name": e.key, "self_us": float(getattr(e, key, 0.0)), "calls": e.count} for e in rows]


def profile_step(vae, z: torch.Tensor, plan: DecodePlan | None, device: str) -> dict:
    """torch.profiler over the third causal step (a steady one) of a decode of z: today's loop
    (`diffusers_chunks`, diffusers' decoder one latent frame a step) for plan None, else the walker."""
    steps = latent_steps(z.shape[2], plan.chunk if plan is not None else 1)[:3]
    head = z[:, :, :steps[-1][1]]
    chunks = diffusers_chunks(vae, head) if plan is None else decoded_chunks(vae, head, plan)
    next(chunks), next(chunks)
    table, top = _profile_table(lambda: next(chunks), device)
    chunks.close()
    frames = steps[-1][1] - steps[-1][0]
    print(table, flush=True)
    return {"latent_frames_in_step": frames, "table": table, "top15": top}


def _compare(frames, reference_u8: torch.Tensor | None, device: str) -> dict:
    if reference_u8 is None:
        return {}
    ours = torch.from_numpy(frames).to(device)
    if ours.shape != reference_u8.shape:
        return {"bytes_equal": False, "shape": list(ours.shape)}
    diff = (ours.int() - reference_u8.int()).abs()
    return {"bytes_equal": bool(diff.max() == 0), "max_u8_diff": int(diff.max()),
            "pixels_off": float((diff > 0).float().mean())}


def _warm(vae, z, plan, reference_float, compiles: bool, reference_fp32: torch.Tensor | None = None) -> dict:
    """First and second call on the short clip: compile time, and the [-1, 1] difference vs plain (and, with
    `reference_fp32`, the error against an fp32 decode: RMS and max)."""
    _sync()
    began = time.perf_counter()
    out = float_frames(vae, z, plan)
    _sync()
    first = time.perf_counter() - began
    result = {"short_latent_frames": z.shape[2], "first_call_s": first}
    if compiles:  # a second call tells the compile (Triton / inductor / cuDNN autotuning) from the run
        began = time.perf_counter()
        float_frames(vae, z, plan)
        _sync()
        result["second_call_s"] = time.perf_counter() - began
        result["compile_s"] = max(0.0, first - result["second_call_s"])
    if reference_float is not None:
        result["max_abs_diff_vs_plain"] = float((out.float() - reference_float.float()).abs().max())
    if reference_fp32 is not None:
        error = out.float() - reference_fp32
        result["rms_vs_fp32"] = float(error.pow(2).mean().sqrt())
        result["max_abs_vs_fp32"] = float(error.abs().max())
    return result


@torch.no_grad()
def stage_case(vae, label: str, frames: int, height: int, width: int, args,
               deadline: float) -> tuple[list[dict], torch.Tensor]:
    device = args.device
    generator = torch.Generator(device=device).manual_seed(0)
    scale = 16 if not args.tiny else 16 * 32  # --tiny: the same frame counts at a few latent pixels
    latent_t = (frames - 1) // 4 + 1 if not args.tiny else TINY_LATENT_FRAMES + (frames > 150)
    latent = torch.randn(1, 48, latent_t, max(2, height // scale), max(2, width // scale), device=device,
                         dtype=vae.dtype, generator=generator)
    plans = [v for v in VARIANTS if v[0] in args.variants]
    shorts = {short_length(latent_t, plan.chunk if plan else 1) for _, _, plan, _ in plans}
    _set_format(vae, False)
    reference_float = {n: float_frames(vae, latent[:, :, :n], None) for n in sorted(shorts)}
    reference_fp32 = {}
    if args.fp32_reference:  # the yardstick: every variant's error, and the plain bf16 decode's own
        vae32 = copy.deepcopy(vae).float()
        reference_fp32 = {n: float_frames(vae32, latent[:, :, :n].float(), None).float() for n in sorted(shorts)}
        del vae32
    rows, reference_u8, today_u8 = [], None, None
    for name, channels_last, plan, benchmark in plans:
        row = {"case": label, "variant": name, "plan": None if plan is None else plan.__dict__,
               "channels_last": channels_last, "cudnn_benchmark": benchmark}
        if time.perf_counter() > deadline:
            rows.append({**row, "skipped": "time budget"})
            print(_line(rows[-1]), flush=True)
            continue
        _set_format(vae, channels_last)
        torch.backends.cudnn.benchmark = benchmark
        z = latent.contiguous(memory_format=torch.channels_last_3d) if channels_last else latent
        try:
            short = short_length(latent_t, plan.chunk if plan else 1)
            compiles = benchmark or (plan is not None and plan.elementwise != "eager")
            row["warm"] = _warm(vae, z[:, :, :short], plan, reference_float[short], compiles, reference_fp32.get(short))
            timing = time_ms(lambda: row.__setitem__("frames", decode_uint8(vae, z, plan)), warmup=0, iters=args.iters)
            row["ms"] = timing.median_ms
            row["samples_ms"] = list(timing.samples_ms)
            out = row.pop("frames")
            if name != "channels_last":
                row["vs_today"] = _compare(out, today_u8, device)
            if name != "plain" and reference_u8 is not None:
                row["vs_plain"] = _compare(out, reference_u8, device)
            if name == "plain":
                reference_u8 = torch.from_numpy(out).to(device)
            elif name == "channels_last":
                today_u8 = torch.from_numpy(out).to(device)
            del out
        except Exception as error:  # one failing candidate must not cost the others' measurements
            row["error"] = f"{type(error).__name__}: {error}"[:2000]
        torch.backends.cudnn.benchmark = False
        if device == "cuda":
            row["peak_gib"] = torch.cuda.max_memory_allocated() / 2**30
            torch.cuda.reset_peak_memory_stats()
            torch.cuda.empty_cache()
        rows.append(row)
        print(_line(row), flush=True)
    return rows, latent


@torch.no_grad()
def profiles(vae, rows: list[dict], latent: torch.Tensor, label: str, device: str) -> list[dict]:
    """Profile one steady causal step of today's path and of the fastest variant of `label`."""
    timed = [r for r in rows if r.get("case") == label and "ms" in r and r["variant"] != "plain"]
    out = []
    if not timed:
        return out
    best = min(timed, key=lambda r: r["ms"])
    for name in dict.fromkeys(("channels_last", best["variant"])):
        _, channels_last, plan, benchmark = next(v for v in VARIANTS if v[0] == name)
        _set_format(vae, channels_last)
        torch.backends.cudnn.benchmark = benchmark
        z = latent.contiguous(memory_format=torch.channels_last_3d) if channels_last else latent
        try:
            out.append({"case": label, "variant": name, "profile": profile_step(vae, z, plan, device)})
        except Exception as error:
            out.append({"case": label, "variant": name, "profile_error": f"{type(error).__name__}: {error}"})
        torch.backends.cudnn.benchmark = False
    return out


def _line(row: dict) -> str:
    """One compact line per variant as it finishes (the JSON keeps everything)."""
    if "ms" not in row:
        return f"{row['case']} {row['variant']}: {row.get('error') or row.get('skipped')}"
    warm, today = row.get("warm", {}), row.get("vs_today", {})
    return (f"{row['case']} {row['variant']}: {row['ms']:.0f} ms, compile {warm.get('compile_s', 0):.1f} s, "
            f"max diff vs plain {warm.get('max_abs_diff_vs_plain', float('nan')):.1e}, vs fp32 rms "
            f"{warm.get('rms_vs_fp32', float('nan')):.2e} max {warm.get('max_abs_vs_fp32', float('nan')):.1e}, "
            f"bytes = today "
            f"{today.get('bytes_equal')} (max {today.get('max_u8_diff')}), peak {row.get('peak_gib', 0):.1f} GiB")


def summary(rows: list[dict]) -> str:
    lines = ["| case | variant | stage ms | vs today | compile s | max abs diff vs plain | RMS / max error vs fp32 | "
             "bytes = plain | bytes = today | max uint8 diff vs today |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    today = {r["case"]: r["ms"] for r in rows if r.get("variant") == "channels_last" and "ms" in r}
    for r in rows:
        if "ms" not in r:
            if "profile" not in r and "profile_error" not in r:
                lines.append(f"| {r['case']} | {r['variant']} | {r.get('error') or r.get('skipped')} | | | | | | | |")
            continue
        warm, plain, now = r.get("warm", {}), r.get("vs_plain", {}), r.get("vs_today", {})
        ratio = f"{today[r['case']] / r['ms']:.3f}x" if r["case"] in today else ""
        fp32 = (f"{warm['rms_vs_fp32']:.2e} / {warm['max_abs_vs_fp32']:.1e}" if "rms_vs_fp32" in warm else "")
        lines.append(f"| {r['case']} | {r['variant']} | {r['ms']:.0f} | {ratio} | {warm.get('compile_s', 0):.1f} | "
                     f"{warm.get('max_abs_diff_vs_plain', 0):.1e} | {fp32} | {plain.get('bytes_equal', '')} | "
                     f"{now.get('bytes_equal', '')} | {now.get('max_u8_diff', '')} |")
    return "\n".join(lines)


def stage(args) -> list[dict]:
    began = time.perf_counter()
    vae = build_vae(args.device, **(TINY if args.tiny else {}))
    rows = []
    first_latent = None
    for index, label in enumerate(args.cases):
        # The first case (720p, the target) may use FIRST_CASE_SHARE of the budget; the rest what is left.
        share = FIRST_CASE_SHARE if index == 0 and len(args.cases) > 1 else 1.0
        deadline = began + share * args.budget_s
        case_rows, latent = stage_case(vae, label, *STAGE_CASES[label], args, deadline)
        rows += case_rows
        if index == 0:
            first_latent = latent
        del latent
    print(summary(rows), flush=True)
    if args.profile and first_latent is not None:  # last: the least important, and only within the budget's slack
        if time.perf_counter() < began + args.budget_s + args.profile_slack_s:
            rows += profiles(vae, rows, first_latent, args.cases[0], args.device)
    print(f"stage section: {time.perf_counter() - began:.0f} s", flush=True)
    return rows


@torch.no_grad()
def engine_stage(args) -> list[dict]:
    """`engine.pipeline.decode.decode_stage` as `engine.generate` runs it (fast path on: channels-last,
    uint8 frames), with the fast decode's plan (`causal_decode.plan_for`) against COSMOS3_VAE_FAST_DECODE=0.
    Each twice: the first call pays kernel compiles; the second is what a warm request sees."""
    from types import SimpleNamespace

    import numpy as np

    from engine.pipeline.causal_decode import plan_for
    from engine.pipeline.decode import decode_stage
    from engine.pipeline.fast_path import FastPathOptions
    from engine.pipeline.state import Latents, RunState

    vae = build_vae(args.device, **(TINY if args.tiny else {}))
    model = SimpleNamespace(vae=vae, parallel=None, safety_checker=None, runtime=ModelRuntime())
    rows = []
    for label in args.cases:
        frames, height, width = STAGE_CASES[label]
        scale = 16 if not args.tiny else 16 * 32
        latent_t = (frames - 1) // 4 + 1 if not args.tiny else TINY_LATENT_FRAMES
        generator = torch.Generator(device=args.device).manual_seed(0)
        vision = torch.randn(1, 48, latent_t, max(2, height // scale), max(2, width // scale), device=args.device,
                             generator=generator)
        row, outputs = {"case": label}, {}
        for name, fast_decode in (("fast decode off", False), ("fast decode on", True)):
            options = FastPathOptions(enabled=True, vae_fast_decode=fast_decode)
            row[name + " plan"] = str(plan_for(vae, tuple(vision.shape), vision.device.type, options))
            for run in ("first", "warm"):
                state = RunState(model=model, request={"mode": "t2v"}, seed=0, generator=None, options=options,
                                 latents=Latents(vision=vision, vision_mask=torch.zeros(latent_t, 1, 1)))
                _sync()
                if args.device == "cuda":
                    torch.cuda.reset_peak_memory_stats()
                began = time.perf_counter()
                decode_stage(state)
                row[f"{name} {run} s"] = time.perf_counter() - began
                if args.device == "cuda":
                    row[f"{name} peak GiB"] = torch.cuda.max_memory_allocated() / 2**30
            outputs[name] = state.frames
        off, on = (outputs[n].astype(np.int16) for n in ("fast decode off", "fast decode on"))
        row["shape"] = list(on.shape)
        row["bytes_equal"] = bool(np.array_equal(off, on))
        row["max_u8_diff"] = int(np.abs(off - on).max())
        row["pixels_off"] = float((off != on).mean())
        print(json.dumps(row), flush=True)
        rows.append(row)
        del outputs, off, on
        if args.device == "cuda":
            torch.cuda.empty_cache()
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sections", default="stage", help="comma list of: cheap, stage, engine")
    parser.add_argument("--cases", default="720p,480p", help="stage cases: 720p, 480p")
    parser.add_argument("--variants", default=",".join(v[0] for v in VARIANTS))
    parser.add_argument("--iters", type=int, default=1, help="timed full-clip runs per variant")
    parser.add_argument("--budget-s", type=float, default=125.0, help="skip the remaining variants after this")
    parser.add_argument("--no-profile", dest="profile", action="store_false")
    parser.add_argument("--profile-slack-s", type=float, default=30.0, help="profile only if the cases ended by budget + this")
    parser.add_argument("--tiny", action="store_true", help="narrow VAE and a few latent pixels (CPU check)")
    parser.add_argument("--fp32-reference", action="store_true",
                        help="stage: each variant's error against an fp32 decode of the short clip")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    args.cases = [c for c in args.cases.split(",") if c]
    args.variants = set(args.variants.split(","))
    args.device = "cuda" if torch.cuda.is_available() else "cpu"
    result = {"device": torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu",
              "torch": torch.__version__, "args": {k: sorted(v) if isinstance(v, set) else v for k, v in vars(args).items()}}
    for section in args.sections.split(","):
        run = {"cheap": lambda: cheap(args.device, args.tiny), "stage": lambda: stage(args),
               "engine": lambda: engine_stage(args)}[section]
        result[section] = run()
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
