"""Cosmos3 Studio's inference engine: checkpoint inspection, defaults and validation, loading,
the denoising loop and the job queue. It never imports gradio."""
from .action import ACTION_DOMAINS, ACTION_KINDS, RESOLUTION_TIERS, VIEW_POINTS
from .defaults import FAMILY_TABLE, sampling_defaults, validate_request
from .loader import LoadedModel, load_model, resolve_source
from .pipeline import GenerationResult, JobCancelled, generate
from .prompts import preview_prompt_texts
from .queue import JobFailed, JobHandle, JobQueue, QueueFull
from .registry import ModelEntry, ModelRegistry
from .media import load_actions_file
from .variants import ALL_MODES, REQUEST_MODES, CheckpointError, VariantInfo, inspect_checkpoint

__all__ = [
    "ACTION_DOMAINS", "ACTION_KINDS", "ALL_MODES", "FAMILY_TABLE", "REQUEST_MODES", "RESOLUTION_TIERS",
    "VIEW_POINTS", "CheckpointError", "LoadedModel", "VariantInfo", "inspect_checkpoint", "load_model",
    "resolve_source", "sampling_defaults", "validate_request", "GenerationResult", "JobCancelled", "generate",
    "preview_prompt_texts", "JobFailed", "JobHandle", "JobQueue", "QueueFull", "ModelEntry", "ModelRegistry",
    "load_actions_file",
]
