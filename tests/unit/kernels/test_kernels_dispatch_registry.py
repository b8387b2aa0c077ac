"""The backend registry (cosmos3_kernels.registry) and the one autotuner (cosmos3_kernels.autotune) behind dispatch.

No GPU: an op of the test's own is registered, its inputs are a stand-in tensor on "cuda" (the rule chain reads its
device and shape only), and the timer calls a candidate once and takes the milliseconds it returns, so the chain runs
as it does on the H200.
"""
from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from cosmos3_kernels import attention_fp8, attention_fp8_fa3, autotune, dispatch as dsp, gemm, persist, registry
from cosmos3_kernels.prefix_attention import AttentionConfig, Flash4Config
from cosmos3_kernels.timing import Timing

OP = "test_scaled"
FINGERPRINT = {"gpu": "NVIDIA H200", "driver": "580.159.04", "torch": "2.11.0", "kernels_source": "abc"}
RAN: list[str] = []  # the backends called, in order (timed or run)


def _backend(name: str, ms: float):
    def call(x, *, config=None):
        RAN.append(name)
        return ms

    return call


# The reference always runs; the kernel refuses width 3; the library is never installed here.
registry.describe(OP, key=lambda x: (tuple(x.shape),))
registry.register(OP, "torch", supported=lambda x: None, call=_backend("torch", 3.0), reference=True)
registry.register(OP, "triton", supported=lambda x: "it refuses width 3" if x.shape[-1] == 3 else None,
                  call=_backend("triton", 2.0))
registry.register(OP, "lib", supported=lambda x: "lib is not installed", call=_backend("lib", 1.0), library=True,
                  forcible=False)


def _on_cuda(width: int):
    return SimpleNamespace(device=torch.device("cuda", 0), shape=(2, width))


@pytest.fixture
def chain(monkeypatch):
    """The rule chain on a stand-in CUDA tensor: nothing is captured, the timer calls each candidate once."""
    RAN.clear()
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    monkeypatch.setattr(autotune, "time_ms", lambda fn, **kw: Timing((fn(),)))
    return RAN


def test_a_backend_whose_supported_says_no_is_never_measured_nor_called(chain):
    d = dsp.KernelDispatcher("auto")
    decision = d.choose(OP, _on_cuda(4))
    assert (decision.backend, decision.reason, decision.ms) == ("triton", "measured", {"torch": 3.0, "triton": 2.0})
    assert chain == ["torch", "triton"]  # "lib" (the fastest, were it run) never ran
    chain.clear()
    assert d.run(OP, (_on_cuda(4),), {}) == 2.0 and chain == ["triton"]  # kept: not measured again
    chain.clear()
    refused = d.choose(OP, _on_cuda(3))
    assert (refused.backend, refused.reason) == ("torch", "unsupported: it refuses width 3") and chain == []
    assert d.run(OP, (_on_cuda(3),), {}) == 3.0 and chain == ["torch"]
    assert set(d.decisions()) == {(OP, "cuda:0", (2, 4))}  # the refusal is no measurement


def test_a_forced_mode_picks_its_backend_or_says_which_it_allows(chain, monkeypatch):
    forced = dsp.KernelDispatcher("triton")
    assert forced.choose(OP, _on_cuda(4)) == dsp.Decision("triton", "forced")
    assert forced.choose(OP, _on_cuda(3)) == dsp.Decision("torch", "unsupported: it refuses width 3")
    assert dsp.KernelDispatcher("torch").choose(OP, _on_cuda(4)) == dsp.Decision("torch", "forced")
    assert chain == []  # a forced choice times nothing
    # A library backend is no mode's to force; a name that is no backend of the op is refused, naming both.
    with pytest.raises(ValueError, match=r"op 'test_scaled': forced backend 'lib' is not one of its backends; "
                                         r"allowed: torch, triton \(or auto\)"):
        registry.forced(OP, "lib")
    with pytest.raises(ValueError, match=r"op 'attention_fp8': forced backend 'flash' .* allowed: fa3, cudnn"):
        dsp.choose_fp8_attention("cuda", "flash")
    # The dispatcher's modes are global: an op without a kernel of that name runs its reference, and says so.
    monkeypatch.setattr(gemm, "mlp_in_unsupported", lambda *a: None)  # as on a Hopper GPU with QuACK
    x = torch.randn(4, 8, dtype=torch.bfloat16)
    decision = forced.choose("mlp_in", x, torch.randn(16, 8, dtype=torch.bfloat16), "swiglu")
    assert decision.backend == "torch" and "mlp_in has no triton kernel" in decision.reason


def test_the_fp8_attention_is_an_op_chosen_by_rank_or_forced(monkeypatch):
    state = {"fa3": None, "cudnn": None}
    monkeypatch.setattr(attention_fp8_fa3, "unavailable", lambda device: state["fa3"])
    monkeypatch.setattr(attention_fp8, "unavailable", lambda device: state["cudnn"])
    assert registry.names("attention_fp8") == ("fa3", "cudnn")  # by rank, whatever the import order
    assert dsp.choose_fp8_attention("cuda") == ("fa3", None)
    assert dsp.choose_fp8_attention("cuda", "cudnn") == ("cudnn", None)
    state["fa3"] = "fa3-fwd is not installed"
    assert dsp.choose_fp8_attention("cuda") == ("cudnn", None)
    assert dsp.choose_fp8_attention("cuda", "fa3") == (None, "fa3-fwd is not installed")  # forced: no fallback
    assert isinstance(registry.backend("attention_fp8", "cudnn").call(centred=False), attention_fp8.CudnnFP8Attention)


