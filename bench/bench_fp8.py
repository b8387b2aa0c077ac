"""FP8 on one H200 (issue 17, point 5): the numeric gate per candidate policy, and Super in FP8.

    python bench/bench_fp8.py --gate --json $OUT/gate.json          # every policy in POLICIES, one process
    python bench/bench_fp8.py --super --steps 3 --json $OUT/super.json
    python bench/bench_fp8.py --smoke                               # tiny dims on the CPU: checks the script

--gate: for each family and the shapes of tests/gpu/test_gpu_fp8.py (one step, both CFG branches, prefixes
301/517), the relative L2 error of the velocity against an fp32 forward of the same weights, for
diffusers' bf16 forward (the yardstick), the engine's bf16 fast tower, and the fast tower under each
FP8 policy (`engine.pipeline.fp8.FP8Policy`); a policy passes where its error is <= 3x the yardstick's
on every shape. Then each policy's step time (CUDA events, warm) at 832x480/121f, prefixes 1615/2866.
With --attention-e4m3 the gate also runs the bf16 fast tower with its attention's q, k and v rounded to
float8 e4m3 first (a scale per token and head, then back to bf16): what any FP8 attention does to its
inputs, without the rounding of its probabilities too, so its error is a lower bound on FP8 attention's.

--super: Super (5120/64/64, intermediate 25600) with full-size random weights, built FP8-only on one GPU
layer by layer (`engine.pipeline.fp8.build_fp8_transformer`: the bf16 model never exists whole), then
T2V 832x480/121f through `engine.generate` with `--steps` steps, and T2I 1024x1024: prefill, per-step
times, denoise, decode, peak memory, and the default-step total as a projection from the measured steps.
"""
from __future__ import annotations

import argparse
import contextlib
import gc
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import models  # noqa: E402
from bench.e2e import generate_marked, run_header, stages, sync  # noqa: E402
from bench.models import as_loaded_model, build_transformer, step_inputs, transformer_config  # noqa: E402
from engine.pipeline import fp8  # noqa: E402
from engine.pipeline.fast_path import FastPathOptions  # noqa: E402
from engine.pipeline.tower import make_gen_tower  # noqa: E402
from cosmos3_kernels.timing import time_ms  # noqa: E402

GATE = 3.0
# Candidates: the current default; fp32 accumulation; tensor-wise scales; each GEMM role alone in FP8 (its
# share of the error: the errors of independent roles add in variance, so the singles predict the pairs);
# the roles that write the residual stream (out, down) kept bf16; the MLP only; bf16 first/last layers.
# In order of importance (a run short of time skips the last ones).
POLICIES = ("row", "row:in", "row:qkv+in", "row:in+down", "row-exact", "row:qkv", "row:out", "row:down",
            "row-exact:in", "tensor", "row:qkv+in+down", "row:qkv+in+out", "row-exact:in+down", "row@4")
GATE_SHAPES = {"edge": [(640, 640, 1)], "nano": [(1024, 1024, 1), (832, 480, 17)]}
GATE_PREFIXES = (301, 517)
TIMING = (832, 480, 121)
TIMING_PREFIXES = (1615, 2866)


def rel_error(ours, reference) -> float:
    """The largest relative L2 error over the branches' velocities (the gate's measure)."""
    return max(float((a - b).norm() / b.norm()) for a, b in zip(ours, reference))


def _free():
    """Drop what the last item left, so the next one starts from the same memory."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def fp32_references(family, transformer, device, shapes, prefixes):
    """diffusers' forward of an fp32 copy of the same weights, per shape (the copy freed after)."""
    refs = {}
    with torch.no_grad():
        upcast = build_transformer(family, device=device, dtype=torch.float32)
        source = dict(transformer.named_parameters())
        for name, param in upcast.named_parameters():
            param.copy_(source[name])  # bf16 -> fp32 is exact; one tensor at a time
        reference_model = as_loaded_model(upcast, family)
        for shape in shapes:
            width, height, frames = shape
            inputs = step_inputs(reference_model, width=width, height=height, frames=frames, prefix_lens=prefixes)
            refs[shape] = inputs.diffusers_step()
            del inputs
    del upcast, reference_model
    _free()
    return refs


def _measure(model, options, inputs, refs, timed, iters) -> tuple[dict, float]:
    """One tower configuration: its error per gate shape and its step time at the timing shape."""
    model.fast_path = options
    try:
        errors = {}
        for shape, step in inputs.items():
            tower = make_gen_tower(model, step.cache, step.branches, layout=step.layout)
            errors[str(shape)] = rel_error(step.engine_step(tower), refs[shape])
            del tower
        tower = make_gen_tower(model, timed.cache, timed.branches, layout=timed.layout)
        return errors, time_ms(lambda: timed.engine_step(tower), warmup=1, iters=iters).median_ms
    finally:
        model.fast_path, model.runtime.fp8_weights = None, None
        gc.collect()


