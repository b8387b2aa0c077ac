"""Remote engines: the studio in front of a server that speaks the /v1 dialect (`--remote URL`).

    python app.py --remote http://gpu-box:7860 --remote-key sk-...

`RemoteRegistry` lists the remote's models (`GET /v1/models`). Another Cosmos3 studio describes each
model fully (its variant facts ride along under `cosmos3`), so every mode, default and limit is the
remote's own. A server that only names its models (SGLang, vLLM-Omni) gets the released variant of
the family its id names, with text-to-image and text-to-video only: the rest is shown unavailable,
with the reason. `RemoteJobQueue` has the `engine.JobQueue` interface: images through
`POST /v1/images/generations`, videos through `POST /v1/videos` polled until done, cancel through
`DELETE`; results are downloaded into this studio's outputs folder, so history and review work as
for local jobs.
"""
from __future__ import annotations

import base64
import json
import logging
import re
import time
from pathlib import Path

import numpy as np

from ..model.defaults import sampling_defaults
from ..pipeline.outputs import ACTIONS_NAME, IMAGE_NAME, SIDECAR_NAME, VIDEO_NAME, is_request_id, new_request_id
from ..events import Cancelled, Failed, Finished, Progress, Queued
from .registry import ModelEntry
from ..model.variants import REQUEST_MODES, TinyLimits, VariantInfo
from .forwarded import ForwardingQueue

log = logging.getLogger("engine.serving")
POLL_S = 0.25
GENERIC_MODES = ("t2i", "t2v")
GENERIC_REASON = ("The remote server at {url} speaks the plain /v1 dialect (images from text, videos from text); "
                  "it does not take conditioning inputs, actions or sound.")
_FAMILY = re.compile(r"(nano|super|edge)", re.IGNORECASE)
REMOTE_NAME = "remote.json"  # beside a remote's result: which server made it and the id it gave it
_STAGE = {"queued": "queued", "in_progress": "denoise", "generating": "denoise", "encoding": "decode"}


class RemoteError(RuntimeError):
    """The remote server could not be reached or answered something this studio cannot use."""


def _variant(fields: dict) -> VariantInfo:
    """A VariantInfo from another studio's `/v1/models` (`http_api.variant_fields`)."""
    tiny = fields.get("tiny")
    if tiny:
        tiny = TinyLimits(image_sizes=tuple(map(tuple, tiny["image_sizes"])),
                          video_sizes=tuple(map(tuple, tiny["video_sizes"])),
                          frame_range=tuple(tiny["frame_range"]), default_frames=tiny["default_frames"])
    sigmas = fields.get("distilled_sigmas")
    return VariantInfo(**{**fields, "modes": tuple(fields["modes"]), "tiny": tiny,
                          "distilled_sigmas": tuple(sigmas) if sigmas else None})


