"""Engine replicas on Ray Serve: one replica per GPU group, the UI and the HTTP API as front ends.

    python app.py --ray auto                 # join the Ray cluster this machine belongs to
    python app.py --ray ray-cluster.json     # {"address": "auto", "replicas": 4, "gpus_per_replica": 2}

Each replica (`EngineReplica`) holds its own `engine.JobQueue` and runs one job at a time
(`max_ongoing_requests=1`), so Ray Serve's router sends each job to a free replica and keeps the rest
waiting on the caller's side. A job is one streaming call through a `DeploymentHandle`: the replica
yields the engine's typed events (progress crosses the boundary), and cancelling the call (Ray Serve's
own request cancellation) sets the job's cancel flag in the replica. A replica that dies fails the job
it was running, reported as `Failed(kind="replica")`; Serve starts a new one, and the jobs still
waiting go to the replicas that are alive. No scheduler or transport of our own: Ray's routing, Ray's
object transport.
"""
from __future__ import annotations

import asyncio
import functools
import json
import logging
import os
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path

from ..events import TERMINAL_EVENTS, Cancelled, Failed, Finished, Queued
from .registry import ModelEntry, ModelRegistry
from ..pipeline.outputs import is_request_id
from .forwarded import ForwardingQueue
from .queue import check_output_group

APP_NAME = "cosmos3-engine"
DEPLOYMENT_NAME = "EngineReplica"
log = logging.getLogger("engine.serving")
REPO_ROOT = Path(__file__).resolve().parents[2]
# A replica is a process with gRPC threads. imageio-ffmpeg starts ffmpeg with `preexec_fn=os.setpgrp` (to
# keep a terminal's Ctrl-C from it), which makes Python fork with the at-fork handlers; gRPC's then abort
# the child now and then before it becomes ffmpeg (seen in CI: SIGABRT in the fork, no video written). A
# replica has no terminal, so it starts ffmpeg without the preexec step.
REPLICA_ENV = {"IMAGEIO_FFMPEG_NO_PREVENT_SIGINT": "1"}


@dataclass(frozen=True)
class RayConfig:
    """Where the cluster is and how to cut it into replicas (`--ray ADDRESS` or `--ray FILE.json`)."""

    address: str = "auto"  # "local" starts a cluster in this process (tests, one machine)
    replicas: int | None = None  # default: the cluster's GPUs // gpus_per_replica (1 without GPUs)
    gpus_per_replica: float = 1.0  # a GPU group; 0 runs on CPU
    cpus_per_replica: float = 1.0
    num_cpus: int | None = None  # only for address "local"
    env: dict = field(default_factory=dict)  # extra environment for the replicas

    @classmethod
    def parse(cls, text: str) -> "RayConfig":
        path = Path(text).expanduser()
        if not text.endswith(".json"):
            return cls(address=text)
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise ValueError(f"--ray {text!r}: could not read a JSON config ({exc}).") from None
        if not isinstance(data, dict):
            raise ValueError(f"--ray {text!r}: the config must be a JSON object.")
        allowed = set(cls.__dataclass_fields__)
        unknown = sorted(set(data) - allowed)
        if unknown:
            raise ValueError(f"--ray {text!r}: unknown keys {unknown}; allowed: {sorted(allowed)}.")
        return cls(**data)


@dataclass(frozen=True)
class ReplicaStarted:
    """First thing a replica yields for a job: who runs it."""

    replica: str  # Ray Serve's replica id (unique within the deployment)
    actor_name: str  # the replica's Ray actor name, namespace "serve"
    pid: int


@dataclass(frozen=True)
class ShippedFiles:
    """A finished job's files, for a front end on another machine (no shared outputs folder)."""

    folder: str  # <output_group>/<request id>
    files: dict  # name -> (file name, bytes)