def gate_family(family, policies, device, log, *, into: list, deadline=float("inf"), shapes=None, timing=TIMING,
                prefixes=GATE_PREFIXES, timing_prefixes=TIMING_PREFIXES, iters=1, attention_e4m3=False,
                uncentred_too=False, shared_first_layer=False, mlp_epilogue=False) -> dict:
    """Every policy on one family, each on its own (a failure is logged and the next runs); policies
    not started by `deadline` (perf_counter) are listed as skipped. The result goes into `into` first,
    so that what `log` writes holds the policies measured so far."""
    shapes = shapes or GATE_SHAPES[family]
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    transformer = build_transformer(family, device=device, dtype=dtype)
    model = as_loaded_model(transformer, family)
    refs = fp32_references(family, transformer, device, shapes, prefixes)
    out = {"family": family, "errors": {}, "step_ms": {}, "failed": {}, "skipped": [], "ratios": {}}
    into.append(out)
    with torch.no_grad():
        inputs = {s: step_inputs(model, width=s[0], height=s[1], frames=s[2], prefix_lens=prefixes) for s in shapes}
        timed = step_inputs(model, width=timing[0], height=timing[1], frames=timing[2], prefix_lens=timing_prefixes)
        out["errors"]["diffusers bf16"] = {str(s): rel_error(inputs[s].diffusers_step(), refs[s]) for s in shapes}
        bf16 = FastPathOptions(enabled=True, cuda_graphs=False)
        # (label, tower options, what runs around the measurement)
        variants = [("engine bf16", bf16, contextlib.nullcontext)]
        if attention_e4m3:
            variants.append((ATTENTION_E4M3, bf16, AttentionInputsE4M3))
        if shared_first_layer:
            variants.append((SHARED_FIRST_LAYER, bf16, SharedFirstLayerEverywhere))
        if mlp_epilogue:
            variants.append((SPLIT_MLP, FastPathOptions(enabled=True, cuda_graphs=False, mlp_epilogue=False),
                             contextlib.nullcontext))
            variants.append((MLP_EPILOGUE, bf16, MLPEpilogueEverywhere))
        for p in policies:
            options = FastPathOptions(enabled=True, cuda_graphs=False, fp8=True, fp8_policy=p)
            variants.append((p, options, contextlib.nullcontext))
            if uncentred_too and fp8.FP8Policy.parse(p).attention:
                variants.append((f"{p} {UNCENTRED}", options, AttentionUncentred))
        for label, options, around in variants:
            if time.perf_counter() > deadline:
                out["skipped"].append(label)
                continue
            began = time.perf_counter()
            try:
                with around():
                    out["errors"][label], out["step_ms"][label] = _measure(model, options, inputs, refs, timed, iters)
            except Exception as error:  # noqa: BLE001 - one policy's failure must not lose the others
                out["failed"][label] = f"{type(error).__name__}: {error}"[:300]
            yardstick = out["errors"]["diffusers bf16"]
            out["ratios"] = {k: {s: e / max(yardstick[s], 1e-12) for s, e in v.items()} for k, v in out["errors"].items()}
            log({"family": family, "policy": label, "ratio": {s: round(e / max(yardstick[s], 1e-12), 3) for s, e in
                 out["errors"].get(label, {}).items()}, "step_ms": round(out["step_ms"].get(label, float("nan")), 2),
                 "failed": out["failed"].get(label), "wall_s": round(time.perf_counter() - began, 2)})
    del model, transformer, inputs, timed, refs
    _free()
    return out


ATTENTION_E4M3 = "attention q,k,v e4m3 (lower bound)"
SHARED_FIRST_LAYER = "engine bf16, first layer's gen block shared"
UNCENTRED = "(v not centred)"
SPLIT_MLP = "engine bf16, MLP activation as its own pass"
MLP_EPILOGUE = "engine bf16, MLP activation in the GEMM's epilogue (forced)"


@contextlib.contextmanager
def AttentionUncentred():
    """While active, a policy naming "attn" gets the FP8 attention without v's centring (`fp8.fp8_attention`)."""
    original = fp8.fp8_attention
    fp8.fp8_attention = lambda policy, device, centred=True: original(policy, device, centred=False)
    try:
        yield
    finally:
        fp8.fp8_attention = original


