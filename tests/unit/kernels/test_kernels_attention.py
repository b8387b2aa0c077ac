"""Prefix attention (varlen CFG branches, GQA) against SDPA per branch in fp32."""
import sys
import types
from dataclasses import replace

import pytest
import torch

from cosmos3_kernels import prefix_attention as pa
from cosmos3_kernels import settings
from cosmos3_kernels.dispatch import DEFAULT_ATTENTION_CONFIGS
from cosmos3_kernels.packed_kv import PackedKVLayout
from attention_fp32 import sdpa_per_branch_fp32
from broken_install import assert_repair_warning, broken_install

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

# bf16 P and output rounding give ~3e-3 (5e-3 under the interpreter, whose bf16 cast truncates).
REL_TOL = {torch.bfloat16: 1e-2, torch.float16: 2e-3}
SMALL = pa.AttentionConfig(block_m=16, block_n=16, num_warps=4, num_stages=2)


def _rel_err(out, ref):
    return ((out.float() - ref.float()).norm() / ref.float().norm()).item()


def _inputs(prefixes, n, hq, hkv, d, dtype):
    layout = PackedKVLayout(prefixes, n)
    q = torch.randn(len(prefixes), n, hq, d, dtype=dtype, device=DEVICE)
    buf = torch.randn(2, layout.total_rows, hkv, d, dtype=dtype, device=DEVICE)
    return layout, q, buf


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("use_tma", [False, True])
@pytest.mark.parametrize(
    "prefixes,n,hq,hkv,d",
    [
        ((5, 19), 20, 4, 2, 16),  # CFG: two branches with different prefixes, GQA 2:1, partial blocks
        ((0,), 33, 2, 1, 32),  # no prefix, MQA, gen length not a multiple of the block
        ((40, 3, 17), 7, 2, 2, 16),  # three branches, MHA, kv runs longer and shorter than a tile
    ],
)
def test_matches_sdpa_per_branch(dtype, use_tma, prefixes, n, hq, hkv, d):
    layout, q, buf = _inputs(prefixes, n, hq, hkv, d, dtype)
    out = torch.full_like(q, float("nan"))  # poisoned: every element must be written
    pa.prefix_attention(q, buf, layout, out=out, config=pa.AttentionConfig(16, 16, 4, 2, use_tma))
    ref = sdpa_per_branch_fp32(q, buf, layout)
    assert not out.isnan().any()
    assert _rel_err(out, ref) <= REL_TOL[dtype]


def test_reference_path_matches_independent_sdpa():
    for prefixes in ((3, 9), (6, 6)):  # per-branch calls, and the one batched call of equal prefixes
        layout, q, buf = _inputs(prefixes, 5, 4, 2, 16, torch.float32)
        ref = pa.prefix_attention_reference(q, buf, layout)
        torch.testing.assert_close(ref, sdpa_per_branch_fp32(q, buf, layout), atol=1e-5, rtol=1e-5)


def test_branch_rows_do_not_leak_into_each_other():
    """Huge keys in branch 1 would swamp branch 0's softmax if its tail tile read them unmasked."""
    layout, q, buf = _inputs((3, 5), 10, 2, 1, 16, torch.bfloat16)
    start1 = layout.branch_start(1)
    buf[0, start1:] *= 60.0
    for tma in (False, True):
        out = pa.prefix_attention(q, buf, layout, config=pa.AttentionConfig(16, 16, 4, 2, tma))
        assert _rel_err(out, sdpa_per_branch_fp32(q, buf, layout)) <= REL_TOL[torch.bfloat16]


def test_rejects_bad_inputs():
    layout, q, buf = _inputs((2, 4), 6, 3, 2, 16, torch.bfloat16)
    with pytest.raises(ValueError, match="multiple"):
        pa.prefix_attention(q, buf, layout)
    layout, q, buf = _inputs((2,), 6, 2, 2, 16, torch.float32)
    with pytest.raises(ValueError, match="bf16 or fp16"):
        pa.prefix_attention(q, buf, layout)
    with pytest.raises(ValueError, match="kv_buffer must be"):
        pa.prefix_attention(q.bfloat16(), buf.bfloat16(), PackedKVLayout((3,), 6))


