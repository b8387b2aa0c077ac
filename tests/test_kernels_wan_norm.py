"""The Wan decoder's fused RMS norm + SiLU kernel (`kernels.wan_norm`) against its reference (CPU: the
Triton interpreter), and that it writes only the interior of its padded buffer."""
import pytest
import torch

from kernels.wan_norm import norm_silu_into, norm_silu_reference


# The kernel runs where its tensors are: on a GPU machine the conftest leaves the interpreter off.
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.mark.parametrize("channels", [8, 24, 48])
def test_norm_silu_kernel_is_the_reference_and_writes_only_the_interior(channels):
    generator = torch.Generator().manual_seed(channels)
    x = (3 * torch.randn(1, channels, 3, 5, 7, generator=generator)).to(DEVICE, torch.bfloat16)
    x = x.contiguous(memory_format=torch.channels_last_3d)
    gamma = (1 + 0.1 * torch.randn(channels, 1, 1, 1, generator=generator)).to(DEVICE, torch.bfloat16)
    buffer = torch.full((1, channels, 5, 7, 9), 7.0, dtype=torch.bfloat16, device=DEVICE).contiguous(
        memory_format=torch.channels_last_3d)
    interior = buffer[:, :, 2:, 1:6, 1:8]
    norm_silu_into(x, gamma, channels ** 0.5, interior)
    assert torch.equal(interior, norm_silu_reference(x, gamma, channels ** 0.5))
    outside = torch.ones_like(buffer, dtype=torch.bool)
    outside[:, :, 2:, 1:6, 1:8] = False
    assert bool((buffer[outside] == 7.0).all())


def test_norm_silu_kernel_refuses_channels_first():
    x = torch.randn(1, 8, 2, 3, 3, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="channel stride 1"):
        norm_silu_into(x, torch.ones(8, dtype=torch.bfloat16), 1.0, torch.empty_like(x))
