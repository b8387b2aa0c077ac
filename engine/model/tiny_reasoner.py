"""Tiny reasoner towers for the tiny checkpoints, in the released layout.

A released Cosmos3 folder holds, at its root, the reasoner that Transformers loads with
`AutoModelForImageTextToText.from_pretrained(root)`: `config.json` (model type `cosmos3_edge` for Edge,
`cosmos3_omni` for Nano and Super), one weight file whose keys are the generator's own (the und tower
is the reasoner's language model; the gen tower, time embedder and action/sound heads sit beside it and
Transformers drops them on load) plus the vision tower, and the processor and tokenizer files.
Diffusers reads only `model_index.json` and the component folders, so it never sees these files.

`write_reasoner` writes exactly that beside a tiny generator: the language model is the tiny
generator's und tower (same tensors, so both libraries read one weight set), the vision tower is
small and random, and the processors keep images to a few patches so CPU tests stay fast.
"""
from __future__ import annotations

from pathlib import Path

# Both processors expand a video slot into timestamped per-frame spans (Edge replaces the whole wrapped
# slot, Qwen3-VL only the pad token inside it).
_CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
    "{% for item in message['content'] %}"
    "{% if item['type'] == 'image' %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif item['type'] == 'video' %}<|vision_start|><|video_pad|><|vision_end|>{% elif item['type'] == 'text' %}{{ item['text'] }}{% endif %}"
    "{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

# Tiny vision towers: patch 16 and 2x2 merge as released, a 4x4 reference grid, two layers.
_VISION = {"hidden": 32, "intermediate": 64, "layers": 2, "heads": 2, "grid": 4}
# Images and frames are resized to 32..64 pixels a side: 1 to 4 language tokens each.
_MIN_PIXELS, _MAX_PIXELS = 32 * 32, 64 * 64


def reasoner_kind(family: str) -> str:
    return "edge" if family == "edge" else "omni"


def _token_ids(tokenizer) -> dict:
    ids = {name: tokenizer.convert_tokens_to_ids(tok) for name, tok in (
        ("image_token_id", "<|image_pad|>"), ("video_token_id", "<|video_pad|>"),
        ("vision_start_token_id", "<|vision_start|>"), ("vision_end_token_id", "<|vision_end|>"))}
    if any(v is None or v == tokenizer.unk_token_id for v in ids.values()):
        raise ValueError(f"The tiny tokenizer lacks a vision token: {ids}")
    return ids


def _text_config(kind: str, generator: dict, vocab_size: int, eos_id: int, pad_id: int) -> dict:
    rope = {"rope_type": "default", "rope_theta": float(generator["rope_theta"]),
            "mrope_section": list(generator["rope_axes_dim"])}
    text = dict(vocab_size=vocab_size, hidden_size=generator["hidden_size"],
                intermediate_size=generator["intermediate_size"], num_hidden_layers=generator["num_hidden_layers"],
                num_attention_heads=generator["num_attention_heads"],
                num_key_value_heads=generator["num_key_value_heads"], head_dim=generator["head_dim"],
                hidden_act=generator["hidden_act"], rms_norm_eps=generator["rms_norm_eps"], rope_parameters=rope,
                max_position_embeddings=4096, eos_token_id=eos_id, pad_token_id=pad_id, bos_token_id=None)
    if kind == "omni":
        rope["mrope_interleaved"] = True
    return text


def build_config(family: str, generator: dict, tokenizer):
    """The Transformers config of the tiny reasoner, sized from the tiny generator's config."""
    from transformers import Cosmos3EdgeConfig, Cosmos3OmniConfig

    kind = reasoner_kind(family)
    eos_id = tokenizer.convert_tokens_to_ids("<|im_end|>")
    text = _text_config(kind, generator, len(tokenizer), eos_id, tokenizer.pad_token_id)
    v = _VISION
    if kind == "edge":
        vision = dict(hidden_size=v["hidden"], intermediate_size=v["intermediate"], num_hidden_layers=v["layers"],
                      num_attention_heads=v["heads"], patch_size=16, num_patches=v["grid"] ** 2,
                      spatial_merge_size=2)
        return Cosmos3EdgeConfig(text_config=text, vision_config=vision, projector_hidden_size=96,
                                 tie_word_embeddings=False, **_token_ids(tokenizer))
    vision = dict(depth=v["layers"], hidden_size=v["hidden"], intermediate_size=v["intermediate"], num_heads=v["heads"],
                  patch_size=16, temporal_patch_size=2, spatial_merge_size=2, out_hidden_size=generator["hidden_size"],
                  num_position_embeddings=v["grid"] ** 2, deepstack_visual_indexes=[0])
    return Cosmos3OmniConfig(text_config=text, vision_config=vision, tie_word_embeddings=False,
                             **_token_ids(tokenizer))


