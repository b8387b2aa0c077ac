"""The switches the kernels take from whoever runs them: the package never reads the environment itself.

The engine fills them once from its configuration (`engine.config.apply_process_environment`, from
`COSMOS3_QUACK`, `COSMOS3_FLASH4` and `TRITON_INTERPRET`); a benchmark or test that uses the kernels alone calls
`use` itself. Until then the defaults hold: every library offered, Triton compiled (not interpreted).
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class KernelSettings:
    quack: bool = True  # QuACK's GEMMs among dispatch's candidates (COSMOS3_QUACK)
    flash4: bool = True  # flash-attn-4 among dispatch's candidates (COSMOS3_FLASH4)
    interpret: bool = False  # Triton runs under its interpreter (TRITON_INTERPRET=1): kernels on a CPU, for tests


_current = KernelSettings()


def use(settings: KernelSettings) -> None:
    """Set the process's kernel settings (one process runs one configuration)."""
    global _current
    _current = settings


def current() -> KernelSettings:
    return _current
