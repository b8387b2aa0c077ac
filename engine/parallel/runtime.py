"""The app side of a GPU group: `GroupModel` starts one worker process per GPU and supervises them.

Why every rank, rank 0 included, is a worker process and the app process holds no rank: a
communicator whose peer died cannot be recovered in place (a collective may hang until its timeout,
and an NCCL error can leave the CUDA context unusable). With the ranks outside, the app ends the
group's processes and starts fresh ones while its UI, its queue and its other models keep serving.

How a job runs: the app validates the request and fixes its seed (so every rank draws the same noise),
then puts the same request into every rank's inbox; the ranks run `engine.generate` in lockstep
(they meet at the first collective). Rank 0 sends progress events, saves the files and sends the
result; every rank reports its end. Cancel: the app sets one shared event; rank 0 reads it once per
step and broadcasts it, so all ranks stop at the same step. A rank that dies, or fails while the
others do not, makes the job fail with a message naming the rank, and the group is restarted.
On a machine without CUDA the ranks are CPU processes on gloo, so CI runs this whole path.
"""
from __future__ import annotations

import itertools
import os
import pickle
import queue as stdlib_queue
import socket
import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import replace
from datetime import timedelta
from pathlib import Path

from ..pipeline.request import validate_request
from ..events import JobCancelled
from ..model.loader import component_parameter_count, resolve_source
from ..model.variants import inspect_checkpoint
from .plan import check_group_size, group_schemes

# How long the others may take to report after one rank failed, before the group is restarted.
FAILURE_GRACE_S = 10.0
POLL_S = 0.2


class GroupWorkerDied(RuntimeError):
    """A worker of the group exited during a job; the group restarts and the job fails."""


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now, for a group's rendezvous (bench/bench_parallel.py uses it too)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


_SPAWN_LOCK = threading.Lock()
_PRELOAD = ["engine.pipeline.run", "engine.parallel.runtime"]


def _process_context():
    """`forkserver`, with the engine imported once in the server: each rank (and each restart) is
    then a fork of a clean process that already holds torch and diffusers, instead of a fresh
    interpreter importing them for seconds. The server never touches CUDA, so its forks may."""
    import torch.multiprocessing

    context = torch.multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(_PRELOAD)
    return context


@contextmanager
def _main_script_hidden():
    """Spawned ranks need only engine code: keep them from re-running the app's main script.

    Why: `spawn` re-imports a main script given by path in every child (for the app, gradio and the
    CLI, seconds and hundreds of MB per rank); without the path it imports only the target's module.
    """
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    if path is None or getattr(main, "__spec__", None) is not None:
        yield
        return
    with _SPAWN_LOCK:
        del main.__file__
        try:
            yield
        finally:
            main.__file__ = path


def _picklable(exc: BaseException) -> BaseException:
    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:  # noqa: BLE001 - any exception that does not survive the trip becomes its text
        return RuntimeError(f"{type(exc).__name__}: {exc}")


def _worker_main(rank: int, world: int, port: int, root: str, backend: str, weights: str,
                 inbox, outbox, cancel_event, config=None) -> None:
    """One rank: join the group, load the model, then run every job put into `inbox` until None."""
    import torch
    import torch.distributed as dist

    if backend == "nccl":
        torch.cuda.set_device(rank)
        device = torch.device("cuda", rank)
    else:
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
        device = torch.device("cpu")
    try:
        from ..model.loader import load_in_process
        from ..pipeline.fast_path import load_kernels
        from ..pipeline.run import generate
        from .group import GroupContext

        dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                                timeout=timedelta(minutes=10))
        context = GroupContext.create(rank, world, device, weights)
        if weights == "sharded":
            from .sharding import load_sharded

            model = load_sharded(root, context, config)
        else:
            model = load_in_process(root, device=str(device), config=config)
        model.parallel = context
        load_kernels(model)  # as engine.load_model: the kernel libraries' imports before the first job
    except Exception as exc:  # noqa: BLE001 - reported to the app, which fails the load with it
        outbox.put(("load_failed", rank, None, _picklable(exc)))
        return
    outbox.put(("ready", rank, None, None))
    while True:
        message = inbox.get()
        if message is None:
            break
        job_id, request, outputs_root, model_name = message
        on_progress = (lambda event: outbox.put(("progress", rank, job_id, event))) if rank == 0 else None
        try:
            result = generate(model, request, on_progress=on_progress, cancel=context.start_job(cancel_event),
                              outputs_root=outputs_root if rank == 0 else None, model_name=model_name)
        except JobCancelled:
            outbox.put(("cancelled", rank, job_id, None))
        except Exception as exc:  # noqa: BLE001 - every failure goes to the app
            outbox.put(("failed", rank, job_id, _picklable(exc)))
        else:
            payload = None
            if rank == 0:
                # Frames travel as a tensor, through shared memory rather than the pipe.
                payload = (replace(result, frames=None), torch.from_numpy(result.frames))
            outbox.put(("done", rank, job_id, payload))
    dist.destroy_process_group()


