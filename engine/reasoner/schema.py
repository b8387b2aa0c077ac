"""The JSON Schemas the reasoner decodes under, sized so that every answer closes within its token budget.

A caption's schema comes from `engine.pipeline.captions` (the one source of its fields, their kinds and
order): the fields a caption must have (`caption.REQUIRED_FIELDS`) and the editor's main ones, texts
bounded in characters and lists in items. Text is printable ASCII without escapes, so each character
is one byte, and every token the grammar allows is at least one byte: the longest answer the schema
admits, in bytes, bounds the answer in tokens. The bounds are chosen from the request's token budget
so that this longest answer, plus the end-of-text token, fits it. A critique's schema works the same
way: a short description, then one score 1..5 and a reason per criterion.
"""
from __future__ import annotations

import json
from dataclasses import dataclass

from ..pipeline.captions import SCHEMA_TIME_RANGE_CHARS, caption_json_schema, fields_for, schema_text
from .caption import REQUIRED_FIELDS

# Lists in a decoded caption: enough subjects and timed actions for a 2-10 s clip.
MAX_ITEMS = {"subjects": 3, "actions": 4}
# Share of the character budget a text gets, by its name; the rest get 1 share each.
TEXT_SHARES = {"description": 4, "temporal_caption": 6, "comprehensive_t2i_caption": 6, "background_setting": 3,
               "appearance_details": 2, "summary": 4, "reason": 2}
MIN_CHARS_PER_SHARE = 8  # below this a caption says nothing: the budget is refused instead
MAX_TEXT_CHARS = 1200  # no single field longer than a paragraph, however large the budget
CRITIQUE_SCORES = (1, 2, 3, 4, 5)


class SchemaBudgetError(ValueError):
    """The token budget cannot hold the schema's fields; the message says how many tokens they need."""


@dataclass(frozen=True)
class DecodingSchema:
    """A schema and the longest answer it admits."""

    schema: dict
    longest_bytes: int  # bytes of the longest answer (compact separators, no whitespace)
    text_chars: dict[str, int]  # the character bound of each text, by its path ("subjects.description")


# What an enhanced or described caption holds: the fields a caption must have (caption.REQUIRED_FIELDS)
# and the editor's main ones, each shown by the caption editor (`form_layout`; a test checks). Every
# field decoded takes room from the others (the longest answer must fit the budget), so the editor's
# finer fields (focus, lens, patterns, clothing...) are left for the user, and segments, which repeat
# what actions say, are not decoded.
_DECODED_COMMON = {
    "lighting": ("conditions", "direction", "shadows"),
    "aesthetics": ("composition", "color_scheme", "mood_atmosphere"),
    "cinematography": ("camera_motion", "framing", "camera_angle"),
    "background_setting": (), "style_medium": (), "artistic_style": (), "context": (),
}
DECODED_FIELDS = {
    "image": {"subjects": ("description", "appearance_details", "location", "pose"), **_DECODED_COMMON,
              "comprehensive_t2i_caption": ()},
    "video": {"subjects": ("description", "appearance_details", "location", "action"), **_DECODED_COMMON,
              "actions": ("time", "description"), "temporal_caption": (), "audio_description": ()},
}


def caption_selection(kind: str) -> dict[str, tuple[str, ...]]:
    """Top-level field -> sub-fields decoded for a caption of `kind`, in the caption schema's order."""
    order = list(fields_for(kind))
    chosen = DECODED_FIELDS[kind]
    return {name: chosen[name] for name in sorted(chosen, key=order.index)}


def longest_bytes(schema: dict) -> int:
    """Bytes of the longest JSON text `schema` admits, written compactly (',' and ':', no spaces).
    Takes the subset of JSON Schema this module writes: objects with closed properties, arrays with
    maxItems, strings with maxLength (ASCII, so characters are bytes), integer enums."""
    if "enum" in schema:
        return max(len(json.dumps(v)) for v in schema["enum"])
    kind = schema["type"]
    if kind == "string":
        return 2 + int(schema["maxLength"])
    if kind == "array":
        items = int(schema["maxItems"])
        return 2 + items * longest_bytes(schema["items"]) + max(items - 1, 0)
    if kind == "object":
        props = schema["properties"]
        keys = sum(len(json.dumps(k, ensure_ascii=False).encode()) + 1 for k in props)
        return 2 + keys + sum(longest_bytes(v) for v in props.values()) + max(len(props) - 1, 0)
    raise ValueError(f"longest_bytes takes object, array, string and enum schemas, got {schema!r}")


