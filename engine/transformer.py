"""The two halves of a Cosmos3 forward, run on the loaded diffusers modules.

The und (text) tower never sees gen tokens or the timestep, so its per-layer keys and values are
the same at every denoising step. `prefill` runs it once per request and CFG branch and writes
each layer's K-for-gen and V into a packed buffer `[prefix | gen]`; `gen_forward` then runs only the
gen tower per step, writing the step's gen K/V into the tail of the same buffers, so no step
concatenates or copies the prefix.

Both functions mirror `Cosmos3PackedMoTAttention` / `Cosmos3VLTextMoTDecoderLayer` op for op, so
on the same inputs they agree with the full diffusers forward (tests/test_engine_parity.py).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .attention import attend_causal, attend_prefix


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """NeoX rotate-half rotary; x [N, heads, D], cos/sin [N, 1, D]."""
    return x * cos + rotate_half(x) * sin


@dataclass
class BranchPrefix:
    """One CFG branch's cached text tower: packed K/V buffers and the gen rotary tables."""

    und_len: int
    gen_len: int
    keys: list[torch.Tensor]  # per layer [und_len + gen_len, kv_heads, head_dim]; prefix filled
    values: list[torch.Tensor]
    cos_gen: torch.Tensor  # [gen_len, 1, head_dim]
    sin_gen: torch.Tensor


def rotary_tables(transformer, position_ids: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin [seq, head_dim] for `[3, seq]` M-RoPE positions, computed as diffusers computes them."""
    cos, sin = transformer.rotary_emb(position_ids=position_ids.unsqueeze(1), device=position_ids.device, dtype=dtype)
    return cos.squeeze(0), sin.squeeze(0)


@torch.no_grad()
def prefill(transformer, input_ids: torch.Tensor, position_ids: torch.Tensor, gen_len: int) -> BranchPrefix:
    """Run the und tower once and return the packed K/V buffers for the gen tower's steps."""
    und_len = int(input_ids.shape[0])
    hidden = transformer.embed_tokens(input_ids)
    dtype = hidden.dtype
    cos, sin = rotary_tables(transformer, position_ids, dtype)
    cos_und, sin_und = cos[:und_len].unsqueeze(1), sin[:und_len].unsqueeze(1)
    keys, values = [], []
    last = len(transformer.layers) - 1
    for index, layer in enumerate(transformer.layers):
        attn = layer.self_attn
        normed = layer.input_layernorm(hidden)
        k = attn.norm_k(attn.to_k(normed).view(-1, attn.num_key_value_heads, attn.head_dim))
        v = attn.to_v(normed).view(-1, attn.num_key_value_heads, attn.head_dim)
        k_for_gen = attn.k_norm_und_for_gen(k) if attn.k_norm_und_for_gen is not None else k
        key_buffer = k.new_empty((und_len + gen_len, attn.num_key_value_heads, attn.head_dim))
        value_buffer = torch.empty_like(key_buffer)
        key_buffer[:und_len] = apply_rotary(k_for_gen, cos_und, sin_und)
        value_buffer[:und_len] = v
        keys.append(key_buffer)
        values.append(value_buffer)
        if index == last:
            # The last layer's und output feeds nothing the gen tower reads: stop at its K/V.
            break
        q = attn.norm_q(attn.to_q(normed).view(-1, attn.num_attention_heads, attn.head_dim))
        q = apply_rotary(q, cos_und, sin_und)
        k = apply_rotary(k, cos_und, sin_und)
        hidden = hidden + attn.to_out(attend_causal(q, k, v))
        hidden = hidden + layer.mlp(layer.post_attention_layernorm(hidden))
    return BranchPrefix(
        und_len=und_len,
        gen_len=gen_len,
        keys=keys,
        values=values,
        cos_gen=cos[und_len:].unsqueeze(1),
        sin_gen=sin[und_len:].unsqueeze(1),
    )


@torch.no_grad()
def gen_forward(transformer, prefix: BranchPrefix, gen_hidden: torch.Tensor) -> torch.Tensor:
    """Run the gen tower over `gen_hidden` [gen_len, hidden] and return its final-normed output."""
    und_len = prefix.und_len
    hidden = gen_hidden
    for layer, key_buffer, value_buffer in zip(transformer.layers, prefix.keys, prefix.values):
        attn = layer.self_attn
        normed = layer.input_layernorm_moe_gen(hidden)
        q = attn.norm_added_q(attn.add_q_proj(normed).view(-1, attn.num_attention_heads, attn.head_dim))
        k = attn.norm_added_k(attn.add_k_proj(normed).view(-1, attn.num_key_value_heads, attn.head_dim))
        key_buffer[und_len:] = apply_rotary(k, prefix.cos_gen, prefix.sin_gen)
        value_buffer[und_len:] = attn.add_v_proj(normed).view(-1, attn.num_key_value_heads, attn.head_dim)
        q = apply_rotary(q, prefix.cos_gen, prefix.sin_gen)
        hidden = hidden + attn.to_add_out(attend_prefix(q, key_buffer, value_buffer))
        hidden = hidden + layer.mlp_moe_gen(layer.post_attention_layernorm_moe_gen(hidden))
    return transformer.norm_moe_gen(hidden)
