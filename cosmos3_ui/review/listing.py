"""Every result in the outputs folder, as review mode sees it: reviewable ones are registered for
review (whenever they were made, review mode on or off), the others are listed with the reason.

A result folder is `<outputs>/<request id>/` or one level down in a group folder (a batch or a suite
run: `<outputs>/<group>/<request id>/`). Hidden folders are staging folders still being written.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from engine.pipeline.outputs import ACTIONS_NAME, IMAGE_NAME, SIDECAR_NAME, VIDEO_NAME

from .store import REQUEST_ID, ReviewStore

MEDIA_NAMES = (IMAGE_NAME, VIDEO_NAME)  # the file names are the output stage's (engine.pipeline.outputs)
MAX_LISTED = 5000


@dataclass(frozen=True)
class Listed:
    request_id: str
    folder: Path
    model: str
    mode: str
    prompt: str
    media: Path | None
    reason: str  # empty when reviewable
    created: str = ""

    @property
    def reviewable(self) -> bool:
        return not self.reason


def _prompt_text(prompt) -> str:
    if isinstance(prompt, dict):
        return json.dumps(prompt, ensure_ascii=False)
    return str(prompt or "")


def inspect_folder(folder: Path) -> Listed:
    """What review can do with one result folder, and why not when it cannot."""
    media = next((folder / n for n in MEDIA_NAMES if (folder / n).is_file()), None)
    sidecar = folder / SIDECAR_NAME
    if not sidecar.is_file():
        return Listed(folder.name, folder, "", "", "", media, "no params.json: not a finished Cosmos3 Studio result")
    try:
        document = json.loads(sidecar.read_text(encoding="utf-8"))
        params = document.get("params") or {}
        model = (document.get("model") or {}).get("name") or ""
        listed = Listed(folder.name, folder, str(model), str(params.get("mode", "")), _prompt_text(params.get("prompt")),
                        media, "", str(document.get("created", "")))
    except (OSError, ValueError, AttributeError) as exc:
        return Listed(folder.name, folder, "", "", "", media, f"params.json cannot be read ({exc})")
    if media is None:
        kind = "actions only (no image or video to look at)" if (folder / ACTIONS_NAME).is_file() else "no image or video file"
        return Listed(listed.request_id, folder, listed.model, listed.mode, listed.prompt, None, kind, listed.created)
    if not listed.model:
        return Listed(listed.request_id, folder, "", listed.mode, listed.prompt, media,
                      "params.json names no model", listed.created)
    return listed


def result_folders(outputs_root: Path) -> list[Path]:
    """Result folders directly under the outputs root or one group folder down; newest first."""
    found: list[Path] = []
    if not outputs_root.is_dir():
        return found
    for entry in outputs_root.iterdir():
        if entry.name.startswith(".") or not entry.is_dir() or entry.is_symlink():
            continue
        if REQUEST_ID.match(entry.name):
            found.append(entry)
            continue
        for inner in entry.iterdir():
            if inner.is_dir() and not inner.is_symlink() and REQUEST_ID.match(inner.name):
                found.append(inner)
    found.sort(key=lambda p: p.name, reverse=True)  # ids start with the time
    return found[:MAX_LISTED]


def origin_of(folder: Path, outputs_root: Path) -> str:
    group = folder.parent.name if folder.parent != outputs_root else ""
    if group.startswith("suite-"):
        return f"suite:{group}"
    if group.startswith("batch-"):
        return f"batch:{group}"
    return "outputs folder"


def sync_outputs(store: ReviewStore, outputs_root: str | Path) -> list[Listed]:
    """List every result folder; register the reviewable ones not yet registered. Newest first."""
    root = Path(outputs_root).resolve()
    listed = [inspect_folder(folder) for folder in result_folders(root)]
    known = {r["request_id"] for r in store.results()}
    new = [(e.request_id, e.folder, e.model, e.mode, origin_of(e.folder, root)) for e in listed
           if e.reviewable and e.request_id not in known]
    if new:
        store.register_results(new)
    return listed
