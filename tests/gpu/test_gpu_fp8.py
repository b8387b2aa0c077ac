"""On the H200: the FP8 mode (`engine.pipeline.fp8`), full-size random weights (issue 17, point 5).

- Super built FP8-only fits one GPU and runs T2V 832x480/121f through `engine.generate` (two steps).
- The numeric gate: for one denoising step with both CFG branches, the relative L2 error of the velocity
  against an fp32 forward of the same weights (diffusers' transformer, upcast copy), for diffusers' own
  bf16 forward (the yardstick) and for our fast tower in the family's FP8 mode (`DEFAULT_POLICIES`,
  chosen by `bench/bench_fp8.py --gate`); FP8 passes when its error is at most 3x the yardstick's.

Skipped without CUDA or torchao. `python -m pytest -q -s -m gpu tests/gpu/test_gpu_fp8.py`
"""
import gc
import time

import pytest
import torch

import engine  # noqa: F401  (MSLK_PYTHON_ONLY is set by tests/conftest.py's start-up call, engine.config.apply_process_environment)

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

GATE = 3.0


def _free():
    gc.collect()
    torch.cuda.empty_cache()


# First in the file: it needs the GPU's memory to itself (~125 GiB of 140).
def test_super_in_fp8_runs_on_one_gpu():
    pytest.importorskip("torchao")
    from bench.bench_fp8 import build_super, timed_request
    from engine.pipeline.fp8 import FP8_LABEL, host_policy

    if torch.cuda.get_device_properties(0).total_memory < 130 * 2**30:
        pytest.skip("Super in FP8 needs a GPU of the H200's size")
    policy = host_policy("super", "cuda").name
    model, facts = build_super("cuda", policy)
    request = dict(mode="t2v", prompt="A lighthouse keeper climbs the stairs at dusk. " * 30, seed=1, steps=2,
                   width=832, height=480, num_frames=121)
    began = time.perf_counter()
    row = timed_request(model, request, default_steps=35)
    print(f"Super FP8 ({policy}): transformer {facts['transformer_gib']:.1f} GiB, peak {row['peak_gib']:.1f} GiB of "
          f"{facts['gpu_total_gib']:.1f}; steps {row['step_s']} s; {time.perf_counter() - began:.1f} s in all")
    assert row["precision"] == FP8_LABEL and row["frames"] == [121, 480, 832, 3]
    assert model.runtime.fp8_weights.resident and model.runtime.fp8_weights.policy.name == policy
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
    from engine.pipeline.fp8 import host_policy
    from engine.pipeline.tower import make_gen_tower

    if force_attention:  # FA3's where installed, else cuDNN's (`FP8_ATTENTION_BACKENDS`)
        monkeypatch.setattr(fp8_pass, "FP8_ATTENTION_MIN_GEN_TOKENS", 0)
    prefixes = (301, 517)
    transformer = build_transformer(family)
    model = as_loaded_model(transformer, family)
    refs = fp32_references(family, transformer, "cuda", shapes, prefixes)
    policy = host_policy(family, "cuda")
    with torch.no_grad():
        for width, height, frames in shapes:
            inputs = step_inputs(model, width=width, height=height, frames=frames, prefix_lens=prefixes)
            fp32 = refs[(width, height, frames)]
            bf16 = rel_error(inputs.diffusers_step(), fp32)
            # The family's FP8 mode, as a request without a policy of its own gets it.
            model.fast_path = FastPathOptions(enabled=True, cuda_graphs=False, fp8=True)
            tower = make_gen_tower(model, inputs.cache, inputs.branches, layout=inputs.layout)
            assert tower.fp8 is model.runtime.fp8_weights and tower.fp8.policy == policy
            fp8 = rel_error(inputs.engine_step(tower), fp32)
            print(f"{family} {(width, height, frames)}: rel. error vs fp32 forward: diffusers bf16 {bf16:.2e}, "
                  f"engine FP8 ({policy.name}) {fp8:.2e} ({fp8 / bf16:.2f}x bf16; gate {GATE}x)")
            assert fp8 <= GATE * bf16
            del inputs, tower
    del model, transformer, refs
    _free()


def _kernel_names(call) -> list:
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        call()
        torch.cuda.synchronize()
    return [event.name for event in prof.events() if event.device_type == torch.autograd.DeviceType.CUDA]


