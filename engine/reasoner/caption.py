"""From a reasoner's answer to a caption in the project's schema (engine.captions), or a precise error.

Model answers go wrong in a few known ways: the JSON sits in a code fence or after a sentence, the
answer was cut off by the token budget, a trailing comma, a field of the wrong type (a number where
text goes, one subject object where a list goes), or a field the caption needs is missing. The first
kinds are repaired here, in the open (each repair is reported); what cannot be repaired becomes a
`CaptionProblem` that says exactly what was wrong, which the caller feeds back to the model for a
bounded number of retries.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from ..pipeline.captions import LIST, TEXT, TEXT_OR_NUMBER, CaptionParseError, fields_for, parse_caption, \
    validate_caption

# What an enhanced caption must have to be worth generating from (all schema fields are optional to
# the generator, but a caption without these says too little).
REQUIRED_FIELDS = {
    "image": ("subjects", "background_setting", "lighting", "cinematography"),
    "video": ("subjects", "background_setting", "lighting", "cinematography", "actions"),
}
MAX_ATTEMPTS = 3

_FENCE = re.compile(r"```(?:json|JSON)?\s*(.*?)```", re.S)
_TRAILING_COMMA = re.compile(r",\s*([}\]])")


@dataclass(frozen=True)
class CaptionProblem(Exception):
    """Why one answer is not a usable caption."""

    what: str  # "not_json" | "field_types" | "missing_fields"
    detail: str

    def __str__(self) -> str:
        return self.detail


def _close_truncated(text: str) -> str:
    """Close the strings, lists and objects left open by an answer cut off mid-way."""
    stack, in_string, escaped = [], False, False
    for char in text:
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "{[":
            stack.append("}" if char == "{" else "]")
        elif char in "}]" and stack:
            stack.pop()
    closed = text + ('"' if in_string else "")
    closed = re.sub(r"[,:]\s*$", "", closed.rstrip())
    return closed + "".join(reversed(stack))


def extract_json(text: str) -> tuple[dict, list[str]]:
    """The JSON object in an answer, and the repairs it took. Raises CaptionProblem("not_json")."""
    repairs: list[str] = []
    body = text.strip()
    fenced = _FENCE.search(body)
    if fenced:
        body = fenced.group(1).strip()
        repairs.append("took the JSON out of a code fence")
    start = body.find("{")
    if start < 0:
        raise CaptionProblem("not_json", f"the answer holds no JSON object (no '{{'); it begins {text[:80]!r}")
    if start > 0:
        repairs.append(f"dropped {start} characters of text before the JSON")
    body = body[start:]
    attempts = [("", body)]
    end = body.rfind("}")
    if 0 < end < len(body) - 1:
        attempts.insert(0, (f"dropped {len(body) - end - 1} characters of text after the JSON", body[:end + 1]))
    attempts.append(("removed trailing commas", _TRAILING_COMMA.sub(r"\1", body)))
    attempts.append(("closed an answer cut off mid-way", _TRAILING_COMMA.sub(r"\1", _close_truncated(body))))
    first_error: CaptionParseError | None = None
    for note, candidate in attempts:
        try:
            caption = parse_caption(candidate)
        except CaptionParseError as exc:
            first_error = first_error or exc
            continue
        return caption, repairs + ([note] if note else [])
    raise CaptionProblem("not_json", f"the answer is not valid JSON: {first_error}")


def _coerce(spec_kind: str, value):
    """A value of the wrong type turned into the right one, or None where no safe repair exists."""
    if spec_kind in (TEXT, TEXT_OR_NUMBER) and isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value) if spec_kind == TEXT else value
    if spec_kind == TEXT and isinstance(value, list) and all(isinstance(v, str) for v in value):
        return "; ".join(value)
    if spec_kind == LIST and isinstance(value, dict):
        return [value]
    return None


def repair_types(caption: dict, kind: str) -> tuple[dict, list[str]]:
    """Fix the top-level and subject fields whose type has one obvious repair; report each."""
    schema = fields_for(kind)
    repairs: list[str] = []
    fixed = dict(caption)
    for key, value in caption.items():
        spec = schema.get(key)
        if value is None:
            del fixed[key]
            repairs.append(f"dropped {key}: null")
            continue
        if spec is None:
            continue
        new = _coerce(spec.kind, value)
        if new is not None and new is not value:
            fixed[key] = new
            repairs.append(f"{key}: turned {type(value).__name__} into {type(new).__name__}")
    subjects = fixed.get("subjects")
    subject_spec = schema["subjects"]
    if isinstance(subjects, list):
        fixed["subjects"] = [dict(s) if isinstance(s, dict) else s for s in subjects]
        for index, subject in enumerate(fixed["subjects"]):
            if not isinstance(subject, dict):
                continue
            for key, value in list(subject.items()):
                child = subject_spec.child(key)
                new = _coerce(child.kind, value) if child is not None else None
                if new is not None and new is not value:
                    subject[key] = new
                    repairs.append(f"subjects[{index}].{key}: turned {type(value).__name__} into {type(new).__name__}")
    return fixed, repairs


def caption_from_answer(text: str, kind: str) -> tuple[dict, list[str]]:
    """A schema-valid caption from one answer, with the repairs made; CaptionProblem otherwise."""
    caption, repairs = extract_json(text)
    caption, more = repair_types(caption, kind)
    repairs += more
    errors = [i for i in validate_caption(caption, kind) if i.severity == "error"]
    if errors:
        raise CaptionProblem("field_types", "wrong field types: " + "; ".join(str(i) for i in errors))
    missing = [name for name in REQUIRED_FIELDS[kind] if not caption.get(name)]
    if missing:
        raise CaptionProblem("missing_fields", f"missing fields: {', '.join(missing)} (a {kind} caption needs "
                                               f"{', '.join(REQUIRED_FIELDS[kind])})")
    subjects = caption["subjects"]
    bare = [i for i, s in enumerate(subjects) if not (isinstance(s, dict) and s.get("description"))]
    if bare:
        raise CaptionProblem("missing_fields", "missing fields: " + ", ".join(f"subjects[{i}].description" for i in bare))
    return caption, repairs


class EnhanceError(ValueError):
    """No usable caption within the attempts; the message lists what each attempt got wrong."""

    def __init__(self, kind: str, problems: list[CaptionProblem], last_answer: str):
        self.field = "prompt"
        self.problems = problems
        self.last_answer = last_answer
        lines = "; ".join(f"attempt {i + 1}: {p.detail}" for i, p in enumerate(problems))
        super().__init__(f"The reasoner gave no valid {kind} caption in {len(problems)} attempts ({lines}).")


def feedback(problem: CaptionProblem, answer: str) -> str:
    """What the next attempt is told about the previous one."""
    shown = answer if len(answer) <= 2000 else answer[:2000] + " ..."
    return (f"Your previous answer was rejected: {problem.detail}.\nPrevious answer:\n{shown}\n"
            "Write the whole caption again as one JSON object and nothing else.")


__all__ = ["CaptionProblem", "EnhanceError", "MAX_ATTEMPTS", "REQUIRED_FIELDS", "caption_from_answer",
           "extract_json", "feedback", "repair_types"]
