"""One request, validated once: `validate_request` turns a request dict into a frozen `Request`.

Validation runs as small steps, in order: fill (defaults for the mode), text (prompt and negative
prompt, each caption parsed and type-checked once), sampling (seed, fps, steps, guidance, shift,
interval), distilled rules, media (action, canvas, frames, conditioning inputs, sound). Every refusal
is a `RequestError` naming the request key it is about (`.field`) and quoting what was received and
what is allowed. The `Request` carries the parsed captions, so nothing downstream parses again.

It lives in the pipeline (not beside the table in `engine.model.defaults`) because it parses captions,
which is pipeline knowledge; the limits it enforces come from `sampling_limits` on the model floor.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from types import MappingProxyType
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
    VAE_SPATIAL,
    Limits,
    distinct_timesteps,
    max_distinct_steps,
    quote_number,
    render_frames,
    render_interval,
    render_range,
    sampling_defaults,
    sampling_limits,
    steps_cap,
)
from ..model.variants import REQUEST_MODES, VariantInfo
from . import captions

REQUEST_KEYS = (
    "mode", "prompt", "negative_prompt", "width", "height", "num_frames", "fps", "steps", "guidance_scale",
    "guidance_interval", "flow_shift", "seed", "image", "video", "sound", "action", "fit",
)
# How a conditioning image or video is fitted to the canvas when their aspects differ. The default
# is what the reference pipeline does: an image is scaled to cover and centre-cropped, a video resized.
FITS = ("crop", "letterbox", "resize")
DEFAULT_FIT = {"i2v": "crop", "v2v": "resize"}
ACTION_KEYS = ("kind", "domain", "chunk_size", "resolution_tier", "view_point", "actions")


class RequestError(ValueError):
    """A refused request. `field` is the request key it is about ("steps", "image", "action.domain",
    "prompt.subjects[0].age", or "" for the request as a whole); the message says what was received
    and what is allowed. `errors` lists every refusal of the request, this one first (validation
    checks every field before it refuses, so a form shows all of its bad fields at once); a refusal
    of one field alone lists itself."""

    def __init__(self, field: str, message: str, errors: list["RequestError"] | None = None):
        super().__init__(message)
        self.field = field
        self.errors: list[RequestError] = list(errors) if errors else [self]

    @classmethod
    def of_all(cls, errors: list["RequestError"]) -> "RequestError":
        """One refusal that carries every one of `errors`: the first's field, all their messages."""
        if len(errors) == 1:
            return errors[0]
        return cls(errors[0].field, " ".join(str(e) for e in errors), errors)


class _Refusals:
    """Collects the refusals of one request, so every independent check runs before it is refused."""

    def __init__(self):
        self.errors: list[RequestError] = []

    def check(self, check, *args, default=None, **kwargs):
        """`check(*args, **kwargs)`, or `default` when it refuses (the refusal is kept)."""
        try:
            return check(*args, **kwargs)
        except RequestError as exc:
            self.errors.extend(exc.errors)
            return default

    def refuse(self) -> None:
        if self.errors:
            raise RequestError.of_all(self.errors)


@dataclass(frozen=True, eq=False)
class Request(Mapping):
    """A validated request: every key filled and checked for one checkpoint and mode.

    Made only by `validate_request`. It reads as a mapping of the request keys too (`request["fps"]`,
    `dict(request)`), giving plain JSON values (a list interval, a dict action), so the sidecar and the
    `/generate` result show exactly what ran. `caption` / `negative_caption` are the parsed JSON
    captions (None for prose), parsed once here.
    """

    mode: str
    prompt: str
    negative_prompt: str
    width: int
    height: int
    num_frames: int
    fps: float
    steps: int
    guidance_scale: float
    guidance_interval: tuple[float, float] | None
    flow_shift: float
    seed: int
    image: Any
    video: Any
    sound: bool
    action: Mapping | None  # read-only; rows of `actions` as tuples
    fit: str | None = None  # i2v/v2v: how the upload meets the canvas (FITS); None where there is none
    caption: Mapping | None = field(default=None, repr=False)
    negative_caption: Mapping | None = field(default=None, repr=False)

    def __getitem__(self, key: str) -> Any:
        if key not in REQUEST_KEYS:
            raise KeyError(key)
        return _plain(getattr(self, key))

    def __iter__(self):
        return iter(REQUEST_KEYS)

    def __len__(self) -> int:
        return len(REQUEST_KEYS)

    def to_dict(self) -> dict[str, Any]:
        """The request as a plain dict (what `validate_request` used to return)."""
        return {key: self[key] for key in REQUEST_KEYS}

    def caption_of(self, key: str) -> dict | None:
        """A fresh plain copy of the parsed caption of "prompt" or "negative_prompt" (None for prose)."""
        return _plain(self.caption if key == "prompt" else self.negative_caption)

    def __reduce__(self):
        # Pickles as plain values (the read-only views do not pickle), e.g. into a ZeroGPU worker process.
        return _rebuild, ({f.name: _plain(getattr(self, f.name)) for f in fields(self)},)

    def replace(self, **changes) -> "Request":
        """A copy with resolved values (e.g. the seed actually used); not a way around validation."""
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        values.update(changes)
        return Request(**values)


