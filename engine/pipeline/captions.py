"""The one schema of structured JSON captions (cosmos3.md section 5).

Everything that knows which fields a caption has reads this module: the UI's caption form, the
caption validator, and the metadata injection that sets resolution, aspect ratio, duration and fps
before a JSON prompt goes to the model. Pure Python; no torch, no gradio.

All fields are optional and extra keys are allowed, so validation only checks the *types* of the
fields it knows and reports each problem with the field's path (``subjects[1].age``). Parse errors
carry the line and column where the JSON broke.
"""
from __future__ import annotations

import copy
import json
import re
from dataclasses import dataclass, field
from typing import Any, Iterable

from ..model.defaults import PROMPT_MAX_CHARS

KINDS = ("image", "video")

# Kinds of values a field takes. "text" is a string; "count" a non-negative integer or a string
# ("two"); "text_or_number" either; "time_range" a "M:SS-M:SS" string; "object" a dict of known
# sub-fields (extra keys allowed); "free_object" any dict; "list" a list of items of `item`.
TEXT = "text"
COUNT = "count"
TEXT_OR_NUMBER = "text_or_number"
INT = "int"
NUMBER = "number"
TIME_RANGE = "time_range"
ASPECT = "aspect_ratio"
DURATION = "duration"
OBJECT = "object"
FREE_OBJECT = "free_object"
LIST = "list"
TEXT_OR_OBJECT = "text_or_object"

ASPECT_RATIOS = ("16,9", "1,1", "9,16", "4,3", "3,4")
DURATION_RANGE_S = (2, 10)  # what the model was trained on; outside it is a warning, not an error

MAX_CAPTION_DEPTH = 12

_TIME_RANGE = re.compile(r"^\d+:[0-5]\d-\d+:[0-5]\d$")
_DURATION = re.compile(r"^(\d+)s$")


@dataclass(frozen=True)
class Field:
    """One caption field. `children` for objects (and for lists of objects)."""

    name: str
    kind: str
    children: tuple["Field", ...] = ()
    item: str | None = None  # for LIST: the item kind (OBJECT, TEXT, TEXT_OR_OBJECT)

    def child(self, name: str) -> "Field | None":
        for c in self.children:
            if c.name == name:
                return c
        return None


def _texts(*names: str) -> tuple[Field, ...]:
    return tuple(Field(n, TEXT) for n in names)


_SUBJECT_COMMON = (
    Field("description", TEXT),
    Field("appearance_details", TEXT),
    Field("relationship", TEXT),
    Field("location", TEXT),
    Field("relative_size", TEXT),
    Field("orientation", TEXT),
    Field("pose", TEXT),
    Field("clothing", TEXT),
    Field("expression", TEXT),
    Field("gender", TEXT),
    Field("age", TEXT_OR_NUMBER),
    Field("skin_tone_and_texture", TEXT),
    Field("facial_features", TEXT),
    Field("number_of_subjects", COUNT),
    Field("number_of_arms", COUNT),
    Field("number_of_legs", COUNT),
)
_SUBJECT_VIDEO_ONLY = (Field("action", TEXT), Field("state_changes", TEXT))
_SUBJECT_IMAGE_ONLY = (Field("number_of_hands", COUNT), Field("number_of_fingers", COUNT))

_LIGHTING = Field("lighting", OBJECT, _texts("conditions", "direction", "shadows", "illumination_effect"))
_AESTHETICS = Field("aesthetics", OBJECT, _texts("composition", "color_scheme", "mood_atmosphere", "patterns"))
_CINEMATOGRAPHY = Field(
    "cinematography", OBJECT,
    _texts("camera_motion", "framing", "camera_angle", "depth_of_field", "focus", "lens_focal_length"),
)
_SIGNAGE = Field(
    "text_and_signage_elements", LIST, _texts("text", "category", "appearance", "spatial_temporal", "context"),
    item=OBJECT,
)
_RESOLUTION = Field("resolution", OBJECT, (Field("H", INT), Field("W", INT)))

