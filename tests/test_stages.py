"""The stages' promises (issue 11): the loop asks the device nothing, options are read once per request."""
import threading

import numpy as np
import pytest
import torch
from PIL import Image

import engine
from engine.pipeline import denoise, fast_path
from engine.pipeline.run import generate


@pytest.fixture(scope="module")
def nano(tiny_family):
    return engine.load_model(tiny_family["nano"], device="cpu")


class _HostReads:
    """Makes any read of a tensor's value on the host (bool, item, tolist, int, float) raise while on."""

    def __init__(self, monkeypatch):
        self.on = False
        for name in ("__bool__", "item", "tolist", "__int__", "__float__"):
            original = getattr(torch.Tensor, name)
            monkeypatch.setattr(torch.Tensor, name, self._guard(name, original))

    def _guard(self, name, original):
        def guarded(tensor, *args, **kwargs):
            if self.on:
                raise AssertionError(f"Tensor.{name} read a value back to the host inside the step")
            return original(tensor, *args, **kwargs)
        return guarded

    def around(self, fn):
        def wrapped(*args, **kwargs):
            self.on = True
            try:
                return fn(*args, **kwargs)
            finally:
                self.on = False
        return wrapped


@pytest.mark.parametrize("request_", [dict(mode="t2i", prompt="a red kite", steps=2, seed=1),
                                      dict(mode="i2v", prompt="the kite climbs", steps=2, seed=1, num_frames=9)],
                         ids=["t2i", "i2v (conditioned frames)"])
def test_the_step_reads_nothing_back_from_the_device(nano, request_, monkeypatch, tmp_path):
    """Gen tokens and velocities (both branches) run without one host sync: which rows are noisy was
    decided at layout. Before, `_masked` asked `mask.sum() > 0` of every velocity."""
    if request_["mode"] == "i2v":
        path = tmp_path / "first.png"
        Image.fromarray(np.full((64, 64, 3), 120, dtype=np.uint8)).save(path)
        request_ = dict(request_, image=str(path))
    reads = _HostReads(monkeypatch)
    calls = []
    for name in ("gen_tokens", "velocity"):
        original = getattr(denoise, name)
        monkeypatch.setattr(denoise, name, reads.around(lambda *a, _f=original, _n=name: calls.append(_n) or _f(*a)))
    result = generate(nano, dict(request_, guidance_scale=4.0, guidance_interval=None))
    assert calls.count("gen_tokens") == 2 and calls.count("velocity") == 4  # two steps, two branches each
    assert np.isfinite(result.frames).all()


def test_fast_path_options_are_read_once_per_request(nano, monkeypatch):
    """The switches come from the environment once per request, not at every step."""
    reads = []
    original = fast_path.FastPathOptions.from_env.__func__
    monkeypatch.setattr(fast_path.FastPathOptions, "from_env",
                        classmethod(lambda cls, device: reads.append(1) or original(cls, device)))
    nano.fast_path = None
    generate(nano, dict(mode="t2i", prompt="a red kite", steps=4, seed=1))
    assert len(reads) == 1


def test_the_towers_dtype_and_device_are_read_once_per_cache_not_per_layer(nano, monkeypatch):
    """diffusers' `ModelMixin.dtype` / `.device` walk every submodule on each read (2-5 ms on a full-size
    tower): the K/V cache takes them once, not once per layer (that was ~0.1 s of host time a request)."""
    from engine.pipeline.transformer import allocate_cache

    tower = type(nano.transformer)
    reads = {"dtype": 0, "device": 0}
    for name in reads:
        original = getattr(tower, name)
        monkeypatch.setattr(tower, name, property(
            lambda self, _o=original, _n=name: reads.__setitem__(_n, reads[_n] + 1) or _o.fget(self)))
    assert len(nano.transformer.layers) > 1
    cache = allocate_cache(nano.transformer, (3, 5), 4)
    assert reads == {"dtype": 1, "device": 1}
    assert len(cache.buffers) == len(nano.transformer.layers)
    assert all(b.dtype == nano.transformer.dtype and b.device == nano.transformer.device for b in cache.buffers)


