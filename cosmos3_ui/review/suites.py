"""Prompt suites and configurations: the two inputs of a suite run, parsed and checked.

A suite is JSON Lines, one item per line:
    {"id": "kitchen-01", "mode": "t2v", "prompt": "...", "seed": 0,
     "image": "media/first.png", "overrides": {"num_frames": 17}}
`id` (letters, digits, . _ -), `mode` and `prompt` (prose or a caption object) are required; `seed`
defaults to 0; `image`/`video` name a file under `assets/` (only suites shipped in `assets/suites/`
may, so an uploaded suite can never point at a server file); `overrides` are request keys for this
item (steps, num_frames, ...); `category` is free text (RBench-style grouping).

A configuration is a registered model plus request overrides under a name:
    {"name": "edge-2steps", "model": "edge", "overrides": {"steps": 2}}
Run requests are built as: item (mode, prompt, seed, media) < item overrides < configuration overrides.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

SUITES_DIR = Path(__file__).resolve().parents[2] / "assets" / "suites"
MAX_ITEMS = 2000
MAX_CONFIGS = 12
_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,79}$")
_CONFIG = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,39}$")
RESERVED = ("mode", "prompt", "seed", "image", "video")
MODES = ("t2i", "t2v", "i2v", "v2v")


class SuiteError(ValueError):
    """A suite or configuration list that cannot run; the message names the line and the key."""


@dataclass(frozen=True)
class SuiteItem:
    id: str
    mode: str
    prompt: str | dict
    seed: int = 0
    image: str | None = None  # absolute path of a shipped file
    video: str | None = None
    overrides: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Configuration:
    name: str
    model: str
    overrides: dict = field(default_factory=dict)


def _overrides(value, where: str) -> dict:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise SuiteError(f"{where}: overrides must be an object of request keys, got {type(value).__name__}.")
    clash = sorted(set(value) & set(RESERVED))
    if clash:
        raise SuiteError(f"{where}: overrides may not set {clash}; those belong to the item.")
    return dict(value)


def _media(value, key: str, where: str, base: Path | None) -> str | None:
    if value is None:
        return None
    if base is None:
        raise SuiteError(f"{where}: {key!r} names a file; only suites shipped in assets/suites/ may (uploads "
                         "cannot point at server files).")
    if not isinstance(value, str) or Path(value).is_absolute() or ".." in Path(value).parts:
        raise SuiteError(f"{where}: {key!r} must be a relative path under assets/, got {value!r}.")
    path = (base / value).resolve()
    if not path.is_file() or base.resolve() not in path.parents:
        raise SuiteError(f"{where}: {key!r} file {value!r} does not exist under assets/.")
    return str(path)


def _item(value, number: int, base: Path | None) -> SuiteItem:
    where = f"line {number}"
    if not isinstance(value, dict):
        raise SuiteError(f"{where}: expected a JSON object, got {type(value).__name__}.")
    unknown = sorted(set(value) - {"id", "mode", "prompt", "seed", "image", "video", "overrides", "category"})
    if unknown:
        raise SuiteError(f"{where}: unknown keys {unknown}; allowed: id, mode, prompt, seed, image, video, "
                         "overrides, category.")
    item_id = value.get("id")
    if not isinstance(item_id, str) or not _ID.match(item_id):
        raise SuiteError(f"{where}: 'id' must be 1-80 letters, digits, '.', '_' or '-', got {item_id!r}.")
    mode = value.get("mode")
    if mode not in MODES:
        raise SuiteError(f"{where} ({item_id}): 'mode' must be one of {list(MODES)}, got {mode!r}.")
    prompt = value.get("prompt")
    if not (isinstance(prompt, str) and prompt.strip()) and not isinstance(prompt, dict):
        raise SuiteError(f"{where} ({item_id}): 'prompt' must be text or a caption object, got {prompt!r}.")
    seed = value.get("seed", 0)
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise SuiteError(f"{where} ({item_id}): 'seed' must be a whole number >= 0, got {seed!r}.")
    return SuiteItem(item_id, mode, prompt, seed, _media(value.get("image"), "image", where, base),
                     _media(value.get("video"), "video", where, base), _overrides(value.get("overrides"), where))


def parse_suite(text: str, base: Path | None = None) -> list[SuiteItem]:
    """Items of a JSONL suite; `base` is the folder media paths are read from (assets/ for a shipped
    suite; None for an upload, which may name no files)."""
    items: list[SuiteItem] = []
    for number, raw in enumerate(text.splitlines(), start=1):
        if not raw.strip():
            continue
        try:
            value = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise SuiteError(f"line {number}: not valid JSON ({exc.msg}, column {exc.colno}).") from None
        items.append(_item(value, number, base))
        if len(items) > MAX_ITEMS:
            raise SuiteError(f"A suite holds at most {MAX_ITEMS} items.")
    if not items:
        raise SuiteError("The suite has no items (one JSON object per line).")
    seen: set[str] = set()
    for item in items:
        if item.id in seen:
            raise SuiteError(f"Item id {item.id!r} appears twice; ids must be unique within a suite.")
        seen.add(item.id)
    return items


def shipped_suites() -> dict[str, Path]:
    """{name: path} of the suites in assets/suites/."""
    return {p.stem: p for p in sorted(SUITES_DIR.glob("*.jsonl"))}


def load_shipped(name: str) -> list[SuiteItem]:
    suites = shipped_suites()
    if name not in suites:
        raise SuiteError(f"Unknown suite {name!r}; shipped suites: {sorted(suites)}.")
    return parse_suite(suites[name].read_text(encoding="utf-8"), base=SUITES_DIR.parent)


def parse_configurations(text: str, models: list[str]) -> list[Configuration]:
    """A JSON list (or JSON Lines) of {name, model, overrides}; names unique, models registered."""
    text = (text or "").strip()
    try:
        values = json.loads(text) if text.startswith("[") else [json.loads(line) for line in text.splitlines()
                                                                 if line.strip()]
    except json.JSONDecodeError as exc:
        raise SuiteError(f"Configurations: not valid JSON ({exc.msg}).") from None
    if not 1 <= len(values) <= MAX_CONFIGS:
        raise SuiteError(f"Give 1 to {MAX_CONFIGS} configurations (2 or more to compare them); got {len(values)}.")
    configs: list[Configuration] = []
    for number, value in enumerate(values, start=1):
        where = f"configuration {number}"
        if not isinstance(value, dict) or set(value) - {"name", "model", "overrides"}:
            raise SuiteError(f"{where}: expected {{\"name\", \"model\", \"overrides\"}}, got {value!r}.")
        name, model = value.get("name"), value.get("model")
        if not isinstance(name, str) or not _CONFIG.match(name):
            raise SuiteError(f"{where}: 'name' must be 1-40 lowercase letters, digits, '.', '_' or '-', got {name!r}.")
        if model not in models:
            raise SuiteError(f"{where} ({name}): unknown model {model!r}; registered models: {models}.")
        configs.append(Configuration(name, model, _overrides(value.get("overrides"), where)))
    names = [c.name for c in configs]
    if len(set(names)) != len(names):
        raise SuiteError(f"Configuration names must be unique, got {names}.")
    return configs


def build_request(item: SuiteItem, config: Configuration) -> dict:
    """The engine request for one item under one configuration."""
    request = {"mode": item.mode, "prompt": item.prompt, "seed": item.seed}
    for key in ("image", "video"):
        if getattr(item, key):
            request[key] = getattr(item, key)
    return {**request, **item.overrides, **config.overrides}


def item_to_json(item: SuiteItem) -> dict:
    return {"id": item.id, "mode": item.mode, "prompt": item.prompt, "seed": item.seed, "image": item.image,
            "video": item.video, "overrides": item.overrides}


def item_from_json(value: dict) -> SuiteItem:
    return SuiteItem(value["id"], value["mode"], value["prompt"], value["seed"], value.get("image"),
                     value.get("video"), value.get("overrides") or {})
