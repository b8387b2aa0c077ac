"""The two halves of a Cosmos3 forward, run on the loaded diffusers modules.

The und (text) tower never sees gen tokens or the timestep, so its per-layer keys and values are
the same at every denoising step. `prefill` runs it once per request and CFG branch and writes each
layer's K-for-gen and V into the branch's prefix rows of a packed per-layer buffer (the layout in
`cosmos3_kernels.packed_kv`: every branch's rows are `[prefix | gen]`). `gen_forward` then runs only the gen
tower per step and writes the step's gen K/V into the gen rows, so no step concatenates or copies
the prefix. The fast path (`engine.pipeline.fast_path`) reads the same buffers.

Both functions mirror `Cosmos3PackedMoTAttention` / `Cosmos3VLTextMoTDecoderLayer` op for op, so
on the same inputs they agree with the full diffusers forward (tests/unit/pipeline/test_engine_parity.py).
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch

from cosmos3_kernels.packed_kv import DeviceLengths, PackedKVLayout, kv_len_bucket

from .attention import attend_causal, attend_prefix


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """NeoX rotate-half rotary; x [N, heads, D], cos/sin [N, 1, D]."""
    return x * cos + rotate_half(x) * sin


@dataclass
class KVCache:
    """Per-layer packed K/V buffers `[2, rows, kv_heads, head_dim]` for all CFG branches of a request.

    With its lengths on the device (`allocate_cache(..., lengths_on_device=True)`), the buffers have a
    fixed capacity of rows for every prompt whose longest branch fits a power-of-two bound, and each
    leading branch count has its own layout carrying `DeviceLengths`: a step captured over this cache reads
    every length from the device, so it replays for another prompt once `lengths_key` matches and the
    prompt's buffers and lengths are copied in (`engine.pipeline.whole_step`).
    """

    layout: PackedKVLayout
    buffers: list[torch.Tensor]
    leading_layouts: dict[int, PackedKVLayout] = field(default_factory=dict)

    def branch(self, layer: int, branch: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.layout.branch_kv(self.buffers[layer], branch)

    def leading(self, branches: int) -> tuple[PackedKVLayout, list[torch.Tensor]]:
        """Layout and buffer views holding only the first `branches` branches (rows start at 0)."""
        if branches in self.leading_layouts:  # lengths on the device: the whole buffers, at capacity
            return self.leading_layouts[branches], self.buffers
        if branches == self.layout.num_branches:
            return self.layout, self.buffers
        layout = PackedKVLayout(self.layout.prefix_lens[:branches], self.layout.gen_len)
        return layout, [buffer[:, : layout.total_rows] for buffer in self.buffers]

    @property
    def lengths_key(self) -> tuple:
        """What a step captured over this cache depends on: the exact prefix lengths, or with the lengths
        on the device only the branch count, gen length and row capacity."""
        layout = self.layout
        if layout.lengths is not None:
            return ("device", layout.num_branches, layout.gen_len, layout.rows, layout.kv_len_limit)
        return ("exact", layout.prefix_lens, layout.gen_len)

    def adopt_lengths(self, other: "KVCache") -> None:
        """Write `other`'s lengths (same `lengths_key`) into this cache's device lengths, every branch count."""
        if other.lengths_key != self.lengths_key or self.layout.lengths is None:
            raise ValueError(f"cannot take the lengths of a cache keyed {other.lengths_key} into one keyed {self.lengths_key}")
        for count, layout in self.leading_layouts.items():
            layout.lengths.write(other.leading_layouts[count])


def allocate_cache(transformer, prefix_lens: tuple[int, ...], gen_len: int, *, lengths_on_device: bool = False,
                   prompt_room: int = 0, device: torch.device | None = None) -> KVCache:
    """The request's K/V buffers. `lengths_on_device`: sized to a capacity and with `DeviceLengths` (see
    `KVCache`); only where every attention call can read lengths from the device (CUDA, the fast path).
    `prompt_room`: with the lengths on the device, the capacity also holds any branch whose text has up to
    this many tokens, so prompts of every length up to it share one capacity (and one kept step).
    `device`: the tower's, where the caller knows it (read from the tower otherwise)."""
    layout = PackedKVLayout(tuple(prefix_lens), gen_len)
    attn = transformer.layers[0].self_attn
    # Read once: diffusers' `ModelMixin.dtype` and `.device` walk every submodule for hooks on each read,
    # 2-5 ms apiece on a full-size tower; one read per layer cost ~0.1 s of host time per request (H200,
    # docs/perf-log/2026-12-02.md, "A request's host time").
    dtype = transformer.dtype
    device = device if device is not None else transformer.device
    leading = {}
    if lengths_on_device:
        # Every branch's keys fit the bound, so the branches' rows fit `branches * bound` in any order.
        bound = kv_len_bucket(max(layout.max_kv_len, gen_len + prompt_room))
        capacity = layout.num_branches * bound
        for count in range(1, layout.num_branches + 1):
            sized = PackedKVLayout(layout.prefix_lens[:count], gen_len, capacity_rows=capacity, kv_len_bound=bound)
            leading[count] = replace(sized, lengths=DeviceLengths(sized, device))
        layout = leading[layout.num_branches]
    buffers = [
        layout.allocate(attn.num_key_value_heads, attn.head_dim, dtype=dtype, device=device)
        for _ in transformer.layers
    ]
    return KVCache(layout, buffers, leading)


