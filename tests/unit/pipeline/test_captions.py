"""The caption schema: parsing with positions, per-field type errors, form <-> JSON round trips."""
import json
from pathlib import Path

import pytest

import engine
from engine.pipeline import captions as C

ASSETS = Path(__file__).resolve().parents[3] / "assets" / "captions"


def _example(name: str) -> dict:
    return json.loads((ASSETS / name).read_text(encoding="utf-8"))


# ---------------------------------------------------------------------------------------------
# Schema
# ---------------------------------------------------------------------------------------------

def test_image_and_video_schemas_split_fields_as_documented():
    video, image = C.fields_for("video"), C.fields_for("image")
    for name in ("actions", "segments", "transitions", "temporal_caption", "audio_description", "duration", "fps"):
        assert name in video and name not in image, name
    for name in ("subject_details", "quadrant_scan", "comprehensive_t2i_caption"):
        assert name in image and name not in video, name
    for name in ("subjects", "background_setting", "lighting", "aesthetics", "cinematography", "style_medium",
                 "artistic_style", "context", "text_and_signage_elements", "resolution", "aspect_ratio"):
        assert name in image and name in video, name
    video_subject = {f.name for f in video["subjects"].children}
    image_subject = {f.name for f in image["subjects"].children}
    assert {"action", "state_changes"} <= video_subject - image_subject
    assert {"number_of_hands", "number_of_fingers"} <= image_subject - video_subject
    assert C.kind_for_mode("t2i") == "image"
    assert all(C.kind_for_mode(m) == "video" for m in ("t2v", "i2v", "v2v", "action"))
    with pytest.raises(ValueError, match="Unknown caption kind"):
        C.fields_for("audio")


@pytest.mark.parametrize("path", sorted(ASSETS.glob("*.json")), ids=lambda p: p.name)
def test_shipped_captions_are_clean(path):
    kind = "image" if path.name.startswith(("image_", "negative_image")) else "video"
    caption = C.parse_caption(path.read_text(encoding="utf-8"))
    assert caption and C.validate_caption(caption, kind) == []


# ---------------------------------------------------------------------------------------------
# Parse errors carry the position
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize(
    "text, line, column, fragment",
    [
        ('{\n  "subjects": [\n    {"description": "a cat"}\n  ]\n  "style_medium": "photo"\n}', 5, 3, "delimiter"),
        ('{"a": 1,}', 1, 9, "property name"),
        ('{\n  "lighting": {"conditions": "soft}\n}', 2, 36, "control character"),
        ("  [1, 2]", 1, 3, "must be a JSON object"),
        ('"just a string"', 1, 1, "got a string"),
        ("", 1, 1, "empty"),
        ("{\n\n   oops\n}", 3, 4, "property name"),
    ],
)
def test_parse_errors_name_line_and_column(text, line, column, fragment):
    with pytest.raises(C.CaptionParseError) as info:
        C.parse_caption(text)
    err = info.value
    assert (err.line, err.column) == (line, column), str(err)
    assert fragment in str(err)
    assert str(err).startswith(f"Line {line}, column {column}:")


def test_parse_error_excerpt_points_at_the_column():
    text = '{\n  "style_medium" "photo"\n}'
    with pytest.raises(C.CaptionParseError) as info:
        C.parse_caption(text)
    excerpt = info.value.excerpt().splitlines()
    assert excerpt[0].endswith('"style_medium" "photo"')
    caret_col = excerpt[1].index("^") - excerpt[1].index("|") - 2
    assert caret_col == info.value.column - 1


def test_parse_refuses_deep_nesting_and_huge_text():
    deep = "{" + '"a":{' * 40 + "}" * 41
    with pytest.raises(C.CaptionParseError, match="nested too deeply"):
        C.parse_caption(deep)
    very_deep = '{"a":' + "[" * 100_000 + "]" * 100_000 + "}"
    with pytest.raises(C.CaptionParseError, match="characters long|nested too deeply"):
        C.parse_caption(very_deep)
    with pytest.raises(C.CaptionParseError, match="at most"):
        C.parse_caption('{"context": "' + "x" * (C.PROMPT_MAX_CHARS + 1) + '"}')


