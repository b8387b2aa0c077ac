"""What a restarted process can keep: one cache folder for compiled kernels and dispatch decisions.

A process that starts again (a Space after sleep, a redeploy, ZeroGPU) pays for everything the fast path does
once per shape: Triton and CuTe DSL kernels compile, `cosmos3_kernels.dispatch` times its candidates. Both
results outlive the process where they are written to disk:

- compiled kernels: the compilers' own disk caches, pointed into this folder (`configure_compiler_caches`):
  Triton (`TRITON_CACHE_DIR`), flash-attn-4's CuTe DSL kernels (`FLASH_ATTENTION_CUTE_DSL_CACHE_DIR`), the CuTe
  DSL's own (`CUTE_DSL_CACHE_DIR`, QuACK's GEMMs) and TorchInductor's (`TORCHINDUCTOR_CACHE_DIR`). A variable
  already set is left as it is;
- dispatch decisions: `DecisionStore`, one JSON file per environment (`environment_fingerprint`: the GPU, its
  driver, the versions of every library that runs a candidate, and a hash of this package's source), read at
  start. A decision measured on another GPU, driver or library version, or by other kernel code, is never read.

The folder: `engine.config.Config.kernel_cache_dir` (`COSMOS3_KERNEL_CACHE` where set, "off" keeping nothing, else
`kernels/` under the studio's cache folder, or on a Hugging Face Space under `HF_HOME`); this package takes it as
an argument and never reads the environment (`cosmos3_kernels.settings`).
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
from pathlib import Path
from typing import MutableMapping

from cosmos3_kernels import settings

log = logging.getLogger(__name__)

CACHE_ENV = "COSMOS3_KERNEL_CACHE"
# Each compiler's disk-cache variable and the subfolder it gets.
COMPILER_CACHES = {
    "TRITON_CACHE_DIR": "triton",
    "FLASH_ATTENTION_CUTE_DSL_CACHE_DIR": "flash4",
    "CUTE_DSL_CACHE_DIR": "cute_dsl",
    "TORCHINDUCTOR_CACHE_DIR": "inductor",
}
# The switches that take a library's candidates out of dispatch (a decision measured with them is not one without).
KEYED_SWITCHES = ("COSMOS3_FLASH4", "COSMOS3_QUACK")
# The libraries whose kernels dispatch times (their versions key the stored decisions).
KEYED_PACKAGES = ("triton", "flash-attn-4", "quack-kernels", "nvidia-cutlass-dsl", "nvidia-cudnn-frontend",
                  "torchao", "mslk-cuda", "fa3-fwd")
STORE_VERSION = 2  # 2: decisions are generic records (a backend name and its times), `cosmos3_kernels.autotune`


def configure_compiler_caches(folder: Path | None, environ: MutableMapping[str, str]) -> dict:
    """Point each compiler's disk cache into `folder` unless its variable is already set in `environ` (the
    process's environment, which the compilers read); returns what was set. Call before the first kernel compiles
    (`engine.config.apply_process_environment` does, at start-up)."""
    if folder is None:
        return {}
    done = {}
    for variable, sub in COMPILER_CACHES.items():
        if not environ.get(variable):
            environ[variable] = done[variable] = str(Path(folder) / sub)
    return done


def load_triton_key() -> str | None:
    """Compute Triton's own cache key now (its version and a hash of its compiler sources and libtriton, which it
    computes once per process, the first time it looks a kernel up in its disk cache): ~0.3-0.5 s of a restarted
    process's first request on the H200 host (cProfile, docs/perf-log/2026-12-04-super-and-restart.md), paid at load
    instead. Returns why not where this Triton has no such function (it lives in `triton.runtime.cache` in 3.6-3.7)."""
    try:
        from triton.runtime.cache import triton_key
    except ImportError as err:
        return f"triton.runtime.cache.triton_key not importable ({err})"
    triton_key()
    return None


def _driver_version() -> str | None:
    """The NVIDIA kernel driver's version line, where the system shows it, else the CUDA driver API version."""
    try:
        first = Path("/proc/driver/nvidia/version").read_text().splitlines()[0]
        return " ".join(first.split())
    except (OSError, IndexError):
        pass
    try:
        import torch

        return f"cuda-driver-api {torch._C._cuda_getDriverVersion()}"
    except (AttributeError, RuntimeError):
        return None


