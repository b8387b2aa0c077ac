"""A request's GPU memory on one device: the plan, the refusal, and where the text tower's weights live.

Why: Super in FP8 on one H200 holds ~104 GiB of weights, and at 1280x720/189f its request needs ~22 GiB of
packed K/V (64 layers, both CFG branches) and ~15 GiB for a step's MLP on top: over the 139.8 GiB the card has.
But the text ("und") tower runs once per request, in the prefill, and ~60 GiB of those weights are its own. So
where a request does not fit with them on the GPU, they wait in pinned host memory through the denoising loop
(`TextTower`: one pinned copy on the host, made once at load, 38-48 s; the GPU copy made again for each request's
prefill and dropped after it: that prefill stage took 1.85 s warm at 720p, the copy included). A request that
does not fit even so is refused before anything runs, naming the sizes that would (`RequestTooLarge`).

The plan (`request_memory`) counts what the fast gen tower holds, by the model's dimensions: the weights (the
tensors themselves), the K/V buffers (`engine.pipeline.transformer.allocate_cache`'s sizing), a step at its
peak (the MLP: the stream, its norm, the input GEMM's output and the activation, both branches' rows), the
text tower's activations, and the VAE decode (12.7 GiB at 1280x720x189 on an H200, cosmos3.md section 3, scaled
by pixels). Dispatch's first-step timing takes only what is left over (`cosmos3_kernels.dispatch`, its budget).
"""
from __future__ import annotations

import gc
import logging
import math
from dataclasses import dataclass

import torch

from ..model.defaults import sampling_limits
from .decode import decoded_frames

log = logging.getLogger(__name__)

GIB = 2**30
# Kept free of the plan: the CUDA context's and libraries' workspaces, the caching allocator's rounding.
HEADROOM_BYTES = 2 * GIB
HEADROOM_SHARE = 0.03
# The full-size Wan2.2 decode of 1280x720x189 peaked at 12.7 GiB (cosmos3.md section 3): bytes per output pixel.
DECODE_BYTES_PER_PIXEL = 12.7 * GIB / (1280 * 720 * 189)
DECODE_MIN_BYTES = GIB
# The prompt a plan assumes where none is given: a typical JSON caption and the default (empty) negative.
PLAN_PREFIXES = (1615, 64)
# The und tower's Linear layers in each decoder layer (the gen tower's are add_*_proj, to_add_out, mlp_moe_gen).
TEXT_TOWER_ATTENTION = ("to_q", "to_k", "to_v", "to_out")


class RequestTooLarge(ValueError):
    """A request whose planned peak memory exceeds the GPU's; the message names what fits, `field` the request field
    to change (the job queue shows it beside that field)."""

    def __init__(self, message: str, field: str):
        super().__init__(message)
        self.field = field


def tensor_bytes(tensors) -> int:
    """Bytes of `tensors`, each storage once (views of one fused weight count once), a tensor subclass (torchao's
    float8 weights) by the plain tensors it holds."""
    seen, total = set(), 0
    stack = list(tensors)
    while stack:
        t = stack.pop()
        if type(t) not in (torch.Tensor, torch.nn.Parameter) and hasattr(t, "__tensor_flatten__"):
            names, _ = t.__tensor_flatten__()
            stack.extend(getattr(t, name) for name in names)
            continue
        storage = t.untyped_storage()
        key = (t.device, storage.data_ptr())
        if key not in seen:
            seen.add(key)
            total += storage.nbytes()
    return total


def text_tower_parameters(transformer) -> list[torch.nn.Parameter]:
    """The weights only the text tower reads: the token embedding, and each layer's und attention and MLP."""
    params = list(transformer.embed_tokens.parameters())
    for layer in transformer.layers:
        for name in TEXT_TOWER_ATTENTION:
            params.extend(getattr(layer.self_attn, name).parameters())
        params.extend(layer.mlp.parameters())
    return params


