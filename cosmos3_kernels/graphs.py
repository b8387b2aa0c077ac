"""The one way this project records a CUDA graph: on a side stream, as `torch.cuda.graph` does, without its
`gc.collect()` and `empty_cache()` before every capture.

Why not `torch.cuda.graph`: the engine captures a step per new prompt length and branch count, and the
dispatcher captures every kernel candidate of every shape mid-forward (`cosmos3_kernels.timing`); handing every
cached block back to the driver each time made the next request pay cudaMalloc for all of it again. The
engine decides itself when memory is short enough to free first (`engine.pipeline.fast_path.capture_graph`).
It lives in cosmos3_kernels/, the leaf, so the timing helper and the engine share it.
"""
from __future__ import annotations

from typing import Callable, TypeVar

import torch

T = TypeVar("T")


def capture(run: Callable[[], T], pool=None) -> tuple[torch.cuda.CUDAGraph, T]:
    """Capture `run()` (after the GPU's queued work is done) into a new graph; returns (graph, what `run` returned).
    `pool`: a `torch.cuda.graph_pool_handle()` to share, or None for the graph's own."""
    graph = torch.cuda.CUDAGraph()
    torch.cuda.synchronize()
    with torch.cuda.stream(torch.cuda.Stream()):
        graph.capture_begin(pool=pool)
        try:
            out = run()
        finally:
            graph.capture_end()
    return graph, out
