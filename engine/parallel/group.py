"""One rank's view of its group, and the two stage hooks that spread a request over it.

Every rank runs the same stages on the same request in lockstep (`engine.pipeline.run.generate`); the
loaded model's `parallel` field holds a `GroupContext`, which gives two stages what they need (the pipeline's
`engine.pipeline.state.TowerGroup`, so the pipeline never imports this floor):
- prefill (`GroupContext.prefill`): every rank runs the text tower for every branch of the request (the
  same module calls on every rank, which sharded weights need), and keeps only the head share of the
  branch it serves;
- the tower stage (`GroupContext.gen_tower`, a `GroupGenTower`): called, like the one-GPU towers, with the
  whole step's gen tokens and returning every branch's whole output, so the denoising loop, the guidance and
  the scheduler run unchanged and identically on every rank. Inside, the rank runs its branch on its token shard
  (Ulysses around attention) and one all-gather collects the shards of both branches.
Decoding and saving happen on rank 0 only.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field, replace

import torch
import torch.distributed as dist

from cosmos3_kernels.packed_kv import PackedKVLayout

from ..pipeline.fast_path import FastGenTower, FastPathOptions
from ..pipeline.state import Branch
from ..pipeline.transformer import GenRotary, KVCache, allocate_cache, gen_forward, prefill
from .plan import StepLayout, cfg_layout, choose_plan, kv_head_range
from .ulysses import SeqExchange


@dataclass
class GroupContext:
    """Rank, size and process groups of one rank; made once per worker process."""

    rank: int
    world: int
    device: torch.device
    weights: str = "replicated"
    seq_groups: dict = field(default_factory=dict)  # (branches, branch index) -> process group
    local_cancel: object = None  # rank 0: the job's cancel event (set by the app); other ranks: None
    cancelled: bool = False

    @property
    def is_leader(self) -> bool:
        return self.rank == 0

    @classmethod
    def create(cls, rank: int, world: int, device: torch.device, weights: str = "replicated") -> "GroupContext":
        """Make the CFG halves' groups; every rank must call this in the same order (new_group is collective)."""
        context = cls(rank, world, device, weights)
        context.seq_groups[(1, 0)] = dist.group.WORLD
        half = cfg_layout(world)
        for branch in range(2):
            ranks = list(range(branch * half.degree, (branch + 1) * half.degree))
            group = dist.new_group(ranks) if half.degree > 1 else None
            context.seq_groups[(2, branch)] = group
        return context

    def exchange(self, layout: StepLayout, total: int, heads: int, kv_heads: int) -> SeqExchange:
        group = self.seq_groups[(layout.branches, layout.branch_of(self.rank))]
        return SeqExchange(group, layout.seq_rank(self.rank), layout.degree, total, heads, kv_heads)

    def start_job(self, local_cancel) -> "GroupCancel":
        self.local_cancel, self.cancelled = local_cancel, False
        return GroupCancel(self)

    def poll_cancel(self) -> bool:
        """Collective, once per step on every rank: rank 0's cancel flag, so all ranks stop at the same step."""
        local = self.is_leader and self.local_cancel is not None and self.local_cancel.is_set()
        flag = torch.tensor([1 if local else 0], dtype=torch.int32, device=self.device)
        dist.broadcast(flag, src=0)
        self.cancelled = bool(flag.item())
        return self.cancelled

    def prefill(self, model, branches: list[Branch], gen_len: int) -> "GroupPrefix":
        """The prefill stage's hook: every branch's text tower on this rank (`GroupPrefix`)."""
        return GroupPrefix(model, branches, gen_len)

    def gen_tower(self, model, prefix: "GroupPrefix", options: FastPathOptions, *, round_qk_norm: bool,
                  fuse_mlp_activation: bool, fuse_residual_add: bool) -> "GroupGenTower":
        """The tower stage's hook: the group's gen tower over `prefix`."""
        return GroupGenTower(model, prefix, options, round_qk_norm=round_qk_norm,
                             fuse_mlp_activation=fuse_mlp_activation, fuse_residual_add=fuse_residual_add)

    def gather_branches(self, layout: StepLayout, out: torch.Tensor, sizes: list[int]) -> list[torch.Tensor]:
        """Every rank's output shard to every rank; returns each branch's whole gen output."""
        width = out.shape[-1]
        padded = out.new_zeros(max(sizes), width)
        padded[: out.shape[0]] = out
        shards = [torch.empty_like(padded) for _ in range(self.world)]
        dist.all_gather(shards, padded)
        outs = []
        for branch in range(layout.branches):
            first = branch * layout.degree
            outs.append(torch.cat([shards[first + i][: sizes[i]] for i in range(layout.degree)]))
        return outs


class GroupCancel:
    """The `cancel` a rank hands to `generate`: the flag all ranks agreed on at the last step.

    Why not the app's event itself: ranks would read it at different moments, one would stop while
    another waits in a collective for it.
    """

    def __init__(self, context: GroupContext):
        self.context = context

    def is_set(self) -> bool:
        return self.context.cancelled


