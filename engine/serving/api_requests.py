"""OpenAI-style request bodies -> the engine's request dicts, and errors that name their field.

A body takes the engine's request keys (`engine.model.defaults.REQUEST_KEYS`) plus the dialect's own:
`model`, `prompt`, `size` ("WxH"), `n` (images; only 1), `response_format` (images: "b64_json" or
"url") and `seconds` (videos). Anything else is refused by name. Conditioning inputs (`image`,
`video`) come inline as base64 or a `data:` URL, never as a path on the server.
"""
from __future__ import annotations

import base64
import binascii
import io
import re
import secrets
from pathlib import Path

from ..model.defaults import sampling_defaults
from ..pipeline.request import REQUEST_KEYS

IMAGE_KEYS = ("model", "prompt", "size", "n", "response_format")
VIDEO_KEYS = ("model", "prompt", "size", "seconds")
RESPONSE_FORMATS = ("b64_json", "url")
VIDEO_MODES = ("t2v", "i2v", "v2v", "action")
_SIZE = re.compile(r"^\s*(\d{1,5})\s*[xX]\s*(\d{1,5})\s*$")
_DATA_URL = re.compile(r"^data:([\w.+-]+/[\w.+-]+)?(;[\w=-]+)*;base64,", re.ASCII)
_VIDEO_SUFFIX = {"video/mp4": ".mp4", "video/webm": ".webm", "video/quicktime": ".mov", "image/gif": ".gif"}
UPLOAD_LIMIT = 64 * 2**20


class ApiError(Exception):
    """An answer other than 200: the HTTP status, the message, and the request field it is about."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str = "invalid_value",
                 headers: dict | None = None):
        super().__init__(message)
        self.status, self.param, self.code, self.headers = status, param, code, headers or {}

    def body(self) -> dict:
        kind = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
                429: "rate_limit_error"}.get(self.status, "server_error")
        return {"error": {"message": str(self), "type": kind, "param": self.param, "code": self.code}}


def client_field(exc: Exception, body: dict) -> str | None:
    """The request key an engine refusal names (`RequestError.field`), as the client sent it: `size`
    stands for width and height, `seconds` for num_frames."""
    field = getattr(exc, "field", None) or None
    if field in ("width", "height") and "size" in body:
        return "size"
    if field == "num_frames" and "seconds" in body:
        return "seconds"
    return field


def _refuse_unknown(body: dict, allowed: tuple[str, ...]) -> None:
    unknown = [key for key in body if key not in allowed]
    if unknown:
        raise ApiError(400, f"Field {unknown[0]!r} is not supported by this endpoint; supported fields: "
                            f"{', '.join(allowed)}.", unknown[0], "unsupported_field")


def _size(body: dict, request: dict) -> None:
    size = body.get("size")
    if size is None:
        return
    match = _SIZE.match(size) if isinstance(size, str) else None
    if match is None:
        raise ApiError(400, f"size must be 'WIDTHxHEIGHT' such as '832x480', got {size!r}.", "size")
    if "width" in body or "height" in body:
        raise ApiError(400, "Give either size or width and height, not both.", "size")
    request["width"], request["height"] = int(match.group(1)), int(match.group(2))


def decode_upload(value, field: str, uploads: Path) -> Path:
    """An inline base64 image or video, checked and written under `uploads`; never a server path."""
    if not isinstance(value, str):
        raise ApiError(400, f"{field} must be a base64 string or a data: URL, got {type(value).__name__}.", field)
    match = _DATA_URL.match(value)
    mime = (match.group(1) or "") if match else ""
    try:
        data = base64.b64decode(value[match.end():] if match else value, validate=True)
    except (binascii.Error, ValueError):
        raise ApiError(400, f"{field} must be base64 data (or a data: URL with base64); file paths and URLs "
                            "are not accepted.", field) from None
    if not data or len(data) > UPLOAD_LIMIT:
        raise ApiError(400, f"{field} holds {len(data)} bytes; allowed: 1 to {UPLOAD_LIMIT} bytes.", field)
    uploads.mkdir(parents=True, exist_ok=True)
    if field == "image":
        from PIL import Image, UnidentifiedImageError

        try:
            with Image.open(io.BytesIO(data)) as image:
                image.verify()
                suffix = "." + (image.format or "png").lower()
        except (UnidentifiedImageError, OSError, SyntaxError) as exc:
            raise ApiError(400, f"image is not a readable image ({exc}).", field) from None
    else:
        suffix = _VIDEO_SUFFIX.get(mime, ".mp4")
    path = uploads / f"{secrets.token_hex(12)}{suffix}"
    path.write_bytes(data)
    return path


def image_request(body: dict) -> tuple[dict, str]:
    """`POST /v1/images/generations` body -> (engine request for t2i, response_format)."""
    _refuse_unknown(body, IMAGE_KEYS + REQUEST_KEYS)
    n = body.get("n", 1)
    if n != 1:
        raise ApiError(400, f"n must be 1 (one image per request; send more requests for more), got {n!r}.", "n")
    response_format = body.get("response_format") or "b64_json"
    if response_format not in RESPONSE_FORMATS:
        raise ApiError(400, f"response_format must be one of {list(RESPONSE_FORMATS)}, got {response_format!r}.",
                       "response_format")
    if body.get("mode", "t2i") != "t2i":
        raise ApiError(400, f"mode must be 't2i' on the images endpoint, got {body['mode']!r}; "
                            "video modes use POST /v1/videos.", "mode")
    request = {key: value for key, value in body.items() if key in REQUEST_KEYS}
    request["mode"] = "t2i"
    _size(body, request)
    return request, response_format


def video_request(body: dict, info, uploads: Path) -> tuple[dict, list[Path]]:
    """`POST /v1/videos` body -> (engine request, uploaded files to remove when the job ends)."""
    _refuse_unknown(body, VIDEO_KEYS + REQUEST_KEYS)
    request = {key: value for key, value in body.items() if key in REQUEST_KEYS}
    mode = body.get("mode") or ("i2v" if body.get("image") is not None else
                                "v2v" if body.get("video") is not None else "t2v")
    if mode not in VIDEO_MODES:
        raise ApiError(400, f"mode must be one of {list(VIDEO_MODES)} on the videos endpoint, got {mode!r}; "
                            "images use POST /v1/images/generations.", "mode")
    request["mode"] = mode
    _size(body, request)
    if "seconds" in body:
        request["num_frames"] = _frames_for(body, request, info)
    files = []
    for key in ("image", "video"):
        if request.get(key) is not None:
            files.append(decode_upload(request[key], key, uploads))
            request[key] = str(files[-1])
    return request, files


def _frames_for(body: dict, request: dict, info) -> int:
    """`seconds` -> num_frames (4k+1 at the request's fps); the engine then checks the range."""
    if "num_frames" in body:
        raise ApiError(400, "Give either seconds or num_frames, not both.", "seconds")
    seconds = body["seconds"]
    try:
        seconds = float(seconds)
    except (TypeError, ValueError):
        raise ApiError(400, f"seconds must be a number, got {seconds!r}.", "seconds") from None
    if not 0 < seconds <= 60:
        raise ApiError(400, f"seconds must be in (0, 60], got {seconds:g}.", "seconds")
    try:
        fps = float(request.get("fps") or sampling_defaults(info, request["mode"])["fps"])
    except (TypeError, ValueError):
        raise ApiError(400, f"fps must be a number, got {request.get('fps')!r}.", "fps") from None
    return 4 * max(1, round(seconds * fps / 4)) + 1
