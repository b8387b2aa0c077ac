"""Which backends each kernel op has, and whether a backend can run a given call.

An op (e.g. "prefix_attention") has backends, each registered by the module that holds its kernel (`register`, at
the end of that module): a name ("triton", "torch", "flash4", ...), `supported`, which takes the op's inputs and
returns None where the backend runs them or else the reason it does not, and `call`, which runs them (with
``config=`` where the backend is timed over launch configs). An op's order is its backends' `rank`, then their
registration: a tie in measured time keeps the earlier one, and an op chosen by rank takes the first supported. An op
that is timed also says, once, what its decisions are kept for (`describe`: the shape key of its inputs, and the
keyword its result is written to). `cosmos3_kernels.autotune` measures the supported backends and keeps the fastest;
`cosmos3_kernels.dispatch` is the gen tower's entry to it. The same shape as diffusers' attention-backend registry
and vLLM's attention backends.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class Backend:
    """One way to run one op. `reference`: the op's PyTorch path, which runs where no other may (one per op at
    most); `library`: another library's kernel, of which a config that fails to build is left out, not fatal;
    `forcible`: whether a forced mode may name it (the kernel dispatcher's modes force our own kernels only);
    `configs`: which launch-config list of the dispatcher it is timed over (None: one launch), and `fit_configs`
    (that list, the op's inputs) -> the ones usable for this call; `need_bytes` (the op's inputs) -> what its timing
    allocates beyond them (`cosmos3_kernels.autotune.sized`); `rank`: its place in the op's order (lower first).
    `call` takes the op's inputs and ``config=`` (None for a backend without configs). `load` (a library backend's):
    imports its library now and returns why it cannot run (None where it loaded), so that `load_libraries` can pay
    the import at start-up instead of inside the first call dispatch sends to it."""

    op: str
    name: str
    supported: Callable[..., str | None]
    call: Callable[..., object]
    reference: bool = False
    library: bool = False
    forcible: bool = True
    configs: str | None = None
    fit_configs: Callable[..., tuple] | None = None
    need_bytes: Callable[..., int] | None = None
    rank: int = 0
    load: Callable[[], str | None] | None = None


@dataclass(frozen=True)
class OpShape:
    """What an op's measured decision is kept for, and where it writes. `key` (the op's inputs) -> the shape after
    (op, device): dtypes, sizes, and whatever else changes which backend is fastest; `output`: the keyword its
    result is written to, where it takes one (timing writes a scratch tensor there, never into the inputs)."""

    key: Callable[..., tuple]
    output: str | None = None


_OPS: dict[str, list[Backend]] = {}
_SHAPES: dict[str, OpShape] = {}


def describe(op: str, *, key: Callable[..., tuple], output: str | None = None) -> OpShape:
    """Say what `op`'s decisions are kept for (`OpShape`); an op that is timed needs this once."""
    if op in _SHAPES:
        raise ValueError(f"op {op!r} is already described")
    _SHAPES[op] = OpShape(key, output)
    return _SHAPES[op]


def shape(op: str) -> OpShape:
    if op not in _SHAPES:
        raise ValueError(f"op {op!r} has no shape description (registry.describe); described: "
                         f"{', '.join(sorted(_SHAPES))}")
    return _SHAPES[op]


def register(op: str, name: str, *, supported: Callable[..., str | None], call: Callable[..., object],
             reference: bool = False, library: bool = False, forcible: bool = True, configs: str | None = None,
             fit_configs: Callable[..., tuple] | None = None, need_bytes: Callable[..., int] | None = None,
             rank: int = 0, load: Callable[[], str | None] | None = None) -> Backend:
    """Add backend `name` to `op` (a second backend of the same name, or a second reference, is refused)."""
    entries = _OPS.setdefault(op, [])
    if any(b.name == name for b in entries):
        raise ValueError(f"op {op!r} already has a backend {name!r}")
    if reference and any(b.reference for b in entries):
        raise ValueError(f"op {op!r} already has a reference backend; {name!r} cannot be a second")
    if load is not None and not library:
        raise ValueError(f"op {op!r}, backend {name!r}: only a library backend has a library to load")
    backend = Backend(op, name, supported, call, reference, library, forcible, configs, fit_configs, need_bytes,
                      rank, load)
    entries.append(backend)
    entries.sort(key=lambda b: b.rank)  # stable: registration order within a rank
    return backend


def load_libraries() -> dict[str, str | None]:
    """Import every library backend's library now (`Backend.load`). Importing flash-attn-4 or QuACK (the CuTe DSL,
    their torch custom ops) takes seconds, which a process would otherwise pay inside its first request.
    Returns "op/backend" -> None where the library loaded, else why the backend cannot run."""
    return {f"{op}/{b.name}": b.load() for op, entries in _OPS.items() for b in entries if b.load is not None}


def ops() -> tuple[str, ...]:
    return tuple(_OPS)


def backends(op: str) -> tuple[Backend, ...]:
    """`op`'s backends in its order; ValueError naming the known ops for an unknown one."""
    if op not in _OPS:
        raise ValueError(f"op {op!r} has no registered backends; known ops: {', '.join(sorted(_OPS))}")
    return tuple(_OPS[op])


def names(op: str) -> tuple[str, ...]:
    return tuple(b.name for b in backends(op))


def backend(op: str, name: str) -> Backend:
    for b in backends(op):
        if b.name == name:
            return b
    raise ValueError(f"op {op!r} has no backend {name!r}; allowed: {', '.join(names(op))}")


def reference(op: str) -> Backend | None:
    """`op`'s PyTorch reference, None where it has none (the FP8 attention's kernels)."""
    return next((b for b in backends(op) if b.reference), None)


def forcible(op: str) -> tuple[str, ...]:
    """The backends of `op` a forced mode may name."""
    return tuple(b.name for b in backends(op) if b.forcible)


def forced(op: str, mode: str) -> Backend:
    """The backend a forced `mode` names for `op`; ValueError naming the op, the mode and the backends allowed."""
    if mode not in forcible(op):
        raise ValueError(f"op {op!r}: forced backend {mode!r} is not one of its backends; allowed: "
                         f"{', '.join(forcible(op))} (or auto)")
    return backend(op, mode)