class TextTower:
    """The text tower's weights in pinned host memory, and their GPU copy made for a prefill and dropped after it.
    Made once per loaded model (`offloadable_text_tower`); the parameters keep their identity, only their data
    moves (`Parameter.data`), so every module reads them as before."""

    def __init__(self, transformer, device):
        self.device = torch.device(device)
        self.params = text_tower_parameters(transformer)
        self.host = []
        for param in self.params:
            # Pinned, so that each prefill's copy to the GPU runs at the link's speed (pinning needs CUDA).
            host = torch.empty(param.shape, dtype=param.dtype, device="cpu", pin_memory=torch.cuda.is_available())
            host.copy_(param.data)
            self.host.append(host)
        self.bytes = sum(h.numel() * h.element_size() for h in self.host)
        self.on_gpu = True  # the parameters' own data is the device copy until `release`

    def to_gpu(self) -> None:
        """The GPU copy for a prefill (from pinned memory, queued on the current stream before the prefill's work)."""
        if not self.on_gpu:
            for param, host in zip(self.params, self.host):
                param.data = host.to(self.device, non_blocking=True)
            self.on_gpu = True

    def release(self) -> None:
        """Drop the GPU copy: the host copy is the weights again (the caching allocator reuses the freed blocks)."""
        if self.on_gpu:
            for param, host in zip(self.params, self.host):
                param.data = host
            self.on_gpu = False
            if self.device.type == "cuda":
                torch.cuda.empty_cache()  # the freed pages back to the driver, for the step's large blocks


@dataclass(frozen=True)
class RequestMemory:
    """A request's planned bytes on the GPU, by what holds them."""

    label: str
    weights: int  # on the GPU for the whole request, the text tower's aside
    text_tower: int
    kv_cache: int
    step: int  # the gen tower's step at its peak (both branches' rows)
    prefill: int  # the text tower's activations
    decode: int

    def peak(self, text_on_gpu: bool) -> int:
        """The largest of the prefill (the text tower always on the GPU for it), the step and the decode."""
        text = self.text_tower if text_on_gpu else 0
        return max(self.weights + self.text_tower + self.kv_cache + self.prefill,
                   self.weights + text + self.kv_cache + self.step,
                   self.weights + text + self.kv_cache + self.decode)

    def describe(self, text_on_gpu: bool) -> str:
        where = "on the GPU" if text_on_gpu else "on the host after the prefill"
        return (f"{self.label}: peak {self.peak(text_on_gpu) / GIB:.1f} GiB (weights {self.weights / GIB:.1f}, text "
                f"tower {self.text_tower / GIB:.1f} {where}, K/V {self.kv_cache / GIB:.1f}, step "
                f"{self.step / GIB:.1f}, decode {self.decode / GIB:.1f})")


