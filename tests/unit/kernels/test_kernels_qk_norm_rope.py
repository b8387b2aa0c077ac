"""Fused QK-norm + RoPE + K/V pack against the split PyTorch path.

On a CPU the kernel runs under the Triton interpreter on tiny grids. PyTorch's CPU ``mean`` adds in its
own order, so CPU bit-exactness is checked against the reference with the kernel's emulated reduction
order; on the GPU it is checked against plain diffusers ops (``torch.equal``).
"""
import pytest
import torch
import triton
import triton.language as tl

from cosmos3_kernels import qk_norm_rope as m
from cosmos3_kernels.packed_kv import PackedKVLayout

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

# One bf16/fp16 rounding step; fp32 differs only where the GPU contracts a*b+c into one FMA.
TOL = {
    torch.bfloat16: dict(atol=2e-2, rtol=2**-7),
    torch.float16: dict(atol=2e-3, rtol=2**-10),
    torch.float32: dict(atol=1e-5, rtol=1e-5),
}


def _rope_tables(n: int, d: int, dtype, batch: int | None = None, theta: float = 1e4):
    """Rotary cos/sin with the NeoX duplicated-halves layout; per-branch positions when batch is set."""
    pos = torch.arange(n, dtype=torch.float32)
    if batch is not None:
        pos = pos[None, :] + 100.0 * torch.arange(batch, dtype=torch.float32)[:, None]
    inv = 1.0 / theta ** (torch.arange(0, d, 2, dtype=torch.float32) / d)
    ang = pos[..., None] * inv
    ang = torch.cat([ang, ang], dim=-1)
    return ang.cos().to(dtype).to(DEVICE), ang.sin().to(dtype).to(DEVICE)


def _case(batch=2, n=8, hq=4, hkv=2, d=16, dtype=torch.bfloat16, prefixes=(5, 3), weight_dtype=None):
    layout = PackedKVLayout(prefixes, n)
    q = torch.randn(batch, n, hq, d, dtype=dtype, device=DEVICE) * 3
    k = torch.randn(batch, n, hkv, d, dtype=dtype, device=DEVICE) * 3
    v = torch.randn(batch, n, hkv, d, dtype=dtype, device=DEVICE)
    wd = weight_dtype or dtype
    qw = (1 + 0.2 * torch.randn(d)).to(wd).to(DEVICE)
    kw = (1 + 0.2 * torch.randn(d)).to(wd).to(DEVICE)
    cos, sin = _rope_tables(n, d, dtype)
    return layout, q, k, v, qw, kw, cos, sin


def _poisoned_buffer(layout, hkv, d, dtype):
    """Prefix rows hold a sentinel (must survive), gen rows NaN (must all be written)."""
    buf = layout.allocate(hkv, d, dtype=dtype, device=DEVICE).fill_(float("nan"))
    for b in range(layout.num_branches):
        k_b, v_b = layout.branch_kv(buf, b)
        k_b[: layout.prefix_lens[b]] = 7.0
        v_b[: layout.prefix_lens[b]] = -7.0
    return buf


def _gen_rows(buf, layout):
    return torch.stack([layout.branch_kv(buf, b)[0][layout.prefix_lens[b]:] for b in range(layout.num_branches)]), \
        torch.stack([layout.branch_kv(buf, b)[1][layout.prefix_lens[b]:] for b in range(layout.num_branches)])


def _assert_prefix_untouched(buf, layout):
    for b in range(layout.num_branches):
        k_b, v_b = layout.branch_kv(buf, b)
        assert torch.all(k_b[: layout.prefix_lens[b]] == 7.0)
        assert torch.all(v_b[: layout.prefix_lens[b]] == -7.0)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("flavour", ["diffusers", "nemotron"])
@pytest.mark.parametrize("d", [16, 128])
def test_rounded_kernel_is_bit_exact_with_split_path(dtype, flavour, d):
    layout, q, k, v, qw, kw, cos, sin = _case(d=d, dtype=dtype)
    order = m.DEFAULT_REDUCE_ORDER
    buf = _poisoned_buffer(layout, 2, d, dtype)
    q_out = torch.full_like(q, float("nan"))
    m.qk_norm_rope_pack(q, k, v, qw, kw, cos, sin, buf, layout, eps=1e-6, flavour=flavour,
                        round_norm_before_rope=True, q_out=q_out, reduce_order=order)
    ref_buf = buf.clone()
    q_ref = m.qk_norm_rope_pack_reference(q, k, v, qw, kw, cos, sin, ref_buf, layout, eps=1e-6,
                                          flavour=flavour, reduce_order=order)
    assert torch.equal(q_out, q_ref)
    assert torch.equal(buf, ref_buf)  # gen rows equal; prefix rows are the same sentinels
    _assert_prefix_untouched(buf, layout)


