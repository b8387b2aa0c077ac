"""Dispatch within a memory budget, and its decisions kept across processes (cosmos3_kernels.persist).

No GPU: the timer is replaced by one that calls the candidate and returns the milliseconds it gives, and the device's
free memory is a number the test sets, so the autotuner measures as it does on the H200 (the registry's rule chain on
a stand-in CUDA tensor: tests/unit/kernels/test_kernels_dispatch_registry.py).
"""
from __future__ import annotations

import json
import pytest
import torch

from cosmos3_kernels import autotune, dispatch as dsp, persist, registry
from cosmos3_kernels.packed_kv import PackedKVLayout
from cosmos3_kernels.prefix_attention import AttentionConfig, Flash4Config
from cosmos3_kernels.timing import Timing

GIB = 2**30
FINGERPRINT = {"gpu": "NVIDIA H200", "driver": "580.159.04", "torch": "2.11.0", "triton": "3.6.0",
               "flash-attn-4": "4.0.0b36", "kernels_source": "abc"}
KEY = ("qk_norm_rope", "cuda:0", torch.bfloat16, (2, 44160, 64, 128), 8, "diffusers", True, False, False)


@pytest.fixture
def calls_candidates(monkeypatch):
    """time_ms calls the candidate once; the candidate returns its milliseconds. Returns the names that ran."""
    ran = []
    monkeypatch.setattr(autotune, "time_ms", lambda fn, **kw: Timing((fn(),)))
    return ran


def candidate(ran, name, ms, need_bytes):
    return dsp.sized(lambda: ran.append(name) or ms, need_bytes)


def test_a_candidate_over_the_memory_budget_is_skipped_never_run(calls_candidates):
    ran = calls_candidates

    def both():
        return {"torch": {None: candidate(ran, "torch", 1.0, 11 * GIB)}, "triton": {None: candidate(ran, "triton", 2.0, 0)}}

    d = dsp.KernelDispatcher("auto", free_memory=lambda: 4 * GIB)
    # The PyTorch reference of QK-norm+RoPE at Super 720p asked for more than the GPU had left: it must not run.
    decision = d.tuner.measure(both())
    assert ran == ["triton"]
    assert (decision.backend, decision.ms) == ("triton", {"triton": 2.0})
    assert "memory budget" in decision.reason
    # The same candidates with room for both: the faster (the reference here) wins, as before.
    ran.clear()
    roomy = dsp.KernelDispatcher("auto", free_memory=lambda: 64 * GIB)
    decision = roomy.tuner.measure(both())
    assert ran == ["torch", "triton"] and decision.backend == "torch" and decision.reason == "measured"


def test_where_no_candidate_fits_the_in_place_kernel_is_taken_unmeasured(calls_candidates):
    ran = calls_candidates
    d = dsp.KernelDispatcher("auto", free_memory=lambda: 0)
    config = AttentionConfig(block_m=64, block_n=64, num_warps=4)
    decision = d.tuner.measure({"torch": {None: candidate(ran, "torch", 1.0, 1)},
                                "triton": {config: candidate(ran, "triton", 1.0, 1)},
                                "flash4": {Flash4Config(): candidate(ran, "flash4", 1.0, 1)}},
                               tolerant=frozenset({"flash4"}), if_none_fits=("triton", config))
    assert ran == []
    assert (decision.backend, decision.reason, decision.config) == ("triton", dsp.NOT_MEASURED, config)
    # The dispatcher names its first kernel and that kernel's first config as the one taken (before any scratch).
    layout = PackedKVLayout((3, 5), 8)
    q, buf = torch.randn(2, 8, 4, 16, dtype=torch.bfloat16), torch.randn(2, layout.total_rows, 2, 16, dtype=torch.bfloat16)
    usable = [registry.backend("prefix_attention", "triton"), registry.backend("prefix_attention", "flash4")]
    decision = d._measure("prefix_attention", usable, (q, buf, layout), {"scale": None})
    assert (decision.backend, decision.reason, decision.config) == ("triton", dsp.NOT_MEASURED, d.attention_configs[0])


def test_a_candidate_that_runs_out_of_memory_anyway_is_left_out(calls_candidates):
    def oom():
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.70 GiB")

    d = dsp.KernelDispatcher("auto", free_memory=lambda: 64 * GIB)
    decision = d.tuner.measure({"torch": {None: dsp.sized(oom, GIB)},
                                "triton": {None: candidate(calls_candidates, "triton", 3.0, 0)}})
    assert decision.backend == "triton" and "torch" not in decision.ms


MEASURED = dsp.Decision("flash4", "measured", {"triton": 1.5, "torch": 2.0, "flash4": 0.9},
                        Flash4Config(128, 176, pack_gqa=False))


