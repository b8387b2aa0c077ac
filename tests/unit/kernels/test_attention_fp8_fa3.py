"""FA3's FP8 attention (`cosmos3_kernels.attention_fp8_fa3`) on the CPU: its PyTorch reference, its refusals, and how the
FP8 mode picks between it and cuDNN's (`engine.pipeline.fp8.FP8_ATTENTION_BACKENDS`). FA3's kernel itself runs on
the H200 (tests/gpu/test_gpu_attention_fp8.py), where it is held to this reference and to fp32."""
import sys

import pytest
import torch

from engine.config import build_config
from engine.pipeline import fp8
from engine.pipeline.fp8 import FP8Policy
from cosmos3_kernels import attention_fp8, attention_fp8_fa3
from cosmos3_kernels.packed_kv import PackedKVLayout
from test_attention_fp8 import _fp32_attention, _inputs, _rel


@pytest.mark.parametrize("centred", [True, False])
def test_reference_rounds_like_fp8_and_stays_close_to_fp32_attention(centred):
    q, kv, layout = _inputs()
    exact = _fp32_attention(q, kv, layout)
    error = _rel(attention_fp8_fa3.prefix_attention_fp8_fa3_reference(q, kv, layout, centred=centred), exact)
    # e4m3 operands and probabilities: the error is far above bf16's rounding and far below a wrong result.
    assert error > 5 * _rel(exact.bfloat16(), exact) and 5e-3 < error < 6e-2, error


def test_centring_v_takes_its_mean_out_before_the_roundings_and_adds_it_back():
    q, kv, layout = _inputs(prefixes=(9, 4), gen=16)
    row = torch.linspace(-3.1, 2.9, kv.shape[-1]).bfloat16()  # every row of v the same, off e4m3's grid
    kv[1] = row
    exact = row.float().expand_as(q)
    centred = attention_fp8_fa3.prefix_attention_fp8_fa3_reference(q, kv, layout)
    uncentred = attention_fp8_fa3.prefix_attention_fp8_fa3_reference(q, kv, layout, centred=False)
    assert torch.equal(centred.float(), exact)  # v - mean is zero; the mean comes back in fp32, rounded once
    assert 5e-3 < _rel(uncentred, exact) < 6e-2  # v itself rounded to e4m3


def test_probabilities_are_rounded_on_fa3s_scale():
    q, kv, layout = _inputs(prefixes=(3,), gen=8, hq=1, hk=1)
    q, kv = q.float(), kv.float()  # an fp32 result, so the check is not lost in bf16's last rounding
    # Every query attends to two keys, with scores 0 and -14/sqrt(128) (each operand on e4m3's grid at its scale);
    # every other key scores -448/sqrt(128), which no probability survives. On FA3's scale (the largest weight of
    # a row is 256) the second key's 256 exp(-1.237) = 74.28 rounds to e4m3's 72; on cuDNN's (448) to 128.
    q[:] = 0
    q[..., 0] = 1
    kv[0] = 0
    kv[0, :, :, 0] = -448
    kv[0, 0, 0, 0], kv[0, 1, 0, 0] = 0, -14
    kv[1] = 0
    kv[1, 0], kv[1, 1] = 1.0, -1.0
    out = attention_fp8_fa3.prefix_attention_fp8_fa3_reference(q, kv, layout, centred=False)[0, :, 0, 0]
    p1 = float(torch.exp(torch.tensor(-14 / 128 ** 0.5)))
    on_fa3s_scale = (256 - 72) / (256 + 256 * p1)
    assert out.tolist() == pytest.approx([on_fa3s_scale] * 8, rel=1e-5)
    assert on_fa3s_scale != pytest.approx((1 - p1) / (1 + p1), rel=5e-3)  # the exact mix: 0.5502 against 0.5571
    assert on_fa3s_scale != pytest.approx((448 - 128) / (448 + 448 * p1), rel=5e-3)  # cuDNN's: 0.5536


def test_the_cuda_path_refuses_what_it_cannot_run():
    q, kv, layout = _inputs()
    assert "needs CUDA" in attention_fp8_fa3.unsupported(q, kv)
    with pytest.raises(ValueError, match=r"FP8 attention cannot run this call: device cpu"):
        attention_fp8_fa3.FA3FP8Attention()(q, kv, layout)


@pytest.fixture
def hopper(monkeypatch):
    """A Hopper GPU as far as the FP8 mode's checks go, with each backend's own check replaceable."""
    monkeypatch.setattr(fp8, "_hopper_missing", lambda device: None)
    state = {"fa3": None, "cudnn": None}
    monkeypatch.setattr(attention_fp8_fa3, "unavailable", lambda device: state["fa3"])
    monkeypatch.setattr(attention_fp8, "unavailable", lambda device: state["cudnn"])
    return state


