"""Opt-in FP8 GEMMs for the gen tower, through torchao's float8 (a switchable pass; off by default).

What it changes: every GEMM of the gen tower that runs per step (fused q|k|v, attention output,
fused gate|up or ReLU² up, down) becomes a row-wise scaled float8 (e4m3) GEMM with dynamically
quantised activations (`torchao.quantization.Float8DynamicActivationFloat8WeightConfig` with
`PerRow` granularity), Hopper's FP8 tensor cores through `torch._scaled_mm`. The text tower (once per
request), the embeddings and the output projection stay bf16. The result is approximate, so it is
never on unless asked for (`COSMOS3_FP8=1` or `FastPathOptions(fp8=True)`) and every result made
with it says so: `FP8_LABEL` as the result's `precision`, in its summary (the API's answer) and sidecar.

Numeric gate (tests/test_gpu_fp8.py, full-size random weights on the H200): one step's velocity
against an fp32 forward of the same weights stays within 3x the relative error of diffusers' own
bf16 forward against that fp32 forward.

Memory: the float8 weights are a second set beside the bf16 ones (requests without FP8 and the exact
path keep running bf16), so FP8 adds about half the gen tower's bf16 bytes rather than saving them.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

FP8_LABEL = "FP8 (faster, approximate)"
BF16_LABEL = "bf16"


class FP8Unavailable(RuntimeError):
    """FP8 was asked for where it cannot run; the message says what is missing."""


def check_available(device) -> None:
    """Raise `FP8Unavailable` unless this device and environment can run torchao's float8 GEMMs."""
    device = torch.device(device)
    if device.type != "cuda":
        raise FP8Unavailable(f"FP8 needs a CUDA GPU with FP8 tensor cores (compute capability >= 8.9); "
                             f"this model runs on {device.type!r}.")
    capability = torch.cuda.get_device_capability(device)
    if capability < (8, 9):
        raise FP8Unavailable(f"FP8 needs compute capability >= 8.9 (Ada, Hopper or newer); "
                             f"{torch.cuda.get_device_name(device)} has {capability[0]}.{capability[1]}.")
    try:
        import torchao  # noqa: F401
    except ImportError as error:
        raise FP8Unavailable("FP8 needs the optional package torchao (requirements-extras.txt); "
                             f"it is not installed: {error}") from error


def _config():
    from torchao.quantization import Float8DynamicActivationFloat8WeightConfig, PerRow

    return Float8DynamicActivationFloat8WeightConfig(granularity=PerRow())


def quantize_weight(weight: torch.Tensor) -> torch.Tensor:
    """One bf16 weight [out, in] -> torchao's float8 weight tensor (F.linear on it runs the FP8 GEMM)."""
    from torchao.quantization import quantize_

    linear = torch.nn.Linear(weight.shape[1], weight.shape[0], bias=False, device=weight.device, dtype=weight.dtype)
    linear.weight = torch.nn.Parameter(weight.detach(), requires_grad=False)
    quantize_(linear, _config())
    return linear.weight


@dataclass
class FP8Weights:
    """The gen tower's per-step GEMM weights in float8, beside (not instead of) the bf16 ones."""

    qkv: list
    gate_up: list
    per_layer: list[dict]  # {"to_add_out", "down_proj", and for ReLU² "up_proj"}


def fp8_weights(model, fused) -> FP8Weights:
    """Quantise once per loaded model and keep the result on it; the bf16 weights are untouched, so a
    request without FP8 (or the exact path) still runs bf16. `fused`: the model's fused projections
    (`engine.pipeline.fast_path.fused_projections`), quantised as they are."""
    if model.fp8_weights is None:
        check_available(model.device)
        per_layer = []
        for layer in model.transformer.layers:
            attn, mlp = layer.self_attn, layer.mlp_moe_gen
            weights = {"to_add_out": quantize_weight(attn.to_add_out.weight),
                       "down_proj": quantize_weight(mlp.down_proj.weight)}
            if mlp.hidden_act != "silu":
                weights["up_proj"] = quantize_weight(mlp.up_proj.weight)
            per_layer.append(weights)
        model.fp8_weights = FP8Weights(
            qkv=[quantize_weight(w) for w in fused.qkv],
            gate_up=[None if w is None else quantize_weight(w) for w in fused.gate_up], per_layer=per_layer)
    return model.fp8_weights


