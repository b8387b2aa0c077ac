"""FP8 attention (`cosmos3_kernels.attention_fp8`) on the CPU: its PyTorch reference, its refusals, and how the FP8
mode routes a layer's attention to it (`FP8Policy` role "attn"). cuDNN's kernel itself runs on the H200
(tests/gpu/test_gpu_attention_fp8.py), where it is held to this reference and to fp32."""
import numpy as np
import pytest
import torch

import engine
from engine.pipeline import fp8
from engine.pipeline.fast_path import FastPathOptions
from engine.pipeline.fp8 import FP8_LABEL, FP8Policy
from cosmos3_kernels import attention_fp8
from cosmos3_kernels.packed_kv import PackedKVLayout
from cosmos3_kernels.prefix_attention import prefix_attention_reference


def _rms_normed(*shape, generator):
    x = torch.randn(*shape, generator=generator)
    return x / x.pow(2).mean(-1, keepdim=True).sqrt()


def _inputs(prefixes=(37, 5), gen=64, hq=4, hk=2, head_dim=128, seed=0):
    g = torch.Generator().manual_seed(seed)
    layout = PackedKVLayout(prefixes, gen)
    kv = torch.empty(2, layout.rows, hk, head_dim)
    kv[0] = _rms_normed(layout.rows, hk, head_dim, generator=g)
    kv[1] = torch.randn(layout.rows, hk, head_dim, generator=g)
    q = _rms_normed(len(prefixes), gen, hq, head_dim, generator=g)
    return q.bfloat16(), kv.bfloat16(), layout


def _fp32_attention(q, kv, layout):
    return prefix_attention_reference(q.float(), kv.float(), layout)


def _rel(a, b):
    return float((a.float() - b.float()).norm() / b.float().norm())


def test_quantize_reference_fills_the_e4m3_range_and_saturates():
    x = torch.tensor([0.5, -2.0, 1.0, 3.0])
    q8 = attention_fp8.quantize_e4m3_reference(x, torch.tensor([2.0]))
    # amax 2 maps to 448; 3.0 is past the amax it was given and saturates instead of becoming NaN.
    assert q8.float().tolist() == [112.0, -448.0, 224.0, 448.0]
    assert attention_fp8.amax(torch.zeros(3)).item() > 0  # a zero tensor still gets a finite scale


@pytest.mark.parametrize("centred", [True, False])
def test_reference_rounds_like_fp8_and_stays_close_to_fp32_attention(centred):
    q, kv, layout = _inputs()
    exact = _fp32_attention(q, kv, layout)
    ours = attention_fp8.prefix_attention_fp8_reference(q, kv, layout, centred=centred)
    bf16_only = _rel(exact.bfloat16(), exact)
    error = _rel(ours, exact)
    # e4m3 keeps 3 mantissa bits: the error is far above bf16's rounding and far below a wrong result.
    assert error > 5 * bf16_only and 5e-3 < error < 6e-2, (error, bf16_only)


def test_uncentred_outputs_are_e4m3_values_on_the_output_scale():
    q, kv, layout = _inputs()
    ours = attention_fp8.prefix_attention_fp8_reference(q, kv, layout, centred=False)
    for b in range(layout.num_branches):
        _, v = layout.branch_kv(kv, b)
        descale_o = attention_fp8.amax(v) / (attention_fp8.OUTPUT_HEADROOM * attention_fp8.E4M3_MAX)
        on_grid = ours[b].float() / descale_o
        # Snapping to e4m3's grid moves a bf16-rounded result ~2-3% (rms); ours only by its last bf16 rounding.
        assert _rel(on_grid.to(torch.float8_e4m3fn).float() * descale_o, ours[b].float()) < 1e-2


def test_centring_v_takes_its_mean_out_before_the_roundings_and_adds_it_back():
    q, kv, layout = _inputs(prefixes=(9, 4), gen=16)
    # Every row of v the same, off e4m3's grid: the exact attention is that row for every query. Centred, v - mean
    # is zero and the mean comes back in fp32, so the output is the row itself; uncentred, the row is rounded to e4m3.
    row = torch.linspace(-3.1, 2.9, kv.shape[-1]).bfloat16()
    kv[1] = row
    exact = row.float().expand_as(q)
    centred = attention_fp8.prefix_attention_fp8_reference(q, kv, layout)
    uncentred = attention_fp8.prefix_attention_fp8_reference(q, kv, layout, centred=False)
    assert torch.equal(centred.float(), exact)
    assert 5e-3 < _rel(uncentred, exact) < 6e-2


def test_centring_v_cuts_the_error_where_v_has_a_common_part():
    # The towers' v has a mean over a branch's rows of 0.13-0.44 of its spread per (head, channel), and attention
    # over many keys lands near that mean; the output's e4m3 rounding then costs far less of what is left.
    q, kv, layout = _inputs(prefixes=(300, 40), gen=512)
    kv[1] = (kv[1].float() + 0.3 * torch.randn(kv.shape[-2], kv.shape[-1], generator=torch.Generator().manual_seed(5))).bfloat16()
    exact = _fp32_attention(q, kv, layout)
    centred = _rel(attention_fp8.prefix_attention_fp8_reference(q, kv, layout), exact)
    uncentred = _rel(attention_fp8.prefix_attention_fp8_reference(q, kv, layout, centred=False), exact)
    assert centred < 0.6 * uncentred, (centred, uncentred)


