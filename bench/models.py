"""Full-size random-weight Cosmos3 towers built straight on the GPU (no download), and one denoising
step's inputs for the engine and for diffusers, shared by bench/bench_engine.py and the GPU tests.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.model.loader import LoadedModel
from engine.pipeline.denoise import gen_tokens, velocity
from engine.pipeline.fast_path import FastPathOptions
from engine.pipeline.layout import gen_layout, positions
from engine.pipeline.prefill import prefill_cache
from engine.pipeline.tower import EagerGenTower, make_gen_tower
from engine.pipeline.state import Branch, Conditioning, Latents
from engine.model.variants import VariantInfo

# Dimensions from cosmos3.md section 1; vocabularies as released (they only size the embedding).
TRANSFORMERS = {
    "nano": dict(hidden_size=4096, num_hidden_layers=36, num_attention_heads=32, num_key_value_heads=8,
                 head_dim=128, intermediate_size=12288, rms_norm_eps=1e-6, rope_theta=5000000.0,
                 hidden_act="silu", qk_norm_for_text=True, use_und_k_norm_for_gen=False, vocab_size=151936,
                 action_gen=True, action_dim=64, sound_gen=True, sound_dim=64),
    # Super: built FP8-only on one GPU (engine.pipeline.fp8.build_fp8_transformer; bench/bench_fp8.py), or
    # sharded (engine.parallel.sharding); `build_transformer("super")` would need ~128 GB of bf16 on one GPU.
    "super": dict(hidden_size=5120, num_hidden_layers=64, num_attention_heads=64, num_key_value_heads=8,
                  head_dim=128, intermediate_size=25600, rms_norm_eps=1e-6, rope_theta=5000000.0,
                  hidden_act="silu", qk_norm_for_text=True, use_und_k_norm_for_gen=False, vocab_size=151936,
                  action_gen=False, sound_gen=False),
    "edge": dict(hidden_size=2048, num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8,
                 head_dim=128, intermediate_size=9216, rms_norm_eps=1e-5, rope_theta=100000000.0,
                 hidden_act="relu2", qk_norm_for_text=False, use_und_k_norm_for_gen=True, vocab_size=131072,
                 action_gen=True, action_dim=64),
}

# Wan2.2's VAE (the layout every Cosmos3 checkpoint ships).
WAN22_VAE = dict(base_dim=160, decoder_base_dim=256, z_dim=48, dim_mult=[1, 2, 4, 4], num_res_blocks=2,
                 attn_scales=[], temperal_downsample=[False, True, True], is_residual=True, in_channels=12,
                 out_channels=12, patch_size=2, scale_factor_spatial=16, scale_factor_temporal=4)


def transformer_config(family: str) -> dict:
    """The `Cosmos3OmniTransformer` config of a full-size family."""
    return dict(latent_channel=48, latent_patch_size=2, patch_latent_dim=192, **TRANSFORMERS[family])


def build_transformer(family: str, device: str = "cuda", dtype: torch.dtype = torch.bfloat16):
    from diffusers import Cosmos3OmniTransformer

    torch.manual_seed(0)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = Cosmos3OmniTransformer(**transformer_config(family))
    finally:
        torch.set_default_dtype(previous)
    with torch.no_grad():
        # Norm weights near one rather than exactly one, so a wrong weight path cannot hide.
        for name, param in model.named_parameters():
            if "norm" in name and name.endswith("weight"):
                param.copy_(1.0 + 0.05 * torch.randn_like(param))
    model.time_embedder.float()  # diffusers keeps it in fp32 (`_keep_in_fp32_modules`)
    return model.eval()


def build_vae(device: str = "cuda", dtype: torch.dtype = torch.bfloat16, **overrides):
    """The Wan2.2 VAE with random weights; `overrides` shrink it for CPU runs of a bench (e.g. base dims)."""
    from diffusers import AutoencoderKLWan

    torch.manual_seed(1)
    with torch.device(device):
        vae = AutoencoderKLWan(**{**WAN22_VAE, **overrides}, latents_mean=[0.0] * 48, latents_std=[1.0] * 48)
    return vae.to(dtype).eval()


def as_loaded_model(transformer, family: str, *, vae=None, tokenizer=None, fast_path=None) -> LoadedModel:
    info = VariantInfo.released(family)
    from diffusers import UniPCMultistepScheduler

    scheduler_config = dict(num_train_timesteps=1000, solver_order=2, prediction_type="flow_prediction",
                            use_flow_sigmas=True, flow_shift=3.0, final_sigmas_type="zero")
    return LoadedModel(info=info, root=None, transformer=transformer, vae=vae, tokenizer=tokenizer,
                       scheduler_class=UniPCMultistepScheduler, scheduler_config=scheduler_config,
                       device=transformer.device, dtype=transformer.dtype, fast_path=fast_path)


@dataclass
class StepInputs:
    """Everything one denoising step needs, for both CFG branches."""

    model: LoadedModel
    latents: Latents
    layout: object
    branches: list
    cache: object
    cond: Conditioning
    timestep: float

    def engine_step(self, tower=None):
        """Our step: gen tokens once, the gen tower for both branches, masked velocities."""
        tower = tower or make_gen_tower(self.model, self.cache, self.branches, layout=self.layout)
        once = FastPathOptions.for_model(self.model).enabled  # as generate: the fast path embeds the timestep once
        tokens = gen_tokens(self.model, self.layout, self.latents, self.timestep, once)
        outs = tower(tokens, len(self.branches))
        return [velocity(self.model, self.layout, self.latents, out).vision for out in outs]

    def diffusers_kwargs(self, branch: Branch) -> dict:
        layout, length = self.layout, len(branch.token_ids)
        device = self.model.device
        return dict(
            input_ids=torch.tensor(branch.token_ids, device=device), text_indexes=torch.arange(length, device=device),
            position_ids=branch.position_ids, und_len=length, sequence_length=length + layout.gen_len,
            vision_tokens=[self.latents.vision.to(self.model.dtype)], vision_token_shapes=[layout.vision_shape],
            vision_sequence_indexes=torch.arange(length, length + layout.num_vision, device=device),
            vision_mse_loss_indexes=layout.vision_noisy_local + length,
            vision_timesteps=torch.full((layout.vision_noisy_local.numel(),), self.timestep, device=device),
            vision_noisy_frame_indexes=[layout.noisy_frames], return_dict=False,
        )

    def diffusers_step(self):
        """The reference's step: a full forward (text tower included) per branch."""
        return [self.model.transformer(**self.diffusers_kwargs(b))[0][0].float() for b in self.branches]


