"""bench/bench_fp8.py's FP8-attention lower bound: the e4m3 rounding it applies, and that the patch it
puts on the dispatcher rounds what attention reads and is taken off afterwards."""
import pytest
import torch

pytest.importorskip("triton")

from bench.bench_fp8 import AttentionInputsE4M3, e4m3_round_trip  # noqa: E402
from kernels.dispatch import KernelDispatcher  # noqa: E402
from kernels.packed_kv import PackedKVLayout  # noqa: E402


def test_e4m3_round_trip_keeps_three_mantissa_bits_per_row():
    x = torch.randn(64, 4, 128, dtype=torch.float32) * torch.logspace(-3, 3, 64).view(64, 1, 1)
    y = e4m3_round_trip(x)
    assert y.dtype == x.dtype and y.shape == x.shape
    # Each row's largest value maps to e4m3's largest normal exactly; every normal value is within half an
    # ulp of 3 mantissa bits (2^-4 relative) of itself.
    peak = x.abs().amax(-1, keepdim=True)
    normal = x.abs() * 448 / peak >= 2.0 ** -6  # e4m3's normal range once the row is scaled to 448
    rel = ((y - x).abs() / x.abs().clamp(min=1e-30))[normal]
    assert float(rel.max()) <= 2.0 ** -4 + 1e-6
    assert float(rel.max()) > 2.0 ** -6  # it does round: a no-op would pass the bound above


def test_attention_patch_rounds_q_and_kv_and_is_removed():
    dispatcher = KernelDispatcher("torch")
    layout = PackedKVLayout(prefix_lens=(3,), gen_len=5)
    generator = torch.Generator().manual_seed(0)
    q = torch.randn(1, 5, 4, 16, generator=generator)
    kv = layout.allocate(2, 16, dtype=torch.float32, device="cpu")
    kv.copy_(torch.randn(kv.shape, generator=generator))
    plain = dispatcher.prefix_attention(q, kv, layout)
    original = KernelDispatcher.prefix_attention
    with AttentionInputsE4M3():
        rounded = dispatcher.prefix_attention(q, kv, layout)
        expected = original(dispatcher, e4m3_round_trip(q), e4m3_round_trip(kv), layout)
    assert KernelDispatcher.prefix_attention is original
    assert torch.equal(rounded, expected) and not torch.equal(rounded, plain)
    # e4m3 keeps 3 mantissa bits (2^-4 relative per value): the output moves by a few percent, no more.
    assert 5e-3 < float((rounded - plain).norm() / plain.norm()) < 0.1
    assert torch.equal(dispatcher.prefix_attention(q, kv, layout), plain)  # the cache was never rounded in place