def _rebuild(values: dict) -> Request:
    interval = values["guidance_interval"]
    frozen = {k: _frozen(values[k]) for k in ("action", "caption", "negative_caption")}
    return Request(**{**values, **frozen, "guidance_interval": tuple(interval) if interval else None})


def _plain(value: Any) -> Any:
    if isinstance(value, Mapping) and not isinstance(value, Request):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    return value


def _frozen(value: Any) -> Any:
    if isinstance(value, dict):
        return MappingProxyType({k: _frozen(v) for k, v in value.items()})
    if isinstance(value, list):
        return tuple(_frozen(v) for v in value)
    return value


def _int(params: dict, key: str, lo: int, hi: int) -> int:
    value = params[key]
    allowed = render_range(lo, hi)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise RequestError(key, f"{key} must be an integer {allowed}, got {value!r}.")
    if isinstance(value, float):
        if not math.isfinite(value) or value != int(value):
            raise RequestError(key, f"{key} must be an integer {allowed}, got {quote_number(value)}.")
        value = int(value)
    if not lo <= value <= hi:
        raise RequestError(key, f"{key} must be {allowed}, got {quote_number(value)}.")
    return value


def _float(params: dict, key: str, lo: float, hi: float, *, lo_open: bool = False) -> float:
    value = params[key]
    allowed = render_range(lo, hi, lo_open=lo_open)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise RequestError(key, f"{key} must be a number {allowed}, got {value!r}.")
    typed = quote_number(value)
    value = float(value)
    if not math.isfinite(value):
        raise RequestError(key, f"{key} must be a finite number {allowed}, got {typed}.")
    if value < lo or value > hi or (lo_open and value == lo):
        raise RequestError(key, f"{key} must be {allowed}, got {typed}.")
    return value


def _size_list(sizes) -> str:
    return ", ".join(f"{w}x{h}" for w, h in sizes)


def _validate_canvas(params: dict, limits: Limits) -> None:
    width = _int(params, "width", VAE_SPATIAL, 4096)
    height = _int(params, "height", VAE_SPATIAL, 4096)
    allowed = list(limits.resolutions)
    if (width, height) in allowed:
        return
    if width % VAE_SPATIAL or height % VAE_SPATIAL:
        raise RequestError(
            "width",
            f"Size {width}x{height} is not a multiple of {VAE_SPATIAL} (the VAE's spatial factor). "
            f"Allowed sizes (WxH): {_size_list(allowed)}."
        )
    raise RequestError("width", f"Size {width}x{height} is not allowed for this model. Allowed sizes (WxH): {_size_list(allowed)}.")


def _validate_frames(params: dict, mode: str, limits: Limits) -> None:
    lo, hi = limits.frame_range
    value = params["num_frames"]
    if mode == "t2i":
        if value != 1 or isinstance(value, bool):
            raise RequestError("num_frames", f"num_frames must be 1 for text-to-image, got {quote_number(value)}.")
        params["num_frames"] = 1
        return
    frames = _int(params, "num_frames", 1, 100_000)
    step = limits.frame_step
    allowed = render_frames(lo, hi, step)
    if (frames - 1) % step:
        below = max(lo, frames - (frames - 1) % step)
        raise RequestError(
            "num_frames",
            f"num_frames must be in {allowed} ({step}k+1: the VAE compresses time {step}x), got {frames}; "
            f"e.g. {below} or {min(hi, below + step)}."
        )
    if not lo <= frames <= hi:
        raise RequestError("num_frames", f"num_frames must be in {allowed} for this model, got {frames}.")
    params["num_frames"] = frames


