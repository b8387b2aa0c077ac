"""bench/bench_quack.py's pieces that run without a GPU: the fp32 references its error columns rest on (the MLP
input's is cosmos3_kernels.gemm's, tested in test_kernels_gemm.py), its tile config spelling, its step shapes, and the
refusals of its command line."""
import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("triton")

from bench import bench_quack as bench  # noqa: E402


def test_residual_reference_norms_the_sum_and_returns_it():
    g = torch.Generator().manual_seed(1)
    x, w, hidden = torch.randn(4, 6, generator=g), torch.randn(3, 6, generator=g), torch.randn(4, 3, generator=g)
    norm_weight = torch.tensor([1.0, 2.0, 0.5])
    normed, h = bench.residual_reference(x, w, hidden, norm_weight, eps=1e-6)
    assert torch.allclose(h, hidden + x @ w.T)
    rms = h.square().mean(-1, keepdim=True).add(1e-6).sqrt()
    assert torch.allclose(normed, h / rms * norm_weight)


def test_relative_error_is_zero_on_the_reference_and_scales_with_the_difference():
    ref = torch.tensor([3.0, 4.0])
    assert bench.relative_error(ref, ref) == 0
    assert bench.relative_error(ref * 1.1, ref) == pytest.approx(0.1)


def test_config_spelling_maps_to_gemm_config_fields():
    assert bench.parse_config("256x192c2x1") == dict(tile_m=256, tile_n=192, pingpong=False, cluster_m=2, cluster_n=1,
                                                     is_dynamic_persistent=False, device_capacity=9)
    assert bench.parse_config("128x192p1x2")["pingpong"] is True
    with pytest.raises(ValueError, match="'128x192' is not"):
        bench.parse_config("128x192")


def test_a_bad_config_and_an_unknown_section_are_refused_with_what_is_allowed(capsys):
    with pytest.raises(SystemExit) as exit_:
        bench.main(["--configs", "128x192p2x1,big"])
    assert exit_.value.code == 2 and "'big' is not" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bench.main(["--sections", "mlp_in,attention"])
    err = capsys.readouterr().err
    assert "unknown ['attention']" in err and "'residual'" in err and "'step'" in err


def test_step_shapes_parse_and_a_bad_one_is_refused_with_the_form():
    from bench.step_ab import parse_shapes

    assert parse_shapes("nano:1280x720x189,edge:832x480x121") == [("nano", 1280, 720, 189), ("edge", 832, 480, 121)]
    with pytest.raises(ValueError, match="'nano:1280x720' is not FAMILY:WIDTHxHEIGHTxFRAMES"):
        parse_shapes("nano:1280x720")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without a GPU")
def test_a_machine_without_hopper_is_refused_with_what_it_has(capsys):
    with pytest.raises(SystemExit):
        bench.main([])
    assert "SM90" in capsys.readouterr().err
