"""At most one denoising step queued ahead of the GPU, so cancel and progress follow the GPU, not the host.

Kernel launches return at once, so a loop with no host sync runs ahead of the GPU: on a long step
(Edge T2V 480p, ~220 ms) the host can queue most of a request's steps before the GPU has finished the
first. A cancel then stops only the host, and the GPU still works through every queued step; progress
reports steps the GPU has not run. (The whole-step loop has always paced itself so; the eager loop, which
runs Edge T2V 480p and every sound or action request, did not.)

The pacer records an event after each step and waits for the previous step's event before the next
one is queued: the GPU always has one step in hand (no idle gap between steps), and at most one step's
work is left when a cancel arrives. On the CPU every step completes as it is called.
"""
from __future__ import annotations

from typing import Callable

import torch


class StepPacer:
    """Call `launched(i)` after step i's work is queued and `finish()` after the loop; `report(step, total)`
    is called once per step, when that step has finished on the device."""

    def __init__(self, on_gpu: bool, report: Callable[[int, int], None], total: int,
                 new_event: Callable[[], object] | None = None) -> None:
        self.on_gpu = on_gpu
        self.report = report
        self.total = total
        self._new_event = new_event or torch.cuda.Event
        self._previous = None
        self._previous_step = -1  # the step whose event `_previous` is
        self.syncs = 0  # waits of the host on the device (the run's trace: `RunTrace.host_syncs`)

    @classmethod
    def for_tensor(cls, sample: torch.Tensor, report: Callable[[int, int], None], total: int) -> "StepPacer":
        return cls(sample.is_cuda, report, total)

    def launched(self, i: int) -> None:
        if not self.on_gpu:
            self.report(i + 1, self.total)
            return
        event = self._new_event()
        event.record()
        self.settle()  # step i-1 is done; step i stays queued, so the GPU never idles
        self._previous, self._previous_step = event, i

    def settle(self) -> None:
        """Wait for the last step queued and report it now. The eager loop calls it before a preview,
        which waits for the device anyway, so the steps before the preview are reported before it, as
        they were before pacing."""
        if self._previous is not None:
            self._previous.synchronize()
            self.syncs += 1
            self._previous = None
            self.report(self._previous_step + 1, self.total)

    def finish(self) -> None:
        self.settle()
