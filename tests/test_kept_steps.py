"""The model's kept whole steps (engine.pipeline.whole_step): how many, how much memory, and what an
out-of-memory error does to them. The graphs themselves are GPU-only (tests/test_gpu_whole_step.py); the
bookkeeping is plain Python and runs here."""
from types import SimpleNamespace

import pytest
import torch

from engine.pipeline import run, whole_step


def _model(**steps):
    return SimpleNamespace(dispatchers={"whole_step": dict(steps)} if steps else {})


def test_a_model_keeps_a_step_for_each_of_sixteen_shapes_and_drops_the_least_recently_used():
    model = _model()
    built = []
    for i in range(whole_step.MAX_CACHED_STEPS):
        whole_step._lookup(model, f"size {i}", lambda: built.append(1) or object())
    assert whole_step.MAX_CACHED_STEPS >= 9  # every whitelisted image size of a family survives its warm-up
    first, reused = whole_step._lookup(model, "size 0", lambda: pytest.fail("size 0 is kept"))
    assert reused
    whole_step._lookup(model, "one more", object)
    kept = model.dispatchers["whole_step"]
    assert len(kept) == whole_step.MAX_CACHED_STEPS and "size 1" not in kept and kept["size 0"] is first
    assert list(kept)[-2:] == ["size 0", "one more"]


def test_trimming_drops_the_least_recently_used_until_the_rest_fit_and_keeps_the_newest_even_alone():
    gib = 2**30
    model = _model(a=SimpleNamespace(bytes=4 * gib), b=SimpleNamespace(bytes=3 * gib), c=SimpleNamespace(bytes=2 * gib))
    assert whole_step.trim_kept_steps(model, 9 * gib) == []
    assert whole_step.trim_kept_steps(model, 5 * gib) == ["a"]
    assert list(model.dispatchers["whole_step"]) == ["b", "c"]
    assert whole_step.trim_kept_steps(model, 1 * gib) == ["b"]
    assert list(model.dispatchers["whole_step"]) == ["c"]  # over the budget alone, but it was just used


def _failing_once(monkeypatch, result="done"):
    calls = []

    def fake(model, request, *args):
        calls.append(dict(model.dispatchers))
        if len(calls) == 1:
            raise torch.OutOfMemoryError("CUDA out of memory")
        return result

    monkeypatch.setattr(run, "_generate", fake)
    monkeypatch.setattr(run, "validate_request", lambda info, mode, request: request)
    monkeypatch.setattr(run, "safety_check_prompt", lambda model, prompt: None)
    return calls


def test_out_of_memory_gives_back_the_kept_steps_and_runs_the_request_once_more(monkeypatch):
    calls = _failing_once(monkeypatch)
    model = _model(old=SimpleNamespace(bytes=1))
    model.info = None
    assert run.generate(model, {"prompt": "p"}) == "done"
    assert len(calls) == 2 and "whole_step" in calls[0] and "whole_step" not in calls[1]


def test_out_of_memory_with_nothing_kept_fails_as_before(monkeypatch):
    calls = _failing_once(monkeypatch)
    model = _model()
    model.info = None
    with pytest.raises(torch.OutOfMemoryError):
        run.generate(model, {"prompt": "p"})
    assert len(calls) == 1


def test_the_prefill_sizes_the_cache_for_captions_up_to_the_kept_prompt_length(tiny_family, monkeypatch):
    import engine
    from engine.pipeline import prefill

    seen = []
    original = prefill.allocate_cache
    monkeypatch.setattr(prefill, "allocate_cache", lambda *a, **kw: seen.append(kw) or original(*a, **kw))
    model = engine.load_model(tiny_family["edge"], device="cpu")
    run.generate(model, dict(mode="t2i", prompt="a lighthouse", seed=1, steps=2))
    assert seen and seen[0]["prompt_room"] == whole_step.KEPT_PROMPT_TOKENS


def test_the_retry_runs_after_the_failed_attempts_frames_are_gone(monkeypatch):
    """Inside an `except` block the traceback keeps the failed attempt's locals (its tensors) alive, so a
    retry there would find the memory still taken; it must run after the handler."""
    import gc
    import weakref

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
    model = _model(old=SimpleNamespace(bytes=1))
    model.info = None
    assert run.generate(model, {"prompt": "p"}) == "done"
    assert seen[1] is True, "the first attempt's locals were still alive when the retry ran"