class EngineReplica:
    """One engine on one GPU group; Ray Serve makes it a deployment (see `deploy`)."""

    def __init__(self, entries: list[tuple[str, str, str]], outputs_root: str, group_gpus: int = 1):
        from ray import serve

        from ..parallel.load import load_model
        from .queue import JobQueue  # JobQueue() imports the denoising stack, before this replica is ready

        registry = ModelRegistry([ModelEntry(*entry) for entry in entries])
        # A group of more than one GPU: the engine's multi-GPU path over the GPUs Ray gave this replica
        # (CUDA_VISIBLE_DEVICES), one worker process per GPU.
        loader = functools.partial(load_model, gpus=group_gpus) if group_gpus > 1 else load_model
        self.queue = JobQueue(registry, outputs_root, max_size=1, loader=loader)
        context = serve.get_replica_context()
        self.replica = context.replica_id.unique_id
        self.actor_name = context.replica_id.to_full_id_str()

    async def run(self, model_name: str, request: dict, output_group: str | None, inputs: dict):
        """Stream one job's events; a cancelled call cancels the job. `inputs`: the conditioning files'
        bytes by request key (this replica may be on a machine that cannot see the caller's files)."""
        yield ReplicaStarted(self.replica, self.actor_name, os.getpid())
        with tempfile.TemporaryDirectory(prefix="cosmos3-inputs-") as folder:
            request = dict(request)
            for key, (file_name, data) in inputs.items():
                request[key] = str(Path(folder) / f"{key}-{Path(file_name).name}")
                Path(request[key]).write_bytes(data)
            async for event in self._events(model_name, request, output_group):
                yield event

    async def _events(self, model_name: str, request: dict, output_group: str | None):
        loop = asyncio.get_running_loop()
        events: asyncio.Queue = asyncio.Queue()
        handle = self.queue.submit(model_name, request, output_group=output_group)

        def pump():
            for event in handle.events():
                loop.call_soon_threadsafe(events.put_nowait, event)

        threading.Thread(target=pump, daemon=True).start()
        try:
            while True:
                event = await events.get()
                if isinstance(event, Queued):
                    continue
                if isinstance(event, Finished) and event.result.output_dir is not None:
                    yield _ship(event.result, output_group)
                yield event
                if isinstance(event, TERMINAL_EVENTS):
                    return
        except asyncio.CancelledError:
            handle.cancel()
            raise


def _ship(result, output_group: str | None) -> ShippedFiles:
    folder = f"{output_group}/{result.request_id}" if output_group else str(result.request_id)
    files = {name: (Path(path).name, Path(path).read_bytes()) for name, path in result.outputs.items()}
    return ShippedFiles(folder, files)


def _failure(exc: Exception, replica: str | None) -> Failed:
    """A replica that died (its actor is gone) versus a job that raised inside a live replica."""
    from ray.exceptions import RayActorError

    if isinstance(exc, RayActorError):
        where = f"replica {replica}" if replica else "the replica it was sent to"
        return Failed(f"The engine {where} stopped while running this job ({type(exc).__name__}); nothing was "
                      "saved. Other jobs go on on the replicas that are alive.", kind="replica")
    log.error("job failed in a replica: %s", exc)
    cause = getattr(exc, "cause", None) or exc
    return Failed(f"Generation failed in replica {replica} ({type(cause).__name__}): {cause}", kind="error")


def start_cluster(config: RayConfig) -> None:
    """Connect to (or, for "local", start) the cluster; replicas import this repo from PYTHONPATH."""
    import ray

    env = {"PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])),
           **REPLICA_ENV,
           **{k: os.environ[k] for k in ("HF_HOME", "HF_HUB_OFFLINE", "TRITON_INTERPRET") if k in os.environ},
           **config.env}
    options = {"runtime_env": {"env_vars": env}, "include_dashboard": False, "log_to_driver": False}
    if config.address == "local":
        ray.init(num_cpus=config.num_cpus, **options)
    else:
        ray.init(address=config.address, **options)