_VIDEO_ONLY_TOP = (
    Field("actions", LIST, (Field("time", TIME_RANGE), Field("description", TEXT)), item=OBJECT),
    Field(
        "segments", LIST,
        (Field("segment_index", INT), Field("time_range", TIME_RANGE), Field("description", TEXT),
         Field("key_changes", TEXT), Field("camera", TEXT)),
        item=OBJECT,
    ),
    Field("transitions", LIST, item=TEXT_OR_OBJECT),
    Field("temporal_caption", TEXT),
    Field("audio_description", TEXT),
    Field("duration", DURATION),
    Field("fps", NUMBER),
)
_IMAGE_ONLY_TOP = (
    Field("subject_details", FREE_OBJECT),
    Field(
        "quadrant_scan", OBJECT,
        _texts("top_left", "top_right", "bottom_left", "bottom_right", "absolute_center"),
    ),
    Field("comprehensive_t2i_caption", TEXT),
)
_COMMON_TOP = (
    _LIGHTING,
    _AESTHETICS,
    _CINEMATOGRAPHY,
    Field("background_setting", TEXT),
    Field("style_medium", TEXT),
    Field("artistic_style", TEXT),
    Field("context", TEXT),
    _SIGNAGE,
    _RESOLUTION,
    Field("aspect_ratio", ASPECT),
)


def _schema(kind: str) -> dict[str, Field]:
    if kind == "video":
        subjects = Field("subjects", LIST, _SUBJECT_COMMON + _SUBJECT_VIDEO_ONLY, item=OBJECT)
        fields = (subjects,) + _COMMON_TOP + _VIDEO_ONLY_TOP
    else:
        subjects = Field("subjects", LIST, _SUBJECT_COMMON + _SUBJECT_IMAGE_ONLY, item=OBJECT)
        fields = (subjects,) + _COMMON_TOP + _IMAGE_ONLY_TOP
    return {f.name: f for f in fields}


SCHEMAS: dict[str, dict[str, Field]] = {kind: _schema(kind) for kind in KINDS}

VIDEO_ONLY_FIELDS = tuple(f.name for f in _VIDEO_ONLY_TOP)
IMAGE_ONLY_FIELDS = tuple(f.name for f in _IMAGE_ONLY_TOP)
VIDEO_ONLY_SUBJECT_FIELDS = tuple(f.name for f in _SUBJECT_VIDEO_ONLY)
IMAGE_ONLY_SUBJECT_FIELDS = tuple(f.name for f in _SUBJECT_IMAGE_ONLY)
# Metadata an image caption does not carry (`inject_metadata` removes it; video gets the request's).
IMAGE_DROPPED_METADATA = ("duration", "fps")


def kind_for_mode(mode: str) -> str:
    """Which caption schema a request mode uses."""
    return "image" if mode == "t2i" else "video"


def fields_for(kind: str) -> dict[str, Field]:
    if kind not in SCHEMAS:
        raise ValueError(f"Unknown caption kind {kind!r}; allowed: {list(KINDS)}.")
    return SCHEMAS[kind]


# ----------------------------------------------------------------------------------------------
# JSON Schema export (constrained decoding)
# ----------------------------------------------------------------------------------------------
# The reasoner decodes a caption under a JSON Schema made here from the fields above, so the two can
# never disagree. Texts are bounded in characters; the decoder also keeps them to printable ASCII
# without escapes (engine.reasoner.constrained), which a `pattern` here would say too but at eight times
# the decoder's per-token cost.
# "M:SS-M:SS" with at most two digits of minutes: the bounded form of what `_TIME_RANGE` accepts.
SCHEMA_TIME_RANGE = r"^[0-9]{1,2}:[0-5][0-9]-[0-9]{1,2}:[0-5][0-9]$"
SCHEMA_TIME_RANGE_CHARS = 11

# What a leaf of a decoded caption may be: only kinds with a bounded JSON form are exported.
_SCHEMA_LEAF_KINDS = (TEXT, TIME_RANGE)


