"""Loading a checkpoint: sources, weight checks, components.

`load_in_process(source)` takes a local folder or a Hugging Face repo id and returns a `LoadedModel`
holding the diffusers components (bf16 on CUDA, fp32 on the CPU) and the `VariantInfo` read once
at load. Weight files are checked before any tensor is read, so a corrupt or truncated file fails
with a message naming it instead of a deep traceback. The public `engine.load_model` (one GPU or a
group of N: `engine.parallel.load`) builds on it; this floor never imports the group runtime.
"""
from __future__ import annotations

import inspect
import json
import math
import os
import re
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..config import configured
from .runtime import ModelRuntime
from .variants import CheckpointError, VariantInfo, inspect_checkpoint

# Files the engine reads. Edge repos also carry Reasoner (VLM) files at the root, which we skip.
HUB_PATTERNS = (
    "model_index.json", "modular_model_index.json", "cosmos3_studio_tiny.json",
    "transformer/*", "vae/*", "scheduler/*", "text_tokenizer/*", "sound_tokenizer/*",
)
HUB_CONFIG_PATTERNS = (
    "model_index.json", "modular_model_index.json", "cosmos3_studio_tiny.json",
    "transformer/config.json", "scheduler/scheduler_config.json", "text_tokenizer/*", "sound_tokenizer/config.json",
)
_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
# ModelOpt exports carry calibration tensors such as `...to_q.input_quantizer._amax`.
QUANTIZER_KEY = re.compile(r"_quantizer\.")

_EXPECTED_CLASSES = {
    "transformer": {"Cosmos3OmniTransformer"},
    "vae": {"AutoencoderKLWan"},
    "scheduler": {"UniPCMultistepScheduler", "FlowMatchEulerDiscreteScheduler"},
    "sound_tokenizer": {"Cosmos3AVAEAudioTokenizer"},
}


def looks_like_repo_id(text: str) -> bool:
    return bool(_REPO_ID.match(text)) and not text.startswith((".", "/", "~"))


def resolve_source(source: str | os.PathLike, *, config_only: bool = False) -> Path:
    """A local folder for `source`: the folder itself, or a snapshot of a hub repo id.

    Hub downloads honour `HF_HUB_OFFLINE` and the cache, and fetch only what the engine reads.
    """
    text = str(source).strip()
    if not text:
        raise CheckpointError("The model source is empty; give a checkpoint folder or a Hugging Face repo id.")
    path = Path(text).expanduser()
    if path.exists():
        return path.resolve()
    if not looks_like_repo_id(text):
        raise CheckpointError(f"Checkpoint folder {text!r} does not exist (and it is not a hub repo id like 'org/name').")
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError, RepositoryNotFoundError

    try:
        local = snapshot_download(text, allow_patterns=list(HUB_CONFIG_PATTERNS if config_only else HUB_PATTERNS))
    except LocalEntryNotFoundError as exc:
        raise CheckpointError(
            f"Hub repo {text!r} is not in the local cache and downloads are off (HF_HUB_OFFLINE) or unreachable: {exc}"
        ) from exc
    except (RepositoryNotFoundError, HfHubHTTPError, OSError) as exc:
        raise CheckpointError(f"Could not fetch hub repo {text!r}: {exc}") from exc
    return Path(local)


