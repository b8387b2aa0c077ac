"""Per-browser history of results: entries, their check on load, and the gallery's items.

Entries live in the browser (Gradio's BrowserState), so they survive a page refresh and no other
browser ever sees them. They name their files relative to the outputs folder (`<request id>/image.png`),
never by the server's path; every name read back from the browser is checked to be a file the server
wrote under its outputs root before it is shown or offered, and then handed out as a capability copy.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable

from . import downloads as D
from .files import locate, publish, relative

HISTORY_LIMIT = 40
MODE_SHORT = {"t2i": "T2I", "t2v": "T2V", "i2v": "I2V", "v2v": "V2V", "action": "Action"}


def make_entry(*, model: str, tab: str, result, ui: dict) -> dict:
    """A history entry for a finished job. `ui` holds what the tab needs to restore its inputs."""
    summary = result.summary()
    # The browser keeps the entry and sends it back with each run: the actions stay in their file.
    summary.pop("actions", None)
    files = {key: relative(path) for key, path in result.outputs.items() if relative(path)}
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


def with_inputs(entry: dict, inputs: dict) -> dict:
    """The entry with the run's kept uploads ({"input_image": path, ...}, copies in the result folder)."""
    kept = {key: relative(path) for key, path in inputs.items() if relative(path)}
    return dict(entry, files={**entry["files"], **kept}) if kept else entry


def file_path(entry: dict, key: str) -> str | None:
    """The server path of an entry's file ("image", "video", "actions", "sidecar"), if it is a result file."""
    name = (entry.get("files") or {}).get(key)
    found = locate(name) if isinstance(name, str) else None
    return str(found) if found is not None else None


def media_path(entry: dict) -> str | None:
    return file_path(entry, "image") or file_path(entry, "video")


def named_files(entry: dict) -> dict[str, str]:
    """The entry's result files (server paths) under their download names (model, mode, seed, request
    id), and the zip."""
    request_id = entry.get("id") if not str(entry.get("id", "")).startswith("unsaved-") else None
    files = {k: file_path(entry, k) for k in D.ORDER}
    return D.named_files({k: p for k, p in files.items() if p}, model=entry.get("model", ""),
                         mode=entry.get("mode", ""), seed=entry.get("seed", ""), request_id=request_id)


def download_paths(entry: dict, with_actions: bool = True) -> list[str]:
    """Server paths of the entry's downloads (publish them before handing them to a browser)."""
    return D.download_list(named_files(entry), with_actions=with_actions)


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
        found = {k: locate(p) if isinstance(p, str) else None for k, p in entry["files"].items()}
        if not found or not all(p is not None and owns(str(p)) for p in found.values()):
            continue
        entry = dict(entry, files={k: relative(p) for k, p in found.items()})  # older entries held server paths
        if not isinstance(entry.get("model"), str) or entry.get("tab") not in ("t2i", "t2v", "action"):
            continue
        out.append(entry)
    return out


def gallery_items(history: list[dict]) -> list[tuple[str, str]]:
    """(capability copy of the media, caption) per entry; the outputs folder itself is never served."""
    items = []
    for entry in history:
        media = media_path(entry)
        if media and Path(media).is_file():
            copy = publish(media)
            if copy is not None:
                items.append((copy, caption_of(entry)))
    return items


def entry_at(history: list[dict], index: int | None) -> dict | None:
    """The entry shown at gallery position `index` (entries without media are not shown)."""
    if index is None:
        return None
    shown = [e for e in history if media_path(e) and Path(media_path(e)).is_file()]
    return shown[index] if 0 <= index < len(shown) else None
