"""Reading user media (images, videos, action files) with clear refusals, and the VAE stages."""
from __future__ import annotations

import csv
import functools
import io
import json
import os
import warnings
from pathlib import Path

import numpy as np

from .request import RequestError

MAX_UPLOAD_BYTES = 200 * 2**20
MAX_IMAGE_PIXELS = 40_000_000
MAX_VIDEO_FRAMES = 400
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp", ".bmp")
VIDEO_SUFFIXES = (".mp4", ".mov", ".webm", ".mkv", ".avi", ".gif")
ACTION_SUFFIXES = (".json", ".csv", ".npy")


def _refusals_name(field: str):
    """A file a request names that cannot be read is the request's fault: the refusal becomes a
    `RequestError` naming that request key, so a failed job (`Failed.field`) points at the input too."""
    def wrap(load):
        @functools.wraps(load)
        def named(*args, **kwargs):
            try:
                return load(*args, **kwargs)
            except ValueError as exc:
                if getattr(exc, "field", None) == field:
                    raise
                raise RequestError(field, str(exc)) from exc
        return named
    return wrap


def _checked_file(path, kind: str, suffixes: tuple[str, ...]) -> Path:
    text = os.fspath(path)
    if "\x00" in text:
        raise ValueError(f"The {kind} file name contains a NUL character.")
    file = Path(text)
    if not file.is_file():
        raise ValueError(f"The {kind} file {file.name!r} does not exist or is not a file.")
    if file.suffix.lower() not in suffixes:
        raise ValueError(f"The {kind} file {file.name!r} has type {file.suffix or '(none)'!r}; allowed: {list(suffixes)}.")
    size = file.stat().st_size
    if size == 0:
        raise ValueError(f"The {kind} file {file.name!r} is empty.")
    if size > MAX_UPLOAD_BYTES:
        raise ValueError(f"The {kind} file {file.name!r} is {size / 2**20:.0f} MiB; at most {MAX_UPLOAD_BYTES // 2**20} MiB.")
    return file


def _named_only(exc: Exception, name: str) -> str:
    """A decoder's message without the file's server path: PIL and FFmpeg quote the path they opened,
    which names the uploads or cache folder; the caller knows the file by its name only."""
    text = str(exc)
    filename = getattr(exc, "filename", None)
    for path in {p for p in (filename, getattr(exc, "filename2", None)) if p}:
        text = text.replace(os.fspath(path), Path(os.fspath(path)).name)
    return text


def decode_image(stream, name: str):
    """A PIL image from a binary stream, its declared size checked before any pixel is decoded.

    A PNG can declare 50000x50000 pixels in a few hundred bytes; PIL refuses those over twice its own
    limit with `DecompressionBombError` (not an OSError), which used to escape as a server error. Every
    refusal here is a ValueError naming the file by `name` and the pixel limit."""
    from PIL import Image, UnidentifiedImageError

    limit = f"at most {MAX_IMAGE_PIXELS:,} pixels"
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)  # the check below is stricter
            with Image.open(stream) as opened:
                if opened.width * opened.height > MAX_IMAGE_PIXELS:
                    raise ValueError(f"The image {name!r} is {opened.width}x{opened.height}; {limit}.")
                opened.load()
                image = opened.copy()
                image.format = opened.format  # what the bytes were (a copy forgets it)
                return image
    except Image.DecompressionBombError:
        raise ValueError(f"The image {name!r} declares far more pixels than allowed; {limit}.") from None
    except UnidentifiedImageError:
        raise ValueError(f"The image {name!r} could not be decoded: it is not an image format this "
                         f"server reads ({', '.join(IMAGE_SUFFIXES)}).") from None
    except (OSError, SyntaxError) as exc:
        raise ValueError(f"The image {name!r} could not be decoded: {_named_only(exc, name)}.") from None


