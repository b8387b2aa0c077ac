"""Turning a chat (text, an image, a video) into the reasoner's model inputs.

With torchvision installed, the checkpoint's own `AutoProcessor` does it. Without it (CPU machines
whose torch build has no matching torchvision), Transformers cannot even build that processor, so the
same files are used piece by piece: the tokenizer with the checkpoint's chat template, the PIL image
processor, and the processor's placeholder rule (one `<|image_pad|>` per 2x2 patch group; a video as
timestamped per-frame spans). Video frames are sized by the video processor's own rule (one pixel
budget for the whole clip, `video_frame_size`), then patchified by the image processor frame by frame
and paired into temporal patches. `tests/unit/reasoner/test_reasoner.py` checks both routes give the same inputs
(token for token; pixels within resampling error), and that the parts route sizes and lays out a video
as Transformers' processor does even where torchvision is missing.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np


@dataclass(frozen=True)
class VideoClip:
    frames: list  # PIL RGB frames, already sampled
    fps: float  # of the source
    indices: tuple[int, ...]  # source frame index of each sampled frame


@dataclass
class Preprocessor:
    """What the reasoner needs to build inputs from one checkpoint."""

    kind: str  # "edge" | "omni"
    tokenizer: Any
    image_processor: Any
    processor: Any  # the AutoProcessor, or None where it cannot be built
    video_config: dict  # fps, min_frames, max_frames, temporal_patch_size of the video processor

    @property
    def temporal_patch(self) -> int:
        return int(self.video_config.get("temporal_patch_size", 1))


def load_preprocessor(root: Path, kind: str) -> Preprocessor:
    import json

    from transformers import AutoImageProcessor, AutoProcessor, AutoTokenizer

    video_file = root / "video_preprocessor_config.json"
    video_config = json.loads(video_file.read_text(encoding="utf-8")) if video_file.is_file() else {}
    processor = None
    try:
        processor = AutoProcessor.from_pretrained(root)
    except (ImportError, AttributeError, ValueError, TypeError):
        # Transformers builds these processors only with torchvision (see the module docstring).
        processor = None
    if processor is not None:
        return Preprocessor(kind, processor.tokenizer, processor.image_processor, processor, video_config)
    return Preprocessor(kind, AutoTokenizer.from_pretrained(root), AutoImageProcessor.from_pretrained(root), None,
                        video_config)


def sample_video(frames: list, fps: float, config: dict) -> VideoClip:
    """Frames at the video processor's rate (2 per second as released), within its frame bounds,
    padded to whole temporal patches: the frame choice both input routes share."""
    rate = float(config.get("fps", 2))
    lo, hi = int(config.get("min_frames", 4)), int(config.get("max_frames", 768))
    patch = int(config.get("temporal_patch_size", 1))
    total = len(frames)
    count = int(round(total / fps * rate)) if fps > 0 else total
    count = max(min(count, hi, total), min(lo, total))
    indices = np.linspace(0, total - 1, count).round().astype(int).tolist() if count > 1 else [0]
    while len(indices) % patch:
        indices.append(indices[-1])
    return VideoClip([frames[i] for i in indices], fps, tuple(indices))


def messages_for(system: str | None, text: str, image=None, video: VideoClip | None = None) -> list[dict]:
    content: list[dict] = []
    if image is not None:
        content.append({"type": "image", "image": image})
    if video is not None:
        content.append({"type": "video", "video": video.frames})
    content.append({"type": "text", "text": text})
    messages = [{"role": "system", "content": [{"type": "text", "text": system}]}] if system else []
    messages.append({"role": "user", "content": content})
    return messages


def _timestamps(indices: tuple[int, ...], fps: float, patch: int) -> list[float]:
    """The time of each temporal patch: the mean of its first and last frame (as the processors do)."""
    times = [i / fps for i in indices]
    return [(times[k] + times[k + patch - 1]) / 2 for k in range(0, len(times), patch)]


def _video_placeholder(pre: Preprocessor, clip: VideoClip, grid) -> str:
    merge = int(pre.image_processor.merge_size) ** 2
    per_frame = int(grid[1] * grid[2]) // merge
    span = "<|vision_start|>" + "<|video_pad|>" * per_frame + "<|vision_end|>"
    return "".join(f"<{t:.1f} seconds>{span}" for t in _timestamps(clip.indices, clip.fps, pre.temporal_patch))


# The video processors' `size` when their config names none (Transformers 5.24's class defaults).
_VIDEO_SIZE_DEFAULTS = {"edge": {"shortest_edge": 64 * 64, "longest_edge": 24 * 1024 * 1024},
                        "omni": {"shortest_edge": 128 * 32 * 32, "longest_edge": 32 * 32 * 768}}


def video_frame_size(kind: str, config: dict, frames: int, height: int, width: int) -> tuple[int, int]:
    """The (height, width) every frame of a clip is resized to, as the checkpoint's video processor
    sizes it: multiples of patch x merge, with `size.longest_edge` pixels for the whole clip (frames
    rounded to temporal patches), at least `size.shortest_edge`; Qwen3-VL's optional per-frame cap too."""
    size = config.get("size") or _VIDEO_SIZE_DEFAULTS[kind]
    lo, hi = int(size["shortest_edge"]), int(size["longest_edge"])
    factor = int(config.get("patch_size", 16)) * int(config.get("merge_size", 2))
    temporal = int(config.get("temporal_patch_size", 1))
    if kind == "omni" and config.get("cap_pixels_per_frame"):
        per_frame = max(min(int(config["max_video_tokens"]) * factor * factor, hi // frames), int(lo * 1.05))
        hi = per_frame * frames
    if height < factor or width < factor:
        scale = max(factor / height, factor / width)
        height, width = int(height * scale), int(width * scale)
    h_bar, w_bar = round(height / factor) * factor, round(width / factor) * factor
    t_bar = round(frames / temporal) * temporal
    if t_bar * h_bar * w_bar > hi:
        beta = math.sqrt(frames * height * width / hi)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif t_bar * h_bar * w_bar < lo:
        beta = math.sqrt(lo / (frames * height * width))
        h_bar, w_bar = math.ceil(height * beta / factor) * factor, math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def _video_pixels(pre: Preprocessor, clip: VideoClip):
    """Frames sized as the video processor sizes them, normalised with its mean and std, patchified by
    the image processor (no second resize), and paired into temporal patches for Qwen3-VL style towers
    (an image fills both temporal slots with itself; a video puts frame 2k and 2k+1 there)."""
    import torch
    from PIL import Image

    config = pre.video_config
    frames = clip.frames
    if config.get("do_resize", True):
        height, width = video_frame_size(pre.kind, config, len(frames), frames[0].height, frames[0].width)
        frames = [f.resize((width, height), Image.Resampling.BICUBIC) for f in frames]
    norm = {k: config[k] for k in ("image_mean", "image_std") if k in config}
    outs = [pre.image_processor(images=[frame], do_resize=False, return_tensors="pt", **norm) for frame in frames]
    grid = outs[0]["image_grid_thw"][0]
    patch = pre.temporal_patch
    pixels = [o["pixel_values"] for o in outs]
    if patch > 1:
        # A row is [channel, temporal slot, patch_h, patch_w] flattened; slot j comes from frame k+j.
        rows, width = pixels[0].shape
        views = [p.view(rows, 3, patch, -1) for p in pixels]
        pixels = [torch.stack([views[k + j][:, :, j] for j in range(patch)], dim=2).reshape(rows, width)
                  for k in range(0, len(views), patch)]
    steps = len(pixels)
    thw = torch.tensor([[steps, int(grid[1]), int(grid[2])]])
    return torch.cat(pixels, dim=0), thw


def _parts_inputs(pre: Preprocessor, messages: list[dict], image, video: VideoClip | None) -> dict:
    import torch

    text = pre.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    out: dict[str, Any] = {}
    if image is not None:
        feats = pre.image_processor(images=[image], return_tensors="pt")
        merge = int(pre.image_processor.merge_size) ** 2
        count = int(feats["image_grid_thw"][0].prod()) // merge
        text = text.replace("<|image_pad|>", "<|image_pad|>" * count, 1)
        out.update(pixel_values=feats["pixel_values"], image_grid_thw=feats["image_grid_thw"])
    if video is not None:
        pixels, thw = _video_pixels(pre, video)
        placeholder = _video_placeholder(pre, video, thw[0])
        # Both processors replace the chat template's whole wrapped slot: each frame span brings its own
        # wrapper (Qwen3-VL's collapses the chat wrapper first since Transformers 5.25).
        text = text.replace("<|vision_start|><|video_pad|><|vision_end|>", placeholder, 1)
        out.update(pixel_values_videos=pixels, video_grid_thw=thw)
    encoded = pre.tokenizer(text, return_tensors="pt", add_special_tokens=False)
    out.update(input_ids=encoded["input_ids"], attention_mask=encoded["attention_mask"])
    out["mm_token_type_ids"] = _token_types(pre.tokenizer, out["input_ids"])
    return out


def _token_types(tokenizer, ids):
    """0 text, 1 image, 2 video: what M-RoPE reads to lay positions out."""
    image_id = tokenizer.convert_tokens_to_ids("<|image_pad|>")
    video_id = tokenizer.convert_tokens_to_ids("<|video_pad|>")
    return (ids == image_id).long() + 2 * (ids == video_id).long()


def build_inputs(pre: Preprocessor, messages: list[dict], image=None, video: VideoClip | None = None) -> dict:
    """Model inputs (batch of one) for `messages`, on the CPU."""
    if pre.processor is None:
        return _parts_inputs(pre, messages, image, video)
    text = pre.processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    kwargs: dict[str, Any] = {"text": [text], "return_tensors": "pt"}
    if image is not None:
        kwargs["images"] = [image]
    if video is not None:
        # The frames are already sampled (sample_video); their metadata gives the processor the
        # timestamps, and it reads them back only when asked to return them (Edge's processor does not
        # ask by default).
        kwargs.update(videos=[video.frames], do_sample_frames=False, return_metadata=True,
                      video_metadata=[{"fps": video.fps, "frames_indices": list(video.indices),
                                       "total_num_frames": max(video.indices) + 1}])
    out = dict(pre.processor(**kwargs))
    if "mm_token_type_ids" not in out:
        out["mm_token_type_ids"] = _token_types(pre.tokenizer, out["input_ids"])
    out.pop("video_metadata", None)
    return out
