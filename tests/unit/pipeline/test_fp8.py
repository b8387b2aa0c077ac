"""FP8 on the CPU (`engine.pipeline.fp8`): policies, the FP8-only build, the one-GPU rule.

torchao's float8 tensors and `torch._scaled_mm` run on the CPU, so the FP8-only model is built and run
here from a tiny Super checkpoint (`check_available` is what refuses FP8 off the GPU in the engine; the
tests that need the CPU path bypass it explicitly). The numeric gate runs on the H200
(tests/gpu/test_gpu_fp8.py, bench/bench_fp8.py --gate).
"""
import json
import re

import numpy as np
import pytest
import torch

pytest.importorskip("torchao")

import engine  # noqa: E402
from engine.config import build_config  # noqa: E402
from engine.model.loader import component_parameter_count, fp8_weight_bytes, load_in_process  # noqa: E402
from engine.parallel.load import FP8OnlyLoader  # noqa: E402
from engine.pipeline import fp8  # noqa: E402
from engine.pipeline.fast_path import FastPathOptions  # noqa: E402
from engine.pipeline.fp8 import FP8_LABEL, FP8Policy  # noqa: E402

FAST = dict(enabled=True, batched_cfg=True, cuda_graphs=False, kernels="torch", fused_projections=True)
REQUEST = dict(mode="t2v", prompt="a lighthouse at dusk", seed=3, steps=3)


_row_loader = FP8OnlyLoader(FP8Policy())  # "row"; where it is passed below it only sizes the model, never builds


def _sizes(root):
    bf16 = sum(component_parameter_count(root / part) for part in ("transformer", "vae")) * 4  # fp32 on the CPU
    return bf16, fp8_weight_bytes(root, 4)


@pytest.mark.parametrize("name", ["row", "row-exact", "tensor", "row:qkv+in", "tensor-exact:in+down@2", "row:attn",
                                  "row:in+attn", "row-exact:qkv+out+in+down+attn@1", "row:in/mslk", "row:in+attn@2/mslk"])
def test_policy_names_round_trip(name):
    assert FP8Policy.parse(name).name == name


@pytest.mark.parametrize("bad", ["rows", "row-fast", "row:mlp", "row@-1", "row@x", "row:", "row:attn+mlp", "row/",
                                 "row:in/fbgemm", "tensor/mslk"])
def test_a_bad_policy_names_what_is_allowed(bad):
    with pytest.raises(ValueError, match=rf"FP8 policy {re.escape(repr(bad))} is not valid.*allowed: GRANULARITY"):
        FP8Policy.parse(bad)


def test_policy_keeps_edge_layers_and_left_out_gemms_bf16():
    policy = FP8Policy.parse("row:qkv+in@1")
    assert policy.gemms_of_layer(0, 4) == frozenset() == policy.gemms_of_layer(3, 4)
    assert policy.gemms_of_layer(1, 4) == frozenset({"qkv", "in"})


def test_the_fp8_only_build_holds_one_layer_in_bf16_at_a_time(tiny_family, monkeypatch):
    """Counted at every quantisation: the gen GEMM weights in bf16 belong to the layer being built only
    (the earlier ones are float8, the later ones not allocated yet)."""
    import diffusers

    from engine.model.loader import GEN_LINEAR

    config = json.loads((tiny_family["super"] / "transformer" / "config.json").read_text())
    built, layers_alive = [], []
    original = diffusers.Cosmos3OmniTransformer.from_config
    monkeypatch.setattr(diffusers.Cosmos3OmniTransformer, "from_config",
                        lambda *a, **k: built.append(original(*a, **k)) or built[-1])

    def counting_quantize(weight):
        layers_alive.append({int(name.split(".")[1]) for name, param in built[0].named_parameters()
                             if GEN_LINEAR.match(name) and not param.is_meta
                             and type(param.data).__name__ != "Float8Tensor"})
        return fp8.quantize_weight(weight, FP8Policy())

    transformer, weights = fp8.build_fp8_transformer(config, "cpu", fp8.checkpoint_fill(tiny_family["super"] / "transformer"),
                                                     FP8Policy(), quantize=counting_quantize)
    count = config["num_hidden_layers"]
    assert len(layers_alive) == 4 * count  # qkv, out, gate|up, down per layer
    assert all(len(alive) <= 1 for alive in layers_alive), layers_alive
    assert [sorted(a) for a in layers_alive[::4]] == [[i] for i in range(count)]
    assert not any(p.is_meta for p in transformer.parameters())
    assert weights.resident and len(weights.qkv) == count
    # The modules' gen weights are views of the quantised fused tensors: one copy, float8.
    attn = transformer.layers[0].self_attn
    assert type(attn.add_q_proj.weight.data).__name__ == "Float8Tensor"
    assert attn.add_q_proj.weight.qdata.data_ptr() == weights.qkv[0].qdata.data_ptr()


