"""K/V lengths on the device: one buffer capacity and one launch for any prompt length that fits.

A kept step graph replays its kernels with the arguments it was captured with. With the lengths on the
device (`PackedKVLayout.lengths`, `KVCache(lengths_on_device=True)`), the kernels read every branch's start,
length and gen offset from tensors whose values a new request rewrites, and size their launch by a bound,
not by the prompt. These tests run the Triton kernels under the interpreter on the CPU: a capacity buffer
whose lengths were rewritten gives exactly what the exact buffer of the new prompt gives.
"""
import pytest
import torch

from engine.pipeline.transformer import allocate_cache
from cosmos3_kernels import dispatch as dsp, prefix_attention as pa, qk_norm_rope as qk
from cosmos3_kernels.packed_kv import DeviceLengths, PackedKVLayout

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # the kernels run on the GPU there, else interpreted


def _sized(prefixes, n, bound, device=DEVICE):
    """A layout at capacity `len(prefixes) * bound` rows whose lengths live in device tensors."""
    sized = PackedKVLayout(prefixes, n, capacity_rows=len(prefixes) * bound, kv_len_bound=bound)
    return PackedKVLayout(prefixes, n, capacity_rows=sized.capacity_rows, kv_len_bound=bound,
                          lengths=DeviceLengths(sized, device))


def _copy_rows(exact_buf, exact, sized_buf):
    """The exact buffer's rows into the capacity buffer at the same packed positions (the rest stays as is)."""
    sized_buf[:, : exact.total_rows] = exact_buf


def test_a_layout_says_its_rows_and_launch_bound_and_refuses_too_small_ones():
    exact = PackedKVLayout((5, 19), 20)
    assert exact.rows == exact.total_rows == 64 and exact.kv_len_limit == exact.max_kv_len == 39
    sized = PackedKVLayout((5, 19), 20, capacity_rows=128, kv_len_bound=64)
    assert sized.rows == 128 and sized.kv_len_limit == 64 and sized.total_rows == 64
    assert sized == PackedKVLayout((5, 19), 20, capacity_rows=128, kv_len_bound=64, lengths=DeviceLengths(sized, "cpu"))
    with pytest.raises(ValueError, match="capacity_rows 50 is less than the 64 rows"):
        PackedKVLayout((5, 19), 20, capacity_rows=50)
    with pytest.raises(ValueError, match="kv_len_bound 32 is less than the longest branch's 39 keys"):
        PackedKVLayout((5, 19), 20, kv_len_bound=32)
    buffer = sized.allocate(2, 16, dtype=torch.float32, device="cpu")
    assert buffer.shape == (2, 128, 2, 16)
    with pytest.raises(ValueError, match=r"kv_buffer must be \[2, 128"):
        sized.check_buffer(torch.empty(2, 64, 2, 16))


def test_device_lengths_hold_their_tensors_and_take_a_new_prompts_values():
    first = _sized((5, 19), 20, 64)
    tensors = first.index_tensors("cpu") + first.cu_seqlens("cpu")
    assert [t.tolist() for t in tensors] == [[0, 25], [25, 39], [5, 44], [1, 0], [0, 20, 40], [0, 25, 64]]
    second = PackedKVLayout((30, 7), 20, capacity_rows=128, kv_len_bound=64)
    first.lengths.write(second)
    again = first.index_tensors("cpu") + first.cu_seqlens("cpu")
    assert all(a is b for a, b in zip(again, tensors)), "the same tensors: a captured graph reads these"
    assert [t.tolist() for t in again] == [[0, 50], [50, 27], [30, 57], [0, 1], [0, 20, 40], [0, 50, 77]]
    with pytest.raises(ValueError, match="holds 2 branches, got a layout with 1"):
        first.lengths.write(PackedKVLayout((4,), 20))


@pytest.mark.parametrize("use_tma", [False, True])
def test_attention_over_a_capacity_buffer_equals_the_exact_buffer_for_each_prompt(use_tma):
    """One capacity buffer and one set of length tensors, rewritten for a second prompt: the Triton kernel
    gives bit for bit what it gives on each prompt's exact buffer. Rows past the prompt hold NaN and huge
    values: none may reach the output."""
    torch.manual_seed(0)
    n, hq, hkv, d = 20, 4, 2, 16
    config = pa.AttentionConfig(16, 16, 4, 2, use_tma)
    sized = _sized((5, 19), n, 64)
    capacity = sized.allocate(hkv, d, dtype=torch.bfloat16, device=DEVICE).fill_(float("nan"))
    capacity[:, -8:] = 3e4
    for prefixes in ((5, 19), (30, 7)):
        exact = PackedKVLayout(prefixes, n)
        q = torch.randn(2, n, hq, d, dtype=torch.bfloat16, device=DEVICE)
        exact_buf = torch.randn(2, exact.total_rows, hkv, d, dtype=torch.bfloat16, device=DEVICE)
        sized.lengths.write(exact)
        _copy_rows(exact_buf, exact, capacity)
        want = pa.prefix_attention(q, exact_buf, exact, config=config)
        got = pa.prefix_attention(q, capacity, sized, config=config)
        assert not got.isnan().any()
        assert torch.equal(got, want), prefixes


