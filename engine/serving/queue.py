"""The job queue: one GPU worker thread, a bounded wait list, a model cache, typed events per job.

`JobQueue.submit` validates a request at once (bad input never waits in line) and returns a
`JobHandle`. The worker runs one job at a time; each job has its own event stream (`Queued`,
`Started`, `Progress`, then one of `Finished`, `Failed`, `Cancelled`). Whatever a job does, the
worker survives it: an out-of-memory step frees caches and fails that job only, and a model that
fails to load leaves the models already loaded in place.

When no job waits, the same worker warms the models it loaded (`engine.serving.warmup`), one short
request at a time; a job that arrives stops the warm request in flight and runs first.
"""
from __future__ import annotations

import gc
import logging
import re
import queue as stdlib_queue
import threading
import time
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

from ..config import Config, build_config
from ..model.loader import CheckpointError, LoadedModel, component_parameter_count, load_in_process, resolve_source
from ..pipeline.outputs import OutputError, new_request_id
from ..pipeline.request import Request, RequestError, validate_request
from ..events import (TERMINAL_EVENTS, Cancelled, Failed, Finished, JobCancelled, JobEvent, Progress, Queued,
                     SafetyRefusal, Started)
from .registry import ModelRegistry
from . import warmup

log = logging.getLogger("engine.serving.queue")
_GROUP = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,80}$")


def check_output_group(output_group: str | None) -> None:
    """An output group becomes a folder under the outputs root: a plain name only (no '/', no '..')."""
    if output_group is not None and not (isinstance(output_group, str) and _GROUP.match(output_group)):
        raise ValueError(f"output_group must be a plain folder name (letters, digits, '.', '_', '-'), "
                         f"got {output_group!r}.")


class QueueFull(ValueError):
    """The wait list is at its bound; the message says how long it is."""


def checked_request(registry, model_name: str, request) -> Request:
    """What every queue's `submit` does first (this one's and the forwarding front ends'): a JSON
    object with a mode, for a registered model, validated once into a `Request` (one given back in
    is kept as it is)."""
    if not isinstance(request, Mapping):
        raise RequestError("", f"The request must be a JSON object, got {type(request).__name__}.")
    info = registry.info(model_name)
    mode = request.get("mode")
    if mode is None:
        raise RequestError("mode", "The request has no 'mode'; allowed: t2i, t2v, i2v, v2v, action.")
    return validate_request(info, mode, request)


class JobFailed(RuntimeError):
    def __init__(self, event: Failed):
        super().__init__(event.message)
        self.event = event


@dataclass
class _Job:
    id: str
    model_name: str
    request: Request | ReasonRequest  # validated once at submit; the worker runs exactly it
    session_id: str | None
    outputs_root: Path
    cancel: threading.Event = field(default_factory=threading.Event)
    events: stdlib_queue.Queue = field(default_factory=stdlib_queue.Queue)
    done: threading.Event = field(default_factory=threading.Event)
    outcome: JobEvent | None = None
    previews: bool = False  # send Preview events while denoising


class JobHandle:
    """What a caller holds for one submitted job."""

    def __init__(self, job: _Job, owner: "JobQueue"):
        self._job = job
        self._owner = owner

    @property
    def id(self) -> str:
        return self._job.id

    @property
    def session_id(self) -> str | None:
        return self._job.session_id

    def position(self) -> int:
        """Jobs ahead of this one (the running one included); 0 once it runs or ends."""
        return self._owner._position(self._job)

    def events(self, timeout: float | None = None) -> Iterator[JobEvent]:
        """Events until and including the terminal one. `timeout` bounds each wait (None: forever)."""
        return drain(self._job.events, self.id, timeout)

    def cancel(self) -> None:
        """Stop the job: a waiting job never starts; a running one stops within one step."""
        self._job.cancel.set()
        self._owner._wake()

    def result(self, timeout: float | None = None):
        """The job's `engine.pipeline.GenerationResult`, or its failure raised."""
        if not self._job.done.wait(timeout):
            raise TimeoutError(f"Job {self.id} did not finish within {timeout} s.")
        return result_of(self._job.outcome)


