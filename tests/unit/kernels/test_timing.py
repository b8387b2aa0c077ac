"""cosmos3_kernels.timing, the one timing helper (CPU: the wall clock; the same sample bookkeeping as on CUDA; CUDA: events,
and graph replays)."""
import logging

import pytest
import torch

from cosmos3_kernels.timing import Timing, time_ms

gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def test_warmup_samples_inner_calls_and_the_hook_are_counted():
    calls, hooks = [], []
    timing = time_ms(lambda: calls.append(1), warmup=2, iters=4, inner=3, before=lambda: hooks.append(1))
    assert len(calls) == 2 + 4 * 3 and len(hooks) == 4
    assert len(timing.samples_ms) == 4 and all(ms >= 0 for ms in timing.samples_ms)


def test_auto_inner_batches_a_fast_call():
    calls = []
    time_ms(lambda: calls.append(1), warmup=0, iters=2, inner="auto")
    assert len(calls) > 1 + 2  # the sizing call, then more than one call per sample


def test_summary_and_quantiles_read_the_same_samples():
    timing = Timing((4.0, 1.0, 3.0, 2.0, 10.0))
    assert timing.summary() == {"median_ms": 3.0, "min_ms": 1.0, "max_ms": 10.0, "n": 5}
    assert (timing.quantile(0.1), timing.quantile(0.9)) == (1.0, 10.0)
    assert timing.fmt() == "3.000 (1.000-10.000)"


@pytest.mark.skipif(torch.cuda.is_available(), reason="CPU rule")
def test_graphed_timing_on_a_cpu_times_the_calls_themselves():
    calls = []
    timing = time_ms(lambda: calls.append(1), warmup=1, iters=3, inner=2, graphed=True)
    assert len(calls) == 1 + 3 * 2 and len(timing.samples_ms) == 3


@gpu
def test_graphed_timing_replays_a_graph_of_the_calls():
    counter = torch.zeros((), device="cuda")
    python_calls = []

    def step():
        python_calls.append(1)
        counter.add_(1)

    timing = time_ms(step, warmup=1, iters=3, inner=2, graphed=True)
    torch.cuda.synchronize()
    # Python ran the warm-up and the two captured calls; the GPU ran the warm-up and three replays of two.
    assert len(python_calls) == 1 + 2
    assert counter.item() == 1 + 3 * 2
    assert len(timing.samples_ms) == 3 and all(ms > 0 for ms in timing.samples_ms)


@gpu
def test_a_call_that_cannot_be_captured_is_timed_eagerly(caplog):
    counter = torch.zeros((), device="cuda")

    def step():
        counter.add_(1)
        torch.cuda.synchronize()  # not allowed while a stream is capturing

    with caplog.at_level(logging.WARNING, logger="cosmos3_kernels.timing"):
        timing = time_ms(step, warmup=0, iters=2, inner=1, graphed=True)
    assert "could not be captured" in caplog.text
    assert len(timing.samples_ms) == 2
    counter.add_(1)  # the device is still usable after the failed capture
    torch.cuda.synchronize()
    assert counter.item() == 3  # the two eager samples and this call; the captured call never ran
