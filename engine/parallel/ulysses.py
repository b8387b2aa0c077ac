"""Ulysses sequence parallel: two all-to-alls around attention.

A rank holds a shard of the gen tokens with every head. Before attention one `all_to_all_single`
turns that into every gen token with its share of the heads (queries, and the key-value heads those
queries read); attention then runs unchanged over the rank's head share of the packed `[text | gen]`
K/V; after it a second all-to-all turns the result back into the rank's token shard. Norms and
rotary act per token and head, so they run on the shard before the exchange.

Shards may be uneven (the split sizes travel with the call), so any token count works. With fewer
key-value heads than ranks (GQA), each rank gets a copy of the one key-value head its query heads
read. Built on `torch.distributed.all_to_all_single` alone (NCCL on CUDA, gloo on the CPU).
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from .plan import token_split


class SeqExchange:
    """The all-to-alls of one rank in a sequence group of `degree` ranks over `total` gen tokens."""

    def __init__(self, group, seq_rank: int, degree: int, total: int, heads: int, kv_heads: int):
        self.group, self.seq_rank, self.degree = group, seq_rank, degree
        self.sizes = token_split(total, degree)
        self.start = sum(self.sizes[:seq_rank])
        self.stop = self.start + self.sizes[seq_rank]
        self.heads, self.kv_heads = heads, kv_heads
        # GQA with more ranks than key-value heads: send each rank its query heads' key-value head.
        self.kv_repeat = degree // kv_heads if kv_heads % degree else 1

    def shard(self, tensor: torch.Tensor) -> torch.Tensor:
        """This rank's rows of a tensor laid out over all gen tokens."""
        return tensor[self.start:self.stop]

    def _scatter_heads(self, x: torch.Tensor) -> torch.Tensor:
        """[n_local, H, D] -> [N, H / degree, D]."""
        n, heads, dim = x.shape
        share = heads // self.degree
        send = x.view(n, self.degree, share, dim).transpose(0, 1).contiguous().view(self.degree * n, share, dim)
        out = x.new_empty(sum(self.sizes), share, dim)
        dist.all_to_all_single(out, send, output_split_sizes=self.sizes, input_split_sizes=[n] * self.degree,
                               group=self.group)
        return out

    def to_heads(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor):
        """Queries, keys and values from the token shard to all tokens with this rank's heads."""
        if self.kv_repeat > 1:
            k, v = k.repeat_interleave(self.kv_repeat, dim=1), v.repeat_interleave(self.kv_repeat, dim=1)
        return self._scatter_heads(q), self._scatter_heads(k), self._scatter_heads(v)

    def to_seq(self, out: torch.Tensor) -> torch.Tensor:
        """Attention output [N, share * D] back to the token shard with every head, [n_local, H * D]."""
        share = self.heads // self.degree
        dim = out.shape[-1] // share
        n = self.sizes[self.seq_rank]
        received = out.new_empty(self.degree * n, share, dim)
        dist.all_to_all_single(received, out.reshape(-1, share, dim).contiguous(),
                               output_split_sizes=[n] * self.degree, input_split_sizes=self.sizes, group=self.group)
        return received.view(self.degree, n, share * dim).transpose(0, 1).reshape(n, self.heads * dim)
