"""Hugging Face ZeroGPU: detection, and the `spaces.GPU` wrapper sized from the request.

The `spaces` package imports gradio, so this lives in the UI layer (the engine never imports
gradio); app.py hands the wrapped `JobQueue.run` to the queue (`JobQueue.use_gpu_call`). Elsewhere,
and when `spaces` is not installed, `gpu_wrapper` returns the function as it is. See
docs/HOSTING.md for what is and is not verified.
"""
from __future__ import annotations

import importlib.util
import math
from typing import Any, Callable, Mapping

# A reservation covers loading onto the GPU, the estimate's error, and decoding on a slower slice.
DURATION_MARGIN = 1.5
DURATION_EXTRA_S = 15.0
DURATION_MIN_S = 30
DURATION_MAX_S = 600


def zero_gpu_requested(environ: Mapping[str, str]) -> bool:
    """What the Space says: SPACES_ZERO_GPU=true (or 1) on a ZeroGPU Space (`environ`: app.py passes the value
    `engine.config.HostConfig.zero_gpu` read)."""
    value = environ.get("SPACES_ZERO_GPU", "")
    return value.strip().lower() in ("1", "t", "true")


def spaces_installed() -> bool:
    return importlib.util.find_spec("spaces") is not None


def on_zero_gpu(environ: Mapping[str, str]) -> bool:
    return zero_gpu_requested(environ) and spaces_installed()


def request_seconds(registry, model_name: str, request: dict) -> int:
    """Seconds to reserve for one request: the measured-step estimate with a margin, clamped."""
    from engine.pipeline.request import validate_request
    from engine.serving.estimates import estimate_seconds

    info = registry.info(model_name)
    validated = validate_request(info, request["mode"], request)
    seconds = estimate_seconds(info, validated) * DURATION_MARGIN + DURATION_EXTRA_S
    return int(min(DURATION_MAX_S, max(DURATION_MIN_S, math.ceil(seconds))))


def job_duration(registry) -> Callable[..., int]:
    """The `duration=` callable for a GPU function called as fn(model_name, request, ...)."""
    def duration(model_name: str, request: dict, *args: Any, **kwargs: Any) -> int:
        return request_seconds(registry, model_name, request)

    return duration


def gpu_wrapper(fn: Callable, duration: Callable[..., int], environ: Mapping[str, str]) -> Callable:
    """`spaces.GPU(duration=duration)(fn)` on ZeroGPU; `fn` itself anywhere else."""
    if not on_zero_gpu(environ):
        return fn
    try:
        import spaces
    except Exception as exc:  # noqa: BLE001 - e.g. spaces 0.51.3's ZeroGPU support on a CPU-only torch
        raise ValueError(
            f"SPACES_ZERO_GPU is set, but the 'spaces' package cannot load its ZeroGPU support here "
            f"({type(exc).__name__}: {exc}). ZeroGPU needs a CUDA build of torch and the Space's device API "
            "(SPACES_ZERO_DEVICE_API_URL); unset SPACES_ZERO_GPU to run without it.") from exc
    return spaces.GPU(duration=duration)(fn)
