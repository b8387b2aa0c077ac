"""Duration estimates reproduce the measured step times and grow the way the workloads do."""
import pytest

from engine.serving.estimates import estimate_seconds, gen_tokens
from engine.model.variants import VariantInfo


def test_gen_tokens_matches_the_benchmark_shapes():
    assert gen_tokens(1024, 1024, 1) == 1024
    assert gen_tokens(832, 480, 121) == 12090
    assert gen_tokens(1280, 720, 189) == 44160
    assert gen_tokens(640, 640, 1) == 400


def test_estimates_hit_measured_points_and_order_workloads():
    nano, edge, super_ = (VariantInfo.released(f) for f in ("nano", "edge", "super"))
    t2i = dict(width=1024, height=1024, num_frames=1, steps=50, guidance_scale=4.0)
    # 50 steps at the measured 58 ms plus decode and fixed costs.
    assert estimate_seconds(nano, t2i) == pytest.approx(3.0 + 50 * 0.058 + 0.07, rel=1e-6)
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