def schema_text(max_chars: int, min_chars: int = 1) -> dict:
    """A text value of `min_chars`..`max_chars` characters."""
    return {"type": "string", "minLength": min(min_chars, max_chars), "maxLength": max_chars}


def _schema_leaf(spec: Field, path: str, text_chars) -> dict:
    if spec.kind == TIME_RANGE:
        return {"type": "string", "minLength": 9, "maxLength": SCHEMA_TIME_RANGE_CHARS, "pattern": SCHEMA_TIME_RANGE}
    if spec.kind != TEXT:
        raise ValueError(f"caption field {path!r} is {spec.kind!r}; a decoding schema takes {list(_SCHEMA_LEAF_KINDS)}")
    return schema_text(int(text_chars(path)))


def _schema_object(spec: Field, path: str, names: tuple[str, ...], required: tuple[str, ...], text_chars) -> dict:
    properties = {}
    for name in names:
        child = spec.child(name)
        if child is None:
            raise ValueError(f"caption field {path!r} has no sub-field {name!r}; it has {[c.name for c in spec.children]}")
        properties[name] = _schema_leaf(child, f"{path}.{name}", text_chars)
    return {"type": "object", "properties": properties, "required": list(required), "additionalProperties": False}


def caption_json_schema(kind: str, selection: dict[str, tuple[str, ...]], *, text_chars, max_items: dict[str, int],
                        required: tuple[str, ...] = (), child_required: dict[str, tuple[str, ...]] | None = None) -> dict:
    """The JSON Schema of a caption of `kind` holding the `selection` of fields (top-level name -> its
    sub-fields, () for a leaf), each text at most `text_chars(path)` characters and each list at most
    `max_items[name]` items. `required` top-level fields must appear (lists with at least one item);
    `child_required[name]` sub-fields must appear in that object or list item. Properties come in
    the schema's order and nothing else is allowed, so the longest answer is known in advance."""
    schema = fields_for(kind)
    child_required = child_required or {}
    properties = {}
    for name, children in selection.items():
        spec = schema.get(name)
        if spec is None:
            raise ValueError(f"{kind} captions have no field {name!r}; they have {list(schema)}")
        if spec.kind == OBJECT:
            properties[name] = _schema_object(spec, name, children, child_required.get(name, ()), text_chars)
        elif spec.kind == LIST and spec.item == OBJECT:
            item = _schema_object(spec, name, children, child_required.get(name, ()), text_chars)
            properties[name] = {"type": "array", "items": item, "minItems": 1 if name in required else 0,
                                "maxItems": int(max_items[name])}
        else:
            properties[name] = _schema_leaf(spec, name, text_chars)
    missing = [name for name in required if name not in properties]
    if missing:
        raise ValueError(f"required fields {missing} are not in the selection {list(selection)}")
    return {"type": "object", "properties": properties, "required": [n for n in properties if n in required],
            "additionalProperties": False}


# ----------------------------------------------------------------------------------------------
# Parsing
# ----------------------------------------------------------------------------------------------


class CaptionParseError(ValueError):
    """The text is not a JSON object. `line` and `column` are 1-based."""

    def __init__(self, message: str, line: int, column: int, source: str = ""):
        super().__init__(f"Line {line}, column {column}: {message}")
        self.reason = message
        self.line = line
        self.column = column
        self.source = source

    def excerpt(self) -> str:
        """The offending line with a caret under the column, for display in a code block."""
        lines = self.source.splitlines() or [""]
        index = min(max(self.line - 1, 0), len(lines) - 1)
        text = lines[index]
        caret = " " * max(self.column - 1, 0) + "^"
        return f"{self.line:>4} | {text}\n     | {caret}"


@dataclass(frozen=True)
class FieldIssue:
    path: str  # "subjects[0].age", "lighting", ...
    message: str
    severity: str = "error"  # "error" | "warning"

    def __str__(self) -> str:
        return f"{self.path}: {self.message}"


