"""Fused residual-add + RMSNorm and the MLP activations against their PyTorch split paths."""
import pytest
import torch

from cosmos3_kernels import norms

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

# The row reduction and exp run in Triton's order: results may differ by one rounding step.
TOL = {
    torch.bfloat16: dict(atol=1.6e-2, rtol=2**-7),
    torch.float16: dict(atol=2e-3, rtol=2**-10),
    torch.float32: dict(atol=1e-5, rtol=1e-5),
}
DTYPES = [torch.bfloat16, torch.float16, torch.float32]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("flavour", ["diffusers", "nemotron"])
@pytest.mark.parametrize("with_residual", [True, False])
def test_add_rms_norm(dtype, flavour, with_residual):
    x = torch.randn(2, 3, 200, dtype=dtype, device=DEVICE)  # 200: not a power of two, masked tail
    r = torch.randn_like(x) if with_residual else None
    w = (1 + 0.2 * torch.randn(200, device=DEVICE)).to(dtype)
    out, hidden = norms.add_rms_norm(x, r, w, eps=1e-6, flavour=flavour)
    ref_out, ref_hidden = norms.add_rms_norm_reference(x, r, w, 1e-6, flavour)
    assert out.shape == x.shape and not out.isnan().any()
    assert torch.equal(hidden, ref_hidden)  # the residual sum rounds exactly like x + r
    torch.testing.assert_close(out, ref_out, **TOL[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
def test_swiglu_on_views_of_a_fused_gate_up(dtype):
    fused = torch.randn(4, 2 * 300, dtype=dtype, device=DEVICE) * 3
    gate, up = fused[:, :300], fused[:, 300:]
    out = norms.swiglu(gate, up, block=128)
    assert not out.isnan().any()
    torch.testing.assert_close(out, norms.swiglu_reference(gate, up), **TOL[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
def test_relu2_is_exact(dtype):
    x = torch.randn(3, 5, 300, dtype=dtype, device=DEVICE) * 3
    assert torch.equal(norms.relu2(x, block=128), norms.relu2_reference(x))


def test_rejects_bad_inputs():
    x = torch.randn(2, 8, device=DEVICE)
    with pytest.raises(ValueError, match="weight"):
        norms.add_rms_norm(x, None, torch.ones(4, device=DEVICE), eps=1e-6)
    with pytest.raises(ValueError, match="diffusers flavour"):
        norms.add_rms_norm(x, None, torch.ones(8, device=DEVICE, dtype=torch.bfloat16), eps=1e-6)
    with pytest.raises(ValueError, match="contiguous"):
        norms.relu2(x.t())
    with pytest.raises(ValueError, match="gate/up"):
        norms.swiglu(x, x[:, :4])


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("flavour,hidden", [("diffusers", 4096), ("nemotron", 2048)])
def test_gpu_model_widths_bf16(flavour, hidden):
    x = torch.randn(4096, hidden, dtype=torch.bfloat16, device=DEVICE)
    r = torch.randn_like(x)
    w = (1 + 0.2 * torch.randn(hidden, device=DEVICE)).to(torch.bfloat16)
    out, h = norms.add_rms_norm(x, r, w, eps=1e-6, flavour=flavour)
    ref_out, ref_h = norms.add_rms_norm_reference(x, r, w, 1e-6, flavour)
    assert torch.equal(h, ref_h)
    torch.testing.assert_close(out, ref_out, **TOL[torch.bfloat16])
    g = torch.randn(4096, 2 * 4608, dtype=torch.bfloat16, device=DEVICE)
    torch.testing.assert_close(norms.swiglu(g[:, :4608], g[:, 4608:]), norms.swiglu_reference(g[:, :4608], g[:, 4608:]),
                               **TOL[torch.bfloat16])
    assert torch.equal(norms.relu2(g), norms.relu2_reference(g))
