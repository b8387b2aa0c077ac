"""OpenAI-style request bodies -> the engine's request dicts, and errors that name their field.

A body takes the engine's request keys (`engine.model.defaults.REQUEST_KEYS`) plus the dialect's own:
`model`, `prompt`, `size` ("WxH"), `n` (images; only 1), `response_format` (images: "b64_json" or
"url") and `seconds` (videos). Anything else is refused by name. Conditioning inputs (`image`,
`video`) come inline as base64 or a `data:` URL, never as a path on the server; `/v1/videos` also takes
the official `openai` client's multipart form, whose `input_reference` file part is the image (or video).
"""
from __future__ import annotations

import base64
import binascii
import io
import math
import re
import secrets
from dataclasses import dataclass
from pathlib import Path

from ..model.defaults import sampling_defaults
from ..pipeline.request import REQUEST_KEYS

IMAGE_KEYS = ("model", "prompt", "size", "n", "response_format")
VIDEO_KEYS = ("model", "prompt", "size", "seconds", "input_reference")
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

    def body(self, message: str | None = None) -> dict:
        """OpenAI's error shape; `message` replaces the exception's own text (cleaned of server paths)."""
        kind = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                404: "not_found_error", 409: "invalid_request_error", 413: "invalid_request_error",
                415: "invalid_request_error", 429: "rate_limit_error"}.get(self.status, "server_error")
        return {"error": {"message": str(self) if message is None else message, "type": kind, "param": self.param,
                          "code": self.code}}


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


@dataclass(frozen=True)
class FilePart:
    """A file sent as a multipart part (the openai client's `input_reference`): its bytes and declared type."""
    data: bytes
    content_type: str = ""


def _inline_bytes(value, field: str) -> tuple[bytes, str]:
    """(bytes, MIME type or "") of an inline base64 string, a `data:` URL or a file part."""
    if isinstance(value, FilePart):
        return value.data, value.content_type
    if not isinstance(value, str):
        raise ApiError(400, f"{field} must be a base64 string or a data: URL, got {type(value).__name__}.", field)
    match = _DATA_URL.match(value)
    try:
        data = base64.b64decode(value[match.end():] if match else value, validate=True)
    except (binascii.Error, ValueError):
        raise ApiError(400, f"{field} must be base64 data (or a data: URL with base64); file paths and URLs "
                            "are not accepted.", field) from None
    return data, (match.group(1) or "") if match else ""


def decode_upload(value, field: str, uploads: Path) -> Path:
    """An inline image or video (base64, a data: URL or a file part), checked and written under
    `uploads` with a name of the server's making; never a server path."""
    from ..pipeline.media import decode_image

    data, mime = _inline_bytes(value, field)
    if not data or len(data) > UPLOAD_LIMIT:
        raise ApiError(400, f"{field} holds {len(data)} bytes; allowed: 1 to {UPLOAD_LIMIT} bytes.", field)
    if field == "image":
        try:  # decoded here, so that a bad image is this request's 400, not a failed job later
            image = decode_image(io.BytesIO(data), "upload")
        except ValueError as exc:
            raise ApiError(400, str(exc), field) from None
        suffix = "." + (image.format or "png").lower()
    else:
        suffix = _VIDEO_SUFFIX.get(mime, ".mp4")
    uploads.mkdir(parents=True, exist_ok=True)
    path = uploads / f"{secrets.token_hex(12)}{suffix}"
    path.write_bytes(data)
    return path


_FORM_NAME = re.compile(r"^([A-Za-z_]\w*)((?:\[\w*\])*)$", re.ASCII)
_FORM_INTEGER = re.compile(r"^-?\d+$")
_FORM_NUMBER = re.compile(r"^-?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?$|^(NaN|-?Infinity)$")
FORM_TEXT_FIELDS = ("model", "prompt", "negative_prompt", "size", "mode", "seconds", "image", "video")


def _form_value(text: str):
    """A form field's text as the JSON value it spells: the openai client sends numbers as digits and
    booleans as true/false; anything else stays text (the engine then checks its type)."""
    if text in ("true", "false", "null"):
        return {"true": True, "false": False, "null": None}[text]
    if _FORM_INTEGER.match(text):
        return int(text)
    return float(text) if _FORM_NUMBER.match(text) else text


def form_body(items: list[tuple[str, object]]) -> dict:
    """A multipart form's (name, value) pairs as a JSON-like body. The openai client spells a list as
    `name[]` parts and an object as `name[key]` parts (`extra_body={"action": {...}}`); deeper nesting
    (an action's rows) is refused naming the field: send those as JSON."""
    body: dict = {}
    for name, value in items:
        match = _FORM_NAME.match(name)
        path = re.findall(r"\[(\w*)\]", match.group(2)) if match else None
        # Taken: name, name[], name[key], name[key][]
        if path is None or len(path) > 2 or "" in path[:-1] or (len(path) == 2 and path[1] != ""):
            raise ApiError(400, f"Form field {name!r} is nested deeper than this form takes; send the request as "
                                "JSON (Content-Type: application/json) instead.", name, "unsupported_field")
        key = match.group(1)
        if isinstance(value, str) and key not in FORM_TEXT_FIELDS:
            value = _form_value(value)
        holder, slot = body, key
        if path and path[0]:  # name[key] or name[key][]
            holder, slot, path = body.setdefault(key, {}), path[0], path[1:]
        if not isinstance(holder, dict):
            raise ApiError(400, f"Form field {name!r} mixes a value and an object.", key)
        if path == [""]:
            holder.setdefault(slot, [])
            if not isinstance(holder[slot], list):
                raise ApiError(400, f"Form field {name!r} mixes a value and a list.", key)
            holder[slot].append(value)
        elif slot in holder:
            raise ApiError(400, f"Form field {name!r} is given twice.", key)
        else:
            holder[slot] = value
    return body


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


def _with_reference(body: dict) -> dict:
    """OpenAI's `input_reference` (a file part, or {"image_url": base64 or data: URL}) as `image`, or as
    `video` when the part is a video."""
    if "input_reference" not in body:
        return body
    body = dict(body)
    reference = body.pop("input_reference")
    if isinstance(reference, dict):
        if set(reference) != {"image_url"}:
            raise ApiError(400, "input_reference must be a file or {\"image_url\": base64 or a data: URL}; "
                                f"got the keys {sorted(reference)}.", "input_reference")
        reference = reference["image_url"]
    video = isinstance(reference, FilePart) and reference.content_type.startswith("video/")
    target = "video" if video else "image"
    if body.get(target) is not None:
        raise ApiError(400, f"Give either input_reference or {target}, not both.", "input_reference")
    body[target] = reference
    return body


def video_request(body: dict, info, uploads: Path) -> tuple[dict, list[Path]]:
    """`POST /v1/videos` body -> (engine request, uploaded files to remove when the job ends)."""
    _refuse_unknown(body, VIDEO_KEYS + REQUEST_KEYS)
    body = _with_reference(body)
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
    fps = request.get("fps")
    try:
        fps = float(sampling_defaults(info, request["mode"])["fps"] if fps is None else fps)
    except (TypeError, ValueError):
        raise ApiError(400, f"fps must be a number, got {request.get('fps')!r}.", "fps") from None
    if not math.isfinite(fps) or fps <= 0:  # NaN and infinity reach here from JSON's NaN / Infinity
        raise ApiError(400, f"fps must be a finite number above 0, got {fps}.", "fps")
    return 4 * max(1, round(seconds * fps / 4)) + 1
