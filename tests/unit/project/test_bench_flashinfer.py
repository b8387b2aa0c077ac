"""bench/bench_flashinfer.py's pieces that run without a GPU: the fp32 reference its error column rests on, the
interleaved timing, and the refusals of its command line."""
import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("triton")

from bench import bench_flashinfer as bench  # noqa: E402
from bench.bench_attention_fp8 import error_vs_fp32  # noqa: E402
from cosmos3_kernels.packed_kv import PackedKVLayout  # noqa: E402


def test_fp32_reference_is_gqa_attention_with_each_query_head_on_its_own_kv_head():
    # The error column's reference (bench_attention_fp8.error_vs_fp32, shared with that bench): SDPA's own GQA
    # attention of every branch scores ~0 against it; the same with the K/V heads swapped does not.
    layout = PackedKVLayout((4, 2), 7)
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 7, 4, 16, generator=g, dtype=torch.float64)
    kv = torch.randn(2, layout.total_rows, 2, 16, generator=g, dtype=torch.float64)

    def sdpa(kv_heads_flipped: bool) -> torch.Tensor:
        out = torch.empty_like(q)
        for b in range(layout.num_branches):
            k, v = (t.flip(1) if kv_heads_flipped else t for t in layout.branch_kv(kv, b))
            out[b] = F.scaled_dot_product_attention(q[b].transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1),
                                                    enable_gqa=True).transpose(0, 1)
        return out

    assert error_vs_fp32(sdpa(False), q, kv, layout, rows=5) < 1e-5
    assert error_vs_fp32(sdpa(True), q, kv, layout, rows=5) > 1e-2


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
