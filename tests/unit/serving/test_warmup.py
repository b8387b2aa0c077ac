"""Warm-up by default, in the background: which modes each family warms, COSMOS3_WARMUP, and how the job
queue's single worker runs warm requests only while no user job waits (engine.serving.warmup).

No GPU work runs here: the queue loads stand-in models (the tiny checkpoints' own VariantInfo, no
weights) and `generate` is replaced by `FakeGpu`, which records every call in order, can hold warm
requests until the test lets them through, and honours the cancel event the way `generate` does.
"""
from __future__ import annotations

import logging
import threading
import time
from types import SimpleNamespace

import pytest

from engine.config import build_config
from engine.model.variants import VariantInfo, inspect_checkpoint
from engine.pipeline import run as pipeline_run
from engine.serving import queue as job_queue
from engine.serving import warmup
from engine.events import Finished, JobCancelled
from engine.serving.registry import ModelEntry, ModelRegistry


# -- the family table and COSMOS3_WARMUP -----------------------------------------------------------

def test_each_family_warms_the_modes_whose_cold_first_request_exceeds_1_5x_warm():
    assert warmup.modes_for("edge", None) == ("t2i", "t2v")  # T2I 10.6x, T2V 1.88x
    assert warmup.modes_for("nano", None) == ("t2i",)  # T2I 2.5x; T2V 1.03x and minutes to warm
    assert warmup.modes_for("super", None) == ("t2i",)
    assert warmup.modes_for("custom", None) == ()  # nothing measured, nothing warmed
    assert warmup.modes_for("nano", ("t2v",)) == ("t2v",)  # what the variable names wins
    assert warmup.modes_for("edge", ()) == ()


def test_a_released_edge_warms_36_short_runs_and_nano_12():
    """The counts docs/HOSTING.md quotes: every whitelisted size of the default modes, two prompt lengths each."""
    from engine.model.variants import VariantInfo

    counts = {family: len(warmup.warm_requests(VariantInfo.released(family), warmup.modes_for(family, None)))
              for family in ("edge", "nano")}
    assert counts == {"edge": 36, "nano": 12}


@pytest.mark.parametrize("value, modes", [
    (None, None),  # unset: each family's default
    ("t2i,t2v", ("t2i", "t2v")),
    (" T2V , t2i,t2v, ", ("t2v", "t2i")),
    ("t2i", ("t2i",)),
    ("off", ()), ("OFF", ()), ("none", ()), ("0", ()), ("", ()), ("  ", ()),
])
def test_cosmos3_warmup_names_the_modes_or_turns_warm_up_off(value, modes):
    environ = {} if value is None else {"COSMOS3_WARMUP": value}
    assert build_config(environ).warmup.modes == modes


def test_an_unknown_mode_in_cosmos3_warmup_says_what_was_received_and_what_is_allowed(monkeypatch, tmp_path):
    with pytest.raises(ValueError) as info:
        build_config({"COSMOS3_WARMUP": "t2i,i2v"})
    message = str(info.value)
    assert "COSMOS3_WARMUP='t2i,i2v'" in message and "'i2v'" in message
    assert "t2i, t2v" in message and "'off'" in message
    # The queue reads it when it is built, so a typo stops the start instead of failing a user's job.
    monkeypatch.setenv("COSMOS3_WARMUP", "yes")
    with pytest.raises(ValueError, match="COSMOS3_WARMUP='yes'"):
        job_queue.JobQueue(ModelRegistry([]), tmp_path / "out", memory_budget_bytes=2**30)


# -- the queue -------------------------------------------------------------------------------------

class FakeGpu:
    """`generate` for the queue's worker: records "user <family> <prompt>" and "warm <family> <mode>
    <WxH> <prompt chars>" (prefixed "cancelled " or "failed " when it ends so). While `hold()` is in
    force a warm request waits for a `release`, stopping with JobCancelled if its cancel event is set."""

    def __init__(self):
        self.calls: list[str] = []
        self.warm_started = threading.Event()
        self.fail_warm = False
        self.on_user = lambda: None  # called inside each user request, while the worker is busy with it
        self._permits: threading.Semaphore | None = None

    def hold(self) -> None:
        self._permits = threading.Semaphore(0)

    def release(self, count: int | None = None) -> None:
        if count is None:
            permits, self._permits = self._permits, None
            if permits is not None:
                permits.release(1000)  # a warm request already waiting goes on
        else:
            self._permits.release(count)

    def generate(self, model, request, on_progress=None, cancel=None, **kwargs):
        family, prompt = model.info.family, request["prompt"]
        if prompt not in warmup.WARM_PROMPTS:
            self.calls.append(f"user {family} {prompt}")
            self.on_user()
            return f"result of {prompt}"
        name = f"warm {family} {request['mode']} {request['width']}x{request['height']} {len(prompt)}"
        self.warm_started.set()
        deadline = time.monotonic() + 10
        while (permits := self._permits) is not None and not permits.acquire(timeout=0.002):
            if cancel is not None and cancel.is_set():
                self.calls.append(f"cancelled {name}")
                raise JobCancelled()
            assert time.monotonic() < deadline, f"{name} was held for 10 s"
        if self.fail_warm:
            self.calls.append(f"failed {name}")
            raise RuntimeError("an illegal memory access was encountered")
        self.calls.append(name)
        return None

    def warm_calls(self, family: str | None = None) -> list[str]:
        return [c for c in self.calls if c.startswith("warm") and (family is None or f" {family} " in c)]


