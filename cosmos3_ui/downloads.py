"""Download names: every file a result made, named by model, mode, seed and request id, plus one zip.

The engine writes `image.png`, `video.mp4`, `actions.json` and `params.json` in the result's folder;
a browser saving five of those gets five `image.png`s. The named files are hard links (copies where
links are not possible) in the result's own `downloads/` folder, made once and reused by History.
"""
from __future__ import annotations

import os
import re
import shutil
import zipfile
from pathlib import Path

ORDER = ("image", "video", "actions", "sidecar")
SUFFIX = {"image": "", "video": "", "actions": "_actions", "sidecar": "_params"}


def _safe(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", str(text)).strip("-") or "result"


def stem(model: str, mode: str, seed, request_id: str) -> str:
    """`nano_t2i_seed42_20260101-...`: what each download of one result is called."""
    return f"{_safe(model)}_{_safe(mode)}_seed{_safe(seed)}_{_safe(request_id)}"


def _link(source: Path, target: Path) -> None:
    if target.exists():
        return
    try:
        os.link(source, target)
    except OSError:
        shutil.copyfile(source, target)


def named_files(files: dict, *, model: str, mode: str, seed, request_id: str | None) -> dict[str, str]:
    """{kind: named path} for a result's files, plus "zip": all of them in one archive.

    Files of an unsaved result (no request id, or no folder) keep their own names.
    """
    present = {k: Path(files[k]) for k in ORDER if files.get(k) and Path(files[k]).is_file()}
    if not present or not request_id:
        return {k: str(p) for k, p in present.items()}
    folder = next(iter(present.values())).parent / "downloads"
    name = stem(model, mode, seed, request_id)
    out: dict[str, str] = {}
    try:
        folder.mkdir(exist_ok=True)
        for kind, path in present.items():
            target = folder / f"{name}{SUFFIX[kind]}{path.suffix}"
            _link(path, target)
            out[kind] = str(target)
        archive = folder / f"{name}.zip"
        if not archive.exists():
            partial = archive.with_suffix(".zip.part")
            with zipfile.ZipFile(partial, "w", compression=zipfile.ZIP_DEFLATED) as bundle:
                for path in out.values():
                    bundle.write(path, arcname=Path(path).name)
            partial.replace(archive)  # complete or absent, never half written
        out["zip"] = str(archive)
    except OSError:
        return {k: str(p) for k, p in present.items()}
    return out


def download_list(named: dict[str, str], *, with_actions: bool = True) -> list[str]:
    """The Files list of a result: media, actions, parameters, then the zip (actions shown once:
    the Action tab lists them beside its plot instead)."""
    kinds = [k for k in (*ORDER, "zip") if k != "actions" or with_actions]
    return [named[k] for k in kinds if named.get(k)]


def named_media(named: dict[str, str], fallback: str | None = None) -> str | None:
    """The named image or video of a result: what the media component shows, so its own download icon
    saves `<model>_<mode>_seed<seed>_<request id>.png`, not `image.png`."""
    return named.get("image") or named.get("video") or fallback
