"""Cosmos3 Studio's inference engine: checkpoint inspection, defaults and validation, loading,
the denoising loop and the job queue. It never imports gradio.

The light parts (tables, inspection, validation, events) import at once; the denoising stack (torch,
diffusers) is imported on first use of a name that needs it, so a UI can start in seconds.
"""
from importlib import import_module

from .action import ACTION_DOMAINS, ACTION_KINDS, RESOLUTION_TIERS, VIEW_POINTS
from .defaults import FAMILY_TABLE, sampling_defaults, validate_request
from .events import JobCancelled
from .prompts import preview_prompt_texts
from .registry import ModelEntry, ModelRegistry
from .variants import ALL_MODES, REQUEST_MODES, CheckpointError, VariantInfo, inspect_checkpoint

_LAZY = {
    "LoadedModel": "loader", "load_model": "loader", "resolve_source": "loader",
    "GenerationResult": "pipeline", "generate": "pipeline",
    "JobFailed": "queue", "JobHandle": "queue", "JobQueue": "queue", "QueueFull": "queue",
    "load_actions_file": "media",
}


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "ACTION_DOMAINS", "ACTION_KINDS", "ALL_MODES", "FAMILY_TABLE", "REQUEST_MODES", "RESOLUTION_TIERS",
    "VIEW_POINTS", "CheckpointError", "JobCancelled", "ModelEntry", "ModelRegistry", "VariantInfo",
    "inspect_checkpoint", "preview_prompt_texts", "sampling_defaults", "validate_request", *_LAZY,
]