def check_safetensors(path: Path) -> dict[str, dict]:
    """Read and check a safetensors header without loading tensors; return {name: info}."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as handle:
            prefix = handle.read(8)
            if len(prefix) < 8:
                raise CheckpointError(f"Weight file {str(path)!r} is truncated: {size} bytes, no header.")
            (header_len,) = struct.unpack("<Q", prefix)
            if header_len > min(size - 8, 100 * 2**20):
                raise CheckpointError(f"Weight file {str(path)!r} is corrupt: header length {header_len} exceeds the file.")
            header = json.loads(handle.read(header_len))
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"Weight file {str(path)!r} is corrupt: {exc}.") from exc
    if not isinstance(header, dict):
        raise CheckpointError(f"Weight file {str(path)!r} is corrupt: its header is not an object.")
    header.pop("__metadata__", None)
    end = 0
    for name, info in header.items():
        try:
            start, stop = info["data_offsets"]
        except (TypeError, KeyError, ValueError) as exc:
            raise CheckpointError(f"Weight file {str(path)!r} is corrupt: bad entry for {name!r}.") from exc
        end = max(end, stop)
    if 8 + header_len + end != size:
        raise CheckpointError(
            f"Weight file {str(path)!r} is corrupt or truncated: the header describes {8 + header_len + end} bytes, "
            f"the file has {size}."
        )
    return header


def weight_files(folder: Path) -> list[Path]:
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        pickles = sorted(p.name for p in folder.glob("*.bin")) + sorted(p.name for p in folder.glob("*.pt"))
        hint = f" (found {pickles}: pickled weights are never loaded, only safetensors)" if pickles else ""
        raise CheckpointError(f"Component folder {str(folder)!r} has no .safetensors weight file{hint}.")
    return files


def weight_shapes(folder: Path):
    """(name, shape) of each weight in a component's files, from their headers alone; calibration
    tensors (`QUANTIZER_KEY`) left out."""
    for file in weight_files(folder):
        for name, info in check_safetensors(file).items():
            if not QUANTIZER_KEY.search(name):
                yield name, [int(dim) for dim in info.get("shape", [])]


def component_parameter_count(folder: Path) -> int:
    """Number of parameters in a component's weight files, from their headers alone."""
    return sum(math.prod(shape) for _, shape in weight_shapes(folder))


def quantizer_keys(folder: Path) -> list[str]:
    return sorted(k for f in weight_files(folder) for k in check_safetensors(f) if QUANTIZER_KEY.search(k))


def filter_scheduler_config(scheduler_cls, config: dict) -> tuple[dict, list[str]]:
    """Keep only the keys `scheduler_cls.__init__` accepts; return (kept, dropped names)."""
    accepted = set(inspect.signature(scheduler_cls.__init__).parameters) - {"self"}
    kept = {k: v for k, v in config.items() if k in accepted}
    dropped = sorted(k for k in config if k not in accepted and not k.startswith("_"))
    return kept, dropped


def _component_class(root: Path, name: str, index: dict) -> str | None:
    entry = index.get(name)
    if not entry or entry[0] is None:
        return None
    class_name = entry[1]
    if name in _EXPECTED_CLASSES and class_name not in _EXPECTED_CLASSES[name]:
        raise CheckpointError(
            f"Checkpoint file {str(root / 'model_index.json')!r}: component {name!r} is {class_name!r}, "
            f"expected one of {sorted(_EXPECTED_CLASSES[name])}."
        )
    return class_name


@dataclass
class LoadedModel:
    """A checkpoint's components, ready for the engine's stages."""

    info: VariantInfo
    root: Path
    transformer: Any
    vae: Any
    tokenizer: Any
    scheduler_class: type
    scheduler_config: dict
    sound_tokenizer: Any = None
    safety_checker: Any = None
    device: Any = None
    dtype: Any = None
    dropped_scheduler_keys: list[str] = field(default_factory=list)
    dropped_weight_keys: list[str] = field(default_factory=list)
    native_flow_schedule: bool = False
    config: Any = None  # engine.config.Config it was loaded under (load_in_process: the environment's where not given)
    # Fast-path switches (None: from `config`).
    fast_path: Any = None
    # What the engine builds for this model and keeps across its requests (fused weights, dispatchers, FP8
    # weights, kept whole steps, sampler tables), each with its lifetime: engine.model.runtime.
    runtime: ModelRuntime = field(default_factory=ModelRuntime)
    parallel: Any = None  # engine.parallel.group.GroupContext on a rank of a GPU group
    # engine.pipeline.memory.TextTower: the text tower's weights in host memory, where requests need its room
    text_tower: Any = None
    weight_bytes: Any = None  # engine.pipeline.memory.model_weight_bytes' count, kept

    def make_scheduler(self, **overrides):
        config = dict(self.scheduler_config)
        config.update(overrides)
        return self.scheduler_class.from_config(config)

    def diffusers_pipeline(self, scheduler=None):
        """The diffusers reference pipeline over these very components (tests and benchmarks)."""
        from diffusers import Cosmos3OmniPipeline

        pipe = Cosmos3OmniPipeline(
            transformer=self.transformer,
            text_tokenizer=self.tokenizer,
            vae=self.vae,
            scheduler=scheduler if scheduler is not None else self.make_scheduler(),
            sound_tokenizer=self.sound_tokenizer,
            safety_checker=None,
            enable_safety_checker=False,
            default_use_system_prompt=self.info.default_use_system_prompt,
            use_native_flow_schedule=self.native_flow_schedule,
        )
        return pipe


