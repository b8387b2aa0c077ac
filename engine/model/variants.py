"""What a checkpoint is: family, Edge, distilled, supported modes.

Everything here is read from the checkpoint's own config files, never from its name or its
weights, and read once per checkpoint folder (`inspect_checkpoint` is cached by resolved path).
The family table (sizes, frames, per-mode defaults) lives in `engine.model.defaults`.
"""
from __future__ import annotations

import functools
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

# Every generation mode the engine knows. "sound" is a capability of the video modes, listed so
# that the UI and `/models` can say whether a checkpoint can produce audio.
ALL_MODES = ("t2i", "t2v", "i2v", "v2v", "action", "sound")
REQUEST_MODES = ("t2i", "t2v", "i2v", "v2v", "action")

EDGE_BACKBONE = "cosmos3_edge_nemotron_dense"

# Checkpoints made by `engine.model.tiny` carry this file at their root. It names the real family the
# tiny model stands in for and declares small canvases and frame ranges so that CPU tests stay
# fast. Real checkpoints never carry it and always get the family table.
TINY_MARKER = "cosmos3_studio_tiny.json"

# (hidden_size, num_hidden_layers, num_attention_heads) of the released towers.
_ARCHITECTURES = {
    (4096, 36, 32): "nano",
    (5120, 64, 64): "super",
}


class CheckpointError(ValueError):
    """A checkpoint folder that is missing, incomplete or malformed. The message names the file."""


@dataclass(frozen=True)
class TinyLimits:
    """Small canvases declared by a tiny random-weight checkpoint (see `TINY_MARKER`)."""

    image_sizes: tuple[tuple[int, int], ...]
    video_sizes: tuple[tuple[int, int], ...]
    frame_range: tuple[int, int]
    default_frames: int


@dataclass(frozen=True)
class VariantInfo:
    """The facts about one checkpoint that validation, the UI and the engine read."""

    path: str
    family: str  # "nano" | "super" | "edge" | "custom"
    is_edge: bool
    is_distilled: bool
    distilled_sigmas: tuple[float, ...] | None
    modes: tuple[str, ...]
    hidden_size: int
    num_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    action_dim: int | None
    default_use_system_prompt: bool
    tiny: TinyLimits | None = None
    config_files_read: tuple[str, ...] = field(default=(), compare=False)

    @classmethod
    def released(cls, family: str, distilled_sigmas: tuple[float, ...] | None = None) -> "VariantInfo":
        """What inspection reports for a released checkpoint of `family` (benchmarks and table tests)."""
        hidden, layers, heads = {"nano": (4096, 36, 32), "super": (5120, 64, 64), "edge": (2048, 28, 16)}[family]
        distilled = distilled_sigmas is not None
        modes = ("t2i", "t2v", "i2v", "v2v")
        if not distilled and family != "super":
            modes += ("action",) + (("sound",) if family == "nano" else ())
        return cls(
            path=f"<released {family}>", family=family, is_edge=family == "edge", is_distilled=distilled,
            distilled_sigmas=distilled_sigmas, modes=modes, hidden_size=hidden, num_layers=layers,
            num_attention_heads=heads, num_key_value_heads=8, head_dim=128,
            action_dim=64 if "action" in modes else None, default_use_system_prompt=True,
        )

    @property
    def is_tiny(self) -> bool:
        return self.tiny is not None

    def supports(self, mode: str) -> bool:
        return mode in self.modes

    def summary(self) -> dict:
        """A JSON-ready description for `/models` and the variant panel."""
        return {
            "family": self.family,
            "is_edge": self.is_edge,
            "is_distilled": self.is_distilled,
            "distilled_sigmas": list(self.distilled_sigmas) if self.distilled_sigmas else None,
            "modes": list(self.modes),
            "is_tiny": self.is_tiny,
            "hidden_size": self.hidden_size,
            "num_layers": self.num_layers,
        }


def _read_json(path: Path, read_log: list[str]) -> dict:
    if not path.is_file():
        raise CheckpointError(f"Checkpoint file {str(path)!r} is missing.")
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"Checkpoint file {str(path)!r} is not valid JSON: {exc}.") from exc
    if not isinstance(data, dict):
        raise CheckpointError(f"Checkpoint file {str(path)!r} must hold a JSON object, got {type(data).__name__}.")
    read_log.append(str(path))
    return data


def _require(config: dict, key: str, path: Path, kind: type | tuple[type, ...]):
    if key not in config:
        raise CheckpointError(f"Checkpoint file {str(path)!r} lacks the key {key!r}.")
    value = config[key]
    if not isinstance(value, kind) or isinstance(value, bool) and kind is int:
        raise CheckpointError(f"Checkpoint file {str(path)!r}: {key!r} has the wrong type ({value!r}).")
    return value