class GroupModel:
    """A model loaded on a group of `gpus` ranks, used where a `LoadedModel` is (`engine.generate`)."""

    is_group = True

    def __init__(self, source, gpus: int, *, weights: str | None = None, per_gpu_bytes: int | None = None,
                 start_timeout_s: float = 1800.0, config=None):
        """`weights`: "replicated" or "sharded"; None chooses from the fit (`choose_weights`, against
        `per_gpu_bytes`, else the first GPU's free memory). `config` (`engine.config.Config`): what every rank
        runs under (None: each rank's environment's, inherited from this process)."""
        import torch

        self.root = resolve_source(source)
        self.info = inspect_checkpoint(self.root)
        check_group_size(gpus, self.info.num_attention_heads, self.info.num_key_value_heads, self.info.family)
        weight_bytes = _weight_bytes(self.root)
        weights = weights or choose_weights(weight_bytes, per_gpu_bytes)
        self.gpus, self.weights = gpus, weights
        self.bytes_per_gpu = weight_bytes // gpus if weights == "sharded" else weight_bytes
        self.backend = "nccl" if torch.cuda.is_available() else "gloo"
        if self.backend == "nccl" and torch.cuda.device_count() < gpus:
            raise ValueError(f"gpus={gpus}, but only {torch.cuda.device_count()} CUDA GPUs are visible.")
        self.safety_checker = None
        self.config = config
        self.restarts = 0
        self.start_timeout_s = start_timeout_s
        self._context = _process_context()
        self._lock = threading.Lock()
        self._jobs = itertools.count(1)
        self._processes: list = []
        self._closed = False
        self._start()
        self._watchdog = threading.Thread(target=self._watch, name="cosmos3-group-watchdog", daemon=True)
        self._watchdog.start()

    # -- what the app shows -------------------------------------------------------------------

    def describe(self) -> dict:
        return {"gpus": self.gpus, "backend": self.backend, "weights": self.weights,
                "schemes": group_schemes(self.gpus), "restarts": self.restarts}

    @property
    def device(self) -> str:
        return f"{self.gpus} x {'cuda' if self.backend == 'nccl' else 'cpu'}"

    # -- the processes ---------------------------------------------------------------------------

    def _start(self) -> None:
        port = free_port()
        self._outbox = self._context.Queue()
        self._inboxes = [self._context.Queue() for _ in range(self.gpus)]
        self._cancel = self._context.Event()
        self._processes = [
            self._context.Process(target=_worker_main, name=f"cosmos3-rank{rank}", daemon=True,
                                  args=(rank, self.gpus, port, str(self.root), self.backend, self.weights,
                                        self._inboxes[rank], self._outbox, self._cancel, self.config))
            for rank in range(self.gpus)
        ]
        with _main_script_hidden():
            for process in self._processes:
                process.start()
        ready: set[int] = set()
        deadline = time.monotonic() + self.start_timeout_s
        while len(ready) < self.gpus:
            try:
                kind, rank, _, payload = self._outbox.get(timeout=POLL_S)
            except stdlib_queue.Empty:
                dead = self._dead_ranks()
                if dead or time.monotonic() > deadline:
                    self._stop()
                    raise RuntimeError(f"The GPU group did not start: ranks {dead or 'all'} "
                                       f"{'exited' if dead else 'timed out'} while loading {self.root.name!r}.")
                continue
            if kind == "load_failed":
                self._stop()
                raise payload
            ready.add(rank)

    def _dead_ranks(self) -> list[str]:
        return [f"{rank} (exit code {p.exitcode})" for rank, p in enumerate(self._processes) if not p.is_alive()]

    def _stop(self) -> None:
        """End this group's own processes, by their handles."""
        for inbox in self._inboxes:
            inbox.put(None)
        for process in self._processes:
            process.join(timeout=2.0)
            if process.is_alive():
                process.terminate()
                process.join(timeout=5.0)
            if process.is_alive():
                process.kill()
                process.join(timeout=5.0)
        self._processes = []

    def _restart(self) -> None:
        self._stop()
        self.restarts += 1
        self._start()

    def _watch(self) -> None:
        """Between jobs, a worker that died is replaced at once (during a job, `_await` sees it)."""
        while not self._closed:
            time.sleep(1.0)
            if self._lock.acquire(blocking=False):
                try:
                    if not self._closed and self._processes and self._dead_ranks():
                        self._restart()
                except Exception:  # noqa: BLE001 - the next job's call starts the group again
                    self._processes = []
                finally:
                    self._lock.release()

    def close(self) -> None:
        self._closed = True
        with self._lock:
            if self._processes:
                self._stop()

    # -- jobs --------------------------------------------------------------------------------------

    def generate(self, request: dict, on_progress=None, cancel=None, outputs_root=None, model_name=None):
        """Run one request on the group; returns rank 0's `GenerationResult` (frames included)."""
        from ..pipeline.decode import safety_check_frames
        from ..pipeline.prompts import safety_check_prompt
        from ..pipeline.run import resolve_seed

        request = validate_request(self.info, request.get("mode", "t2i"), request)
        # Still a Request (pickled to each rank as is), so no rank validates or parses it again.
        request = request.replace(seed=resolve_seed(request.seed))
        safety_check_prompt(self, request["prompt"])
        with self._lock:
            if not self._processes:
                self._restart()
            job_id = next(self._jobs)
            self._cancel.clear()
            for inbox in self._inboxes:
                inbox.put((job_id, request, str(outputs_root) if outputs_root is not None else None, model_name))
            result = self._await(job_id, on_progress, cancel)
        result.frames = safety_check_frames(self, result.frames)
        return result

    def _await(self, job_id: int, on_progress, cancel):
        reports: dict[int, tuple[str, object]] = {}
        first_failure = None
        while len(reports) < self.gpus:
            if cancel is not None and cancel.is_set():
                self._cancel.set()
            try:
                kind, rank, got, payload = self._outbox.get(timeout=POLL_S)
            except stdlib_queue.Empty:
                dead = self._dead_ranks()
                if dead:
                    self._restart()
                    raise GroupWorkerDied(f"GPU worker rank {', '.join(dead)} died during the job; the group "
                                          "was restarted and keeps serving.") from None
                if first_failure is not None and time.monotonic() - first_failure > FAILURE_GRACE_S:
                    break
                continue
            if got != job_id:
                continue
            if kind == "progress":
                if on_progress is not None:
                    on_progress(payload)
                continue
            reports[rank] = (kind, payload)
            if kind == "failed" and first_failure is None:
                first_failure = time.monotonic()
        return self._outcome(reports)

    def _outcome(self, reports: dict):
        failures = [payload for kind, payload in reports.values() if kind == "failed"]
        if failures:
            if len(reports) < self.gpus or len(failures) < self.gpus:
                # Some ranks went on (or wait in a collective): start the group afresh.
                self._restart()
            raise failures[0]
        if any(kind == "cancelled" for kind, _ in reports.values()):
            raise JobCancelled()
        result, frames = reports[0][1]
        result.frames = frames.numpy().copy()
        if result.outputs:
            result.outputs = {key: Path(value) for key, value in result.outputs.items()}
        return result


