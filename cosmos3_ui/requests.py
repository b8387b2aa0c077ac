"""Engine requests from what the user typed, and from `/generate`'s arguments. Pure functions.

The engine validates a request once (`engine.validate_request` makes the `Request` the queue keeps,
parsing and type-checking a JSON caption there) and is the only authority on limits; its
`RequestError.field` names the request key at fault. What is checked here is only what the engine
cannot see: an empty box (the engine would silently take its default), a JSON-style prompt that is
not an object at all, which upload is which. Those come back as `StudioError` with the request key
they concern (`"prompt"`, `"steps"`, `"action.actions"`...), the engine's own vocabulary, so the UI
marks every refusal the same way.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.model.defaults import DEFAULT_FPS
from engine.pipeline import captions
from engine.pipeline.media import ACTION_SUFFIXES, IMAGE_SUFFIXES, VIDEO_SUFFIXES

from .controls import parse_size
from .service import StudioError

STYLE_JSON = "Structured caption (JSON)"
STYLE_PROSE = "Prose"
PROMPT_STYLES = (STYLE_JSON, STYLE_PROSE)


_EMPTY_OBJECT = re.compile(r"\s*\{\s*\}\s*")


def caption_text(text: str, *, json_style: bool, field: str = "prompt") -> str:
    """The prompt text as it is sent: a JSON caption goes as written and is parsed once, by the engine.

    Refused here only what the engine would take silently: an empty box, an empty object, and text in
    the JSON editor that is not an object at all (the engine would send it to the model as prose).
    """
    stripped = (text or "").strip()
    if not stripped:
        what = "write a JSON caption" if json_style else "describe the scene in a sentence or two"
        raise StudioError(f"The prompt is empty: {what}.", field)
    if json_style and not captions.looks_like_json(stripped):
        raise StudioError("The caption must be a JSON object {...}; pick Prose to send a sentence.", field)
    if _EMPTY_OBJECT.fullmatch(stripped):
        raise StudioError("The caption is an empty object: fill in at least one field.", field)
    return stripped


def prompt_from_editor(style: str, json_text: str, prose_text: str) -> str:
    """The prompt to send from the caption editor; raises StudioError(field="prompt")."""
    if style == STYLE_PROSE:
        return caption_text(prose_text, json_style=False)
    return caption_text(json_text, json_style=True)


def negative_from_text(text: str) -> str:
    """The negative prompt as sent (a JSON caption or prose; the engine parses it once), or empty."""
    stripped = (text or "").strip()
    return caption_text(stripped, json_style=False, field="negative_prompt") if stripped else ""


def _number(value: Any, name: str, field: str) -> Any:
    """A number control's value as the engine gets it; only an empty box is refused here (the engine
    would take its default instead). Range and type are the engine's to refuse, in the API's words."""
    if value is None or isinstance(value, bool) or value == "":
        raise StudioError(f"{name} is empty; enter a number.", field)
    if isinstance(value, float) and value.is_integer():
        return int(value)  # a whole number from a browser box (a double) goes as one
    return value


def seed_value(seed: Any, randomize: bool) -> int:
    """The seed as typed. The box is text, so a seed past 2**53 reaches the engine exactly (a browser's
    number box would round 99999999999999999999 to 1e20); the engine refuses one out of range."""
    if randomize:
        return -1
    if isinstance(seed, str):
        text = seed.strip()
        if not text:
            raise StudioError("Seed is empty; enter a whole number.", "seed")
        try:
            return int(text)
        except ValueError:
            raise StudioError(f"Seed must be a whole number, got {text!r}.", "seed") from None
    return _number(seed, "Seed", "seed")


@dataclass
class Sampling:
    """The sampling controls every tab shares."""

    resolution: str | None = None
    frames: Any = 1
    fps: Any = DEFAULT_FPS
    steps: Any = 1
    guidance_scale: Any = 1.0
    use_interval: bool = False
    interval_lo: Any = None  # read only with use_interval
    interval_hi: Any = None
    flow_shift: Any = 1.0
    seed: Any = 0
    randomize: bool = True

    def common(self) -> dict:
        return {
            "steps": _number(self.steps, "Steps", "steps"),
            "guidance_scale": _number(self.guidance_scale, "Guidance scale", "guidance_scale"),
            "flow_shift": _number(self.flow_shift, "Flow shift", "flow_shift"),
            "seed": seed_value(self.seed, self.randomize),
        }

    def canvas(self) -> dict:
        if not self.resolution:
            raise StudioError("Pick a resolution.", "resolution")
        try:
            width, height = parse_size(self.resolution)
        except ValueError as exc:
            raise StudioError(str(exc), "resolution") from None
        return {"width": width, "height": height}

    def interval(self) -> list[float] | None:
        if not self.use_interval:
            return None
        return [_number(self.interval_lo, "Interval start", "guidance_interval"),
                _number(self.interval_hi, "Interval end", "guidance_interval")]


def image_request(prompt: str, negative: str, sampling: Sampling) -> dict:
    return {
        "mode": "t2i", "prompt": prompt, "negative_prompt": negative, **sampling.canvas(), "num_frames": 1,
        "guidance_interval": sampling.interval(), **sampling.common(),
    }


def video_request(prompt: str, negative: str, sampling: Sampling, *, image: str | None, video: str | None,
                  sound: bool, fit: str | None = None) -> dict:
    """T2V, or I2V with a conditioning image, or V2V with a conditioning video."""
    if image and video:
        raise StudioError("Give a conditioning image or a conditioning video, not both; clear one of them.", "image")
    mode = "i2v" if image else "v2v" if video else "t2v"
    request = {
        "mode": mode, "prompt": prompt, "negative_prompt": negative, **sampling.canvas(),
        "num_frames": _number(sampling.frames, "Frames", "num_frames"), "fps": _number(sampling.fps, "FPS", "fps"),
        "guidance_interval": None, "sound": bool(sound), **sampling.common(),
    }
    if image:
        request["image"] = image
    if video:
        request["video"] = video
    if (image or video) and fit:
        request["fit"] = fit
    return request


@dataclass
class ActionInputs:
    kind: str
    domain: str
    view_point: str
    chunk_size: Any
    resolution_tier: Any
    instruction: str = ""
    image: str | None = None
    video: str | None = None
    actions_file: str | None = None


def load_actions(path: str, domain: str) -> list[list[float]]:
    from engine.pipeline.media import load_actions_file

    try:
        return load_actions_file(path, domain)
    except ValueError as exc:
        raise StudioError(str(exc), "action.actions") from None


def action_request(inputs: ActionInputs, sampling: Sampling) -> dict:
    kind = inputs.kind
    action: dict[str, Any] = {
        "kind": kind, "domain": inputs.domain, "view_point": inputs.view_point,
        "chunk_size": _number(inputs.chunk_size, "Chunk size", "action.chunk_size"),
        "resolution_tier": _number(inputs.resolution_tier, "Resolution tier", "action.resolution_tier"),
    }
    request: dict[str, Any] = {
        "mode": "action", "prompt": (inputs.instruction or "").strip(), "negative_prompt": "",
        "fps": _number(sampling.fps, "FPS", "fps"), **sampling.common(),
    }
    if kind == "inverse_dynamics":
        if not inputs.video:
            raise StudioError("Inverse dynamics needs a video: upload the clip whose actions you want.", "video")
        request["video"] = inputs.video
    else:
        if inputs.image and inputs.video:
            raise StudioError("Give the first frame as an image or a video, not both; clear one of them.", "image")
        if not inputs.image and not inputs.video:
            raise StudioError(f"{kind.replace('_', ' ').capitalize()} needs a first frame: upload an image "
                              "(or a video, whose first frame is used).", "image")
        if inputs.image:
            request["image"] = inputs.image
        else:
            request["video"] = inputs.video
    if kind == "forward_dynamics":
        if not inputs.actions_file:
            raise StudioError("Forward dynamics needs an actions file [T, D] (JSON, CSV or NPY).", "action.actions")
        action["actions"] = load_actions(inputs.actions_file, inputs.domain)
    request["action"] = action
    return request


# ----------------------------------------------------------------------------------------------
# The scripting API
# ----------------------------------------------------------------------------------------------


def file_kind(path: str) -> str:
    """"image", "video" or "actions" from an uploaded file's suffix; raises for anything else."""
    suffix = Path(path).suffix.lower()
    if suffix in IMAGE_SUFFIXES:
        return "image"
    if suffix in VIDEO_SUFFIXES:
        return "video"
    if suffix in ACTION_SUFFIXES:
        return "actions"
    allowed = list(IMAGE_SUFFIXES + VIDEO_SUFFIXES + ACTION_SUFFIXES)
    raise StudioError(f"The file {Path(path).name!r} has type {suffix or '(none)'!r}; allowed: {allowed}.", "file")