@_refusals_name("image")
def load_image(source):
    """A PIL RGB image from a PIL image, an [H, W, 3] uint8 array or a file path."""
    from PIL import Image

    if isinstance(source, Image.Image):
        image = source
    elif isinstance(source, np.ndarray):
        if source.ndim != 3 or source.shape[-1] != 3:
            raise ValueError(f"An image array must be [H, W, 3], got shape {list(source.shape)}.")
        image = Image.fromarray(source.astype(np.uint8))
    else:
        file = _checked_file(source, "image", IMAGE_SUFFIXES)
        with file.open("rb") as stream:
            image = decode_image(stream, file.name)
    if image.width * image.height > MAX_IMAGE_PIXELS:
        raise ValueError(f"The image is {image.width}x{image.height}; at most {MAX_IMAGE_PIXELS:,} pixels.")
    return image.convert("RGB")


def fit_image(image, width: int, height: int, fit: str):
    """`image` (PIL) on a `width` x `height` canvas: "crop" scales it to cover the canvas and cuts the
    overflow evenly from both sides, "letterbox" scales it to fit inside and pads the rest black,
    "resize" stretches it to the canvas."""
    from PIL import Image

    if fit == "resize":
        return image.resize((width, height), Image.BICUBIC)
    pick = max if fit == "crop" else min
    scale = pick(width / image.width, height / image.height)
    w, h = max(1, round(image.width * scale)), max(1, round(image.height * scale))
    scaled = image.resize((w, h), Image.BICUBIC)
    if fit == "crop":
        left, top = (w - width) // 2, (h - height) // 2
        return scaled.crop((left, top, left + width, top + height))
    canvas = Image.new("RGB", (width, height))
    canvas.paste(scaled, ((width - w) // 2, (height - h) // 2))
    return canvas


@_refusals_name("video")
def load_video(source, max_frames: int = MAX_VIDEO_FRAMES) -> list:
    """Up to `max_frames` PIL RGB frames from a list of frames, a [T, H, W, 3] array or a file path."""
    from PIL import Image

    if isinstance(source, (list, tuple)):
        frames = [load_image(frame) for frame in source[:max_frames]]
    elif isinstance(source, np.ndarray):
        if source.ndim != 4 or source.shape[-1] != 3:
            raise ValueError(f"A video array must be [T, H, W, 3], got shape {list(source.shape)}.")
        frames = [Image.fromarray(frame.astype(np.uint8)) for frame in source[:max_frames]]
    else:
        import av

        file = _checked_file(source, "video", VIDEO_SUFFIXES)
        frames = []
        try:
            with av.open(str(file)) as container:
                stream = container.streams.video[0]
                if stream.codec_context.width * stream.codec_context.height > MAX_IMAGE_PIXELS:
                    raise ValueError(f"The video {file.name!r} frames are larger than {MAX_IMAGE_PIXELS:,} pixels.")
                for frame in container.decode(stream):
                    frames.append(frame.to_image().convert("RGB"))
                    if len(frames) >= max_frames:
                        break
        except (av.FFmpegError, IndexError, OSError) as exc:
            raise ValueError(f"The video {file.name!r} could not be decoded: {_named_only(exc, file.name)}.") from exc
    if not frames:
        raise ValueError("The video has no frames.")
    return frames


@_refusals_name("action.actions")
def load_actions_file(path, domain: str) -> list[list[float]]:
    """Actions `[T, D]` from a JSON (list of rows, or {"actions": rows}), CSV or NPY file."""
    from .request import validate_action_array

    file = _checked_file(path, "actions", ACTION_SUFFIXES)
    suffix = file.suffix.lower()
    try:
        if suffix == ".json":
            data = json.loads(file.read_text(encoding="utf-8"))
            rows = data.get("actions") if isinstance(data, dict) else data
        elif suffix == ".csv":
            text = file.read_text(encoding="utf-8")
            rows = []
            for record in csv.reader(io.StringIO(text)):
                if not record or all(not cell.strip() for cell in record):
                    continue
                try:
                    rows.append([float(cell) for cell in record])
                except ValueError:
                    if rows:  # only a first line may be a header
                        raise
        else:
            array = np.load(file, allow_pickle=False)
            if array.ndim != 2:
                raise ValueError(f"The actions array must be 2-D [T, D], got shape {list(array.shape)}.")
            rows = array.astype(np.float64).tolist()
    except (UnicodeDecodeError, json.JSONDecodeError, ValueError, OSError) as exc:
        raise ValueError(f"The actions file {file.name!r} could not be read as {suffix[1:].upper()}: {exc}") from exc
    return validate_action_array(rows, domain)