def _until(predicate, timeout: float = 5.0) -> None:
    end = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < end, "timed out waiting"
        time.sleep(0.002)


def _stand_in(root):
    """A loaded model as the queue sees it: the checkpoint's facts, no weights."""
    return SimpleNamespace(info=inspect_checkpoint(root), root=root, transformer=None, vae=None,
                           sound_tokenizer=None, safety_checker=None)


@pytest.fixture
def fake_gpu(monkeypatch):
    fake = FakeGpu()
    monkeypatch.setattr(pipeline_run, "generate", fake.generate)  # the queue and warm_one import it on call
    monkeypatch.setattr(job_queue, "torch_cuda_available", lambda: True)
    monkeypatch.delenv("COSMOS3_WARMUP", raising=False)  # each family's default
    yield fake
    fake.release()


@pytest.fixture
def make_queue(tiny_family, tmp_path):
    made = []

    def make(names=("edge", "nano"), budget=2**30, loader=_stand_in):
        registry = ModelRegistry([ModelEntry(n, str(tiny_family[n])) for n in names])
        jobs = job_queue.JobQueue(registry, tmp_path / "out", memory_budget_bytes=budget, loader=loader)
        made.append(jobs)
        return jobs

    yield make
    for jobs in made:
        jobs.close(timeout=5)


def _warm_names(jobs, model_name: str, modes) -> list[str]:
    info = jobs.registry.info(model_name)
    return [f"warm {info.family} {r['mode']} {r['width']}x{r['height']} {len(r['prompt'])}"
            for r in warmup.warm_requests(info, modes)]


def _job(jobs, model="edge", prompt="a boat"):
    return jobs.submit(model, dict(mode="t2i", prompt=prompt, steps=1))


def test_the_job_that_loads_a_model_does_not_wait_for_its_warm_up(fake_gpu, make_queue):
    jobs = make_queue()
    fake_gpu.hold()  # no warm request can finish until the test says so
    assert _job(jobs).result(timeout=5) == "result of a boat"
    expected = _warm_names(jobs, "edge", ("t2i", "t2v"))  # Edge's default: both modes, every size
    assert fake_gpu.calls == ["user edge a boat"]
    assert jobs.state()["warming"] == {"edge": {"done": 0, "total": len(expected)}}
    fake_gpu.release()
    _until(lambda: not jobs.warming())
    assert fake_gpu.calls == ["user edge a boat", *expected]


def test_a_user_job_that_arrives_runs_before_the_remaining_warm_requests(fake_gpu, make_queue):
    jobs = make_queue()
    fake_gpu.hold()
    _job(jobs, prompt="first").result(timeout=5)
    _until(fake_gpu.warm_started.is_set)  # the first warm request is in flight, held
    # It never gets a permit: only the cancel the new job sets lets this job run.
    assert _job(jobs, prompt="second").result(timeout=5) == "result of second"
    expected = _warm_names(jobs, "edge", ("t2i", "t2v"))
    assert fake_gpu.calls == ["user edge first", f"cancelled {expected[0]}", "user edge second"]
    fake_gpu.release()
    _until(lambda: not jobs.warming())
    # The cancelled request is still cold, so it runs again first; none is lost or repeated.
    assert fake_gpu.calls[3:] == expected


def test_warm_up_waits_while_user_jobs_wait_even_when_generate_cannot_stop_midway(fake_gpu, make_queue, monkeypatch):
    jobs = make_queue()
    deaf = fake_gpu.generate
    monkeypatch.setattr(pipeline_run, "generate", lambda model, request, cancel=None, **k: deaf(model, request, **k))
    fake_gpu.hold()
    _job(jobs, prompt="first").result(timeout=5)
    _until(fake_gpu.warm_started.is_set)
    later = [_job(jobs, prompt=f"user {i}") for i in range(2)]
    fake_gpu.release(1)  # the request in flight ends; both waiting jobs go before the next one
    for handle in later:
        handle.result(timeout=5)
    expected = _warm_names(jobs, "edge", ("t2i", "t2v"))
    assert fake_gpu.calls == ["user edge first", expected[0], "user edge user 0", "user edge user 1"]
    fake_gpu.release()
    _until(lambda: not jobs.warming())
    assert fake_gpu.calls[4:] == expected[1:]