def test_the_qk_kernel_writes_gen_rows_at_the_offsets_on_the_device():
    torch.manual_seed(1)
    n, hq, hkv, d = 8, 4, 2, 16
    sized = _sized((5, 3), n, 16)
    capacity = sized.allocate(hkv, d, dtype=torch.bfloat16, device=DEVICE).fill_(float("nan"))
    qw, kw = (1 + 0.2 * torch.randn(d)).bfloat16().to(DEVICE), (1 + 0.2 * torch.randn(d)).bfloat16().to(DEVICE)
    for prefixes in ((5, 3), (2, 7)):
        exact = PackedKVLayout(prefixes, n)
        q = torch.randn(2, n, hq, d, dtype=torch.bfloat16, device=DEVICE)
        k = torch.randn(2, n, hkv, d, dtype=torch.bfloat16, device=DEVICE)
        v = torch.randn(2, n, hkv, d, dtype=torch.bfloat16, device=DEVICE)
        cos, sin = torch.randn(n, d).bfloat16().to(DEVICE), torch.randn(n, d).bfloat16().to(DEVICE)
        exact_buf = exact.allocate(hkv, d, dtype=torch.bfloat16, device=DEVICE).zero_()
        sized.lengths.write(exact)
        capacity[:, : exact.total_rows] = 0
        want = qk.qk_norm_rope_pack(q, k, v, qw, kw, cos, sin, exact_buf, exact, eps=1e-6)
        got = qk.qk_norm_rope_pack(q, k, v, qw, kw, cos, sin, capacity, sized, eps=1e-6)
        assert torch.equal(got, want)
        assert torch.equal(capacity[:, : exact.total_rows], exact_buf), prefixes


def test_dispatch_never_takes_a_host_length_path_when_the_lengths_are_on_the_device():
    """The PyTorch paths slice by host integers, which a replay for another prompt would not change: with
    the lengths on the device dispatch refuses them by name instead of running them."""
    n, hq, hkv, d = 8, 4, 2, 16
    sized = _sized((5, 3), n, 16, device="cpu")
    capacity = sized.allocate(hkv, d, dtype=torch.bfloat16, device="cpu").zero_()
    q = torch.randn(2, n, hq, d, dtype=torch.bfloat16)
    auto = dsp.KernelDispatcher("auto")  # on a CPU auto mode takes the PyTorch path
    with pytest.raises(ValueError, match="prefix_attention: .*cannot run this call: it slices each branch by host "
                                         "lengths, and the lengths are on the device"):
        auto.prefix_attention(q, capacity, sized)
    k = torch.randn(2, n, hkv, d, dtype=torch.bfloat16)
    w, cos = torch.ones(d, dtype=torch.bfloat16), torch.ones(n, d, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="qk_norm_rope: .*cannot run this call: it writes k and v at host offsets, "
                                         "and the lengths are on the device"):
        auto.qk_norm_rope_pack(q, k, k, w, w, cos, cos, capacity, sized, eps=1e-6)
    if DEVICE == "cpu":  # forced to the kernels, which run under the interpreter here
        forced = dsp.KernelDispatcher("triton", interpret=True)
        out = forced.prefix_attention(q, capacity, sized)
        assert torch.equal(out, pa.prefix_attention(q, capacity, sized, config=forced.attention_configs[0]))


@pytest.mark.parametrize("device,head_dim,dtype,mode,why", [
    ("cpu", 128, torch.bfloat16, "auto", "device cpu"),
    ("cpu", 128, torch.bfloat16, "torch", "forced to the PyTorch path"),
])
def test_where_lengths_cannot_live_on_the_device_says_why(device, head_dim, dtype, mode, why):
    assert why in dsp.lengths_on_device_refused(torch.device(device), head_dim, dtype, mode)


def test_a_cache_with_device_lengths_keys_by_capacity_and_takes_another_prompts_lengths(tiny_family):
    import engine

    tower = engine.load_model(tiny_family["edge"], device="cpu").transformer
    first = allocate_cache(tower, (70, 12), 40, lengths_on_device=True)
    second = allocate_cache(tower, (50, 12), 40, lengths_on_device=True)
    assert first.layout.kv_len_limit == 128 and first.layout.rows == 256
    assert first.lengths_key == second.lengths_key == ("device", 2, 40, 256, 128)
    assert allocate_cache(tower, (70, 12), 40).lengths_key == ("exact", (70, 12), 40)
    assert allocate_cache(tower, (100, 12), 40, lengths_on_device=True).lengths_key != first.lengths_key
    # leading(1): the whole buffers at capacity, with the one-branch layout's own device lengths
    one, buffers = first.leading(1)
    assert one.num_branches == 1 and one.rows == 256 and buffers[0].shape[1] == 256 and one.lengths is not None
    first.adopt_lengths(second)
    assert first.layout.index_tensors("cpu")[1].tolist() == [90, 52]
    assert first.leading(1)[0].index_tensors("cpu")[1].tolist() == [90]
    with pytest.raises(ValueError, match="cannot take the lengths"):
        first.adopt_lengths(allocate_cache(tower, (70, 12), 40))


def test_room_for_a_long_caption_gives_short_and_long_prompts_one_capacity(tiny_family):
    import engine

    tower = engine.load_model(tiny_family["edge"], device="cpu").transformer
    short = allocate_cache(tower, (9, 12), 40, lengths_on_device=True, prompt_room=200)
    long = allocate_cache(tower, (215, 12), 40, lengths_on_device=True, prompt_room=200)
    # Each branch's keys (text + 40 gen) fit 40 + 200 -> a 256-key bound, whatever the prompt's length.
    assert short.layout.kv_len_limit == long.layout.kv_len_limit == 256
    assert short.lengths_key == long.lengths_key == ("device", 2, 40, 512, 256)
    # A caption past the room takes the next bucket; without room the bound follows the prompt.
    assert allocate_cache(tower, (230, 12), 40, lengths_on_device=True, prompt_room=200).layout.kv_len_limit == 512
    assert allocate_cache(tower, (9, 12), 40, lengths_on_device=True).layout.kv_len_limit == 64
