"""The one table of sampling defaults and limits.

`sampling_defaults` (the defaults of a mode, as JSON) and `sampling_limits` (every limit of a mode, as a
frozen `Limits`) are the only readers of `FAMILY_TABLE`; request validation, the UI's controls,
`/models` and the tests all go through them, so no limit is written down twice. Values come from
cosmos3.md section 6 (with the project's choices marked there).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

from .action import CHUNK_RANGE, RESOLUTION_TIERS
from .variants import REQUEST_MODES, VariantInfo

DEFAULT_FPS = 24.0
SEED_MAX = 2**63 - 1
STEPS_MAX = 200
GUIDANCE_MAX = 30.0
FLOW_SHIFT_MAX = 50.0
FPS_MAX = 120.0
PROMPT_MAX_CHARS = 50_000  # prompt, negative prompt and a JSON caption alike
TIMESTEP_MAX = 1000.0  # guidance_interval is given in the scheduler's timestep units, 0..1000
VAE_SPATIAL = 16  # the Wan VAE compresses space 16x: canvas sides are multiples of 16
VAE_TEMPORAL = 4  # and time 4x: video frame counts are 4k+1
FRAME_STEP = VAE_TEMPORAL
DEFAULT_ACTION_TIER = 480
DEFAULT_ACTION_CHUNK = 16
VIDEO_MODES = ("t2v", "i2v", "v2v")

Size = tuple[int, int]  # (width, height)


@dataclass(frozen=True)
class ModeDefaults:
    width: int
    height: int
    num_frames: int
    steps: int
    guidance_scale: float
    guidance_interval: tuple[float, float] | None
    flow_shift: float


@dataclass(frozen=True)
class FamilyLimits:
    image_sizes: tuple[Size, ...]
    video_sizes: tuple[Size, ...]
    frame_range: tuple[int, int]
    image: ModeDefaults
    video: ModeDefaults
    action: ModeDefaults


_NANO_SUPER_SIZES: tuple[Size, ...] = ((1280, 720), (720, 1280), (832, 480), (480, 832), (1024, 1024), (640, 640))
# Edge was trained at 256p/480p only; larger grids push M-RoPE past its trained range.
_EDGE_SIZES: tuple[Size, ...] = (
    (832, 480), (480, 832), (640, 480), (480, 640), (480, 480), (640, 640), (448, 256), (256, 448), (256, 256),
)
_ACTION_DEFAULTS = ModeDefaults(832, 480, DEFAULT_ACTION_CHUNK + 1, 30, 1.0, None, 10.0)
# T2I guidance only where it helps: timesteps in [400, 1000] (project choice, cosmos3.md section 6).
T2I_GUIDANCE_INTERVAL = (400.0, TIMESTEP_MAX)

_NANO_SUPER = FamilyLimits(
    image_sizes=_NANO_SUPER_SIZES,
    video_sizes=_NANO_SUPER_SIZES,
    frame_range=(17, 189),
    image=ModeDefaults(1024, 1024, 1, 50, 4.0, T2I_GUIDANCE_INTERVAL, 3.0),
    video=ModeDefaults(1280, 720, 121, 35, 6.0, None, 10.0),
    action=_ACTION_DEFAULTS,
)

FAMILY_TABLE: dict[str, FamilyLimits] = {
    "nano": _NANO_SUPER,
    "super": _NANO_SUPER,
    # An unknown architecture gets the widest validated table rather than a guess of its own.
    "custom": _NANO_SUPER,
    "edge": FamilyLimits(
        image_sizes=_EDGE_SIZES,
        video_sizes=_EDGE_SIZES,
        frame_range=(49, 149),
        image=ModeDefaults(640, 640, 1, 50, 7.0, T2I_GUIDANCE_INTERVAL, 3.0),
        video=ModeDefaults(832, 480, 121, 50, 5.0, None, 3.0),
        action=_ACTION_DEFAULTS,
    ),
}


def _limits(info: VariantInfo) -> FamilyLimits:
    table = FAMILY_TABLE[info.family]
    if info.tiny is None:
        return table
    tiny = info.tiny
    image_w, image_h = tiny.image_sizes[0]
    video_w, video_h = tiny.video_sizes[0]
    return FamilyLimits(
        image_sizes=tiny.image_sizes,
        video_sizes=tiny.video_sizes,
        frame_range=tiny.frame_range,
        image=ModeDefaults(image_w, image_h, 1, table.image.steps, table.image.guidance_scale,
                           table.image.guidance_interval, table.image.flow_shift),
        video=ModeDefaults(video_w, video_h, tiny.default_frames, table.video.steps, table.video.guidance_scale,
                           table.video.guidance_interval, table.video.flow_shift),
        action=table.action,
    )


def _mode_key(mode: str) -> str:
    if mode == "t2i":
        return "image"
    if mode in VIDEO_MODES or mode == "sound":
        return "video"
    if mode == "action":
        return "action"
    raise ValueError(f"Unknown mode {mode!r}; allowed: {list(REQUEST_MODES)}.")


@dataclass(frozen=True)
class Limits:
    """Every limit of one mode on one checkpoint: what validation enforces and what the UI draws.

    Ranges are (lo, hi), both ends allowed unless the field's comment says the low end is open.
    """

    steps: tuple[int, int]
    guidance_scale: tuple[float, float]
    flow_shift: tuple[float, float]  # low end open: 0 is refused
    fps: tuple[float, float]  # low end open: 0 is refused
    guidance_interval: tuple[float, float]  # timesteps; a request's [lo, hi] needs lo < hi inside this
    seed: tuple[int, int]  # -1 asks for a random seed
    prompt_chars: int  # per text field (prompt, negative prompt)
    resolutions: tuple[Size, ...]  # (width, height)
    frame_range: tuple[int, int]
    frame_step: int  # num_frames = lo + k * frame_step (1 for images)
    steps_locked: bool  # distilled: steps, guidance and shift are fixed by the checkpoint
    guidance_locked: bool


def quote_number(value) -> str:
    """A number as the user wrote it: integers exactly (a 20-digit seed is not shown as 1e+20), other
    floats by their shortest round-trip form, as a browser shows them."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, int):
        return str(value)
    return str(int(value)) if value.is_integer() and abs(value) < 2**53 else repr(value)