def step_inputs(model: LoadedModel, *, width: int, height: int, frames: int, prefix_lens=(1615, 2866),
                timestep: float = 900.0, seed: int = 0) -> StepInputs:
    generator = torch.Generator(device="cpu").manual_seed(seed)
    latent_t = (frames - 1) // 4 + 1
    shape = (1, 48, latent_t, height // 16, width // 16)
    vision = torch.randn(shape, generator=generator).to(model.device)
    latents = Latents(vision=vision, vision_mask=torch.zeros((latent_t, 1, 1), device=model.device))
    cond = Conditioning(vision_shape=shape, clean=None, condition_frames=[], width=width, height=height)
    layout = gen_layout(model, latents, cond)
    vocab = min(model.transformer.config.vocab_size, 100_000)
    branches = []
    for index, length in enumerate(prefix_lens):
        ids = torch.randint(0, vocab, (length,), generator=generator).tolist()
        branches.append(Branch(index, ids, positions(model, layout, length, 24.0)))
    cache = prefill_cache(model, branches, layout)
    return StepInputs(model, latents, layout, branches, cache, cond, timestep)


def gen_step_flops(model: LoadedModel, inputs: StepInputs) -> float:
    """Matmul FLOPs of one engine step (gen tower, all branches): the arithmetic floor's numerator."""
    config = model.transformer.config
    n = inputs.layout.gen_len
    hidden, heads, kv_heads, head_dim = config.hidden_size, config.num_attention_heads, config.num_key_value_heads, config.head_dim
    mlp_mats = 3 if config.hidden_act == "silu" else 2
    per_token = 2 * hidden * (heads + 2 * kv_heads) * head_dim + 2 * heads * head_dim * hidden
    per_token += 2 * mlp_mats * hidden * config.intermediate_size
    total = 0.0
    for branch in inputs.branches:
        keys = len(branch.token_ids) + n
        total += config.num_hidden_layers * (n * per_token + 4 * n * keys * heads * head_dim)
    return total


__all__ = ["EagerGenTower", "TRANSFORMERS", "WAN22_VAE", "as_loaded_model", "build_transformer", "build_vae",
           "gen_step_flops", "step_inputs", "transformer_config"]
