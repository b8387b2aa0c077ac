"""Layout of the per-layer packed K/V buffer shared by the gen tower's kernels.

One buffer per layer holds, for every CFG branch b, the rows ``[prefix_b | gen]``::

    kv_buffer: [2, total_rows, num_kv_heads, head_dim]    (plane 0 = K, plane 1 = V)
    branch b occupies rows [start_b, start_b + prefix_b + gen_len)
    its gen rows begin at gen_offset_b = start_b + prefix_b

The prefix (the und tower's K for gen, already normed and rotated, and V) is written once per request at
prefill; every denoising step writes only the gen rows, so no step concatenates or copies the prefix.
Rows are token-major (``[T, H, D]``), the layout the projections produce, so the per-step write is a
contiguous copy per token, and attention reads one head's rows at a fixed stride.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field

import torch


class DeviceLengths:
    """Device copies of a layout's row bookkeeping that keep their addresses while their values change.

    Why: a CUDA graph reads the index tensors it was captured with. When a layout carries these
    (`PackedKVLayout.lengths`), the kernels take every branch's start and length from them and nothing
    from host integers, so one captured step serves any prompt lengths that fit the buffer:
    `write(layout)` puts a new request's values in before the replay.
    """

    def __init__(self, layout: "PackedKVLayout", device: torch.device | str):
        self.num_branches = layout.num_branches
        values = _index_values(layout)
        # Each tensor its own allocation (kernels assume aligned index pointers); a new prompt's values come
        # over in one host-to-device copy to a staging tensor, then device-to-device copies (no host wait).
        self.tensors = {name: torch.tensor(v, dtype=torch.int32, device=device) for name, v in values.items()}
        self._staging = torch.empty(sum(len(v) for v in values.values()), dtype=torch.int32, device=device)

    def write(self, layout: "PackedKVLayout") -> None:
        """Copy `layout`'s starts, lengths and offsets in (same branch count), ordered on the current stream
        before any replay that reads them."""
        if layout.num_branches != self.num_branches:
            raise ValueError(f"DeviceLengths holds {self.num_branches} branches, got a layout with {layout.num_branches}")
        values = _index_values(layout)
        self._staging.copy_(torch.tensor([v for row in values.values() for v in row], dtype=torch.int32))
        start = 0
        for name, row in values.items():
            self.tensors[name].copy_(self._staging[start: start + len(row)])
            start += len(row)


@dataclass(frozen=True)
class PackedKVLayout:
    """Row bookkeeping for branches with differing prefix lengths and one shared gen length.

    `capacity_rows` (default: exactly `total_rows`) lets the buffer hold more rows than these lengths
    need, and `kv_len_bound` (default: `max_kv_len`) is what the kernels size their launch by, so that
    any prompt whose longest branch fits the bound launches the same way. `lengths` (not part of the
    value: equal layouts compare equal with or without it) are device tensors the kernels then read
    instead of the cached ones: see `DeviceLengths`.
    """

    prefix_lens: tuple[int, ...]
    gen_len: int
    capacity_rows: int = 0
    kv_len_bound: int = 0
    lengths: DeviceLengths | None = field(default=None, compare=False, hash=False, repr=False)

    def __post_init__(self) -> None:
        if not self.prefix_lens:
            raise ValueError("PackedKVLayout needs at least one branch, got prefix_lens=()")
        if any(int(p) < 0 for p in self.prefix_lens):
            raise ValueError(f"prefix lengths must be >= 0, got {self.prefix_lens}")
        if int(self.gen_len) < 1:
            raise ValueError(f"gen_len must be >= 1, got {self.gen_len}")
        object.__setattr__(self, "prefix_lens", tuple(int(p) for p in self.prefix_lens))
        object.__setattr__(self, "gen_len", int(self.gen_len))
        if self.capacity_rows and self.capacity_rows < self.total_rows:
            raise ValueError(f"capacity_rows {self.capacity_rows} is less than the {self.total_rows} rows of {self.prefix_lens}"
                             f" + {self.gen_len} gen tokens per branch")
        if self.kv_len_bound and self.kv_len_bound < self.max_kv_len:
            raise ValueError(f"kv_len_bound {self.kv_len_bound} is less than the longest branch's {self.max_kv_len} keys")
        if self.lengths is not None and self.lengths.num_branches != self.num_branches:
            raise ValueError(f"lengths hold {self.lengths.num_branches} branches, the layout has {self.num_branches}")

    @property
    def rows(self) -> int:
        """Rows of the buffer: `capacity_rows` if set, else exactly `total_rows`."""
        return max(self.total_rows, self.capacity_rows)

    @property
    def kv_len_limit(self) -> int:
        """What launches are sized by (flash-attn-4's max_seqlen_k, the Triton key tile, dispatch's bucket)."""
        return self.kv_len_bound or self.max_kv_len

    @property
    def num_branches(self) -> int:
        return len(self.prefix_lens)

    def kv_len(self, branch: int) -> int:
        return self.prefix_lens[branch] + self.gen_len

    @property
    def max_kv_len(self) -> int:
        """The longest branch's key rows (varlen attention's max_seqlen_k; dispatch's shape bucket)."""
        return max(self.prefix_lens) + self.gen_len

    def branch_start(self, branch: int) -> int:
        return sum(self.kv_len(b) for b in range(branch))

    def gen_offset(self, branch: int) -> int:
        return self.branch_start(branch) + self.prefix_lens[branch]

    @property
    def total_rows(self) -> int:
        return self.branch_start(self.num_branches)

    @property
    def uniform_prefix(self) -> bool:
        return len(set(self.prefix_lens)) == 1

    def allocate(
        self, num_kv_heads: int, head_dim: int, *, dtype: torch.dtype, device: torch.device | str
    ) -> torch.Tensor:
        """One layer's buffer, ``[2, rows, num_kv_heads, head_dim]`` (uninitialised: every kernel reads only
        a branch's own rows, or masks the scores and zeroes the values of any other rows a tile reaches)."""
        return torch.empty(2, self.rows, num_kv_heads, head_dim, dtype=dtype, device=device)

    def check_buffer(self, kv_buffer: torch.Tensor) -> None:
        if kv_buffer.dim() != 4 or kv_buffer.shape[0] != 2 or kv_buffer.shape[1] != self.rows:
            raise ValueError(
                f"kv_buffer must be [2, {self.rows}, kv_heads, head_dim] for {self}, "
                f"got {tuple(kv_buffer.shape)}"
            )
        if kv_buffer.stride(-1) != 1:
            raise ValueError(f"kv_buffer's last dim must be contiguous, got strides {kv_buffer.stride()}")

    def branch_kv(self, kv_buffer: torch.Tensor, branch: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Views ``(K, V)`` of branch ``branch``'s whole ``[prefix | gen]`` rows, each ``[L+N, H, D]``."""
        start = self.branch_start(branch)
        stop = start + self.kv_len(branch)
        return kv_buffer[0, start:stop], kv_buffer[1, start:stop]

    def write_prefix(
        self, kv_buffer: torch.Tensor, branch: int, k_prefix: torch.Tensor, v_prefix: torch.Tensor
    ) -> None:
        """Prefill: copy one branch's prefix K (normed, rotated) and V into the buffer, once per request."""
        self.check_buffer(kv_buffer)
        start = self.branch_start(branch)
        length = self.prefix_lens[branch]
        expected = (length, kv_buffer.shape[2], kv_buffer.shape[3])
        if tuple(k_prefix.shape) != expected or tuple(v_prefix.shape) != expected:
            raise ValueError(
                f"branch {branch} prefix K/V must be {expected}, got {tuple(k_prefix.shape)} / {tuple(v_prefix.shape)}"
            )
        kv_buffer[0, start : start + length].copy_(k_prefix)
        kv_buffer[1, start : start + length].copy_(v_prefix)

    def index_tensors(
        self, device: torch.device | str
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(branch_starts, kv_lens, gen_offsets, longest_first)`` as int32 device tensors, once per device.

        ``longest_first`` lists the branches by decreasing key count (the launch order for attention).

        Why cached: a fresh host-to-device copy per layer per step would cost a launch and a pageable copy
        36 times a step, and could not be captured in a CUDA graph.
        """
        if self.lengths is not None:
            t = self.lengths.tensors
            return t["starts"], t["lens"], t["gen_offsets"], t["longest_first"]
        return _index_tensors(self, str(torch.device(device)))

    def cu_seqlens(self, device: torch.device | str) -> tuple[torch.Tensor, torch.Tensor]:
        """``(cu_seqlens_q, cu_seqlens_k)``: int32 [branches + 1] offsets, as varlen attention takes them.

        The packed buffer is already the varlen layout: branch b's keys are rows ``cu_k[b]:cu_k[b+1]``
        and its queries are rows ``b*N:(b+1)*N`` of q flattened to ``[B*N, H, D]``. Cached per device for
        the reasons ``index_tensors`` gives.
        """
        if self.lengths is not None:
            return self.lengths.tensors["cu_q"], self.lengths.tensors["cu_k"]
        return _cu_seqlens(self, str(torch.device(device)))


def kv_len_bucket(kv_len: int) -> int:
    """`kv_len` rounded up to a power of two: dispatch measures once per bucket, and a K/V cache with its
    lengths on the device is sized by it (`engine.pipeline.transformer.allocate_cache`)."""
    return 1 << (kv_len - 1).bit_length()


def _index_values(layout: PackedKVLayout) -> dict[str, list[int]]:
    """Every index tensor's values, by name (one table for the cached tensors and `DeviceLengths`)."""
    branches = range(layout.num_branches)
    return {
        "starts": [layout.branch_start(b) for b in branches],
        "lens": [layout.kv_len(b) for b in branches],
        "gen_offsets": [layout.gen_offset(b) for b in branches],
        "longest_first": sorted(branches, key=lambda b: -layout.kv_len(b)),
        "cu_q": [b * layout.gen_len for b in range(layout.num_branches + 1)],
        "cu_k": [layout.branch_start(b) for b in range(layout.num_branches + 1)],
    }


@functools.lru_cache(maxsize=64)
def _index_tensors(
    layout: PackedKVLayout, device: str
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    values = _index_values(layout)
    return tuple(torch.tensor(values[name], dtype=torch.int32, device=device)
                 for name in ("starts", "lens", "gen_offsets", "longest_first"))


@functools.lru_cache(maxsize=64)
def _cu_seqlens(layout: PackedKVLayout, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    values = _index_values(layout)
    return (torch.tensor(values["cu_q"], dtype=torch.int32, device=device),
            torch.tensor(values["cu_k"], dtype=torch.int32, device=device))
