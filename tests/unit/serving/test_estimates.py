"""Duration estimates reproduce the current measured figures (docs/data/current.json) and grow the way the
workloads do."""
import json
from pathlib import Path

import pytest

from engine.model.variants import VariantInfo
from engine.serving.estimates import (
    CURRENT_FIGURES, DECODE_WORKLOADS, STEP_WORKLOADS, estimate_seconds, gen_tokens, load_step_times,
)

FIGURES = {entry["id"]: entry for entry in json.loads(CURRENT_FIGURES.read_text(encoding="utf-8"))["workloads"]}
FIXED_SECONDS = 3.0
SHAPES = {"nano-t2i-1024": (1024, 1024, 1), "nano-t2v-480p": (832, 480, 121), "nano-t2v-720p": (1280, 720, 189),
          "step-edge-t2i-640": (640, 640, 1), "edge-t2v-480p": (832, 480, 121)}


def test_gen_tokens_matches_the_benchmark_shapes():
    assert gen_tokens(1024, 1024, 1) == 1024
    assert gen_tokens(832, 480, 121) == 12090
    assert gen_tokens(1280, 720, 189) == 44160
    assert gen_tokens(640, 640, 1) == 400
    for name, (width, height, frames) in SHAPES.items():
        assert gen_tokens(width, height, frames) == FIGURES[name]["gen_tokens"], name


@pytest.mark.parametrize("family,name", [(f, n) for f, names in STEP_WORKLOADS.items() for n in names])
def test_each_step_at_a_measured_shape_is_its_current_figure(family, name):
    width, height, frames = SHAPES[name]
    request = dict(width=width, height=height, num_frames=frames, steps=35, guidance_scale=6.0)
    info = VariantInfo.released(family)
    ten_more_steps = estimate_seconds(info, dict(request, steps=45)) - estimate_seconds(info, request)
    assert ten_more_steps == pytest.approx(10 * FIGURES[name]["figures"]["step_ms"] / 1000, rel=1e-9)


@pytest.mark.parametrize("name", DECODE_WORKLOADS)
def test_an_estimate_at_a_measured_shape_is_fixed_plus_its_steps_plus_its_decode(name):
    entry = FIGURES[name]
    width, height, frames = SHAPES[name]
    request = dict(width=width, height=height, num_frames=frames, steps=entry["steps"], guidance_scale=6.0)
    expected = FIXED_SECONDS + entry["steps"] * entry["figures"]["step_ms"] / 1000 + entry["figures"]["decode_s"]
    assert estimate_seconds(VariantInfo.released(entry["family"]), request) == pytest.approx(expected, rel=1e-9)


def test_estimates_order_workloads():
    nano, edge, super_ = (VariantInfo.released(f) for f in ("nano", "edge", "super"))
    t2i = dict(width=1024, height=1024, num_frames=1, steps=50, guidance_scale=4.0)
    t2v_480 = dict(width=832, height=480, num_frames=121, steps=35, guidance_scale=6.0)
    t2v_720 = dict(width=1280, height=720, num_frames=189, steps=35, guidance_scale=6.0)
    assert estimate_seconds(nano, t2v_480) < estimate_seconds(nano, t2v_720)
    assert estimate_seconds(edge, dict(t2v_480, steps=50)) < estimate_seconds(nano, dict(t2v_480, steps=50))
    assert estimate_seconds(super_, t2i) > estimate_seconds(nano, t2i)
    distilled = dict(t2i, steps=4, guidance_scale=1.0)
    assert estimate_seconds(nano, distilled) < estimate_seconds(nano, dict(t2i, steps=4))
    # In between two measured shapes the estimate lies between them.
    mid = estimate_seconds(nano, dict(width=1280, height=720, num_frames=61, steps=35, guidance_scale=6.0))
    assert estimate_seconds(nano, t2v_480) < mid < estimate_seconds(nano, t2v_720)


def _write(tmp_path: Path, current: dict) -> Path:
    path = tmp_path / "current.json"
    path.write_text(json.dumps(current), encoding="utf-8")
    return path


def test_a_new_figure_in_current_json_moves_the_estimate(tmp_path):
    current = json.loads(CURRENT_FIGURES.read_text(encoding="utf-8"))
    entry = next(e for e in current["workloads"] if e["id"] == "nano-t2v-720p")
    entry["figures"]["step_ms"] *= 2
    entry["figures"]["decode_s"] += 1.0
    request = dict(width=1280, height=720, num_frames=189, steps=35, guidance_scale=6.0)
    nano = VariantInfo.released("nano")
    before = estimate_seconds(nano, request)
    after = estimate_seconds(nano, request, load_step_times(_write(tmp_path, current)))
    assert after == pytest.approx(before + 35 * FIGURES["nano-t2v-720p"]["figures"]["step_ms"] / 1000 + 1.0)


def test_a_missing_or_one_branch_workload_is_refused_by_name(tmp_path):
    current = json.loads(CURRENT_FIGURES.read_text(encoding="utf-8"))
    without = dict(current, workloads=[e for e in current["workloads"] if e["id"] != "edge-t2v-480p"])
    with pytest.raises(ValueError, match="no workload 'edge-t2v-480p'"):
        load_step_times(_write(tmp_path, without))
    one_branch = json.loads(json.dumps(current))
    next(e for e in one_branch["workloads"] if e["id"] == "step-edge-t2i-640")["cfg"] = "the default guidance interval"
    with pytest.raises(ValueError, match="step-edge-t2i-640.*both branches"):
        load_step_times(_write(tmp_path, one_branch))