def _weight_bytes(root: Path) -> int:
    """bf16 bytes of the transformer and VAE weights, from the safetensors headers."""
    return sum(component_parameter_count(root / c) for c in ("transformer", "vae")) * 2


def choose_weights(weight_bytes: int, per_gpu_bytes: int | None = None) -> str:
    """"replicated" where the weights fit one GPU (with a tenth to spare), else "sharded"."""
    import torch

    if per_gpu_bytes is None:
        if not torch.cuda.is_available():
            return "replicated"
        per_gpu_bytes = torch.cuda.mem_get_info(0)[0]
    return "replicated" if weight_bytes <= per_gpu_bytes * 0.9 else "sharded"


def resolve_gpus(gpus) -> int:
    """`gpus` as a count: an int >= 1, or "auto" for every visible CUDA GPU (1 without CUDA)."""
    if isinstance(gpus, str):
        if gpus.strip().lower() == "auto":
            import torch

            return max(1, torch.cuda.device_count()) if torch.cuda.is_available() else 1
        try:
            gpus = int(gpus)
        except ValueError:
            raise ValueError(f"gpus must be a positive integer or 'auto', got {gpus!r}.") from None
    if isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 1:
        raise ValueError(f"gpus must be a positive integer or 'auto', got {gpus!r}.")
    return gpus
