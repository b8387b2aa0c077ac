"""Live previews while denoising: every few steps, a cheap look at the current clean-sample estimate.

The estimate is x0 = x_t - sigma_t * v (flow matching: x_t = (1 - sigma) x0 + sigma noise, v = noise - x0),
which the sampler computes anyway. It is made visible cheaply: the latent is average-pooled 2x (a
quarter of the pixels), and only a few latent frames are decoded, each on its own (first, middle and
last for a video, side by side as a strip). Nothing here touches the request's result: the estimate is
a copy, and the VAE's causal cache is cleared around each decode. Previews are off unless asked for.

Their cost is bounded by measurement, on any GPU: after the first, a planned preview is shown only while
the previews so far plus one more (priced at the last one's measured time) stay within `PREVIEW_BUDGET`
of the denoising time so far. On the H200, Edge T2I 640x640 steps take 10.7 ms and a preview 14 ms, so
three previews would cost 7.8% of the run; the budget keeps one (docs/perf-log/2026-12-02.md, live preview).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F

from ..events import Preview

PREVIEWS_PER_RUN = 3  # at most this many previews, at 1/4, 2/4 and 3/4 of the steps (the end is the result)
STRIP_FRAMES = 3  # latent frames a video preview shows
PREVIEW_BUDGET = 0.05  # previews may cost at most this share of the denoising time so far (the first is always shown)


def preview_steps(total: int, per_run: int = PREVIEWS_PER_RUN) -> frozenset[int]:
    """The (1-based) steps after which a preview is sent: evenly spread, never the last one."""
    planned = {k * total // (per_run + 1) for k in range(1, per_run + 1)}
    return frozenset(step for step in planned if 0 < step < total)


def _frame_indices(frames: int) -> list[int]:
    if frames <= STRIP_FRAMES:
        return list(range(frames))
    return sorted({0, frames // 2, frames - 1})


@torch.no_grad()
def preview_image(vae, x0: torch.Tensor) -> np.ndarray:
    """uint8 [H, W, 3]: the x0 latent [1, C, T, h, w] (normalised, as the sampler holds it) decoded at
    half resolution; several latent frames side by side."""
    if x0.dim() == 4:  # the eager loop holds [C, T, h, w]
        x0 = x0.unsqueeze(0)
    mean = torch.tensor(vae.config.latents_mean, dtype=torch.float32, device=x0.device).view(1, -1, 1, 1, 1)
    std = torch.tensor(vae.config.latents_std, dtype=torch.float32, device=x0.device).view(1, -1, 1, 1, 1)
    z = x0.float() * std + mean
    if min(z.shape[-2:]) >= 8:
        b, c, t, h, w = z.shape
        z = F.avg_pool2d(z.permute(0, 2, 1, 3, 4).reshape(b * t, c, h, w), 2)
        z = z.reshape(b, t, c, h // 2, w // 2).permute(0, 2, 1, 3, 4)
    tiles = []
    for index in _frame_indices(z.shape[2]):
        frame = vae.decode(z[:, :, index:index + 1].to(vae.dtype)).sample[0, :, 0]  # [3, H, W] in [-1, 1]
        tiles.append(((frame.float().clamp(-1, 1) + 1.0) * 127.5).round().to(torch.uint8).permute(1, 2, 0))
    return torch.cat(tiles, dim=1).cpu().numpy()


@dataclass
class Previewer:
    """Sends `Preview` events at the planned steps through `emit` (the job's event stream), within budget."""

    vae: object
    total: int
    emit: Callable[[Preview], None]
    budget: float | None = None  # None: PREVIEW_BUDGET
    clock: Callable[[], float] = field(default=time.perf_counter, repr=False)

    def __post_init__(self):
        self.steps = preview_steps(self.total)
        self.budget = PREVIEW_BUDGET if self.budget is None else self.budget
        self.started = self.clock()
        self.spent = 0.0  # seconds spent on previews so far
        self.last = 0.0  # the last preview's seconds: the price of the next one
        self.skipped: list[int] = []

    def due(self, step: int) -> bool:
        if step not in self.steps:
            return False
        if self.spent + self.last <= self.budget * (self.clock() - self.started - self.spent):
            return True
        self.skipped.append(step)
        return False

    def show(self, step: int, x0: torch.Tensor) -> None:
        if x0.device.type == "cuda":
            # The steps still queued are the denoiser's time; the preview's own time starts after them
            # (its copy to the host would wait for them anyway, so this adds no wait).
            torch.cuda.synchronize(x0.device)
        begin = self.clock()
        image = preview_image(self.vae, x0)
        self.last = self.clock() - begin
        self.spent += self.last
        self.emit(Preview(step=step, total=self.total, image=image))


def previewer(model, steps: int, emit, enabled: bool) -> Previewer | None:
    """A previewer for one request, or None when previews are off or nobody listens."""
    if not enabled or emit is None or steps < 2:
        return None
    return Previewer(model.vae, steps, emit)
