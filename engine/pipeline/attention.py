"""The one place where the engine picks an attention implementation.

The engine calls `attend_causal` (text tower, once per request and branch) and `attend_prefix` (gen
queries over the packed `[prefix | gen]` K/V, every step). Both take and return packed sequences
without a batch axis, laid out as diffusers lays them out, and use diffusers' own attention
dispatch so that the CPU path is numerically the reference's.
"""
from __future__ import annotations

import torch
from diffusers.models.attention_dispatch import dispatch_attention_fn


def attend_causal(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Causal GQA attention; q [N, Hq, D], k/v [N, Hkv, D] -> [N, Hq * D]."""
    out = dispatch_attention_fn(q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0), is_causal=True, enable_gqa=True)
    return out.squeeze(0).flatten(-2, -1)


def attend_prefix(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Non-causal GQA attention of gen queries over packed keys; q [N, Hq, D], k/v [P + N, Hkv, D]."""
    out = dispatch_attention_fn(q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0), is_causal=False, enable_gqa=True)
    return out.squeeze(0).flatten(-2, -1)