def test_the_mslk_quantiser_rounds_its_scale_in_fp32_and_lands_within_one_e4m3_step_of_torchaos():
    """Both quantisers of `engine.pipeline.fp8.QUANTISERS`, one activation: MSLK's scale is amax / 448 in fp32
    (torchao's is taken in bf16), each e4m3 code is torchao's or its neighbour, identical where the two scales
    are; the FP8 GEMM's output stays as close to bf16's; MSLK's path launches its one Triton kernel and replays
    in a CUDA graph to the same bits."""
    pytest.importorskip("torchao")
    from engine.pipeline import fp8
    from engine.pipeline.fp8 import FP8Policy, quantize_weight

    why = fp8.mslk_unavailable("cuda")
    if why is not None:
        pytest.skip(f"MSLK's quantiser needs {why}")
    from torchao.quantization import Float8Tensor, PerRow
    from torchao.quantization.quantize_.common import KernelPreference

    gen = torch.Generator(device="cuda").manual_seed(0)
    # Rows four decades apart in size, as the tower's normalised activations are not.
    spread = torch.logspace(-2, 2, 4096, device="cuda")[:, None]
    x = (torch.randn(4096, 4096, device="cuda", generator=gen) * spread).bfloat16()
    quantised = {pref: Float8Tensor.from_hp(x, granularity=PerRow(), kernel_preference=pref)
                 for pref in (KernelPreference.TORCH, KernelPreference.MSLK)}
    ours, theirs = quantised[KernelPreference.MSLK], quantised[KernelPreference.TORCH]
    amax = x.abs().amax(dim=-1, keepdim=True)
    # MSLK's scale is fp32, within one fp32 ulp of amax / 448 (Triton's division is not always correctly rounded:
    # 44% of these rows land on it exactly); torchao's is amax / 448 rounded to bf16, up to 0.3% away.
    assert float(((ours.scale - amax.float() / 448.0).abs() / (amax.float() / 448.0)).max()) <= 2.0**-23
    assert torch.equal(theirs.scale, (amax / 448.0).float())
    same_scale = (ours.scale == theirs.scale).expand_as(x)
    assert 0 < same_scale[:, 0].sum() < x.shape[0]  # both kinds of row are exercised
    code_ours = ours.qdata.view(torch.uint8).int()
    code_theirs = theirs.qdata.view(torch.uint8).int()
    rounded = (x.float() / ours.scale).clamp(-448.0, 448.0).to(torch.float8_e4m3fn).view(torch.uint8).int()
    assert torch.equal(code_ours, rounded)  # each element x / scale, rounded to nearest e4m3
    nonzero = ((code_ours | code_theirs) & 0x7F) != 0
    assert torch.equal((code_ours & 0x80)[nonzero], (code_theirs & 0x80)[nonzero])  # the same signs
    steps = ((code_ours & 0x7F) - (code_theirs & 0x7F)).abs()
    assert int(steps.max()) <= 1
    assert torch.equal(code_ours[same_scale], code_theirs[same_scale])

    weight = (torch.randn(6144, 4096, device="cuda", generator=gen) * 0.02).bfloat16()
    exact = x.float() @ weight.float().t()
    errors = {}
    for spelling in ("row:in", "row:in/mslk"):
        out = torch.nn.functional.linear(x, quantize_weight(weight, FP8Policy.parse(spelling)))
        errors[spelling] = float((out.float() - exact).norm() / exact.norm())
    print(f"FP8 GEMM rel. error against fp32: {errors}")
    assert errors["row:in"] < 5e-2 and abs(errors["row:in/mslk"] / errors["row:in"] - 1) < 0.05

    fp8_weight = quantize_weight(weight, FP8Policy.parse("row:in/mslk"))
    names = _kernel_names(lambda: torch.nn.functional.linear(x, fp8_weight))
    assert any("quantize_fp8_row" in name for name in names), names
    torch_names = _kernel_names(lambda: torch.nn.functional.linear(x, quantize_weight(weight, FP8Policy.parse("row:in"))))
    assert not any("quantize_fp8_row" in name for name in torch_names)
    eager = torch.nn.functional.linear(x, fp8_weight)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = torch.nn.functional.linear(x, fp8_weight)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured, eager)
