"""Cosmos3 Studio's inference engine. It never imports gradio.

Three floors, each importing only the ones below it:
- `engine.model`: what a checkpoint is (inspection, the variant table and limits, the action tables,
  loading, the tiny checkpoints);
- `engine.pipeline`: one request run on one loaded model (validation, captions, prompts, media, the
  transformer and its fast path, the denoising loop, saving the outputs);
- `engine.serving`: many requests over time (the job queue, the model registry, typed events, batches,
  time estimates).

The light parts (tables, inspection, validation, events) import at once; the denoising stack (torch,
diffusers) is imported on first use of a name that needs it, so a UI can start in seconds.
"""
import os
from importlib import import_module

# MSLK (optional, the FP8 mode's activation quantiser, `engine.pipeline.fp8.QUANTISERS`) is used for its Triton
# kernel only. Its native library, which `import mslk` loads and torchao imports whenever MSLK is installed, is
# built for one torch release; where it does not match (torch 2.11 on the H200 host with mslk-cuda 1.1.0), that
# import fails and takes torchao's float8 with it. Python-only mode skips it; it must be set before anything
# imports torchao, hence here.
os.environ.setdefault("MSLK_PYTHON_ONLY", "1")

from .model.action import ACTION_DOMAINS, ACTION_KINDS, RESOLUTION_TIERS, VIEW_POINTS
from .model.defaults import FAMILY_TABLE, Limits, sampling_defaults, sampling_limits
from .model.variants import ALL_MODES, REQUEST_MODES, CheckpointError, VariantInfo, inspect_checkpoint
from .pipeline.prompts import preview_prompt_texts
from .pipeline.request import Request, RequestError, validate_request
from .events import JobCancelled
from .serving.registry import ModelEntry, ModelRegistry

_LAZY = {
    "LoadedModel": "model.loader", "load_model": "parallel.load", "resolve_source": "model.loader",
    "GenerationResult": "pipeline.run", "generate": "pipeline.run",
    "JobFailed": "serving.queue", "JobHandle": "serving.queue", "JobQueue": "serving.queue",
    "QueueFull": "serving.queue", "load_actions_file": "pipeline.media",
    "reason": "reasoner.run", "ReasonResult": "reasoner.run", "validate_reason_request": "reasoner.request",
}


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "ACTION_DOMAINS", "ACTION_KINDS", "ALL_MODES", "FAMILY_TABLE", "Limits", "REQUEST_MODES", "RESOLUTION_TIERS", "Request", "RequestError",
    "VIEW_POINTS", "CheckpointError", "JobCancelled", "ModelEntry", "ModelRegistry", "VariantInfo",
    "inspect_checkpoint", "preview_prompt_texts", "sampling_defaults", "sampling_limits", "validate_request", *_LAZY,
]