@pytest.mark.parametrize("centred", [True, False])
def test_output_scale_leaves_room_when_one_key_takes_all_the_weight(centred):
    q, kv, layout = _inputs(prefixes=(3,), gen=8, hq=1, hk=1)
    # Scores so sharp that every query attends to the key holding v's largest value: O is that row of v.
    q[:] = q[0, 0, 0]
    kv[0] = 0
    kv[0, 1] = q[0, 0] * 40
    kv[1, 1] = 7.5
    out = attention_fp8.prefix_attention_fp8_reference(q, kv, layout, centred=centred)
    assert torch.isfinite(out.float()).all()
    assert out[0, 0].float().max().item() == pytest.approx(7.5, rel=0.07)


def test_the_cuda_path_refuses_what_it_cannot_run():
    q, kv, layout = _inputs()
    assert "needs CUDA" in attention_fp8.unsupported(q, kv)
    with pytest.raises(ValueError, match=r"FP8 attention cannot run this call: device cpu"):
        attention_fp8.CudnnFP8Attention()(q, kv, layout)


def test_policies_name_the_attention_role():
    assert FP8Policy.parse("row:in+attn").roles == ("in", "attn")
    attention_only = FP8Policy.parse("row:attn@1")
    assert attention_only.gemms == frozenset() and attention_only.attention
    assert [attention_only.attention_of_layer(i, 4) for i in range(4)] == [False, True, True, False]
    assert not FP8Policy.parse("row").attention  # the GEMM policies keep the bf16 attention


@pytest.fixture(scope="module")
def nano(tiny_family):
    return engine.load_model(tiny_family["nano"], device="cpu")


@pytest.mark.parametrize("threshold,expect_calls", [(0, True), (10**9, False)])
def test_the_fp8_mode_routes_long_attention_calls_to_fp8(nano, monkeypatch, threshold, expect_calls):
    monkeypatch.setattr(fp8, "check_available", lambda device, policy=None, backend="": None)
    monkeypatch.setattr(fp8, "FP8_ATTENTION_MIN_GEN_TOKENS", threshold)
    calls = []

    def recorded(q, kv_buffer, layout, **kwargs):
        calls.append(layout.gen_len)
        return attention_fp8.prefix_attention_fp8_reference(q, kv_buffer, layout, **kwargs)

    recorded.name = "recorded"
    monkeypatch.setattr(fp8, "fp8_attention", lambda policy, device, **backend: recorded if policy.attention else None)
    request = dict(mode="t2v", prompt="a lighthouse at dusk", negative_prompt="blurry", seed=3, steps=2, num_frames=9)
    layers = len(nano.transformer.layers)
    try:
        nano.fast_path = FastPathOptions(enabled=True, cuda_graphs=False, kernels="torch")
        bf16 = engine.generate(nano, dict(request))
        nano.fast_path = FastPathOptions(enabled=True, cuda_graphs=False, kernels="torch", fp8=True, fp8_policy="row:attn")
        ours = engine.generate(nano, dict(request))
        # The FP8 weights stay on the model for the next FP8 request; a bf16 request after it ran no FP8 attention.
        nano.fast_path = FastPathOptions(enabled=True, cuda_graphs=False, kernels="torch")
        after = engine.generate(nano, dict(request))
    finally:
        nano.fast_path, nano.runtime.fp8_weights = None, None
    assert ours.precision == FP8_LABEL and bf16.precision == "bf16"
    if expect_calls:
        # Both CFG branches in one call per layer and step (the bf16 edges of "@N" are FP8Policy's, tested above).
        assert len(calls) == request["steps"] * layers and len(set(calls)) == 1
        assert not np.array_equal(ours.frames, bf16.frames)
        assert ours.summary()["fp8_attention"] == "recorded"  # the summary (API, sidecar) names the kernel
    else:
        assert calls == [] and np.array_equal(ours.frames, bf16.frames)
        assert ours.summary()["fp8_attention"] is None  # FP8 GEMMs, bf16 attention
    assert bf16.summary()["fp8_attention"] is None and after.summary()["fp8_attention"] is None


def test_the_fp8_attention_and_its_cudnn_graphs_outlive_a_change_of_policy(nano, monkeypatch):
    # A server whose requests switch between policies (FastPathOptions.fp8_policy) must not rebuild every cuDNN
    # graph (~1 s per shape on the H200) on each switch.
    from engine.pipeline.fast_path import fused_projections

    monkeypatch.setattr(fp8, "check_available", lambda device, policy=None, backend="": None)
    made = []
    monkeypatch.setattr(fp8, "fp8_attention",
                        lambda policy, device, **backend: made.append(policy.name) or object() if policy.attention else None)
    try:
        nano.runtime.fp8_weights = None
        runners = []
        for name in ("row:in", "row:attn", "row:in", "row:attn"):
            weights = fp8.fp8_weights(nano, fused_projections(nano), FP8Policy.parse(name))
            runners.append(weights.attention)
            assert weights.attends_in_fp8(0, 2, PackedKVLayout((3, 3), 10**6)) == (name == "row:attn")
    finally:
        nano.runtime.fp8_weights = None
    assert runners[0] is None and runners[1] is runners[2] is runners[3] is not None and made == ["row:attn"]
