"""Live previews while denoising (engine.pipeline.preview): when they are sent, what they show, and that they
change nothing about the result. CPU, tiny checkpoints."""
from types import SimpleNamespace

import numpy as np
import pytest
import torch

import engine
from engine.events import Preview
from engine.pipeline.denoise import _previewing
import engine.pipeline.preview as preview_module
from engine.pipeline.preview import PREVIEWS_PER_RUN, Previewer, preview_image, preview_steps


@pytest.fixture(scope="module")
def nano(tiny_family):
    return engine.load_model(tiny_family["nano"])


@pytest.fixture
def no_budget(monkeypatch):
    """These tests are about which steps preview and what they show, not the time budget (tested on its own
    below): on the CPU a tiny VAE decode can cost more than a tiny step."""
    monkeypatch.setattr(preview_module, "PREVIEW_BUDGET", float("inf"))


def _run(model, request, previews):
    events = []
    result = engine.generate(model, dict(request), on_progress=events.append, previews=previews)
    return result, [e for e in events if isinstance(e, Preview)]


def test_the_plan_spreads_previews_and_never_repeats_the_result():
    assert preview_steps(8) == {2, 4, 6}
    assert preview_steps(50) == {12, 25, 37}
    assert preview_steps(4) == {1, 2, 3}
    assert preview_steps(2) == {1}
    assert preview_steps(1) == frozenset()
    assert all(len(preview_steps(n)) <= PREVIEWS_PER_RUN for n in range(1, 300))


def test_previews_are_off_unless_asked_and_never_change_the_result(nano, no_budget):
    request = {"mode": "t2i", "prompt": "a kite over a beach", "steps": 8, "seed": 3}
    plain, none = _run(nano, request, previews=False)
    shown, previews = _run(nano, request, previews=True)
    assert none == []
    assert [p.step for p in previews] == [2, 4, 6] and all(p.total == 8 for p in previews)
    image = previews[0].image
    assert image.dtype == np.uint8 and image.ndim == 3 and image.shape[2] == 3
    np.testing.assert_array_equal(plain.frames, shown.frames)  # the preview reads the state, never writes it


def test_a_video_preview_is_a_strip_of_frames(nano, no_budget):
    _, previews = _run(nano, {"mode": "t2v", "prompt": "a kite", "steps": 4, "seed": 1}, previews=True)
    image = previews[-1].image
    width, height = nano.info.tiny.video_sizes[0]
    assert image.shape[0] == height and image.shape[1] == 3 * width  # first, middle and last latent frame


def test_the_preview_shows_the_clean_estimate_not_the_noisy_sample(nano, no_budget):
    """x0 = x_t - sigma v: the eager loop hands the previewer the estimate, which at the last planned
    step is close to the final latent, while the noisy sample there is not."""
    seen = {}

    class Recorder(Previewer):
        def show(self, step, x0):
            seen[step] = x0.clone()

    import engine.pipeline.run as pipeline

    original = pipeline.previewer
    pipeline.previewer = lambda model, steps, emit, enabled: Recorder(model.vae, steps, emit) if enabled else None
    try:
        result, _ = _run(nano, {"mode": "t2i", "prompt": "a kite", "steps": 8, "seed": 5}, previews=True)
    finally:
        pipeline.previewer = original
    assert sorted(seen) == [2, 4, 6]
    first = preview_image(nano.vae, seen[2])
    assert first.shape[:2] == result.frames.shape[1:3]  # tiny latents are not pooled
    # The estimate moves towards the result as sigma falls.
    final = torch.from_numpy(result.frames[0]).float()
    error = [float((torch.from_numpy(preview_image(nano.vae, seen[s])).float() / 255 - final).abs().mean())
             for s in (2, 6)]
    assert error[1] < error[0]


def test_previews_stay_within_their_share_of_the_denoising_time(monkeypatch):
    """The H200's Edge T2I 640x640: 10.7 ms steps, 14 ms previews. Three previews would cost 7.8% of the
    run; within the 5% budget the first is shown and the later ones are skipped. Slow steps keep all three."""
    def run(step_s, preview_s, steps=50):
        now = [0.0]
        shown = []
        previewer = Previewer(vae=None, total=steps, emit=shown.append, clock=lambda: now[0])
        monkeypatch.setattr(preview_module, "preview_image", lambda vae, x0: now.__setitem__(0, now[0] + preview_s))
        for step in range(1, steps + 1):
            now[0] += step_s
            if previewer.due(step):
                previewer.show(step, torch.zeros(1))
        return [p.step for p in shown], previewer.skipped, previewer.spent / now[0]

    steps, skipped, share = run(0.0107, 0.014)
    assert steps == [12] and skipped == [25, 37] and share <= 0.05
    steps, skipped, share = run(0.260, 0.035)  # Edge T2V 480p: 0.8% for all three
    assert steps == [12, 25, 37] and skipped == [] and share <= 0.05


def test_the_whole_step_loop_previews_from_the_samplers_x0():
    calls, shown = [], []
    held = torch.ones(1)
    whole = SimpleNamespace(sampler=SimpleNamespace(m_prev=held), sample=torch.zeros(1))
    preview = SimpleNamespace(due=lambda step: step == 2, show=lambda step, x0: shown.append((step, x0)))
    report = _previewing(lambda step, total: calls.append(step), preview, whole)
    for step in (1, 2, 3):
        report(step, 3)
    assert calls == [1, 2, 3] and shown == [(2, held)]
    whole.sampler.m_prev = None  # the distilled sampler keeps no x0: the sample is shown
    report(2, 3)
    assert shown[-1][1] is whole.sample


def test_the_whole_step_loop_sends_previews_through_the_real_generate(nano, no_budget):
    """The sampler holds its x0 as [1, 1, C, T, h, w] (it was built on the sample unsqueezed); the preview
    must get the sample's own shape."""
    from engine.pipeline.fast_path import FastPathOptions

    nano.fast_path = FastPathOptions(enabled=True, batched_cfg=True, cuda_graphs=False, kernels="torch",
                                     fused_projections=True, whole_step=True)
    try:
        _, previews = _run(nano, {"mode": "t2i", "prompt": "a kite over a beach", "steps": 8, "seed": 3}, previews=True)
    finally:
        nano.fast_path = None
    assert [p.step for p in previews] == [2, 4, 6]
    assert all(p.image.dtype == np.uint8 and p.image.ndim == 3 for p in previews)
