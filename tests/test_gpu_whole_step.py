"""On the H200: the new fast-path pieces against their references, at full size where it matters.

- scheduler tables on CUDA, bit for bit diffusers' schedulers on CUDA (same device, same scalar ops);
- the whole step as CUDA graphs (Edge full-size random weights, T2I with a guidance interval so both
  branch counts are captured) against the eager fast loop, and a second request reusing the graphs;
- the uint8 decode of the full-size Wan2.2 VAE against the exact decode + output-stage rounding.

Skipped without CUDA. `python -m pytest -q -s -m gpu tests/test_gpu_whole_step.py`
"""
import gc

import numpy as np
import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


@pytest.mark.parametrize("kind", ["unipc", "distilled"])
def test_scheduler_tables_bitwise_on_cuda(kind):
    from diffusers import FlowMatchEulerDiscreteScheduler, UniPCMultistepScheduler

    from engine.pipeline.scheduler_tables import sampler_for

    def make():
        if kind == "unipc":
            s = UniPCMultistepScheduler(num_train_timesteps=1000, solver_order=2, prediction_type="flow_prediction",
                                        use_flow_sigmas=True, flow_shift=10.0, final_sigmas_type="zero")
            s.set_timesteps(35, device="cuda")
        else:
            s = FlowMatchEulerDiscreteScheduler(shift=1.0, stochastic_sampling=True)
            s.set_timesteps(sigmas=[0.999, 0.75, 0.5, 0.25], device="cuda")
        return s

    shape = (1, 1, 48, 12, 30, 52)
    reference = make()
    ours = sampler_for(make(), torch.empty(shape, device="cuda"), torch.Generator().manual_seed(5))
    ref_gen = torch.Generator().manual_seed(5)
    torch.manual_seed(0)
    ref_x = our_x = torch.randn(shape, device="cuda")
    for i, t in enumerate(reference.timesteps):
        v = torch.randn(shape, device="cuda")
        kwargs = {"generator": ref_gen} if kind == "distilled" else {}
        ref_x = reference.step(v, t, ref_x, return_dict=False, **kwargs)[0]
        ours.load_row(i)
        our_x = ours.step(v, our_x)
        assert torch.equal(our_x, ref_x), f"step {i}"


@pytest.fixture(scope="module")
def edge():
    from bench.models import as_loaded_model, build_transformer, build_vae
    from engine.model.tiny import build_tokenizer

    model = as_loaded_model(build_transformer("edge"), "edge", vae=build_vae(), tokenizer=build_tokenizer())
    yield model
    del model
    gc.collect()
    torch.cuda.empty_cache()


def _generate(model, request, whole: bool):
    from engine.pipeline.fast_path import FastPathOptions
    from engine.pipeline.run import generate

    model.fast_path = FastPathOptions.from_env(model.device).__class__(
        **{**FastPathOptions.from_env(model.device).__dict__, "whole_step": whole})
    try:
        return generate(model, request)
    finally:
        model.fast_path = None


def test_whole_step_graphs_equal_the_eager_fast_loop(edge):
    request = dict(mode="t2i", prompt="A lighthouse keeper at dusk. " * 40, negative_prompt="blurry, low quality",
                   seed=3, steps=16, width=640, height=640, guidance_interval=[400, 1000])
    eager = _generate(edge, request, whole=False)
    graphed = _generate(edge, request, whole=True)
    kept = edge.dispatchers["whole_step"]
    step = next(iter(kept.values()))
    assert step.use_graphs and step.captured_counts == {1, 2}, "both branch counts captured"
    diff = np.abs(graphed.frames.astype(int) - eager.frames.astype(int)).max()
    print(f"whole-step graphs vs eager fast loop: max uint8 diff {diff}")
    assert diff == 0
    # A second request of the same shape and text lengths replays the kept graphs.
    again = dict(request, seed=11, guidance_scale=4.5)
    graphed = _generate(edge, again, whole=True)
    assert next(iter(kept.values())) is step
    assert np.array_equal(graphed.frames, _generate(edge, again, whole=False).frames)


