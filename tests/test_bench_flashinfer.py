"""bench/bench_flashinfer.py's pieces that run without a GPU: the fp32 reference its error column rests on, the
interleaved timing, and the refusals of its command line."""
import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("triton")

from bench import bench_flashinfer as bench  # noqa: E402


def test_fp32_reference_is_gqa_attention_with_each_query_head_on_its_own_kv_head():
    g = torch.Generator().manual_seed(0)
    q = torch.randn(7, 4, 16, generator=g, dtype=torch.float64)
    k, v = torch.randn(11, 2, 16, generator=g, dtype=torch.float64), torch.randn(11, 2, 16, generator=g, dtype=torch.float64)
    exact = F.scaled_dot_product_attention(q.transpose(0, 1).unsqueeze(0), k.transpose(0, 1).unsqueeze(0),
                                           v.transpose(0, 1).unsqueeze(0), enable_gqa=True)[0].transpose(0, 1)
    got = bench.fp32_attention(q, k, v)
    assert got.shape == (7, 4, 16)
    assert torch.allclose(got.double(), exact, atol=1e-5, rtol=1e-5)
    # Query heads 0 and 1 read K/V head 0, heads 2 and 3 head 1: a head paired with the other K/V head differs.
    swapped = bench.fp32_attention(q, k.flip(1), v.flip(1))
    assert not torch.allclose(swapped.double(), exact, atol=1e-3)


def test_interleaved_takes_each_candidate_once_a_round_in_turn():
    calls = []
    medians = bench.interleaved({"a": lambda: calls.append("a"), "b": lambda: calls.append("b")}, rounds=3, inner=2)
    assert calls == ["a", "a", "b", "b"] * 3
    assert set(medians) == {"a", "b"} and all(ms >= 0 for ms in medians.values())


def test_attention_flops_count_both_matmuls_over_every_branch():
    # 4 N L D H per branch: QK^T and PV, 2 FLOPs a multiply-add each.
    assert bench.attention_flops(10, [3, 5], heads=2) == 4 * 10 * (3 + 5) * bench.HEAD_DIM * 2


def test_an_unknown_section_is_refused_with_the_allowed_ones(capsys):
    with pytest.raises(SystemExit) as exit_:
        bench.main(["--sections", "bf16,fp4"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "unknown ['fp4']" in err and "'bf16', 'fp8'" in err


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without a GPU")
def test_a_machine_without_hopper_is_refused_with_what_it_has(capsys):
    with pytest.raises(SystemExit):
        bench.main([])
    assert "Hopper" in capsys.readouterr().err