# ---------------------------------------------------------------------------------------------
# Field errors name the field
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize(
    "caption, kind, path, fragment",
    [
        ({"subjects": {"description": "x"}}, "video", "subjects", "must be a list"),
        ({"subjects": [{"age": [30]}]}, "video", "subjects[0].age", "string or a number"),
        ({"subjects": [{"description": "a"}, {"number_of_legs": -2}]}, "video", "subjects[1].number_of_legs", "whole number"),
        ({"subjects": [{"description": "fine"}, 3]}, "image", "subjects[1]", "must be an object"),
        ({"lighting": "bright"}, "image", "lighting", "must be an object"),
        ({"lighting": {"shadows": 5}}, "image", "lighting.shadows", "must be a string"),
        ({"cinematography": {"camera_motion": None}}, "video", "cinematography.camera_motion", "got null"),
        ({"actions": [{"time": "three seconds", "description": "x"}]}, "video", "actions[0].time", "M:SS-M:SS"),
        ({"segments": [{"segment_index": "first"}]}, "video", "segments[0].segment_index", "whole number"),
        ({"aspect_ratio": "21,9"}, "video", "aspect_ratio", "one of"),
        ({"duration": 5}, "video", "duration", "whole seconds"),
        ({"fps": "fast"}, "video", "fps", "must be a number"),
        ({"resolution": {"H": 720, "W": "wide"}}, "image", "resolution.W", "whole number"),
        ({"quadrant_scan": {"top_left": 1}}, "image", "quadrant_scan.top_left", "must be a string"),
        ({"transitions": [1]}, "video", "transitions[0]", "string or an object"),
        ({"background_setting": 7}, "image", "background_setting", "must be a string"),
    ],
)
def test_field_errors_name_the_field(caption, kind, path, fragment):
    issues = [i for i in C.validate_caption(caption, kind) if i.severity == "error"]
    assert [i.path for i in issues] == [path], issues
    assert fragment in issues[0].message
    # The validator's own path: the request names the field, and the message quotes it.
    mode = "t2i" if kind == "image" else "t2v"
    with pytest.raises(engine.RequestError) as info:
        engine.validate_request(engine.VariantInfo.released("nano"), mode, {"prompt": json.dumps(caption)})
    assert info.value.field == f"prompt.{path}" and path in str(info.value)


def test_cross_kind_fields_and_odd_durations_are_warnings():
    issues = C.validate_caption(
        {"segments": [], "subjects": [{"action": "runs"}], "extra_key": {"anything": 1}}, "image"
    )
    assert {(i.path, i.severity) for i in issues} == {("segments", "warning"), ("subjects[0].action", "warning")}
    warnings = C.validate_caption(C.parse_caption('{"duration": "30s"}'), "video")
    assert warnings[0].path == "duration" and warnings[0].severity == "warning" and "2s..10s" in warnings[0].message


# ---------------------------------------------------------------------------------------------
# Metadata and text forms
# ---------------------------------------------------------------------------------------------

def test_inject_metadata_sets_canvas_and_timing():
    caption = {"context": "x", "resolution": {"H": 1, "W": 1}, "duration": "9s", "fps": 3}
    video = C.inject_metadata(caption, width=1280, height=720, num_frames=121, fps=24, is_image=False)
    assert video["resolution"] == {"H": 720, "W": 1280} and video["aspect_ratio"] == "16,9"
    assert video["duration"] == "5s" and video["fps"] == 24.0 and isinstance(video["fps"], float)
    image = C.inject_metadata(caption, width=640, height=640, num_frames=1, fps=24, is_image=True)
    assert "duration" not in image and "fps" not in image and image["aspect_ratio"] == "1,1"
    assert caption["duration"] == "9s"  # the input is not modified
    assert C.nearest_aspect_ratio(480, 832) == "9,16"
    assert C.nearest_aspect_ratio(640, 480) == "4,3"


