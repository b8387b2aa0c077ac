"""What each control shows for a model and a mode, as plain data.

Everything here is computed from `engine.sampling_defaults` and the model's `VariantInfo` (through
the registry's `describe`), so the UI never carries a table of its own. `layout.py` turns these
specs into Gradio updates; tests check them without starting a server.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from engine.model.action import (
    ACTION_DOMAINS,
    ACTION_KINDS,
    CHUNK_RANGE,
    MODEL_ACTION_WIDTH,
    RESOLUTION_TIERS,
    SUPPORTED_DOMAINS,
    VIEW_POINTS,
)
from engine.model.defaults import (
    DEFAULT_FPS,
    FRAME_STEP,
    T2I_GUIDANCE_INTERVAL,
    Limits,
    max_distinct_steps,
    render_frames,
    render_interval,
    render_range,
    steps_cap,
)

TAB_MODES = {"t2i": "Text to Image", "t2v": "Text to Video", "action": "Action"}
MODE_NAMES = {
    "t2i": "text to image", "t2v": "text to video", "i2v": "image to video", "v2v": "video to video",
    "action": "action", "sound": "sound",
}
KIND_LABELS = {
    "policy": "Policy: image -> future video + actions",
    "forward_dynamics": "Forward dynamics: image + actions -> video",
    "inverse_dynamics": "Inverse dynamics: video -> actions",
}
VIEW_LABELS = {
    "ego_view": "Ego (first person)", "third_person_view": "Third person", "wrist_view": "Wrist camera",
    "concat_view": "Concatenated views",
}
NEGATIVE_UNUSED = "Distilled checkpoints do not use a negative prompt."
DISTILLED_NOTE = (
    "This is a distilled (few-step) checkpoint: it runs exactly its {steps} fixed sigmas {sigmas} with "
    "guidance baked into the weights, so steps, guidance and flow shift are fixed and the negative prompt "
    "is not used."
)


def size_label(width: int, height: int) -> str:
    return f"{width}x{height}"


def parse_size(label: str) -> tuple[int, int]:
    """(width, height) from "WxH"; raises ValueError naming the field."""
    text = str(label or "").lower().replace(" ", "")
    parts = text.split("x")
    if len(parts) != 2 or not all(p.isdigit() for p in parts):
        raise ValueError(f"Resolution must be WIDTHxHEIGHT such as 1280x720, got {label!r}.")
    return int(parts[0]), int(parts[1])


SHORT_ASPECT_TERM = 16  # 16:9 is named as it is; 832x480 (26:15) is named by the nearest caption aspect


def _aspect_name(width: int, height: int) -> str:
    """"16:9" when exact and short, else the nearest caption aspect marked approximate ("~16:9")."""
    from math import gcd

    from engine.pipeline.captions import nearest_aspect_ratio

    g = gcd(width, height)
    if max(width // g, height // g) <= SHORT_ASPECT_TERM:
        return f"{width // g}:{height // g}"
    return "~" + nearest_aspect_ratio(width, height).replace(",", ":")


def resolution_choices(resolutions: list[list[int]]) -> list[tuple[str, str]]:
    """Dropdown (label, value) pairs: exactly the sizes the model allows, in the table's order."""
    return [(f"{w} x {h} ({_aspect_name(w, h)})", size_label(w, h)) for w, h in resolutions]


def unsupported_reason(model: dict, mode: str) -> str | None:
    """Why `mode` is off for this model (None when it is available). `model` is `describe()`'s dict."""
    if mode in model["modes"]:
        return None
    if mode in model.get("unavailable", {}):  # a remote engine says why (engine.serving.remote)
        return model["unavailable"][mode]
    family = model["family"].capitalize()
    if model["is_distilled"] and mode in ("action", "sound"):
        return f"Distilled (few-step) checkpoints run the vision modes only; {MODE_NAMES[mode]} needs a full checkpoint."
    if mode == "action":
        return f"This {family} checkpoint has no action head (Cosmos3 Super has none); pick a Nano or Edge model."
    if mode == "sound":
        return f"This {family} checkpoint has no sound tokenizer; sound comes with Nano checkpoints only."
    return f"This {family} checkpoint does not support {MODE_NAMES.get(mode, mode)}."


@dataclass
class SamplingControls:
    """The shared sampling controls of one tab."""

    mode: str
    available: bool
    reason: str | None
    resolution_choices: list[tuple[str, str]]
    resolution: str | None
    frames_range: tuple[int, int] | None  # None for images
    frames: int
    fps: float
    steps: int
    guidance_scale: float
    guidance_interval: tuple[float, float] | None
    show_interval: bool
    flow_shift: float
    locked: bool
    lock_note: str
    negative_enabled: bool
    sound_available: bool = False
    sound_reason: str | None = None
    limits_note: str = ""
    limits: Limits | None = None  # the engine's limits for this mode (None: a model described without them)


