"""How long a request should take on one H200, from the measured step times in docs/PERFORMANCE.md.

Used to size a ZeroGPU reservation (`@spaces.GPU(duration=...)`) and to give a first ETA before the
queue has timed any job. Between measured points the step time is interpolated in log-log space over
gen tokens, which follows the attention-dominated growth of long videos and the flat launch-bound T2I end.
"""
from __future__ import annotations

import math

from ..model.variants import VariantInfo

# (gen tokens, seconds per step with both CFG branches), engine fast path, H200, 2026-11-29.
_STEP_SECONDS = {
    "nano": ((1024, 0.058), (12090, 0.92), (44160, 6.30)),
    "edge": ((400, 0.012), (12090, 0.265)),
}
# Super has ~4x Nano's parameters; until it is measured, scale Nano's steps by its FLOP ratio.
_SUPER_SCALE = 4.3
_DECODE_SECONDS = ((1024, 0.07), (12090, 2.75), (44160, 9.5))  # Wan2.2 decode by gen-token count
_FIXED_SECONDS = 3.0  # prompt, prefill, saving


def _interpolate(points, x: float) -> float:
    if x <= points[0][0]:
        return points[0][1] * x / points[0][0] if len(points) > 1 and x > 0 else points[0][1]
    for (x0, y0), (x1, y1) in zip(points, points[1:]):
        if x <= x1:
            t = (math.log(x) - math.log(x0)) / (math.log(x1) - math.log(x0))
            return math.exp(math.log(y0) + t * (math.log(y1) - math.log(y0)))
    (x0, y0), (x1, y1) = points[-2], points[-1]
    slope = (math.log(y1) - math.log(y0)) / (math.log(x1) - math.log(x0))
    return y1 * (x / x1) ** slope


def gen_tokens(width: int, height: int, num_frames: int) -> int:
    latent_frames = (num_frames - 1) // 4 + 1
    return latent_frames * math.ceil(height / 32) * math.ceil(width / 32)


def estimate_seconds(info: VariantInfo, request: dict) -> float:
    """Expected seconds for a validated request (width/height/num_frames/steps/guidance filled in)."""
    tokens = gen_tokens(request["width"], request["height"], request["num_frames"])
    family = info.family if info.family in _STEP_SECONDS else "nano"
    per_step = _interpolate(_STEP_SECONDS[family], tokens)
    if info.family == "super":
        per_step *= _SUPER_SCALE
    if request.get("guidance_scale", 1.0) == 1.0:
        per_step /= 2  # one branch
    return _FIXED_SECONDS + request["steps"] * per_step + _interpolate(_DECODE_SECONDS, tokens)
