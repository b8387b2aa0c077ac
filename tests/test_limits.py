"""One source for every limit: `engine.sampling_limits` is what validation enforces, end to end.

Each limit is checked at its edge through `validate_request`: the limit itself passes, one past it is
refused with a message that quotes the limit. If validation kept a literal of its own, moving the limit
in the table would make one of these fail.
"""
import dataclasses

import pytest

import engine
from engine.model import defaults as D
from engine.pipeline import captions

MODELS = ("nano", "edge", "nano-distilled")


def _base(info, mode):
    if mode == "i2v":
        return {"prompt": "x", "image": "first.png"}
    return {"prompt": "x"}


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("mode", ("t2i", "t2v"))
def test_every_range_is_enforced_at_its_edge(tiny_family, name, mode):
    info = engine.inspect_checkpoint(tiny_family[name])
    limits = engine.sampling_limits(info, mode)
    assert isinstance(limits, engine.Limits)
    with pytest.raises(dataclasses.FrozenInstanceError):
        limits.steps = (1, 2)
    base = _base(info, mode)
    # fps: the top passes, just above is refused; the open low end refuses 0.
    assert engine.validate_request(info, mode, {**base, "fps": limits.fps[1]})["fps"] == limits.fps[1]
    for bad in (limits.fps[1] + 0.5, limits.fps[0]):
        with pytest.raises(ValueError, match=f"fps must be in \\({limits.fps[0]:g}, {limits.fps[1]:g}\\]"):
            engine.validate_request(info, mode, {**base, "fps": bad})
    with pytest.raises(ValueError, match=f"seed must be in \\[{limits.seed[0]}, {limits.seed[1]}\\]"):
        engine.validate_request(info, mode, {**base, "seed": limits.seed[1] + 1})
    lo, hi = limits.guidance_interval
    if not info.is_distilled:
        assert engine.validate_request(info, mode, {**base, "guidance_interval": [lo, hi]})["guidance_interval"] == [lo, hi]
        with pytest.raises(ValueError, match=f"{lo:g} <= lo < hi <= {hi:g}"):
            engine.validate_request(info, mode, {**base, "guidance_interval": [lo, hi + 1]})
        with pytest.raises(ValueError, match=f"steps must be in \\[1, {limits.steps[1]}\\]"):
            engine.validate_request(info, mode, {**base, "steps": limits.steps[1] + 1})
        with pytest.raises(ValueError, match=f"guidance_scale must be in \\[0, {limits.guidance_scale[1]:g}\\]"):
            engine.validate_request(info, mode, {**base, "guidance_scale": limits.guidance_scale[1] + 0.5})
        with pytest.raises(ValueError, match=f"flow_shift must be in \\(0, {limits.flow_shift[1]:g}\\]"):
            engine.validate_request(info, mode, {**base, "flow_shift": limits.flow_shift[1] + 1})
    assert limits.steps_locked == limits.guidance_locked == info.is_distilled
    # sizes and frames: what the limits list passes, and the defaults sit inside the limits.
    defaults = engine.sampling_defaults(info, mode)
    assert [list(s) for s in limits.resolutions] == defaults["resolutions"]
    assert list(limits.frame_range) == defaults["frame_range"]
    for width, height in limits.resolutions:
        engine.validate_request(info, mode, {**base, "width": width, "height": height})
    f_lo, f_hi = limits.frame_range
    if mode == "t2v":
        assert limits.frame_step == 4
        assert engine.validate_request(info, mode, {**base, "num_frames": f_hi})["num_frames"] == f_hi
        with pytest.raises(ValueError, match=f"in {f_lo}..{f_hi}"):
            engine.validate_request(info, mode, {**base, "num_frames": f_hi + limits.frame_step})
        with pytest.raises(ValueError, match=f"steps of {limits.frame_step}"):
            engine.validate_request(info, mode, {**base, "num_frames": f_lo + 1})
    else:
        assert limits.frame_range == (1, 1)


def test_prompt_length_is_one_constant(tiny_family):
    """The request check and the caption parser refuse at the same length, from the same constant."""
    info = engine.inspect_checkpoint(tiny_family["nano"])
    limit = engine.sampling_limits(info, "t2i").prompt_chars
    assert limit == D.PROMPT_MAX_CHARS and not hasattr(captions, "MAX_CAPTION_CHARS")
    engine.validate_request(info, "t2i", {"prompt": "x" * limit})
    with pytest.raises(ValueError, match=f"at most {limit} are allowed"):
        engine.validate_request(info, "t2i", {"prompt": "x" * (limit + 1)})
    with pytest.raises(ValueError, match=f"at most {limit} are allowed"):
        captions.parse_caption('{"context": "' + "x" * limit + '"}')
