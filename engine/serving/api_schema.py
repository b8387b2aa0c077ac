"""The request bodies of the HTTP API as OpenAPI schemas (the routes read raw JSON, so that a bad
field is answered 400 naming it, in OpenAI's error shape, rather than FastAPI's 422)."""
from __future__ import annotations

_NUMBER = {"type": "number"}
_INTEGER = {"type": "integer"}
_ENGINE_FIELDS = {
    "negative_prompt": {"type": "string"},
    "width": _INTEGER, "height": _INTEGER, "steps": _INTEGER, "seed": {**_INTEGER, "description": "-1 picks one"},
    "guidance_scale": _NUMBER, "flow_shift": _NUMBER,
    "guidance_interval": {"type": "array", "items": _NUMBER, "minItems": 2, "maxItems": 2, "nullable": True,
                          "description": "[lo, hi] in timestep units; null for every step"},
}
_COMMON = {
    "model": {"type": "string", "description": "an id from GET /v1/models"},
    "prompt": {"type": "string", "description": "prose, or one JSON caption object as a string"},
    "size": {"type": "string", "example": "832x480", "description": "WIDTHxHEIGHT (or width and height)"},
}


def _body(properties: dict, example: dict, form: bool = False) -> dict:
    schema = {"type": "object", "required": ["prompt"], "properties": properties, "additionalProperties": False}
    content = {"application/json": {"schema": schema, "example": example}}
    if form:  # the official openai client's `videos.create` sends a form; objects as `name[key]` fields
        fields = {**properties, "input_reference": {"type": "string", "format": "binary",
                                                    "description": "the image (i2v) or video (v2v) as a file part"}}
        content["multipart/form-data"] = {"schema": {**schema, "properties": fields}}
    return {"requestBody": {"required": True, "content": content}}


IMAGE_BODY = _body({
    **_COMMON, **_ENGINE_FIELDS,
    "mode": {"type": "string", "enum": ["t2i"]},
    "n": {"type": "integer", "enum": [1]},
    "response_format": {"type": "string", "enum": ["b64_json", "url"], "default": "b64_json"},
}, {"model": "nano", "prompt": "A lighthouse at dusk.", "size": "1024x1024", "steps": 30, "seed": 7})

VIDEO_BODY = _body({
    **_COMMON, **_ENGINE_FIELDS,
    "mode": {"type": "string", "enum": ["t2v", "i2v", "v2v", "action"],
             "description": "default: i2v with image, v2v with video, else t2v"},
    "seconds": {"type": "number", "description": "length; num_frames = 4k+1 nearest seconds*fps"},
    "num_frames": _INTEGER, "fps": _NUMBER, "sound": {"type": "boolean"},
    "image": {"type": "string", "description": "base64 or a data: URL (i2v, action)"},
    "video": {"type": "string", "description": "base64 or a data: URL (v2v, inverse dynamics)"},
    "action": {"type": "object", "description": "kind, domain, chunk_size, resolution_tier, view_point, actions"},
    "input_reference": {"type": "object", "properties": {"image_url": {"type": "string"}},
                        "description": "OpenAI's spelling of image: {\"image_url\": base64 or a data: URL}"},
}, {"model": "nano", "prompt": "A red kite over a windy beach.", "size": "832x480", "seconds": 5, "seed": 7}, form=True)