def parse_request_json(text: Any) -> dict:
    if isinstance(text, dict):
        return dict(text)
    if not isinstance(text, str) or not text.strip():
        raise StudioError("request_json is empty; send a JSON object such as {\"mode\": \"t2i\", \"prompt\": \"...\"}.")
    if len(text) > 2 * captions.PROMPT_MAX_CHARS + 100_000:
        raise StudioError(f"request_json is {len(text)} characters long; that is more than any valid request.")
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise StudioError(f"request_json is not valid JSON: {exc.msg} at line {exc.lineno}, column {exc.colno}.") from None
    except RecursionError:
        raise StudioError("request_json is nested too deeply.") from None
    if not isinstance(value, dict):
        raise StudioError(f"request_json must be a JSON object, got {type(value).__name__}.")
    return value


def api_request(request: dict, file_path: str | None) -> dict:
    """The engine request for `/generate`: the uploaded file goes where its mode needs it.

    Paths inside request_json are refused: files come only through the `file` argument, so a
    caller can never point the engine at a file on the server.
    """
    request = dict(request)
    for key in ("image", "video"):
        if request.get(key) is not None:
            raise StudioError(f"request_json must not name a file in {key!r}; upload it as the `file` argument.", "file")
    action = request.get("action")
    if isinstance(action, dict) and isinstance(action.get("actions"), str):
        raise StudioError("action.actions must be a list of rows, not a file name; upload the file as `file`.", "file")
    mode = request.get("mode")
    if not file_path:
        return request
    kind = file_kind(file_path)
    if mode == "i2v" and kind == "image":
        request["image"] = file_path
    elif mode == "v2v" and kind == "video":
        request["video"] = file_path
    elif mode == "action" and isinstance(action, dict):
        action_kind = action.get("kind")
        if kind == "actions":
            if action_kind != "forward_dynamics":
                raise StudioError(f"An actions file is only used by forward_dynamics, not {action_kind!r}.", "file")
            domain = action.get("domain")
            if not isinstance(domain, str):
                raise StudioError("action.domain is needed to read an actions file.", "file")
            request["action"] = dict(action, actions=load_actions(file_path, domain))
        elif kind == "video" or (kind == "image" and action_kind != "inverse_dynamics"):
            request[kind] = file_path
        else:
            raise StudioError("inverse_dynamics takes a video file, not an image.", "file")
    else:
        wanted = {"i2v": "an image", "v2v": "a video", "action": "an image, a video or an actions file"}
        if mode in wanted:
            raise StudioError(f"Mode {mode!r} takes {wanted[mode]}; the uploaded file is {kind == 'actions' and 'an actions file' or 'a ' + kind}.", "file")
        raise StudioError(f"Mode {mode!r} takes no file; use i2v (image), v2v (video) or action.", "file")
    return request