def test_the_fp8_mode_takes_the_first_backend_the_host_can_run(hopper, monkeypatch):
    assert list(fp8.FP8_ATTENTION_BACKENDS) == ["fa3", "cudnn"]
    policy = FP8Policy.parse("row:in+attn")
    assert fp8.attention_backend("cuda") == ("fa3", None)
    # Both installed: FA3's takes every call, the shortest the FP8 mode gives the FP8 attention included (it
    # measured faster than cuDNN's at every length).
    runner = fp8.fp8_attention(policy, "cuda")
    assert isinstance(runner, attention_fp8_fa3.FA3FP8Attention) and runner.name == "fa3"
    hopper["cudnn"] = "nvidia-cudnn-frontend is not installed"  # or alone
    assert isinstance(fp8.fp8_attention(policy, "cuda"), attention_fp8_fa3.FA3FP8Attention)
    hopper["cudnn"] = None
    hopper["fa3"] = "fa3-fwd is not installed"
    assert fp8.attention_backend("cuda") == ("cudnn", None)
    assert isinstance(fp8.fp8_attention(policy, "cuda"), attention_fp8.CudnnFP8Attention)
    assert fp8.fp8_attention(policy, "cuda", centred=False).centred is False
    hopper["cudnn"] = "nvidia-cudnn-frontend is not installed"
    assert fp8.attention_unavailable("cuda") == "fa3-fwd is not installed or nvidia-cudnn-frontend is not installed"
    # The default policy then leaves the attention out; one naming it is refused, quoting what is missing.
    assert fp8.host_policy("nano", "cuda").attention is False
    monkeypatch.setattr(fp8, "mslk_unavailable", lambda device: None)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    monkeypatch.setitem(sys.modules, "torchao", object())  # check_available's import, on a host without it
    with pytest.raises(fp8.FP8Unavailable, match=r"'row:in\+attn' runs attention in FP8, which needs fa3-fwd is not "
                                                 r"installed or nvidia-cudnn-frontend"):
        fp8.check_available("cuda", policy)


def named(variable: str, value: str):
    """What `COSMOS3_FP8_ATTENTION` or `COSMOS3_FA3_PACK_GQA` set to `value` hands the FP8 mode (engine.config)."""
    section = build_config({variable: value}).fp8
    return section.attention if variable == "COSMOS3_FP8_ATTENTION" else section.fa3_pack_gqa


def test_cosmos3_fp8_attention_names_one_backend(hopper, monkeypatch):
    backend = named("COSMOS3_FP8_ATTENTION", "fa3")
    assert isinstance(fp8.fp8_attention(FP8Policy.parse("row:attn"), "cuda", backend=backend),
                      attention_fp8_fa3.FA3FP8Attention)
    backend = named("COSMOS3_FP8_ATTENTION", "cudnn")
    assert fp8.attention_backend("cuda", backend) == ("cudnn", None)  # though FA3 could run
    hopper["cudnn"] = "nvidia-cudnn-frontend is not installed"
    assert fp8.attention_backend("cuda", backend) == (None, "nvidia-cudnn-frontend is not installed")  # no fallback
    with pytest.raises(ValueError, match=r"COSMOS3_FP8_ATTENTION='flash': allowed one of \['fa3', 'cudnn'\]"):
        named("COSMOS3_FP8_ATTENTION", "flash")


def test_fa3_runs_unpacked_unless_told_otherwise(hopper, monkeypatch):
    policy = FP8Policy.parse("row:in+attn")
    unset = build_config({}).fp8.fa3_pack_gqa
    assert attention_fp8_fa3.PACK_GQA is False and fp8.fp8_attention(policy, "cuda", pack_gqa=unset).pack_gqa is False
    for text, expected in (("1", True), ("0", False), ("auto", None)):
        pack = named("COSMOS3_FA3_PACK_GQA", text)
        assert fp8.fp8_attention(policy, "cuda", pack_gqa=pack).pack_gqa is expected
    with pytest.raises(ValueError, match=r"COSMOS3_FA3_PACK_GQA='yes': allowed '1', '0', 'auto'"):
        named("COSMOS3_FA3_PACK_GQA", "yes")


def test_each_runner_names_itself_as_cosmos3_fp8_attention_spells_it(hopper, monkeypatch):
    # A result's summary reports the runner's name; it must be the spelling that reproduces the result.
    for spelling in fp8.FP8_ATTENTION_BACKENDS:
        backend = named("COSMOS3_FP8_ATTENTION", spelling)
        assert fp8.fp8_attention(FP8Policy.parse("row:attn"), "cuda", backend=backend).name == spelling
