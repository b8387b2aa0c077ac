"""Per-browser history of results: entries, their seal and check on load, and the gallery's items.

Entries live in the browser (Gradio's BrowserState), so they survive a page refresh and no other
browser ever sees them. They name their files relative to the outputs folder (`<request id>/image.png`),
never by the server's path. A browser can send any list back (every handler is callable by its
`fn_index`), so each entry carries a seal: an HMAC, with a key that never leaves the server, over the
entry's id, model, tab, mode and files. An entry whose seal does not verify (one forged from another
user's request id) is dropped before any of its files is looked at; a sealed entry's files are then
checked to be files the server wrote under its outputs root, and handed out as capability copies.
"""
from __future__ import annotations

import hashlib
import hmac
import json
import secrets
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import downloads as D
from .files import locate, publish, relative

HISTORY_LIMIT = 40
MODE_SHORT = {"t2i": "T2I", "t2v": "T2V", "i2v": "I2V", "v2v": "V2V", "action": "Action"}
# What the seal covers: what names the entry's files and the names its downloads get. Strings only, so the
# browser's JSON round trip cannot change them (it may turn 5.0 into 5 in the rest of the entry).
SEALED_FIELDS = ("id", "model", "tab", "mode", "files")


def _derived(secret: str, purpose: bytes) -> bytes:
    return hmac.new(secret.encode("utf-8"), purpose, hashlib.sha256).digest()


def browser_state_secret(secret: str) -> str:
    """The BrowserState's encryption key. Gradio sends it to every browser in /config, so it is derived
    from the app's key (one way) rather than being it: knowing it reveals nothing about the seal's key."""
    return _derived(secret, b"cosmos3-studio browser state").hex()


@dataclass(frozen=True)
class HistorySeal:
    """Seals history entries with a key kept on the server: browsers keep entries but cannot make them."""

    key: bytes = field(repr=False)

    @classmethod
    def from_secret(cls, secret: str) -> "HistorySeal":
        """The seal of an app whose key is `secret` (app.py's key file, in the cache folder)."""
        return cls(_derived(secret, b"cosmos3-studio history seal"))

    @classmethod
    def fresh(cls) -> "HistorySeal":
        """A seal for this process only (entries then stop verifying when the server restarts)."""
        return cls(secrets.token_bytes(32))

    def _mac(self, entry: dict) -> str:
        text = json.dumps({k: entry.get(k) for k in SEALED_FIELDS}, sort_keys=True, separators=(",", ":"))
        return hmac.new(self.key, text.encode("utf-8"), hashlib.sha256).hexdigest()

    def sign(self, entry: dict) -> dict:
        return dict(entry, seal=self._mac(entry))

    def verifies(self, entry: dict) -> bool:
        seal = entry.get("seal")
        try:
            return isinstance(seal, str) and hmac.compare_digest(seal, self._mac(entry))
        except (TypeError, ValueError):  # a value JSON cannot hold: not an entry this server made
            return False


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


def add(history: Any, entry: dict, seal: HistorySeal, limit: int = HISTORY_LIMIT) -> list:
    """A new entry (sealed here) before the browser's earlier ones that still verify."""
    return ([seal.sign(entry)] + clean(history, seal))[:limit]


def clean(history: Any, seal: HistorySeal) -> list[dict]:
    """Entries from the browser that this server sealed, well formed, whose files are still result files."""
    if not isinstance(history, list):
        return []
    out = []
    for entry in history[:HISTORY_LIMIT]:
        if not isinstance(entry, dict) or not seal.verifies(entry) or not isinstance(entry.get("files"), dict):
            continue
        names = entry["files"]
        if not names or not all(isinstance(p, str) and locate(p) is not None for p in names.values()):
            continue
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
