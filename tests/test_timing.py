"""kernels.timing, the one timing helper (CPU: the wall clock; the same sample bookkeeping as on CUDA)."""
from kernels.timing import Timing, time_ms


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