def test_measured_decisions_are_read_back_by_a_fresh_dispatcher(tmp_path):
    first = dsp.KernelDispatcher("auto", store=persist.DecisionStore(tmp_path, FINGERPRINT))
    assert first.tuner.remember(KEY, MEASURED) == MEASURED
    fresh = dsp.KernelDispatcher("auto", store=persist.DecisionStore(tmp_path, FINGERPRINT))
    assert fresh.tuner.cached(KEY) == MEASURED
    assert fresh.decisions()[KEY] == MEASURED
    # Another shape is not that decision: it is measured.
    assert fresh.tuner.cached(KEY[:3] + ((2, 12090, 64, 128),) + KEY[4:]) is None
    # Candidates timed another way (eager), or other candidates, are not that decision either.
    eager = dsp.KernelDispatcher("auto", timing="eager", store=persist.DecisionStore(tmp_path, FINGERPRINT))
    assert eager.tuner.cached(KEY) is None
    one_config = dsp.KernelDispatcher("auto", flash4_configs=(Flash4Config(),),
                                      store=persist.DecisionStore(tmp_path, FINGERPRINT))
    assert one_config.tuner.cached(KEY) is None


@pytest.mark.parametrize("changed", ["gpu", "driver", "triton", "flash-attn-4", "kernels_source", "COSMOS3_FLASH4",
                                     "store_version"])
def test_decisions_of_another_environment_are_ignored(tmp_path, changed):
    dsp.KernelDispatcher("auto", store=persist.DecisionStore(tmp_path, FINGERPRINT)).tuner.remember(KEY, MEASURED)
    elsewhere = persist.DecisionStore(tmp_path, {**FINGERPRINT, changed: "other"})
    assert len(elsewhere) == 0
    assert dsp.KernelDispatcher("auto", store=elsewhere).tuner.cached(KEY) is None
    # A file under this environment's name whose recorded fingerprint differs (copied from elsewhere) is ignored too.
    mine = persist.DecisionStore(tmp_path, FINGERPRINT)
    data = json.loads(mine.path.read_text())
    data["fingerprint"][changed] = "other"
    mine.path.write_text(json.dumps(data))
    assert len(persist.DecisionStore(tmp_path, FINGERPRINT)) == 0


def test_only_measured_decisions_are_stored_and_two_stores_on_one_file_keep_both(tmp_path):
    a = dsp.KernelDispatcher("auto", store=persist.DecisionStore(tmp_path, FINGERPRINT))
    b = dsp.KernelDispatcher("auto", store=persist.DecisionStore(tmp_path, FINGERPRINT))  # a second loaded model
    unmeasured = dsp.KernelDispatcher("auto", store=persist.DecisionStore(tmp_path, FINGERPRINT))
    unmeasured.tuner.remember(KEY, dsp.Decision("triton", dsp.NOT_MEASURED))
    unmeasured.tuner.remember(KEY, dsp.Decision("triton", "measured, some candidates over the memory budget"))
    assert len(persist.DecisionStore(tmp_path, FINGERPRINT)) == 0
    other = KEY[:3] + ((2, 1024, 64, 128),) + KEY[4:]
    a.tuner.remember(KEY, dsp.Decision("triton", "measured", {"triton": 1.0}))
    b.tuner.remember(other, dsp.Decision("torch", "measured", {"torch": 1.0}))
    assert len(persist.DecisionStore(tmp_path, FINGERPRINT)) == 2


def test_the_cache_folder_and_the_compilers_caches(tmp_path, monkeypatch):
    from engine.config import build_config  # the folder is the engine's to choose; the kernels take it

    def cache_dir(environ):
        return build_config(environ).kernel_cache_dir()

    assert cache_dir({persist.CACHE_ENV: str(tmp_path)}) == tmp_path
    assert cache_dir({persist.CACHE_ENV: "off"}) is None
    assert cache_dir({"COSMOS3_STUDIO_CACHE": str(tmp_path)}) == tmp_path / "kernels"
    # On a Space: under HF_HOME, the folder its persistent storage keeps.
    assert cache_dir({"SPACE_ID": "org/app", "HF_HOME": "/data/hf"}) == persist.Path("/data/hf/cosmos3-studio/kernels")
    environ = {"TRITON_CACHE_DIR": "/mine"}
    done = persist.configure_compiler_caches(tmp_path, environ)
    assert environ["TRITON_CACHE_DIR"] == "/mine" and "TRITON_CACHE_DIR" not in done  # a variable set is kept
    assert environ["FLASH_ATTENTION_CUTE_DSL_CACHE_DIR"] == str(tmp_path / "flash4")
    assert environ["CUTE_DSL_CACHE_DIR"] == str(tmp_path / "cute_dsl")
    assert persist.configure_compiler_caches(None, environ) == {}


def test_the_fingerprint_names_the_environment_a_decision_depends_on():
    fingerprint = persist.environment_fingerprint()
    for field in ("torch", "cuda", "kernels_source", "gpu", "triton", "flash-attn-4", "quack-kernels",
                  "COSMOS3_FLASH4", "COSMOS3_QUACK"):
        assert field in fingerprint
    assert fingerprint["kernels_source"] == persist.kernels_source_hash()
