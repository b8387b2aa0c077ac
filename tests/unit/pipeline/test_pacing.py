"""The denoising loops keep at most one step queued ahead of the GPU (`engine.pipeline.pacing`), so a cancel
stops the GPU's work too and progress reports only steps the device has finished.

On the CPU the device is faked: events that record when they were recorded and synchronized."""
import pytest

import engine
from engine.pipeline import pacing
from engine.pipeline.fast_path import FastPathOptions
from engine.pipeline.run import generate


class FakeEvent:
    log: list

    def __init__(self):
        self.index = sum(1 for entry in self.log if entry[0] == "record")

    def record(self):
        self.log.append(("record", self.index))

    def synchronize(self):
        self.log.append(("sync", self.index))


def _pacer(total):
    log = []
    event = type("Event", (FakeEvent,), {"log": log})
    reports = []
    pacer = pacing.StepPacer(True, lambda step, n: log.append(("report", step)) or reports.append((step, n)), total,
                             new_event=event)
    return pacer, log, reports


def test_each_step_is_reported_once_the_device_has_finished_it_with_one_step_queued_ahead():
    pacer, log, reports = _pacer(3)
    pacer.launched(0)
    assert log == [("record", 0)]  # nothing waited on yet: step 0 is queued and the host goes on
    pacer.launched(1)
    assert log[1:] == [("record", 1), ("sync", 0), ("report", 1)]  # step 1 queued before waiting for step 0
    pacer.launched(2)
    assert log[4:] == [("record", 2), ("sync", 1), ("report", 2)]
    pacer.finish()
    assert log[7:] == [("sync", 2), ("report", 3)]
    assert reports == [(1, 3), (2, 3), (3, 3)]
    pacer.finish()  # idempotent: nothing left to wait for
    assert len(reports) == 3


def test_on_the_cpu_every_step_is_reported_as_it_is_called():
    reports = []
    pacer = pacing.StepPacer(False, lambda step, n: reports.append(step), 2, new_event=lambda: pytest.fail("no events"))
    pacer.launched(0)
    pacer.launched(1)
    pacer.finish()
    assert reports == [1, 2]


@pytest.fixture(scope="module")
def nano(tiny_family):
    return engine.load_model(tiny_family["nano"], device="cpu")


def _fast(whole: bool) -> FastPathOptions:
    return FastPathOptions(enabled=True, batched_cfg=True, cuda_graphs=False, kernels="torch", fused_projections=True,
                           whole_step=whole)


@pytest.mark.parametrize("whole", [False, True], ids=["eager loop", "whole-step loop"])
def test_both_denoising_loops_pace_every_step(nano, monkeypatch, whole):
    log = []
    event = type("Event", (FakeEvent,), {"log": log})
    made = []

    def gpu_pacer(sample, report, total):
        made.append(pacing.StepPacer(True, report, total, new_event=event))
        return made[-1]

    monkeypatch.setattr(pacing.StepPacer, "for_tensor", staticmethod(gpu_pacer))
    progress = []
    nano.fast_path = _fast(whole)
    try:
        result = generate(nano, dict(mode="t2i", prompt="a lighthouse at dusk", seed=1, steps=4),
                          on_progress=lambda p: progress.append(p.step) if p.stage == "denoise" else None)
    finally:
        nano.fast_path = None
    assert len(made) == 1
    records = [i for kind, i in log if kind == "record"]
    syncs = [i for kind, i in log if kind == "sync"]
    assert records == syncs == [0, 1, 2, 3]
    assert result.trace.host_syncs == len(syncs)  # the run's trace counts the host's waits on the device
    assert result.trace.whole_step == ("built" if whole else None)
    # Step i is waited for only after step i+1 is queued (never more than one step ahead, never idle).
    assert log.index(("sync", 0)) > log.index(("record", 1))
    assert log.index(("sync", 1)) < log.index(("record", 3))
    assert progress == [1, 2, 3, 4]


@pytest.mark.parametrize("whole", [False, True], ids=["eager loop", "whole-step loop"])
def test_a_preview_never_runs_ahead_of_the_progress_reported_before_it(nano, monkeypatch, whole):
    """Before pacing, the eager loop reported step k-1 before it sent the preview of step k; pacing must
    keep that (the preview waits for the device anyway, so the step before it is finished)."""
    from engine.events import Preview

    log = []
    event = type("Event", (FakeEvent,), {"log": log})
    monkeypatch.setattr(pacing.StepPacer, "for_tensor", staticmethod(
        lambda sample, report, total: pacing.StepPacer(True, report, total, new_event=event)))
    events = []
    nano.fast_path = _fast(whole)
    try:
        generate(nano, dict(mode="t2i", prompt="a lighthouse at dusk", seed=1, steps=8), previews=True,
                 on_progress=lambda e: events.append(("preview", e.step) if isinstance(e, Preview) else
                                                      ("progress", e.step) if e.stage == "denoise" else None))
    finally:
        nano.fast_path = None
    events = [e for e in events if e is not None]
    previews = [i for i, (kind, _) in enumerate(events) if kind == "preview"]
    assert previews, events  # the first planned preview is always shown
    for index in previews:
        reported = [step for kind, step in events[:index] if kind == "progress"]
        assert reported and reported[-1] >= events[index][1] - 1, events
    assert [step for kind, step in events if kind == "progress"] == list(range(1, 9))