def _transformer_class():
    from diffusers import Cosmos3OmniTransformer

    class QuantizerFreeCosmos3OmniTransformer(Cosmos3OmniTransformer):
        # Calibration tensors from ModelOpt exports are not parameters of the bf16 model: drop them.
        _keys_to_ignore_on_load_unexpected = [QUANTIZER_KEY.pattern]

    return QuantizerFreeCosmos3OmniTransformer


MAX_GPUS = 64  # the largest group a refusal suggests

# The gen tower's per-layer GEMM weights: what an FP8-only model (engine.pipeline.fp8) holds in float8, by
# the role its policy names them with (`FP8Policy.gemms_of_layer`).
GEN_LINEAR = re.compile(r"^layers\.(\d+)\.(self_attn\.(add_[qkv]_proj|to_add_out)|mlp_moe_gen\.(gate|up|down)_proj)\.weight$")
GEN_ROLES = {"add_q_proj": "qkv", "add_k_proj": "qkv", "add_v_proj": "qkv", "to_add_out": "out", "gate": "in",
             "up": "in", "down": "down"}


def fp8_weight_bytes(root: Path, dtype_bytes: int = 2, policy=None) -> int:
    """Bytes of the transformer and VAE when the gen tower's GEMM weights that `policy` puts in FP8 (all
    when None) are float8 (one byte, plus a 4-byte scale per row) and everything else stays bf16: what
    `load_in_process(..., fp8_loader=...)` holds."""
    layers = json.loads((root / "transformer" / "config.json").read_text(encoding="utf-8"))["num_hidden_layers"]
    total = 0
    for part in ("transformer", "vae"):
        for name, shape in weight_shapes(root / part):
            gen = GEN_LINEAR.match(name) if part == "transformer" and len(shape) == 2 else None
            role = gen and GEN_ROLES[gen.group(3) or gen.group(4)]
            fp8 = gen is not None and (policy is None or role in policy.gemms_of_layer(int(gen.group(1)), layers))
            total += math.prod(shape) + 4 * shape[0] if fp8 else math.prod(shape) * dtype_bytes
    return total


def gpus_needed(weight_bytes: int, per_gpu_bytes: int) -> int:
    """The smallest power-of-two group whose shards leave each GPU 40% for gathered layers and activations."""
    count = 2
    while weight_bytes / count > per_gpu_bytes * 0.6 and count < MAX_GPUS:
        count *= 2
    return count


def _budget(device, memory_budget_bytes: int | None) -> int | None:
    import torch

    if device.type != "cuda" and memory_budget_bytes is None:
        return None
    return memory_budget_bytes if memory_budget_bytes is not None else torch.cuda.mem_get_info(device)[0]


def fits(need: int, budget: int | None) -> bool:
    # Keep a tenth free for activations of the smallest request; larger ones are checked per request.
    return budget is None or need <= budget * 0.9


def _check_fits(info, device, need: int, budget: int | None, weight_shards: int, fp8_need: int | None = None) -> None:
    """Refuse weights that do not fit the device, saying how many GPUs would hold them and how, and
    (on one GPU) whether the FP8-only model would fit instead (`fp8_need`, its bytes)."""
    if fits(need, budget):
        return
    shards = gpus_needed(need * weight_shards, budget)
    fp8 = ""
    if fp8_need is not None and weight_shards == 1:
        fp8 = (f" Or run it on this one GPU in FP8 (faster, approximate), about {fp8_need / 2**30:.1f} GiB: "
               f"COSMOS3_FP8=1 (or engine.load_model(source, fp8=True); a GPU with FP8 tensor cores and torchao)."
               if fits(fp8_need, budget) else
               f" In FP8 (faster, approximate) it would still need about {fp8_need / 2**30:.1f} GiB, too much for this GPU.")
    raise MemoryError(
        f"{info.family} weights need about {need / 2**30:.1f} GiB on {device}, which has "
        f"{budget / 2**30:.1f} GiB free. Shard them over {shards} GPUs of this size: pass --gpus {shards} "
        f"(or engine.load_model(source, gpus={shards})); see docs/perf-log/2026-12-02.md, Multi-GPU.{fp8}"
    )