@pytest.mark.parametrize("order", list(m.ReduceOrder))
def test_every_reduction_order_is_reproduced(order):
    layout, q, k, v, qw, kw, cos, sin = _case(d=128, hq=2, hkv=1, batch=1, prefixes=(3,))
    buf = layout.allocate(1, 128, dtype=q.dtype, device=DEVICE)
    ref_buf = buf.clone()
    out = m.qk_norm_rope_pack(q, k, v, qw, kw, cos, sin, buf, layout, eps=1e-6,
                              round_norm_before_rope=True, reduce_order=order)
    ref = m.qk_norm_rope_pack_reference(q, k, v, qw, kw, cos, sin, ref_buf, layout, eps=1e-6, reduce_order=order)
    assert torch.equal(out, ref)
    assert torch.equal(buf[:, 3:], ref_buf[:, 3:])


def test_reduction_orders_differ_on_wide_range_data():
    """The probe can only tell orders apart if they give different sums: check they do."""
    gen = torch.Generator().manual_seed(0)
    x = (torch.randn(256, 128, generator=gen) * torch.exp2(torch.randint(-6, 7, (256, 128), generator=gen).float()))
    sums = [m.sum_of_squares_emulated(x.to(torch.bfloat16), o) for o in m.ReduceOrder]
    for i in range(len(sums)):
        for j in range(i + 1, len(sums)):
            assert not torch.equal(sums[i], sums[j])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("flavour", ["diffusers", "nemotron"])
def test_unrounded_kernel_matches_fp32_math(dtype, flavour):
    layout, q, k, v, qw, kw, cos, sin = _case(d=32, dtype=dtype, n=9, prefixes=(4, 0))
    buf = _poisoned_buffer(layout, 2, 32, dtype)
    q_out = m.qk_norm_rope_pack(q, k, v, qw, kw, cos, sin, buf, layout, eps=1e-5, flavour=flavour)
    # The same function computed in fp32 end to end, rounded once.
    f32 = [t.float() for t in (q, k, v, qw, kw, cos, sin)]
    ref_buf = buf.float().clone()
    q_ref = m.qk_norm_rope_pack_reference(*f32, ref_buf, layout, eps=1e-5, flavour=flavour)
    torch.testing.assert_close(q_out.float(), q_ref.to(dtype).float(), **TOL[dtype])
    k_gen, v_gen = _gen_rows(buf, layout)
    k_ref, v_ref = _gen_rows(ref_buf, layout)
    torch.testing.assert_close(k_gen.float(), k_ref.to(dtype).float(), **TOL[dtype])
    assert torch.equal(v_gen, v)
    _assert_prefix_untouched(buf, layout)


def test_in_place_q_and_strided_views_of_a_fused_projection():
    batch, n, hq, hkv, d = 2, 8, 4, 2, 16
    layout = PackedKVLayout((2, 6), n)
    qkv = torch.randn(batch, n, (hq + 2 * hkv) * d, dtype=torch.bfloat16, device=DEVICE)
    q = qkv[..., : hq * d].unflatten(-1, (hq, d))
    k = qkv[..., hq * d : (hq + hkv) * d].unflatten(-1, (hkv, d))
    v = qkv[..., (hq + hkv) * d :].unflatten(-1, (hkv, d))
    qw = torch.randn(d, dtype=torch.bfloat16, device=DEVICE)
    kw = torch.randn(d, dtype=torch.bfloat16, device=DEVICE)
    cos, sin = _rope_tables(n, d, torch.bfloat16, batch=batch)  # per-branch positions
    ref_buf = layout.allocate(hkv, d, dtype=torch.bfloat16, device=DEVICE)
    q_ref = m.qk_norm_rope_pack_reference(q, k, v, qw, kw, cos, sin, ref_buf, layout, eps=1e-6,
                                          reduce_order=m.DEFAULT_REDUCE_ORDER)
    buf = ref_buf.clone().fill_(float("nan"))
    out = m.qk_norm_rope_pack(q, k, v, qw, kw, cos, sin, buf, layout, eps=1e-6, round_norm_before_rope=True,
                              q_out=q, reduce_order=m.DEFAULT_REDUCE_ORDER)
    assert out is q
    assert torch.equal(q, q_ref)
    for b in range(batch):
        off = layout.gen_offset(b)
        assert torch.equal(buf[:, off : off + n], ref_buf[:, off : off + n])


