"""The prompt stage: from a request to the exact text and token ids the model sees.

Light on purpose (no torch): validation previews the prompt text without loading a model.

Prose prompts get the reference's sentence templates (and their "is not" forms on the negative).
A prompt that is one JSON object (a structured caption) instead gets its canvas and timing
metadata injected, as the serving engines do, and no sentences: this is where we deliberately
differ from diffusers, which appends the sentences to JSON too (cosmos3.md section 5).
"""
from __future__ import annotations

from dataclasses import dataclass

from ..model.action import action_caption
from ..model.variants import VariantInfo
from ..events import SafetyRefusal
from . import captions
from .request import Request

SYSTEM_PROMPT_IMAGE = "You are a helpful assistant who will generate images from a give prompt."
SYSTEM_PROMPT_VIDEO = "You are a helpful assistant who will generate videos from a give prompt."

_DURATION = "The video is {duration:.1f} seconds long and is of {fps:.0f} FPS."
_NOT_DURATION = "The video is not {duration:.1f} seconds long and is not of {fps:.0f} FPS."
_RESOLUTION = "This {kind} is of {height}x{width} resolution."
_NOT_RESOLUTION = "This {kind} is not of {height}x{width} resolution."


@dataclass(frozen=True)
class PromptTexts:
    prompt_text: str
    negative_prompt_text: str
    use_system_prompt: bool
    is_json: bool


def _append(base: str, sentence: str) -> str:
    base = base.rstrip(".")
    return f"{base}. {sentence}" if base else sentence


def apply_sentence_templates(text: str, *, negative: bool, width: int, height: int, num_frames: int, fps: float) -> str:
    """The reference's prose templates: duration (video only), then resolution."""
    is_image = num_frames == 1
    if not is_image:
        template = _NOT_DURATION if negative else _DURATION
        text = _append(text, template.format(duration=num_frames / fps, fps=fps))
    template = _NOT_RESOLUTION if negative else _RESOLUTION
    return _append(text, template.format(kind="image" if is_image else "video", height=height, width=width))


def canvas_of(request: dict) -> tuple[int, int]:
    """(width, height) the model is conditioned on; action runs resolve theirs from the input."""
    return int(request["width"]), int(request["height"])


def build_prompt_texts(info: VariantInfo, request: Request) -> PromptTexts:
    """Final user-message texts for a validated request (width/height already resolved); its captions
    were parsed by validation and are not parsed again."""
    width, height = canvas_of(request)
    frames, fps = int(request["num_frames"]), float(request["fps"])
    prompt, negative = request["prompt"], request.get("negative_prompt") or ""
    geometry = dict(width=width, height=height, num_frames=frames, fps=fps)
    if request["mode"] == "action":
        action = request["action"]
        text = action_caption(prompt, action["view_point"], frames, fps, height, width)
        # The reference sends the action negative as given, without templates.
        return PromptTexts(text, negative, info.default_use_system_prompt, True)
    caption = request.caption_of("prompt")
    if caption is not None:
        prompt_text = captions.to_prompt(captions.inject_metadata(caption, is_image=frames == 1, **geometry))
    else:
        prompt_text = apply_sentence_templates(prompt, negative=False, **geometry)
    negative_caption = request.caption_of("negative_prompt") if negative else None
    if negative_caption is not None:
        # A JSON negative describes what to avoid; the positive's canvas is not written into it.
        negative_text = captions.to_prompt(negative_caption)
    else:
        negative_text = apply_sentence_templates(negative, negative=True, **geometry)
    return PromptTexts(prompt_text, negative_text, info.default_use_system_prompt, caption is not None)


def tokenize(tokenizer, text: str, *, is_image: bool, use_system_prompt: bool) -> list[int]:
    """Chat template with the trained system prompt, then EOS and `<|vision_start|>`."""
    messages = []
    if use_system_prompt:
        messages.append({"role": "system", "content": SYSTEM_PROMPT_IMAGE if is_image else SYSTEM_PROMPT_VIDEO})
    messages.append({"role": "user", "content": text})
    encoded = tokenizer.apply_chat_template(
        messages, tokenize=True, add_generation_prompt=True, add_vision_id=False, return_dict=True
    )
    return list(encoded["input_ids"]) + [tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids("<|vision_start|>")]


def prompt_stage(state) -> None:
    """The final texts (on the canvas the conditioning stage settled) and each branch's token ids. Reads `model`,
    `request`, `cond`; writes `texts` and `token_ids`.
    `state`: the request's `engine.pipeline.state.RunState` (not imported: the state imports this module)."""
    model, request, cond = state.model, state.request, state.cond
    state.texts = texts = build_prompt_texts(model.info, request.replace(width=cond.width, height=cond.height))
    is_image = request["num_frames"] == 1
    state.token_ids = tuple(tokenize(model.tokenizer, text, is_image=is_image, use_system_prompt=texts.use_system_prompt)
                            for text in (texts.prompt_text, texts.negative_prompt_text))


def safety_check_prompt(model, prompt: str) -> None:
    """With a guardrail loaded, refuse an unsafe prompt before any GPU work."""
    if model.safety_checker is not None and not model.safety_checker.check_text_safety(prompt):
        raise SafetyRefusal("The safety checker refused this prompt; nothing was generated.")


def preview_prompt_texts(info: VariantInfo, request: Request) -> tuple[str, str]:
    """What would be sent for `request` (validated), without loading the model.

    Action runs size their canvas from the uploaded input, so their preview uses the request's
    width/height as given.
    """
    texts = build_prompt_texts(info, request)
    return texts.prompt_text, texts.negative_prompt_text