def describe_field_errors(issues: list[FieldIssue]) -> str:
    """One message for a caption's wrongly typed fields; each part names its field."""
    errors = [i for i in issues if i.severity == "error"]
    return f"Caption field error{'s' if len(errors) > 1 else ''}: {'; '.join(str(i) for i in errors)}"


def _position(text: str, offset: int) -> tuple[int, int]:
    line = text.count("\n", 0, offset) + 1
    column = offset - (text.rfind("\n", 0, offset) + 1) + 1
    return line, column


def _depth(value: Any, limit: int) -> int:
    """Nesting depth of a parsed JSON value, stopping early once past `limit`."""
    stack = [(value, 1)]
    deepest = 0
    while stack:
        node, depth = stack.pop()
        deepest = max(deepest, depth)
        if deepest > limit:
            return deepest
        if isinstance(node, dict):
            stack.extend((v, depth + 1) for v in node.values())
        elif isinstance(node, list):
            stack.extend((v, depth + 1) for v in node)
    return deepest


def looks_like_json(text: str) -> bool:
    """Whether the user meant a JSON caption (it starts with '{'), as opposed to prose."""
    return text.lstrip().startswith("{")


def parse_caption(text: str) -> dict:
    """Parse a JSON caption; raise CaptionParseError with the line and column of the problem."""
    if not isinstance(text, str):
        raise CaptionParseError(f"a caption must be text, got {type(text).__name__}", 1, 1)
    if len(text) > PROMPT_MAX_CHARS:
        raise CaptionParseError(
            f"the caption is {len(text)} characters long; at most {PROMPT_MAX_CHARS} are allowed", 1, 1, text
        )
    if not text.strip():
        raise CaptionParseError("the caption is empty; write a JSON object such as {\"subjects\": [...]}", 1, 1, text)
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise CaptionParseError(exc.msg, exc.lineno, exc.colno, text) from None
    except RecursionError:
        raise CaptionParseError(f"the JSON is nested too deeply (more than {MAX_CAPTION_DEPTH} levels)", 1, 1, text) from None
    if not isinstance(value, dict):
        start = len(text) - len(text.lstrip())
        line, column = _position(text, start)
        raise CaptionParseError(
            f"a caption must be a JSON object {{...}}, got {_json_type(value)}", line, column, text
        )
    if _depth(value, MAX_CAPTION_DEPTH) > MAX_CAPTION_DEPTH:
        raise CaptionParseError(f"the JSON is nested too deeply (more than {MAX_CAPTION_DEPTH} levels)", 1, 1, text)
    return value


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