def test_rejects_bad_inputs():
    layout, q, k, v, qw, kw, cos, sin = _case()
    buf = layout.allocate(2, 16, dtype=q.dtype, device=DEVICE)
    with pytest.raises(ValueError, match="flavour"):
        m.qk_norm_rope_pack(q, k, v, qw, kw, cos, sin, buf, layout, eps=1e-6, flavour="layernorm")
    with pytest.raises(ValueError, match="layout"):
        m.qk_norm_rope_pack(q, k, v, qw, kw, cos, sin, buf, PackedKVLayout((5,), 8), eps=1e-6)
    with pytest.raises(ValueError, match="q_weight"):
        m.qk_norm_rope_pack(q, k, v, qw.float(), kw, cos, sin, buf, layout, eps=1e-6)
    with pytest.raises(ValueError, match="cos/sin"):
        m.qk_norm_rope_pack(q, k, v, qw, kw, cos[:4], sin[:4], buf, layout, eps=1e-6)


@triton.jit
def _round_kernel(x_ptr, o_ptr, N: tl.constexpr, DTYPE: tl.constexpr):
    offs = tl.arange(0, N)
    tl.store(o_ptr + offs, m._round_to(tl.load(x_ptr + offs), DTYPE))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_in_kernel_rounding_matches_torch_casts(dtype):
    """Every intermediate rounding of the kernel, over 48 binades: subnormals, ties, overflow to inf."""
    n = 4096
    x = torch.randn(n) * torch.exp2(torch.randint(-30, 18, (n,)).float())
    x[:8] = torch.tensor([65504.0, 65519.0, 65520.0, 1e9, -0.0, float("inf"), 2.0**-25, 3 * 2.0**-26])
    x = x.to(DEVICE)
    out = torch.empty_like(x)
    _round_kernel[(1,)](x, out, n, tl.bfloat16 if dtype == torch.bfloat16 else tl.float16)
    assert torch.equal(out, x.to(dtype).float())


def test_probe_is_none_off_cuda():
    assert m.torch_reduce_order("cpu") is None


# ------------------------------------------------------------------------------------------------
# GPU: bit-exact against plain diffusers ops, fresh random inputs every run
# ------------------------------------------------------------------------------------------------
@pytest.mark.gpu
@gpu
def test_gpu_probe_finds_this_builds_order():
    assert m.torch_reduce_order(DEVICE) is not None


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("flavour,hq", [("diffusers", 32), ("nemotron", 16)])
def test_gpu_rounded_fused_equals_split_path_bf16(flavour, hq):
    n, hkv, d = 1024, 8, 128
    layout = PackedKVLayout((1615, 2866), n)
    q = torch.randn(2, n, hq, d, dtype=torch.bfloat16, device=DEVICE) * 4
    k = torch.randn(2, n, hkv, d, dtype=torch.bfloat16, device=DEVICE) * 4
    v = torch.randn(2, n, hkv, d, dtype=torch.bfloat16, device=DEVICE)
    qw = (1 + 0.3 * torch.randn(d, device=DEVICE)).to(torch.bfloat16)
    kw = (1 + 0.3 * torch.randn(d, device=DEVICE)).to(torch.bfloat16)
    cos, sin = _rope_tables(n, d, torch.bfloat16, batch=2)
    buf = _poisoned_buffer(layout, hkv, d, torch.bfloat16)
    ref_buf = buf.clone()
    q_out = torch.full_like(q, float("nan"))
    m.qk_norm_rope_pack(q, k, v, qw, kw, cos, sin, buf, layout, eps=1e-6, flavour=flavour,
                        round_norm_before_rope=True, q_out=q_out)
    q_ref = m.qk_norm_rope_pack_reference(q, k, v, qw, kw, cos, sin, ref_buf, layout, eps=1e-6, flavour=flavour)
    assert not q_out.isnan().any()
    diff = (q_out.float() - q_ref.float()).abs()
    assert torch.equal(q_out, q_ref), f"{(diff > 0).sum().item()} of {q_out.numel()} differ, max {diff.max().item()}"
    assert torch.equal(buf, ref_buf)
    _assert_prefix_untouched(buf, layout)


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("flavour", ["diffusers", "nemotron"])
def test_gpu_rounded_fused_equals_emulated_order_reference(flavour):
    """Localises a failure of the test above: this one fixes the reduction order on both sides."""
    layout, q, k, v, qw, kw, cos, sin = _case(batch=2, n=256, hq=8, hkv=4, d=128, prefixes=(100, 37))
    buf, ref_buf = (layout.allocate(4, 128, dtype=q.dtype, device=DEVICE).zero_() for _ in range(2))
    for order in m.ReduceOrder:
        out = m.qk_norm_rope_pack(q, k, v, qw, kw, cos, sin, buf, layout, eps=1e-6, flavour=flavour,
                                  round_norm_before_rope=True, reduce_order=order)
        ref = m.qk_norm_rope_pack_reference(q, k, v, qw, kw, cos, sin, ref_buf, layout, eps=1e-6, flavour=flavour,
                                            reduce_order=order)
        assert torch.equal(out, ref), f"{order.name}: {(out != ref).sum().item()} of {out.numel()} differ"
        assert torch.equal(buf, ref_buf)
