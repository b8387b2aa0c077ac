"""The OpenAI-style HTTP API (the dialect SGLang, vLLM-Omni and TensorRT-LLM serve), as FastAPI routes.

    GET    /v1/models                     the registered models (with each one's modes and defaults)
    POST   /v1/images/generations         text-to-image, synchronous: b64_json or a URL to /content
    GET    /v1/images/{id}/content        the PNG of an image made with response_format "url"
    POST   /v1/videos                     a video job (t2v, i2v, v2v, action), asynchronous: its id
    GET    /v1/videos                     the caller's video jobs
    GET    /v1/videos/{id}                state (queued, generating, encoding, completed, failed,
                                          cancelled), progress, queue position, ETA, error
    GET    /v1/videos/{id}/content        the MP4 (?variant=params for params.json, actions for actions.json)
    DELETE /v1/videos/{id}                cancels a queued or running job; deletes a finished one
    GET    /v1/queue                      jobs waiting and running on the engine behind the API
    GET    /v1/openapi.json               this API's OpenAPI schema

`HttpApi(job_queue, keys).router` is mounted on the app's FastAPI server beside the UI, so both use
one queue and one GPU pool. `job_queue` is anything with the `engine.JobQueue` interface (`registry`,
`submit`, handles with `events`/`cancel`): the in-process queue, Ray Serve replicas, or a remote server.

Guards (docs/SERVING.md, "What the API guards"): bodies are JSON (`/v1/videos` also takes the openai
client's multipart form); without keys only `Content-Type: application/json`, so that no cross-site
"simple" request can start a job; no answer names a server folder; the job book outlives a restart.
"""
from __future__ import annotations

import asyncio
import base64
import functools
import json
import re
import shutil
import tempfile
import time
from pathlib import Path

from fastapi import APIRouter, Request
from fastapi.openapi.utils import get_openapi
from fastapi.responses import FileResponse, JSONResponse

from ..config import Config, build_config
from .registry import ModelRegistry
from .api_jobs import TERMINAL_STATES, ApiJob, JobBook, new_job_id
from .api_keys import ApiKey, KeyRing, LimitExceeded, Unauthorized
from .api_requests import ApiError, FilePart, UPLOAD_LIMIT, client_field, form_body, image_request, video_request
from .api_schema import IMAGE_BODY, VIDEO_BODY

API_GROUP = "api"  # API results go to <outputs>/api/<request id>/
CONTENT_VARIANTS = {"video": "video", "image": "image", "params": "sidecar", "actions": "actions"}
MEDIA_TYPES = {".mp4": "video/mp4", ".png": "image/png", ".json": "application/json"}
JOBS_FOLDER = ".api-jobs"  # the job book's records, under the outputs folder (api_jobs.py)
FORM_LIMITS = {"max_files": 2, "max_fields": 200}
MAX_BODY_BYTES = 3 * UPLOAD_LIMIT  # an image and a video inline in base64 (4/3 each), and the rest


async def capped_body(request: Request) -> bytes:
    """The request's body, refused (413) once it passes MAX_BODY_BYTES, before it is all in memory."""
    declared = request.headers.get("content-length", "")
    too_big = ApiError(413, f"The body is over {MAX_BODY_BYTES // 2**20} MiB; inline files may hold "
                            f"{UPLOAD_LIMIT // 2**20} MiB each.", "body", "body_too_large")
    if declared.isdigit() and int(declared) > MAX_BODY_BYTES:
        raise too_big
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            raise too_big
        chunks.append(chunk)
    return b"".join(chunks)


def _answers(route):
    """Turn an ApiError into its JSON answer (OpenAI's error shape, with `param` naming the field),
    its message cleaned of server paths."""

    @functools.wraps(route)
    async def wrapper(api, *args, **kwargs):
        try:
            return await route(api, *args, **kwargs)
        except ApiError as exc:
            return JSONResponse(exc.body(api.public_text(str(exc))), status_code=exc.status, headers=exc.headers)

    return wrapper


def server_folders_pattern(folders) -> re.Pattern:
    """A pattern for a path inside any of `folders` (as given and resolved), up to the next space or quote."""
    forms = set()
    for folder in folders:
        for form in (Path(folder).expanduser(), Path(folder).expanduser().resolve()):
            if len(form.parts) > 1:  # never "/" itself
                forms.add(str(form))
    alternatives = "|".join(re.escape(form) for form in sorted(forms, key=len, reverse=True))
    return re.compile(rf"(?:{alternatives})(?=[/\s'\",:;)\]]|$)[^\s'\",;)\]]*")


