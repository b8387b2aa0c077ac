"""The kept whole steps (engine.pipeline.whole_step): which are kept, how many, how much memory across all
loaded models, and what an out-of-memory error does to them. The graphs themselves are GPU-only
(tests/gpu/test_gpu_whole_step.py); the bookkeeping is plain Python and runs here."""
import gc
import weakref

import pytest
import torch

from engine.model.runtime import ModelRuntime
from engine.pipeline import run, whole_step


class _Model:
    """What the bookkeeping reads of a loaded model: its `runtime` (and, for `generate`, `info`)."""

    def __init__(self, **steps):
        self.runtime = ModelRuntime()
        self.info = None
        for key, size in steps.items():
            whole_step._lookup(self, key, lambda size=size: _Step(size))


class _Step:
    def __init__(self, size):
        self.bytes = size
        self.last_use = -1


@pytest.fixture(autouse=True)
def _no_holders():
    whole_step.release_kept_steps()
    yield
    whole_step.release_kept_steps()


def test_only_image_scale_steps_are_kept():
    assert whole_step.keeps(1024, 2)  # Nano 1024x1024 and every other whitelisted image size, with CFG
    assert not whole_step.keeps(1984, 2)  # Edge T2V 256x256/121f: a video step, not kept
    assert not whole_step.keeps(24180, 2)


def test_a_model_keeps_a_step_for_each_of_sixteen_shapes_and_drops_the_least_recently_used():
    model = _Model()
    for i in range(whole_step.MAX_CACHED_STEPS):
        whole_step._lookup(model, f"size {i}", lambda: _Step(1))
    assert whole_step.MAX_CACHED_STEPS >= 9  # every whitelisted image size of a family survives its warm-up
    first, reused = whole_step._lookup(model, "size 0", lambda: pytest.fail("size 0 is kept"))
    assert reused
    whole_step._lookup(model, "one more", lambda: _Step(1))
    kept = model.runtime.kept_steps
    assert len(kept) == whole_step.MAX_CACHED_STEPS and "size 1" not in kept and kept["size 0"] is first
    assert list(kept)[-2:] == ["size 0", "one more"]


def test_trimming_counts_every_models_steps_drops_the_least_recent_first_and_keeps_the_newest_even_alone():
    gib = 2**30
    nano = _Model(a=4 * gib)
    edge = _Model(b=3 * gib)
    whole_step._lookup(nano, "c", lambda: _Step(2 * gib))
    assert whole_step.trim_kept_steps(9 * gib) == []
    assert whole_step.trim_kept_steps(5 * gib) == ["a"]  # nano's oldest, although edge's is smaller
    assert list(nano.runtime.kept_steps) == ["c"] and list(edge.runtime.kept_steps) == ["b"]
    assert whole_step.trim_kept_steps(1 * gib) == ["b"]
    assert list(nano.runtime.kept_steps) == ["c"]  # over the budget alone, but it was just used


def test_a_model_that_is_gone_holds_nothing():
    model = _Model(a=1)
    gone = weakref.ref(model)
    del model
    gc.collect()
    assert gone() is None and whole_step._kept() == []


class _ReplayedStep(_Step):
    """What `whole_step.denoise` drives: a sampler row per step, a timestep, replays, and the sample."""

    def __init__(self, model, size, steps=3):
        super().__init__(size)
        self.model, self.use_graphs, self.key = model, True, None
        self.sampler = type("Sampler", (), {"steps": steps, "load_row": lambda self, i: None})()
        self.timesteps, self.t = torch.linspace(1, 0, steps), torch.zeros(())
        self.sample = torch.zeros(2)
        self.replays = []

    def run(self, passes):
        self.replays.append(passes)


def _denoise_with_budget(monkeypatch, step, budget):
    monkeypatch.setattr(whole_step, "kept_steps_budget", lambda device: budget)
    return whole_step.denoise(step, [True] * step.sampler.steps, lambda done, total: None, None)


def test_a_kept_steps_denoise_trims_every_models_kept_steps_to_the_budget_after_it(monkeypatch):
    gib = 2**30
    other = _Model(old=6 * gib)
    model = _Model()
    step, _ = whole_step._lookup(model, "new", lambda: _ReplayedStep(model, 3 * gib))
    step.key = "new"
    _denoise_with_budget(monkeypatch, step, 4 * gib)
    assert step.replays == [2, 2, 2]
    assert "old" not in other.runtime.kept_steps and list(model.runtime.kept_steps) == ["new"]


def _failing_once(monkeypatch, result="done"):
    calls = []

    def fake(model, request, seed, *args):
        calls.append({"kept": whole_step._kept(), "seed": seed})
        if len(calls) == 1:
            raise torch.OutOfMemoryError("CUDA out of memory")
        return result

    monkeypatch.setattr(run, "_generate", fake)
    monkeypatch.setattr(run, "validate_request", lambda info, mode, request: request)
    monkeypatch.setattr(run, "safety_check_prompt", lambda model, prompt: None)
    return calls