class RemoteRegistry:
    """The `ModelRegistry` interface over a remote server's `GET /v1/models`."""

    def __init__(self, url: str, key: str | None = None, *, timeout_s: float = 30.0, transport=None):
        """`transport`: an httpx transport (tests hand in a mock server)."""
        import httpx

        self.url = url.rstrip("/")
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        self.http = httpx.Client(base_url=self.url + "/v1/", headers=headers, timeout=timeout_s, transport=transport)
        try:
            answer = self.http.get("models")
            answer.raise_for_status()
            listed = answer.json()["data"]
        except Exception as exc:  # noqa: BLE001 - whatever it is, the studio cannot start on it
            raise ValueError(f"--remote {self.url}: GET /v1/models failed ({type(exc).__name__}: {exc}).") from None
        self._infos: dict[str, VariantInfo] = {}
        self._unavailable: dict[str, dict[str, str]] = {}
        self.studio_peer: dict[str, bool] = {}
        self.skipped: dict[str, str] = {}  # model id -> why this studio cannot show it
        for model in listed:
            self._add(model)
        for name, reason in self.skipped.items():
            log.warning("--remote %s: model %r left out: %s", self.url, name, reason)
        if not self._infos:
            raise ValueError(f"--remote {self.url}: none of its models can be served here: {self.skipped or 'none listed'}.")

    def _add(self, model: dict) -> None:
        name = model.get("id")
        described = model.get("cosmos3") or {}
        if described.get("variant"):
            self._infos[name] = _variant(described["variant"])
            self.studio_peer[name] = True
            return
        family = _FAMILY.search(name or "")
        if family is None:
            self.skipped[name] = "its id names no Cosmos3 family (nano, super, edge), so its limits are unknown"
            return
        released = VariantInfo.released(family.group(1).lower())
        modes = tuple(m for m in released.modes if m in GENERIC_MODES)
        self._infos[name] = VariantInfo(**{**released.__dict__, "modes": modes, "path": f"{self.url} {name}"})
        reason = GENERIC_REASON.format(url=self.url)
        self._unavailable[name] = {m: reason for m in released.modes + ("sound",) if m not in modes}
        self.studio_peer[name] = False

    def names(self) -> list[str]:
        return list(self._infos)

    def entry(self, name: str) -> ModelEntry:
        self.info(name)
        return ModelEntry(name, f"{self.url}#{name}", f"remote: {self.url}")

    def info(self, name: str) -> VariantInfo:
        if name not in self._infos:
            raise ValueError(f"Unknown model {name!r}; registered models: {self.names()}.")
        return self._infos[name]

    def describe(self, name: str) -> dict:
        info = self.info(name)
        return {"name": name, "label": f"remote: {self.url}", **info.summary(),
                "defaults": {m: sampling_defaults(info, m) for m in REQUEST_MODES if info.supports(m)},
                "unavailable": dict(self._unavailable.get(name, {}))}

    def describe_all(self) -> list[dict]:
        return [self.describe(name) for name in self.names()]


