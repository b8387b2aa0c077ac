"""How one request is spread over a group of N ranks (one process per GPU).

Two kinds of denoising step, each with its own layout of the group:
- **CFG steps** (both branches): the group splits in two halves, the conditional branch on ranks
  0..N/2-1 and the unconditional one on N/2..N-1; each half splits its branch's gen tokens over its
  ranks (Ulysses degree N/2). Each half keeps only its own branch's text K/V.
- **solo steps** (the conditional branch alone: guidance 1.0, distilled models, steps outside the
  guidance interval): every rank works on the one branch (Ulysses degree N), so the ranks that ran
  the unconditional branch are not idle.
On one rank both layouts have degree 1, which is the single-GPU engine.

Ulysses needs the degree to divide the query heads, and the key-value heads either to be divided by
it or to divide it (then each rank keeps a copy of the one key-value head its query heads read).
`check_group_size` refuses a group that breaks either rule before any process starts.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class StepLayout:
    """`branches` CFG branches side by side, each over `degree` consecutive ranks."""

    branches: int
    degree: int

    def branch_of(self, rank: int) -> int:
        return rank // self.degree

    def seq_rank(self, rank: int) -> int:
        return rank % self.degree

    @property
    def name(self) -> str:
        parts = []
        if self.branches > 1:
            parts.append(f"CFG {self.branches}")
        if self.degree > 1:
            parts.append(f"Ulysses {self.degree}")
        return " x ".join(parts) or "one rank"


@dataclass(frozen=True)
class ParallelPlan:
    """The layouts one request uses: `cfg` for steps with both branches, `solo` for the others."""

    world: int
    cfg: StepLayout | None
    solo: StepLayout | None
    weights: str = "replicated"  # or "sharded" (FSDP2, for models that do not fit one GPU)

    def layout(self, branches: int) -> StepLayout:
        chosen = self.cfg if branches == 2 else self.solo
        if chosen is None:
            raise ValueError(f"this request's plan has no layout for steps with {branches} branch(es)")
        return chosen

    def describe(self) -> str:
        steps = []
        if self.cfg is not None:
            steps.append(f"CFG steps: {self.cfg.name}")
        if self.solo is not None:
            steps.append(f"single-branch steps: {self.solo.name}")
        return f"{self.world} ranks, weights {self.weights}; " + "; ".join(steps)


def group_schemes(world: int) -> dict:
    """The two layouts a group of `world` ranks can run, as `/models` reports them."""
    return {"cfg_steps": cfg_layout(world).name, "single_branch_steps": StepLayout(1, world).name}


def cfg_layout(world: int) -> StepLayout:
    return StepLayout(2, world // 2) if world >= 2 else StepLayout(2, 1)


def choose_plan(world: int, cfg_steps: list[bool], weights: str = "replicated") -> ParallelPlan:
    """The plan for one request, from the group size and which steps run the unconditional branch."""
    cfg = cfg_layout(world) if any(cfg_steps) else None
    solo = StepLayout(1, world) if not all(cfg_steps) else None
    return ParallelPlan(world, cfg, solo, weights)


def ulysses_ok(degree: int, heads: int, kv_heads: int) -> bool:
    return heads % degree == 0 and (kv_heads % degree == 0 or degree % kv_heads == 0)


def check_group_size(world: int, heads: int, kv_heads: int, family: str = "this model") -> None:
    """Refuse a group size the model's heads cannot be split over, naming the sizes that work."""
    degrees = {world} | ({world // 2} if world >= 2 else set())
    if world >= 1 and (world == 1 or (world % 2 == 0 and all(ulysses_ok(d, heads, kv_heads) for d in degrees))):
        return
    allowed = [n for n in range(1, heads + 1) if n == 1 or (n % 2 == 0 and ulysses_ok(n, heads, kv_heads)
                                                             and ulysses_ok(n // 2, heads, kv_heads))]
    raise ValueError(
        f"gpus={world} cannot split {family}'s {heads} attention heads ({kv_heads} key-value heads) evenly; "
        f"allowed GPU counts: {allowed}."
    )


def kv_head_range(seq_rank: int, degree: int, kv_heads: int) -> tuple[int, int]:
    """The key-value heads a rank keeps: its share, or the one head its query heads read."""
    if kv_heads % degree == 0:
        per = kv_heads // degree
        return seq_rank * per, (seq_rank + 1) * per
    first = seq_rank * kv_heads // degree
    return first, first + 1


def token_split(total: int, degree: int) -> list[int]:
    """Token counts per rank, as even as they go (the first ranks take the remainder)."""
    base, extra = divmod(total, degree)
    return [base + (1 if i < extra else 0) for i in range(degree)]