# ----------------------------------------------------------------------------------------------
# Field validation
# ----------------------------------------------------------------------------------------------


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _check_value(spec: Field, value: Any, path: str, issues: list[FieldIssue]) -> None:
    kind = spec.kind
    got = _json_type(value)
    if kind == TEXT:
        if not isinstance(value, str):
            issues.append(FieldIssue(path, f"must be a string, got {got}"))
    elif kind == TEXT_OR_NUMBER:
        if not (isinstance(value, str) or _is_number(value)):
            issues.append(FieldIssue(path, f"must be a string or a number, got {got}"))
    elif kind == COUNT:
        if isinstance(value, str):
            return
        if not _is_number(value) or value != int(value) or value < 0:
            issues.append(FieldIssue(path, f"must be a whole number >= 0 (or a word such as \"two\"), got {value!r}"))
    elif kind == INT:
        if not _is_number(value) or value != int(value):
            issues.append(FieldIssue(path, f"must be a whole number, got {value!r}"))
        elif spec.name in ("H", "W") and value <= 0:
            issues.append(FieldIssue(path, f"must be positive, got {value!r}"))
    elif kind == NUMBER:
        if not _is_number(value) or value != value or value in (float("inf"), float("-inf")):
            issues.append(FieldIssue(path, f"must be a number, got {got}"))
        elif value <= 0:
            issues.append(FieldIssue(path, f"must be positive, got {value!r}"))
    elif kind == TIME_RANGE:
        if not isinstance(value, str) or not _TIME_RANGE.match(value.strip()):
            issues.append(FieldIssue(path, f"must be a time range \"M:SS-M:SS\" such as \"0:00-0:03\", got {value!r}"))
    elif kind == ASPECT:
        if value not in ASPECT_RATIOS:
            issues.append(FieldIssue(path, f"must be one of {list(ASPECT_RATIOS)}, got {value!r}"))
    elif kind == DURATION:
        match = _DURATION.match(value) if isinstance(value, str) else None
        if not match:
            issues.append(FieldIssue(path, f"must be whole seconds such as \"5s\", got {value!r}"))
        elif not DURATION_RANGE_S[0] <= int(match.group(1)) <= DURATION_RANGE_S[1]:
            lo, hi = DURATION_RANGE_S
            issues.append(FieldIssue(path, f"the model was trained on {lo}s..{hi}s clips, got {value!r}", "warning"))
    elif kind == FREE_OBJECT:
        if not isinstance(value, dict):
            issues.append(FieldIssue(path, f"must be an object {{...}}, got {got}"))
    elif kind == OBJECT:
        if not isinstance(value, dict):
            issues.append(FieldIssue(path, f"must be an object {{...}}, got {got}"))
            return
        for key, sub in value.items():
            child = spec.child(key)
            if child is not None:
                _check_value(child, sub, f"{path}.{key}", issues)
    elif kind == LIST:
        if not isinstance(value, list):
            issues.append(FieldIssue(path, f"must be a list [...], got {got}"))
            return
        for index, item in enumerate(value):
            item_path = f"{path}[{index}]"
            if spec.item == OBJECT:
                _check_value(Field(spec.name, OBJECT, spec.children), item, item_path, issues)
            elif spec.item == TEXT:
                _check_value(Field(spec.name, TEXT), item, item_path, issues)
            elif spec.item == TEXT_OR_OBJECT and not isinstance(item, (str, dict)):
                issues.append(FieldIssue(item_path, f"must be a string or an object, got {_json_type(item)}"))


def validate_caption(caption: dict, kind: str) -> list[FieldIssue]:
    """Type problems in a parsed caption, each naming its field. Warnings do not block a request."""
    schema = fields_for(kind)
    issues: list[FieldIssue] = []
    if not isinstance(caption, dict):
        return [FieldIssue("(caption)", f"must be a JSON object, got {_json_type(caption)}")]
    other = "video" if kind == "image" else "image"
    other_only = IMAGE_ONLY_FIELDS if kind == "video" else VIDEO_ONLY_FIELDS
    for key, value in caption.items():
        spec = schema.get(key)
        if spec is not None:
            _check_value(spec, value, key, issues)
        elif key in other_only:
            issues.append(FieldIssue(key, f"is a field of {other} captions; the model ignores it here", "warning"))
    subjects = caption.get("subjects")
    if isinstance(subjects, list):
        other_subject = IMAGE_ONLY_SUBJECT_FIELDS if kind == "video" else VIDEO_ONLY_SUBJECT_FIELDS
        for index, subject in enumerate(subjects):
            if isinstance(subject, dict):
                for key in subject:
                    if key in other_subject:
                        issues.append(FieldIssue(
                            f"subjects[{index}].{key}", f"is a field of {other} captions; the model ignores it here",
                            "warning",
                        ))
    return issues


# ----------------------------------------------------------------------------------------------
# Text forms and metadata
# ----------------------------------------------------------------------------------------------


def to_prompt(caption: dict) -> str:
    """The compact one-line form a JSON caption is sent in."""
    return json.dumps(caption, ensure_ascii=False)


def pretty(caption: dict) -> str:
    """The indented form shown in the editor."""
    return json.dumps(caption, ensure_ascii=False, indent=2)


def nearest_aspect_ratio(width: int, height: int) -> str:
    ratio = width / height if height > 0 else 1.0
    return min(ASPECT_RATIOS, key=lambda r: abs(int(r.split(",")[0]) / int(r.split(",")[1]) - ratio))


