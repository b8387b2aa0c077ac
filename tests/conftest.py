"""Shared test setup.

Triton kernels only run on a machine without a GPU under the interpreter, and the switch must be
set before any kernel is defined, so it is set here, before any test module imports `cosmos3_kernels`.
"""
import os

try:
    import torch

    _HAS_CUDA = torch.cuda.is_available()
except ImportError:  # pragma: no cover - torch is a hard requirement
    _HAS_CUDA = False

if not _HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

import pytest  # noqa: E402

from engine.config import apply_process_environment, build_config  # noqa: E402

# What app.py and `engine.load_model` do at start-up (MSLK's native library kept unloaded before anything imports
# torchao; the kernels' settings, the interpreter above included), done once for the session's process.
apply_process_environment(build_config())


@pytest.fixture(scope="session")
def tiny_family(tmp_path_factory):
    """The six tiny checkpoints, built once per test session: {name: Path}."""
    from engine.model.tiny import write_family

    return write_family(tmp_path_factory.mktemp("tiny-family"))
