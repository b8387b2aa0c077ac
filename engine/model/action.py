"""The embodied-action tables: domains, view points, resolution tiers.

One source for the engine's action stage, the validation, the UI's dropdowns and upload checks.
Facts from cosmos3.md section 7; ids and widths agree with diffusers 0.42.1's own tables, which
`tests/unit/model/test_action_tables.py` checks.
"""
from __future__ import annotations

from dataclasses import dataclass

ACTION_KINDS = ("policy", "forward_dynamics", "inverse_dynamics")
MODEL_ACTION_WIDTH = 64


# What each channel of a domain's action row means. Rows are composed of 9-D poses (position, then
# the rotation as the first two columns of its matrix, "6D rotation"), 1-D grippers and 15-D
# fingertips (five tips, xyz each); cosmos3.md section 7.
_ROTATION = ("rot1", "rot2", "rot3", "rot4", "rot5", "rot6")


def _pose(prefix: str = "") -> tuple[str, ...]:
    return tuple(f"{prefix}{name}" for name in ("x", "y", "z", *_ROTATION))


def _fingertips(prefix: str) -> tuple[str, ...]:
    return tuple(f"{prefix}{finger}_{axis}" for finger in ("thumb", "index", "middle", "ring", "pinky")
                 for axis in "xyz")


_ARM = (*_pose(), "gripper")
_TWO_ARMS = (*_pose("L "), "L gripper", *_pose("R "), "R gripper")
_CHANNELS = {
    "av": _pose("ego "), "camera_pose": _pose("cam "),
    "hand_pose": (*_pose("ego "), *_pose("L wrist "), *_fingertips("L "), *_pose("R wrist "), *_fingertips("R ")),
    "pusht": ("x", "y"), "robomind-franka-dual": _TWO_ARMS,
    "agibotworld": (*_pose("ego "), *_TWO_ARMS), "agibot_gear_gripper": (*_pose("ego "), *_TWO_ARMS),
    "agibot_gear_gripper_ext": (*_pose("ego "), *_TWO_ARMS),
}


@dataclass(frozen=True)
class ActionDomain:
    name: str
    domain_id: int
    raw_dim: int | None  # None: the width depends on the dataset, so inference is not supported
    typical_chunk: int
    typical_fps: float
    note: str = ""

    @property
    def supported(self) -> bool:
        return self.raw_dim is not None

    @property
    def channels(self) -> tuple[str, ...]:
        """Each action channel's name (x, y, z, rot1..rot6, gripper, ...); generic where the layout is
        not known (galbot's humanoid stack)."""
        named = _CHANNELS.get(self.name, _ARM if self.raw_dim == len(_ARM) else ())
        if self.raw_dim is not None and len(named) == self.raw_dim:
            return named
        return tuple(f"a{i}" for i in range(self.raw_dim or 0))


# Typical clip shapes are known for AV, Bridge, DROID and UMI; the others take a 16-step chunk at
# the model's 24 fps until their datasets say otherwise.
ACTION_DOMAINS: dict[str, ActionDomain] = {
    d.name: d
    for d in (
        ActionDomain("no_action", 0, None, 16, 24.0, "no action stream"),
        ActionDomain("av", 1, 9, 60, 10.0, "ego 9-D pose"),
        ActionDomain("camera_pose", 2, 9, 16, 24.0, "camera 9-D pose"),
        ActionDomain("hand_pose", 3, 57, 16, 24.0, "9-D ego + 2 x (9-D wrist + 15-D fingertips)"),
        ActionDomain("pusht", 4, 2, 16, 10.0, "2-D push target"),
        ActionDomain("libero", 5, None, 16, 20.0, "width depends on the dataset configuration"),
        ActionDomain("umi", 6, 10, 16, 20.0, "9-D effector + gripper"),
        ActionDomain("bridge_orig_lerobot", 7, 10, 16, 5.0, "9-D effector + gripper"),
        ActionDomain("droid_lerobot", 8, 10, 16, 15.0, "9-D effector + gripper"),
        ActionDomain("robomind-franka", 8, 10, 16, 24.0, "9-D effector + gripper"),
        ActionDomain("galbot", 9, 30, 16, 24.0, "humanoid stack"),
        ActionDomain("robomind-franka-dual", 12, 20, 16, 24.0, "two arms"),
        ActionDomain("robomind-ur", 13, 10, 16, 24.0, "9-D effector + gripper"),
        ActionDomain("agibotworld", 15, 29, 16, 24.0, "9-D ego + two arms"),
        ActionDomain("agibot_gear_gripper", 15, 29, 16, 24.0, "9-D ego + two arms"),
        ActionDomain("agibot_gear_gripper_ext", 15, 29, 16, 24.0, "9-D ego + two arms"),
        ActionDomain("fractal", 20, 10, 16, 24.0, "9-D effector + gripper"),
    )
}

