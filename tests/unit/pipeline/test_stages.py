"""The stages' promises (issue 11): the loop asks the device nothing, options are read once per request."""
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
    for name in ("gen_tokens", "velocity"):
        monkeypatch.setattr(denoise, name, reads.around(getattr(denoise, name)))
    result = generate(nano, dict(request_, guidance_scale=4.0, guidance_interval=None))
    # The eager loop ran (the guarded functions with it): two steps, two branches each, no host wait off the GPU.
    trace = result.trace
    assert trace.tower == "eager" and trace.tower_steps == [2, 2] and trace.velocities == 4 and trace.host_syncs == 0
    assert np.isfinite(result.frames).all()


def test_fast_path_options_are_read_once_per_request(nano, monkeypatch):
    """The switches come from the configuration once per request, not at every step."""
    reads = []
    original = fast_path.FastPathOptions.from_config.__func__
    monkeypatch.setattr(fast_path.FastPathOptions, "from_config",
                        classmethod(lambda cls, config, device: reads.append(1) or original(cls, config, device)))
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


def test_the_trace_names_each_ops_kernels_as_dispatch_chose_them():
    """`RunTrace.kernels`: every path dispatch holds per op (over its shapes), read from its public decisions; a
    tower without a dispatcher (eager, a GPU group's) has none. On the GPU these are measured choices."""
    from types import SimpleNamespace

    from cosmos3_kernels.dispatch import REGULAR, Decision
    from engine.pipeline.trace import kernel_choices

    decisions = {("prefix_attention", 1024, 2): Decision("flash4", "measured"),
                 ("prefix_attention", 400, 1): Decision("triton", "measured"),
                 ("qk_norm_rope", 1024): Decision("triton", "measured"),
                 ("shared_gen_attention", 8192): Decision(REGULAR, "measured: slower")}
    tower = SimpleNamespace(dispatch=SimpleNamespace(decisions=lambda: decisions))
    assert kernel_choices(tower) == {"prefix_attention": ["flash4", "triton"], "qk_norm_rope": ["triton"],
                                     "shared_gen_attention": ["not shared"]}
    assert kernel_choices(SimpleNamespace()) == {}