def test_prompt_text_is_compact_and_keeps_unicode():
    text = C.to_prompt({"context": "café", "subjects": [{"description": "a"}]})
    assert "\n" not in text and "café" in text
    assert json.loads(C.pretty(json.loads(text))) == json.loads(text)


# ---------------------------------------------------------------------------------------------
# Form <-> JSON
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(p.name for p in ASSETS.glob("*.json")))
def test_form_round_trip_is_lossless(name):
    caption = _example(name)
    kind = "image" if name.startswith(("image_", "negative_image")) else "video"
    form = C.caption_to_form(caption, kind)
    assert C.form_to_caption(caption, form.texts, form.tables, kind) == caption


def test_form_edits_merge_into_the_caption():
    base = {
        "subjects": [
            {"description": "a cat", "age": 3, "number_of_legs": 4},
            {"description": "a dog"},
        ],
        "lighting": {"conditions": "dim"},
        "custom_key": [1, 2],
        "fps": 24.0,
    }
    form = C.caption_to_form(base, "video")
    assert form.texts["lighting.conditions"] == "dim"
    assert form.tables["subjects"][0][:2] == ["a cat", ""]
    texts = dict(form.texts)
    texts["lighting.conditions"] = ""  # cleared: the key and its emptied parent go
    texts["cinematography.camera_motion"] = " slow pan left "
    texts["background_setting"] = "a garden"
    subjects = [list(r) for r in form.tables["subjects"]]
    subjects[0][3] = "jumps onto a wall"  # action column
    subjects = subjects[:1]  # the dog row is deleted
    actions = [["0:00-0:02", "The cat jumps."], ["", ""]]  # a trailing blank row is ignored
    segments = [["0", "0:00-0:02", "jump", "", ""]]
    out = C.form_to_caption(base, texts, {"subjects": subjects, "actions": actions, "segments": segments}, "video")
    assert out == {
        "subjects": [{"description": "a cat", "age": 3, "number_of_legs": 4, "action": "jumps onto a wall"}],
        "custom_key": [1, 2],
        "fps": 24.0,
        "cinematography": {"camera_motion": "slow pan left"},
        "background_setting": "a garden",
        "actions": [{"time": "0:00-0:02", "description": "The cat jumps."}],
        "segments": [{"segment_index": 0, "time_range": "0:00-0:02", "description": "jump"}],
    }
    assert base["lighting"] == {"conditions": "dim"}  # the base is not modified


def test_form_keeps_values_it_cannot_show_exactly():
    base = {"subjects": ["a bare string subject", {"description": "x", "age": 41}], "context": 12}
    form = C.caption_to_form(base, "image")
    assert form.texts["context"] == "12"
    assert form.tables["subjects"][0][0] == "a bare string subject"
    assert C.form_to_caption(base, form.texts, form.tables, "image") == base
    rows = [list(r) for r in form.tables["subjects"]]
    rows[1][4] = "a red coat"  # clothing
    out = C.form_to_caption(base, form.texts, {"subjects": rows}, "image")
    assert out["subjects"] == ["a bare string subject", {"description": "x", "age": 41, "clothing": "a red coat"}]
    assert out["context"] == 12


def test_form_from_empty_caption_builds_one():
    form = C.caption_to_form({}, "image")
    texts = dict(form.texts, background_setting="a beach", **{"aesthetics.mood_atmosphere": "calm"})
    out = C.form_to_caption({}, texts, {"subjects": [["a gull", "", "", "", "", ""]]}, "image")
    assert out == {"background_setting": "a beach", "aesthetics": {"mood_atmosphere": "calm"},
                   "subjects": [{"description": "a gull"}]}
    assert C.form_layout("video").text_keys()[0] == "background_setting"