def models_payload(registry: ModelRegistry) -> dict:
    """`GET /v1/models`: OpenAI's list, each model carrying its variant facts under `cosmos3`, so that
    another studio (`--remote`) can show its modes, defaults and limits."""
    data = []
    for name in registry.names():
        described = registry.describe(name)
        data.append({"id": name, "object": "model", "created": 0, "owned_by": "cosmos3-studio",
                     "cosmos3": {**described, "variant": variant_fields(registry.info(name))}})
    return {"object": "list", "data": data}


def variant_fields(info) -> dict:
    """The VariantInfo as JSON (`engine.serving.remote` rebuilds it on the other side)."""
    from dataclasses import asdict

    fields = asdict(info)
    fields.pop("config_files_read", None)
    return fields


class HttpApi:
    """The routes, the jobs they created, and the keys allowed to call them."""

    def __init__(self, job_queue, keys: KeyRing | None = None, *, uploads_dir: str | Path | None = None,
                 sync_timeout_s: float = 3600.0, prefix: str = "/v1", config: Config | None = None):
        """`config` (None: built here from the environment): the host's folders no answer may name."""
        self.host = (build_config() if config is None else config).host
        self.queue = job_queue
        self.registry: ModelRegistry = job_queue.registry
        self.keys = keys or KeyRing([])
        self.outputs_root = Path(getattr(job_queue, "outputs_root", "outputs"))
        self.uploads = Path(uploads_dir) if uploads_dir else self.outputs_root / ".api-uploads"
        self._server_paths = server_folders_pattern(self._server_folders())
        self.book = JobBook(self.outputs_root / JOBS_FOLDER, self.outputs_root, self.public_text)
        self.sync_timeout_s = sync_timeout_s
        self.router = APIRouter(prefix=prefix)
        self._add_routes()

    def _server_folders(self) -> list[Path]:
        """Folders no answer may name: outputs, uploads, temp and caches (Gradio's and the hub's live
        there or in the home folder), the working folder, and each local model's source."""
        folders = [self.outputs_root, self.uploads, Path(tempfile.gettempdir()), Path.home(), Path.cwd()]
        folders += [Path(folder) for folder in (self.host.temp_dir, self.host.hf_home) if folder]
        entry = getattr(self.registry, "entry", None)
        for name in self.registry.names() if entry is not None else []:
            source = Path(entry(name).source).expanduser()
            folders += [source] if source.is_absolute() else []
        return folders

    def public_text(self, text: str) -> str:
        """`text` with every server path cut to its last part (the outputs folder itself: `<outputs>`)."""
        outputs = {str(self.outputs_root), str(self.outputs_root.resolve())}
        return self._server_paths.sub(lambda m: "<outputs>" if m.group(0) in outputs else Path(m.group(0)).name, text)

    # -- plumbing -------------------------------------------------------------------------------

    def _key(self, request: Request) -> ApiKey:
        if not self.keys.required and request.headers.get("sec-fetch-site") == "cross-site":
            # A browser on another site: without keys nothing says who is calling, so it is refused.
            raise ApiError(403, "This API has no keys, so it refuses calls from pages of other sites.", None,
                           "cross_site")
        try:
            return self.keys.authenticate(request.headers.get("authorization"))
        except Unauthorized as exc:
            raise ApiError(401, str(exc), None, "invalid_api_key", {"WWW-Authenticate": "Bearer"}) from None

    async def _body(self, request: Request, form: bool = False) -> dict:
        """The request's body as a dict: JSON, or (where `form`) the openai client's multipart form.

        Without keys only `Content-Type: application/json` is read: a web page can make a visitor's browser
        send text/plain, form-encoded or multipart bodies to any site without asking first (a "simple"
        request), but JSON needs the server's consent, and a multipart body is taken only with an
        Authorization header, which no simple request carries. With keys the key is that proof."""
        media = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if form and media == "multipart/form-data" and (self.keys.required or "authorization" in request.headers):
            declared = request.headers.get("content-length", "")
            if declared.isdigit() and int(declared) > MAX_BODY_BYTES:
                raise ApiError(413, f"The form is over {MAX_BODY_BYTES // 2**20} MiB.", "body", "body_too_large")
            return await self._form(request)
        is_json = media == "application/json" or (media.startswith("application/") and media.endswith("+json"))
        if not self.keys.required and not is_json:
            accepted = "application/json" + (" (or multipart/form-data with an Authorization header)" if form else "")
            raise ApiError(415, f"This server takes Content-Type {accepted}; got {media or 'none'!r}.", "body",
                           "unsupported_media_type")
        raw = await capped_body(request)
        try:
            body = json.loads(raw)
        except RecursionError:
            raise ApiError(400, "The body is nested too deeply to read.", "body", "invalid_json") from None
        except ValueError as exc:
            raise ApiError(400, f"The body must be a JSON object ({exc}).", "body", "invalid_json") from None
        if not isinstance(body, dict):
            raise ApiError(400, f"The body must be a JSON object, got {type(body).__name__}.", "body", "invalid_json")
        return body

    @staticmethod
    async def _form(request: Request) -> dict:
        """A multipart form as a body; file parts (`input_reference`, `image`, `video`) as FileParts."""
        try:
            form = await request.form(**FORM_LIMITS)
        except Exception as exc:  # noqa: BLE001 - Starlette's parser raises several kinds for a bad form
            raise ApiError(400, f"The multipart form could not be read ({exc}).", "body", "invalid_form") from None
        items = []
        try:
            for name, value in form.multi_items():
                if isinstance(value, str):
                    items.append((name, value))
                    continue
                data = await value.read(UPLOAD_LIMIT + 1)
                items.append((name, FilePart(data, value.content_type or "")))
        finally:
            await form.close()
        return form_body(items)

    def _model(self, body: dict) -> str:
        model = body.get("model")
        if model is None and len(self.registry.names()) == 1:
            return self.registry.names()[0]
        if not isinstance(model, str) or model not in self.registry.names():
            raise ApiError(400, f"model must be one of {self.registry.names()}, got {model!r}.", "model",
                           "model_not_found")
        return model

    def _submit(self, key: ApiKey, kind: str, model: str, request: dict, uploads: list[Path], body: dict) -> ApiJob:
        """Count the job against the key, queue it (validated by the engine), and follow it."""
        from .queue import QueueFull

        job = ApiJob(id=new_job_id(kind), kind=kind, owner=key.name, model=model, request=request, cleanup=uploads)
        try:
            self.keys.admit(key, job.id)
        except LimitExceeded as exc:
            self._remove(uploads)
            raise ApiError(429, str(exc), None, "rate_limit_exceeded", {"Retry-After": str(exc.retry_after_s)}) from None
        try:
            job.handle = self.queue.submit(model, request, session_id=f"api:{key.name}", output_group=API_GROUP)
        except QueueFull as exc:
            self.keys.unsubmit(key, job.id)
            self._remove(uploads)
            raise ApiError(503, str(exc), None, "queue_full", {"Retry-After": "30"}) from None
        except ValueError as exc:
            self.keys.unsubmit(key, job.id)
            self._remove(uploads)
            raise ApiError(400, str(exc), client_field(exc, body)) from None
        self.book.follow(job, lambda ended: self.keys.release(key, ended.id))
        return job

    @staticmethod
    def _remove(paths: list[Path]) -> None:
        for path in paths:
            path.unlink(missing_ok=True)

    def _remove_result(self, job: ApiJob) -> None:
        """Delete a finished job's result folder: the one folder holding its files, inside <outputs>/api/."""
        api_root = (self.outputs_root / API_GROUP).resolve()
        for folder in {path.resolve().parent for path in job.files().values()}:
            if folder.parent == api_root:
                shutil.rmtree(folder, ignore_errors=True)

    def _job(self, request: Request, job_id: str, kind: str) -> ApiJob:
        job = self.book.get(job_id, self._key(request).name)
        if job is None or job.kind != kind:
            raise ApiError(404, f"No {kind} job {job_id!r} for this key.", "id", "not_found")
        return job

    @staticmethod
    def _file(job: ApiJob, name: str) -> FileResponse:
        if job.status != "completed":
            raise ApiError(409, f"Job {job.id} is {job.status}; its content exists once it is completed.",
                           None, "not_ready")
        path = job.files().get(name)
        if path is None or not path.is_file():
            raise ApiError(404, f"Job {job.id} has no {name} file.", "variant", "not_found")
        return FileResponse(path, media_type=MEDIA_TYPES.get(path.suffix, "application/octet-stream"),
                            filename=f"{job.id}{path.suffix}")

    # -- routes ---------------------------------------------------------------------------------

    def _add_routes(self) -> None:
        add = self.router.add_api_route
        add("/models", self.list_models, methods=["GET"], summary="List the models")
        add("/images/generations", self.create_image, methods=["POST"], summary="Create an image (synchronous)",
            openapi_extra=IMAGE_BODY)
        add("/images/{job_id}/content", self.image_content, methods=["GET"], summary="Download an image")
        add("/videos", self.create_video, methods=["POST"], summary="Create a video job (asynchronous)",
            openapi_extra=VIDEO_BODY)
        add("/videos", self.list_videos, methods=["GET"], summary="List this key's video jobs")
        add("/videos/{job_id}", self.get_video, methods=["GET"], summary="A video job's state")
        add("/videos/{job_id}/content", self.video_content, methods=["GET"], summary="Download a video job's file")
        add("/videos/{job_id}", self.delete_video, methods=["DELETE"], summary="Cancel or delete a video job")
        add("/queue", self.queue_state, methods=["GET"], summary="Jobs waiting and running")
        add("/openapi.json", self.openapi, methods=["GET"], include_in_schema=False)

    @_answers
    async def list_models(self, request: Request):
        self._key(request)
        return models_payload(self.registry)

    @_answers
    async def create_image(self, request: Request):
        key = self._key(request)
        body = await self._body(request)
        model = self._model(body)
        engine_request, response_format = image_request(body)
        job = self._submit(key, "image", model, engine_request, [], body)
        deadline = time.monotonic() + self.sync_timeout_s
        while not job.done.is_set():
            if await request.is_disconnected() or time.monotonic() > deadline:
                job.handle.cancel()  # nobody will read this image
                raise ApiError(408, "The request ended before the image was made; the job was cancelled.")
            await asyncio.sleep(0.05)
        if job.status != "completed":
            error = job.error or {}
            status = 400 if error.get("code") in ("invalid", "refused") else 500
            raise ApiError(status, error.get("message", job.status), None, error.get("code", job.status))
        image = job.files()["image"]
        item = {"revised_prompt": job.summary["prompt_text"], "seed": job.summary["seed"]}
        if response_format == "url":
            item["url"] = str(request.url_for("image_content", job_id=job.id))
        else:
            item["b64_json"] = base64.b64encode(image.read_bytes()).decode("ascii")
        # `result` (seed, prompt texts, params, timings) is this server's addition: another studio
        # fronting this one (`--remote`) shows it in its history; OpenAI clients ignore it.
        return {"created": job.created_at, "data": [item], "id": job.id, "model": model, "result": job.summary}

    @_answers
    async def image_content(self, request: Request, job_id: str, variant: str = "image"):
        job = self._job(request, job_id, "image")
        if variant not in ("image", "params"):
            raise ApiError(400, f"variant must be 'image' or 'params', got {variant!r}.", "variant")
        return self._file(job, CONTENT_VARIANTS[variant])

    @_answers
    async def create_video(self, request: Request):
        key = self._key(request)
        body = await self._body(request, form=True)
        model = self._model(body)
        engine_request, uploads = video_request(body, self.registry.info(model), self.uploads)
        job = self._submit(key, "video", model, engine_request, uploads, body)
        return JSONResponse(job.to_json(), status_code=200)

    @_answers
    async def list_videos(self, request: Request):
        key = self._key(request)
        jobs = sorted(self.book.owned(key.name, "video"), key=lambda j: j.created_at, reverse=True)
        return {"object": "list", "data": [job.to_json() for job in jobs]}

    @_answers
    async def get_video(self, request: Request, job_id: str):
        return self._job(request, job_id, "video").to_json()

    @_answers
    async def video_content(self, request: Request, job_id: str, variant: str = "video"):
        job = self._job(request, job_id, "video")
        if variant not in ("video", "params", "actions"):
            raise ApiError(400, f"variant must be 'video', 'params' or 'actions', got {variant!r}.", "variant")
        return self._file(job, CONTENT_VARIANTS[variant])

    @_answers
    async def delete_video(self, request: Request, job_id: str):
        job = self._job(request, job_id, "video")
        if job.status in TERMINAL_STATES:
            self.book.forget(job.id)
            self._remove_result(job)
            return {"id": job.id, "object": "video.deleted", "deleted": True}
        job.handle.cancel()
        for _ in range(200):  # a running job stops within one denoising step
            if job.done.is_set():
                break
            await asyncio.sleep(0.05)
        return job.to_json()

    @_answers
    async def queue_state(self, request: Request):
        self._key(request)
        state = getattr(self.queue, "state", None)
        return state() if callable(state) else {"backend": type(self.queue).__name__}

    async def openapi(self):
        return get_openapi(title="Cosmos3 Studio HTTP API", version="1", routes=self.router.routes,
                           description=__doc__)
