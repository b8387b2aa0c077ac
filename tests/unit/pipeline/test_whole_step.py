"""The whole-step path (`engine.pipeline.whole_step`) gives the eager fast path's results bit for bit (CPU).

On the CPU the step runs eagerly from its static buffers (no graph), which is exactly the sequence a
capture records; the GPU test (tests/gpu/test_gpu_fast_path.py) compares graph replays on the H200.
"""
import threading

import numpy as np
import pytest
from PIL import Image

import engine
from engine.pipeline import whole_step
from engine.events import JobCancelled
from engine.pipeline.fast_path import FastPathOptions
from engine.pipeline.run import generate

FAST = FastPathOptions(enabled=True, batched_cfg=True, cuda_graphs=False, kernels="torch", fused_projections=True)


@pytest.fixture(scope="module")
def models(tiny_family):
    return {name: engine.load_model(tiny_family[name], device="cpu") for name in ("nano", "edge-distilled")}


def _run(model, request, whole: bool, **kwargs):
    model.fast_path = FastPathOptions(**{**FAST.__dict__, "whole_step": whole})
    try:
        return generate(model, request, **kwargs)
    finally:
        model.fast_path = None


CASES = {
    # CFG only inside the interval: steps with one branch and with two, one graph each.
    "nano t2i, guidance interval": ("nano", dict(mode="t2i", prompt="a lighthouse at dusk", negative_prompt="blurry",
                                                 seed=4, steps=4, guidance_scale=5.0, guidance_interval=[400, 1000])),
    "nano t2v, CFG every step": ("nano", dict(mode="t2v", prompt="waves on rocks", seed=2, steps=3, num_frames=9,
                                              guidance_scale=6.0, guidance_interval=None)),
}


@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_whole_step_is_bitwise_the_eager_loop(models, case, monkeypatch):
    name, request = CASES[case]
    model = models[name]
    eager = _run(model, request, whole=False)
    fast = _run(model, request, whole=True)
    assert eager.trace.whole_step is None and "whole_step" not in eager.trace.passes
    assert fast.trace.whole_step == "built" and "whole_step" in fast.trace.passes, "the whole-step path did not run"
    assert fast.trace.graph_records == 0  # the CPU runs the step eagerly from its static buffers
    assert fast.trace.tower_steps == eager.trace.tower_steps
    assert np.array_equal(fast.frames, eager.frames)


def test_distilled_i2v_with_reanchoring_is_bitwise_the_eager_loop(models, tmp_path, monkeypatch):
    image = tmp_path / "start.png"
    Image.fromarray((np.random.default_rng(0).random((96, 128, 3)) * 255).astype(np.uint8)).save(image)
    request = dict(mode="i2v", prompt="a cat turns its head", seed=9, image=str(image), num_frames=9)
    model = models["edge-distilled"]
    eager = _run(model, request, whole=False)
    fast = _run(model, request, whole=True)
    assert fast.trace.whole_step == "built"
    kept = []  # the step itself, to see that it re-anchors (built again here: it is not kept on the CPU)
    monkeypatch.setattr(whole_step, "cacheable", lambda tower: kept.append(1) is None)
    _run(model, request, whole=True)
    step = next(iter(model.runtime.kept_steps.values()))
    assert kept and step.sampler.kind == "distilled" and step.clean is not None
    model.runtime.kept_steps.clear()
    assert np.array_equal(fast.frames, eager.frames)


def test_a_second_request_of_the_same_shape_reuses_the_step_and_its_buffers(models, monkeypatch):
    """What a kept graph relies on: the static buffers take the new request's prefill and tables."""
    model = models["nano"]
    model.runtime.kept_steps.clear()
    monkeypatch.setattr(whole_step, "cacheable", lambda tower: True)
    first = dict(CASES["nano t2i, guidance interval"][1])
    second = dict(first, seed=77, guidance_scale=3.0, prompt="a lighthouse at dawn")  # same token count
    assert _run(model, first, whole=True).trace.whole_step == "built"
    kept = next(iter(model.runtime.kept_steps.values()))
    reused = _run(model, second, whole=True)
    assert reused.trace.whole_step == "reused"
    assert len(model.runtime.kept_steps) == 1 and next(iter(model.runtime.kept_steps.values())) is kept
    assert np.array_equal(reused.frames, _run(model, second, whole=False).frames)
    model.runtime.kept_steps.clear()


def test_cancel_between_steps(models):
    model = models["nano"]
    cancel = threading.Event()
    seen = []

    def on_progress(progress):
        seen.append(progress.step)
        if progress.stage == "denoise" and progress.step == 2:
            cancel.set()

    with pytest.raises(JobCancelled):
        _run(model, dict(CASES["nano t2i, guidance interval"][1], steps=5), whole=True,
             on_progress=on_progress, cancel=cancel)
    assert max(seen) == 2


def test_fp8_asked_for_off_the_gpu_fails_with_the_reason(models):
    from engine.pipeline.fp8 import FP8Unavailable

    model = models["nano"]
    model.fast_path = FastPathOptions(**{**FAST.__dict__, "fp8": True})
    try:
        with pytest.raises(FP8Unavailable, match="needs a CUDA GPU.*runs on 'cpu'"):
            generate(model, dict(CASES["nano t2i, guidance interval"][1], steps=1))
    finally:
        model.fast_path = None
    result = _run(model, dict(CASES["nano t2i, guidance interval"][1], steps=1), whole=True)
    assert result.precision == "bf16" and result.summary()["precision"] == "bf16"


def test_warm_up_covers_every_whitelisted_size_of_the_default_modes(models):
    from engine.model.defaults import sampling_defaults
    from engine.serving.warmup import WARM_PROMPTS, warm_requests

    for model in models.values():
        requests = warm_requests(model.info)
        for mode in ("t2i", "t2v"):
            defaults = sampling_defaults(model.info, mode)
            sizes = {(r["width"], r["height"]) for r in requests if r["mode"] == mode}
            assert sizes == {tuple(size) for size in defaults["resolutions"]}
            steps = {r["steps"] for r in requests if r["mode"] == mode}
            assert steps == ({defaults["steps"]} if defaults["steps_locked"] else {min(12, defaults["steps"])})
        assert {r["prompt"] for r in requests} == set(WARM_PROMPTS)
        for request in requests[:1]:  # each one is a valid request as written
            engine.validate_request(model.info, request["mode"], request)