def drain(events: stdlib_queue.Queue, job_id: str, timeout: float | None) -> Iterator[JobEvent]:
    """A job's events from its queue, until and including the terminal one (every job handle's `events`)."""
    while True:
        try:
            event = events.get(timeout=timeout)
        except stdlib_queue.Empty:
            raise TimeoutError(f"No event from job {job_id} within {timeout} s.") from None
        yield event
        if isinstance(event, TERMINAL_EVENTS):
            return


def result_of(outcome: JobEvent):
    """A finished job's result, or how it ended raised (every job handle's `result`)."""
    if isinstance(outcome, Finished):
        return outcome.result
    if isinstance(outcome, Cancelled):
        raise JobCancelled()
    raise JobFailed(outcome)


def typical_wait(durations: dict[str, float], position: int, model_name: str | None) -> float | None:
    """A rough wait for `position` jobs ahead, from the last job time per model (None before any)."""
    if not durations:
        return None
    typical = durations.get(model_name) or sum(durations.values()) / len(durations)
    return position * typical


def _warm_failed(step: warmup.WarmStep, exc: Exception) -> None:
    """Log a warm step that failed (it costs that size its warmth, nothing else)."""
    import torch

    request = step.request
    what = "loading it" if request is None else (
        f"{request['mode']} {request['width']}x{request['height']}, a {len(request['prompt'])}-character prompt")
    log.warning("warm-up of model %s (%s) failed; it serves without it: %r", step.model_name, what, exc, exc_info=exc)
    if isinstance(exc, torch.OutOfMemoryError):
        free_memory()  # as after a job's: the next user job finds the cache freed


def torch_cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def free_memory() -> None:
    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def model_bytes(model: LoadedModel) -> int:
    if getattr(model, "is_group", False):
        return model.bytes_per_gpu  # a GPU group's weights live in its worker processes
    total = 0
    for module in (model.transformer, model.vae, model.sound_tokenizer):
        if module is not None:
            total += sum(p.numel() * p.element_size() for p in module.parameters())
    return total


def _default_memory_budget() -> int:
    import torch

    if torch.cuda.is_available():
        return int(torch.cuda.get_device_properties(0).total_memory * 0.85)
    return 16 * 2**30