def _validate_interval(value, limits: Limits) -> list[float] | None:
    if value is None:
        return None
    allowed = render_interval(*limits.guidance_interval)
    low, high = limits.guidance_interval
    if (
        not isinstance(value, (list, tuple))
        or len(value) != 2
        or any(isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) for v in value)
    ):
        raise RequestError("guidance_interval", f"guidance_interval must be null or [lo, hi] with {allowed}, got {value!r}.")
    lo, hi = float(value[0]), float(value[1])
    if not low <= lo < hi <= high:
        raise RequestError("guidance_interval", f"guidance_interval must satisfy {allowed}, got "
                                                f"[{quote_number(value[0])}, {quote_number(value[1])}].")
    return [lo, hi]


def _validate_action(info: VariantInfo, action, params: dict) -> dict:
    if not isinstance(action, dict):
        raise RequestError("action", f"action must be an object with keys {list(ACTION_KEYS)}, got {type(action).__name__}.")
    unknown = sorted(set(action) - set(ACTION_KEYS))
    if unknown:
        raise RequestError("action", f"Unknown action keys {unknown}; allowed: {list(ACTION_KEYS)}.")
    kind = action.get("kind")
    if kind not in ACTION_KINDS:
        raise RequestError("action.kind", f"action.kind must be one of {list(ACTION_KINDS)}, got {kind!r}.")
    domain_name = action.get("domain")
    if not isinstance(domain_name, str) or domain_name not in ACTION_DOMAINS:  # a list would not hash
        raise RequestError("action.domain", f"Unknown action domain {domain_name!r}; allowed: {list(SUPPORTED_DOMAINS)}.")
    domain = ACTION_DOMAINS[domain_name]
    if not domain.supported:
        raise RequestError(
            "action.domain",
            f"Action domain {domain_name!r} has no fixed action width ({domain.note}), so it cannot be used for "
            f"inference; allowed: {list(SUPPORTED_DOMAINS)}."
        )
    model_width = info.action_dim or MODEL_ACTION_WIDTH
    if domain.raw_dim > model_width:
        raise RequestError("action.domain", f"Domain {domain_name!r} needs {domain.raw_dim} action channels; this model has {model_width}.")
    out = {"kind": kind, "domain": domain_name}
    chunk = action.get("chunk_size", domain.typical_chunk)
    out["chunk_size"] = _int({"action.chunk_size": chunk}, "action.chunk_size", *CHUNK_RANGE)
    if out["chunk_size"] % 4:
        raise RequestError(
            "action.chunk_size",
            f"action.chunk_size must be a multiple of 4 (the video has chunk_size + 1 = 4k+1 frames), "
            f"got {out['chunk_size']}."
        )
    tier = action.get("resolution_tier", DEFAULT_ACTION_TIER)
    if isinstance(tier, bool) or not isinstance(tier, (int, float)) or tier not in RESOLUTION_TIERS:
        raise RequestError("action.resolution_tier", f"action.resolution_tier must be one of {sorted(RESOLUTION_TIERS)}, got {tier!r}.")
    out["resolution_tier"] = int(tier)
    view = action.get("view_point", "ego_view")
    if not isinstance(view, str) or view not in VIEW_POINTS:
        raise RequestError("action.view_point", f"action.view_point must be one of {list(VIEW_POINTS)}, got {view!r}.")
    out["view_point"] = view
    actions = action.get("actions")
    if kind == "forward_dynamics":
        out["actions"] = validate_action_array(actions, domain_name, model_width)
    elif actions is not None:
        raise RequestError("action.actions", f"action.actions is only used by forward_dynamics; {kind} predicts or infers the actions.")
    else:
        out["actions"] = None
    if kind == "inverse_dynamics":
        if params.get("video") is None:
            raise RequestError("video", "inverse_dynamics needs a conditioning video (request key 'video').")
        if params.get("image") is not None:
            raise RequestError("image", "inverse_dynamics takes a video, not an image; remove 'image'.")
    elif params.get("image") is None and params.get("video") is None:
        raise RequestError("image", f"{kind} needs a first frame: give 'image' (or a 'video', whose first frame is used).")
    elif params.get("image") is not None and params.get("video") is not None:
        raise RequestError("image", f"{kind} takes either 'image' or 'video', not both.")
    return out