# ------------------------------------------------------------------------------------------------
# GPU: real head dims and lengths, fresh random inputs every run
# ------------------------------------------------------------------------------------------------
@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("hq", [32, 16])
@pytest.mark.parametrize(
    "config",
    [*DEFAULT_ATTENTION_CONFIGS, pa.AttentionConfig(block_m=128, block_n=64, num_warps=4, use_tma=False)],
    ids=["dispatch0", "dispatch1", "pointers"],
)
def test_gpu_t2i_cfg_shape_bf16(hq, config):
    layout, q, buf = _inputs((1615, 2866), 1024, hq, 8, 128, torch.bfloat16)
    out = torch.full_like(q, float("nan"))
    pa.prefix_attention(q, buf, layout, out=out, config=config)
    ref = sdpa_per_branch_fp32(q, buf, layout)
    assert not out.isnan().any()
    assert _rel_err(out, ref) <= 1e-2


@pytest.mark.gpu
@gpu
def test_gpu_long_video_branch_bf16():
    layout, q, buf = _inputs((1615,), 12090, 32, 8, 128, torch.bfloat16)
    out = torch.full_like(q, float("nan"))
    pa.prefix_attention(q, buf, layout, out=out)
    ref = pa.prefix_attention_reference(q.float(), buf.float(), layout)
    assert not out.isnan().any()
    assert _rel_err(out, ref) <= 1e-2


# ------------------------------------------------------------------------------------------------
# flash-attn-4 (optional library kernel): same op, same bound; runs where it is installed on SM90+
# ------------------------------------------------------------------------------------------------
# Asked once: the answer imports flash-attn-4 on a GPU machine.
FLASH4_MISSING = (
    pa.flash4_unsupported(torch.empty(1, 1, 1, 128, dtype=torch.bfloat16, device="cuda"))
    if torch.cuda.is_available() else "needs CUDA"
)


def test_flash4_is_refused_with_the_reason_on_cpu():
    layout = PackedKVLayout((5, 9), 16)
    q = torch.randn(2, 16, 4, 32, dtype=torch.bfloat16)
    buf = torch.randn(2, layout.total_rows, 2, 32, dtype=torch.bfloat16)
    assert "needs CUDA" in pa.flash4_unsupported(q)
    with pytest.raises(ValueError, match="flash-attn-4 cannot run this call: device cpu"):
        pa.prefix_attention_flash4(q, buf, layout)


def test_the_start_up_advice_names_flash4_only_where_it_would_help_and_is_missing(monkeypatch):
    def gpu(major, installed):
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (major, 0))
        monkeypatch.setattr(pa, "installed", lambda name: installed and name == "flash-attn-4")

    monkeypatch.setattr(settings, "_current", replace(settings.current(), flash4=True))
    gpu(9, installed=False)
    advice = pa.flash4_advice()
    assert "flash-attn-4 is not installed" in advice and "9.0" in advice
    assert "pip install -r requirements-gpu.txt" in advice and pa.FLASH4_ENV_VAR in advice
    gpu(9, installed=True)
    assert pa.flash4_advice() is None
    gpu(8, installed=False)  # an Ampere GPU: flash-attn-4's kernel does not run there
    assert pa.flash4_advice() is None
    gpu(9, installed=False)
    monkeypatch.setattr(settings, "_current", replace(settings.current(), flash4=False))  # left out on purpose
    assert pa.flash4_advice() is None
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(settings, "_current", replace(settings.current(), flash4=True))
    assert pa.flash4_advice() is None
    monkeypatch.undo()
    assert pa.installed("torch") and not pa.installed("no-such-distribution-here")


def test_flash4_config_knobs_become_the_library_arguments():
    assert pa.flash4_call_kwargs(None) == pa.flash4_call_kwargs(pa.Flash4Config()) == {}
    assert pa.flash4_call_kwargs(pa.Flash4Config(128, 176, pack_gqa=False)) == {"tile_mn": (128, 176), "pack_gqa": False}
    assert pa.flash4_call_kwargs(pa.Flash4Config(mma_pv_is_rs=False, intra_wg_overlap=True)) == {
        "mma_pv_is_rs": False, "intra_wg_overlap": True}
    assert pa.Flash4Config(128, 176, pack_gqa=False).label == "128x176 pack_gqa=False"
    assert pa.Flash4Config().label == "lib"