@pytest.mark.parametrize("decision", [
    dsp.Decision("flash4", "measured", {"torch": 2.0, "triton": 1.5, "flash4": 0.9}, Flash4Config(128, 176)),
    dsp.Decision("triton", "measured", {"torch": 2.0, "triton": 1.5}, AttentionConfig(64, 64, 4)),
    dsp.Decision("quack", "measured", {"torch": 2.0, "quack": 1.5}, gemm.QuackConfig()),
    dsp.Decision(dsp.REGULAR, "measured", {dsp.REGULAR: 2.0, "flash4": 3.0}),
    dsp.Decision("torch", "measured", {"torch": 1.0}),
])
def test_decisions_round_trip_as_json(decision):
    record = json.loads(json.dumps(autotune.encode_decision(decision)))
    assert autotune.decode_decision(record, dsp._CONFIG_TYPES) == decision


def test_a_stored_decision_is_taken_by_a_fresh_dispatcher_without_timing_again(chain, tmp_path, monkeypatch):
    first = dsp.KernelDispatcher("auto", store=persist.DecisionStore(tmp_path, FINGERPRINT))
    measured = first.choose(OP, _on_cuda(4))
    chain.clear()
    fresh = dsp.KernelDispatcher("auto", store=persist.DecisionStore(tmp_path, FINGERPRINT))
    assert fresh.choose(OP, _on_cuda(4)) == measured and chain == []
    assert fresh.choose(OP, _on_cuda(5)).reason == "measured" and chain == ["torch", "triton"]  # another shape


def test_an_old_format_store_file_is_ignored(chain, tmp_path):
    # What the dispatcher wrote before the registry: a field per backend, under a key without the format.
    old = {"kind": "Decision", "path": "torch", "reason": "measured", "triton_ms": 2.0, "torch_ms": 1.0,
           "config": None, "flash4_ms": None, "flash4_config": None, "quack_ms": None, "quack_config": None}
    assert autotune.decode_decision(old) is None
    d = dsp.KernelDispatcher("auto", store=persist.DecisionStore(tmp_path, FINGERPRINT))
    key = (OP, "cuda:0", (2, 4))
    d.tuner.store.put(f"graph|{d.tuner.scope}|{key!r}", old)
    d.tuner.store.put(d.tuner._store_key(key), old)  # even under this format's key, an old record is not read
    fresh = dsp.KernelDispatcher("auto", store=persist.DecisionStore(tmp_path, FINGERPRINT))
    assert fresh.choose(OP, _on_cuda(4)).backend == "triton" and chain == ["torch", "triton"]  # measured, not "torch"
    # A file of the previous store version is another environment's: another name, and not read if copied over.
    assert persist.STORE_VERSION == 2
    previous = persist.DecisionStore(tmp_path, {**FINGERPRINT, "store_version": 1})
    assert previous.path != persist.DecisionStore(tmp_path, {**FINGERPRINT, "store_version": 2}).path


def test_the_kernel_package_reads_no_environment():
    # The engine hands the settings over (COSMOS3_KERNELS, COSMOS3_DISPATCH_TIMING, TRITON_INTERPRET).
    root = Path(dsp.__file__).parent
    for name in ("dispatch.py", "autotune.py", "registry.py"):
        assert "os.environ" not in (root / name).read_text(), name


LOADED: list[str] = []


def _load(name: str, why: str | None):
    def load():
        LOADED.append(name)
        return why

    return load


registry.register("test_loaded", "torch", supported=lambda x: None, call=_backend("torch", 1.0), reference=True)
registry.register("test_loaded", "lib_a", supported=lambda x: None, call=_backend("lib_a", 1.0), library=True,
                  load=_load("lib_a", None))
registry.register("test_loaded", "lib_b", supported=lambda x: None, call=_backend("lib_b", 1.0), library=True,
                  load=_load("lib_b", "lib_b is not installed"))


def test_load_libraries_imports_each_library_backend_once_and_says_which_loaded():
    LOADED.clear()
    said = registry.load_libraries()
    assert LOADED == ["lib_a", "lib_b"]  # the reference has no library to load
    assert said["test_loaded/lib_a"] is None and said["test_loaded/lib_b"] == "lib_b is not installed"
    # The engine's own library backends each have a load: the imports a restarted process pays at start-up.
    for op, name in (("prefix_attention", "flash4"), ("shared_gen_attention", "flash4"), ("mlp_in", "quack")):
        assert registry.backend(op, name).load is not None, (op, name)
        assert f"{op}/{name}" in said


def test_only_a_library_backend_may_have_a_load():
    with pytest.raises(ValueError, match="only a library backend"):
        registry.register("test_loaded", "kernel", supported=lambda x: None, call=_backend("kernel", 1.0),
                          load=_load("kernel", None))


def test_load_triton_key_computes_tritons_per_process_key_at_load():
    # Triton hashes its compiler and libtriton once per process, on its first disk-cache lookup; load_kernels pays
    # it at load. No GPU needed: the key is a hash of files.
    from triton.runtime.cache import triton_key

    triton_key.cache_clear()
    assert persist.load_triton_key() is None
    assert triton_key.cache_info().currsize == 1
