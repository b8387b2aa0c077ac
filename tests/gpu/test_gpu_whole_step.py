"""On the H200: the new fast-path pieces against their references, at full size where it matters.

- scheduler tables on CUDA, bit for bit diffusers' schedulers on CUDA (same device, same scalar ops);
- the whole step as CUDA graphs (Edge full-size random weights, T2I with a guidance interval so both
  branch counts are captured) against the eager fast loop, and a second request reusing the graphs;
- the uint8 decode of the full-size Wan2.2 VAE against the exact decode + output-stage rounding.

Skipped without CUDA. `python -m pytest -q -s -m gpu tests/gpu/test_gpu_whole_step.py`
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


def _generate(model, request, whole: bool, **options):
    """`generate` with the whole step on or off and any other fast-path switches (`FastPathOptions` fields)."""
    from dataclasses import replace

    from engine.config import build_config
    from engine.pipeline.fast_path import FastPathOptions
    from engine.pipeline.run import generate

    model.fast_path = replace(FastPathOptions.from_config(build_config(), model.device), whole_step=whole, **options)
    try:
        return generate(model, request)
    finally:
        model.fast_path = None


def test_whole_step_graphs_equal_the_eager_fast_loop(edge):
    request = dict(mode="t2i", prompt="A lighthouse keeper at dusk. " * 40, negative_prompt="blurry, low quality",
                   seed=3, steps=16, width=640, height=640, guidance_interval=[400, 1000])
    eager = _generate(edge, request, whole=False)
    graphed = _generate(edge, request, whole=True, lengths_on_device=False)
    kept = edge.runtime.kept_steps
    step = next(iter(kept.values()))
    assert step.use_graphs and step.captured_counts == {1, 2}, "both branch counts captured"
    assert step.tower.cache.layout.lengths is None
    diff = np.abs(graphed.frames.astype(int) - eager.frames.astype(int)).max()
    print(f"whole-step graphs vs eager fast loop: max uint8 diff {diff}")
    assert diff == 0
    # A second request of the same shape and text lengths replays the kept graphs.
    again = dict(request, seed=11, guidance_scale=4.5)
    graphed = _generate(edge, again, whole=True, lengths_on_device=False)
    assert next(iter(kept.values())) is step
    assert np.array_equal(graphed.frames, _generate(edge, again, whole=False).frames)


def test_a_kept_step_with_the_lengths_on_the_device_serves_a_new_prompt_length_bit_for_bit(edge, monkeypatch):
    """The default whole step keeps its graphs across prompt lengths: a request at a new length (same
    power-of-two bucket) replays the kept step without capturing, and its frames equal (1) a fresh capture
    at that length with the same kernel choices, and (2) the eager fast loop with the kernels forced to
    Triton, which the graphs then run too."""
    from engine.pipeline import whole_step

    saved = {name: edge.runtime.dispatchers.pop(name) for name in ("auto", "triton") if name in edge.runtime.dispatchers}
    saved_steps = dict(edge.runtime.kept_steps)
    try:
        first = dict(mode="t2i", prompt="A lighthouse keeper at dusk. " * 40, negative_prompt="blurry, low quality",
                     seed=3, steps=16, width=640, height=640, guidance_interval=[400, 1000])
        second = dict(first, prompt="A lighthouse keeper at dusk. " * 43, seed=4)
        for kernels in ("auto", "triton"):
            edge.runtime.kept_steps.clear()
            built = _generate(edge, first, whole=True, kernels=kernels)
            step = next(iter(edge.runtime.kept_steps.values()))
            assert step.tower.cache.layout.lengths is not None and built.trace.graph_records == 2  # 1 and 2 branches
            replayed = _generate(edge, second, whole=True, kernels=kernels)
            assert replayed.trace.whole_step == "reused" and len(edge.runtime.kept_steps) == 1
            assert replayed.trace.graph_records == 0, "no capture for the new length"
            edge.runtime.kept_steps.clear()
            fresh = _generate(edge, second, whole=True, kernels=kernels)
            assert fresh.trace.whole_step == "built" and fresh.trace.graph_records == 2
            diff = np.abs(replayed.frames.astype(int) - fresh.frames.astype(int)).max()
            print(f"{kernels}: kept step at a new prompt length vs a fresh capture: max uint8 diff {diff}")
            assert diff == 0
        eager = _generate(edge, second, whole=False, kernels="triton")
        diff = np.abs(replayed.frames.astype(int) - eager.frames.astype(int)).max()
        print(f"kept step (Triton) at a new prompt length vs the eager loop (Triton): max uint8 diff {diff}")
        assert diff == 0
    finally:
        for name in ("auto", "triton"):
            edge.runtime.dispatchers.pop(name, None)
        edge.runtime.dispatchers.update(saved)
        edge.runtime.kept_steps.clear()
        edge.runtime.kept_steps.update(saved_steps)


def test_a_short_prompt_and_a_long_caption_share_one_kept_step_whose_memory_is_counted(edge, monkeypatch):
    """With the lengths on the device the capacity has room for captions up to `KEPT_PROMPT_TOKENS`, so a
    one-line prompt and a ~1.6k-token caption at one size replay one kept step (no second capture); the
    step counts its graphs' pool beside its K/V buffers, which is what the kept steps' budget adds up."""
    from bench.e2e import long_prompt
    from engine.pipeline import whole_step

    saved = dict(edge.runtime.kept_steps)
    edge.runtime.kept_steps.clear()
    try:
        short = dict(mode="t2i", prompt="A lighthouse keeper at dusk.", seed=3, steps=8, width=640, height=640,
                     guidance_interval=None)
        records = [_generate(edge, short, whole=True).trace.graph_records]
        # >= 1600 tokens of the model's tokenizer
        records.append(_generate(edge, dict(short, prompt=long_prompt(edge)), whole=True).trace.graph_records)
        kept = edge.runtime.kept_steps
        step = next(iter(kept.values()))
        buffers = sum(b.numel() * b.element_size() for b in step.tower.cache.buffers)
        print(f"one kept step for both prompts: {len(kept)}; captures {records}; K/V {buffers / 2**20:.0f} MiB, "
              f"with its graph pool {step.bytes / 2**20:.0f} MiB; capacity {step.tower.cache.layout.kv_len_limit} keys")
        assert len(kept) == 1 and records == [1, 0], "the long caption replayed the short prompt's step"
        assert step.tower.cache.layout.kv_len_limit >= step.layout.gen_len + whole_step.KEPT_PROMPT_TOKENS
        assert step.bytes > buffers, "the graph pool's memory is counted"
    finally:
        edge.runtime.kept_steps.clear()
        edge.runtime.kept_steps.update(saved)


def test_a_real_out_of_memory_in_a_capture_gives_the_kept_steps_back_and_the_retry_is_exact(edge, monkeypatch):
    """A capture that really runs out of GPU memory (an impossible allocation inside it, after the step's
    kernels were recorded) reaches `generate`'s retry: every kept step is given back, the device is left
    usable, and the request runs once more with the seed it drew, to the frames a clean run gives."""
    from engine.pipeline import run, whole_step

    saved = dict(edge.runtime.kept_steps)
    edge.runtime.kept_steps.clear()
    try:
        request = dict(mode="t2i", prompt="A lighthouse keeper at dusk.", seed=-1, steps=6, width=480, height=480,
                       guidance_interval=[400, 1000])
        seeds = []
        original_seed = run.resolve_seed
        monkeypatch.setattr(run, "resolve_seed", lambda seed: seeds.append(original_seed(seed)) or seeds[-1])
        _generate(edge, dict(request, width=640, height=640), whole=True)  # a kept step to give back
        assert edge.runtime.kept_steps
        original = whole_step.capture_graph
        failures = []

        def capture_that_runs_out_once(record, pool=None):
            def run_then_exhaust():
                out = record()
                if not failures:
                    failures.append(1)
                    torch.empty(1 << 46, dtype=torch.uint8, device="cuda")  # 64 TiB: no GPU has it
                return out
            return original(run_then_exhaust, pool=pool)

        monkeypatch.setattr(whole_step, "capture_graph", capture_that_runs_out_once)
        retried = _generate(edge, request, whole=True)
        assert failures == [1], "the capture ran out of memory once"
        assert len(edge.runtime.kept_steps) == 1, "the 640x640 step was given back; the retry's is kept"
        assert len(seeds) == 2, "the retried request drew its seed once, for both attempts"
        monkeypatch.setattr(whole_step, "capture_graph", original)
        whole_step.release_kept_steps()
        clean = _generate(edge, dict(request, seed=seeds[-1]), whole=True)
        diff = np.abs(retried.frames.astype(int) - clean.frames.astype(int)).max()
        print(f"out of memory in a capture, retried: max uint8 diff against a clean run {diff}")
        assert diff == 0
    finally:
        edge.runtime.kept_steps.clear()
        edge.runtime.kept_steps.update(saved)


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
    import dataclasses

    from cosmos3_kernels import autotune, prefix_attention as pa
    from engine.pipeline import fast_path

    missing = pa.flash4_unsupported(torch.empty(1, 1, 1, 128, dtype=torch.bfloat16, device="cuda"))
    if missing is not None:
        pytest.skip(f"flash-attn-4: {missing}")
    measure = autotune.Autotuner.measure

    def prefer_flash4(self, candidates, **kwargs):  # the attention's flash-attn-4 configs alone, where one runs
        if "flash4" in candidates:
            alone = measure(self, {"flash4": candidates["flash4"]}, **kwargs)
            if alone.backend == "flash4":
                return dataclasses.replace(alone, reason="test: flash-attn-4 preferred")
        return measure(self, candidates, **kwargs)

    monkeypatch.setattr(autotune.Autotuner, "measure", prefer_flash4)
    # Measured afresh: decisions an earlier test stored on disk for these shapes would skip `measure`.
    monkeypatch.setattr(fast_path, "open_store", lambda *args, **kwargs: None)
    saved = {name: edge.runtime.dispatchers.pop(name) for name in ("auto",) if name in edge.runtime.dispatchers}
    saved_steps = dict(edge.runtime.kept_steps)
    edge.runtime.kept_steps.clear()
    try:
        request = dict(mode="t2i", prompt="A lighthouse keeper at dusk. " * 40, negative_prompt="blurry, low quality",
                       seed=5, steps=16, width=640, height=640, guidance_interval=[400, 1000])
        eager = _generate(edge, request, whole=False)
        paths = {d.backend for key, d in edge.runtime.dispatchers["auto"].decisions().items() if key[0] == "prefix_attention"}
        assert paths == {"flash4"}, paths
        graphed = _generate(edge, request, whole=True, lengths_on_device=False)
        step = next(iter(edge.runtime.kept_steps.values()))
        assert step.use_graphs and step.captured_counts == {1, 2}, "both branch counts captured"
        diff = np.abs(graphed.frames.astype(int) - eager.frames.astype(int)).max()
        print(f"whole-step graphs with flash-attn-4 vs eager fast loop: max uint8 diff {diff}")
        assert diff == 0
        # With the lengths on the device (capacity rows; cu_seqlens rewritten per prompt, max_seqlen_k the
        # bound): flash-attn-4 in a kept step at a new prompt length equals a fresh capture at that length.
        edge.runtime.kept_steps.clear()
        _generate(edge, request, whole=True)
        second = dict(request, prompt="A lighthouse keeper at dusk. " * 43, seed=6)
        replayed = _generate(edge, second, whole=True)
        assert len(edge.runtime.kept_steps) == 1
        edge.runtime.kept_steps.clear()
        fresh = _generate(edge, second, whole=True)
        paths = {d.backend for key, d in edge.runtime.dispatchers["auto"].decisions().items()
                 if key[0] == "prefix_attention" and key[-1]}
        assert paths == {"flash4"}, paths
        diff = np.abs(replayed.frames.astype(int) - fresh.frames.astype(int)).max()
        print(f"flash-attn-4, lengths on the device: kept step at a new length vs a fresh capture: max diff {diff}")
        assert diff == 0
    finally:
        edge.runtime.dispatchers.pop("auto", None)
        edge.runtime.dispatchers.update(saved)
        edge.runtime.kept_steps.clear()
        edge.runtime.kept_steps.update(saved_steps)


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