class RemoteJobQueue(ForwardingQueue):
    """The `engine.JobQueue` interface over a remote /v1 server."""

    backend = "remote"

    def _forward(self, handle) -> None:
        try:
            if handle.request["mode"] == "t2i":
                self._image(handle)
            else:
                self._video(handle)
        except Exception as exc:  # noqa: BLE001 - a remote failure fails this job only
            handle.put(Failed(f"The remote server {self.registry.url} failed this job: {exc}", kind="remote"))

    def _body(self, handle) -> dict:
        request = {k: v for k, v in handle.request.items() if v is not None}
        if not self.registry.studio_peer[handle.model_name]:  # the plain dialect's names
            full = handle.validated
            generic = {"model": handle.model_name, "prompt": request["prompt"], "size": f"{full['width']}x{full['height']}"}
            if request["mode"] == "t2v":
                generic["seconds"] = round(full["num_frames"] / full["fps"], 3)
            for ours, theirs in (("negative_prompt", "negative_prompt"), ("seed", "seed"),
                                 ("steps", "num_inference_steps"), ("guidance_scale", "guidance_scale")):
                if ours in request:
                    generic[theirs] = request[ours]
            return generic
        for key in ("image", "video"):
            if request.get(key):
                request[key] = base64.b64encode(Path(request[key]).read_bytes()).decode("ascii")
        return {"model": handle.model_name, **request}

    def _image(self, handle) -> None:
        handle.started(self.registry.url)
        answer = self.registry.http.post("images/generations", json={**self._body(handle), "response_format": "b64_json"},
                                         timeout=None)
        _raise_for(answer)
        if handle.cancelled():
            handle.put(Cancelled())
            return
        body = answer.json()
        files = {"image": (IMAGE_NAME, base64.b64decode(body["data"][0]["b64_json"]))}
        if body.get("id") and self.registry.studio_peer[handle.model_name]:
            files["sidecar"] = (SIDECAR_NAME, self._download(f"images/{body['id']}/content", {"variant": "params"}))
        self._finished(handle)
        handle.put(Finished(self._result(handle, body.get("result") or {}, files)))

    def _video(self, handle) -> None:
        answer = self.registry.http.post("videos", json=self._body(handle))
        _raise_for(answer)
        job_id = answer.json()["id"]
        handle.on_cancel(lambda: self.registry.http.delete(f"videos/{job_id}"))
        started = time.monotonic()
        while True:
            job = self.registry.http.get(f"videos/{job_id}").json()
            status = job.get("status")
            if status == "queued":
                handle.put(Queued(position=job.get("queue_position") or 0))
            elif status in ("generating", "in_progress", "encoding"):
                if handle.started_at is None:
                    handle.started(self.registry.url)
                handle.put(Progress(stage=job.get("stage") or _STAGE[status], step=int(job.get("progress") or 0),
                                    total=100, elapsed_s=time.monotonic() - started, eta_s=job.get("eta_seconds")))
            elif status in ("cancelled",) or (handle.cancelled() and status != "completed"):
                handle.put(Cancelled())
                return
            elif status == "failed":
                error = job.get("error") or {}
                handle.put(Failed(f"The remote server failed this job: {error.get('message', 'no reason given')}",
                                  kind=error.get("code", "remote")))
                return
            elif status == "completed":
                break
            time.sleep(POLL_S)
        files = {"video": (VIDEO_NAME, self._download(f"videos/{job_id}/content"))}
        result = job.get("result") or {}
        for name, file_name in (("sidecar", SIDECAR_NAME), ("actions", ACTIONS_NAME)):
            if file_name in (result.get("files") or {}).values():
                files[name] = (file_name, self._download(f"videos/{job_id}/content",
                                                         {"variant": "params" if name == "sidecar" else "actions"}))
        if handle.started_at is None:
            handle.started(self.registry.url)
        self._finished(handle)
        handle.put(Finished(self._result(handle, result, files)))

    def _download(self, path: str, params: dict | None = None) -> bytes:
        answer = self.registry.http.get(path, params=params)
        _raise_for(answer)
        return answer.content

    def _result(self, handle, summary: dict, files: dict):
        """A GenerationResult for the downloaded files (no frame array: the files are the output)."""
        from ..pipeline.run import GenerationResult

        parent = self.outputs_root / handle.output_group if handle.output_group else self.outputs_root
        remote_id = summary.get("request_id")
        request_id = local_request_id(remote_id, parent)
        folder = parent / request_id
        staging = parent / f".{request_id}.part"
        staging.mkdir(parents=True, exist_ok=True)
        for file_name, data in files.values():
            (staging / file_name).write_bytes(data)
        origin = {"server": self.registry.url, "request_id": remote_id[:200] if isinstance(remote_id, str) else None}
        (staging / REMOTE_NAME).write_text(json.dumps(origin), encoding="utf-8")
        staging.rename(folder)
        params = summary.get("params") or dict(handle.validated)
        shape = summary.get("frames") or [params.get("num_frames") or 1, params.get("height"), params.get("width"), 3]
        actions = summary.get("actions")
        return GenerationResult(
            frames=np.broadcast_to(np.zeros((), np.float32), tuple(shape)), audio=None, audio_sample_rate=None,
            actions=np.asarray(actions, np.float32) if actions is not None else None,
            seed=summary.get("seed", params.get("seed", -1)), prompt_text=summary.get("prompt_text", params["prompt"]),
            negative_prompt_text=summary.get("negative_prompt_text", ""), params=params,
            timings=summary.get("timings") or {}, outputs={name: folder / f for name, (f, _) in files.items()},
            output_dir=folder, request_id=request_id)

    def state(self) -> dict:
        return {**super().state(), "url": self.registry.url}


def local_request_id(remote_id, parent: Path) -> str:
    """The folder name under `parent` for a remote's result: the remote's request id only when it has
    this engine's id shape (a plain name) and no result here has it yet; otherwise a fresh id of our own.
    A remote is another server: an id like `../../x` or `/etc` must never become a path here."""
    if is_request_id(remote_id) and not (parent / remote_id).exists() and not (parent / f".{remote_id}.part").exists():
        return remote_id
    if remote_id is not None:
        log.warning("remote request id %.80r is not a plain id of this engine's shape or is taken here; the "
                    "result is kept under a new id (the remote's is in %s)", remote_id, REMOTE_NAME)
    return new_request_id()


def _raise_for(answer) -> None:
    if answer.status_code >= 400:
        try:
            message = answer.json()["error"]["message"]
        except Exception:  # noqa: BLE001 - not the dialect's error shape
            message = answer.text[:300]
        raise RemoteError(f"HTTP {answer.status_code}: {message}")