def _fp8_only_fits(info, root: Path, device, need: int, budget: int | None, weight_shards: int, dtype,
                   fp8_loader) -> bool:
    """Whether to build the FP8-only model: FP8 asked for (`fp8_loader`, its `policy_for` sizing it), the bf16
    weights over the budget, the FP8 ones under it. Otherwise refuse what does not fit (naming the FP8 option on one GPU) or return False."""
    fp8_need = None
    if weight_shards == 1 and not fits(need, budget):  # only then does the FP8 size matter (and the policy's lookup)
        policy = fp8_loader.policy_for(info.family, device) if fp8_loader else None
        fp8_need = fp8_weight_bytes(root, dtype.itemsize, policy)
    if fp8_loader is not None and fp8_need is not None and fits(fp8_need, budget):
        return True
    _check_fits(info, device, need, budget, weight_shards, fp8_need)
    return False


def load_in_process(source: str | os.PathLike, *, device: str | None = None, safety: bool = False,
                    memory_budget_bytes: int | None = None, transformer_loader=None, weight_shards: int = 1,
                    fp8_loader=None, config=None):
    """Load a Cosmos3 checkpoint's components into this process, on one device. See the module docstring.
    `engine.load_model` (engine.parallel.load) calls it for one GPU and each rank of a group for its own;
    `transformer_loader`/`weight_shards`: a rank's shard. `fp8_loader` (engine.parallel.load.FP8OnlyLoader): FP8
    asked for; it builds the transformer FP8-only where bf16 does not fit and FP8 does (engine.pipeline.fp8)."""
    config = configured(config)  # what the model runs under (None: the environment's), set before torch loads
    import torch
    import diffusers
    from transformers import AutoTokenizer

    root = resolve_source(source)
    info = inspect_checkpoint(root)
    index = json.loads((root / "model_index.json").read_text(encoding="utf-8"))
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32

    for name in ("transformer", "vae", "scheduler", "sound_tokenizer"):
        _component_class(root, name, index)
    parameters = component_parameter_count(root / "transformer") + component_parameter_count(root / "vae")
    sound_class = _component_class(root, "sound_tokenizer", index)
    if sound_class:
        parameters += component_parameter_count(root / "sound_tokenizer")
    fp8_only = _fp8_only_fits(info, root, device, parameters * dtype.itemsize // weight_shards,
                              _budget(device, memory_budget_bytes), weight_shards, dtype, fp8_loader)
    dropped_weights = quantizer_keys(root / "transformer")
    fp8_weights = None
    if fp8_only:
        try:  # its own refusal (no FP8 on this device: engine.pipeline.fp8.FP8Unavailable) passes as it is
            transformer, fp8_weights = fp8_loader(root / "transformer", device, info.family)
        except (OSError, KeyError) as exc:
            raise CheckpointError(f"Loading weights from {str(root)!r} failed: {exc}") from exc
    try:
        # safetensors only: a pickled weight file is never opened.
        if fp8_weights is None and transformer_loader is not None:
            transformer = transformer_loader(root / "transformer", dtype)
        elif fp8_weights is None:
            transformer = _transformer_class().from_pretrained(root / "transformer", torch_dtype=dtype,
                                                               use_safetensors=True)
        vae = diffusers.AutoencoderKLWan.from_pretrained(root / "vae", torch_dtype=dtype, use_safetensors=True)
        sound_tokenizer = None
        if sound_class:
            sound_tokenizer = diffusers.Cosmos3AVAEAudioTokenizer.from_pretrained(root / "sound_tokenizer",
                                                                                  use_safetensors=True)
    except (OSError, ValueError, RuntimeError, KeyError) as exc:
        raise CheckpointError(f"Loading weights from {str(root)!r} failed: {exc}") from exc
    try:
        tokenizer = AutoTokenizer.from_pretrained(root / "text_tokenizer", trust_remote_code=False)
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"Loading the tokenizer from {str(root / 'text_tokenizer')!r} failed: {exc}") from exc
    for token in ("<|vision_start|>",):
        if tokenizer.convert_tokens_to_ids(token) in (None, tokenizer.unk_token_id):
            raise CheckpointError(f"The tokenizer in {str(root / 'text_tokenizer')!r} lacks the token {token!r}.")
    if tokenizer.eos_token_id is None or not tokenizer.chat_template:
        raise CheckpointError(f"The tokenizer in {str(root / 'text_tokenizer')!r} needs an EOS token and a chat template.")

    scheduler_path = root / "scheduler" / "scheduler_config.json"
    raw_scheduler = json.loads(scheduler_path.read_text(encoding="utf-8"))
    scheduler_class = getattr(diffusers, raw_scheduler.get("_class_name", ""), None)
    if scheduler_class is None:
        raise CheckpointError(f"Checkpoint file {str(scheduler_path)!r}: unknown scheduler {raw_scheduler.get('_class_name')!r}.")
    scheduler_config, dropped = filter_scheduler_config(scheduler_class, raw_scheduler)

    safety_checker = None
    if safety:
        safety_checker = make_safety_checker()

    if transformer_loader is None and fp8_weights is None:  # a rank's shards, an FP8-only model: built in place
        transformer.to(device)
    transformer.eval()
    vae.to(device).eval()
    if sound_tokenizer is not None:
        sound_tokenizer.to(device).eval()
    return LoadedModel(
        info=info, root=root, transformer=transformer, vae=vae, tokenizer=tokenizer,
        scheduler_class=scheduler_class, scheduler_config=scheduler_config, sound_tokenizer=sound_tokenizer,
        safety_checker=safety_checker, device=device, dtype=dtype, dropped_scheduler_keys=dropped,
        dropped_weight_keys=dropped_weights, native_flow_schedule=bool(index.get("use_native_flow_schedule", False)),
        runtime=ModelRuntime(fp8_weights=fp8_weights), config=config)