@pytest.mark.parametrize("tile,why", [((128, None), "set together"), ((128, 170), "multiple of 16"),
                                      ((96, 128), "tile_m in"), ((128, 272), r"\[16, 256\]")])
def test_flash4_config_refuses_a_tile_the_kernel_cannot_take(tile, why):
    with pytest.raises(ValueError, match=why) as err:
        pa.Flash4Config(*tile)
    assert str(tile[0]) in str(err.value)


@pytest.mark.parametrize("preset", [None, "0", "1"])
def test_flash4s_disk_cache_is_on_unless_set(monkeypatch, preset):
    """Set at start-up, before anything imports the library (`engine.config.apply_process_environment`), unless
    set already or flash-attn-4 is switched off."""
    from engine.config import apply_process_environment, build_config

    monkeypatch.setattr(settings, "_current", settings.current())  # restored after: the start-up call sets it
    for flash4, expected in (("1", preset or "1"), ("0", preset)):
        environ = {} if preset is None else {pa.FLASH4_CACHE_ENV_VAR: preset}
        apply_process_environment(build_config({"COSMOS3_FLASH4": flash4, "COSMOS3_KERNEL_CACHE": "off"}), environ)
        assert environ.get(pa.FLASH4_CACHE_ENV_VAR) == expected


class FakeFlash4:
    """flash-attn-4's private forward as far as the wrapper uses it: checks a given `out` as the library
    does (shape, dtype), writes the reference result into it, or returns a new tensor."""

    def __init__(self):
        self.kwargs = None

    def __call__(self, q, k, v, *, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal,
                 out=None, **knobs):
        self.kwargs = dict(knobs, out=out)
        result = torch.zeros_like(q) + 1  # the values do not matter here, only where they go
        if out is None:
            return result, None
        assert out.shape == q.shape and out.dtype == q.dtype, "out shape/dtype != expected"  # as the library
        out.copy_(result)
        return out, None


@pytest.fixture
def fake_flash4(monkeypatch):
    fake = FakeFlash4()
    monkeypatch.setattr(pa, "flash4_unsupported", lambda q: None)
    monkeypatch.setattr(pa, "_flash4_entry", lambda: (fake, True, None))
    return fake


def test_flash4_writes_straight_into_an_out_of_q_s_dtype_and_copies_into_any_other(fake_flash4):
    layout, q, buf = _inputs((3, 5), 8, 4, 2, 16, torch.bfloat16)
    out = torch.zeros_like(q)
    assert pa.prefix_attention_flash4(q, buf, layout, out=out) is out and (out == 1).all()
    assert fake_flash4.kwargs["out"] is not None and fake_flash4.kwargs["out"].data_ptr() == out.data_ptr()
    wide = torch.zeros(q.shape, dtype=torch.float32)  # the library refuses it: the wrapper copies instead
    assert pa.prefix_attention_flash4(q, buf, layout, out=wide) is wide and (wide == 1).all()
    assert fake_flash4.kwargs["out"] is None
    config = pa.Flash4Config(192, 128, pack_gqa=False, mma_pv_is_rs=False, sm=9)
    pa.prefix_attention_flash4(q, buf, layout, config=config)
    assert fake_flash4.kwargs == {"tile_mn": (192, 128), "pack_gqa": False, "mma_pv_is_rs": False, "out": None}


def test_a_flash4_config_with_knobs_is_refused_by_name_where_the_library_cannot_take_them(fake_flash4, monkeypatch):
    monkeypatch.setattr(pa, "_flash4_entry", lambda: (fake_flash4, False, None))
    layout, q, buf = _inputs((3, 5), 8, 4, 2, 16, torch.bfloat16)
    with pytest.raises(ValueError, match="config 192x128 pack_gqa=False needs the library's _flash_attn_fwd"):
        pa.prefix_attention_flash4(q, buf, layout, config=pa.Flash4Config(192, 128, pack_gqa=False))