def inject_metadata(caption: dict, *, width: int, height: int, num_frames: int, fps: float, is_image: bool) -> dict:
    """A copy of `caption` with the request's canvas and timing, the way serving engines set them.

    resolution always (overriding the caption's), aspect_ratio the nearest of the five; for video
    duration "{int(F/fps)}s" and fps as a float; for images duration and fps are removed.
    """
    out = copy.deepcopy(caption)
    out["resolution"] = {"H": int(height), "W": int(width)}
    out["aspect_ratio"] = nearest_aspect_ratio(int(width), int(height))
    if is_image:
        for key in IMAGE_DROPPED_METADATA:
            out.pop(key, None)
    else:
        out["duration"] = f"{int(num_frames / fps) if fps > 0 else 0}s"
        out["fps"] = float(fps)
    return out


# ----------------------------------------------------------------------------------------------
# Form <-> JSON
# ----------------------------------------------------------------------------------------------
# The form shows the main fields as text boxes and three lists as tables. Converting back is a
# merge into the caption the form was made from: only cells whose text changed are written, so
# keys the form does not show, and values it cannot show faithfully, survive a round trip.

FormPath = tuple[str, ...]


@dataclass(frozen=True)
class FormText:
    path: FormPath
    label: str

    @property
    def key(self) -> str:
        return ".".join(self.path)


@dataclass(frozen=True)
class FormTable:
    name: str  # the list field: "subjects", "actions", "segments"
    columns: tuple[str, ...]
    label: str
    numeric: tuple[str, ...] = ()  # columns written back as numbers when they parse as one


@dataclass(frozen=True)
class FormLayout:
    kind: str
    texts: tuple[FormText, ...]
    tables: tuple[FormTable, ...] = field(default=())

    def text_keys(self) -> list[str]:
        return [t.key for t in self.texts]


def _form_texts(kind: str) -> tuple[FormText, ...]:
    items = [
        (("background_setting",), "Background / setting"),
        (("lighting", "conditions"), "Lighting: conditions"),
        (("lighting", "direction"), "Lighting: direction"),
        (("lighting", "shadows"), "Lighting: shadows"),
        (("lighting", "illumination_effect"), "Lighting: illumination effect"),
        (("aesthetics", "composition"), "Aesthetics: composition"),
        (("aesthetics", "color_scheme"), "Aesthetics: color scheme"),
        (("aesthetics", "mood_atmosphere"), "Aesthetics: mood / atmosphere"),
        (("aesthetics", "patterns"), "Aesthetics: patterns"),
        (("cinematography", "camera_motion"), "Camera motion"),
        (("cinematography", "framing"), "Framing"),
        (("cinematography", "camera_angle"), "Camera angle"),
        (("cinematography", "depth_of_field"), "Depth of field"),
        (("cinematography", "focus"), "Focus"),
        (("cinematography", "lens_focal_length"), "Lens focal length"),
        (("style_medium",), "Style: medium"),
        (("artistic_style",), "Style: artistic style"),
        (("context",), "Context"),
    ]
    if kind == "video":
        items += [(("temporal_caption",), "Temporal caption"), (("audio_description",), "Audio description")]
    else:
        items += [(("comprehensive_t2i_caption",), "Comprehensive caption")]
    return tuple(FormText(path, label) for path, label in items)


def form_layout(kind: str) -> FormLayout:
    fields_for(kind)
    if kind == "video":
        subjects = FormTable(
            "subjects", ("description", "appearance_details", "location", "action", "clothing", "expression"),
            "Subjects",
        )
        tables = (
            subjects,
            FormTable("actions", ("time", "description"), "Actions (time \"M:SS-M:SS\")"),
            FormTable(
                "segments", ("segment_index", "time_range", "description", "key_changes", "camera"), "Segments",
                numeric=("segment_index",),
            ),
        )
    else:
        tables = (
            FormTable(
                "subjects", ("description", "appearance_details", "location", "pose", "clothing", "expression"),
                "Subjects",
            ),
        )
    return FormLayout(kind, _form_texts(kind), tables)


def _cell_text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return str(value)
    return json.dumps(value, ensure_ascii=False)


