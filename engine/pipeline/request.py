"""Request validation: a request dict checked against the checkpoint's limits, with defaults filled in.

It lives in the pipeline (not beside the table in `engine.model.defaults`) because it parses captions,
which is pipeline knowledge; the table it reads stays on the model floor.
"""
from __future__ import annotations

import math
from typing import Any

from ..model.action import (
    ACTION_DOMAINS,
    ACTION_KINDS,
    CHUNK_RANGE,
    MODEL_ACTION_WIDTH,
    RESOLUTION_TIERS,
    SUPPORTED_DOMAINS,
    VIEW_POINTS,
)
from ..model.defaults import (
    DEFAULT_ACTION_TIER,
    Limits,
    distinct_timesteps,
    max_distinct_steps,
    sampling_defaults,
    sampling_limits,
)
from ..model.variants import REQUEST_MODES, VariantInfo
from .prompts import parse_caption

REQUEST_KEYS = (
    "mode", "prompt", "negative_prompt", "width", "height", "num_frames", "fps", "steps", "guidance_scale",
    "guidance_interval", "flow_shift", "seed", "image", "video", "sound", "action",
)
ACTION_KEYS = ("kind", "domain", "chunk_size", "resolution_tier", "view_point", "actions")


def _int(params: dict, key: str, lo: int, hi: int) -> int:
    value = params[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{key} must be an integer in [{lo}, {hi}], got {value!r}.")
    if isinstance(value, float):
        if not math.isfinite(value) or value != int(value):
            raise ValueError(f"{key} must be an integer in [{lo}, {hi}], got {value!r}.")
        value = int(value)
    if not lo <= value <= hi:
        raise ValueError(f"{key} must be in [{lo}, {hi}], got {value}.")
    return value


def _float(params: dict, key: str, lo: float, hi: float, *, lo_open: bool = False) -> float:
    value = params[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{key} must be a number, got {value!r}.")
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"{key} must be a finite number, got {value!r}.")
    if value < lo or value > hi or (lo_open and value == lo):
        bracket = "(" if lo_open else "["
        raise ValueError(f"{key} must be in {bracket}{lo:g}, {hi:g}], got {value:g}.")
    return value


def _size_list(sizes) -> str:
    return ", ".join(f"{w}x{h}" for w, h in sizes)


def _validate_canvas(params: dict, limits: Limits) -> None:
    width = _int(params, "width", 16, 4096)
    height = _int(params, "height", 16, 4096)
    allowed = list(limits.resolutions)
    if (width, height) in allowed:
        return
    if width % 16 or height % 16:
        raise ValueError(
            f"Size {width}x{height} is not a multiple of 16 (the VAE's spatial factor). "
            f"Allowed sizes (WxH): {_size_list(allowed)}."
        )
    raise ValueError(f"Size {width}x{height} is not allowed for this model. Allowed sizes (WxH): {_size_list(allowed)}.")


def _validate_frames(params: dict, mode: str, limits: Limits) -> None:
    lo, hi = limits.frame_range
    value = params["num_frames"]
    if mode == "t2i":
        if value != 1 or isinstance(value, bool):
            raise ValueError(f"num_frames must be 1 for text-to-image, got {value!r}.")
        params["num_frames"] = 1
        return
    frames = _int(params, "num_frames", 1, 100_000)
    step = limits.frame_step
    if (frames - 1) % step:
        below = max(lo, frames - (frames - 1) % step)
        raise ValueError(
            f"num_frames must be 4k+1 (the VAE compresses time 4x), got {frames}; "
            f"allowed: {lo}..{hi} in steps of {step}, e.g. {below} or {min(hi, below + step)}."
        )
    if not lo <= frames <= hi:
        raise ValueError(f"num_frames must be in {lo}..{hi} (4k+1) for this model, got {frames}.")
    params["num_frames"] = frames


def _validate_interval(value, limits: Limits) -> list[float] | None:
    if value is None:
        return None
    low, high = limits.guidance_interval
    if (
        not isinstance(value, (list, tuple))
        or len(value) != 2
        or any(isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) for v in value)
    ):
        raise ValueError(f"guidance_interval must be null or [lo, hi] with {low:g} <= lo < hi <= {high:g}, got {value!r}.")
    lo, hi = float(value[0]), float(value[1])
    if not low <= lo < hi <= high:
        raise ValueError(f"guidance_interval must satisfy {low:g} <= lo < hi <= {high:g}, got [{lo:g}, {hi:g}].")
    return [lo, hi]