def test_cu_seqlens_are_the_packed_rows():
    layout = PackedKVLayout((5, 9, 0), 16)
    cu_q, cu_k = layout.cu_seqlens("cpu")
    assert cu_q.tolist() == [0, 16, 32, 48]
    assert cu_k.tolist() == [layout.branch_start(b) for b in range(4)] == [0, 21, 46, 62]
    assert cu_q.dtype == cu_k.dtype == torch.int32
    assert layout.max_kv_len == 9 + 16 == max(layout.kv_len(b) for b in range(3))  # flash-attn-4's max_seqlen_k
    assert layout.cu_seqlens("cpu")[0] is cu_q  # cached: no host-to-device copy per layer and step


@pytest.mark.gpu
@pytest.mark.skipif(FLASH4_MISSING is not None, reason=f"flash-attn-4: {FLASH4_MISSING}")
def test_gpu_flash4_into_a_strided_out_and_with_no_out():
    layout, q, buf = _inputs((1615, 2866), 1024, 32, 8, 128, torch.bfloat16)
    direct = pa.prefix_attention_flash4(q, buf, layout)
    wide = torch.full((*q.shape[:3], 2 * q.shape[3]), float("nan"), dtype=q.dtype, device=q.device)
    strided = wide[..., : q.shape[3]]  # not contiguous: the library's output is copied in
    assert pa.prefix_attention_flash4(q, buf, layout, out=strided) is strided
    assert torch.equal(strided, direct)
    assert wide[..., q.shape[3]:].isnan().all()


@pytest.mark.gpu
@pytest.mark.skipif(FLASH4_MISSING is not None, reason=f"flash-attn-4: {FLASH4_MISSING}")
@pytest.mark.parametrize("config", pa.DEFAULT_FLASH4_CONFIGS, ids=lambda c: c.label)
@pytest.mark.parametrize("hq", [32, 16])
@pytest.mark.parametrize("prefixes,n", [((1615, 2866), 1024), ((1615, 2866), 4096), ((1615,), 12090)])
def test_gpu_flash4_matches_fp32_per_branch(hq, prefixes, n, config):
    layout, q, buf = _inputs(prefixes, n, hq, 8, 128, torch.bfloat16)
    out = torch.full_like(q, float("nan"))
    assert pa.prefix_attention_flash4(q, buf, layout, out=out, config=config) is out
    ref = sdpa_per_branch_fp32(q, buf, layout) if n <= 4096 else pa.prefix_attention_reference(q.float(), buf.float(), layout)
    assert not out.isnan().any()
    assert _rel_err(out, ref) <= 1e-2


@pytest.mark.parametrize("imported_before", [False, True], ids=["fresh", "imported before"])
@pytest.mark.parametrize("is_installed", [True, False])
def test_an_installed_flash4_that_does_not_import_is_logged_once_with_its_error_and_the_fix(is_installed, imported_before,
                                                                                           monkeypatch, caplog):
    """As on an H200 host whose CuTe DSL lacked one of its three wheels: the engine still serves (dispatch leaves
    flash-attn-4 out, with the import error as the reason), and the log says why it is slower and how to repair it.
    Absent on purpose, nothing is logged (the start-up advice covers that). `imported before`: the library's
    modules are already loaded, as after the GPU tests that ran it (the staging must still make it fail)."""
    monkeypatch.setattr(settings, "_current", replace(settings.current(), flash4=True))
    if imported_before:
        package, cute = types.ModuleType("flash_attn"), types.ModuleType("flash_attn.cute")
        cute.flash_attn_varlen_func = lambda *args, **kwargs: None
        package.cute = cute
        monkeypatch.setitem(sys.modules, "flash_attn", package)
        monkeypatch.setitem(sys.modules, "flash_attn.cute", cute)
    with broken_install(monkeypatch, caplog, "flash_attn", pa.FLASH4_DISTRIBUTION, is_installed,
                        pa._flash4_entry) as messages:
        fn, takes_knobs, why = pa._flash4_entry()
        pa._flash4_entry()
    assert fn is None and not takes_knobs and why.startswith("flash-attn-4 not importable (ModuleNotFoundError")
    assert_repair_warning(messages, pa.FLASH4_DISTRIBUTION, is_installed, "cuDNN's SDPA")
