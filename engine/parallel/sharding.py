"""Sharded weights for models that do not fit one GPU (Super): FSDP2 (`fully_shard`) per linear layer.

Why FSDP2 and not tensor parallel: a step of Super at 720p moves, per rank, half the gen tower's
weights once (FSDP2's all-gather, about 29 GB in bf16, overlapped with the previous layer's compute),
where tensor parallel would all-reduce the activations twice per layer (2 x 64 x 44k x 5120 x 2 bytes,
about 58 GB), and FSDP2 leaves the CFG-parallel and Ulysses layouts as they are, since every rank
still holds whole heads once a layer's weights are gathered. docs/perf-log/2026-12-02.md (Multi-GPU) has
what was measured.

Why per linear layer: the engine calls the layers' submodules directly (the prefix cache runs the
two towers separately), so each `nn.Linear` / `nn.Embedding` is its own FSDP unit and gathers its
weight in its own forward hook. Norms and the small custom heads stay whole on every rank.

The model is built with its parameters on the meta device, sharded, then each rank allocates and
fills only its own rows (from the checkpoint's safetensors slices, or random for benchmarks): the
whole model never exists on one GPU.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor


def _shard_rows(rows: int, world: int, rank: int) -> tuple[int, int]:
    """The rows of dim 0 FSDP2 gives `rank` (torch.chunk's split)."""
    chunks = torch.arange(rows).chunk(world)
    if rank >= len(chunks) or chunks[rank].numel() == 0:
        return 0, 0
    return int(chunks[rank][0]), int(chunks[rank][-1]) + 1


def build_sharded_transformer(config: dict, context, dtype: torch.dtype, fill):
    """A Cosmos3 transformer with every linear layer sharded over the group; `fill(name, local, rows)`
    writes each parameter's local rows (`rows` is None for a parameter kept whole)."""
    from accelerate import init_empty_weights
    from diffusers import Cosmos3OmniTransformer

    with init_empty_weights(include_buffers=False):
        transformer = Cosmos3OmniTransformer.from_config(config)
    transformer.to(dtype)
    transformer.time_embedder.float()  # diffusers keeps it in fp32 (`_keep_in_fp32_modules`)
    buffers = {name: buffer.clone() for name, buffer in transformer.named_buffers()}
    mesh = init_device_mesh(context.device.type, (context.world,))
    for module in transformer.modules():
        if isinstance(module, (torch.nn.Linear, torch.nn.Embedding)):
            fully_shard(module, mesh=mesh, reshard_after_forward=True)
    transformer.to_empty(device=context.device)
    with torch.no_grad():
        for name, buffer in transformer.named_buffers():
            buffer.copy_(buffers[name])
        for name, param in transformer.named_parameters():
            if isinstance(param, DTensor):
                fill(name, param.to_local(), _shard_rows(param.shape[0], context.world, context.rank))
            else:
                fill(name, param, None)
    return transformer.eval()


def checkpoint_filler(folder: Path):
    """Fill from a diffusers checkpoint folder, reading only this rank's rows of each sharded tensor."""
    from safetensors import safe_open

    index = {}
    for file in sorted(folder.glob("*.safetensors")):
        with safe_open(file, framework="pt") as handle:
            index.update({key: file for key in handle.keys()})

    def fill(name: str, local: torch.Tensor, rows) -> None:
        if name not in index:
            raise KeyError(f"{str(folder)!r} has no tensor {name!r}")
        with safe_open(index[name], framework="pt") as handle:
            piece = handle.get_slice(name)
            values = piece[rows[0]:rows[1]] if rows is not None else piece[:]
        local.copy_(values.to(local.dtype))

    return fill


def random_filler(rank: int, device: torch.device, std: float = 0.02):
    """Random weights for benchmarks, drawn on the rank's device: shards differ per rank; whole
    parameters are the same everywhere (one seed); norm weights near one so no weight path can hide."""
    whole = torch.Generator(device=device).manual_seed(0)
    shards = torch.Generator(device=device).manual_seed(1000 + rank)

    def fill(name: str, local: torch.Tensor, rows) -> None:
        generator = shards if rows is not None else whole
        values = torch.randn(local.shape, generator=generator, device=device, dtype=local.dtype).mul_(std)
        if "norm" in name and name.endswith("weight"):
            values.add_(1.0)
        local.copy_(values)

    return fill


def load_sharded(root, context, config=None):
    """`engine.load_model` for one rank of a group whose transformer is sharded."""
    from ..model.loader import load_in_process

    def transformer_loader(folder: Path, dtype: torch.dtype):
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
        return build_sharded_transformer(config, context, dtype, checkpoint_filler(folder))

    return load_in_process(root, device=str(context.device), transformer_loader=transformer_loader,
                      weight_shards=context.world, config=config)
