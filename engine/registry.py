"""The models an app or CLI serves: name -> source, with inspection done once per model."""
from __future__ import annotations

from dataclasses import dataclass

from .defaults import sampling_defaults
from .loader import resolve_source
from .variants import REQUEST_MODES, VariantInfo, inspect_checkpoint


@dataclass(frozen=True)
class ModelEntry:
    name: str
    source: str
    label: str = ""


class ModelRegistry:
    """Registered models. Inspection reads config files only, once per model, on first use."""

    def __init__(self, entries: list[ModelEntry]):
        names = [e.name for e in entries]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"Model names must be unique; repeated: {duplicates}.")
        self._entries = {e.name: e for e in entries}
        self._infos: dict[str, VariantInfo] = {}

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
        """What `/models` and the variant panel show for one model."""
        info = self.info(name)
        return {
            "name": name,
            "label": self.entry(name).label,
            **info.summary(),
            "defaults": {mode: sampling_defaults(info, mode) for mode in REQUEST_MODES if info.supports(mode)},
        }

    def describe_all(self) -> list[dict]:
        return [self.describe(name) for name in self._entries]
