"""The fast path's decode (`engine.pipeline.decode`) gives the exact path's 8-bit frames bit for bit (CPU).

Reference: diffusers' `vae.decode`, `VideoProcessor.postprocess_video` to float32, then the output
stage's rounding (`engine.pipeline.outputs.frames_to_uint8`), which is what the exact path writes to disk.
"""
import numpy as np
import pytest
import torch
from diffusers.video_processor import VideoProcessor

import engine
from engine.pipeline.decode import decode_uint8, to_uint8
from engine.pipeline.outputs import frames_to_uint8


@pytest.fixture(scope="module")
def vae(tiny_family):
    return engine.load_model(tiny_family["nano"], device="cpu").vae


@pytest.mark.parametrize("latent_frames", [1, 4], ids=["image", "video"])
def test_uint8_decode_is_bitwise_the_exact_path(vae, latent_frames):
    torch.manual_seed(latent_frames)
    z = torch.randn(1, vae.config.z_dim, latent_frames, 4, 6, dtype=vae.dtype)
    with torch.no_grad():
        decoded = vae.decode(z).sample.float()
    reference = VideoProcessor(vae_scale_factor=16).postprocess_video(decoded, output_type="np")[0]
    expected = frames_to_uint8(reference.astype(np.float32))
    ours = decode_uint8(vae, z)
    assert ours.dtype == np.uint8 and ours.shape == expected.shape == (1 + 4 * (latent_frames - 1), 64, 96, 3)
    assert np.array_equal(ours, expected)


def test_gpu_rounding_is_the_output_stage_rounding_everywhere_in_range():
    """Every bf16 value in and beyond [-1, 1] (clipping at both ends, every rounding tie on the way)."""
    bits = torch.arange(-(2**15), 2**15, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)
    values = bits[torch.isfinite(bits) & (bits.float().abs() <= 2.0)]
    decoded = values.reshape(1, 1, 1, -1).expand(3, 1, 1, -1)
    reference = frames_to_uint8((decoded.float() * 0.5 + 0.5).clamp(0, 1).permute(1, 2, 3, 0).numpy())
    ours = to_uint8(decoded).numpy()
    assert (ours == 0).any() and (ours == 255).any()
    assert np.array_equal(ours, reference)


def test_frames_reach_the_host_in_decode_order():
    from engine.pipeline.decode import frames_to_host

    chunks = [torch.full((n, 2, 3, 3), i, dtype=torch.uint8) for i, n in enumerate((1, 4, 4))]
    frames = frames_to_host(iter(chunks), 9)
    assert frames.shape == (9, 2, 3, 3) and frames.dtype == np.uint8
    assert [int(f[0, 0, 0]) for f in frames] == [0, 1, 1, 1, 1, 2, 2, 2, 2]
    with pytest.raises(ValueError, match="the decoder gave no frames"):
        frames_to_host(iter([]), 9)


def test_each_chunk_is_taken_as_it_arrives_so_a_decoder_may_reuse_its_buffer():
    """A decoder that writes every chunk into one buffer (as a replayed graph does) still gives every chunk."""
    from engine.pipeline.decode import frames_to_host

    def reused_buffer():
        buffer = torch.empty((2, 2, 3, 3), dtype=torch.uint8)
        for i in range(3):
            buffer.fill_(i)
            yield buffer

    frames = frames_to_host(reused_buffer(), 6)
    assert [int(f[0, 0, 0]) for f in frames] == [0, 0, 1, 1, 2, 2]


@pytest.mark.parametrize("counts, expected, error", [
    ((1, 4, 4), 5, "does not fit 5 uint8 frames"),
    ((1, 4), 9, "gave 5 frames, 9 were expected"),
])
def test_a_frame_count_other_than_the_decoders_is_refused(counts, expected, error):
    from engine.pipeline.decode import frames_to_host

    chunks = [torch.zeros((n, 2, 3, 3), dtype=torch.uint8) for n in counts]
    with pytest.raises(ValueError, match=error):
        frames_to_host(iter(chunks), expected)


def test_a_chunk_of_another_size_or_type_is_refused():
    from engine.pipeline.decode import frames_to_host

    for bad in (torch.zeros((1, 2, 4, 3), dtype=torch.uint8), torch.zeros((1, 2, 3, 3), dtype=torch.float32)):
        with pytest.raises(ValueError, match=r"chunk \(1, 2, ., 3\) torch\.(uint8|float32) after 1 frames"):
            frames_to_host(iter([torch.zeros((1, 2, 3, 3), dtype=torch.uint8), bad]), 2)


@pytest.mark.parametrize("latent_frames, frames", [(0, 0), (1, 1), (2, 5), (31, 121), (48, 189)])
def test_decoded_frame_count_is_the_causal_rule(latent_frames, frames):
    from engine.pipeline.decode import decoded_frames

    assert decoded_frames(latent_frames) == frames
