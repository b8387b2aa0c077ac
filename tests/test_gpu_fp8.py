"""On the H200: the FP8 mode (`engine.pipeline.fp8`), full-size random weights (issue 17, point 5).

- Super built FP8-only fits one GPU and runs T2V 832x480/121f through `engine.generate` (two steps).
- The numeric gate: for one denoising step with both CFG branches, the relative L2 error of the velocity
  against an fp32 forward of the same weights (diffusers' transformer, upcast copy), for diffusers' own
  bf16 forward (the yardstick) and for our fast tower in the family's FP8 mode (`DEFAULT_POLICIES`,
  chosen by `bench/bench_fp8.py --gate`); FP8 passes when its error is at most 3x the yardstick's.

Skipped without CUDA or torchao. `python -m pytest -q -s -m gpu tests/test_gpu_fp8.py`
"""
import gc
import time

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

GATE = 3.0


def _free():
    gc.collect()
    torch.cuda.empty_cache()


# First in the file: it needs the GPU's memory to itself (~125 GiB of 140).
def test_super_in_fp8_runs_on_one_gpu():
    pytest.importorskip("torchao")
    from bench.bench_fp8 import build_super, timed_request
    from engine.pipeline.fp8 import FP8_LABEL, policy_from_env

    if torch.cuda.get_device_properties(0).total_memory < 130 * 2**30:
        pytest.skip("Super in FP8 needs a GPU of the H200's size")
    policy = policy_from_env("super").name
    model, facts = build_super("cuda", policy)
    request = dict(mode="t2v", prompt="A lighthouse keeper climbs the stairs at dusk. " * 30, seed=1, steps=2,
                   width=832, height=480, num_frames=121)
    began = time.perf_counter()
    row = timed_request(model, request, default_steps=35)
    print(f"Super FP8 ({policy}): transformer {facts['transformer_gib']:.1f} GiB, peak {row['peak_gib']:.1f} GiB of "
          f"{facts['gpu_total_gib']:.1f}; steps {row['step_s']} s; {time.perf_counter() - began:.1f} s in all")
    assert row["precision"] == FP8_LABEL and row["frames"] == [121, 480, 832, 3]
    assert model.fp8_weights.resident and model.fp8_weights.policy.name == policy
    del model
    _free()


@pytest.mark.parametrize("family,shapes,force_attention", [
    ("edge", [(640, 640, 1)], False), ("nano", [(1024, 1024, 1), (832, 480, 17)], False),
    # Nano's mode at video sizes (its FP8 attention runs from FP8_ATTENTION_MIN_GEN_TOKENS up), the attention
    # forced to FP8 at the gate's shapes, where an fp32 forward fits.
    ("nano", [(1024, 1024, 1), (832, 480, 17)], True)], ids=["edge-t2i", "nano-t2i-t2v", "nano-fp8-attention-forced"])
def test_fp8_mode_velocity_within_three_times_bf16_error(family, shapes, force_attention, monkeypatch):
    pytest.importorskip("torchao")
    from bench.bench_fp8 import fp32_references, rel_error
    from bench.models import as_loaded_model, build_transformer, step_inputs
    from engine.pipeline.fast_path import FastPathOptions
    from engine.pipeline import fp8 as fp8_pass
    from engine.pipeline.fp8 import policy_from_env
    from engine.pipeline.prefill import make_gen_tower

    if force_attention:
        monkeypatch.setattr(fp8_pass, "FP8_ATTENTION_MIN_GEN_TOKENS", 0)
    prefixes = (301, 517)
    transformer = build_transformer(family)
    model = as_loaded_model(transformer, family)
    refs = fp32_references(family, transformer, "cuda", shapes, prefixes)
    policy = policy_from_env(family)
    with torch.no_grad():
        for width, height, frames in shapes:
            inputs = step_inputs(model, width=width, height=height, frames=frames, prefix_lens=prefixes)
            fp32 = refs[(width, height, frames)]
            bf16 = rel_error(inputs.diffusers_step(), fp32)
            # The family's FP8 mode, as a request without a policy of its own gets it.
            model.fast_path = FastPathOptions(enabled=True, cuda_graphs=False, fp8=True)
            tower = make_gen_tower(model, inputs.cache, inputs.branches, layout=inputs.layout)
            assert tower.fp8 is model.fp8_weights and tower.fp8.policy == policy
            fp8 = rel_error(inputs.engine_step(tower), fp32)
            print(f"{family} {(width, height, frames)}: rel. error vs fp32 forward: diffusers bf16 {bf16:.2e}, "
                  f"engine FP8 ({policy.name}) {fp8:.2e} ({fp8 / bf16:.2f}x bf16; gate {GATE}x)")
            assert fp8 <= GATE * bf16
            del inputs, tower
    del model, transformer, refs
    _free()