def gen_tokens(width: int, height: int, frames: int) -> int:
    """Vision tokens of one branch: latent frames x the patch grid (2x2 patches of the 16x latent)."""
    return ((frames - 1) // 4 + 1) * math.ceil(height / 32) * math.ceil(width / 32)


def _kv_rows(prefixes: tuple[int, ...], gen_len: int) -> int:
    """Rows of one layer's packed K/V buffer (`allocate_cache`): exact, or a capacity where the step is kept."""
    from cosmos3_kernels.packed_kv import kv_len_bucket

    from .fast_path import GRAPH_MAX_GEN_TOKENS
    from .whole_step import KEPT_MAX_GEN_TOKENS, KEPT_PROMPT_TOKENS

    if gen_len * len(prefixes) <= min(KEPT_MAX_GEN_TOKENS, GRAPH_MAX_GEN_TOKENS):
        return len(prefixes) * kv_len_bucket(max(max(prefixes) + gen_len, gen_len + KEPT_PROMPT_TOKENS))
    return sum(prefixes) + len(prefixes) * gen_len


def _step_bytes_per_row(config, fp8_in: bool) -> int:
    """A step's live bytes per gen row at its peak: the attention's (stream, norm, q|k|v, rotated q, output) or
    the MLP's (stream, norm, the input GEMM's output, the activation; an FP8 input's copy), the larger."""
    hidden, inner = config.hidden_size, config.intermediate_size
    q_width = config.num_attention_heads * config.head_dim
    kv_width = config.num_key_value_heads * config.head_dim
    attention = 2 * (2 * hidden + 3 * q_width + 2 * kv_width)
    gemm_out = 2 * inner if config.hidden_act == "silu" else inner
    mlp = 2 * (2 * hidden + gemm_out + inner) + (hidden if fp8_in else 0)
    return max(attention, mlp) + 2 * 2 * hidden  # the step's gen tokens and its output rows


def model_weight_bytes(model, text_tower: TextTower | None) -> tuple[int, int]:
    """(bytes on the GPU through a request except the text tower's, the text tower's bytes); counted once per model
    and set of FP8 weights (kept on the model: a count walks every tensor, a few ms on a full-size model)."""
    key = (id(model.runtime.fp8_weights), id(text_tower))
    held = getattr(model, "weight_bytes", None)
    if held is not None and held[0] == key:
        return held[1]
    counted = _count_weight_bytes(model, text_tower)
    model.weight_bytes = (key, counted)
    return counted


def _count_weight_bytes(model, text_tower: TextTower | None) -> tuple[int, int]:
    text = text_tower_parameters(model.transformer)
    text_ids = {id(p) for p in text}
    parts = [p for p in model.transformer.parameters() if id(p) not in text_ids]
    parts += list(model.transformer.buffers())
    for module in (model.vae, model.sound_tokenizer):
        if module is not None:
            parts += list(module.parameters())
    held = model.runtime.fp8_weights
    if held is not None and not held.resident:  # FP8 weights kept beside the bf16 ones
        parts += [w for w in held.qkv + held.gate_up if w is not None]
        parts += [w for layer in held.per_layer for w in layer.values() if w is not None]
    text_bytes = text_tower.bytes if text_tower is not None else tensor_bytes(text)
    device_type = torch.device(model.device).type if model.device is not None else "cuda"
    return tensor_bytes(t for t in parts if t.device.type == device_type), text_bytes


def request_memory(model, width: int, height: int, frames: int, prefixes: tuple[int, ...] = PLAN_PREFIXES,
                   text_tower: TextTower | None = None) -> RequestMemory:
    """The plan of one request on `model` (`prefixes`: each CFG branch's text tokens; one for no CFG)."""
    config = model.transformer.config
    gen_len = gen_tokens(width, height, frames)
    rows = len(prefixes) * gen_len
    fp8 = model.runtime.fp8_weights
    fp8_in = fp8 is not None and "in" in fp8.policy.gemms
    layers, kv_width = config.num_hidden_layers, config.num_key_value_heads * config.head_dim
    weights, text = model_weight_bytes(model, text_tower if text_tower is not None else model.text_tower)
    step = rows * _step_bytes_per_row(config, fp8_in)
    from .fast_path import GRAPH_MAX_GEN_TOKENS

    if rows <= GRAPH_MAX_GEN_TOKENS:
        step *= 2  # the eager run that measures, and the captured graph's own pool
    return RequestMemory(
        label=f"{width}x{height}" + (f"/{frames}f" if frames > 1 else ""),
        weights=weights, text_tower=text, kv_cache=layers * 2 * _kv_rows(tuple(prefixes), gen_len) * kv_width * 2,
        step=step, prefill=max(prefixes) * (8 * config.hidden_size + 6 * config.intermediate_size),
        decode=max(DECODE_MIN_BYTES, int(width * height * frames * DECODE_BYTES_PER_PIXEL)))


def gpu_capacity(model) -> int:
    """Bytes this model may plan with on its GPU: what is free, plus its own tensors there now."""
    free, _ = torch.cuda.mem_get_info(model.device)
    unused_cache = torch.cuda.memory_reserved(model.device) - torch.cuda.memory_allocated(model.device)
    weights, text = model_weight_bytes(model, model.text_tower)
    on_gpu_text = text if model.text_tower is None or model.text_tower.on_gpu else 0
    return free + unused_cache + weights + on_gpu_text


def fits(need: int, capacity: int) -> bool:
    return need <= capacity * (1 - HEADROOM_SHARE) - HEADROOM_BYTES


def can_offload(model) -> bool:
    return model.text_tower is not None or (model.device is not None and torch.device(model.device).type == "cuda")


def what_fits(model, mode: str, capacity: int, prefixes: tuple[int, ...], offload: bool) -> list[str]:
    """Each of the mode's sizes at the most frames that fit (images: the sizes that fit), largest first."""
    limits = sampling_limits(model.info, mode)
    lo, hi = limits.frame_range
    out = []
    for width, height in sorted(limits.resolutions, key=lambda s: -s[0] * s[1]):
        for frames in range(hi, lo - 1, -max(1, limits.frame_step)):
            plan = request_memory(model, width, height, frames, prefixes)
            if fits(plan.peak(text_on_gpu=not offload), capacity):
                out.append(f"{width}x{height}" + (f" up to {frames} frames" if hi > 1 else ""))
                break
    return out


def plan_request(model, mode: str, width: int, height: int, frames: int, prefixes: tuple[int, ...],
                 capacity: int | None = None) -> tuple[RequestMemory, bool]:
    """(the plan, whether the text tower stays on the GPU through the request); `RequestTooLarge` where it fits
    neither way. `capacity`: the GPU's bytes for this model (None: `gpu_capacity`)."""
    capacity = gpu_capacity(model) if capacity is None else capacity
    plan = request_memory(model, width, height, frames, prefixes)
    if fits(plan.peak(text_on_gpu=True), capacity):
        return plan, True
    if can_offload(model) and fits(plan.peak(text_on_gpu=False), capacity):
        return plan, False
    offload = can_offload(model)
    sizes = what_fits(model, mode, capacity, prefixes, offload)
    raise RequestTooLarge(
        f"{model.info.family} {mode} {plan.describe(text_on_gpu=not offload)} does not fit this GPU's "
        f"{capacity / GIB:.1f} GiB. What fits: " + (", ".join(sizes) if sizes else "no size of this mode") + ".",
        "num_frames" if frames > 1 else "width")


def memory_stage(state) -> None:
    """Before the prefill: plan the request, refuse it where it cannot fit, and put the text tower where the plan
    says (on the GPU for the prefill; `after_prefill` drops it again where the request needs the room). Reads
    `model`, `request`, `cond`, `latents`, `token_ids`, `plan`; writes `text_tower_leaves` (and the model's
    `text_tower`, made on first need). `state`: the request's `engine.pipeline.state.RunState`."""
    model = state.model
    state.text_tower_leaves = False
    if model.parallel is not None or model.device is None or torch.device(model.device).type != "cuda":
        return
    cond = state.cond
    frames = decoded_frames(state.latents.vision.shape[2])
    prefixes = tuple(len(ids) for ids in state.token_ids[: 2 if any(state.plan) else 1])
    plan = (model, state.request["mode"], cond.width, cond.height, frames, prefixes)
    try:
        _, text_on_gpu = plan_request(*plan)
    except RequestTooLarge:
        # Kept step graphs are a cache (engine.pipeline.whole_step): give their memory back and plan once more.
        from .whole_step import release_kept_steps

        if not release_kept_steps():
            raise
        gc.collect()
        torch.cuda.empty_cache()
        _, text_on_gpu = plan_request(*plan)
    if not text_on_gpu and model.text_tower is None:
        model.text_tower = TextTower(model.transformer, model.device)
    if model.text_tower is not None:
        model.text_tower.to_gpu()
    state.text_tower_leaves = not text_on_gpu


def after_prefill(state) -> None:
    """The text tower's GPU copy goes where the plan needs its room for the denoising loop. Reads
    `text_tower_leaves`, `model`; writes nothing of the state."""
    if state.text_tower_leaves:
        state.model.text_tower.release()


def _largest_mode(model) -> tuple[str, object]:
    mode = "t2v" if "t2v" in model.info.modes else "t2i"
    return mode, sampling_limits(model.info, mode)


def describe_at_load(model, capacity: int | None = None) -> str:
    """The plan's line at load, e.g. "Super FP8 on 1 H200: weights 45.4 GiB (text tower 59.6 GiB, on the host
    between prefills), peak 127.2 GiB at 1280x720/189f of 139.2 GiB" (measured there: 127.36 GiB, the prefill's):
    the family's default video size (or image size) at its most frames."""
    from ..model.defaults import sampling_defaults

    capacity = gpu_capacity(model) if capacity is None else capacity
    mode, limits = _largest_mode(model)
    defaults = sampling_defaults(model.info, mode)
    plan = request_memory(model, defaults["width"], defaults["height"], limits.frame_range[1])
    text_on_gpu = fits(plan.peak(True), capacity)
    precision = "FP8" if model.runtime.fp8_weights is not None and model.runtime.fp8_weights.resident else "bf16"
    gpu = torch.cuda.get_device_name(model.device).removeprefix("NVIDIA ")
    where = "stays on the GPU" if text_on_gpu else "on the host between prefills"
    verdict = "" if fits(plan.peak(text_on_gpu), capacity) else ", does not fit"
    return (f"{model.info.family.capitalize()} {precision} on 1 {gpu}: weights {plan.weights / GIB:.1f} GiB "
            f"(text tower {plan.text_tower / GIB:.1f} GiB, {where}), peak {plan.peak(text_on_gpu) / GIB:.1f} GiB at "
            f"{plan.label} of {capacity / GIB:.1f} GiB{verdict}")


def prepare_at_load(model) -> str | None:
    """At load, on one CUDA device: move the text tower to the host where the family's largest request needs the
    room (pinning it takes a while, so not on a user's request), and log the plan's line (returned)."""
    if model.parallel is not None or model.device is None or torch.device(model.device).type != "cuda":
        return None
    capacity = gpu_capacity(model)
    line = describe_at_load(model, capacity)
    mode, limits = _largest_mode(model)
    largest = max((request_memory(model, w, h, limits.frame_range[1]) for w, h in limits.resolutions),
                  key=lambda plan: plan.peak(True))
    if not fits(largest.peak(True), capacity) and model.text_tower is None:
        model.text_tower = TextTower(model.transformer, model.device)
    log.warning("memory plan: %s", line)
    return line