def _image_file(tmp_path) -> str:
    path = tmp_path / "first.png"
    Image.fromarray(np.full((64, 64, 3), 120, dtype=np.uint8)).save(path)
    return str(path)


@pytest.mark.parametrize("name, request_", [
    ("nano", dict(mode="t2v", prompt="a boat", steps=2, seed=3, width=64, height=64, num_frames=9, sound=True)),
    ("nano", dict(mode="i2v", prompt="the kite climbs", steps=2, seed=3, num_frames=9)),
    ("nano", dict(mode="action", prompt="pick up the cup", steps=2, seed=3,
                  action=dict(kind="forward_dynamics", domain="bridge_orig_lerobot", chunk_size=8, resolution_tier=256,
                              view_point="wrist_view", actions=[[0.1 * i] * 10 for i in range(6)]))),
    ("edge-distilled", dict(mode="t2v", prompt="a boat", seed=3, width=64, height=64, num_frames=9)),
], ids=["t2v with sound", "i2v (conditioned frames)", "forward dynamics", "distilled (draws while denoising)"])
def test_noise_drawn_on_a_worker_is_the_same_request(tiny_family, name, request_, monkeypatch, tmp_path):
    """On a GPU the noise stage draws on a worker thread while the prefill runs. Here the worker is forced on the
    CPU and each draw made slow: the denoise stage must wait for every value (and for the generator, which the
    distilled sampler draws from next) to give the request's own frames, sound and actions."""
    import time

    from engine.pipeline import conditioning

    model = engine.load_model(tiny_family[name], device="cpu")
    if request_["mode"] in ("i2v", "action"):
        request_ = dict(request_, image=_image_file(tmp_path))
    inline = generate(model, request_)
    draw = conditioning.randn_tensor
    slow_draws = []

    def slow(*args, **kwargs):
        time.sleep(0.3)
        slow_draws.append(threading.current_thread().name)
        return draw(*args, **kwargs)

    monkeypatch.setattr(conditioning, "randn_tensor", slow)
    monkeypatch.setattr(conditioning, "_draws_in_background", lambda options, device: True)
    background = generate(model, request_)
    assert slow_draws and all(thread.startswith("cosmos3-noise") for thread in slow_draws)
    assert np.array_equal(background.frames, inline.frames)
    for field in ("audio", "actions"):
        ours, expected = getattr(background, field), getattr(inline, field)
        assert (ours is None) == (expected is None) and (ours is None or np.array_equal(ours, expected)), field


def test_a_failed_draw_on_the_worker_fails_the_request_with_its_error(nano, monkeypatch):
    from engine.pipeline import conditioning

    def broken(*args, **kwargs):
        raise RuntimeError("no randomness today")

    monkeypatch.setattr(conditioning, "randn_tensor", broken)
    monkeypatch.setattr(conditioning, "_draws_in_background", lambda options, device: True)
    with pytest.raises(RuntimeError, match="no randomness today"):
        generate(nano, dict(mode="t2i", prompt="a red kite", steps=2, seed=1))
    monkeypatch.undo()
    assert np.isfinite(generate(nano, dict(mode="t2i", prompt="a red kite", steps=2, seed=1)).frames).all()


def test_the_noise_worker_runs_on_the_fast_paths_gpu_unless_switched_off():
    from engine.pipeline.conditioning import _draws_in_background
    from engine.pipeline.fast_path import FastPathOptions

    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    assert _draws_in_background(FastPathOptions(enabled=True), cuda)
    assert not _draws_in_background(FastPathOptions(enabled=True, noise_worker=False), cuda)
    assert not _draws_in_background(FastPathOptions(enabled=False), cuda)
    assert not _draws_in_background(FastPathOptions(enabled=True), cpu)