@dataclass
class GenRotary:
    """One branch's rotary tables for its gen tokens, [gen_len, 1, head_dim]."""

    cos: torch.Tensor
    sin: torch.Tensor


def rotary_tables(transformer, position_ids: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin [seq, head_dim] for `[3, seq]` M-RoPE positions, computed as diffusers computes them."""
    cos, sin = transformer.rotary_emb(position_ids=position_ids.unsqueeze(1), device=position_ids.device, dtype=dtype)
    return cos.squeeze(0), sin.squeeze(0)


def time_embeds(transformer, timesteps: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """[rows, hidden] timestep embeddings of `timesteps` [rows] (float32, unscaled), in `dtype`: the embedder
    runs in its own dtype (fp32, as diffusers keeps it). The eager loop (engine.pipeline.denoise) and the
    whole step (engine.pipeline.whole_step, from a device buffer) both embed through here."""
    embedder_dtype = next(transformer.time_embedder.parameters()).dtype
    steps = timesteps * transformer.config.timestep_scale
    return transformer.time_embedder(transformer.time_proj(steps).to(embedder_dtype)).to(dtype)


@torch.no_grad()
def prefill(transformer, cache: KVCache, branch: int, input_ids: torch.Tensor, position_ids: torch.Tensor) -> GenRotary:
    """Run the und tower once, writing branch `branch`'s prefix K/V; return its gen rotary tables."""
    und_len = int(input_ids.shape[0])
    if und_len != cache.layout.prefix_lens[branch]:
        raise ValueError(f"branch {branch} has {und_len} text tokens, the cache expects {cache.layout.prefix_lens[branch]}")
    hidden = transformer.embed_tokens(input_ids)
    cos, sin = rotary_tables(transformer, position_ids, hidden.dtype)
    cos_und, sin_und = cos[:und_len].unsqueeze(1), sin[:und_len].unsqueeze(1)
    last = len(transformer.layers) - 1
    for index, layer in enumerate(transformer.layers):
        attn = layer.self_attn
        normed = layer.input_layernorm(hidden)
        k = attn.norm_k(attn.to_k(normed).view(-1, attn.num_key_value_heads, attn.head_dim))
        v = attn.to_v(normed).view(-1, attn.num_key_value_heads, attn.head_dim)
        k_for_gen = attn.k_norm_und_for_gen(k) if attn.k_norm_und_for_gen is not None else k
        keys, values = cache.branch(index, branch)
        keys[:und_len] = apply_rotary(k_for_gen, cos_und, sin_und)
        values[:und_len] = v
        if index == last:
            # The last layer's und output feeds nothing the gen tower reads: stop at its K/V.
            break
        q = attn.norm_q(attn.to_q(normed).view(-1, attn.num_attention_heads, attn.head_dim))
        q = apply_rotary(q, cos_und, sin_und)
        k = apply_rotary(k, cos_und, sin_und)
        hidden = hidden + attn.to_out(attend_causal(q, k, v))
        hidden = hidden + layer.mlp(layer.post_attention_layernorm(hidden))
    return GenRotary(cos[und_len:].unsqueeze(1), sin[und_len:].unsqueeze(1))


@torch.no_grad()
def gen_forward(transformer, cache: KVCache, branch: int, rotary: GenRotary, gen_hidden: torch.Tensor,
                exchange=None) -> torch.Tensor:
    """Run the gen tower over `gen_hidden` [gen_len, hidden] for one branch; return its final-normed output.

    With `exchange` (`engine.parallel.ulysses.SeqExchange`, sequence parallel), `gen_hidden` and
    `rotary` hold this rank's token shard, and the cache this rank's share of the key-value heads:
    queries, keys and values go to all tokens with a share of the heads before attention, and back after.
    """
    und_len = cache.layout.prefix_lens[branch]
    hidden = gen_hidden
    for index, layer in enumerate(transformer.layers):
        attn = layer.self_attn
        keys, values = cache.branch(index, branch)
        normed = layer.input_layernorm_moe_gen(hidden)
        q = attn.norm_added_q(attn.add_q_proj(normed).view(-1, attn.num_attention_heads, attn.head_dim))
        k = attn.norm_added_k(attn.add_k_proj(normed).view(-1, attn.num_key_value_heads, attn.head_dim))
        k = apply_rotary(k, rotary.cos, rotary.sin)
        v = attn.add_v_proj(normed).view(-1, attn.num_key_value_heads, attn.head_dim)
        q = apply_rotary(q, rotary.cos, rotary.sin)
        if exchange is not None:
            q, k, v = exchange.to_heads(q, k, v)
        keys[und_len:] = k
        values[und_len:] = v
        out = attend_prefix(q, keys, values)
        hidden = hidden + attn.to_add_out(exchange.to_seq(out) if exchange is not None else out)
        hidden = hidden + layer.mlp_moe_gen(layer.post_attention_layernorm_moe_gen(hidden))
    return transformer.norm_moe_gen(hidden)