def validate_action_array(actions, domain_name: str, model_width: int = MODEL_ACTION_WIDTH) -> list[list[float]]:
    """Check a forward-dynamics action array `[T, D]` against the domain's raw width."""
    width = ACTION_DOMAINS[domain_name].raw_dim
    if not isinstance(actions, (list, tuple)) or not actions:
        raise RequestError("action.actions", f"forward_dynamics needs action.actions as a non-empty list of rows [T, {width}].")
    rows = []
    for t, row in enumerate(actions):
        if not isinstance(row, (list, tuple)):
            raise RequestError("action.actions", f"action.actions[{t}] must be a list of {width} numbers, got {type(row).__name__}.")
        if len(row) > model_width:
            raise RequestError(
            "action.actions",
                f"action.actions rows have {len(row)} values, wider than the model's action width {model_width}."
            )
        if len(row) != width:
            raise RequestError(
            "action.actions",
                f"action.actions[{t}] has {len(row)} values; domain {domain_name!r} takes exactly {width}."
            )
        values = []
        for value in row:
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise RequestError("action.actions", f"action.actions[{t}] holds a non-finite or non-numeric value {value!r}.")
            values.append(float(value))
        rows.append(values)
    if len(rows) > CHUNK_RANGE[1]:
        raise RequestError("action.actions", f"action.actions has {len(rows)} rows; at most {CHUNK_RANGE[1]} are used.")
    return rows


def validate_request(info: VariantInfo, mode: str, params: Mapping) -> Request:
    """Fill in defaults for `mode` and refuse anything this checkpoint cannot run, once.

    Raises `RequestError` (a ValueError) naming the field, what was received and what is allowed.
    A `Request` given back in is returned as it is: it was validated when it was made.
    """
    if isinstance(params, Request):
        if params.mode != mode:
            raise RequestError("mode", f"The request says mode {params.mode!r} but was submitted as {mode!r}.")
        return params
    _check_mode(info, mode)
    limits = sampling_limits(info, mode)
    out = _fill(info, mode, params)
    # Every field is checked before the request is refused, so a form learns all of its mistakes at once.
    refusals = _Refusals()
    caption, negative_caption = refusals.check(_check_text, out, mode, limits, default=(None, None))
    _check_sampling(out, info, limits, refusals)
    if info.is_distilled:
        _apply_distilled(out, info, refusals)
    _check_media(out, info, mode, params, limits, refusals)
    refusals.refuse()
    return Request(**out, caption=_frozen(caption), negative_caption=_frozen(negative_caption))


def _check_mode(info: VariantInfo, mode: str) -> None:
    if mode not in REQUEST_MODES:
        raise RequestError("mode", f"Unknown mode {mode!r}; allowed: {list(REQUEST_MODES)}.")
    if not info.supports(mode):
        raise RequestError(
            "mode",
            f"This {info.family} checkpoint{' (distilled)' if info.is_distilled else ''} does not support mode "
            f"{mode!r}; it supports: {[m for m in info.modes if m != 'sound']}.",
        )


