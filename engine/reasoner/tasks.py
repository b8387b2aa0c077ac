"""What the reasoner is asked for each task, in the project's own words, and how critiques are read."""
from __future__ import annotations

import re

from ..pipeline.captions import fields_for
from .caption import REQUIRED_FIELDS


def _schema_lines(kind: str) -> str:
    schema = fields_for(kind)
    lines = []
    for name, spec in schema.items():
        if spec.children:
            inner = ", ".join(c.name for c in spec.children)
            shape = "list of objects" if spec.kind == "list" else "object"
            lines.append(f"- {name}: {shape} with {inner}")
        else:
            lines.append(f"- {name}: {spec.kind.replace('_', ' ')}")
    return "\n".join(lines)


def _decoded_lines(schema: dict) -> str:
    """The fields of a decoding schema (engine.reasoner.schema), in the order they are written."""
    lines = []
    for name, spec in schema["properties"].items():
        inner = spec.get("items", spec)
        if inner.get("type") == "object":
            shape = f"list of up to {spec['maxItems']} objects" if spec.get("type") == "array" else "object"
            lines.append(f"- {name}: {shape} with {', '.join(inner['properties'])}")
        else:
            lines.append(f"- {name}: text")
    return "\n".join(lines)


def caption_system_prompt(kind: str, decoding=None) -> str:
    """The caption task's instructions; with `decoding` (a schema.DecodingSchema), the fields and
    lengths the answer is decoded under, in its order."""
    medium = "a video" if kind == "video" else "an image"
    timing = (" Give actions as a list of {\"time\": \"M:SS-M:SS\", \"description\"} in order."
              if kind == "video" else "")
    if decoding is None:
        fields, limits = _schema_lines(kind), ""
    else:
        from .schema import limits_text

        fields, limits = _decoded_lines(decoding.schema), " " + limits_text(decoding)
    return (
        f"You write structured captions for a model that generates {medium} from them. Answer with one JSON "
        f"object and nothing else: no prose, no code fence. Be concrete and visual; fill every field you can "
        f"infer and always include {', '.join(REQUIRED_FIELDS[kind])}.{timing}{limits}\n"
        f"Fields of {medium} caption (text unless said otherwise):\n{fields}"
    )


def enhance_text(prompt: str, has_image: bool) -> str:
    frame = " The attached image is the first frame: keep what it shows." if has_image else ""
    return f"Turn this idea into a full caption.{frame}\nIdea: {prompt}"


def describe_text(prompt: str, is_video: bool) -> str:
    what = "video" if is_video else "image"
    extra = f"\nAlso consider: {prompt}" if prompt else ""
    return f"Describe this {what} as a full caption, so that it can be generated again from the caption.{extra}"


CRITIQUE_SYSTEM = (
    "You review results of a generative video and image model. First describe in a few sentences what the "
    "result shows. Then answer each criterion on its own line as `criterion: N - reason`, N from 1 (poor) to "
    "5 (excellent). Judge only what you see."
)


CRITIQUE_SCHEMA_SYSTEM = (
    "You review results of a generative video and image model. Answer with one JSON object: `summary`, a few "
    "sentences on what the result shows; then `scores`, for each criterion in the order given, its `score` from "
    "1 (poor) to 5 (excellent) and the `reason` for it. Judge only what you see."
)


def critique_text(prompt: str, criteria: tuple[str, ...], is_video: bool) -> str:
    listed = "\n".join(f"- {c}" for c in criteria)
    what = "video" if is_video else "image"
    return (f"This {what} was generated from the prompt below. Review it.\nPrompt: {prompt}\n"
            f"Criteria:\n{listed}")


def read_scores(text: str, criteria: tuple[str, ...]) -> dict[str, int | None]:
    """The 1-5 score the critique gave each criterion, None where it gave none (never guessed)."""
    scores: dict[str, int | None] = {}
    for name in criteria:
        spaced = re.escape(name).replace("_", "[ _]")
        match = re.search(rf"{spaced}\W{{0,4}}\s*(?:score\s*)?([1-5])(?!\d)", text, re.I)
        scores[name] = int(match.group(1)) if match else None
    return scores