def e4m3_round_trip(x: torch.Tensor) -> torch.Tensor:
    """x rounded to float8 e4m3 with a scale per row of its last dim (one token's head), back in x's dtype."""
    wide = x.float()
    scale = 448.0 / wide.abs().amax(dim=-1, keepdim=True).clamp(min=1e-12)
    return ((wide * scale).to(torch.float8_e4m3fn).float() / scale).to(x.dtype)


@contextlib.contextmanager
def SharedFirstLayerEverywhere():
    """While active, the bf16 tower shares its first layer's gen block (cosmos3_kernels.shared_gen_attention) at every size and
    on flash-attn-4, not only from SHARE_MIN_GEN_TOKENS up where dispatch measures it faster: the gate's shapes are
    shorter than that, and its error is what is measured here."""
    from engine.pipeline import fast_path
    from cosmos3_kernels import dispatch, prefix_attention as pa, shared_gen_attention as sga

    probe = torch.empty(1, 1, 1, 128, dtype=torch.bfloat16, device="cuda" if torch.cuda.is_available() else "cpu")
    why = sga.shared_unsupported(probe)
    if why is not None:
        raise RuntimeError(f"the shared first layer runs on flash-attn-4 only: {why}")
    forced = dispatch.Decision("flash4", "forced: the gate measures its error", config=pa.DEFAULT_FLASH4_CONFIGS[-1])
    minimum, choose = fast_path.SHARE_MIN_GEN_TOKENS, dispatch.KernelDispatcher.choose
    fast_path.SHARE_MIN_GEN_TOKENS = 0
    dispatch.KernelDispatcher.choose = (
        lambda self, op, *a, **k: forced if op == "shared_gen_attention" else choose(self, op, *a, **k))
    try:
        yield
    finally:
        fast_path.SHARE_MIN_GEN_TOKENS = minimum
        dispatch.KernelDispatcher.choose = choose


@contextlib.contextmanager
def MLPEpilogueEverywhere():
    """While active, a tower allowed one rounding in its MLP (`fast_path.fuses_mlp_activation`: videos) runs the
    activation in QuACK's GEMM epilogue (cosmos3_kernels.gemm.mlp_in_quack) at every layer, not only where dispatch measures
    it faster and no less accurate: its error is what is measured here."""
    from cosmos3_kernels import dispatch, gemm

    probe = torch.empty(16, 128, dtype=torch.bfloat16, device="cuda" if torch.cuda.is_available() else "cpu")
    why = gemm.mlp_in_unsupported(probe, probe, "relu_sq")
    if why is not None:
        raise RuntimeError(f"the MLP epilogue runs on QuACK only: {why}")
    forced = dispatch.Decision("quack", "forced: the gate measures its error", config=gemm.DEFAULT_QUACK_CONFIGS[0])
    choose = dispatch.KernelDispatcher.choose
    dispatch.KernelDispatcher.choose = lambda self, op, *a, **k: forced if op == "mlp_in" else choose(self, op, *a, **k)
    try:
        yield
    finally:
        dispatch.KernelDispatcher.choose = choose


class AttentionInputsE4M3:
    """While active, every dispatched prefix attention reads e4m3-rounded q, k and v (a copy of the K/V
    buffer: the cache itself stays bf16). Patches the dispatcher class, so it covers the tower built inside."""

    def __enter__(self):
        from cosmos3_kernels.dispatch import KernelDispatcher

        self._original = original = KernelDispatcher.prefix_attention

        def rounded(dispatcher, q, kv_buffer, layout, **kwargs):
            return original(dispatcher, e4m3_round_trip(q), e4m3_round_trip(kv_buffer), layout, **kwargs)

        KernelDispatcher.prefix_attention = rounded
        return self

    def __exit__(self, *exc):
        from cosmos3_kernels.dispatch import KernelDispatcher

        KernelDispatcher.prefix_attention = self._original
        return False


def gate_markdown(results: list[dict]) -> str:
    columns = [(r["family"], s) for r in results for s in r["errors"]["diffusers bf16"]]
    head = " | ".join(f"{f} {s}" for f, s in columns)
    lines = [f"| policy | {head} | worst | passes (<= {GATE}x) | " +
             " | ".join(f"{r['family']} step ms" for r in results) + " |",
             "|---|" + "---|" * (len(columns) + 2 + len(results))]
    labels = list(dict.fromkeys(label for r in results for label in r["ratios"]))
    for label in labels:
        ratios = [r["ratios"].get(label, {}).get(s) for r in results for s in r["errors"]["diffusers bf16"]]
        cells = " | ".join("-" if x is None else f"{x:.2f}x" for x in ratios)
        worst = max((x for x in ratios if x is not None), default=float("nan"))
        verdict = "yes" if None not in ratios and worst <= GATE else ("no" if worst > GATE else "incomplete")
        steps = " | ".join(f"{r['step_ms'].get(label, float('nan')):.1f}" for r in results)
        lines.append(f"| {label} | {cells} | {worst:.2f}x | {verdict} | {steps} |")
    lines.append("| (diffusers bf16 error) | " + " | ".join(
        f"{r['errors']['diffusers bf16'][s]:.2e}" for r in results for s in r["errors"]["diffusers bf16"]) + " | | | |")
    return "\n".join(lines)


