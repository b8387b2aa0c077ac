"""The models an app or CLI serves: name -> source, with inspection done once per model."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..model.defaults import sampling_defaults
from ..model.loader import looks_like_repo_id, resolve_source
from ..model.variants import REQUEST_MODES, VariantInfo, inspect_checkpoint


@dataclass(frozen=True)
class ModelEntry:
    name: str
    source: str
    label: str = ""


class ModelRegistry:
    """Registered models. Inspection reads config files only, once per model, on first use.

    With `allowed_roots`, every local source must lie inside one of those folders (after resolving
    links and `..`), so a deployment can say exactly which checkpoints it serves; hub repo ids are
    allowed only when `allow_hub` is set.
    """

    def __init__(self, entries: list[ModelEntry], *, allowed_roots: list[str] | None = None, allow_hub: bool = True,
                 gpus: int = 1):
        self.gpus = gpus  # the GPU group every model is loaded on (app --gpus; engine.parallel)
        names = [e.name for e in entries]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"Model names must be unique; repeated: {duplicates}.")
        self.allowed_roots = [Path(r).expanduser().resolve() for r in allowed_roots] if allowed_roots else None
        self.allow_hub = allow_hub
        for entry in entries:
            self.check_source(entry.source)
        self._entries = {e.name: e for e in entries}
        self._infos: dict[str, VariantInfo] = {}

    def check_source(self, source: str) -> None:
        """Refuse a source outside the configured roots (or a hub id when the hub is off)."""
        if "\x00" in source:
            raise ValueError("A model source contains a NUL character.")
        local = Path(source).expanduser()
        if not local.exists() and looks_like_repo_id(source):
            if not self.allow_hub:
                raise ValueError(f"Model source {source!r} is a hub repo id, and hub sources are turned off here.")
            return
        if self.allowed_roots is None:
            return
        resolved = local.resolve()
        if not any(resolved == root or root in resolved.parents for root in self.allowed_roots):
            raise ValueError(
                f"Model source {source!r} is outside the allowed model folders "
                f"{[str(r) for r in self.allowed_roots]}."
            )

    def names(self) -> list[str]:
        return list(self._entries)

    def entry(self, name: str) -> ModelEntry:
        if name not in self._entries:
            raise ValueError(f"Unknown model {name!r}; registered models: {self.names()}.")
        return self._entries[name]

    def info(self, name: str) -> VariantInfo:
        if name not in self._infos:
            entry = self.entry(name)
            self._infos[name] = inspect_checkpoint(resolve_source(entry.source, config_only=True))
        return self._infos[name]

    def describe(self, name: str) -> dict:
        """What `/models` and the variant panel show for one model (with the GPU group it runs on)."""
        from ..parallel.plan import group_schemes

        info = self.info(name)
        return {
            "name": name,
            "label": self.entry(name).label,
            **info.summary(),
            "gpus": self.gpus,
            "parallel": group_schemes(self.gpus) if self.gpus > 1 else None,
            "defaults": {mode: sampling_defaults(info, mode) for mode in REQUEST_MODES if info.supports(mode)},
        }

    def describe_all(self) -> list[dict]:
        return [self.describe(name) for name in self._entries]