def test_uint8_decode_equals_the_exact_decode_on_cuda(edge):
    from diffusers.video_processor import VideoProcessor

    from engine.pipeline.decode import decode_uint8
    from engine.pipeline.outputs import frames_to_uint8

    vae = edge.vae
    torch.manual_seed(0)
    z = torch.randn(1, 48, 5, 30, 52, device="cuda", dtype=vae.dtype)
    with torch.no_grad():
        decoded = vae.decode(z).sample.float()
    expected = frames_to_uint8(VideoProcessor(vae_scale_factor=16).postprocess_video(decoded, output_type="np")[0])
    assert np.array_equal(decode_uint8(vae, z), expected)


def test_whole_step_graphs_with_flash4_attention_equal_the_eager_fast_loop(edge, monkeypatch):
    """flash-attn-4 captured inside the step graph: dispatch is made to prefer it wherever it is offered, at a
    graphed shape (640x640 T2I, both branch counts), and the replayed graphs must equal the eager loop."""
    from kernels import dispatch as dsp, prefix_attention as pa

    missing = pa.flash4_unsupported(torch.empty(1, 1, 1, 128, dtype=torch.bfloat16, device="cuda"))
    if missing is not None:
        pytest.skip(f"flash-attn-4: {missing}")
    measure = dsp.KernelDispatcher._measure

    def prefer_flash4(self, run_triton, run_torch, run_flash4=None):
        decision = measure(self, run_triton, run_torch, run_flash4)
        if decision.flash4_ms is None:
            return decision
        return dsp.Decision(dsp.Path.FLASH4, "test: flash-attn-4 preferred", triton_ms=decision.triton_ms,
                            torch_ms=decision.torch_ms, flash4_ms=decision.flash4_ms,
                            flash4_config=decision.flash4_config)

    monkeypatch.setattr(dsp.KernelDispatcher, "_measure", prefer_flash4)
    saved = {name: edge.dispatchers.pop(name) for name in ("auto", "whole_step") if name in edge.dispatchers}
    try:
        request = dict(mode="t2i", prompt="A lighthouse keeper at dusk. " * 40, negative_prompt="blurry, low quality",
                       seed=5, steps=16, width=640, height=640, guidance_interval=[400, 1000])
        eager = _generate(edge, request, whole=False)
        paths = {d.path for key, d in edge.dispatchers["auto"].decisions().items() if key[0] == "prefix_attention"}
        assert paths == {dsp.Path.FLASH4}, paths
        graphed = _generate(edge, request, whole=True)
        step = next(iter(edge.dispatchers["whole_step"].values()))
        assert step.use_graphs and step.captured_counts == {1, 2}, "both branch counts captured"
        diff = np.abs(graphed.frames.astype(int) - eager.frames.astype(int)).max()
        print(f"whole-step graphs with flash-attn-4 vs eager fast loop: max uint8 diff {diff}")
        assert diff == 0
    finally:
        for name in ("auto", "whole_step"):
            edge.dispatchers.pop(name, None)
        edge.dispatchers.update(saved)


def test_capture_graph_keeps_the_allocators_cache_and_replays_what_it_captured(monkeypatch):
    """`capture_graph` is `torch.cuda.graph` without the empty_cache before every capture (each new prompt
    length recaptures): the cached blocks stay, and the replay computes what the eager call computes.
    Short of memory, it still frees the cache first."""
    from engine.pipeline.fast_path import CAPTURE_EMPTY_CACHE_BELOW, capture_graph

    emptied = []
    real_empty = torch.cuda.empty_cache
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: emptied.append(1) or real_empty())
    x = torch.randn(1024, 1024, device="cuda")
    w = torch.randn(1024, 1024, device="cuda")
    block = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    del block  # a free block in the allocator's cache
    reserved = torch.cuda.memory_reserved()
    graph, out = capture_graph(lambda: torch.relu(x @ w))
    assert emptied == [] and torch.cuda.memory_reserved() >= reserved
    x.copy_(torch.randn_like(x))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, torch.relu(x @ w))

    free, total = torch.cuda.mem_get_info()
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda *a: (int(total * CAPTURE_EMPTY_CACHE_BELOW / 2), total))
    capture_graph(lambda: x * 2)
    assert emptied == [1]
