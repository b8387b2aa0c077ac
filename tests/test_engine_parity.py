"""Parity: `engine.generate` against diffusers' Cosmos3OmniPipeline on the same tiny checkpoint, seed,
scheduler and final prompt text, in fp32 on the CPU. Decoded frames (and actions, audio) must agree
to 1e-3; in practice they agree bit for bit, because the engine runs the same modules in the same order.
"""
import json

import numpy as np
import pytest
import torch
from diffusers.pipelines.cosmos.pipeline_cosmos3_omni import CosmosActionCondition
from PIL import Image

import engine
from engine.pipeline import cfg_plan, generate

TOL = 1e-3


@pytest.fixture(scope="module")
def models(tiny_family):
    return {name: engine.load_model(tiny_family[name], device="cpu") for name in ("nano", "edge", "super")}


def _reference(model, request, prompt, **kwargs):
    """diffusers on the same components, with the scheduler our request resolves to."""
    scheduler = model.make_scheduler(flow_shift=request["flow_shift"], use_karras_sigmas=False)
    pipe = model.diffusers_pipeline(scheduler)
    return pipe(prompt, num_inference_steps=request["steps"], guidance_scale=request["guidance_scale"],
                generator=torch.Generator().manual_seed(request["seed"]), output_type="np", **kwargs)


def _image(seed=0, size=(80, 120)):
    rng = np.random.default_rng(seed)
    return Image.fromarray((rng.random((*size, 3)) * 255).astype(np.uint8))


def _video(frames=9, size=(64, 96)):
    return [_image(i, size) for i in range(frames)]


PROSE = "A red ball rolls across a wooden floor, late afternoon light."
CAPTION = json.dumps({
    "subjects": [{"description": "a red rubber ball", "relative_size": "small"}],
    "background_setting": "a wooden floor in a bright room",
    "lighting": {"conditions": "late afternoon sun"},
    "resolution": {"H": 9999, "W": 1},
    "duration": "9s",
})


@pytest.mark.parametrize("name", ["nano", "edge", "super"])
@pytest.mark.parametrize("mode", ["t2i", "t2v"])
def test_prose_parity(models, name, mode):
    model = models[name]
    size = dict(width=96, height=64, num_frames=1 if mode == "t2i" else 9)
    request = dict(mode=mode, prompt=PROSE, negative_prompt="blurry, dark", seed=11, steps=3,
                   guidance_scale=4.5, guidance_interval=None, **size)
    result = generate(model, request)
    reference = _reference(model, result.params, PROSE, negative_prompt="blurry, dark", **size)
    assert result.frames.shape == reference.video.shape
    assert np.abs(result.frames - reference.video).max() <= TOL
    # The prose path sends exactly the reference's templated text.
    assert result.prompt_text.startswith(PROSE.rstrip("."))
    assert result.prompt_text.endswith(f"This {'image' if mode == 't2i' else 'video'} is of 64x96 resolution.")
    assert result.negative_prompt_text.endswith("is not of 64x96 resolution.")


@pytest.mark.parametrize("mode", ["t2i", "t2v"])
def test_json_caption_injection_both_sides(models, mode):
    model = models["nano"]
    frames = 1 if mode == "t2i" else 9
    request = dict(mode=mode, prompt=CAPTION, seed=5, steps=2, guidance_scale=3.0, guidance_interval=None,
                   width=96, height=64, num_frames=frames)
    result = generate(model, request)
    sent = json.loads(result.prompt_text)
    # Our side: metadata written into the caption, no sentence templates.
    assert sent["resolution"] == {"H": 64, "W": 96} and sent["aspect_ratio"] == "4,3"
    if mode == "t2i":
        assert "duration" not in sent and "fps" not in sent
    else:
        assert sent["duration"] == "0s" and sent["fps"] == 24.0
    assert "resolution." not in result.prompt_text
    # Same final text into diffusers (templates off) gives the same frames.
    same = _reference(model, result.params, result.prompt_text, negative_prompt=result.negative_prompt_text,
                      add_resolution_template=False, add_duration_template=False,
                      width=96, height=64, num_frames=frames)
    assert np.abs(result.frames - same.video).max() <= TOL
    # The reference's own handling appends sentences to the JSON: a different prompt, a different image.
    theirs = _reference(model, result.params, CAPTION, width=96, height=64, num_frames=frames)
    assert np.abs(result.frames - theirs.video).max() > 1e-3