def _text_paths(schema: dict, prefix: str = "") -> list[tuple[str, int]]:
    """(path, how many times it can occur) of every bounded text in a schema written here."""
    out = []
    if schema.get("type") == "object":
        for name, sub in schema["properties"].items():
            out += _text_paths(sub, f"{prefix}.{name}" if prefix else name)
    elif schema.get("type") == "array":
        out += [(p, n * int(schema["maxItems"])) for p, n in _text_paths(schema["items"], prefix)]
    elif schema.get("type") == "string" and "enum" not in schema and schema["maxLength"] != SCHEMA_TIME_RANGE_CHARS:
        out.append((prefix, 1))
    return out


def _shares(path: str) -> int:
    return TEXT_SHARES.get(path.rsplit(".", 1)[-1], 1)


def _fit(build, budget: int, what: str) -> DecodingSchema:
    """Build the schema with text bounds scaled so its longest answer plus EOS fits `budget` tokens.
    `build(text_chars)` makes the schema for a path -> characters function."""
    skeleton = build(lambda path: 0)
    frame = longest_bytes(skeleton)
    shares = sum(_shares(p) * n for p, n in _text_paths(skeleton))
    room = budget - 1 - frame
    needed = frame + 1 + shares * MIN_CHARS_PER_SHARE
    if room < shares * MIN_CHARS_PER_SHARE:
        raise SchemaBudgetError(f"max_new_tokens is {budget}, too few for {what} under its schema: its fields need "
                                f"at least {needed} tokens.")
    per_share = room // shares
    chars = {p: min(per_share * _shares(p), MAX_TEXT_CHARS) for p, _ in _text_paths(skeleton)}
    schema = build(lambda path: chars[path])
    longest = longest_bytes(schema)
    assert longest + 1 <= budget, (longest, budget)
    return DecodingSchema(schema, longest, chars)


def caption_schema(kind: str, budget: int) -> DecodingSchema:
    """The schema a caption of `kind` is decoded under within `budget` tokens."""
    selection = caption_selection(kind)
    # An object or list item that is written must say something: its first field, or these.
    objects = {name: children[:1] for name, children in selection.items() if children}
    objects.update(subjects=("description",), actions=("time", "description"), cinematography=("framing",))
    return _fit(lambda text_chars: caption_json_schema(
        kind, selection, text_chars=text_chars, max_items=MAX_ITEMS, required=REQUIRED_FIELDS[kind],
        child_required=objects), budget, f"an {kind} caption" if kind == "image" else f"a {kind} caption")


def critique_schema(criteria: tuple[str, ...], budget: int) -> DecodingSchema:
    """The schema a critique is decoded under: a summary of what the result shows, then for each
    criterion (in the request's order) a score 1..5 and the reason for it."""
    def build(text_chars) -> dict:
        def text(path: str) -> dict:
            return schema_text(text_chars(path), min_chars=min(1, text_chars(path)))

        per = {c: {"type": "object", "properties": {"score": {"enum": list(CRITIQUE_SCORES)},
                                                    "reason": text(f"scores.{c}.reason")},
                   "required": ["score", "reason"], "additionalProperties": False} for c in criteria}
        return {"type": "object", "properties": {
            "summary": text("summary"),
            "scores": {"type": "object", "properties": per, "required": list(criteria), "additionalProperties": False},
        }, "required": ["summary", "scores"], "additionalProperties": False}

    return _fit(build, budget, "a critique")


def scores_from_critique(answer: dict, criteria: tuple[str, ...]) -> dict[str, int | None]:
    """Each criterion's score from a critique decoded under `critique_schema`."""
    scores = answer.get("scores") if isinstance(answer, dict) else None
    out: dict[str, int | None] = {}
    for name in criteria:
        entry = scores.get(name) if isinstance(scores, dict) else None
        value = entry.get("score") if isinstance(entry, dict) else None
        out[name] = value if value in CRITIQUE_SCORES else None
    return out


def limits_text(decoding: DecodingSchema) -> str:
    """The character bounds, told to the model so that it writes within them rather than being cut."""
    bounds = sorted(set(decoding.text_chars.values()))
    if not bounds:
        return ""
    return (f"Plain ASCII text, no double quotes or backslashes; each text field at most "
            f"{bounds[0]}-{bounds[-1]} characters (descriptions the longest).")