def sampling_controls(model: dict, mode: str) -> SamplingControls:
    """Controls for a tab's mode ("t2i", "t2v" or "action") from the model's `describe()` dict."""
    reason = unsupported_reason(model, mode)
    defaults = model["defaults"].get(mode)
    if defaults is None:
        # Unavailable mode: keep the controls readable but empty and disabled.
        return SamplingControls(
            mode=mode, available=False, reason=reason, resolution_choices=[], resolution=None, frames_range=None,
            frames=1, fps=DEFAULT_FPS, steps=1, guidance_scale=1.0, guidance_interval=None, show_interval=False,
            flow_shift=1.0, locked=True, lock_note="", negative_enabled=False,
            limits=(model.get("limits") or {}).get(mode),
        )
    locked = bool(defaults["steps_locked"] or defaults["guidance_locked"])
    lock_note = ""
    if locked:
        sigmas = model.get("distilled_sigmas") or []
        lock_note = DISTILLED_NOTE.format(steps=defaults["steps"], sigmas=sigmas)
    frames_range = None if mode == "t2i" else tuple(defaults["frame_range"])
    interval = tuple(defaults["guidance_interval"]) if defaults["guidance_interval"] else None
    sound_reason = unsupported_reason(model, "sound")
    limits = []
    if mode != "action":
        limits.append("sizes " + ", ".join(size_label(w, h) for w, h in defaults["resolutions"]))
    if frames_range:
        limits.append(f"frames {frames_range[0]}..{frames_range[1]} (4k+1)")
    return SamplingControls(
        mode=mode,
        available=reason is None,
        reason=reason,
        resolution_choices=resolution_choices(defaults["resolutions"]),
        resolution=size_label(defaults["width"], defaults["height"]),
        frames_range=frames_range,
        frames=int(defaults["num_frames"]),
        fps=float(defaults["fps"]),
        steps=int(defaults["steps"]),
        guidance_scale=float(defaults["guidance_scale"]),
        guidance_interval=interval,
        show_interval=mode == "t2i",
        flow_shift=float(defaults["flow_shift"]),
        locked=locked,
        lock_note=lock_note,
        negative_enabled=not model["is_distilled"],
        sound_available=mode == "t2v" and sound_reason is None,
        sound_reason=None if mode != "t2v" else sound_reason,
        limits_note="; ".join(limits),
        limits=(model.get("limits") or {}).get(mode),
    )


# What the interval boxes show while the model has no interval of its own (distilled checkpoints).
INTERVAL_FALLBACK = T2I_GUIDANCE_INTERVAL


def _range(spec: SamplingControls, name: str):
    """One of the engine's ranges for this tab (`engine.Limits`); None where the model came without."""
    return getattr(spec.limits, name) if spec.limits is not None else None


def steps_max(spec: SamplingControls, flow_shift) -> int:
    """The most steps the model runs at this flow shift (the scheduler repeats timesteps beyond it)."""
    if spec.locked:
        return spec.steps
    top = _range(spec, "steps")[1]
    lo, hi = _range(spec, "flow_shift")
    try:
        shift = float(flow_shift)
    except (TypeError, ValueError):
        return top
    if not lo < shift <= hi:
        return top
    return min(top, max_distinct_steps(shift))


@dataclass(frozen=True)
class LimitNotes:
    """The allowed range of each number control, as its info line (all from the engine's limits)."""

    steps: str
    guidance: str
    flow_shift: str
    fps: str
    frames: str
    interval: str
    seed: str
    chunk: str


def _hint(text: str) -> str:
    return text[:1].upper() + text[1:]


def steps_note(spec: SamplingControls, flow_shift=None) -> str:
    """Steps' allowed range at this flow shift; without a shift, the range before the shift's limit
    (so building the page needs no scheduler, which imports the denoising stack). Rendered by the
    engine's own `render_range`, as its refusal says it."""
    if spec.locked or spec.limits is None:
        return "Fixed by the distilled checkpoint." if spec.locked else ""
    lo, top = _range(spec, "steps")
    if flow_shift is None:
        return _hint(f"{render_range(lo, top)}; fewer at high flow shifts.")
    most = steps_max(spec, flow_shift)
    cap = f"; {steps_cap(most, float(flow_shift))}" if most < top else ""
    return _hint(f"{render_range(lo, top)}{cap}.")