@dataclass
class RankCache:
    """One layout's K/V on this rank: its branch's text K/V (its head share) and its gen rows."""

    cache: KVCache  # one branch
    rotary: GenRotary  # this rank's token rows
    exchange: SeqExchange
    layout: StepLayout
    branch: Branch  # the request's branch this rank serves, with this rank's rotary rows
    fast: FastGenTower | None = None  # where the rank runs a whole branch


class GroupPrefix:
    """Every branch's full-head text K/V (prefix rows only), from which each layout takes its share."""

    def __init__(self, model, branches: list[Branch], gen_len: int):
        self.model, self.branches, self.gen_len = model, branches, gen_len
        self.prefixes, self.rotaries = [], []
        for branch in branches:
            # gen_len 1: only the text rows are kept here; each layout allocates its own gen rows.
            cache = allocate_cache(model.transformer, (len(branch.token_ids),), 1)
            ids = torch.tensor(branch.token_ids, dtype=torch.long, device=model.device)
            self.rotaries.append(prefill(model.transformer, cache, 0, ids, branch.position_ids))
            self.prefixes.append(cache)
        self.rank_caches: dict[int, RankCache] = {}

    def for_layout(self, layout: StepLayout, context: GroupContext) -> RankCache:
        """This rank's cache for a layout, built on first use from the kept text K/V."""
        if layout.branches in self.rank_caches:
            return self.rank_caches[layout.branches]
        branch = layout.branch_of(context.rank)
        attn = self.model.transformer.layers[0].self_attn
        heads, kv_heads = attn.num_attention_heads, attn.num_key_value_heads
        exchange = context.exchange(layout, self.gen_len, heads, kv_heads)
        first, last = kv_head_range(layout.seq_rank(context.rank), layout.degree, kv_heads)
        prefix_len = len(self.branches[branch].token_ids)
        packed = PackedKVLayout((prefix_len,), self.gen_len)
        buffers = []
        for source in self.prefixes[branch].buffers:
            buffer = packed.allocate(last - first, attn.head_dim, dtype=source.dtype, device=source.device)
            buffer[:, :prefix_len] = source[:, :prefix_len, first:last]
            buffers.append(buffer)
        rotary = self.rotaries[branch]
        local = GenRotary(exchange.shard(rotary.cos), exchange.shard(rotary.sin))
        served = replace(self.branches[branch], index=0, rotary=local)
        self.rank_caches[layout.branches] = RankCache(KVCache(packed, buffers), local, exchange, layout, served)
        return self.rank_caches[layout.branches]


class GroupGenTower:
    """The gen tower over the group, with the one-GPU towers' call: (tokens, branch count) -> outputs
    (`engine.pipeline.tower.GenTower`)."""

    kind = "group"
    passes: tuple[str, ...] = ()

    def __init__(self, model, prefix: GroupPrefix, options: FastPathOptions, *, round_qk_norm: bool,
                 fuse_mlp_activation: bool = False, fuse_residual_add: bool = False):
        self.model, self.prefix = model, prefix
        self.options = options  # the request's fast-path switches (engine.pipeline.fast_path), read once
        self.round_qk_norm = round_qk_norm  # engine.pipeline.fast_path.rounds_qk_norm, for a rank's fast tower
        self.fuse_mlp_activation = fuse_mlp_activation  # engine.pipeline.fast_path.fuses_mlp_activation, likewise
        self.fuse_residual_add = fuse_residual_add  # engine.pipeline.fast_path.fuses_residual_add, likewise
        self.context: GroupContext = model.parallel
        self.ops: Counter = Counter()  # a rank's own fast tower counts its ops (`RankCache.fast`)

    def __call__(self, tokens: torch.Tensor, count: int) -> list[torch.Tensor]:
        self.context.poll_cancel()
        steps = [count == 2]
        layout = choose_plan(self.context.world, steps, self.context.weights).layout(count)
        part = self.prefix.for_layout(layout, self.context)
        shard = part.exchange.shard(tokens)
        fast = self._fast_tower(part) if layout.degree == 1 else None
        if fast is not None:  # a whole branch on this rank: the one-GPU fast path as it is
            out = fast(shard, 1)[0]
        else:
            exchange = part.exchange if layout.degree > 1 else None
            out = gen_forward(self.model.transformer, part.cache, 0, part.rotary, shard, exchange)
        return self.context.gather_branches(layout, out, part.exchange.sizes)

    def _fast_tower(self, part: RankCache) -> FastGenTower | None:
        if not self.options.enabled or self.context.weights != "replicated":
            return None  # fused projections would read sharded weights
        if part.fast is None:
            part.fast = FastGenTower(self.model, part.cache, [part.branch], self.options,
                                     round_qk_norm=self.round_qk_norm,
                                     fuse_mlp_activation=self.fuse_mlp_activation,
                                     fuse_residual_add=self.fuse_residual_add)
        return part.fast