def test_guidance_interval_both_sides(models):
    model = models["nano"]
    base = dict(mode="t2i", prompt=PROSE, seed=3, steps=4, guidance_scale=5.0, width=64, height=64)
    with_interval = generate(model, dict(base, guidance_interval=[700, 1000]))
    without = generate(model, dict(base, guidance_interval=None))
    reference = _reference(model, without.params, PROSE, width=64, height=64, num_frames=1)
    assert np.abs(without.frames - reference.video).max() <= TOL
    scheduler = model.make_scheduler(flow_shift=3.0)
    scheduler.set_timesteps(4)
    plan = cfg_plan(scheduler.timesteps.tolist(), 5.0, [700, 1000])
    assert any(plan) and not all(plan)
    # Steps outside the interval skip the unconditional branch, so the result moves off the reference.
    assert np.abs(with_interval.frames - reference.video).max() > 1e-4


@pytest.mark.parametrize("name", ["nano", "edge"])
def test_i2v_and_v2v_parity(models, name):
    model = models[name]
    image, video = _image(), _video()
    for mode, media in (("i2v", {"image": image}), ("v2v", {"video": video})):
        request = dict(mode=mode, prompt=PROSE, seed=2, steps=3, guidance_scale=6.0, width=96, height=64,
                       num_frames=9, **media)
        result = generate(model, request)
        reference = _reference(model, result.params, PROSE, width=96, height=64, num_frames=9, **media)
        assert np.abs(result.frames - reference.video).max() <= TOL, mode


def test_sound_parity(models):
    model = models["nano"]
    request = dict(mode="t2v", prompt=PROSE, seed=4, steps=3, width=64, height=64, num_frames=9, sound=True)
    result = generate(model, request)
    reference = _reference(model, result.params, PROSE, width=64, height=64, num_frames=9, enable_sound=True)
    assert np.abs(result.frames - reference.video).max() <= TOL
    assert result.audio.shape == tuple(reference.sound.shape)
    assert np.abs(result.audio - reference.sound.numpy()).max() <= TOL


@pytest.mark.parametrize("name", ["nano", "edge"])
@pytest.mark.parametrize("kind", ["policy", "forward_dynamics", "inverse_dynamics"])
def test_action_parity(models, name, kind):
    model = models[name]
    rng = np.random.default_rng(1)
    actions = rng.standard_normal((6, 10)).tolist() if kind == "forward_dynamics" else None
    image, video = _image(), _video()
    request = dict(mode="action", prompt="pick up the blue cup", seed=7, steps=3,
                   action=dict(kind=kind, domain="bridge_orig_lerobot", chunk_size=8, resolution_tier=256,
                               view_point="wrist_view", actions=actions))
    request["video" if kind == "inverse_dynamics" else "image"] = video if kind == "inverse_dynamics" else image
    result = generate(model, request)
    condition = CosmosActionCondition(
        mode=kind, chunk_size=8, domain_name="bridge_orig_lerobot", resolution_tier=256, view_point="wrist_view",
        raw_actions=torch.tensor(actions, dtype=torch.float32) if actions else None,
        image=None if kind == "inverse_dynamics" else image, video=video if kind == "inverse_dynamics" else None)
    reference = _reference(model, result.params, "pick up the blue cup", action=condition, fps=result.params["fps"])
    assert result.frames.shape == reference.video.shape
    assert np.abs(result.frames - reference.video).max() <= TOL
    caption = json.loads(result.prompt_text)
    assert caption["cinematography"]["framing"].startswith("This video is captured from a wrist-mounted camera")
    assert caption["actions"][0]["description"] == "pick up the blue cup."
    if kind == "forward_dynamics":
        assert result.actions is None and reference.action is None
    else:
        assert result.actions.shape == (8, 10)
        assert np.abs(result.actions - reference.action[0].numpy()).max() <= TOL


