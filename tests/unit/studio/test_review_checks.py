"""Checks that can fail: the automatic checks and the agreement statistics against known answers.

Each test here was run against a broken implementation (the mutations are listed in docs/REVIEW.md)
and failed: PSNR and SSIM against closed-form values and torchmetrics frame by frame, determinism on a
changed output, Cohen's and Fleiss' kappa on their textbook examples, LPIPS's "unavailable, reason".
"""
import math
import sys
import types

import numpy as np
import pytest
from PIL import Image

from cosmos3_ui.review.leaderboard import cohen_kappa, fleiss_kappa
from cosmos3_ui.review.report import CHECK_COLUMNS, check_summary
from cosmos3_ui.review.runs import record_checks, sha256_file
from cosmos3_ui.review.store import ReviewStore
from cosmos3_ui.review.suites import Configuration, SuiteItem
from engine.pipeline import quality


def constant(value: float, frames: int = 1, size: int = 24) -> np.ndarray:
    return np.full((frames, size, size, 3), value, dtype=np.float32)


def test_psnr_has_its_closed_form_on_fixed_images():
    # MSE 0.01 with data range 1: PSNR = 10 log10(1 / 0.01) = 20 dB; MSE 0.0025: 26.02 dB.
    assert quality.compare_frames(constant(0.0), constant(0.1))["psnr"] == pytest.approx(20.0, abs=1e-4)
    assert quality.compare_frames(constant(0.5), constant(0.55))["psnr"] == pytest.approx(26.0206, abs=1e-3)
    rng = np.random.default_rng(7)
    ref, cand = rng.random((3, 16, 20, 3), dtype=np.float32), rng.random((3, 16, 20, 3), dtype=np.float32)
    per_frame = [10 * math.log10(1.0 / float(np.mean((ref[t] - cand[t]) ** 2))) for t in range(3)]
    assert quality.compare_frames(ref, cand)["psnr"] == pytest.approx(np.mean(per_frame), abs=1e-3)


def test_ssim_has_its_closed_form_and_matches_torchmetrics_frame_by_frame():
    # Two flat images: no variance, so SSIM = (2ab + C1) / (a^2 + b^2 + C1) with C1 = (0.01 * range)^2.
    c1 = 0.01**2
    assert quality.compare_frames(constant(0.5), constant(0.25))["ssim"] == pytest.approx(
        (2 * 0.5 * 0.25 + c1) / (0.5**2 + 0.25**2 + c1), abs=1e-4)
    assert quality.compare_frames(constant(0.3), constant(0.3))["ssim"] == pytest.approx(1.0, abs=5e-4)  # float32 variances
    import torch
    from torchmetrics.image import StructuralSimilarityIndexMeasure

    rng = np.random.default_rng(3)
    ref = rng.random((2, 32, 32, 3), dtype=np.float32)
    cand = np.clip(ref + rng.normal(0, 0.1, ref.shape).astype(np.float32), 0, 1)
    cand[1] = 1.0 - cand[1]  # the second frame far worse: a mean over frames, not the first frame's value
    expected = []
    for t in range(2):
        metric = StructuralSimilarityIndexMeasure(data_range=1.0)
        expected.append(float(metric(torch.from_numpy(cand[t:t + 1]).permute(0, 3, 1, 2),
                                     torch.from_numpy(ref[t:t + 1]).permute(0, 3, 1, 2))))
    assert expected[0] > 0.5 > expected[1]
    assert quality.compare_frames(ref, cand)["ssim"] == pytest.approx(np.mean(expected), abs=1e-4)


def _png(path, value: int) -> str:
    Image.fromarray(np.full((16, 16, 3), value, dtype=np.uint8)).save(path)
    return str(path)


def _run_with_outputs(tmp_path, media: dict) -> tuple[ReviewStore, object]:
    """A stored run whose tasks are recorded done with the given media files: {(item, config, attempt): path}."""
    store = ReviewStore(tmp_path / "private" / "reviews.sqlite3")
    items = [SuiteItem("kite", "t2i", "A kite.")]
    configs = [Configuration("steady", "nano"), Configuration("flaky", "nano")]
    run = store.runs.create("checks", items, configs, reference="steady", repeat=True, reviewer="alice")
    for (item, config, attempt), path in media.items():
        store.runs.record(run.run_id, item, config, attempt, "done", request_id=f"r-{config}-{attempt}", media=path,
                          sha256=sha256_file(path))
    return store, run


