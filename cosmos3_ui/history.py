"""Per-browser history of results: entries, their check on load, and the gallery's items.

Entries live in the browser (Gradio's encrypted BrowserState), so they survive a page refresh and
no other browser ever sees them. Every path read back from the browser is checked to be a file
the server wrote under its outputs root before it is shown or offered for download.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable

HISTORY_LIMIT = 40
MODE_SHORT = {"t2i": "T2I", "t2v": "T2V", "i2v": "I2V", "v2v": "V2V", "action": "Action"}


def make_entry(*, model: str, tab: str, result, ui: dict) -> dict:
    """A history entry for a finished job. `ui` holds what the tab needs to restore its inputs."""
    summary = result.summary()
    # The browser keeps the entry and sends it back with each run: the actions stay in their file.
    summary.pop("actions", None)
    files = {key: str(path) for key, path in result.outputs.items()}
    return {
        "id": result.request_id or f"unsaved-{time.time_ns()}",
        "model": model,
        "tab": tab,
        "mode": result.params.get("mode", tab),
        "created": time.strftime("%Y-%m-%d %H:%M:%S"),
        "seed": int(result.seed),
        "files": files,
        "summary": summary,
        "ui": ui,
    }


def media_path(entry: dict) -> str | None:
    files = entry.get("files") or {}
    return files.get("image") or files.get("video")


def download_paths(entry: dict) -> list[str]:
    files = entry.get("files") or {}
    return [files[k] for k in ("image", "video", "actions", "sidecar") if files.get(k)]


def caption_of(entry: dict) -> str:
    mode = MODE_SHORT.get(entry.get("mode", ""), entry.get("mode", ""))
    if entry.get("mode") == "action":
        kind = (entry.get("summary", {}).get("params", {}).get("action") or {}).get("kind", "")
        mode = f"{mode} · {kind.replace('_', ' ')}" if kind else mode
    return f"{entry.get('model', '?')} · {mode} · seed {entry.get('seed', '?')}"


def add(history: list | None, entry: dict, limit: int = HISTORY_LIMIT) -> list:
    return ([entry] + list(history or []))[:limit]


def clean(history: Any, owns: Callable[[str], bool]) -> list[dict]:
    """Entries from the browser that are well formed and whose files the server wrote."""
    if not isinstance(history, list):
        return []
    out = []
    for entry in history[:HISTORY_LIMIT]:
        if not isinstance(entry, dict) or not isinstance(entry.get("files"), dict):
            continue
        files = entry["files"]
        if not files or not all(isinstance(p, str) and owns(p) for p in files.values()):
            continue
        if not isinstance(entry.get("model"), str) or entry.get("tab") not in ("t2i", "t2v", "action"):
            continue
        out.append(entry)
    return out


def gallery_items(history: list[dict]) -> list[tuple[str, str]]:
    items = []
    for entry in history:
        media = media_path(entry)
        if media and Path(media).is_file():
            items.append((media, caption_of(entry)))
    return items


def entry_at(history: list[dict], index: int | None) -> dict | None:
    """The entry shown at gallery position `index` (entries without media are not shown)."""
    if index is None:
        return None
    shown = [e for e in history if media_path(e) and Path(media_path(e)).is_file()]
    return shown[index] if 0 <= index < len(shown) else None