def _fill(info: VariantInfo, mode: str, params: Mapping) -> dict[str, Any]:
    """Step 1: the mode's defaults, then the request's own keys (unknown keys refused)."""
    if not isinstance(params, Mapping):
        raise RequestError("", f"The request must be a JSON object, got {type(params).__name__}.")
    unknown = sorted(set(params) - set(REQUEST_KEYS))
    if unknown:
        raise RequestError(unknown[0], f"Unknown request keys {unknown}; allowed: {list(REQUEST_KEYS)}.")
    if params.get("mode", mode) != mode:
        raise RequestError("mode", f"The request says mode {params['mode']!r} but was submitted as {mode!r}.")
    defaults = sampling_defaults(info, mode)
    out: dict[str, Any] = {k: defaults[k] for k in ("width", "height", "num_frames", "fps", "steps",
                                                     "guidance_scale", "guidance_interval", "flow_shift")}
    out.update({"mode": mode, "prompt": "", "negative_prompt": "", "seed": -1, "image": None, "video": None,
                "sound": False, "action": None, "fit": DEFAULT_FIT.get(mode)})
    for key, value in params.items():
        if value is not None or key in ("guidance_interval", "image", "video", "action"):
            out[key] = value
    return out


def _parse_text(key: str, text: str, mode: str) -> dict | None:
    """The caption if `text` is a JSON caption (parsed and type-checked), None for prose.

    Text that starts like JSON but does not parse is an error, not prose: sending a broken caption
    to the model as a sentence would silently waste the user's run.
    """
    if not captions.looks_like_json(text):
        return None
    try:
        caption = captions.parse_caption(text)
    except captions.CaptionParseError as exc:
        raise RequestError(key, f"{key} looks like a JSON caption but is not valid: {exc}") from exc
    if mode == "action":  # the action caption is built from the instruction; no caption schema applies
        return caption
    errors = [i for i in captions.validate_caption(caption, captions.kind_for_mode(mode)) if i.severity == "error"]
    if errors:
        raise RequestError(f"{key}.{errors[0].path}", f"{key}: {captions.describe_field_errors(errors)}")
    return caption


def _check_text(out: dict, mode: str, limits: Limits) -> tuple[dict | None, dict | None]:
    """Step 2: prompt and negative prompt are strings of bounded length; JSON captions parse once."""
    refusals = _Refusals()
    for key in ("prompt", "negative_prompt"):
        refusals.check(_check_string, out[key], key, limits)
    if refusals.errors:
        refusals.refuse()
    if mode != "action" and not out["prompt"].strip():
        refusals.errors.append(RequestError("prompt", "prompt is empty; describe the image or video (prose or a JSON caption)."))
    # A caption that does not parse, or has a wrongly typed field, is refused here, before it queues.
    caption = refusals.check(_parse_text, "prompt", out["prompt"], mode)
    negative = refusals.check(_parse_text, "negative_prompt", out["negative_prompt"], mode)
    refusals.refuse()
    return caption, negative


def _check_string(text, key: str, limits: Limits) -> None:
    if not isinstance(text, str):
        raise RequestError(key, f"{key} must be a string, got {type(text).__name__}.")
    if len(text) > limits.prompt_chars:
        raise RequestError(key, f"{key} is {len(text)} characters long; at most {limits.prompt_chars} are allowed.")
    if "\x00" in text:
        raise RequestError(key, f"{key} contains a NUL character.")


def _check_sampling(out: dict, info: VariantInfo, limits: Limits, refusals: _Refusals) -> None:
    """Step 3: seed, fps, steps, guidance, shift and interval inside the limits (each refusal kept)."""
    checked = {
        "seed": refusals.check(_int, out, "seed", *limits.seed),
        "fps": refusals.check(_float, out, "fps", *limits.fps, lo_open=True),
        "steps": refusals.check(_int, out, "steps", *limits.steps),
        "guidance_scale": refusals.check(_float, out, "guidance_scale", *limits.guidance_scale),
        "flow_shift": refusals.check(_float, out, "flow_shift", *limits.flow_shift, lo_open=True),
    }
    out.update({key: value for key, value in checked.items() if value is not None})
    interval = refusals.check(_validate_interval, out["guidance_interval"], limits)
    out["guidance_interval"] = tuple(interval) if interval else None
    if not isinstance(out["sound"], bool):
        refusals.errors.append(RequestError("sound", f"sound must be true or false, got {out['sound']!r}."))
    if checked["flow_shift"] is None or info.is_distilled:
        return  # the steps a shift allows are only worth saying once the shift is a number in range
    if checked["steps"] is None:
        # The range refused says the table's limit; the shift's own cap is said too, as the hint says it.
        refusal = next(e for e in refusals.errors if e.field == "steps")
        most = max_distinct_steps(out["flow_shift"])
        if most < limits.steps[1] and isinstance(out["steps"], (int, float)) and out["steps"] > most:
            refusal.args = (f"{str(refusal).rstrip('.')}; {steps_cap(most, out['flow_shift'])}.",)
        return
    if not distinct_timesteps(out["flow_shift"], out["steps"]):
        refusals.errors.append(RequestError(
            "steps",
            f"With flow_shift {quote_number(out['flow_shift'])}, {out['steps']} steps repeat timesteps near t = 1000 "
            f"and the scheduler cannot run them; {steps_cap(max_distinct_steps(out['flow_shift']), out['flow_shift'])}.",
        ))


