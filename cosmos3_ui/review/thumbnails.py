"""Small PNG thumbnails (the first frame for a video), made once per result in a private temp folder.

They keep the Review list light (a gallery of full videos would copy every MP4 into Gradio's cache)
and give the HTML report its poster frames. Decoding uses PIL and PyAV, never torch.
"""
from __future__ import annotations

import base64
import io
import tempfile
import threading
from pathlib import Path

THUMB_SIZE = (256, 256)


def first_frame(media: str | Path):
    """The image, or a video's first frame, as a PIL RGB image; None when it cannot be decoded."""
    import av
    from PIL import Image, UnidentifiedImageError

    path = Path(media)
    try:
        if path.suffix.lower() == ".mp4":
            with av.open(str(path)) as container:
                for frame in container.decode(video=0):
                    return frame.to_image().convert("RGB")
            return None
        with Image.open(path) as opened:
            return opened.convert("RGB")
    except (OSError, ValueError, UnidentifiedImageError, IndexError, av.FFmpegError):
        return None  # the caller lists the result without a picture


def thumbnail_png(media: str | Path, size: tuple[int, int] = THUMB_SIZE) -> bytes | None:
    image = first_frame(media)
    if image is None:
        return None
    image.thumbnail(size)
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def data_uri(media: str | Path, size: tuple[int, int] = THUMB_SIZE) -> str | None:
    """A `data:image/png;base64,...` poster frame (for the self-contained HTML report)."""
    png = thumbnail_png(media, size)
    return None if png is None else "data:image/png;base64," + base64.b64encode(png).decode("ascii")


class Thumbnails:
    """Thumbnail files by request id, kept for the life of the app."""

    def __init__(self):
        self.folder = Path(tempfile.mkdtemp(prefix="cosmos3-review-thumbs-"))
        self._lock = threading.Lock()

    def of(self, key: str, media: str | Path | None) -> Path | None:
        if media is None:
            return None
        path = self.folder / f"{key}.png"
        with self._lock:
            if path.is_file():
                return path
        png = thumbnail_png(media)
        if png is None:
            return None
        path.write_bytes(png)
        return path
