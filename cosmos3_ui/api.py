"""The public scripting API: `/models` and `/generate`.

    from gradio_client import Client, handle_file
    client = Client("http://127.0.0.1:7860/")
    models = client.predict(api_name="/models")
    media, result = client.predict("nano", json.dumps({"mode": "t2i", "prompt": "..."}), None,
                                   api_name="/generate")

Errors come back as `gradio_client` `AppError`s carrying the message (never a stack trace).
"""
from __future__ import annotations

import logging
from typing import Any

import gradio as gr

from .files import publish
from .jobs import JobFollower
from .requests import api_request, parse_request_json
from .service import JobWasCancelled, StudioError, StudioService

log = logging.getLogger("cosmos3_ui")


def models_api(service: StudioService) -> list[dict]:
    return service.models_api()


def _file_path(file: Any) -> str | None:
    if file is None:
        return None
    if isinstance(file, str):
        return file or None
    for attribute in ("path", "name"):
        value = getattr(file, attribute, None)
        if isinstance(value, str) and value:
            return value
    if isinstance(file, dict):
        return file.get("path") or file.get("name")
    return None


async def generate_api(jobs: JobFollower, model_name: str, request_json: str, file: Any, session: str, progress):
    """Returns (media file path, result JSON). Raises gr.Error with the reason on any refusal."""
    service: StudioService = jobs.service
    try:
        request = api_request(parse_request_json(request_json), _file_path(file))
        handle = service.submit(model_name, request, session)
    except StudioError as exc:
        raise gr.Error(str(exc), print_exception=False) from None
    except Exception as exc:  # noqa: BLE001 - the caller gets a message; the log keeps the traceback
        log.exception("/generate: submitting failed")
        raise gr.Error(f"The request could not be submitted ({type(exc).__name__}).", print_exception=False) from None
    try:
        result = await jobs.drive(handle, session, progress)
    except JobWasCancelled as exc:
        raise gr.Error(exc.message(), print_exception=False) from None
    except StudioError as exc:
        raise gr.Error(str(exc), print_exception=False) from None
    except Exception as exc:  # noqa: BLE001
        log.exception("/generate: job failed")
        raise gr.Error(f"Generation failed ({type(exc).__name__}).", print_exception=False) from None
    service.record(result, model_name, "api")
    outputs = result.outputs
    media = outputs.get("image") or outputs.get("video") or outputs.get("actions")
    summary = dict(result.summary(), model=model_name)
    return publish(media), summary