def deploy(config: RayConfig, registry: ModelRegistry, outputs_root: Path):
    """Run the replicas as a Ray Serve application; returns its DeploymentHandle."""
    import ray
    from ray import serve

    replicas = config.replicas
    if replicas is None:
        gpus = ray.cluster_resources().get("GPU", 0)
        replicas = max(1, int(gpus // config.gpus_per_replica)) if config.gpus_per_replica else 1
    serve.start(proxy_location="Disabled")
    deployment = serve.deployment(
        EngineReplica, name=DEPLOYMENT_NAME, num_replicas=replicas, max_ongoing_requests=1,
        max_queued_requests=-1, health_check_period_s=2, health_check_timeout_s=30,
        ray_actor_options={"num_gpus": config.gpus_per_replica, "num_cpus": config.cpus_per_replica},
    )
    entries = [(name, registry.entry(name).source, registry.entry(name).label) for name in registry.names()]
    group = max(1, int(config.gpus_per_replica))
    return serve.run(deployment.bind(entries, str(outputs_root), group), name=APP_NAME, route_prefix=None)


class RayJobQueue(ForwardingQueue):
    """The `engine.JobQueue` interface over Ray Serve replicas (what the UI and the API submit to)."""

    backend = "ray"

    def __init__(self, registry: ModelRegistry, outputs_root: str | Path, handle, *, max_size: int = 16,
                 owns_cluster: bool = False):
        super().__init__(registry, outputs_root, max_size=max_size)
        self._handle = handle.options(stream=True)
        self._owns_cluster = owns_cluster

    @classmethod
    def start(cls, config: RayConfig, registry: ModelRegistry, outputs_root: Path, *, max_size: int = 16):
        start_cluster(config)
        return cls(registry, outputs_root, deploy(config, registry, outputs_root), max_size=max_size,
                   owns_cluster=config.address == "local")

    def _forward(self, handle) -> None:
        from ray.serve.exceptions import RequestCancelledError

        if handle.cancelled():
            handle.put(Cancelled())
            return
        inputs = {key: (Path(path).name, Path(path).read_bytes())
                  for key in ("image", "video") if isinstance(path := handle.request.get(key), str)}
        call = self._handle.run.remote(handle.model_name, handle.request, handle.output_group, inputs)
        handle.on_cancel(call.cancel)
        folder = None
        try:
            for event in call:
                if isinstance(event, ShippedFiles):
                    folder = self._store(event)
                else:
                    self._receive(handle, event, folder)
        except RequestCancelledError:
            handle.put(Cancelled())
        except Exception as exc:  # noqa: BLE001 - whatever went wrong fails this job only
            handle.put(_failure(exc, handle.replica))
        finally:
            if not handle.done():
                handle.put(Cancelled() if handle.cancelled() else Failed("The replica ended the job without a result.",
                                                                          kind="replica"))
            if handle.started_at is not None:
                self._book.announce_positions()

    def _receive(self, handle, event, folder: Path | None) -> None:
        if isinstance(event, ReplicaStarted):
            handle.started(event.replica)
            self._book.announce_positions()
            return
        if isinstance(event, Finished):
            self._finished(handle)
            if folder is not None:  # the result's paths as this machine sees them
                result = event.result
                result.outputs = {name: folder / Path(path).name for name, path in result.outputs.items()}
                result.output_dir = folder
        handle.put(event)

    def _store(self, shipped: ShippedFiles) -> Path:
        """A finished job's folder here: written from the shipped bytes unless this machine sees it.
        The replica's folder and file names become paths here, so they must be plain names."""
        group, _, request_id = shipped.folder.rpartition("/")
        check_output_group(group or None)
        names = [file_name for file_name, _ in shipped.files.values()]
        if not is_request_id(request_id) or not all(
                isinstance(n, str) and n == Path(n).name and not n.startswith(".") for n in names):
            raise ValueError(f"A replica shipped a result under {shipped.folder!r} with files {names!r}; expected "
                             "<group>/<request id> and plain file names.")
        folder = self.outputs_root / shipped.folder
        if folder.is_dir():
            return folder
        staging = folder.with_name(f".{folder.name}.part")
        staging.mkdir(parents=True, exist_ok=True)
        for file_name, data in shipped.files.values():
            (staging / file_name).write_bytes(data)
        staging.rename(folder)
        return folder

    # -- what the UI and the API read ---------------------------------------------------------------

    def state(self) -> dict:
        """Replicas (from Ray Serve's status) and this front end's jobs, waiting and running."""
        from ray import serve

        replicas = {}
        try:
            deployment = serve.status().applications[APP_NAME].deployments[DEPLOYMENT_NAME]
            replicas = {str(state): count for state, count in deployment.replica_states.items()}
        except (KeyError, AttributeError):
            pass
        return {**super().state(), "replicas": replicas}

    def close(self, timeout: float = 10.0) -> None:
        super().close(timeout)
        if self._owns_cluster:
            import ray
            from ray import serve

            serve.shutdown()
            ray.shutdown()