def limit_notes(spec: SamplingControls, flow_shift=None) -> LimitNotes:
    """Each control's hint, rendered from the engine's limits by the functions its refusals use."""
    if spec.limits is None:  # an unavailable tab of a model described without limits: nothing to say
        return LimitNotes(*([""] * 8))
    steps = steps_note(spec, flow_shift)
    if spec.locked:
        guidance = shift = "Fixed by the distilled checkpoint."
    else:
        guidance = _hint(f"{render_range(*_range(spec, 'guidance_scale'))}; 1 turns guidance off.")
        shift = _hint(f"{render_range(*_range(spec, 'flow_shift'), lo_open=True)}; higher shifts allow fewer steps.")
    frames = ""
    if spec.frames_range:
        frames = _hint(render_frames(*spec.frames_range, spec.limits.frame_step) + ".")
    return LimitNotes(
        steps=steps, guidance=guidance, flow_shift=shift, fps=_hint(render_range(*_range(spec, "fps"), lo_open=True) + "."),
        frames=frames, interval=f"Timesteps, start = lo, end = hi: {render_interval(*_range(spec, 'guidance_interval'))}.",
        seed=_hint(f"{render_range(*_range(spec, 'seed'))}; -1 picks one at random."),
        chunk=f"{CHUNK_RANGE[0]} to {CHUNK_RANGE[1]}, a multiple of {FRAME_STEP}; the video has chunk + 1 frames.",
    )


# ----------------------------------------------------------------------------------------------
# Action controls
# ----------------------------------------------------------------------------------------------


def domain_choices() -> list[tuple[str, str]]:
    """Supported domains with their width; domains without a fixed width are left out."""
    out = []
    for name in SUPPORTED_DOMAINS:
        d = ACTION_DOMAINS[name]
        out.append((f"{name} ({d.raw_dim}-D, {d.note})", name))
    return out


def channel_names(domain: str) -> list[str]:
    """What each action channel of `domain` means, from the domain table (x, y, z, rot1..6, gripper...)."""
    return list(ACTION_DOMAINS[domain].channels) if domain in ACTION_DOMAINS else []


def unsupported_domains_note() -> str:
    names = [f"{d.name} ({d.note})" for d in ACTION_DOMAINS.values() if not d.supported]
    return "Not offered (no fixed action width): " + ", ".join(names) + "." if names else ""


def kind_choices() -> list[tuple[str, str]]:
    return [(KIND_LABELS[k], k) for k in ACTION_KINDS]


def view_choices() -> list[tuple[str, str]]:
    return [(VIEW_LABELS.get(v, v), v) for v in VIEW_POINTS]


def tier_choices() -> list[tuple[str, int]]:
    return [(f"{tier}p", tier) for tier in sorted(RESOLUTION_TIERS)]


@dataclass
class DomainControls:
    chunk_size: int
    fps: float
    raw_dim: int
    note: str


def domain_controls(domain: str) -> DomainControls:
    d = ACTION_DOMAINS[domain]
    chunk = min(max(d.typical_chunk, CHUNK_RANGE[0]), CHUNK_RANGE[1])
    chunk -= chunk % FRAME_STEP
    return DomainControls(
        chunk_size=chunk, fps=float(d.typical_fps), raw_dim=int(d.raw_dim),
        note=(f"Domain id {d.domain_id}: {d.raw_dim} values per step ({d.note}); typical chunk {d.typical_chunk} "
              f"at {d.typical_fps:g} fps. Wider than {MODEL_ACTION_WIDTH} is refused; narrower is zero-padded "
              "by the engine."),
    )


@dataclass(frozen=True)
class KindInputs:
    """Which uploads an action kind uses."""

    image: bool
    video: bool
    actions: bool
    note: str


def kind_inputs(kind: str) -> KindInputs:
    if kind == "policy":
        return KindInputs(True, True, False, "Give the first frame as an image (or a video: its first frame is used). "
                                             "The model predicts the future video and the actions.")
    if kind == "forward_dynamics":
        return KindInputs(True, True, True, "Give the first frame (image, or a video's first frame) and an actions "
                                            "file [T, D] (JSON, CSV or NPY); the model renders the video.")
    return KindInputs(False, True, False, "Give a video; the model infers the actions that produced it.")


# ----------------------------------------------------------------------------------------------
# Variant panel
# ----------------------------------------------------------------------------------------------


