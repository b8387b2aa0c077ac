"""bench/bench_shared_attention.py's pieces that run without a GPU: the first layer's operands its timings rest on
(built on the CPU by the same code) and the refusals of its command line."""
import pytest
import torch

pytest.importorskip("triton")

from bench import bench_shared_attention as bench  # noqa: E402
from cosmos3_kernels import shared_gen_attention as sga  # noqa: E402
from cosmos3_kernels.packed_kv import PackedKVLayout  # noqa: E402


def test_operands_hold_one_gen_block_in_every_branch():
    # The bench's error column compares the shared op with each branch's own attention, which only holds if the
    # operands are the first layer's: one set of gen queries, keys and values in every branch.
    layout = PackedKVLayout((5, 2), 6)
    q, kv = bench.first_layer_operands(layout, 4, 2, device="cpu")
    assert torch.equal(q[0], q[1])
    g0, g1 = layout.gen_offset(0), layout.gen_offset(1)
    assert torch.equal(kv[:, g0:g0 + 6], kv[:, g1:g1 + 6])
    start1 = layout.branch_start(1)
    assert not torch.equal(kv[:, :2], kv[:, start1:start1 + 2])  # the prefixes stay each branch's own
    shared = sga.shared_gen_attention_reference(q.float(), kv.float(), layout)
    own = torch.stack([sga.attention_with_lse_reference(q[b].float(), *(t.float() for t in layout.branch_kv(kv, b)),
                                                        scale=128 ** -0.5)[0] for b in range(2)])
    torch.testing.assert_close(shared, own, atol=1e-5, rtol=1e-5)


def test_an_unknown_section_is_refused_with_what_is_allowed(capsys):
    with pytest.raises(SystemExit) as exit_:
        bench.main(["--sections", "first_layer,decode"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "unknown ['decode']" in err and "'first_layer'" in err
