"""On the H200: the FP8 pass's numeric gate, full-size random weights (issue 17).

For one denoising step with both CFG branches: the relative L2 error of the velocity against an fp32
forward of the same weights (diffusers' transformer, upcast copy), for
- diffusers' own bf16 forward (the yardstick), and
- our fast tower with FP8 GEMMs (`engine.pipeline.fp8`);
FP8 passes when its error is at most 3x the yardstick's. Both numbers are printed.

Skipped without CUDA or torchao. `python -m pytest -q -s -m gpu tests/test_gpu_fp8.py`
"""
import gc

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

GATE = 3.0


def _rel(ours, reference) -> float:
    return max(float((a - b).norm() / b.norm()) for a, b in zip(ours, reference))


# Measured on the H200 (2026-12-01, torchao 0.18.0, row-wise float8 e4m3): FP8 error 4.7x (Edge T2I),
# 4.6x (Nano T2I) and 5.1x (Nano T2V 480p) diffusers' bf16 error: the gate is missed, which is why FP8
# stays off by default and labelled approximate. Strict: the day it passes, this test says so.
@pytest.mark.xfail(strict=True, reason="FP8 misses the 3x-bf16 gate (measured 4.6-5.1x); docs/PERFORMANCE.md")
@pytest.mark.parametrize("family,shape", [("edge", (640, 640, 1)), ("nano", (1024, 1024, 1)),
                                          ("nano", (832, 480, 17))], ids=["edge-t2i", "nano-t2i", "nano-t2v"])
def test_fp8_velocity_within_three_times_bf16_error(family, shape):
    pytest.importorskip("torchao")
    from bench.models import as_loaded_model, build_transformer, step_inputs
    from engine.pipeline.fast_path import FastPathOptions
    from engine.pipeline.prefill import make_gen_tower

    width, height, frames = shape
    transformer = build_transformer(family)
    model = as_loaded_model(transformer, family)
    with torch.no_grad():
        upcast = build_transformer(family, dtype=torch.float32)  # then the bf16 weights, exactly, in fp32
        source = dict(transformer.named_parameters())
        for name, param in upcast.named_parameters():
            param.copy_(source[name])  # bf16 -> fp32 is exact; one tensor at a time (no second fp32 copy)
        reference_model = as_loaded_model(upcast, family)
        ref_inputs = step_inputs(reference_model, width=width, height=height, frames=frames, prefix_lens=(301, 517))
        fp32 = ref_inputs.diffusers_step()
        del ref_inputs, reference_model, upcast
        gc.collect()
        torch.cuda.empty_cache()
        inputs = step_inputs(model, width=width, height=height, frames=frames, prefix_lens=(301, 517))
        bf16 = _rel(inputs.diffusers_step(), fp32)
        model.fast_path = FastPathOptions(enabled=True, cuda_graphs=False)
        fast_bf16 = _rel(inputs.engine_step(make_gen_tower(model, inputs.cache, inputs.branches)), fp32)
        model.fast_path = FastPathOptions(enabled=True, cuda_graphs=False, fp8=True)
        tower = make_gen_tower(model, inputs.cache, inputs.branches)
        assert tower.fp8 is not None and tower.fp8 is model.fp8_weights
        fp8 = _rel(inputs.engine_step(tower), fp32)
    print(f"{family} {shape}: rel. error vs fp32 forward: diffusers bf16 {bf16:.2e}, engine bf16 {fast_bf16:.2e}, "
          f"engine FP8 {fp8:.2e} ({fp8 / bf16:.1f}x bf16; gate {GATE}x)")
    del model, transformer, inputs, tower
    gc.collect()
    torch.cuda.empty_cache()
    assert fp8 <= GATE * bf16
