"""On the GPU, at full size: one step of our engine against diffusers' transformer, same random weights.

Skipped without CUDA. Run on the H200 with `python -m pytest -q -m gpu tests/gpu/test_gpu_fast_path.py`.
"""
import gc

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

BF16_REL_ERROR = 2e-2


@pytest.fixture(scope="module", params=["nano", "edge"])
def model(request):
    from bench.models import as_loaded_model, build_transformer

    transformer = build_transformer(request.param)
    yield as_loaded_model(transformer, request.param)
    del transformer
    gc.collect()
    torch.cuda.empty_cache()


@pytest.mark.parametrize("shape,video_qk_fp32", [((640, 640, 1), True), ((832, 480, 17), True), ((832, 480, 17), False)],
                         ids=["t2i", "t2v", "t2v-rounded-qk-norm"])
def test_fast_step_matches_diffusers(model, shape, video_qk_fp32):
    from bench.models import step_inputs
    from engine.pipeline.fast_path import FastGenTower, FastPathOptions
    from engine.pipeline.tower import EagerGenTower, make_gen_tower

    width, height, frames = shape
    inputs = step_inputs(model, width=width, height=height, frames=frames, prefix_lens=(301, 517))
    with torch.no_grad():
        reference = inputs.diffusers_step()
        options = FastPathOptions(enabled=True, video_qk_fp32=video_qk_fp32)
        tower = make_gen_tower(model, inputs.cache, inputs.branches, options, inputs.layout)
        assert isinstance(tower, FastGenTower)
        # A video's QK-norm rounds once unless the switch is off; an image keeps diffusers' roundings.
        assert tower.round_qk_norm is (frames == 1 or not video_qk_fp32)
        for _ in range(3):  # the first call measures and captures, later ones replay the graph
            fast = inputs.engine_step(tower)
        model.fast_path = FastPathOptions(enabled=False)  # the exact path throughout
        try:
            exact = inputs.engine_step(EagerGenTower(model, inputs.cache, inputs.branches))
        finally:
            model.fast_path = None
    for ours, eager, theirs in zip(fast, exact, reference):
        assert torch.isfinite(ours).all()
        fast_error = float((ours - theirs).norm() / theirs.norm())
        eager_error = float((eager - theirs).norm() / theirs.norm())
        print(f"{model.info.family} {shape} video_qk_fp32={video_qk_fp32}: fast rel. error {fast_error:.2e}, exact tower {eager_error:.2e}")
        assert fast_error <= BF16_REL_ERROR
        assert eager_error <= BF16_REL_ERROR


def step_errors_on_and_off(model, field: str, attribute: str, calls: list) -> tuple[dict, dict]:
    """One fast step at 832x480x17 with ``FastPathOptions.<field>`` on, then off: each velocity's relative error
    against diffusers' bf16 step, and how many entries each step appended to ``calls`` (the caller's spy on the
    pass's kernel). Each tower's ``attribute`` must say whether the pass may apply."""
    from bench.models import step_inputs
    from engine.pipeline.fast_path import FastPathOptions
    from engine.pipeline.tower import make_gen_tower

    inputs = step_inputs(model, width=832, height=480, frames=17, prefix_lens=(301, 517))
    errors, counts = {}, {}
    with torch.no_grad():
        reference = inputs.diffusers_step()
        for on in (True, False):
            options = FastPathOptions(enabled=True, cuda_graphs=False, **{field: on})
            tower = make_gen_tower(model, inputs.cache, inputs.branches, options, inputs.layout)
            assert getattr(tower, attribute) is on
            before = len(calls)
            fast = inputs.engine_step(tower)
            counts[on] = len(calls) - before
            errors[on] = [float((ours - theirs).norm() / theirs.norm()) for ours, theirs in zip(fast, reference)]
    return errors, counts


def count_calls(monkeypatch, owner, name: str) -> list:
    """Spy on ``owner.name`` (a module function or a static method): each call appends to the returned list."""
    import inspect

    original = getattr(owner, name)
    spy = lambda *a, **k: calls.append(1) or original(*a, **k)  # noqa: E731
    static = inspect.isclass(owner) and isinstance(inspect.getattr_static(owner, name), staticmethod)
    calls = []
    monkeypatch.setattr(owner, name, staticmethod(spy) if static else spy)
    return calls