def test_out_of_memory_gives_back_every_models_kept_steps_and_runs_the_request_once_more_with_its_seed(monkeypatch):
    calls = _failing_once(monkeypatch)
    model, other = _Model(), _Model(old=1)  # the other model's steps are what hold the memory
    assert run.generate(model, {"prompt": "p", "seed": -1}) == "done"
    assert len(calls) == 2 and calls[0]["kept"] and calls[1]["kept"] == []
    assert calls[0]["seed"] == calls[1]["seed"] >= 0  # a random seed is drawn once, so the retry makes the same image
    assert not other.runtime.kept_steps


def test_a_retry_tells_the_progress_listener_why_it_starts_again(monkeypatch):
    pytest.importorskip("gradio")  # the UI package; a GPU box that runs the whole suite may lack it
    from cosmos3_ui.service import JobStatus
    from engine.events import Progress

    calls = _failing_once(monkeypatch)
    seen = []
    run.generate(_Model(old=1), {"prompt": "p", "seed": 1}, on_progress=seen.append)
    assert len(calls) == 2 and [p.stage for p in seen] == ["retry"] and isinstance(seen[0], Progress)
    status = JobStatus(stage="retry")
    assert "ran out of memory" in status.describe() and "started again" in status.describe()


def test_out_of_memory_with_nothing_kept_fails_as_before(monkeypatch):
    calls = _failing_once(monkeypatch)
    with pytest.raises(torch.OutOfMemoryError):
        run.generate(_Model(), {"prompt": "p", "seed": 1})
    assert len(calls) == 1


def test_the_retry_runs_after_the_failed_attempts_frames_are_gone(monkeypatch):
    """Inside an `except` block the traceback keeps the failed attempt's locals (its tensors) alive, so a
    retry there would find the memory still taken; it must run after the handler."""

    class Activations:
        pass

    seen = []

    def fake(model, request, *args):
        if not seen:
            held = Activations()
            seen.append(weakref.ref(held))
            raise torch.OutOfMemoryError("CUDA out of memory")
        gc.collect()
        seen.append(seen[0]() is None)
        return "done"

    monkeypatch.setattr(run, "_generate", fake)
    monkeypatch.setattr(run, "validate_request", lambda info, mode, request: request)
    monkeypatch.setattr(run, "safety_check_prompt", lambda model, prompt: None)
    assert run.generate(_Model(old=1), {"prompt": "p", "seed": 1}) == "done"
    assert seen[1] is True, "the first attempt's locals were still alive when the retry ran"


def test_a_capture_that_runs_out_of_memory_is_not_taken_for_a_capture_problem(monkeypatch):
    """`_capture` turns a failed capture into an eager step with a warning; out of memory must reach
    `generate`'s retry instead (it is a RuntimeError too)."""
    step = whole_step.WholeStep.__new__(whole_step.WholeStep)
    step.use_graphs = True
    monkeypatch.setattr(whole_step.WholeStep, "_record", lambda self, count: (_ for _ in ()).throw(
        torch.OutOfMemoryError("CUDA out of memory")))
    with pytest.raises(torch.OutOfMemoryError):
        step._capture(2)
    assert step.use_graphs
    monkeypatch.setattr(whole_step.WholeStep, "_record", lambda self, count: (_ for _ in ()).throw(
        RuntimeError("operation not permitted when stream is capturing")))
    with pytest.warns(UserWarning, match="capture failed"):
        step._capture(2)
    assert not step.use_graphs


def test_the_prefill_sizes_the_cache_for_captions_up_to_the_kept_prompt_length(tiny_family, monkeypatch):
    import engine
    from engine.pipeline import prefill

    seen = []
    original = prefill.allocate_cache
    monkeypatch.setattr(prefill, "allocate_cache", lambda *a, **kw: seen.append(kw) or original(*a, **kw))
    model = engine.load_model(tiny_family["edge"], device="cpu")
    run.generate(model, dict(mode="t2i", prompt="a lighthouse", seed=1, steps=2))
    assert seen and seen[0]["prompt_room"] == whole_step.KEPT_PROMPT_TOKENS


def test_both_warm_prompts_fit_a_kept_steps_text_room_with_the_offline_tokenizer():
    """So a warm-up keeps one step per size, not one per prompt (with Cosmos3's own tokenizers they are
    shorter still)."""
    from engine.model.tiny import build_tokenizer
    from engine.serving.warmup import WARM_PROMPTS

    tokenizer = build_tokenizer()
    longest = max(len(tokenizer(prompt)["input_ids"]) for prompt in WARM_PROMPTS)
    assert 1000 < longest <= whole_step.KEPT_PROMPT_TOKENS - 256  # room for the chat template around it
