"""bench/bench_fp8.py's FP8-attention lower bound: the e4m3 rounding it applies, and that the patch it
puts on the dispatcher rounds what attention reads and is taken off afterwards."""
import pytest
import torch

pytest.importorskip("triton")

from bench.bench_fp8 import AttentionInputsE4M3, e4m3_round_trip  # noqa: E402
from cosmos3_kernels.dispatch import KernelDispatcher  # noqa: E402
from cosmos3_kernels.packed_kv import PackedKVLayout  # noqa: E402


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


def test_uncentred_patch_gives_attention_policies_the_plain_op_and_is_removed():
    from bench.bench_fp8 import AttentionUncentred
    from engine.pipeline import fp8

    original = fp8.fp8_attention
    with AttentionUncentred():
        runner = fp8.fp8_attention(fp8.FP8Policy.parse("row:in+attn"), "cpu")
        assert runner.centred is False and fp8.fp8_attention(fp8.FP8Policy.parse("row:in"), "cpu") is None
    assert fp8.fp8_attention is original
    assert original(fp8.FP8Policy.parse("row:attn"), "cpu").centred is True


def test_mlp_epilogue_patch_forces_quack_where_it_can_run_and_refuses_where_it_cannot(monkeypatch):
    from bench.bench_fp8 import MLPEpilogueEverywhere
    from cosmos3_kernels import dispatch, gemm

    original = dispatch.KernelDispatcher.choose
    with pytest.raises(RuntimeError, match="the MLP epilogue runs on QuACK only: device cpu"):
        with MLPEpilogueEverywhere():
            pass
    assert dispatch.KernelDispatcher.choose is original
    monkeypatch.setattr(gemm, "mlp_in_unsupported", lambda *a: None)  # as on a Hopper GPU with QuACK
    with MLPEpilogueEverywhere():
        decision = dispatch.KernelDispatcher().choose("mlp_in", None, None, "swiglu")
        assert (decision.backend, decision.config) == ("quack", gemm.DEFAULT_QUACK_CONFIGS[0])
        assert dispatch.KernelDispatcher("torch").choose("swiglu", torch.ones(2, 2), torch.ones(2, 2)).reason == "forced"
    assert dispatch.KernelDispatcher.choose is original


def test_tower_inputs_bench_captures_every_layer_and_measures_both_ways(monkeypatch, tmp_path):
    import json

    from bench import bench_fp8_attention_inputs as bench, models

    tiny = dict(models.TRANSFORMERS["edge"], hidden_size=64, num_hidden_layers=3, num_attention_heads=4,
                num_key_value_heads=2, head_dim=32, intermediate_size=128, rope_axes_dim=[8, 4, 4])
    monkeypatch.setitem(models.TRANSFORMERS, "edge", tiny)
    out = tmp_path / "inputs.json"
    assert bench.main(["--family", "edge", "--size", "64x64x1", "--layers", "2", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert [row["layer"] for row in result["layers"]] == [0, 1]  # --layers builds only the first two
    for row in result["layers"]:
        assert row["keys"] == bench.PROMPT_TOKENS + (64 // 16 // 2) ** 2
        assert 1e-3 < row["centred"] < 0.1 and 1e-3 < row["not_centred"] < 0.1


def test_centring_measure_sees_a_common_part_of_v():
    from bench.bench_fp8_attention_inputs import layer_errors

    g = torch.Generator().manual_seed(3)
    q = torch.randn(256, 4, 128, generator=g)
    k = torch.randn(400, 2, 128, generator=g)
    v = torch.randn(400, 2, 128, generator=g) + 0.5 * torch.randn(2, 128, generator=g)
    row = layer_errors(q, k, v)
    assert 0.3 < row["v_mean_over_spread"] < 0.8
    assert row["centred"] < 0.6 * row["not_centred"]
