"""The first layer's attention with its gen block shared by the branches (cosmos3_kernels.shared_gen_attention).

On the CPU: the reference against one fp32 attention per branch over the same keys, the Triton combine under the
interpreter against its reference, and what the op must refuse. On a GPU with flash-attn-4: its parts and the
whole op against fp32 attention at a video's shape.
"""
import pytest
import torch

from cosmos3_kernels import prefix_attention as pa, shared_gen_attention as sga
from cosmos3_kernels.packed_kv import DeviceLengths, PackedKVLayout
from attention_fp32 import sdpa_per_branch_fp32

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _rel_err(out, ref):
    return ((out.float() - ref.float()).norm() / ref.float().norm()).item()


def _shared_inputs(prefixes, n, hq, hkv, d, dtype, *, seed=0, gen_differs=False):
    """q and a packed buffer whose branches hold the same gen queries, keys and values (as the tower's first
    layer has them), each with its own prefix; `gen_differs`: branch 1's gen keys are other values."""
    g = torch.Generator().manual_seed(seed)
    layout = PackedKVLayout(prefixes, n)
    q_gen = torch.randn(n, hq, d, generator=g)
    q = q_gen.expand(len(prefixes), n, hq, d).clone()
    buf = torch.randn(2, layout.total_rows, hkv, d, generator=g)
    gen0 = layout.gen_offset(0)
    for b in range(1, len(prefixes)):
        gen = layout.gen_offset(b)
        buf[:, gen:gen + n] = buf[:, gen0:gen0 + n]
        if gen_differs:
            buf[0, gen:gen + n] = torch.randn(n, hkv, d, generator=g)
    return layout, q.to(DEVICE, dtype), buf.to(DEVICE, dtype)


@pytest.mark.parametrize("prefixes,n,hq,hkv", [((7, 3), 12, 4, 2), ((0, 5), 9, 2, 1), ((4, 11, 2), 6, 4, 4)])
def test_reference_equals_attention_over_each_branch_when_the_gen_block_is_shared(prefixes, n, hq, hkv):
    layout, q, buf = _shared_inputs(prefixes, n, hq, hkv, 16, torch.float32)
    out = sga.shared_gen_attention_reference(q.cpu(), buf.cpu(), layout)
    torch.testing.assert_close(out, sdpa_per_branch_fp32(q.cpu(), buf.cpu(), layout), atol=2e-6, rtol=2e-5)


def test_reference_reads_the_gen_block_of_the_source_branch_only():
    # What the op rests on, shown by breaking it: with branch 1's gen keys changed, branch 1's shared result is
    # still branch 0's gen block joined with its own prefix, so it is not branch 1's own attention.
    layout, q, buf = _shared_inputs((5, 3), 10, 2, 1, 16, torch.float32, gen_differs=True)
    q, buf = q.cpu(), buf.cpu()
    shared = sga.shared_gen_attention_reference(q, buf, layout)
    own = sdpa_per_branch_fp32(q, buf, layout)
    torch.testing.assert_close(shared[0], own[0], atol=2e-6, rtol=2e-5)
    assert _rel_err(shared[1], own[1]) > 1e-2
    fixed = buf.clone()
    g0, g1 = layout.gen_offset(0), layout.gen_offset(1)
    fixed[:, g1:g1 + 10] = buf[:, g0:g0 + 10]
    torch.testing.assert_close(shared[1], sdpa_per_branch_fp32(q, fixed, layout)[1], atol=2e-6, rtol=2e-5)


def test_empty_prefix_takes_no_weight():
    layout, q, buf = _shared_inputs((0, 0), 8, 2, 2, 16, torch.float32)
    o_parts, lse_parts = sga.partials_reference(q.cpu(), buf.cpu(), layout)
    assert torch.isneginf(lse_parts[1:]).all() and not o_parts[1:].any()
    out = sga.combine_reference(o_parts, lse_parts)
    torch.testing.assert_close(out, o_parts[0].expand_as(out), atol=0, rtol=0)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_triton_combine_matches_its_reference(dtype):
    g = torch.Generator().manual_seed(3)
    branches, n, hq, d = 2, 70, 3, 32  # rows not a multiple of the block
    o_parts = torch.randn(1 + branches, n, hq, d, generator=g).to(DEVICE, dtype)
    lse_parts = (torch.randn(1 + branches, hq, n, generator=g) * 4).to(DEVICE)
    lse_parts[2, 0] = float("-inf")  # one head of branch 1 with an empty prefix
    out = torch.full((branches, n, hq, d), float("nan"), dtype=dtype, device=DEVICE)
    sga.combine(o_parts, lse_parts, out, block_m=32)
    ref = sga.combine_reference(o_parts, lse_parts)
    assert not out.isnan().any()
    torch.testing.assert_close(out.float(), ref.float(), atol=1e-5 if dtype == torch.float32 else 8e-3,
                               rtol=1e-5 if dtype == torch.float32 else 8e-3)
    # The weights are those of the softmax over both parts: a part with a far larger lse takes all of it.
    lse_parts[0] += 80.0
    torch.testing.assert_close(sga.combine(o_parts, lse_parts).float(), o_parts[0].float().expand(branches, n, hq, d),
                               atol=1e-6, rtol=0)