@pytest.fixture(scope="module", params=["row", "row-exact:qkv+in@1"])
def super_pair(tiny_family, request):
    """The tiny Super loaded FP8-only (the bf16 weights 'do not fit') and loaded whole in bf16."""
    root, loader = tiny_family["super"], FP8OnlyLoader(FP8Policy.parse(request.param))
    bf16, _ = _sizes(root)
    budget = int((bf16 + fp8_weight_bytes(root, 4, loader.policy)) / 2 / 0.9)  # bf16 over 90% of it, FP8 under
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(fp8, "check_available", lambda device, policy=None, backend="": None)  # the loader's GPU check, bypassed on the CPU
        fp8_model = load_in_process(root, device="cpu", memory_budget_bytes=budget, fp8_loader=loader)
    reference = load_in_process(root, device="cpu")
    for name, module in reference.transformer.named_children():
        if name != "time_embedder":  # kept in fp32, as diffusers keeps it (and as the FP8-only build does)
            module.to(torch.bfloat16)
    return fp8_model, reference


def test_super_fp8_only_equals_fp8_beside_bf16_and_says_fp8(super_pair, monkeypatch):
    """Same weights, same policy: the FP8-only model and FP8 weights quantised beside the bf16 ones give
    the same frames; every result of the FP8-only model is labelled FP8, fast path or not."""
    fp8_model, reference = super_pair
    monkeypatch.setattr(fp8, "check_available", lambda device, policy=None, backend="": None)  # FP8 beside bf16, on the CPU
    assert fp8_model.runtime.fp8_weights.resident and fp8_model.transformer.layers[0].self_attn.to_q.weight.dtype == torch.bfloat16
    fp8_model.fast_path = FastPathOptions(**FAST)  # fp8 not even asked for: the model holds nothing else
    reference.fast_path = FastPathOptions(**FAST, fp8=True, fp8_policy=fp8_model.runtime.fp8_weights.policy.name)
    try:
        ours, theirs = engine.generate(fp8_model, dict(REQUEST)), engine.generate(reference, dict(REQUEST))
        assert ours.precision == theirs.precision == FP8_LABEL == ours.summary()["precision"]
        # The summary (API, sidecar) names the policy, so a result can be reproduced under the same one.
        assert ours.summary()["fp8_policy"] == theirs.summary()["fp8_policy"] == fp8_model.runtime.fp8_weights.policy.name
        assert np.array_equal(ours.frames, theirs.frames)
        reference.fast_path = FastPathOptions(**FAST)
        bf16 = engine.generate(reference, dict(REQUEST))
        assert bf16.precision == "bf16" and not np.array_equal(bf16.frames, ours.frames)
        assert bf16.summary()["fp8_policy"] is None
        fp8_model.fast_path = FastPathOptions(enabled=False)  # the exact path reads the float8 module weights
        assert engine.generate(fp8_model, dict(REQUEST)).precision == FP8_LABEL
    finally:
        fp8_model.fast_path = reference.fast_path = None


def test_one_gpu_rule_with_and_without_fp8(tiny_family, monkeypatch):
    monkeypatch.delenv("COSMOS3_FP8_POLICY", raising=False)
    root = tiny_family["super"]
    bf16, fp8_bytes = _sizes(root)
    budget = int((bf16 + fp8_bytes) / 2 / 0.9)
    with pytest.raises(MemoryError, match=r"--gpus 2 .*Or run it on this one GPU in FP8 \(faster, approximate\).*"
                                          r"COSMOS3_FP8=1"):
        load_in_process(root, device="cpu", memory_budget_bytes=budget)
    tight = int(fp8_bytes / 0.9 * 0.95)
    with pytest.raises(MemoryError, match=r"--gpus 2 .*In FP8 \(faster, approximate\) it would still need"):
        load_in_process(root, device="cpu", memory_budget_bytes=tight, fp8_loader=_row_loader)
    # Where bf16 fits, asking for FP8 keeps the bf16 model (FP8 weights come beside it per request).
    assert load_in_process(root, device="cpu", fp8_loader=_row_loader).runtime.fp8_weights is None
    # engine.load_model asks the FP8-only build (Super's FP8 mode) for a GPU with FP8 tensor cores.
    mode_budget = int((bf16 + fp8_weight_bytes(root, 4, fp8.policy_for("super"))) / 2 / 0.9)
    with pytest.raises(fp8.FP8Unavailable, match="needs a CUDA GPU"):
        engine.load_model(root, device="cpu", memory_budget_bytes=mode_budget, fp8=True)


