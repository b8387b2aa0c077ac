"""Reference-based quality numbers for review: PSNR and SSIM of a result against a reference result.

The published quality gates compare a run against a reference run with LPIPS, PSNR and SSIM. PSNR
and SSIM come from torchmetrics (maintained implementations; frames in [0, 1], data range 1, SSIM
with its default 11x11 Gaussian window), averaged over the frames of a video.

LPIPS (AlexNet) comes from torchmetrics too, where it can run: torchmetrics ships LPIPS's linear
calibration layers, but the AlexNet backbone comes from torchvision, which loads its ImageNet weights
from `<torch hub dir>/checkpoints/` (downloading them there on first use). `lpips_unavailable` says why
it cannot run (no torchvision, or no weights file: nothing is downloaded here), and the comparison
then reports LPIPS as None with that reason.
"""
from __future__ import annotations

import functools
from pathlib import Path

import numpy as np

from .media import load_image, load_video

LPIPS_WEIGHTS = "alexnet-owt-7be5be79.pth"  # torchvision's AlexNet IMAGENET1K_V1 file name
LPIPS_FRAMES_PER_CALL = 8  # frames per AlexNet pass: bounds memory for long 720p videos
MAX_FRAMES = 257


def lpips_weights_path() -> Path:
    import torch

    return Path(torch.hub.get_dir()) / "checkpoints" / LPIPS_WEIGHTS


def lpips_unavailable() -> str | None:
    """None when LPIPS can run on this host; otherwise the reason, naming what to provide."""
    try:
        import torchvision  # noqa: F401 - LPIPS's backbone
    except Exception as exc:  # noqa: BLE001 - missing, or built for another torch: either way the reason is shown
        return f"torchvision does not import ({type(exc).__name__}: {exc}); LPIPS's AlexNet comes from it"
    path = lpips_weights_path()
    if not path.is_file():
        return f"the AlexNet weights are not at {path} (copy {LPIPS_WEIGHTS} there, or set TORCH_HOME)"
    return None


@functools.cache
def _lpips_metric(device: str):
    from torchmetrics.image.lpip import LearnedPerceptualImagePatchSimilarity

    return LearnedPerceptualImagePatchSimilarity(net_type="alex", reduction="mean", normalize=True).to(device).eval()


def lpips_frames(reference, candidate) -> float:
    """Mean LPIPS over frames of two [T, 3, H, W] tensors in [0, 1] (lower is closer)."""
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    metric = _lpips_metric(device)
    metric.reset()
    with torch.no_grad():
        for start in range(0, reference.shape[0], LPIPS_FRAMES_PER_CALL):
            chunk = slice(start, start + LPIPS_FRAMES_PER_CALL)
            metric.update(candidate[chunk].to(device), reference[chunk].to(device))
        return float(metric.compute())  # the mean over every frame updated since the reset


def read_frames(path: str) -> np.ndarray:
    """[T, H, W, 3] float32 in [0, 1] from a PNG (T = 1) or an MP4."""
    if str(path).lower().endswith(".mp4"):
        frames = load_video(path, max_frames=MAX_FRAMES)
    else:
        frames = [load_image(path)]
    return np.stack([np.asarray(f, dtype=np.float32) / 255.0 for f in frames])


def compare_frames(reference: np.ndarray, candidate: np.ndarray) -> dict:
    """{"psnr": dB, "ssim": 0..1, "lpips": value or None, "lpips_reason": why None} of `candidate` against
    `reference`, both [T, H, W, 3] in [0, 1]."""
    import torch
    from torchmetrics.functional.image import peak_signal_noise_ratio, structural_similarity_index_measure

    if reference.shape != candidate.shape:
        raise ValueError(f"Cannot compare: the reference is {list(reference.shape)} (frames, height, width, "
                         f"channels) and this result is {list(candidate.shape)}; they must match.")
    ref = torch.from_numpy(np.ascontiguousarray(reference)).permute(0, 3, 1, 2)
    cand = torch.from_numpy(np.ascontiguousarray(candidate)).permute(0, 3, 1, 2)
    psnr = peak_signal_noise_ratio(cand, ref, data_range=1.0, reduction="none", dim=(1, 2, 3))
    ssim = structural_similarity_index_measure(cand, ref, data_range=1.0, reduction="none")
    reason = lpips_unavailable()
    return {"psnr": float(psnr.mean()), "ssim": float(ssim.mean()),
            "lpips": None if reason else lpips_frames(ref, cand), "lpips_reason": reason or ""}


def compare_files(reference_path: str, candidate_path: str) -> dict:
    return compare_frames(read_frames(reference_path), read_frames(candidate_path))