def test_determinism_reads_differs_when_the_repeat_changed_and_same_when_it_did_not(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "torchvision", None)  # as on CI: LPIPS cannot run, and says why
    store, run = _run_with_outputs(tmp_path, {
        ("kite", "steady", 0): _png(tmp_path / "s0.png", 100), ("kite", "steady", 1): _png(tmp_path / "s1.png", 100),
        ("kite", "flaky", 0): _png(tmp_path / "f0.png", 100), ("kite", "flaky", 1): _png(tmp_path / "f1.png", 101),
    })
    record_checks(store.runs, run)
    rows = {row[0]: dict(zip(CHECK_COLUMNS, row)) for row in check_summary(store, run)}
    assert rows["steady"]["determinism"].startswith("same SHA256")
    assert rows["flaky"]["determinism"].startswith("differs: SHA256")
    # The reference metrics come from the real comparison: 100 vs 100 identical, LPIPS with its reason.
    assert rows["flaky"]["PSNR (mean)"] == "identical (inf)" and rows["flaky"]["SSIM (mean)"] == "1.0000"
    assert rows["flaky"]["LPIPS (mean)"] == f"unavailable: {quality.lpips_unavailable()}"
    assert "torchvision does not import" in rows["flaky"]["LPIPS (mean)"] and rows["steady"]["LPIPS (mean)"] == "reference"


def test_cohen_kappa_of_the_textbook_example():
    # Wikipedia "Cohen's kappa", worked example: 50 proposals, yes/yes 20, yes/no 5, no/yes 10, no/no 15;
    # p_o = 0.7, p_e = 0.5, kappa = 0.4.
    first = ["yes"] * 25 + ["no"] * 25
    second = ["yes"] * 20 + ["no"] * 5 + ["yes"] * 10 + ["no"] * 15
    assert cohen_kappa(first, second) == pytest.approx(0.4, abs=1e-9)
    assert cohen_kappa(first, first) == 1.0


def test_fleiss_kappa_of_the_textbook_example():
    # Wikipedia "Fleiss' kappa", worked example: 14 raters, 10 subjects, 5 categories;
    # P-bar = 0.378, P-bar_e = 0.213, kappa = 0.210.
    table = np.array([[0, 0, 0, 0, 14], [0, 2, 6, 4, 2], [0, 0, 3, 5, 6], [0, 3, 9, 2, 0], [2, 2, 8, 1, 1],
                      [7, 7, 0, 0, 0], [3, 2, 6, 3, 0], [2, 5, 3, 2, 2], [6, 5, 2, 1, 0], [0, 2, 2, 3, 7]], dtype=float)
    assert fleiss_kappa(table) == pytest.approx(0.210, abs=5e-4)


def test_lpips_is_unavailable_with_the_reason_without_torchvision(monkeypatch):
    monkeypatch.setitem(sys.modules, "torchvision", None)  # `import torchvision` raises ImportError
    reason = quality.lpips_unavailable()
    assert reason.startswith("torchvision does not import") and "AlexNet" in reason
    scores = quality.compare_frames(constant(0.2), constant(0.4))
    assert scores["lpips"] is None and scores["lpips_reason"] == reason and scores["psnr"] > 0


def test_lpips_without_its_weights_names_the_file_and_where_it_goes(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "torchvision", types.ModuleType("torchvision"))
    import torch

    monkeypatch.setattr(torch.hub, "get_dir", lambda: str(tmp_path / "hub"))
    reason = quality.lpips_unavailable()
    assert quality.LPIPS_WEIGHTS in reason and str(tmp_path / "hub" / "checkpoints") in reason
    (tmp_path / "hub" / "checkpoints").mkdir(parents=True)
    (tmp_path / "hub" / "checkpoints" / quality.LPIPS_WEIGHTS).write_bytes(b"weights")
    assert quality.lpips_unavailable() is None