# -- Super on one GPU ----------------------------------------------------------------------------------

def build_super(device, policy, family="super", log=print):
    """Full-size random Super built FP8-only, layer by layer; returns the loaded model and build facts."""
    from engine.model.tiny import build_tokenizer

    sync()
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    began = time.perf_counter()
    transformer, weights = fp8.build_fp8_transformer(transformer_config(family), device, fp8.random_fill(device),
                                                     fp8.FP8Policy.parse(policy))
    sync()
    facts = {"build_s": time.perf_counter() - began, "policy": policy}
    facts["parameters"] = sum(p.numel() for p in transformer.parameters())
    if torch.cuda.is_available():
        facts["transformer_gib"] = torch.cuda.memory_allocated() / 2**30
        facts["build_peak_gib"] = torch.cuda.max_memory_allocated() / 2**30
    vae = models.build_vae(device, dtype=torch.bfloat16 if device == "cuda" else torch.float32)
    model = as_loaded_model(transformer, family, vae=vae, tokenizer=build_tokenizer())
    model.dtype = transformer.embed_tokens.weight.dtype
    model.runtime.fp8_weights = weights
    if torch.cuda.is_available():
        facts["loaded_gib"] = torch.cuda.memory_allocated() / 2**30
        facts["gpu_total_gib"] = torch.cuda.get_device_properties(0).total_memory / 2**30
    log(facts)
    return model, facts