def test_shared_first_layer_attention_keeps_the_step_as_close_to_diffusers(model, monkeypatch):
    # The first layer's gen block computed once (cosmos3_kernels.shared_gen_attention) on flash-attn-4, forced at a short
    # video (the engine shares from SHARE_MIN_GEN_TOKENS, where dispatch also measures it): the step's velocity
    # against diffusers' must stay within the bf16 bound, and near the unshared step's error.
    from bench.bench_fp8 import SharedFirstLayerEverywhere
    from cosmos3_kernels import shared_gen_attention as sga

    probe = torch.empty(1, 1, 1, 128, device="cuda", dtype=torch.bfloat16)
    if sga.shared_unsupported(probe) is not None:
        pytest.skip(sga.shared_unsupported(probe))
    calls = count_calls(monkeypatch, sga, "partials_flash4")
    with SharedFirstLayerEverywhere():
        errors, counts = step_errors_on_and_off(model, "share_first_attention", "shares_gen_block", calls)
    print(f"{model.info.family} 832x480x17: rel. error against diffusers, shared {errors[True]}, not shared {errors[False]}")
    assert counts == {True: 1, False: 0}  # one step, one first layer
    for shared, separate in zip(errors[True], errors[False]):
        assert shared <= BF16_REL_ERROR and shared <= 1.25 * separate


def test_mlp_activation_in_the_gemm_keeps_the_step_as_close_to_diffusers(model, monkeypatch):
    # QuACK's GEMM with the MLP's activation in its epilogue (cosmos3_kernels.gemm.mlp_in_quack), forced at a short video
    # (dispatch otherwise measures it): the step's velocity against diffusers' must stay within the bf16 bound and
    # no further than the split path's; with the switch off it must not run at all.
    from bench.bench_fp8 import MLPEpilogueEverywhere
    from cosmos3_kernels import gemm

    activation = "relu_sq" if model.transformer.config.hidden_act == "relu2" else "swiglu"
    probe = torch.empty(16, 128, device="cuda", dtype=torch.bfloat16)
    why = gemm.mlp_in_unsupported(probe, probe, activation)
    if why is not None:
        pytest.skip(why)
    calls = count_calls(monkeypatch, gemm, "mlp_in_quack")
    with MLPEpilogueEverywhere():
        errors, counts = step_errors_on_and_off(model, "mlp_epilogue", "fuse_mlp_activation", calls)
    print(f"{model.info.family} 832x480x17: rel. error against diffusers, MLP epilogue {errors[True]}, split {errors[False]}")
    assert counts == {True: len(model.transformer.layers), False: 0}
    for fused_error, split_error in zip(errors[True], errors[False]):
        assert fused_error <= BF16_REL_ERROR and fused_error <= 1.1 * split_error


def test_residual_add_in_the_gemm_keeps_the_step_as_close_to_diffusers(model, monkeypatch):
    # The attention-out and down projections added to the residual stream in cuBLAS's epilogue
    # (FastPathOptions.residual_epilogue), at a short video: the step's velocity against diffusers' must stay within the
    # bf16 bound and no further than with the separate add; with the switch off it must not run at all.
    from engine.pipeline.fast_path import FastGenTower

    calls = count_calls(monkeypatch, FastGenTower, "_add_product")
    errors, counts = step_errors_on_and_off(model, "residual_epilogue", "fuse_residual_add", calls)
    print(f"{model.info.family} 832x480x17: rel. error against diffusers, residual add in the GEMM {errors[True]}, "
          f"separate {errors[False]}")
    assert counts == {True: 2 * len(model.transformer.layers), False: 0}
    for fused_error, split_error in zip(errors[True], errors[False]):
        assert fused_error <= BF16_REL_ERROR and fused_error <= 1.1 * split_error


def test_load_kernels_imports_the_installed_libraries_before_any_request(model):
    # A restarted process paid flash-attn-4's and QuACK's imports inside its first request (seconds); load_kernels,
    # which engine.load_model calls, pays them at load instead.
    from importlib.util import find_spec

    from cosmos3_kernels import gemm, prefix_attention as pa
    from engine.pipeline.fast_path import FastPathOptions, load_kernels

    # The module's model has served other tests: start from no dispatcher and no import, as a fresh load does.
    model.runtime.dispatchers.clear()
    pa._flash4_entry.cache_clear()
    gemm._epilogue_entry.cache_clear()
    said = load_kernels(model)
    assert {"prefix_attention/flash4", "shared_gen_attention/flash4", "mlp_in/quack"} <= set(said)
    assert FastPathOptions.for_model(model).kernels in model.runtime.dispatchers
    assert pa._flash4_entry.cache_info().currsize == 1 and gemm._epilogue_entry.cache_info().currsize == 1
    installed = {"prefix_attention/flash4": find_spec("flash_attn") is not None,
                 "shared_gen_attention/flash4": find_spec("flash_attn") is not None,
                 "mlp_in/quack": find_spec("quack") is not None}
    for name, present in installed.items():
        assert (said[name] is None) == present, (name, said[name])
