"""Cosmos3 Studio's inference engine. It never imports gradio.

Three floors, each importing only the ones below it:
- `engine.model`: what a checkpoint is (inspection, the variant table and limits, the action tables,
  loading, the tiny checkpoints);
- `engine.pipeline`: one request run on one loaded model (validation, captions, prompts, media, the
  transformer and its fast path, the denoising loop, saving the outputs);
- `engine.serving`: many requests over time (the job queue, the model registry, typed events, batches,
  time estimates).

The light parts (tables, inspection, validation, events) import at once; the denoising stack (torch,
diffusers) is imported on first use of a name that needs it, so a UI can start in seconds. Importing it
changes nothing in the process's environment: the start-up settings are `engine.config.apply_process_environment`'s
(called by app.py, `python -m engine` and `engine.load_model`).
"""
from importlib import import_module

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
