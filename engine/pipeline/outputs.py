"""The output stage: one folder per request, written so that a crash never leaves a complete-looking
but half-written result.

Files are written into a hidden staging folder next to the final one and the folder is renamed into
place last, after the sidecar; readers only ever see finished folders. File names are fixed here,
never taken from user input.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
import time
import uuid
import wave
from pathlib import Path

import numpy as np

IMAGE_NAME = "image.png"
VIDEO_NAME = "video.mp4"
ACTIONS_NAME = "actions.json"
SIDECAR_NAME = "params.json"


class OutputError(OSError):
    """Saving a result failed; the message says where and why."""


REQUEST_ID = re.compile(r"^[0-9]{8}-[0-9]{6}-[0-9a-f]{12}$")  # what new_request_id makes, nothing else


def new_request_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S") + "-" + uuid.uuid4().hex[:12]


def is_request_id(text) -> bool:
    """Whether `text` has the shape of this engine's request ids (so it is a plain folder name)."""
    return isinstance(text, str) and REQUEST_ID.fullmatch(text) is not None


def frames_to_uint8(frames: np.ndarray) -> np.ndarray:
    """float frames in [0, 1] -> uint8; frames already uint8 (the fast path's decode) pass through."""
    if frames.dtype == np.uint8:
        return frames
    return (np.clip(frames, 0.0, 1.0) * 255.0 + 0.5).astype(np.uint8)


def _write_png(path: Path, frame: np.ndarray) -> None:
    from PIL import Image

    Image.fromarray(frames_to_uint8(frame)).save(path, format="PNG")


def _write_wav(path: Path, audio: np.ndarray, sample_rate: int) -> None:
    """16-bit PCM; `audio` is [channels, samples] float in [-1, 1]."""
    pcm = (np.clip(audio, -1.0, 1.0) * 32767.0).astype("<i2").T.copy()
    with wave.open(str(path), "wb") as handle:
        handle.setnchannels(pcm.shape[1])
        handle.setsampwidth(2)
        handle.setframerate(sample_rate)
        handle.writeframes(pcm.tobytes())


def _write_mp4(path: Path, frames: np.ndarray, fps: float, audio: np.ndarray | None, sample_rate: int | None) -> None:
    """H.264 (yuv420p) MP4 through imageio-ffmpeg's bundled ffmpeg, with AAC audio when given."""
    import imageio_ffmpeg

    pixels = frames_to_uint8(frames)
    height, width = pixels.shape[1:3]
    audio_path = None
    if audio is not None:
        audio_path = path.with_suffix(".wav")
        _write_wav(audio_path, audio, sample_rate)
    writer = imageio_ffmpeg.write_frames(
        str(path), (width, height), fps=fps, codec="libx264", pix_fmt_out="yuv420p", quality=8,
        macro_block_size=1, output_params=["-movflags", "+faststart"], ffmpeg_log_level="error",
        audio_path=str(audio_path) if audio_path else None, audio_codec="aac" if audio_path else None,
    )
    try:
        writer.send(None)
        for frame in pixels:
            writer.send(np.ascontiguousarray(frame))
    finally:
        writer.close()
        if audio_path is not None:
            audio_path.unlink(missing_ok=True)
    # imageio-ffmpeg does not check ffmpeg's exit status, and a short clip fits in the pipe's buffer, so an
    # ffmpeg that died at start (a fork that aborted, say) went unnoticed until the file was read.
    if not path.is_file() or path.stat().st_size == 0:
        raise RuntimeError(f"ffmpeg wrote no video to {path.name} ({len(pixels)} frames of {width}x{height} sent)")


def _json_default(value):
    if isinstance(value, (np.integer,)):
        return int(value)
    if isinstance(value, (np.floating,)):
        return float(value)
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, Path):
        return str(value)
    return repr(value)


def save_result(root: Path, request_id: str, *, frames: np.ndarray, fps: float, actions: np.ndarray | None,
                audio: np.ndarray | None, sample_rate: int | None, sidecar: dict) -> dict[str, Path]:
    """Write one request's files and return {"image"|"video"|"actions"|"sidecar": final path}."""
    root = Path(root)
    final = root / request_id
    try:
        root.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{request_id}-", dir=root))
    except OSError as exc:
        raise OutputError(f"Cannot create an output folder under {str(root)!r}: {exc.strerror or exc}.") from exc
    try:
        names: dict[str, str] = {}
        if frames.shape[0] == 1:
            _write_png(staging / IMAGE_NAME, frames[0])
            names["image"] = IMAGE_NAME
        else:
            _write_mp4(staging / VIDEO_NAME, frames, fps, audio, sample_rate)
            names["video"] = VIDEO_NAME
        if actions is not None:
            (staging / ACTIONS_NAME).write_text(json.dumps({"actions": np.asarray(actions).tolist()}), encoding="utf-8")
            names["actions"] = ACTIONS_NAME
        names["sidecar"] = SIDECAR_NAME
        document = dict(sidecar, files={k: v for k, v in names.items() if k != "sidecar"})
        (staging / SIDECAR_NAME).write_text(json.dumps(document, indent=2, default=_json_default), encoding="utf-8")
        os.replace(staging, final)
    except (OSError, subprocess.SubprocessError, RuntimeError) as exc:
        shutil.rmtree(staging, ignore_errors=True)
        raise OutputError(f"Saving the result under {str(root)!r} failed: {exc}") from exc
    return {key: final / name for key, name in names.items()}


def outputs_stage(result, root: str | Path, *, model_name: str, model_summary: dict, fps: float) -> None:
    """Save a finished `GenerationResult` under `root` (its own folder) and note where on the result.

    The sidecar names the model as registered, never its source: it carries no server path (issue 19).
    Actions go in their own file; the sidecar lists it."""
    result.request_id = new_request_id()
    sidecar = {k: v for k, v in result.summary().items() if k not in ("actions", "files")}
    sidecar["model"] = {"name": model_name, **model_summary}
    sidecar["created"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    result.outputs = save_result(Path(root), result.request_id, frames=result.frames, fps=fps, actions=result.actions,
                                 audio=result.audio, sample_rate=result.audio_sample_rate, sidecar=sidecar)
    result.output_dir = Path(root) / result.request_id
