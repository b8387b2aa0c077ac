"""The tiny Cosmos3 family: random-weight checkpoints with the real diffusers file layout.

`python -m engine.model.tiny OUT_DIR` writes six folders (nano, nano-distilled, super, super-distilled,
edge, edge-distilled). Each loads with `Cosmos3OmniPipeline.from_pretrained` and is shaped like the
released model in everything the code reads: 48 latent channels, transformer patch 2, a Wan2.2
layout VAE (z 48, 16x spatial, 4x temporal, its own patch 2), Edge's relu2 / Nemotron norms and
und-K norm for gen, distilled FlowMatchEuler schedulers with a 4-sigma `t_list`, action heads on
Nano and Edge, sound on Nano. Only the widths and depths are small.

The root file `cosmos3_studio_tiny.json` (see `engine.model.variants.TINY_MARKER`) names the family the
tiny model stands in for and declares its small canvases, so CPU tests stay fast.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

TINY_NAMES = ("nano", "nano-distilled", "super", "super-distilled", "edge", "edge-distilled")

# Bump when the layout or shapes change so that cached copies are rebuilt.
TINY_VERSION = 4  # 3: distilled checkpoints carry modular_model_index.json; 4: reasoner towers at the root

# The last two are the reasoner's image and video placeholders (engine/model/tiny_reasoner.py).
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>", "<|pad|>",
                  "<|image_pad|>", "<|video_pad|>"]
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

# Sigma lists seen in public code; the released values are read from each checkpoint.
_T_LISTS = {"nano": [0.999, 0.75, 0.5, 0.25], "super": [1.0, 0.9375, 0.8333, 0.625], "edge": [0.999, 0.75, 0.5, 0.25]}

# Small stand-ins for each family's table, different where the real ones differ: Edge gets a smaller
# largest canvas and a narrower frame range (as 480p / 49..149 against 720p / 17..189).
_TINY_LIMITS = {
    "nano": {"image_sizes": [[64, 64], [96, 64], [64, 96], [128, 64]], "video_sizes": [[64, 64], [96, 64], [64, 96]],
             "frame_range": [5, 17], "default_frames": 9},
    "edge": {"image_sizes": [[64, 64], [96, 64], [64, 96], [32, 32]], "video_sizes": [[64, 64], [96, 64], [64, 96], [32, 32]],
             "frame_range": [9, 17], "default_frames": 9},
}
_TINY_LIMITS["super"] = _TINY_LIMITS["nano"]

# Small, but each family differs the way the real ones do (depth, width, norms, rope theta).
_TRANSFORMERS = {
    "nano": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                 intermediate_size=128, rms_norm_eps=1e-6, rope_theta=5000000.0, hidden_act="silu",
                 qk_norm_for_text=True, use_und_k_norm_for_gen=False,
                 action_gen=True, action_dim=64, sound_gen=True, sound_dim=64),
    "super": dict(hidden_size=80, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
                  intermediate_size=160, rms_norm_eps=1e-6, rope_theta=5000000.0, hidden_act="silu",
                  qk_norm_for_text=True, use_und_k_norm_for_gen=False,
                  action_gen=False, action_dim=None, sound_gen=False, sound_dim=None),
    "edge": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                 intermediate_size=144, rms_norm_eps=1e-5, rope_theta=100000000.0, hidden_act="relu2",
                 qk_norm_for_text=False, use_und_k_norm_for_gen=True,
                 action_gen=True, action_dim=64, sound_gen=False, sound_dim=None),
}


def _family_of(name: str) -> str:
    return name.split("-")[0]


def build_tokenizer():
    """A byte-level BPE tokenizer made offline with the `tokenizers` library, wrapped for transformers."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    # A few hundred merges learnt from the project's own words keep JSON captions short on the CPU.
    corpus = [
        '{"subjects": [{"description": "a red robot arm", "appearance_details": "brushed metal"}],'
        ' "background_setting": "a quiet workshop", "lighting": {"conditions": "soft daylight"},'
        ' "aesthetics": {"composition": "centered", "mood_atmosphere": "calm"},'
        ' "cinematography": {"camera_motion": "slow dolly", "framing": "medium shot"},'
        ' "resolution": {"H": 720, "W": 1280}, "aspect_ratio": "16,9", "duration": "5s", "fps": 24.0}',
        "This video is of 720x1280 resolution. The video is 5.0 seconds long and is of 24 FPS.",
        "You are a helpful assistant who will generate images from a give prompt.",
        "You are a helpful assistant who will generate videos from a give prompt.",
        "A cat walks along a sunny windowsill while the camera pans slowly to the left.",
    ] * 4
    trainer = trainers.BpeTrainer(
        vocab_size=600,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(corpus, trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        eos_token="<|endoftext|>",
        pad_token="<|pad|>",
        additional_special_tokens=["<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>",
                                   "<|image_pad|>", "<|video_pad|>"],
        chat_template=CHAT_TEMPLATE,
    )


def _build_transformer(family: str, vocab_size: int):
    import torch
    from diffusers import Cosmos3OmniTransformer

    spec = dict(_TRANSFORMERS[family])
    model = Cosmos3OmniTransformer(
        head_dim=32,
        latent_channel=48,
        latent_patch_size=2,
        patch_latent_dim=192,
        rope_axes_dim=[8, 4, 4],
        vocab_size=vocab_size,
        num_embodiment_domains=32,
        **spec,
    )
    # Random weights with a scale that keeps activations O(1) through the tiny stack, so parity
    # tests compare meaningful numbers rather than saturated ones.
    generator = torch.Generator().manual_seed({"nano": 11, "super": 22, "edge": 33}[family])
    with torch.no_grad():
        for pname, param in model.named_parameters():
            if "norm" in pname and pname.endswith("weight"):
                param.copy_(1.0 + 0.1 * torch.randn(param.shape, generator=generator))
            elif param.ndim >= 2:
                param.copy_(torch.randn(param.shape, generator=generator) / param.shape[-1] ** 0.5)
            else:
                param.copy_(0.02 * torch.randn(param.shape, generator=generator))
    config = dict(model.config)
    if family == "edge":
        # Released Edge configs carry the backbone name; diffusers ignores the key with a warning.
        config["backbone_type"] = "cosmos3_edge_nemotron_dense"
    return model, config


def _build_vae():
    import torch
    from diffusers import AutoencoderKLWan

    generator = torch.Generator().manual_seed(1234)
    mean = (0.3 * torch.randn(48, generator=generator)).tolist()
    std = (1.0 + 0.5 * torch.rand(48, generator=generator)).tolist()
    return AutoencoderKLWan(
        base_dim=8,
        decoder_base_dim=8,
        z_dim=48,
        dim_mult=[1, 2, 4, 4],
        num_res_blocks=1,
        attn_scales=[],
        temperal_downsample=[False, True, True],
        is_residual=True,
        in_channels=12,
        out_channels=12,
        patch_size=2,
        scale_factor_spatial=16,
        scale_factor_temporal=4,
        latents_mean=mean,
        latents_std=std,
    )


def _build_sound_tokenizer():
    from diffusers.models.autoencoders.autoencoder_cosmos3_audio import Cosmos3AVAEAudioTokenizer

    # Real strides (1920x hop at 48 kHz = 25 latent fps), tiny channels, decoder only as released.
    return Cosmos3AVAEAudioTokenizer(vocoder_input_dim=64, dec_dim=4, enc_latent_dim=128, encoder_enabled=False)


def _scheduler_config(family: str, distilled: bool) -> dict:
    if distilled:
        return {
            "_class_name": "FlowMatchEulerDiscreteScheduler",
            "_diffusers_version": "0.42.1",
            "num_train_timesteps": 1000,
            "shift": 1.0,
            "use_dynamic_shifting": False,
            "stochastic_sampling": True,
            # Read by serving engines, not accepted by the scheduler class: filtered at load.
            "fixed_step_sampler_config": {"t_list": _T_LISTS[family]},
        }
    return {
        "_class_name": "UniPCMultistepScheduler",
        "_diffusers_version": "0.42.1",
        "num_train_timesteps": 1000,
        "solver_order": 2,
        "prediction_type": "flow_prediction",
        "use_flow_sigmas": True,
        "flow_shift": 10.0,
        "use_karras_sigmas": False,
        "final_sigmas_type": "zero",
        "lower_order_final": True,
        # Carried by some exports and not a UniPC argument: filtered at load.
        "stochastic_sampling": False,
    }


def _modular_index(name: str, family: str, tokenizer_class: str) -> dict:
    """What diffusers' own distilled pipeline reads (`ModularPipeline.from_pretrained` ->
    `Cosmos3DistilledModularPipeline` with `Cosmos3DistilledBlocks`): the fixed sigmas and each
    component's loading spec, as its `save_pretrained` writes them. A component whose files are in the
    folder it is loaded from loads from there, so the specs name the checkpoint by its folder name only."""
    def spec(subfolder: str, library: str, class_name: str) -> list:
        return [None, None, {"pretrained_model_name_or_path": name, "revision": None, "subfolder": subfolder,
                             "type_hint": [library, class_name], "variant": None}]

    return {
        "_blocks_class_name": "Cosmos3DistilledBlocks",
        "_class_name": "Cosmos3DistilledModularPipeline",
        "_diffusers_version": "0.42.1",
        "default_use_system_prompt": True,
        "distilled_sigmas": _T_LISTS[family],
        "enable_safety_checker": False,
        "is_distilled": True,
        "scheduler": spec("scheduler", "diffusers", "FlowMatchEulerDiscreteScheduler"),
        "text_tokenizer": spec("text_tokenizer", "transformers", tokenizer_class),
        "transformer": spec("transformer", "diffusers", "Cosmos3OmniTransformer"),
        "vae": spec("vae", "diffusers", "AutoencoderKLWan"),
    }


def _write_json(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def write_checkpoint(name: str, out: Path) -> Path:
    """Write one tiny checkpoint folder `out/name` and return its path."""
    import torch

    if name not in TINY_NAMES:
        raise ValueError(f"Unknown tiny checkpoint {name!r}; allowed: {list(TINY_NAMES)}.")
    family = _family_of(name)
    distilled = name.endswith("-distilled")
    target = out / name
    staging = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=out))
    try:
        torch.manual_seed(0)
        tokenizer = build_tokenizer()
        tokenizer.save_pretrained(staging / "text_tokenizer")

        transformer, transformer_config = _build_transformer(family, vocab_size=len(tokenizer))
        transformer.save_pretrained(staging / "transformer", safe_serialization=True)
        _write_json(staging / "transformer" / "config.json", transformer_config)
        # The reasoner tower at the root, as released folders carry it (Transformers loads it from there).
        from .tiny_reasoner import write_reasoner

        write_reasoner(staging, family, transformer_config, transformer.state_dict(), tokenizer)

        _build_vae().save_pretrained(staging / "vae", safe_serialization=True)
        _write_json(staging / "scheduler" / "scheduler_config.json", _scheduler_config(family, distilled))

        has_sound = bool(_TRANSFORMERS[family]["sound_gen"])
        if has_sound:
            _build_sound_tokenizer().save_pretrained(staging / "sound_tokenizer", safe_serialization=True)

        index = {
            "_class_name": "Cosmos3OmniPipeline",
            "_diffusers_version": "0.42.1",
            "transformer": ["diffusers", "Cosmos3OmniTransformer"],
            "vae": ["diffusers", "AutoencoderKLWan"],
            "scheduler": ["diffusers", _scheduler_config(family, distilled)["_class_name"]],
            "text_tokenizer": ["transformers", "PreTrainedTokenizerFast"],
            "sound_tokenizer": ["diffusers", "Cosmos3AVAEAudioTokenizer"] if has_sound else [None, None],
            "safety_checker": [None, None],
            "enable_safety_checker": False,
            "default_use_system_prompt": True,
            "use_native_flow_schedule": False,
        }
        _write_json(staging / "model_index.json", index)
        if distilled:
            _write_json(staging / "modular_model_index.json", _modular_index(name, family, type(tokenizer).__name__))
        _write_json(staging / "cosmos3_studio_tiny.json", {"family": family, "version": TINY_VERSION, **_TINY_LIMITS[family]})
        if target.exists():
            shutil.rmtree(target)
        os.replace(staging, target)
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    return target


def write_family(out: str | os.PathLike, names=TINY_NAMES) -> dict[str, Path]:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    return {name: write_checkpoint(name, out) for name in names}


def ensure_family(cache_dir: str | os.PathLike) -> dict[str, Path]:
    """Build the tiny family into `cache_dir` once; later calls reuse what is there."""
    cache = Path(cache_dir)
    paths = {}
    for name in TINY_NAMES:
        marker = cache / name / "cosmos3_studio_tiny.json"
        current = False
        if marker.is_file():
            try:
                current = json.loads(marker.read_text()).get("version") == TINY_VERSION
            except (OSError, json.JSONDecodeError):
                current = False
        paths[name] = cache / name if current else write_checkpoint(name, _mkdir(cache))
    return paths


def _mkdir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m engine.model.tiny", description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", help="folder to write the six tiny checkpoints into")
    args = parser.parse_args(argv)
    for name, path in write_family(args.out_dir).items():
        print(f"{name}: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
