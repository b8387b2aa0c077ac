"""Reference-based quality numbers for review: PSNR and SSIM of a result against a reference result.

The published quality gates compare a run against a reference run with LPIPS, PSNR and SSIM. PSNR
and SSIM come from torchmetrics (maintained implementations; frames in [0, 1], data range 1, SSIM
with its default 11x11 Gaussian window), averaged over the frames of a video.

LPIPS is not computed. The `lpips` wheel ships only its small linear calibration layers
(`lpips/weights/v0.1/*.pth`); the backbone it calibrates (AlexNet or VGG16 with ImageNet weights)
comes from torchvision, which downloads it on first use, and torchmetrics' LPIPS does the same.
This machine reaches no download host, so LPIPS_NEEDS says what a deployment must provide.
"""
from __future__ import annotations

import numpy as np

from .media import load_image, load_video

LPIPS_NEEDS = ("LPIPS needs torchvision plus the ImageNet AlexNet weights (alexnet-owt-7be5be79.pth in "
               "$TORCH_HOME/hub/checkpoints) beside the lpips package's own linear layers; neither download "
               "is possible offline, so only PSNR and SSIM are computed.")
MAX_FRAMES = 257


def read_frames(path: str) -> np.ndarray:
    """[T, H, W, 3] float32 in [0, 1] from a PNG (T = 1) or an MP4."""
    if str(path).lower().endswith(".mp4"):
        frames = load_video(path, max_frames=MAX_FRAMES)
    else:
        frames = [load_image(path)]
    return np.stack([np.asarray(f, dtype=np.float32) / 255.0 for f in frames])


def compare_frames(reference: np.ndarray, candidate: np.ndarray) -> dict[str, float]:
    """{"psnr": dB, "ssim": 0..1} of `candidate` against `reference`, both [T, H, W, 3] in [0, 1]."""
    import torch
    from torchmetrics.functional.image import peak_signal_noise_ratio, structural_similarity_index_measure

    if reference.shape != candidate.shape:
        raise ValueError(f"Cannot compare: the reference is {list(reference.shape)} (frames, height, width, "
                         f"channels) and this result is {list(candidate.shape)}; they must match.")
    ref = torch.from_numpy(np.ascontiguousarray(reference)).permute(0, 3, 1, 2)
    cand = torch.from_numpy(np.ascontiguousarray(candidate)).permute(0, 3, 1, 2)
    psnr = peak_signal_noise_ratio(cand, ref, data_range=1.0, reduction="none", dim=(1, 2, 3))
    ssim = structural_similarity_index_measure(cand, ref, data_range=1.0, reduction="none")
    return {"psnr": float(psnr.mean()), "ssim": float(ssim.mean())}


def compare_files(reference_path: str, candidate_path: str) -> dict[str, float]:
    return compare_frames(read_frames(reference_path), read_frames(candidate_path))