def _distilled_sigmas(root: Path, scheduler_config: dict, read_log: list[str]) -> tuple[float, ...] | None:
    """Sigmas of a few-step checkpoint, or None for a plain one (cosmos3.md section 2)."""
    modular_index = root / "modular_model_index.json"
    if modular_index.is_file():
        modular = _read_json(modular_index, read_log)
        sigmas = modular.get("distilled_sigmas")
        if modular.get("is_distilled") and sigmas:
            return tuple(float(s) for s in sigmas)
    if scheduler_config.get("_class_name") == "FlowMatchEulerDiscreteScheduler":
        t_list = (scheduler_config.get("fixed_step_sampler_config") or {}).get("t_list")
        if t_list:
            sigmas = tuple(float(s) for s in t_list)
            if any(not (0.0 < s <= 1.0) for s in sigmas) or list(sigmas) != sorted(sigmas, reverse=True):
                raise CheckpointError(
                    f"Checkpoint file {str(root / 'scheduler' / 'scheduler_config.json')!r}: t_list {list(sigmas)} "
                    "must be decreasing values in (0, 1]."
                )
            return sigmas
    return None


def _tiny_limits(marker: dict, path: Path) -> TinyLimits:
    try:
        image_sizes = tuple((int(w), int(h)) for w, h in marker["image_sizes"])
        video_sizes = tuple((int(w), int(h)) for w, h in marker["video_sizes"])
        lo, hi = (int(v) for v in marker["frame_range"])
        default_frames = int(marker["default_frames"])
    except (KeyError, TypeError, ValueError) as exc:
        raise CheckpointError(f"Checkpoint file {str(path)!r} is malformed: {exc!r}.") from exc
    return TinyLimits(image_sizes, video_sizes, (lo, hi), default_frames)


def _modes(transformer_config: dict, is_distilled: bool, has_sound_tokenizer: bool) -> tuple[str, ...]:
    modes = ["t2i", "t2v", "i2v", "v2v"]
    # The few-step sampler exists for the vision modes only (diffusers' distilled blocks).
    if not is_distilled:
        if transformer_config.get("action_gen") and transformer_config.get("action_dim"):
            modes.append("action")
        if transformer_config.get("sound_gen") and transformer_config.get("sound_dim") and has_sound_tokenizer:
            modes.append("sound")
    return tuple(modes)


def _inspect_folder(root: Path) -> VariantInfo:
    if not root.exists():
        raise CheckpointError(f"Checkpoint folder {str(root)!r} does not exist.")
    if not root.is_dir():
        raise CheckpointError(f"Checkpoint path {str(root)!r} is not a folder.")
    read_log: list[str] = []
    index = _read_json(root / "model_index.json", read_log)
    if index.get("_class_name") != "Cosmos3OmniPipeline":
        raise CheckpointError(
            f"Checkpoint file {str(root / 'model_index.json')!r}: _class_name is {index.get('_class_name')!r}, "
            "expected 'Cosmos3OmniPipeline'."
        )
    for component in ("transformer", "vae", "scheduler", "text_tokenizer"):
        if not (root / component).is_dir():
            raise CheckpointError(f"Checkpoint {str(root)!r} lacks the component folder {component + '/'!r}.")

    transformer_path = root / "transformer" / "config.json"
    transformer = _read_json(transformer_path, read_log)
    scheduler = _read_json(root / "scheduler" / "scheduler_config.json", read_log)

    hidden = _require(transformer, "hidden_size", transformer_path, int)
    layers = _require(transformer, "num_hidden_layers", transformer_path, int)
    heads = _require(transformer, "num_attention_heads", transformer_path, int)
    kv_heads = int(transformer.get("num_key_value_heads", 8))
    head_dim = int(transformer.get("head_dim", 128))
    is_edge = transformer.get("backbone_type") == EDGE_BACKBONE or transformer.get("hidden_act") == "relu2"

    tiny = None
    marker_path = root / TINY_MARKER
    marker = _read_json(marker_path, read_log) if marker_path.is_file() else None
    if marker is not None:
        tiny = _tiny_limits(marker, marker_path)

    if is_edge:
        family = "edge"
    elif (hidden, layers, heads) in _ARCHITECTURES:
        family = _ARCHITECTURES[(hidden, layers, heads)]
    elif marker is not None and marker.get("family") in ("nano", "super"):
        family = marker["family"]
    else:
        family = "custom"

    sigmas = _distilled_sigmas(root, scheduler, read_log)
    has_sound_tokenizer = (root / "sound_tokenizer").is_dir() and index.get("sound_tokenizer", [None])[0] is not None
    return VariantInfo(
        path=str(root),
        family=family,
        is_edge=is_edge,
        is_distilled=sigmas is not None,
        distilled_sigmas=sigmas,
        modes=_modes(transformer, sigmas is not None, has_sound_tokenizer),
        hidden_size=hidden,
        num_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=head_dim,
        action_dim=transformer.get("action_dim") if transformer.get("action_gen") else None,
        default_use_system_prompt=bool(index.get("default_use_system_prompt", True)),
        tiny=tiny,
        config_files_read=tuple(read_log),
    )


@functools.lru_cache(maxsize=64)
def _inspect_cached(resolved: str) -> VariantInfo:
    return _inspect_folder(Path(resolved))


def inspect_checkpoint(path: str | os.PathLike) -> VariantInfo:
    """Inspect a local diffusers-format Cosmos3 checkpoint folder, reading only its config files.

    The result is cached per resolved folder, so a request never re-reads checkpoint files. Hub
    repo ids are resolved to a local snapshot by `engine.model.loader.resolve_source` first.
    """
    return _inspect_cached(str(Path(path).expanduser().resolve()))


def clear_inspection_cache() -> None:
    _inspect_cached.cache_clear()
