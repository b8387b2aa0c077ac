"""Per-step speed of our engine against diffusers' Cosmos3OmniTransformer, same weights, one run.

    python bench/bench_engine.py                 # the H200 table (about 6-8 minutes)
    python bench/bench_engine.py --smoke         # a tiny CPU run that only checks the script works
    python bench/bench_engine.py --e2e all --warm-up-effect --fp8-step 1280x720x189   # end to end (bench/e2e.py)
    python bench/bench_engine.py --e2e-ablate edge-t2i-640,nano-t2i-1024            # the new pieces, one at a time
    python bench/bench_engine.py --table short        # docs/perf-log/2026-12-02.md's end-to-end table, one section per call
    python bench/bench_engine.py --render a.json b.json                             # that table from saved runs
    python bench/bench_engine.py --e2e super-t2v-720p,super-t2i-1024 --cold-only super-t2v-720p --steps 4  # Super, FP8
    python bench/bench_engine.py --fresh-process edge-t2v-480p,nano-t2i-1024    # first request of a new process

For each workload it builds the inputs of one denoising step with both CFG branches (JSON-caption
prefixes of 1615 and 2866 tokens, as measured for real captions) and times:
- diffusers: two full forwards (text tower included), as `Cosmos3OmniPipeline` runs every step;
- engine: our step (gen tokens once, the fast gen tower for both branches, velocities);
- ablations on the T2I shapes: prefix cache only (exact eager tower), no CUDA graphs, kernels off.
Times are medians over CUDA-event-timed runs after warm-up, with min and max. TFLOP/s counts the gen
step's matmul FLOPs; the floor is those FLOPs at the measured 790 TFLOP/s bf16 matmul rate.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.e2e import TABLE_SECTIONS, table_markdown  # noqa: E402
from bench.models import as_loaded_model, build_transformer, build_vae, gen_step_flops, step_inputs  # noqa: E402
from engine.pipeline.fast_path import FastPathOptions  # noqa: E402
from engine.pipeline.tower import EagerGenTower, make_gen_tower  # noqa: E402
from cosmos3_kernels.timing import time_ms  # noqa: E402

MATMUL_CEILING_TFLOPS = 790.0

WORKLOADS = {
    "nano": [("Nano T2I 1024x1024", 1024, 1024, 1), ("Nano T2V 832x480 121f", 832, 480, 121),
             ("Nano T2V 1280x720 189f", 1280, 720, 189)],
    "edge": [("Edge T2I 640x640", 640, 640, 1), ("Edge T2V 832x480 121f", 832, 480, 121)],
}


def timed(fn, warmup: int, iters: int) -> dict:
    """Median, min and max ms of `fn` (cosmos3_kernels.timing, the helper the kernel dispatcher measures with)."""
    return time_ms(fn, warmup=warmup, iters=iters).summary()


def _max_error(ours, reference) -> float:
    return max(float((a - b).norm() / b.norm()) for a, b in zip(ours, reference))


def peak_gib(fn) -> float:
    if not torch.cuda.is_available():
        return 0.0
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    fn()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() / 2**30


def bench_workload(model, label, width, height, frames, iters, ablate, prefix_lens):
    inputs = step_inputs(model, width=width, height=height, frames=frames, prefix_lens=prefix_lens)
    flops = gen_step_flops(model, inputs)
    rows = {}
    with torch.no_grad():
        rows["diffusers"] = timed(inputs.diffusers_step, 1, iters)
        rows["diffusers"]["peak_gib"] = peak_gib(inputs.diffusers_step)
        tower = make_gen_tower(model, inputs.cache, inputs.branches, layout=inputs.layout)
        rows["engine"] = timed(lambda: inputs.engine_step(tower), 2, iters)
        rows["engine"]["peak_gib"] = peak_gib(lambda: inputs.engine_step(tower))
        rows["engine"]["path"] = type(tower).__name__
        if ablate:
            exact = EagerGenTower(model, inputs.cache, inputs.branches)
            model.fast_path = FastPathOptions(enabled=False)  # the exact path throughout, gen tokens included
            rows["prefix cache only"] = timed(lambda: inputs.engine_step(exact), 1, iters)
            reference = inputs.diffusers_step()
            rows["prefix cache only"]["rel_error"] = _max_error(inputs.engine_step(exact), reference)
            for name, options in (
                ("fast, no CUDA graphs", FastPathOptions(True, True, False, "auto", True)),
                ("fast, kernels off", FastPathOptions(True, True, True, "torch", True)),
                ("fast, CFG not batched", FastPathOptions(True, False, True, "auto", True)),
                ("fast, projections not fused", FastPathOptions(True, True, True, "auto", False)),
            ):
                model.fast_path = options
                variant = make_gen_tower(model, inputs.cache, inputs.branches, layout=inputs.layout)
                rows[name] = timed(lambda: inputs.engine_step(variant), 2, iters)
                rows[name]["rel_error"] = _max_error(inputs.engine_step(variant), reference)
                del variant
            model.fast_path = None
        reference = inputs.diffusers_step()
        ours = inputs.engine_step(tower)
        errors = [float((a - b).norm() / b.norm()) for a, b in zip(ours, reference)]
    del tower, inputs
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    floor_ms = flops / (MATMUL_CEILING_TFLOPS * 1e12) * 1e3
    return {"workload": label, "flops": flops, "floor_ms": floor_ms,
            "rel_error": errors, "rows": rows}


def bench_vae(vae, iters) -> list[dict]:
    out = []
    for label, frames, height, width in (("image 1024x1024", 1, 1024, 1024), ("video 832x480 121f", 121, 480, 832),
                                         ("video 1280x720 189f", 189, 720, 1280)):
        latent = torch.randn(1, 48, (frames - 1) // 4 + 1, height // 16, width // 16, device=vae.device, dtype=vae.dtype)
        with torch.no_grad():
            stats = timed(lambda: vae.decode(latent).sample, 1 if frames == 1 else 0, iters if frames == 1 else 1)
            stats["peak_gib"] = peak_gib(lambda: vae.decode(latent).sample)
        out.append({"decode": label, **stats})
        del latent
        torch.cuda.empty_cache()
    return out


def bench_end_to_end(transformer, vae) -> dict:
    """Nano T2I 1024x1024, prompt to decoded image, ours and diffusers', same weights and seed."""
    from engine.pipeline.run import generate
    from engine.model.tiny import build_tokenizer

    tokenizer = build_tokenizer()
    model = as_loaded_model(transformer, "nano", vae=vae, tokenizer=tokenizer)
    caption = Path(__file__).resolve().parents[1] / "assets" / "captions" / "image_lighthouse_keeper.json"
    prompt = caption.read_text() if caption.is_file() else "A lighthouse keeper at dusk. " * 60
    request = dict(mode="t2i", prompt=prompt, seed=1, width=1024, height=1024)
    generate(model, dict(request, steps=2))  # warm-up: kernels compile, dispatch measures
    torch.cuda.synchronize()
    began = time.perf_counter()
    result = generate(model, request)
    torch.cuda.synchronize()
    ours = time.perf_counter() - began
    pipe = model.diffusers_pipeline(model.make_scheduler(flow_shift=3.0, use_karras_sigmas=False))
    began = time.perf_counter()
    pipe(result.prompt_text, num_frames=1, width=1024, height=1024, num_inference_steps=result.params["steps"],
         guidance_scale=result.params["guidance_scale"], generator=torch.Generator().manual_seed(1),
         add_resolution_template=False, add_duration_template=False, output_type="np")
    torch.cuda.synchronize()
    theirs = time.perf_counter() - began
    return {"steps": result.params["steps"], "guidance_interval": result.params["guidance_interval"],
            "engine_s": ours, "engine_timings": result.timings, "diffusers_s": theirs,
            "prompt_chars": len(result.prompt_text),
            "prompt_tokens": len(tokenizer.apply_chat_template([{"role": "user", "content": result.prompt_text}],
                                                               tokenize=True, return_dict=True)["input_ids"])}