def timed_request(model, request, default_steps: int) -> dict:
    """`engine.generate` once: stages, step times as progress saw them, peak memory, and the total at
    `default_steps` projected from the median measured step (labelled a projection)."""
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    result, marks, wall = generate_marked(model, request)
    times = stages(result.timings)
    prefill = times["prefill_s"]
    steps = [b - a for a, b in zip([prefill] + marks, marks)]
    later = sorted(steps[1:]) or steps
    median = later[len(later) // 2] if later else times["denoise_s"]
    row = {"request": {k: v for k, v in request.items() if k != "prompt"}, "precision": result.precision, **times,
           "wall_s": wall, "step_s": [round(s, 4) for s in steps], "median_step_after_first_s": median,
           "frames": list(result.frames.shape)}
    row[f"projected_total_{default_steps}_steps_s (projection)"] = prefill + default_steps * median + times["decode_s"]
    if torch.cuda.is_available():
        row["peak_gib"] = torch.cuda.max_memory_allocated() / 2**30
    return row


def super_run(args, device, log, out: dict) -> dict:
    """Build Super FP8-only, then T2V 480p (and T2I 1024x1024), each request on its own (fail soft)."""
    from bench.e2e import long_prompt
    from engine.model.defaults import sampling_defaults

    model, out["build"] = build_super(device, args.policy, log=log)
    prompt = long_prompt(model, tokens=args.prompt_tokens)
    workloads = [("t2v", dict(width=832, height=480, num_frames=121))]
    if not args.skip_t2i:
        workloads.append(("t2i", dict(width=1024, height=1024)))
    for mode, size in workloads:
        if args.smoke:
            size = dict(size, num_frames=17) if mode == "t2v" else dict(width=640, height=640)  # allowed sizes
        default_steps = sampling_defaults(model.info, mode)["steps"]
        request = dict(mode=mode, prompt=prompt, seed=1, steps=args.steps, **size)
        try:
            row = timed_request(model, request, default_steps)
        except Exception as error:  # noqa: BLE001 - the next request (and the gate) still run
            row = {"request": request | {"prompt": "..."}, "failed": f"{type(error).__name__}: {error}"[:500]}
            if torch.cuda.is_available():
                row["peak_gib"] = torch.cuda.max_memory_allocated() / 2**30
        row["mode"], row["default_steps"] = mode, default_steps
        out["runs"].append(row)
        log(row)
    return out


def _shrink_for_smoke():
    """Tiny dims for a CPU check of the script (numbers mean nothing)."""
    for spec in models.TRANSFORMERS.values():
        spec.update(hidden_size=64, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
                    head_dim=32, intermediate_size=128, rope_axes_dim=[8, 4, 4])
    models.WAN22_VAE.update(base_dim=8, decoder_base_dim=4)
    fp8.check_available = lambda device, policy=None, backend="": None  # the smoke runs torchao's float8 on the CPU (torch._scaled_mm)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gate", action="store_true", help="the numeric gate for every policy in --policies")
    parser.add_argument("--super", action="store_true", help="Super in FP8 on one GPU through engine.generate")
    parser.add_argument("--policies", default=",".join(POLICIES), help="FP8 GEMM policies ('' for none)")
    parser.add_argument("--attention-e4m3", action="store_true",
                        help="--gate: also the bf16 tower with e4m3-rounded attention inputs (FP8 attention's lower bound)")
    parser.add_argument("--attention-everywhere", action="store_true",
                        help="--gate: FP8 attention (policies naming 'attn') at every size, not only from "
                        "FP8_ATTENTION_MIN_GEN_TOKENS gen tokens up, so the gate's shapes measure its error")
    parser.add_argument("--shared-first-layer", action="store_true",
                        help="--gate: also the bf16 tower with its first layer's gen block shared, forced at every size")
    parser.add_argument("--mlp-epilogue", action="store_true",
                        help="--gate: also the bf16 tower with the MLP's activation as its own pass, and forced into "
                        "QuACK's GEMM epilogue at every layer of a video")
    parser.add_argument("--uncentred-too", action="store_true",
                        help="--gate: each policy naming 'attn' also with the FP8 attention's v not centred")
    parser.add_argument("--families", default="edge,nano")
    parser.add_argument("--policy", default=None, help="--super's FP8 policy (default: Super's measured FP8 mode)")
    parser.add_argument("--steps", type=int, default=3, help="--super's denoising steps per request")
    parser.add_argument("--skip-t2i", action="store_true", help="--super: T2V only")
    parser.add_argument("--prompt-tokens", type=int, default=1600)
    parser.add_argument("--smoke", action="store_true", help="tiny dims on the CPU: checks the script")
    parser.add_argument("--json", default=None)
    parser.add_argument("--budget-s", type=float, default=200.0,
                        help="gate policies not started this many seconds after the start are skipped (listed)")
    args = parser.parse_args(argv)
    device = "cuda" if torch.cuda.is_available() and not args.smoke else "cpu"
    args.policy = args.policy or fp8.host_policy("super", device).name
    if args.smoke:
        _shrink_for_smoke()
        args.gate = args.super = True
        args.prompt_tokens = 40
    header = run_header(torch.cuda.get_device_name() if device == "cuda" else "cpu (smoke)")
    results = {"header": header, "gate": [], "super": None}

    def log(row):
        print(json.dumps(row, default=str), flush=True)
        if args.json:  # as it goes, so a run cut short keeps what it measured
            Path(args.json).write_text(json.dumps(results, indent=2, default=str))

    log(header)
    deadline = time.perf_counter() + args.budget_s
    if args.super:  # first: the target (Super runs on one H200 in FP8)
        results["super"] = {"runs": []}
        try:
            super_run(args, device, log, results["super"])
        except Exception as error:  # noqa: BLE001 - the gate still runs
            results["super"]["failed"] = f"{type(error).__name__}: {error}"[:500]
            log({"super_failed": results["super"]["failed"]})
        _free()
    if args.attention_everywhere:  # the FP8 attention at every size
        fp8.FP8_ATTENTION_MIN_GEN_TOKENS = 0
    if args.gate:
        policies = [p for p in args.policies.split(",") if p]
        for family in args.families.split(","):
            kwargs = dict(shapes=[(64, 64, 1), (64, 64, 5)], timing=(64, 64, 5), prefixes=(20, 31),
                          timing_prefixes=(20, 31)) if args.smoke else {}
            try:
                gate_family(family, policies, device, log, into=results["gate"], deadline=deadline,
                            attention_e4m3=args.attention_e4m3 or args.smoke, uncentred_too=args.uncentred_too,
                            shared_first_layer=args.shared_first_layer, mlp_epilogue=args.mlp_epilogue,
                            **kwargs)
            except Exception as error:  # noqa: BLE001 - the other family still runs
                log({"gate_failed": family, "error": f"{type(error).__name__}: {error}"[:500]})
        if results["gate"]:
            print(gate_markdown(results["gate"]), flush=True)
    log({"done": True})
    return 0


if __name__ == "__main__":
    sys.exit(main())