def test_the_fp8_size_follows_the_policy(tiny_family):
    root = tiny_family["super"]
    bf16, all_fp8 = _sizes(root)
    some = fp8_weight_bytes(root, 4, FP8Policy.parse("row:in"))
    edges = fp8_weight_bytes(root, 4, FP8Policy.parse("row@1"))
    assert all_fp8 < some < bf16 and all_fp8 < edges < bf16
    # Only the middle one of three layers is FP8 under "row@1": a third of the gen GEMM weights' saving.
    assert (bf16 - edges) * 3 == pytest.approx(bf16 - all_fp8, rel=1e-6)


def test_the_fp8_mode_is_the_measured_policy_per_family(monkeypatch):
    monkeypatch.delenv("COSMOS3_FP8_POLICY", raising=False)
    assert {f: fp8.policy_for(f).name for f in ("nano", "super", "edge")} == {
        "nano": "row:in+attn", "super": "row:in+attn", "edge": "row:down"}
    # Nano's attention joins its MLP input in FP8 (only from FP8_ATTENTION_MIN_GEN_TOKENS per branch, by
    # FP8Weights.attends_in_fp8). Where no FP8 attention can run, the default does not ask for it: the
    # GEMM policy stays.
    assert fp8.policy_for("nano", attention_available=False).name == "row:in"
    assert fp8.policy_for("edge", attention_available=False).name == "row:down"
    assert fp8.attention_unavailable("cpu") == "a CUDA GPU (this model runs on 'cpu')"
    # Where MSLK's quantiser can run, the default takes it (the same GEMMs, one kernel per activation instead of six).
    assert {f: fp8.policy_for(f, mslk_available=True).name for f in ("nano", "super", "edge")} == {
        "nano": "row:in+attn/mslk", "super": "row:in+attn/mslk", "edge": "row:down/mslk"}
    assert fp8.mslk_unavailable("cpu") == "a CUDA GPU (this model runs on 'cpu')"
    monkeypatch.setenv("COSMOS3_FP8_POLICY", "tensor-exact")
    named = build_config().fp8.policy
    assert fp8.policy_for("edge", named).name == "tensor-exact"
    assert fp8.policy_for("edge", named, mslk_available=True).name == "tensor-exact"  # a named policy stays as named
    assert FastPathOptions.from_config(build_config(), torch.device("cpu")).fp8_policy == "tensor-exact"


def test_the_quantiser_reaches_torchaos_activation_and_the_gemm_stays_torchs():
    """The policy's quantiser picks the kernel that quantises each activation (torchao's act_quant_kwargs); the
    weight's own preference, which picks the GEMM, stays TORCH (torch._scaled_mm) under both."""
    from torchao.quantization.quantize_.common import KernelPreference

    weight = torch.randn(64, 32, dtype=torch.bfloat16)
    for spelling, expected in (("row:in", KernelPreference.TORCH), ("row:in/mslk", KernelPreference.MSLK)):
        quantised = fp8.quantize_weight(weight, FP8Policy.parse(spelling))
        assert quantised.act_quant_kwargs.kernel_preference == expected
        assert quantised.kernel_preference == KernelPreference.TORCH


def test_a_policy_naming_mslk_is_refused_where_mslk_is_missing(monkeypatch):
    """On a Hopper GPU without `mslk-cuda`, "/mslk" is refused with what is missing and what to do, and the
    default does not ask for it."""
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "a Hopper GPU")
    monkeypatch.setattr(fp8, "_mslk_installed", lambda: False)
    monkeypatch.delenv("COSMOS3_FP8_POLICY", raising=False)
    with pytest.raises(fp8.FP8Unavailable, match=r"'row:in/mslk' quantises activations with MSLK's kernel, which needs "
                                                 r"the package mslk-cuda .*Leave '/mslk' out"):
        fp8.check_available("cuda", FP8Policy.parse("row:in/mslk"))
    fp8.check_available("cuda", FP8Policy.parse("row:in"))  # the torch quantiser needs nothing more
    assert fp8.host_policy("super", "cuda").quantiser == "torch"
    monkeypatch.setattr(fp8, "_mslk_installed", lambda: True)
    assert fp8.host_policy("super", "cuda").name == "row:in/mslk"


def test_the_fp8_only_loader_sizes_and_builds_by_the_policy_this_host_can_run(monkeypatch):
    """Its default is the family's for this device (`host_policy`), for sizing and building alike: on a CPU
    Nano's "attn" role is dropped; a policy given to the loader is kept as given."""
    monkeypatch.delenv("COSMOS3_FP8_POLICY", raising=False)
    assert FP8OnlyLoader().policy_for("nano", "cpu") == fp8.host_policy("nano", "cpu") == FP8Policy.parse("row:in")
    assert FP8OnlyLoader(FP8Policy.parse("row:in+attn")).policy_for("nano", "cpu").name == "row:in+attn"