def render_range(lo: float, hi: float, *, lo_open: bool = False) -> str:
    """One allowed range, for the refusal and for the control's hint alike ("in [1, 200]", "in (0, 120]"
    where the low end is refused), so the page's hint and the engine's error can never disagree."""
    return f"in {'(' if lo_open else '['}{quote_number(lo)}, {quote_number(hi)}]"


def render_frames(lo: int, hi: int, step: int) -> str:
    """The allowed frame counts, for the refusal and the hint ("49..149 in steps of 4")."""
    return f"{lo}..{hi} in steps of {step}" if step > 1 else f"{lo}..{hi}"


def render_interval(lo: float, hi: float) -> str:
    """The guidance interval's bounds, for the refusal and the hint ("0 <= lo < hi <= 1000")."""
    return f"{quote_number(lo)} <= lo < hi <= {quote_number(hi)}"


def steps_cap(most: int, flow_shift: float) -> str:
    """The most steps a flow shift allows, for the refusal and the hint alike."""
    return f"at most {most} steps are allowed at this shift (flow shift {quote_number(flow_shift)})"


def sampling_limits(info: VariantInfo, mode: str) -> Limits:
    """Every limit of `mode` on this checkpoint (see `Limits`); the defaults are `sampling_defaults`."""
    table = _limits(info)
    key = _mode_key(mode)
    if key == "image":
        sizes, frame_range, frame_step = table.image_sizes, (1, 1), 1
    elif key == "video":
        sizes, frame_range, frame_step = table.video_sizes, table.frame_range, FRAME_STEP
    else:
        sizes = tuple((w, h) for (h, w) in RESOLUTION_TIERS[DEFAULT_ACTION_TIER].values())
        frame_range, frame_step = (CHUNK_RANGE[0] + 1, CHUNK_RANGE[1] + 1), FRAME_STEP
    return Limits(
        steps=(1, STEPS_MAX), guidance_scale=(0.0, GUIDANCE_MAX), flow_shift=(0.0, FLOW_SHIFT_MAX),
        fps=(0.0, FPS_MAX), guidance_interval=(0.0, TIMESTEP_MAX), seed=(-1, SEED_MAX),
        prompt_chars=PROMPT_MAX_CHARS, resolutions=tuple(sizes), frame_range=frame_range, frame_step=frame_step,
        steps_locked=info.is_distilled, guidance_locked=info.is_distilled,
    )


def sampling_defaults(info: VariantInfo, mode: str) -> dict[str, Any]:
    """Defaults for `mode` on this checkpoint, with the limits the UI needs, as one JSON-ready dict."""
    defaults: ModeDefaults = getattr(_limits(info), _mode_key(mode))
    limits = sampling_limits(info, mode)
    steps, guidance, interval, shift = defaults.steps, defaults.guidance_scale, defaults.guidance_interval, defaults.flow_shift
    if info.is_distilled:
        # Few-step checkpoints: the sigmas are the schedule, guidance is baked into the weights.
        steps, guidance, interval, shift = len(info.distilled_sigmas), 1.0, None, 1.0
    return {
        "width": defaults.width,
        "height": defaults.height,
        "num_frames": defaults.num_frames,
        "fps": DEFAULT_FPS,
        "steps": steps,
        "guidance_scale": guidance,
        "guidance_interval": list(interval) if interval else None,
        "flow_shift": shift,
        "resolutions": [[w, h] for (w, h) in limits.resolutions],
        "frame_range": list(limits.frame_range),
        "steps_locked": limits.steps_locked,
        "guidance_locked": limits.guidance_locked,
    }


@functools.lru_cache(maxsize=512)
def distinct_timesteps(flow_shift: float, steps: int) -> bool:
    """Whether UniPC's flow schedule gives `steps` distinct integer timesteps at this shift.

    Why: at high shifts the schedule crowds near t = 1000 and integer timesteps repeat, and UniPC's
    multistep update then fails mid-run (shift 10 breaks past 100 steps). Refusing up front beats
    losing a long run at step 101.
    """
    from diffusers import UniPCMultistepScheduler

    scheduler = UniPCMultistepScheduler(num_train_timesteps=1000, solver_order=2, prediction_type="flow_prediction",
                                        use_flow_sigmas=True, flow_shift=flow_shift, final_sigmas_type="zero")
    scheduler.set_timesteps(steps)
    return len(set(scheduler.timesteps.tolist())) == steps


def max_distinct_steps(flow_shift: float) -> int:
    steps = STEPS_MAX
    while steps > 1 and not distinct_timesteps(flow_shift, steps):
        steps -= 1
    return steps