SUPPORTED_DOMAINS = tuple(name for name, d in ACTION_DOMAINS.items() if d.supported)

# The framing sentences the action model was trained with (diffusers' viewpoint table).
VIEW_POINTS: dict[str, str] = {
    "ego_view": "This video is captured from a first-person perspective looking at the scene.",
    "third_person_view": "This video is captured from a third-person perspective looking towards the agent from the front.",
    "wrist_view": "This video is captured from a wrist-mounted camera.",
    "concat_view": "This video contains concatenated views from multiple camera perspectives.",
}

# Canvas (height, width) per tier, keyed by height/width aspect; the input picks the closest.
RESOLUTION_TIERS: dict[int, dict[float, tuple[int, int]]] = {
    256: {1.0: (256, 256), 0.8: (256, 320), 1.25: (320, 256), 0.6: (192, 320), 1.6666666666666667: (320, 192)},
    480: {
        1.0: (640, 640),
        0.7391304347826086: (544, 736),
        1.3529411764705883: (736, 544),
        0.5769230769230769: (480, 832),
        1.7333333333333334: (832, 480),
    },
    704: {
        1.0: (960, 960),
        0.7647058823529411: (832, 1088),
        1.3076923076923077: (1088, 832),
        0.55: (704, 1280),
        1.8181818181818181: (1280, 704),
    },
    720: {
        1.0: (960, 960),
        0.7536231884057971: (832, 1104),
        1.3269230769230769: (1104, 832),
        0.5625: (720, 1280),
        1.7777777777777777: (1280, 720),
    },
}

CHUNK_RANGE = (4, 188)  # frames = chunk + 1 must be 4k+1


def action_caption(description: str, view_point: str | None, num_frames: int, fps: float, height: int, width: int) -> str:
    """The structured caption the action model was trained on, built the way diffusers builds it."""
    import json
    import math

    seconds = num_frames / fps if fps > 0 else 0.0
    finite = seconds >= 0 and math.isfinite(seconds)
    duration = int(seconds) if finite else 0
    minutes, secs = divmod(round(seconds) if finite else 0, 60)
    text = description.strip()
    if text and not text.endswith((".", "!", "?")):
        text += "."
    caption: dict = {}
    if view_point in VIEW_POINTS:
        caption["cinematography"] = {"framing": VIEW_POINTS[view_point]}
    ratio = width / height if height > 0 else 1.0
    caption["actions"] = [{"time": f"0:00-{minutes}:{secs:02d}", "description": text}]
    caption["duration"] = f"{duration}s"
    caption["fps"] = float(fps)
    caption["resolution"] = {"H": int(height), "W": int(width)}
    # The reference's candidate order, not engine.pipeline.captions.ASPECT_RATIOS': `min` breaks ties by order,
    # and the action caption must be the one the model was trained on.
    caption["aspect_ratio"] = min(
        ("1,1", "4,3", "3,4", "16,9", "9,16"), key=lambda r: abs(int(r.split(",")[0]) / int(r.split(",")[1]) - ratio)
    )
    return json.dumps(caption)