def _validate_action(info: VariantInfo, action, params: dict) -> dict:
    if not isinstance(action, dict):
        raise ValueError(f"action must be an object with keys {list(ACTION_KEYS)}, got {type(action).__name__}.")
    unknown = sorted(set(action) - set(ACTION_KEYS))
    if unknown:
        raise ValueError(f"Unknown action keys {unknown}; allowed: {list(ACTION_KEYS)}.")
    kind = action.get("kind")
    if kind not in ACTION_KINDS:
        raise ValueError(f"action.kind must be one of {list(ACTION_KINDS)}, got {kind!r}.")
    domain_name = action.get("domain")
    if domain_name not in ACTION_DOMAINS:
        raise ValueError(f"Unknown action domain {domain_name!r}; allowed: {list(SUPPORTED_DOMAINS)}.")
    domain = ACTION_DOMAINS[domain_name]
    if not domain.supported:
        raise ValueError(
            f"Action domain {domain_name!r} has no fixed action width ({domain.note}), so it cannot be used for "
            f"inference; allowed: {list(SUPPORTED_DOMAINS)}."
        )
    model_width = info.action_dim or MODEL_ACTION_WIDTH
    if domain.raw_dim > model_width:
        raise ValueError(f"Domain {domain_name!r} needs {domain.raw_dim} action channels; this model has {model_width}.")
    out = {"kind": kind, "domain": domain_name}
    chunk = action.get("chunk_size", domain.typical_chunk)
    out["chunk_size"] = _int({"action.chunk_size": chunk}, "action.chunk_size", *CHUNK_RANGE)
    if out["chunk_size"] % 4:
        raise ValueError(
            f"action.chunk_size must be a multiple of 4 (the video has chunk_size + 1 = 4k+1 frames), "
            f"got {out['chunk_size']}."
        )
    tier = action.get("resolution_tier", DEFAULT_ACTION_TIER)
    if isinstance(tier, bool) or tier not in RESOLUTION_TIERS:
        raise ValueError(f"action.resolution_tier must be one of {sorted(RESOLUTION_TIERS)}, got {tier!r}.")
    out["resolution_tier"] = int(tier)
    view = action.get("view_point", "ego_view")
    if view not in VIEW_POINTS:
        raise ValueError(f"action.view_point must be one of {list(VIEW_POINTS)}, got {view!r}.")
    out["view_point"] = view
    actions = action.get("actions")
    if kind == "forward_dynamics":
        out["actions"] = validate_action_array(actions, domain_name, model_width)
    elif actions is not None:
        raise ValueError(f"action.actions is only used by forward_dynamics; {kind} predicts or infers the actions.")
    else:
        out["actions"] = None
    if kind == "inverse_dynamics":
        if params.get("video") is None:
            raise ValueError("inverse_dynamics needs a conditioning video (request key 'video').")
        if params.get("image") is not None:
            raise ValueError("inverse_dynamics takes a video, not an image; remove 'image'.")
    elif params.get("image") is None and params.get("video") is None:
        raise ValueError(f"{kind} needs a first frame: give 'image' (or a 'video', whose first frame is used).")
    elif params.get("image") is not None and params.get("video") is not None:
        raise ValueError(f"{kind} takes either 'image' or 'video', not both.")
    return out


def validate_action_array(actions, domain_name: str, model_width: int = MODEL_ACTION_WIDTH) -> list[list[float]]:
    """Check a forward-dynamics action array `[T, D]` against the domain's raw width."""
    width = ACTION_DOMAINS[domain_name].raw_dim
    if not isinstance(actions, (list, tuple)) or not actions:
        raise ValueError(f"forward_dynamics needs action.actions as a non-empty list of rows [T, {width}].")
    rows = []
    for t, row in enumerate(actions):
        if not isinstance(row, (list, tuple)):
            raise ValueError(f"action.actions[{t}] must be a list of {width} numbers, got {type(row).__name__}.")
        if len(row) > model_width:
            raise ValueError(
                f"action.actions rows have {len(row)} values, wider than the model's action width {model_width}."
            )
        if len(row) != width:
            raise ValueError(
                f"action.actions[{t}] has {len(row)} values; domain {domain_name!r} takes exactly {width}."
            )
        values = []
        for value in row:
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise ValueError(f"action.actions[{t}] holds a non-finite or non-numeric value {value!r}.")
            values.append(float(value))
        rows.append(values)
    if len(rows) > CHUNK_RANGE[1]:
        raise ValueError(f"action.actions has {len(rows)} rows; at most {CHUNK_RANGE[1]} are used.")
    return rows


