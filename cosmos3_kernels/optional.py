"""The optional GPU libraries the kernels reach for (flash-attn-4, QuACK): whether one is installed, and what to
say when one is installed and does not import.

An absent library is left out quietly: dispatch records why, and the app says at start where flash-attn-4 would
help (`prefix_attention.flash4_advice`). An installed one that does not import is an install to repair, and it
costs every request: CuTe DSL 4.8, which both run on, ships in three wheels, and an H200 host that had two of
them served an Edge T2V step in 239.7 ms on cuDNN's attention and cuBLAS instead of 209.8 ms (docs/perf-log/2026-12-02.md,
"What flash-attn-4 and QuACK are worth"), with nothing in its log. So that case is logged once per library, as a
warning that quotes the error and names the fix.
"""
from __future__ import annotations

import importlib.metadata
import logging

log = logging.getLogger("cosmos3_kernels.optional")


def installed(distribution: str) -> bool:
    """Whether `distribution` is installed, read from its metadata without importing it (imports cost seconds)."""
    try:
        importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def warn_if_installed(distribution: str, error: BaseException, fallback: str) -> None:
    """Log that `distribution` is installed but its import failed with `error`, so `fallback` runs instead; nothing
    when it is not installed (absent on purpose). Callers call it from their cached import, so once per process."""
    if installed(distribution):
        log.warning("%s is installed but does not import (%s: %s), so %s runs instead, slower. Repair the install: "
                    "pip install -r requirements-gpu.txt (into site-packages).",
                    distribution, type(error).__name__, str(error)[:200], fallback)