class JobQueue:
    def __init__(self, registry: ModelRegistry, outputs_root: str | Path, *, max_size: int = 16,
                 memory_budget_bytes: int | None = None, loader: Callable[..., LoadedModel] = load_in_process,
                 safety_checker=None, config: Config | None = None):
        """`safety_checker` (e.g. `engine.model.loader.make_safety_checker()`): one guardrail shared by every
        model this queue loads, applied to each prompt and each generated video. `config` (None: built here from
        the environment, `engine.config.build_config`): the warm-up it asks for."""
        if max_size < 1:
            raise ValueError(f"max_size must be at least 1, got {max_size}.")
        # The denoising stack (torch, diffusers) is imported here, on the thread that builds the queue,
        # before any job is accepted: diffusers resolves its names lazily, and a request validated on a
        # handler thread while the worker was still importing it failed with an ImportError (issue 19).
        from ..pipeline import run  # noqa: F401
        self.registry = registry
        self.outputs_root = Path(outputs_root)
        self.max_size = max_size
        self.memory_budget_bytes = memory_budget_bytes if memory_budget_bytes is not None else _default_memory_budget()
        self._loader = loader
        self._safety_checker = safety_checker
        self._gpu_call: Callable | None = None
        self._lock = threading.Condition()
        self._waiting: list[_Job] = []
        self._running: _Job | None = None
        self._models: OrderedDict[str, LoadedModel] = OrderedDict()
        self._durations: dict[str, float] = {}
        self._closed = False
        # Read once, here: a COSMOS3_WARMUP naming an unknown mode fails the start, not a user's job.
        self._warm_modes = (build_config() if config is None else config).warmup.modes
        self._backlog = warmup.WarmBacklog()
        self._warm_cancel: threading.Event | None = None  # set: the warm request in flight stops
        self._worker = threading.Thread(target=self._work, name="cosmos3-gpu-worker", daemon=True)
        self._worker.start()

    # -- submitting ---------------------------------------------------------------------------

    def submit(self, model_name: str, request: dict, session_id: str | None = None,
               output_group: str | None = None, previews: bool = False) -> JobHandle:
        """Queue a request. `output_group` (a plain folder name, e.g. a batch id) nests its outputs;
        `previews` asks for `Preview` events while it denoises."""
        outputs_root = self.outputs_root
        check_output_group(output_group)
        if output_group is not None:
            outputs_root = outputs_root / output_group
        if isinstance(request, Mapping) and "task" in request:  # a reasoner request (engine/reasoner)
            from ..reasoner import validate_reason_request

            request = validate_reason_request(request, self.registry.info(model_name))  # run as it is
        else:
            request = checked_request(self.registry, model_name, request)
        with self._lock:
            if self._closed:
                raise RuntimeError("The job queue is shut down.")
            if len(self._waiting) >= self.max_size:
                raise QueueFull(
                    f"The queue is full ({len(self._waiting)} jobs waiting, the limit is {self.max_size}); "
                    "try again in a minute."
                )
            # Unique across restarts, so an id quoted by a user finds its line in the server log.
            job = _Job(id=new_request_id(), model_name=model_name, request=request, session_id=session_id,
                       outputs_root=outputs_root, previews=bool(previews))
            self._waiting.append(job)
            job.events.put(Queued(position=self._position_locked(job)))
            self._stop_warming_locked()  # a user job never waits for a warm-up
            self._lock.notify_all()
        return JobHandle(job, self)

    def _position_locked(self, job: _Job) -> int:
        if job in self._waiting:
            return self._waiting.index(job) + (1 if self._running is not None else 0)
        return 0

    def _position(self, job: _Job) -> int:
        with self._lock:
            return self._position_locked(job)

    def eta_seconds(self, position: int, model_name: str | None = None) -> float | None:
        """A rough wait estimate from the durations of recent jobs."""
        return typical_wait(self._durations, position, model_name)

    def _wake(self) -> None:
        with self._lock:
            self._lock.notify_all()

    def _stop_warming_locked(self) -> None:
        if self._warm_cancel is not None:
            self._warm_cancel.set()

    def close(self, timeout: float = 10.0) -> None:
        with self._lock:
            self._closed = True
            for job in self._waiting:
                job.cancel.set()
            self._stop_warming_locked()
            self._lock.notify_all()
        self._worker.join(timeout)

    def loaded_models(self) -> list[str]:
        with self._lock:
            return list(self._models)

    def warming(self) -> dict[str, dict[str, int]]:
        """The models still warming up in the background, {model: {"done", "total"}}; cheap (the UI's status line)."""
        with self._lock:
            return self._backlog.status()

    def state(self) -> dict:
        """What `GET /v1/queue` shows: the jobs waiting and running here, the models loaded, and the
        models still warming up in the background, e.g. {"edge": {"done": 3, "total": 36}} (warm
        requests, two prompt lengths per size; empty when idle)."""
        with self._lock:
            return {"backend": "local", "waiting": len(self._waiting), "running": int(self._running is not None),
                    "max_size": self.max_size, "loaded_models": list(self._models),
                    "warming": self._backlog.status()}

    # -- the worker ---------------------------------------------------------------------------

    def _next_work(self) -> _Job | warmup.WarmStep | None:
        """A waiting job first; warm work only when none waits; None once closed."""
        with self._lock:
            while not self._waiting and not self._closed and not self._backlog:
                self._lock.wait()
            if not self._waiting:
                if self._closed:
                    return None
                self._warm_cancel = threading.Event()
                return self._backlog.next()
            job = self._waiting.pop(0)
            self._running = job
            for index, waiting in enumerate(self._waiting):
                waiting.events.put(Queued(position=index + 1))
            return job

    def _finish(self, job: _Job, event: JobEvent) -> None:
        job.outcome = event
        job.events.put(event)
        job.done.set()
        with self._lock:
            self._running = None

    # -- running a job -------------------------------------------------------------------------

    def run(self, model_name: str, request: Request, outputs_root: str, on_progress=None, cancel=None,
            previews: bool = False):
        """One job, synchronously, on the calling thread: the model (cached) and `generate`.

        The worker calls it for every job; with `use_gpu_call` it is called inside that wrapper
        instead (ZeroGPU), with only picklable arguments (a `Request` pickles as its plain values).
        """
        from ..pipeline.run import generate

        from ..reasoner import ReasonRequest

        model = self._model(model_name, on_progress)
        if isinstance(request, ReasonRequest):
            from ..reasoner import reason

            return reason(model, request, on_progress=on_progress, cancel=cancel)
        return generate(model, request, on_progress=on_progress, cancel=cancel, outputs_root=Path(outputs_root),
                        model_name=model_name, previews=previews)

    def use_gpu_call(self, gpu_call: Callable) -> None:
        """Run each job as `gpu_call(model_name, request, outputs_root)` (e.g. a `spaces.GPU`-wrapped
        `self.run`). Such a call may run in another process, so it gets no progress or cancel hooks:
        a job can still be cancelled while it waits, not once it runs. No warm-up runs from then on:
        the worker's warm requests would run outside any GPU call."""
        with self._lock:
            self._gpu_call = gpu_call
            self._backlog.clear()

    def preload(self) -> list[str]:
        """Load every registered model now (ZeroGPU wants weights in place before the first GPU call)."""
        for name in self.registry.names():
            self._model(name, None)
        return self.loaded_models()

    def warm_default(self, model_name: str) -> bool:
        """Load `model_name` and warm it up in the background, on the worker, without a user job and
        without making one wait (a job that arrives runs first; a load already under way finishes).
        False, doing nothing, where no warm-up would run: no CUDA, a GPU group, ZeroGPU, or no modes to warm."""
        info = self.registry.info(model_name)  # an unknown name raises here
        modes = self._modes_to_warm(info.family, group=self.registry.gpus > 1)
        if not modes:
            return False
        with self._lock:
            self._backlog.load(model_name, len(warmup.warm_requests(info, modes)))
            self._lock.notify_all()
        return True

    def _work(self) -> None:
        while True:
            work = self._next_work()
            if work is None:
                return
            if isinstance(work, warmup.WarmStep):
                self._warm(work)
            else:
                self._run_job(work)

    def _run_job(self, job: _Job) -> None:
        if job.cancel.is_set():
            self._finish(job, Cancelled())
            return
        job.events.put(Started(model_name=job.model_name))
        started = time.perf_counter()
        try:
            if self._gpu_call is not None:
                result = self._gpu_call(job.model_name, job.request, str(job.outputs_root))
            else:
                result = self.run(job.model_name, job.request, str(job.outputs_root),
                                  on_progress=job.events.put, cancel=job.cancel, previews=job.previews)
        except JobCancelled:
            self._finish(job, Cancelled())
        except Exception as exc:  # noqa: BLE001 - every failure becomes the job's message
            self._finish(job, self._failure(exc, job))
        else:
            self._durations[job.model_name] = time.perf_counter() - started
            self._finish(job, Finished(result))

    def _warm(self, step: warmup.WarmStep) -> None:
        """One piece of background warm work. Whatever happens costs warmth only, never the worker."""
        with self._lock:
            cancel = self._warm_cancel
        cancelled = False
        try:
            if step.request is None:
                self._model(step.model_name)  # warm_default: the load plans the warm requests
            elif step.model_name in self._models:
                warmup.warm_one(self._models[step.model_name], step.request, cancel=cancel)
        except JobCancelled:  # a user job arrived (or close): this size is still cold, so it goes back
            cancelled = True
        except Exception as exc:  # noqa: BLE001 - the model still serves, only this size stays cold
            _warm_failed(step, exc)
        with self._lock:
            (self._backlog.put_back if cancelled else self._backlog.finished)(step)
            self._warm_cancel = None

    def _modes_to_warm(self, family: str, group: bool) -> tuple[str, ...]:
        """What a model of `family` warms here (`engine.serving.warmup` says which and why); none on ZeroGPU
        (each job runs in a GPU call of its own, which warm requests would lack), for a GPU group (its ranks
        would need warming in their own processes) or on the CPU (nothing to compile)."""
        if self._gpu_call is not None or group or not torch_cuda_available():
            return ()
        return warmup.modes_for(family, self._warm_modes)

    def _plan_warm_up(self, name: str, model: LoadedModel) -> None:
        """Queue the warm requests of a model just loaded (none: any left from an earlier load are dropped)."""
        modes = self._modes_to_warm(model.info.family, group=getattr(model, "is_group", False))
        with self._lock:
            self._backlog.plan(name, warmup.warm_requests(model.info, modes))
            self._lock.notify_all()

    def _failure(self, exc: Exception, job: _Job) -> Failed:
        import torch

        if isinstance(exc, torch.OutOfMemoryError):
            free_memory()
            return Failed("The GPU ran out of memory for this request. Try a smaller size, fewer frames, or "
                          "another model; the server has freed its caches and keeps serving.", kind="oom")
        if isinstance(exc, CheckpointError):
            return Failed(f"The model could not be loaded: {exc}", kind="load")
        if isinstance(exc, MemoryError):
            return Failed(str(exc), kind="oom")
        if isinstance(exc, OutputError):
            return Failed(str(exc), kind="io")
        if isinstance(exc, ValueError):
            return Failed(str(exc), kind="refused" if isinstance(exc, SafetyRefusal) else "invalid",
                          field=getattr(exc, "field", ""))
        # Not a failure the engine knows: the traceback stays in the server log under the request id,
        # and the user gets the id to quote, not the internals.
        log.error("request %s (model %s) failed unexpectedly: %r", job.id, job.model_name, exc, exc_info=exc,
                  extra={"request_id": job.id})
        return Failed(f"Generation failed because of an internal error (request id {job.id}); the server log "
                      "has the details.", kind="error")

    def _model(self, name: str, on_progress=None) -> LoadedModel:
        if name in self._models:
            self._models.move_to_end(name)
            return self._models[name]
        if on_progress is not None:
            on_progress(Progress(stage="load", step=0, total=1, elapsed_s=0.0, eta_s=None))
        source = self.registry.entry(name).source
        # Check the files before evicting anything, so a broken checkpoint leaves the loaded ones serving.
        root = resolve_source(source)
        self.registry.info(name)
        parameters = sum(component_parameter_count(root / c) for c in ("transformer", "vae"))
        need = parameters * (2 if torch_cuda_available() else 4)
        # Switching variants evicts the least recently used ones until the newcomer fits the budget.
        while self._models and sum(model_bytes(m) for m in self._models.values()) + need > self.memory_budget_bytes:
            evicted_name, evicted = self._models.popitem(last=False)
            with self._lock:
                self._backlog.drop(evicted_name)  # its warmth leaves with it
            if getattr(evicted, "is_group", False):
                evicted.close()  # its worker processes hold the GPUs' memory
            free_memory()
        model = self._loader(root)
        if self._safety_checker is not None:
            model.safety_checker = self._safety_checker
        self._models[name] = model
        self._plan_warm_up(name, model)  # after it is in `_models`, where the warm steps look for it
        return model