def validate_request(info: VariantInfo, mode: str, params: dict) -> dict:
    """Fill in defaults for `mode` and refuse anything this checkpoint cannot run.

    Raises ValueError with a message that says what was received and what is allowed.
    """
    if mode not in REQUEST_MODES:
        raise ValueError(f"Unknown mode {mode!r}; allowed: {list(REQUEST_MODES)}.")
    if not info.supports(mode):
        raise ValueError(
            f"This {info.family} checkpoint{' (distilled)' if info.is_distilled else ''} does not support mode "
            f"{mode!r}; it supports: {[m for m in info.modes if m != 'sound']}."
        )
    if not isinstance(params, dict):
        raise ValueError(f"The request must be a JSON object, got {type(params).__name__}.")
    unknown = sorted(set(params) - set(REQUEST_KEYS))
    if unknown:
        raise ValueError(f"Unknown request keys {unknown}; allowed: {list(REQUEST_KEYS)}.")
    if params.get("mode", mode) != mode:
        raise ValueError(f"The request says mode {params['mode']!r} but was submitted as {mode!r}.")

    defaults = sampling_defaults(info, mode)
    limits = sampling_limits(info, mode)
    out: dict[str, Any] = {k: defaults[k] for k in ("width", "height", "num_frames", "fps", "steps",
                                                     "guidance_scale", "guidance_interval", "flow_shift")}
    out.update({"mode": mode, "prompt": "", "negative_prompt": "", "seed": -1, "image": None, "video": None,
                "sound": False, "action": None})
    for key, value in params.items():
        if value is not None or key in ("guidance_interval", "image", "video", "action"):
            out[key] = value

    prompt, negative = out["prompt"], out["negative_prompt"]
    if not isinstance(prompt, str):
        raise ValueError(f"prompt must be a string, got {type(prompt).__name__}.")
    if not isinstance(negative, str):
        raise ValueError(f"negative_prompt must be a string, got {type(negative).__name__}.")
    for key, text in (("prompt", prompt), ("negative_prompt", negative)):
        if len(text) > limits.prompt_chars:
            raise ValueError(f"{key} is {len(text)} characters long; at most {limits.prompt_chars} are allowed.")
        if "\x00" in text:
            raise ValueError(f"{key} contains a NUL character.")
    if mode != "action" and not prompt.strip():
        raise ValueError("prompt is empty; describe the image or video (prose or a JSON caption).")
    # A caption that does not parse is refused here, before it waits in the queue.
    parse_caption(prompt, "prompt")
    parse_caption(negative, "negative_prompt")

    out["seed"] = _int(out, "seed", *limits.seed)
    out["fps"] = _float(out, "fps", *limits.fps, lo_open=True)
    out["steps"] = _int(out, "steps", *limits.steps)
    out["guidance_scale"] = _float(out, "guidance_scale", *limits.guidance_scale)
    out["flow_shift"] = _float(out, "flow_shift", *limits.flow_shift, lo_open=True)
    out["guidance_interval"] = _validate_interval(out["guidance_interval"], limits)
    if not isinstance(out["sound"], bool):
        raise ValueError(f"sound must be true or false, got {out['sound']!r}.")

    if not info.is_distilled and not distinct_timesteps(out["flow_shift"], out["steps"]):
        raise ValueError(
            f"With flow_shift {out['flow_shift']:g}, {out['steps']} steps repeat timesteps near t = 1000 and the "
            f"scheduler cannot run them; at most {max_distinct_steps(out['flow_shift'])} steps are allowed at this shift."
        )
    if info.is_distilled:
        fixed = len(info.distilled_sigmas)
        if out["steps"] != fixed:
            raise ValueError(
                f"This distilled checkpoint runs exactly {fixed} steps (its fixed sigmas "
                f"{list(info.distilled_sigmas)}); got steps={out['steps']}."
            )
        if out["guidance_scale"] != 1.0:
            raise ValueError(
                f"This distilled checkpoint has guidance baked into its weights: guidance_scale must be 1.0, "
                f"got {out['guidance_scale']:g}."
            )
        if out["flow_shift"] != 1.0:
            raise ValueError(f"This distilled checkpoint uses its sigmas as given: flow_shift must be 1.0, got {out['flow_shift']:g}.")
        out["guidance_interval"] = None
        out["negative_prompt"] = ""

    if mode == "action":
        out["action"] = _validate_action(info, out["action"], out)
        domain = ACTION_DOMAINS[out["action"]["domain"]]
        if "fps" not in params or params["fps"] is None:
            out["fps"] = domain.typical_fps
        out["num_frames"] = out["action"]["chunk_size"] + 1
        if out["sound"]:
            raise ValueError("sound is not available in action mode.")
        return out

    if out["action"] is not None:
        raise ValueError(f"action is only used in mode 'action', not {mode!r}.")
    _validate_canvas(out, limits)
    _validate_frames(out, mode, limits)
    if mode == "i2v" and out["image"] is None:
        raise ValueError("image-to-video needs a conditioning image (request key 'image').")
    if mode != "i2v" and out["image"] is not None:
        raise ValueError(f"image is only used by i2v and action, not {mode!r}.")
    if mode == "v2v" and out["video"] is None:
        raise ValueError("video-to-video needs a conditioning video (request key 'video').")
    if mode != "v2v" and out["video"] is not None:
        raise ValueError(f"video is only used by v2v and action, not {mode!r}.")
    if out["sound"]:
        if "sound" not in info.modes:
            raise ValueError(f"This {info.family} checkpoint cannot generate sound; it supports: {list(info.modes)}.")
        if mode == "t2i":
            raise ValueError("sound needs a video mode (t2v, i2v or v2v), not t2i.")
    return out