def markdown(results: list[dict]) -> str:
    lines = ["| workload | diffusers ms/step | engine ms/step | ratio | engine TFLOP/s | floor ms | peak GiB (ours / theirs) | rel. error |",
             "|---|---|---|---|---|---|---|---|"]
    for r in results:
        d, e = r["rows"]["diffusers"], r["rows"]["engine"]
        tflops = r["flops"] / (e["median_ms"] / 1e3) / 1e12
        lines.append(f"| {r['workload']} | {d['median_ms']:.1f} ({d['min_ms']:.1f}-{d['max_ms']:.1f}) | "
                     f"{e['median_ms']:.1f} ({e['min_ms']:.1f}-{e['max_ms']:.1f}) | {d['median_ms'] / e['median_ms']:.2f}x | "
                     f"{tflops:.0f} | {r['floor_ms']:.1f} | {e['peak_gib']:.1f} / {d['peak_gib']:.1f} | "
                     f"{max(r['rel_error']):.1e} |")
    ablations = [r for r in results if len(r["rows"]) > 2]
    if ablations:
        lines += ["", "| workload | " + " | ".join(k for k in ablations[0]["rows"]) + " |",
                  "|---|" + "---|" * len(ablations[0]["rows"])]
        for r in ablations:
            lines.append(f"| {r['workload']} | " + " | ".join(
                f"{v['median_ms']:.1f}" + (f" (err {v['rel_error']:.1e})" if "rel_error" in v else "")
                for v in r["rows"].values()) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--families", default="nano,edge")
    parser.add_argument("--iters", type=int, default=5)
    parser.add_argument("--only-t2i", action="store_true", help="image workloads only (quick check)")
    parser.add_argument("--skip-vae", action="store_true")
    parser.add_argument("--skip-e2e", action="store_true")
    parser.add_argument("--smoke", action="store_true", help="tiny dims on the CPU: checks the script, times nothing real")
    parser.add_argument("--json", default=None, help="write the raw results here")
    parser.add_argument("--e2e", default=None, help="end-to-end workloads (bench/e2e.py WORKLOADS), comma-separated, "
                        "or 'all': prefill/denoise/decode/total, cold and warm, beside the published numbers")
    parser.add_argument("--e2e-ablate", default=None, help="workloads to ablate the new pieces on (whole step, "
                        "uint8 decode, FP8, a new prompt length with and without the lengths on the device), plus the "
                        "warm-up effect and the decode variants")
    parser.add_argument("--warm-up-effect", action="store_true",
                        help="after the Edge rows: engine.serving.warmup over the T2I sizes, then a first request at 640x480")
    parser.add_argument("--warm-up-first", default=None,
                        help="workloads (comma-separated) whose family's fresh model first runs engine.serving.warmup over "
                        "that mode's sizes, then the workload's first request and a warm repeat (before any other row)")
    parser.add_argument("--profile-step", default=None, help="after a family's rows: one warm step's GPU kernels at "
                        "[FAMILY:]WxHxF, Nano unless FAMILY (edge or nano) is given (torch.profiler, top kernels by "
                        "device time)")
    parser.add_argument("--profile-request", default=None, help="e2e workloads to run once more, warm, under "
                        "torch.profiler: the GPU's busy share of the request and its top kernels")
    parser.add_argument("--profile-prefixes", default="1615,2866", help="text tokens of the two CFG branches in "
                        "--profile-step (generate's default empty negative prompt is ~59 tokens)")
    parser.add_argument("--fp8", action="store_true", help="the e2e requests in the FP8 mode (COSMOS3_FP8=1: "
                        "each family's measured FP8 policy for the request's size, engine.pipeline.fp8)")
    parser.add_argument("--fp8-step", default=None, help="after the Nano rows: one step bf16 vs FP8 at WxHxF")
    parser.add_argument("--fp8-policies", default="", help="--fp8-step's FP8 policies, comma-separated (engine.pipeline."
                        "fp8.FP8Policy; '' or none: the family's FP8 mode); its CFG prefixes are --profile-prefixes")
    parser.add_argument("--fp8-attention", default="", help="--fp8-step: each policy naming 'attn' once per "
                        "comma-separated FP8 attention kernel (COSMOS3_FP8_ATTENTION: fa3, cudnn; '': the engine's "
                        "choice), in order, e.g. fa3,cudnn,fa3,cudnn")
    parser.add_argument("--cold-only", default="nano-t2v-720p", help="e2e workloads measured cold only (device time)")
    parser.add_argument("--prompt-tokens", type=int, default=1600, help="e2e: the caption's length in tokens")
    parser.add_argument("--steps", default=None, help="e2e: run this many denoising steps instead of the workload's "
                        "(N for every row, or WORKLOAD=N,...); such a row also gets its total projected to the "
                        "workload's steps (a projection)")
    parser.add_argument("--fresh-process", default=None, help="e2e workloads (comma-separated) each run in new "
                        "processes over one kernel cache folder (bench/fresh_process.py): a first process from an "
                        "empty cache, then a second after it: its first request against a warm one")
    parser.add_argument("--profile-cold", action="store_true", help="e2e and --fresh-process: each cold request "
                        "runs under cProfile, its top functions kept in the row (the request's time then includes "
                        "the profiler's overhead)")
    parser.add_argument("--fresh-process-warm-up", action="store_true", help="--fresh-process: also a process that "
                        "runs the app's start-up warm-up over the workload's mode before its first request")
    parser.add_argument("--fresh-process-baseline", action="store_true", help="--fresh-process: also a process "
                        "that keeps the compiled kernels but not the dispatch decisions (as before they were kept)")
    parser.add_argument("--table", choices=sorted(TABLE_SECTIONS), default=None,
                        help="one section of docs/perf-log/2026-12-02.md's end-to-end table (bench/e2e.py TABLE_SECTIONS): "
                        "runs its arguments and prints its rows with the targets' status")
    parser.add_argument("--render", nargs="+", default=None, metavar="JSON",
                        help="print the end-to-end table of earlier --e2e or --table runs' JSON files (no GPU)")
    args = parser.parse_args(argv)
    if args.fp8:
        os.environ["COSMOS3_FP8"] = "1"  # read by engine.config.build_config as each model of the run loads
    if args.render:
        for path in args.render:
            print(table_markdown(json.loads(Path(path).read_text())) + "\n")
        return 0
    if args.table:  # the section's arguments first, so that any given on the command line (--json) apply too
        args = parser.parse_args(TABLE_SECTIONS[args.table] + list(sys.argv[1:] if argv is None else argv))
    if args.fresh_process:
        from bench.fresh_process import main_fresh

        return main_fresh(args)
    if args.e2e or args.e2e_ablate or args.warm_up_effect or args.warm_up_first or args.fp8_step or args.profile_step:
        return main_e2e(args)
    device = "cuda" if torch.cuda.is_available() and not args.smoke else "cpu"
    if args.smoke:
        from bench import models

        for spec in models.TRANSFORMERS.values():
            spec.update(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                        head_dim=32, intermediate_size=128, vocab_size=1000)
    header = {"date": time.strftime("%Y-%m-%d"), "torch": torch.__version__,
              "gpu": torch.cuda.get_device_name() if device == "cuda" else "cpu (smoke)"}
    try:
        import triton

        header["triton"] = triton.__version__
    except ImportError:
        pass
    print(json.dumps(header), flush=True)
    results, vae_rows, e2e = [], [], None
    for family in args.families.split(","):
        dtype = torch.bfloat16 if device == "cuda" else torch.float32
        transformer = build_transformer(family, device=device, dtype=dtype)
        model = as_loaded_model(transformer, family)
        if args.smoke:
            model.transformer.config.rope_axes_dim = [8, 4, 4]
        for label, width, height, frames in WORKLOADS[family]:
            if args.only_t2i and frames != 1:
                continue
            if args.smoke:
                width, height, frames = 64, 64, 1 if frames == 1 else 5
            ablate = frames == 1
            iters = args.iters if frames == 1 else max(2, args.iters // 2)
            result = bench_workload(model, label, width, height, frames, iters, ablate, (1615, 2866) if not args.smoke else (20, 31))
            result["gen_tokens"] = ((frames - 1) // 4 + 1) * (height // 32) * (width // 32)
            results.append(result)
            print(json.dumps(result), flush=True)
        if family == "nano" and device == "cuda" and not (args.skip_vae and args.skip_e2e):
            vae = build_vae(device)
            if not args.skip_vae:
                vae_rows = bench_vae(vae, 3)
                print(json.dumps(vae_rows), flush=True)
            if not args.skip_e2e:
                e2e = bench_end_to_end(transformer, vae)
                print(json.dumps(e2e), flush=True)
            del vae
        del model, transformer
        gc.collect()
        if device == "cuda":
            torch.cuda.empty_cache()
    print(markdown(results))
    if args.json:
        Path(args.json).write_text(json.dumps({"header": header, "steps": results, "vae": vae_rows, "e2e": e2e}, indent=2))
    return 0


def steps_for(spelling: str | None, workload: str) -> int | None:
    """`--steps`' count for `workload`: N for every workload, or WORKLOAD=N pairs (None: the workload's own)."""
    if not spelling:
        return None
    if "=" not in spelling:
        return int(spelling)
    pairs = dict(item.split("=") for item in spelling.split(",") if item)
    return int(pairs[workload]) if workload in pairs else None


def load_family(family: str, log=print):
    """A full-size random-weight model of `family`, as `engine.load_model` would leave it: Super built FP8-only (its
    bf16 weights do not fit one GPU) with its memory plan made and logged (engine.pipeline.memory)."""
    from engine.model.tiny import build_tokenizer
    from engine.pipeline.fast_path import load_kernels
    from engine.pipeline.memory import prepare_at_load

    if family != "super":
        model = as_loaded_model(build_transformer(family), family, vae=build_vae(), tokenizer=build_tokenizer())
        facts = {"family": family}
    else:
        from bench.bench_fp8 import build_super
        from engine.pipeline import fp8

        model, facts = build_super("cuda", fp8.host_policy("super", "cuda").name, log=log)
        began = time.perf_counter()
        facts["memory_plan"] = prepare_at_load(model)
        facts["prepare_s"] = time.perf_counter() - began  # the text tower's host copy, pinned, where it is made
        facts["text_tower_on_host"] = model.text_tower is not None
    began = time.perf_counter()
    facts["kernel_libraries"] = load_kernels(model)  # as engine.load_model: before the first request
    facts["load_kernels_s"] = time.perf_counter() - began
    log(facts)
    return model


def main_e2e(args) -> int:
    """The end-to-end sections: one model per family, built once, workloads in the order given."""
    from bench import e2e

    header = e2e.run_header(torch.cuda.get_device_name())
    print(json.dumps(header), flush=True)
    clocks = e2e.ClockSampler()
    # "all": every workload but Super's (built FP8-only, minutes a request: named on their own)
    names = ([n for n, w in e2e.WORKLOADS.items() if w[0] != "super"] if args.e2e == "all"
             else [n for n in (args.e2e or "").split(",") if n])
    ablate = [n for n in (args.e2e_ablate or "").split(",") if n]
    warm_first = [n for n in (args.warm_up_first or "").split(",") if n]
    results = {"header": header, "e2e": [], "ablations": [], "warm_up": None, "warm_up_first": [], "decode": None,
               "fp8_step": None, "profile_step": None}
    def log(row):
        print(json.dumps(row, default=str), flush=True)
        if args.json:  # as it goes, so a run cut short keeps what it measured
            Path(args.json).write_text(json.dumps(results, indent=2, default=str))

    for family in ("edge", "nano", "super"):
        mine = [n for n in names if e2e.WORKLOADS[n][0] == family]
        mine_ablate = [n for n in ablate if e2e.WORKLOADS[n][0] == family]
        mine_warm_first = [n for n in warm_first if e2e.WORKLOADS[n][0] == family]
        profile_family, _, profile_shape = (args.profile_step or "").rpartition(":")
        profile_family = profile_family or "nano"
        extra = ((args.warm_up_effect and family == "edge") or (args.fp8_step and family == "nano")
                 or (args.profile_step and family == profile_family))
        if not (mine or mine_ablate or mine_warm_first or extra):
            continue
        model = load_family(family, log)
        for name in mine_warm_first:  # first, while the process has compiled and measured nothing for this model
            results["warm_up_first"].append(dict(workload=name, **e2e.warm_up_effect(model, name, log=log)))
        for name in mine:
            e2e.run(model, [name], warm=name not in args.cold_only.split(","), log=log, rows=results["e2e"],
                    prompt_tokens=args.prompt_tokens, steps=steps_for(args.steps, name), profile_cold=args.profile_cold)
        for name in [n for n in (args.profile_request or "").split(",") if n in mine]:
            results.setdefault("profile_request", []).append(e2e.profile_request(model, name, log=log))
        for name in mine_ablate:
            results["ablations"].append(e2e.ablate(model, name, log=log))
        if mine_ablate and family == "edge":
            results["decode"] = e2e.decode_variants(model.vae, log=log)
        if args.warm_up_effect and family == "edge":
            results["warm_up"] = e2e.warm_up_effect(model, "edge-t2i-480-new-size", log=log, width=640, height=480)
        if args.fp8_step and family == "nano":
            width, height, frames = (int(v) for v in args.fp8_step.split("x"))
            results["fp8_step"] = e2e.fp8_step(model, width, height, frames, log=log,
                                               policies=tuple(args.fp8_policies.split(",")),
                                               prefix_lens=tuple(int(v) for v in args.profile_prefixes.split(",")),
                                               attention_backends=tuple(args.fp8_attention.split(",")))
        if args.profile_step and family == profile_family:
            width, height, frames = (int(v) for v in profile_shape.split("x"))
            prefixes = tuple(int(v) for v in args.profile_prefixes.split(","))
            results["profile_step"] = dict(family=family, **e2e.profile_step(model, width, height, frames, log=log,
                                                                             prefix_lens=prefixes))
        # Which attention each shape got (dispatch measures Triton, SDPA and flash-attn-4 where installed).
        # The key is dispatch's: (op, device, dtype, q shape [B, N, Hq, D], kv heads, uniform prefix, bucket,
        # lengths on the device);
        # "longest_kv" is that bucket, the longest branch's key rows rounded up to a power of two.
        dispatcher = model.runtime.dispatchers.get("auto")
        if dispatcher is not None:
            results.setdefault("attention_paths", {})[family] = [
                dict(gen=key[3][1], heads=key[3][2], longest_kv=key[6], device_lengths=key[7], path=d.backend,
                     triton_ms=d.ms.get("triton"), torch_ms=d.ms.get("torch"), flash4_ms=d.ms.get("flash4"),
                     flash4_config=d.config.label if d.backend == "flash4" and d.config else None)
                for key, d in dispatcher.decisions().items() if key[0] == "prefix_attention"
            ]
            log({"attention_paths": results["attention_paths"][family]})
            # What each MLP input shape got: the split path (torch), or QuACK with the activation in its epilogue.
            results.setdefault("gemm_paths", {})[family] = [
                dict(op=key[0], x=key[3], w=key[4], activation=key[5], path=d.backend, reason=d.reason,
                     torch_ms=d.ms.get("torch"), quack_ms=d.ms.get("quack"),
                     quack_config=d.config.label if d.backend == "quack" and d.config else None)
                for key, d in dispatcher.decisions().items() if key[0] == "mlp_in"
            ]
            log({"gemm_paths": results["gemm_paths"][family]})
        del model
        gc.collect()
        torch.cuda.empty_cache()
    e2e.annotate_clocks(results, clocks.close())
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2, default=str))
    print(e2e.table_markdown(results))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.exit(main())