def _apply_distilled(out: dict, info: VariantInfo, refusals: _Refusals) -> None:
    """Step 4: a distilled checkpoint runs its own sigmas with guidance baked in (a field already
    refused for its range is not refused twice)."""
    fixed = len(info.distilled_sigmas)
    refused = {e.field for e in refusals.errors}
    rules = (
        ("steps", fixed, f"This distilled checkpoint runs exactly {fixed} steps (its fixed sigmas "
                         f"{list(info.distilled_sigmas)}); got steps={quote_number(out['steps'])}."),
        ("guidance_scale", 1.0, "This distilled checkpoint has guidance baked into its weights: guidance_scale must "
                                f"be 1.0, got {quote_number(out['guidance_scale'])}."),
        ("flow_shift", 1.0, "This distilled checkpoint uses its sigmas as given: flow_shift must be 1.0, got "
                            f"{quote_number(out['flow_shift'])}."),
    )
    for key, wanted, message in rules:
        if key not in refused and out[key] != wanted:
            refusals.errors.append(RequestError(key, message))
    out["guidance_interval"] = None
    out["negative_prompt"] = ""


def _check_media(out: dict, info: VariantInfo, mode: str, params: Mapping, limits: Limits,
                 refusals: _Refusals) -> None:
    """Step 5: the action, the canvas and frames, the conditioning inputs and sound, per mode."""
    if mode == "action":
        refusals.check(_check_action, out, info, params)
        refusals.check(_validate_fit, out, mode)  # the action canvas fits its input its own way
        return
    if out["action"] is not None:
        refusals.errors.append(RequestError("action", f"action is only used in mode 'action', not {mode!r}."))
    refusals.check(_validate_canvas, out, limits)
    refusals.check(_validate_frames, out, mode, limits)
    refusals.check(_validate_fit, out, mode)
    for key, needs in (("image", "i2v"), ("video", "v2v")):
        if mode == needs and out[key] is None:
            what = "image-to-video needs a conditioning image" if key == "image" else "video-to-video needs a conditioning video"
            refusals.errors.append(RequestError(key, f"{what} (request key {key!r})."))
        if mode != needs and out[key] is not None:
            refusals.errors.append(RequestError(key, f"{key} is only used by {needs} and action, not {mode!r}."))
    if out["sound"] is True:
        if "sound" not in info.modes:
            refusals.errors.append(RequestError(
                "sound", f"This {info.family} checkpoint cannot generate sound; it supports: {list(info.modes)}."))
        elif mode == "t2i":
            refusals.errors.append(RequestError("sound", "sound needs a video mode (t2v, i2v or v2v), not t2i."))


def _validate_fit(out: dict, mode: str) -> None:
    fit = out["fit"]
    if mode not in DEFAULT_FIT:
        if fit is not None:
            raise RequestError("fit", f"fit is only used with a conditioning image or video (i2v, v2v), not {mode!r}.")
        return
    if fit not in FITS:
        raise RequestError("fit", f"fit must be one of {list(FITS)}, got {fit!r}.")


def _check_action(out: dict, info: VariantInfo, params: Mapping) -> None:
    action = _validate_action(info, out["action"], out)
    if params.get("fps") is None:
        out["fps"] = ACTION_DOMAINS[action["domain"]].typical_fps
    out["num_frames"] = action["chunk_size"] + 1
    if out["sound"]:
        raise RequestError("sound", "sound is not available in action mode.")
    out["action"] = _frozen(action)