def _package_version(name: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def kernels_source_hash() -> str:
    """A hash of this package's Python source: a changed kernel or candidate list makes stored decisions stale."""
    digest = hashlib.sha256()
    for path in sorted(Path(__file__).resolve().parent.glob("*.py")):
        digest.update(path.name.encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def environment_fingerprint(device=None) -> dict:
    """What a stored decision is valid for: the GPU (name, capability), its driver, torch with its CUDA and cuDNN,
    every library in `KEYED_PACKAGES` (None where not installed), the switches in `KEYED_SWITCHES` and this
    package's source."""
    import torch

    out = {"store_version": STORE_VERSION, "torch": torch.__version__, "cuda": torch.version.cuda,
           "kernels_source": kernels_source_hash()}
    if torch.cuda.is_available():
        index = torch.device(device).index if device is not None and torch.device(device).index is not None else None
        props = torch.cuda.get_device_properties(index if index is not None else torch.cuda.current_device())
        out.update(gpu=props.name, capability=f"{props.major}.{props.minor}", sms=props.multi_processor_count,
                   driver=_driver_version(),
                   cudnn=torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None)
    else:
        out.update(gpu="cpu")
    for name in KEYED_PACKAGES:
        out[name] = _package_version(name)
    switches = settings.current()
    on = {"COSMOS3_FLASH4": switches.flash4, "COSMOS3_QUACK": switches.quack}
    for name in KEYED_SWITCHES:
        out[name] = None if on[name] else "0"  # as the variable was recorded before: unset (on) or 0
    return out


class DecisionStore:
    """Dispatch decisions on disk, for one environment: `{key text: record}` in one JSON file whose name is a hash
    of the fingerprint, and which holds the fingerprint itself. Records are plain JSON (dispatch encodes them).
    A file written under another fingerprint, or one that does not parse, is ignored (and overwritten by the
    next `put`); a write that fails is logged, never raised: losing the store costs only time."""

    def __init__(self, folder: Path, fingerprint: dict):
        self.fingerprint = json.loads(json.dumps(fingerprint, default=str))  # as it reads back from the file
        name = hashlib.sha256(json.dumps(self.fingerprint, sort_keys=True, default=str).encode()).hexdigest()[:16]
        self.path = Path(folder) / f"decisions-{name}.json"
        self.records: dict[str, dict] = self._read()

    def _read(self) -> dict[str, dict]:
        try:
            data = json.loads(self.path.read_text())
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as err:
            log.warning("dispatch decisions in %s are unreadable and ignored: %s", self.path, err)
            return {}
        if not isinstance(data, dict) or data.get("fingerprint") != self.fingerprint:
            log.info("dispatch decisions in %s were written for another environment: ignored", self.path)
            return {}
        records = data.get("decisions")
        return dict(records) if isinstance(records, dict) else {}

    def __len__(self) -> int:
        return len(self.records)

    def get(self, key: str) -> dict | None:
        return self.records.get(key)

    def put(self, key: str, record: dict) -> None:
        """Keep `record` under `key` and rewrite the file (atomically: a reader never sees half a file), merged with
        what another store of the process (a second loaded model) wrote to it since this one read it."""
        self.records = {**self._read(), **self.records, key: record}
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            text = json.dumps({"fingerprint": self.fingerprint, "decisions": self.records}, indent=1, default=str)
            handle, temporary = tempfile.mkstemp(dir=self.path.parent, prefix=".decisions-", suffix=".tmp")
            with os.fdopen(handle, "w") as out:
                out.write(text)
            os.replace(temporary, self.path)
        except OSError as err:
            log.warning("could not write dispatch decisions to %s: %s", self.path, err)


def open_store(folder: Path | None, device=None) -> DecisionStore | None:
    """The decision store of this environment in the cache `folder` (`engine.config.Config.kernel_cache_dir`),
    None where the cache is off."""
    if folder is None:
        return None
    return DecisionStore(folder / "dispatch", environment_fingerprint(device))
