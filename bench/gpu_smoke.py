"""End-to-end smoke run of the engine on the GPU with the tiny family: every mode through `generate`,
fast path on (kernels, batched CFG, CUDA graphs, channels-last VAE), then again with it off, compared.

    python bench/gpu_smoke.py
"""
from __future__ import annotations

import importlib.util
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import bench  # noqa: E402, F401 - the engine's start-up settings (bench/__init__.py)

import engine  # noqa: E402
from engine.pipeline.fast_path import FastPathOptions  # noqa: E402
from engine.model.tiny import write_family  # noqa: E402

REQUESTS = {
    "t2i": dict(mode="t2i", prompt="a lighthouse at dusk", steps=4, seed=1),
    "t2v": dict(mode="t2v", prompt="waves on a beach", steps=4, seed=2, num_frames=9),
    "sound": dict(mode="t2v", prompt="rain on a roof", steps=3, seed=3, num_frames=9, sound=True),
}


def as_unit(frames: np.ndarray) -> np.ndarray:
    """Frames as float in [0, 1]: the fast path decodes to uint8 on the GPU, the exact path gives floats
    (subtracting uint8 arrays would wrap around)."""
    return frames.astype(np.float32) / 255.0 if frames.dtype == np.uint8 else frames.astype(np.float32)


def main() -> int:
    out = Path(tempfile.mkdtemp())
    family = write_family(out / "tiny", names=("nano", "edge"))
    # The device image has no imageio-ffmpeg (its wheel is too large to carry): videos are then not written.
    can_write_video = importlib.util.find_spec("imageio_ffmpeg") is not None
    worst = 0.0
    for name, path in family.items():
        model = engine.load_model(path, device="cuda")
        for label, request in REQUESTS.items():
            if label == "sound" and "sound" not in model.info.modes:
                continue
            model.fast_path = None  # from the model's configuration: on, on CUDA
            writes = request["mode"] == "t2i" or can_write_video
            fast = engine.generate(model, request, outputs_root=out / "results" if writes else None)
            model.fast_path = FastPathOptions(enabled=False)
            exact = engine.generate(model, request)
            diff = float(np.abs(as_unit(fast.frames) - as_unit(exact.frames)).max())
            worst = max(worst, diff)
            print(f"{name} {label}: frames {fast.frames.shape}, files {sorted(fast.outputs)}, "
                  f"max |fast - exact| {diff:.3e}", flush=True)
        print(f"{name}: dispatch {[(k[0], d.backend) for k, d in model.runtime.dispatchers['auto'].decisions().items()][:6]}")
        del model
        torch.cuda.empty_cache()
    print(f"worst frame difference {worst:.3e}")
    return 0 if worst < 0.1 else 1


if __name__ == "__main__":
    sys.exit(main())