def _get_path(caption: dict, path: FormPath) -> Any:
    node: Any = caption
    for key in path:
        if not isinstance(node, dict) or key not in node:
            return None
        node = node[key]
    return node


@dataclass
class FormValues:
    texts: dict[str, str]
    tables: dict[str, list[list[str]]]


def caption_to_form(caption: dict, kind: str) -> FormValues:
    """The form's text boxes and table rows for a caption (values shown as text)."""
    layout = form_layout(kind)
    texts = {t.key: _cell_text(_get_path(caption, t.path)) for t in layout.texts}
    tables: dict[str, list[list[str]]] = {}
    for table in layout.tables:
        items = caption.get(table.name)
        rows = []
        if isinstance(items, list):
            for item in items:
                if isinstance(item, dict):
                    rows.append([_cell_text(item.get(c)) for c in table.columns])
                else:
                    rows.append([_cell_text(item)] + [""] * (len(table.columns) - 1))
        tables[table.name] = rows
    return FormValues(texts, tables)


def _set_path(caption: dict, path: FormPath, text: str) -> None:
    """Write `text` at `path`, or remove the key (and emptied parents) when it is blank."""
    parents = [caption]
    node = caption
    for key in path[:-1]:
        child = node.get(key)
        if not isinstance(child, dict):
            if not text.strip():
                return
            child = {}
            node[key] = child
        node = child
        parents.append(node)
    if text.strip():
        node[path[-1]] = text.strip()
        return
    node.pop(path[-1], None)
    for depth in range(len(path) - 1, 0, -1):
        if parents[depth]:
            break
        parents[depth - 1].pop(path[depth - 1], None)


def _numeric(text: str) -> Any:
    stripped = text.strip()
    try:
        return int(stripped)
    except ValueError:
        pass
    try:
        return float(stripped)
    except ValueError:
        return stripped


def _normalise_rows(rows: Iterable | None, width: int) -> list[list[str]]:
    out = []
    for row in rows or []:
        cells = [_cell_text(c) for c in list(row)[:width]]
        cells += [""] * (width - len(cells))
        out.append(cells)
    return out


def form_to_caption(base: dict, texts: dict[str, str], tables: dict[str, Any], kind: str) -> dict:
    """Merge edited form values into `base` (the caption the form was shown for) and return a copy.

    A text box or cell is written only when its text differs from what `base` shows, so untouched
    fields keep their exact values and types. Blank text removes the key. Table rows merge into the
    list items at the same index, keeping each item's keys the table does not show; blank rows are
    dropped and rows beyond the table's end are removed.
    """
    layout = form_layout(kind)
    shown = caption_to_form(base, kind)
    out = copy.deepcopy(base)
    for text in layout.texts:
        new = _cell_text(texts.get(text.key, ""))
        if new.strip() != shown.texts[text.key].strip():
            _set_path(out, text.path, new)
    for table in layout.tables:
        if table.name not in tables:
            continue
        new_rows = _normalise_rows(tables[table.name], len(table.columns))
        old_rows = shown.tables[table.name]
        if new_rows == old_rows:
            continue
        old_items = base.get(table.name) if isinstance(base.get(table.name), list) else []
        items = []
        for index, row in enumerate(new_rows):
            old_item = old_items[index] if index < len(old_items) else None
            if index < len(old_rows) and row == old_rows[index] and old_item is not None:
                items.append(copy.deepcopy(old_item))
                continue
            item = copy.deepcopy(old_item) if isinstance(old_item, dict) else {}
            old_row = old_rows[index] if index < len(old_rows) else [""] * len(table.columns)
            for column, cell, old_cell in zip(table.columns, row, old_row):
                if cell.strip() == old_cell.strip() and (column in item or not cell.strip()):
                    continue
                if cell.strip():
                    item[column] = _numeric(cell) if column in table.numeric else cell.strip()
                else:
                    item.pop(column, None)
            if item:
                items.append(item)
        if items:
            out[table.name] = items
        else:
            out.pop(table.name, None)
    return out