@torch.no_grad()
def _distilled_reference(model, request):
    """A plain statement of the few-step sampler on the diffusers transformer's full forward:
    x0 = x - s * v; x' = (1 - s') * x0 + s' * noise, noise from the request's generator."""
    pipe = model.diffusers_pipeline(model.make_scheduler())
    size = dict(num_frames=request["num_frames"], height=request["height"], width=request["width"])
    ids, _ = pipe.tokenize_prompt(request["prompt"], None, fps=request["fps"], **size)
    text = pipe._prepare_text_segment(ids, device="cpu")
    generator = torch.Generator().manual_seed(request["seed"])
    shape = (1, 48, (size["num_frames"] - 1) // 4 + 1, size["height"] // 16, size["width"] // 16)
    x = torch.randn(shape, generator=generator, dtype=torch.float32)
    vision = pipe._prepare_vision_segment(x, False, text["vision_start_temporal_offset"], request["fps"],
                                          text["und_len"], "cpu", [])
    position_ids = torch.cat([text["text_mrope_ids"], vision["vision_mrope_ids"]], dim=1)
    sigmas = list(model.info.distilled_sigmas) + [0.0]
    for s, s_next in zip(sigmas[:-1], sigmas[1:]):
        t = s * 1000.0
        v = pipe.transformer(
            input_ids=text["input_ids"], text_indexes=text["text_indexes"], position_ids=position_ids,
            und_len=text["und_len"], sequence_length=text["und_len"] + vision["num_vision_tokens"],
            vision_tokens=[x], vision_token_shapes=vision["vision_token_shapes"],
            vision_sequence_indexes=vision["vision_sequence_indexes"],
            vision_mse_loss_indexes=vision["vision_mse_loss_indexes"],
            vision_timesteps=torch.full((vision["num_noisy_vision_tokens"],), t),
            vision_noisy_frame_indexes=vision["vision_noisy_frame_indexes"], return_dict=False)[0][0].float()
        x0 = x - s * v
        noise = torch.randn(x.shape, generator=generator, dtype=torch.float32)
        x = (1.0 - s_next) * x0 + s_next * noise
    mean = torch.tensor(model.vae.config.latents_mean).view(1, -1, 1, 1, 1)
    std = torch.tensor(model.vae.config.latents_std).view(1, -1, 1, 1, 1)
    decoded = model.vae.decode(x * std + mean).sample
    return (decoded[0].permute(1, 2, 3, 0) / 2 + 0.5).clamp(0, 1).numpy()


@pytest.mark.parametrize("name,mode", [("nano-distilled", "t2i"), ("edge-distilled", "t2v"), ("super-distilled", "t2v")])
def test_distilled_sampler_matches_its_plain_statement(tiny_family, name, mode):
    model = engine.load_model(tiny_family[name], device="cpu")
    request = dict(mode=mode, prompt=PROSE, seed=9, width=64, height=64, num_frames=1 if mode == "t2i" else 9)
    result = generate(model, request)
    assert result.params["steps"] == 4 and result.params["guidance_scale"] == 1.0
    reference = _distilled_reference(model, result.params)
    assert np.abs(result.frames - reference).max() <= TOL


def test_distilled_i2v_keeps_the_conditioned_frame(tiny_family):
    model = engine.load_model(tiny_family["nano-distilled"], device="cpu")
    image = _image(3, (64, 64))
    result = generate(model, dict(mode="i2v", prompt=PROSE, seed=1, width=64, height=64, num_frames=9, image=image))
    again = generate(model, dict(mode="i2v", prompt=PROSE, seed=1, width=64, height=64, num_frames=9, image=image))
    other = generate(model, dict(mode="i2v", prompt=PROSE, seed=1, width=64, height=64, num_frames=9,
                                 image=_image(4, (64, 64))))
    assert np.array_equal(result.frames, again.frames)
    # Re-anchoring keeps frame 0 tied to the image: a different image changes the first frame.
    assert np.abs(result.frames[0] - other.frames[0]).max() > 1e-3


def test_same_seed_same_output_and_random_seed_reported(models):
    model = models["edge"]
    request = dict(mode="t2i", prompt=PROSE, steps=2, width=64, height=64)
    first = generate(model, dict(request, seed=-1))
    assert 0 <= first.seed < 2**31
    again = generate(model, dict(request, seed=first.seed))
    assert np.array_equal(first.frames, again.frames)