def test_the_family_default_decides_what_a_loaded_model_warms(fake_gpu, make_queue):
    jobs = make_queue()
    _job(jobs, model="nano").result(timeout=5)
    _until(lambda: not jobs.warming())
    assert fake_gpu.warm_calls() == _warm_names(jobs, "nano", ("t2i",))  # Nano: images only
    assert all(" t2i " in call for call in fake_gpu.warm_calls())


def test_cosmos3_warmup_off_and_an_explicit_list_override_the_default(fake_gpu, make_queue, monkeypatch):
    monkeypatch.setenv("COSMOS3_WARMUP", "off")
    jobs = make_queue()
    _job(jobs).result(timeout=5)
    assert jobs.warming() == {} and jobs.warm_default("nano") is False
    time.sleep(0.05)
    assert fake_gpu.calls == ["user edge a boat"]
    monkeypatch.setenv("COSMOS3_WARMUP", "t2v")
    jobs = make_queue()
    _job(jobs, model="nano").result(timeout=5)
    _until(lambda: not jobs.warming())
    assert fake_gpu.warm_calls() == _warm_names(jobs, "nano", ("t2v",))


def test_warm_up_never_runs_on_a_cpu_host_or_for_a_gpu_group(fake_gpu, make_queue, monkeypatch):
    monkeypatch.setenv("COSMOS3_WARMUP", "t2i,t2v")  # asked for, and still not run
    monkeypatch.setattr(job_queue, "torch_cuda_available", lambda: False)
    jobs = make_queue()
    _job(jobs).result(timeout=5)
    assert jobs.warming() == {} and jobs.warm_default("nano") is False
    monkeypatch.setattr(job_queue, "torch_cuda_available", lambda: True)
    group = make_queue(loader=lambda root: SimpleNamespace(**vars(_stand_in(root)), is_group=True,
                                                           bytes_per_gpu=0, close=lambda: None))
    _job(group).result(timeout=5)
    assert group.warming() == {}
    time.sleep(0.05)  # a warm request planned anyway would have started by now
    assert fake_gpu.calls == ["user edge a boat", "user edge a boat"]


def test_a_failing_warm_request_costs_only_warmth(fake_gpu, make_queue, caplog):
    jobs = make_queue()
    fake_gpu.fail_warm = True
    with caplog.at_level(logging.WARNING, logger="engine.serving.queue"):
        _job(jobs, prompt="first").result(timeout=5)
        _until(lambda: not jobs.warming())
    expected = _warm_names(jobs, "edge", ("t2i", "t2v"))
    assert fake_gpu.calls == ["user edge first", *(f"failed {name}" for name in expected)]  # each tried once
    assert "warm-up of model edge (t2i" in caplog.text and "illegal memory access" in caplog.text
    assert _job(jobs, prompt="after").result(timeout=5) == "result of after"  # the worker lives on


def test_evicting_a_model_drops_its_pending_warm_work(fake_gpu, make_queue):
    jobs = make_queue(budget=1)  # any switch of model evicts the other
    fake_gpu.hold()
    _job(jobs, model="edge").result(timeout=5)
    _until(fake_gpu.warm_started.is_set)
    seen = []
    fake_gpu.on_user = lambda: seen.append(jobs.warming())  # right after the switch, before any warm step runs
    _job(jobs, model="nano").result(timeout=5)
    assert jobs.loaded_models() == ["nano"]
    nano = _warm_names(jobs, "nano", ("t2i",))
    assert seen == [{"nano": {"done": 0, "total": len(nano)}}]
    fake_gpu.release()
    _until(lambda: not jobs.warming())
    assert fake_gpu.warm_calls("edge") == [] and fake_gpu.warm_calls("nano") == nano


def test_close_returns_promptly_in_the_middle_of_a_warm_up(fake_gpu, make_queue):
    jobs = make_queue()
    fake_gpu.hold()  # the request in flight would take 10 s without its cancel
    _job(jobs).result(timeout=5)
    _until(fake_gpu.warm_started.is_set)
    began = time.monotonic()
    jobs.close(timeout=5)
    assert time.monotonic() - began < 1 and not jobs._worker.is_alive()
    assert fake_gpu.calls[-1].startswith("cancelled warm edge") and not fake_gpu.warm_calls()


