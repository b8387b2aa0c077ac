"""One source for every limit: `engine.sampling_limits` is what validation enforces, end to end.

Each limit is checked at its edge through `validate_request`: the limit itself passes, one past it is
refused with a message that quotes the limit. If validation kept a literal of its own, moving the limit
in the table would make one of these fail.
"""
import dataclasses
import re

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
        with pytest.raises(ValueError, match=re.escape(f"fps must be {D.render_range(*limits.fps, lo_open=True)}")):
            engine.validate_request(info, mode, {**base, "fps": bad})
    with pytest.raises(ValueError, match=re.escape(f"seed must be {D.render_range(*limits.seed)}")):
        engine.validate_request(info, mode, {**base, "seed": limits.seed[1] + 1})
    lo, hi = limits.guidance_interval
    if not info.is_distilled:
        assert engine.validate_request(info, mode, {**base, "guidance_interval": [lo, hi]})["guidance_interval"] == [lo, hi]
        with pytest.raises(ValueError, match=re.escape(D.render_interval(lo, hi))):
            engine.validate_request(info, mode, {**base, "guidance_interval": [lo, hi + 1]})
        with pytest.raises(ValueError, match=re.escape(f"steps must be {D.render_range(*limits.steps)}")):
            engine.validate_request(info, mode, {**base, "steps": limits.steps[1] + 1})
        with pytest.raises(ValueError, match=re.escape(f"guidance_scale must be {D.render_range(*limits.guidance_scale)}")):
            engine.validate_request(info, mode, {**base, "guidance_scale": limits.guidance_scale[1] + 0.5})
        with pytest.raises(ValueError, match=re.escape(f"flow_shift must be {D.render_range(*limits.flow_shift, lo_open=True)}")):
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
        with pytest.raises(ValueError, match=re.escape(D.render_frames(f_lo, f_hi, limits.frame_step))):
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


def test_every_bad_field_is_refused_at_once_and_quoted_as_written(tiny_family):
    """Frames, steps, fps, guidance and seed all wrong: one refusal lists all five, the first's field
    stays `.field`, and each number is quoted exactly as it came (a 20-digit seed is not 1e+20)."""
    info = engine.inspect_checkpoint(tiny_family["nano"])
    limits = engine.sampling_limits(info, "t2v")
    bad = {"prompt": "x", "num_frames": 6, "steps": 500, "fps": 0, "guidance_scale": -3,
           "seed": 99999999999999999999}
    with pytest.raises(ValueError) as caught:
        engine.validate_request(info, "t2v", bad)
    exc = caught.value
    fields = [e.field for e in exc.errors]
    assert sorted(fields) == ["fps", "guidance_scale", "num_frames", "seed", "steps"], fields
    assert exc.field == fields[0] and exc.errors[0] is not exc
    by_field = {e.field: str(e) for e in exc.errors}
    assert "got 99999999999999999999." in by_field["seed"] and "e+" not in by_field["seed"]
    assert f"must be {D.render_range(*limits.steps)}, got 500; {D.steps_cap(100, 10)}." in by_field["steps"]
    assert "got -3." in by_field["guidance_scale"] and "got 0." in by_field["fps"]
    assert all(message in str(exc) for message in by_field.values())
    # One bad field alone: the refusal lists itself, as before.
    with pytest.raises(ValueError) as caught:
        engine.validate_request(info, "t2v", {"prompt": "x", "steps": 500})
    assert caught.value.field == "steps" and caught.value.errors == [caught.value]


def test_quote_number_keeps_what_was_typed():
    assert D.quote_number(99999999999999999999) == "99999999999999999999"
    assert D.quote_number(3.0) == "3" and D.quote_number(0.1) == "0.1" and D.quote_number(1e300) == "1e+300"
    assert D.render_range(0.0, 120.0, lo_open=True) == "in (0, 120]"