# What `cosmos_guardrail.CosmosSafetyChecker()` (0.3.2) fetches from the hub when it is built: the blocklist
# and face-blur weights, and the Qwen3Guard text classifier.
GUARDRAIL_REPOS = ("nvidia/Cosmos-1.0-Guardrail", "Qwen/Qwen3Guard-Gen-0.6B")


class SafetyUnavailable(ValueError):
    """The guardrail was asked for and cannot run; the message says what is missing and how to provide it."""


def make_safety_checker():
    """The Cosmos guardrail, built through its documented API, or a loud failure: never silently skipped."""
    try:
        from cosmos_guardrail import CosmosSafetyChecker
    except ModuleNotFoundError as exc:
        if exc.name != "cosmos_guardrail":
            raise SafetyUnavailable(
                f"The 'cosmos_guardrail' package is installed but cannot be imported: it needs the module "
                f"{exc.name!r}, which is missing. Install the extras (pip install -r requirements-gpu.txt: "
                "torchvision built for the installed torch) or run without --safety.") from exc
        raise SafetyUnavailable(
            "The safety checker was asked for, but the 'cosmos_guardrail' package is not installed. "
            "Install it (pip install -r requirements-gpu.txt) or run without --safety.") from exc
    except Exception as exc:  # noqa: BLE001 - a broken dependency fails at import, e.g. a torchvision for another torch
        raise SafetyUnavailable(
            f"The 'cosmos_guardrail' package is installed but cannot be imported ({type(exc).__name__}: {exc}). "
            "Its dependencies must match the installed torch (torchvision above all; requirements-gpu.txt), "
            "or run without --safety.") from exc
    try:
        return CosmosSafetyChecker()
    except Exception as exc:  # noqa: BLE001 - its models are fetched from the hub as it is built
        from huggingface_hub import constants

        offline = " Downloads are off (HF_HUB_OFFLINE is set)." if constants.HF_HUB_OFFLINE else ""
        raise SafetyUnavailable(
            f"The Cosmos guardrail's models could not be loaded ({type(exc).__name__}: {exc}).{offline} It needs "
            f"{' and '.join(GUARDRAIL_REPOS)} in the Hugging Face cache ({constants.HF_HUB_CACHE}): fetch them once "
            f"where the hub is reachable ({'; '.join('hf download ' + r for r in GUARDRAIL_REPOS)}), or point "
            "HF_HOME at a cache that holds them, then start again; or run without --safety.") from exc