def model_choices(models: list[dict]) -> list[tuple[str, str]]:
    out = []
    for m in models:
        label = m["name"]
        if m.get("label"):
            label += f"  ({m['label']})"
        out.append((label, m["name"]))
    return out


def variant_markdown(model: dict) -> str:
    """The variant panel: family, flags, modes, limits, and what is unavailable and why."""
    family = model["family"].capitalize()
    flags = [family]
    if model["is_edge"] and family != "Edge":
        flags.append("Edge")
    flags.append("distilled, " + str(len(model.get("distilled_sigmas") or [])) + " steps" if model["is_distilled"]
                 else "full sampler")
    if model.get("is_tiny"):
        flags.append("tiny random weights (outputs are noise)")
    lines = [f"**{model['name']}** · " + " · ".join(flags)]
    said = {model["name"].lower(), *(flag.lower() for flag in flags)}
    if model.get("label") and not any(model["label"].lower() in flag for flag in said):
        lines.append(f"_{model['label']}_")
    if model.get("gpus", 1) > 1:  # a GPU group (engine.parallel): its size and how requests are split
        scheme = model.get("parallel") or {}
        lines.append(f"GPU group: {model['gpus']} GPUs · CFG steps: {scheme.get('cfg_steps')} · "
                     f"single-branch steps: {scheme.get('single_branch_steps')}")
    modes = [MODE_NAMES[m] for m in model["modes"]]
    lines.append("Modes: " + ", ".join(modes) + ".")
    for mode in ("t2i", "t2v"):
        d = model["defaults"].get(mode)
        if d is None:
            continue
        sizes = ", ".join(size_label(w, h) for w, h in d["resolutions"])
        frames = "" if mode == "t2i" else f"; frames {d['frame_range'][0]}..{d['frame_range'][1]} (4k+1)"
        lines.append(f"{TAB_MODES[mode]}: {sizes}{frames}; {d['steps']} steps, guidance {d['guidance_scale']:g}"
                     + (" (locked)" if d["steps_locked"] else ""))
    if model["is_distilled"] and model.get("distilled_sigmas"):
        lines.append(f"Fixed sigmas: {model['distilled_sigmas']}.")
    for mode in ("action", "sound"):
        reason = unsupported_reason(model, mode)
        if reason:
            lines.append(f"Not available: {MODE_NAMES[mode]}. {reason}")
    return "\n\n".join(lines)


@dataclass
class TabAvailability:
    t2i: tuple[bool, str | None]
    t2v: tuple[bool, str | None]
    action: tuple[bool, str | None]
    fallback: str = field(default="t2i")


def tab_availability(model: dict) -> TabAvailability:
    return TabAvailability(
        t2i=(unsupported_reason(model, "t2i") is None, unsupported_reason(model, "t2i")),
        t2v=(unsupported_reason(model, "t2v") is None, unsupported_reason(model, "t2v")),
        action=(unsupported_reason(model, "action") is None, unsupported_reason(model, "action")),
    )


# ----------------------------------------------------------------------------------------------
# Fitting an upload to the canvas
# ----------------------------------------------------------------------------------------------

FIT_CHOICES = [("Crop to fill (centre)", "crop"), ("Letterbox (nothing cut, black bars)", "letterbox"),
               ("Stretch to the canvas", "resize")]


def fit_note(upload_size: tuple[int, int] | None, canvas: tuple[int, int] | None, fit: str) -> str:
    """What happens to an upload of `upload_size` on the `canvas` with `fit`, in pixels of the upload."""
    if not upload_size or not canvas:
        return "An upload whose aspect differs from the resolution is fitted as chosen here."
    (w, h), (cw, ch) = upload_size, canvas
    if w * ch == h * cw:
        return f"Your {w}x{h} upload has the canvas's aspect: it is scaled to {cw}x{ch}, nothing is cut or padded."
    if fit == "resize":
        return f"Your {w}x{h} upload is stretched to {cw}x{ch} (its aspect changes)."
    cover = fit == "crop"
    scale = max(cw / w, ch / h) if cover else min(cw / w, ch / h)
    sw, sh = round(w * scale), round(h * scale)
    if cover:
        cut = f"{round((sw - cw) / scale)} px of its width" if sw > cw else f"{round((sh - ch) / scale)} px of its height"
        return f"Your {w}x{h} upload is scaled to cover {cw}x{ch} and centre-cropped: {cut} is cut, split evenly."
    bars = f"{cw - sw} px of black beside it" if sw < cw else f"{ch - sh} px of black above and below"
    return f"Your {w}x{h} upload is scaled to {sw}x{sh} inside {cw}x{ch}: {bars}, nothing is cut."