def test_state_counts_the_warm_requests_done_and_is_empty_after(fake_gpu, make_queue):
    jobs = make_queue()
    fake_gpu.hold()
    _job(jobs).result(timeout=5)
    total = len(_warm_names(jobs, "edge", ("t2i", "t2v")))
    fake_gpu.release(3)
    _until(lambda: jobs.state()["warming"].get("edge", {}).get("done") == 3)
    assert jobs.state()["warming"] == {"edge": {"done": 3, "total": total}}
    fake_gpu.release()
    _until(lambda: len(fake_gpu.warm_calls()) == total)
    _until(lambda: not jobs.state()["warming"])
    assert jobs.state()["warming"] == {} and jobs.loaded_models() == ["edge"]


def test_warm_default_loads_and_warms_at_start_without_a_user_job(fake_gpu, make_queue):
    jobs = make_queue()
    with pytest.raises(ValueError, match="Unknown model 'nope'"):
        jobs.warm_default("nope")
    fake_gpu.hold()
    assert jobs.warm_default("edge") is True
    _until(fake_gpu.warm_started.is_set)
    assert jobs.loaded_models() == ["edge"]
    # A user arriving meanwhile runs first, on the model the warm-up loaded.
    assert _job(jobs, prompt="early").result(timeout=5) == "result of early"
    fake_gpu.release()
    _until(lambda: not jobs.warming())
    expected = _warm_names(jobs, "edge", ("t2i", "t2v"))
    assert fake_gpu.calls == [f"cancelled {expected[0]}", "user edge early", *expected]


def test_the_queue_warms_a_tiny_model_through_the_real_generate(tiny_family, tmp_path, monkeypatch):
    """End to end on the CPU (the GPU check stubbed): the warm requests are valid requests that
    `generate` runs, and the job that loaded the model shows no warm-up stage."""
    from engine.events import Progress

    monkeypatch.setenv("COSMOS3_WARMUP", "t2i")
    monkeypatch.setattr(job_queue, "torch_cuda_available", lambda: True)
    original = warmup.warm_requests
    monkeypatch.setattr(warmup, "warm_requests", lambda info, modes: [dict(r, steps=1) for r in original(info, modes)[:2]])
    warmed = []
    real_warm_one = warmup.warm_one
    monkeypatch.setattr(warmup, "warm_one", lambda model, request, cancel=None: warmed.append(
        real_warm_one(model, request, cancel=cancel)))
    jobs = job_queue.JobQueue(ModelRegistry([ModelEntry("nano", str(tiny_family["nano"]))]), tmp_path / "out")
    try:
        events = list(_job(jobs, model="nano").events(timeout=60))
        _until(lambda: not jobs.warming(), timeout=60)
    finally:
        jobs.close()
    assert isinstance(events[-1], Finished)
    assert not [e for e in events if isinstance(e, Progress) and e.stage == "warm-up"]
    assert [(w["mode"], w["prompt_chars"]) for w in warmed] == [("t2i", len(p)) for p in warmup.WARM_PROMPTS]


def test_warming_shows_from_warm_default_on_through_the_load_and_clears_if_the_load_fails(fake_gpu, make_queue):
    """The UI polls the note only while `warming()` says something, and the page's first look is often during
    the first model's load at start: the load counts as warming (0 done) so the note shows from then."""
    loading, go_on = threading.Event(), threading.Event()

    def slow_loader(root):
        loading.set()
        assert go_on.wait(5)
        return _stand_in(root)

    jobs = make_queue(loader=slow_loader)
    fake_gpu.hold()
    assert jobs.warm_default("edge") is True
    _until(loading.is_set)
    total = len(_warm_names(jobs, "edge", ("t2i", "t2v")))
    assert jobs.warming() == {"edge": {"done": 0, "total": total}}  # still loading
    go_on.set()
    _until(fake_gpu.warm_started.is_set)
    assert jobs.warming() == {"edge": {"done": 0, "total": total}}
    fake_gpu.release()
    _until(lambda: not jobs.warming())

    def broken_loader(root):
        raise RuntimeError("checkpoint unreadable")

    broken = make_queue(loader=broken_loader)
    assert broken.warm_default("edge") is True
    _until(lambda: not broken.warming())  # a failed load leaves nothing warming (the UI stops polling)
    assert broken.loaded_models() == []


def test_a_warm_request_cancelled_before_it_starts_runs_nothing(monkeypatch):
    from engine.events import JobCancelled

    ran = []
    monkeypatch.setattr(pipeline_run, "generate", lambda *a, **k: ran.append(a))
    cancel = threading.Event()
    cancel.set()
    request = warmup.warm_requests(VariantInfo.released("edge"), ("t2i",))[0]
    with pytest.raises(JobCancelled):
        warmup.warm_one(object(), request, cancel=cancel)
    assert ran == []  # not even the prompt encoding and prefill of a cold first run
    cancel.clear()
    warmup.warm_one(object(), request, cancel=cancel)
    assert len(ran) == 1