def test_rejects_what_it_cannot_share():
    layout, q, buf = _shared_inputs((3, 4), 6, 2, 1, 16, torch.float32)
    one = PackedKVLayout((3,), 6)
    with pytest.raises(ValueError, match="two or more branches, got 1"):
        sga.check_shared_inputs(q[:1], buf[:, : one.total_rows], one)
    with pytest.raises(ValueError, match="source must be a branch in \\[0, 2\\), got 2"):
        sga.check_shared_inputs(q, buf, layout, source=2)
    on_device = PackedKVLayout((3, 4), 6)
    on_device = PackedKVLayout((3, 4), 6, lengths=DeviceLengths(on_device, "cpu"))
    with pytest.raises(ValueError, match="lengths on the device"):
        sga.check_shared_inputs(q, buf, on_device)
    with pytest.raises(ValueError, match="lse_parts must be float32"):
        sga.combine(torch.zeros(3, 6, 2, 16), torch.zeros(3, 2, 6, dtype=torch.float64))


# --------------------------------------------------------------------------------------------------
# The GPU: flash-attn-4's parts
# --------------------------------------------------------------------------------------------------
def _flash4_or_skip():
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    why = sga.shared_unsupported(torch.empty(1, 1, 1, 128, device="cuda", dtype=torch.bfloat16))
    if why is not None:
        pytest.skip(why)


@pytest.mark.parametrize("config", pa.DEFAULT_FLASH4_CONFIGS, ids=lambda c: c.label)
def test_flash4_parts_match_the_reference(config):
    _flash4_or_skip()
    layout, q, buf = _shared_inputs((301, 59), 1000, 8, 2, 128, torch.bfloat16)
    o_parts, lse_parts = sga.partials_flash4(q, buf, layout, config=config)
    ref_o, ref_lse = sga.partials_reference(q, buf, layout)
    torch.testing.assert_close(lse_parts, ref_lse, atol=1e-3, rtol=1e-4)
    assert _rel_err(o_parts, ref_o) <= 1e-2


@pytest.mark.parametrize("prefixes", [(1606, 59), (0, 59)])
def test_flash4_shared_attention_is_as_close_to_fp32_as_one_call_per_branch(prefixes):
    # A video's first layer at Edge's heads: the shared op's error against fp32 attention stays within 1.5x that of
    # the attention the engine runs at every other layer (its one extra rounding is of the partial outputs).
    _flash4_or_skip()
    layout, q, buf = _shared_inputs(prefixes, 8192, 16, 8, 128, torch.bfloat16, seed=1)
    ref = sdpa_per_branch_fp32(q[:, :512], buf, PackedKVLayout(prefixes, 8192))  # the first 512 queries: fp32 fits
    shared = sga.shared_gen_attention_flash4(q, buf, layout)
    regular = pa.prefix_attention_flash4(q, buf, layout, config=pa.DEFAULT_FLASH4_CONFIGS[-1])
    shared_err, regular_err = _rel_err(shared[:, :512], ref), _rel_err(regular[:, :512], ref)
    assert shared_err <= 1.5 * regular_err, (shared_err, regular_err)


def test_parts_need_the_library_entry_that_takes_an_lse_buffer(monkeypatch):
    # Only `_flash_attn_fwd` writes the log-sum-exp into our buffer; with the public function alone the shared op
    # must say so rather than call it.
    monkeypatch.setattr(pa, "_flash4_entry", lambda: (lambda *a, **k: None, False, None))
    assert pa.flash4_forward() is None
    monkeypatch.setattr(pa, "flash4_unsupported", lambda q: None)
    probe = torch.empty(1, 1, 1, 128, dtype=torch.bfloat16)
    assert "_flash_attn_fwd" in sga.shared_unsupported(probe)
    monkeypatch.setattr(pa, "_flash4_entry", lambda: (print, True, None))
    assert pa.flash4_forward() is print and sga.shared_unsupported(probe) is None
    assert "dtype torch.float32" in sga.shared_unsupported(probe.float())