def _vision_state(model, kind: str, seed: int) -> dict:
    """Random vision and projector tensors under the names a released checkpoint stores them."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    state = {}
    for name, param in model.state_dict().items():
        if not name.startswith(("model.visual.", "model.projector.")):
            continue
        if name.endswith("weight") and ("norm" in name):
            value = 1.0 + 0.1 * torch.randn(param.shape, generator=generator)
        elif param.ndim >= 2:
            value = torch.randn(param.shape, generator=generator) / param.shape[-1] ** 0.5
        else:
            value = 0.02 * torch.randn(param.shape, generator=generator)
        # Released Nano/Super files keep the ViT flat (`blocks.*`, `merger.*`); Edge keeps module names.
        key = name[len("model.visual."):] if kind == "omni" else name
        state[key] = value.to(param.dtype).contiguous()
    return state


def _write_processor(root: Path, kind: str, tokenizer) -> None:
    """Processor files as a released folder has them. They are written piece by piece because a
    Transformers processor object cannot be built without torchvision (its video processor needs it),
    which a CPU machine may lack; the files are the same either way."""
    import json

    from transformers import Cosmos3EdgeImageProcessorPil, Qwen2VLImageProcessorPil

    size = {"shortest_edge": _MIN_PIXELS, "longest_edge": _MAX_PIXELS}
    tokenizer.save_pretrained(root)
    (root / "chat_template.jinja").write_text(_CHAT_TEMPLATE, encoding="utf-8")
    if kind == "edge":
        image = Cosmos3EdgeImageProcessorPil(size=size)
        names = ("Cosmos3EdgeProcessor", "Cosmos3EdgeImageProcessor", "Cosmos3EdgeVideoProcessor")
        video = {"temporal_patch_size": 1}
    else:
        image = Qwen2VLImageProcessorPil(size=size, patch_size=16, temporal_patch_size=2, merge_size=2)
        names = ("Qwen3VLProcessor", "Qwen2VLImageProcessor", "Qwen3VLVideoProcessor")
        video = {"temporal_patch_size": 2}
    image_config = image.to_dict()
    image_config["image_processor_type"] = names[1]
    image_config.pop("processor_class", None)
    video.update(size=size, patch_size=16, merge_size=2, fps=2, min_frames=2, max_frames=8, do_sample_frames=True,
                 image_mean=image_config["image_mean"], image_std=image_config["image_std"],
                 video_processor_type=names[2])
    for name, data in (("preprocessor_config.json", image_config), ("video_preprocessor_config.json", video),
                       ("processor_config.json", {"processor_class": names[0]})):
        (root / name).write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def write_reasoner(root: Path, family: str, generator_config: dict, generator_state: dict, tokenizer) -> None:
    """Write the tiny reasoner at checkpoint `root`: config, weights (generator keys + vision keys),
    generation config, processor and tokenizer files."""
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForImageTextToText, GenerationConfig

    kind = reasoner_kind(family)
    config = build_config(family, generator_config, tokenizer)
    with torch.device("meta"):
        skeleton = AutoModelForImageTextToText.from_config(config)
    state = {k: v.detach().contiguous() for k, v in generator_state.items()}
    state.update(_vision_state(skeleton, kind, seed={"nano": 41, "super": 42, "edge": 43}[family]))
    save_file(state, str(root / "model.safetensors"), metadata={"format": "pt"})
    config.save_pretrained(root)
    eos = config.text_config.eos_token_id
    GenerationConfig(eos_token_id=eos, pad_token_id=config.text_config.pad_token_id, do_sample=False).save_pretrained(root)
    _write_processor(root, kind, tokenizer)
