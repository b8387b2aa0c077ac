"""Foundation: inspection, the defaults table, validation and loading on the six tiny checkpoints."""
import json
import shutil
from pathlib import Path

import pytest
import torch

import engine
from engine.model import variants
from engine.pipeline.request import validate_request
from engine.model.loader import CheckpointError, filter_scheduler_config, load_in_process

EXPECTED = {
    # name: (family, is_edge, is_distilled, modes)
    "nano": ("nano", False, False, ("t2i", "t2v", "i2v", "v2v", "action", "sound")),
    "nano-distilled": ("nano", False, True, ("t2i", "t2v", "i2v", "v2v")),
    "super": ("super", False, False, ("t2i", "t2v", "i2v", "v2v")),
    "super-distilled": ("super", False, True, ("t2i", "t2v", "i2v", "v2v")),
    "edge": ("edge", True, False, ("t2i", "t2v", "i2v", "v2v", "action")),
    "edge-distilled": ("edge", True, True, ("t2i", "t2v", "i2v", "v2v")),
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_inspection(tiny_family, name):
    info = engine.inspect_checkpoint(tiny_family[name])
    family, is_edge, is_distilled, modes = EXPECTED[name]
    assert (info.family, info.is_edge, info.is_distilled, info.modes) == (family, is_edge, is_distilled, modes)
    assert info.is_tiny
    if is_distilled:
        assert len(info.distilled_sigmas) == 4
        assert list(info.distilled_sigmas) == sorted(info.distilled_sigmas, reverse=True)
    else:
        assert info.distilled_sigmas is None


def test_inspection_reads_config_files_once(tiny_family, monkeypatch):
    variants.clear_inspection_cache()
    reads = []
    original = variants._read_json
    monkeypatch.setattr(variants, "_read_json", lambda path, log: reads.append(str(path)) or original(path, log))
    first = engine.inspect_checkpoint(tiny_family["edge"])
    count = len(reads)
    assert count >= 3 and len(set(reads)) == count
    assert all(not r.endswith(".safetensors") for r in reads)
    for _ in range(3):
        assert engine.inspect_checkpoint(tiny_family["edge"]) is first
    assert len(reads) == count


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_defaults_for_every_supported_mode(tiny_family, name):
    info = engine.inspect_checkpoint(tiny_family[name])
    for mode in engine.REQUEST_MODES:
        if not info.supports(mode):
            continue
        d = engine.sampling_defaults(info, mode)
        assert set(d) >= {"width", "height", "num_frames", "fps", "steps", "guidance_scale", "guidance_interval",
                          "flow_shift", "resolutions", "steps_locked", "guidance_locked"}
        if mode != "action":
            assert [d["width"], d["height"]] in d["resolutions"]
        if mode == "t2i":
            assert d["num_frames"] == 1
        elif mode != "action":
            lo, hi = d["frame_range"]
            assert lo <= d["num_frames"] <= hi and (d["num_frames"] - 1) % 4 == 0
        if info.is_distilled:
            assert d["steps"] == 4 and d["guidance_scale"] == 1.0 and d["flow_shift"] == 1.0
            assert d["steps_locked"] and d["guidance_locked"] and d["guidance_interval"] is None
        # Filling a request from nothing gives back the defaults.
        params = {"prompt": "a red ball"}
        if mode == "i2v":
            params["image"] = "frame.png"
        if mode == "v2v":
            params["video"] = "clip.mp4"
        if mode == "action":
            params = {"action": {"kind": "policy", "domain": "bridge_orig_lerobot"}, "image": "frame.png"}
        filled = validate_request(info, mode, params)
        assert filled["steps"] == d["steps"] and filled["guidance_scale"] == d["guidance_scale"]


def _real_table_info(family, distilled=False):
    return variants.VariantInfo.released(family, (1.0, 0.9375, 0.8333, 0.625) if distilled else None)


def test_real_family_table():
    nano, edge = _real_table_info("nano"), _real_table_info("edge")
    t2i = engine.sampling_defaults(nano, "t2i")
    assert (t2i["width"], t2i["height"], t2i["steps"], t2i["guidance_scale"], t2i["flow_shift"]) == (1024, 1024, 50, 4.0, 3.0)
    assert t2i["guidance_interval"] == [400.0, 1000.0]
    t2v = engine.sampling_defaults(nano, "t2v")
    assert (t2v["width"], t2v["height"], t2v["num_frames"], t2v["steps"], t2v["guidance_scale"], t2v["flow_shift"]) == (1280, 720, 121, 35, 6.0, 10.0)
    assert t2v["frame_range"] == [17, 189]
    e2i = engine.sampling_defaults(edge, "t2i")
    assert (e2i["width"], e2i["height"], e2i["guidance_scale"]) == (640, 640, 7.0)
    e2v = engine.sampling_defaults(edge, "t2v")
    assert (e2v["width"], e2v["height"], e2v["steps"], e2v["guidance_scale"], e2v["flow_shift"]) == (832, 480, 50, 5.0, 3.0)
    assert e2v["frame_range"] == [49, 149] and [1280, 720] not in e2v["resolutions"] and [256, 256] in e2v["resolutions"]
    action = engine.sampling_defaults(nano, "action")
    assert (action["steps"], action["guidance_scale"], action["flow_shift"]) == (30, 1.0, 10.0)
    distilled = engine.sampling_defaults(_real_table_info("super", distilled=True), "t2v")
    assert (distilled["steps"], distilled["guidance_scale"], distilled["flow_shift"]) == (4, 1.0, 1.0)
    assert (distilled["width"], distilled["height"]) == (1280, 720)


BAD_REQUESTS = [
    # (checkpoint, mode, params, fragment expected in the message)
    ("nano", "t2i", {"prompt": "x", "width": 1000, "height": 64}, "not a multiple of 16"),
    ("nano", "t2i", {"prompt": "x", "width": 512, "height": 512}, "Allowed sizes (WxH): 64x64, 96x64, 64x96, 128x64"),
    ("nano", "t2v", {"prompt": "x", "num_frames": 10}, "4k+1"),
    ("nano", "t2v", {"prompt": "x", "num_frames": 21}, "in 5..17"),
    ("nano", "t2i", {"prompt": "x", "num_frames": 5}, "must be 1 for text-to-image"),
    ("nano", "t2v", {"prompt": "x", "steps": -3}, "steps must be in [1, 200]"),
    ("nano", "t2v", {"prompt": "x", "steps": 2.5}, "steps must be an integer"),
    ("nano", "t2v", {"prompt": "x", "steps": 120}, "With flow_shift 10, 120 steps repeat timesteps"),
    ("nano", "t2v", {"prompt": "x", "guidance_scale": float("nan")}, "guidance_scale must be a finite number"),
    ("nano", "t2v", {"prompt": "x", "guidance_scale": float("inf")}, "guidance_scale must be a finite number"),
    ("nano", "t2v", {"prompt": "x", "guidance_scale": 1e9}, "guidance_scale must be in [0, 30]"),
    ("nano", "t2v", {"prompt": "x", "flow_shift": 0}, "flow_shift must be in (0, 50]"),
    ("nano", "t2v", {"prompt": "x", "seed": 2**64}, "seed must be in [-1,"),
    ("nano", "t2v", {"prompt": "x", "seed": "7"}, "seed must be an integer"),
    ("nano", "t2v", {"prompt": "x", "fps": 0}, "fps must be in (0, 120]"),
    ("nano", "t2i", {"prompt": "x", "guidance_interval": [900, 100]}, "0 <= lo < hi <= 1000"),
    ("nano", "t2i", {"prompt": "   "}, "prompt is empty"),
    ("nano", "t2i", {"prompt": 5}, "prompt must be a string"),
    ("nano", "t2i", {"prompt": "x", "colour": "red"}, "Unknown request keys ['colour']"),
    ("nano", "i2v", {"prompt": "x"}, "needs a conditioning image"),
    ("nano", "v2v", {"prompt": "x"}, "needs a conditioning video"),
    ("nano", "t2i", {"prompt": "x", "sound": True}, "sound needs a video mode"),
    ("nano", "paint", {"prompt": "x"}, "Unknown mode 'paint'"),
    ("super", "action", {"action": {"kind": "policy", "domain": "av"}, "image": "a.png"}, "does not support mode 'action'"),
    ("edge", "t2v", {"prompt": "x", "sound": True}, "cannot generate sound"),
    ("nano-distilled", "t2i", {"prompt": "x", "steps": 8}, "runs exactly 4 steps"),
    ("nano-distilled", "t2i", {"prompt": "x", "guidance_scale": 3.0}, "guidance_scale must be 1.0"),
    ("edge-distilled", "t2v", {"prompt": "x", "flow_shift": 5.0}, "flow_shift must be 1.0"),
    ("nano", "action", {"action": {"kind": "fly", "domain": "av"}, "image": "a.png"}, "action.kind must be one of"),
    ("nano", "action", {"action": {"kind": "policy", "domain": "mars_rover"}, "image": "a.png"}, "Unknown action domain 'mars_rover'"),
    ("nano", "action", {"action": {"kind": "policy", "domain": "libero"}, "image": "a.png"}, "no fixed action width"),
    ("nano", "action", {"action": {"kind": "policy", "domain": "av", "chunk_size": 6}, "image": "a.png"}, "multiple of 4"),
    ("nano", "action", {"action": {"kind": "policy", "domain": "av", "resolution_tier": 300}, "image": "a.png"}, "resolution_tier must be one of [256, 480, 704, 720]"),
    ("nano", "action", {"action": {"kind": "forward_dynamics", "domain": "av", "actions": [[0.0] * 10]}, "image": "a.png"}, "takes exactly 9"),
    ("nano", "action", {"action": {"kind": "forward_dynamics", "domain": "av", "actions": [[0.0] * 70]}, "image": "a.png"}, "wider than the model's action width 64"),
    ("nano", "action", {"action": {"kind": "forward_dynamics", "domain": "av", "actions": [[float("nan")] * 9]}, "image": "a.png"}, "non-finite"),
    ("nano", "action", {"action": {"kind": "inverse_dynamics", "domain": "av"}, "image": "a.png"}, "needs a conditioning video"),
    ("nano", "action", {"action": {"kind": "policy", "domain": "av"}}, "needs a first frame"),
]


@pytest.mark.parametrize("name,mode,params,fragment", BAD_REQUESTS)
def test_invalid_requests_are_refused_with_their_message(tiny_family, name, mode, params, fragment):
    info = engine.inspect_checkpoint(tiny_family[name])
    with pytest.raises(ValueError) as caught:
        validate_request(info, mode, params)
    assert fragment in str(caught.value)


def test_step_limit_follows_what_the_scheduler_can_run():
    from diffusers import UniPCMultistepScheduler

    from engine.model.defaults import max_distinct_steps

    assert max_distinct_steps(10.0) == 100 and max_distinct_steps(3.0) == 200
    info = _real_table_info("nano")
    validate_request(info, "t2v", {"prompt": "x", "steps": 100})
    with pytest.raises(ValueError, match="at most 100 steps are allowed at this shift"):
        validate_request(info, "t2v", {"prompt": "x", "steps": 101})
    # The refusal matches the scheduler's own failure: 101 steps at shift 10 break UniPC's update.
    scheduler = UniPCMultistepScheduler(num_train_timesteps=1000, solver_order=2, prediction_type="flow_prediction",
                                        use_flow_sigmas=True, flow_shift=10.0, final_sigmas_type="zero")
    scheduler.set_timesteps(101)
    sample = torch.zeros(1, 4)
    with pytest.raises(AssertionError):
        for t in scheduler.timesteps:
            sample = scheduler.step(torch.zeros(1, 4), t, sample, return_dict=False)[0]


def test_real_edge_refuses_720p_and_lists_sizes():
    with pytest.raises(ValueError, match=r"Allowed sizes \(WxH\): 832x480, 480x832, 640x480"):
        validate_request(_real_table_info("edge"), "t2v", {"prompt": "x", "width": 1280, "height": 720})
    with pytest.raises(ValueError, match="in 49..149"):
        validate_request(_real_table_info("edge"), "t2v", {"prompt": "x", "num_frames": 189})


def _copy_config_only(src: Path, dst: Path) -> Path:
    for path in src.rglob("*"):
        if path.is_file() and path.suffix != ".safetensors" and path.name != "cosmos3_studio_tiny.json":
            target = dst / path.relative_to(src)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(path, target)
    return dst


@pytest.mark.parametrize("family,dims", [
    ("nano", dict(hidden_size=4096, num_hidden_layers=36, num_attention_heads=32, intermediate_size=12288)),
    ("super", dict(hidden_size=5120, num_hidden_layers=64, num_attention_heads=64, intermediate_size=25600)),
    ("edge", dict(hidden_size=2048, num_hidden_layers=28, num_attention_heads=16, intermediate_size=9216)),
])
def test_config_only_copies_with_real_dimensions(tiny_family, tmp_path, family, dims):
    source = tiny_family["edge" if family == "edge" else "nano"]
    root = _copy_config_only(source, tmp_path / family)
    config_path = root / "transformer" / "config.json"
    config = json.loads(config_path.read_text())
    config.update(dims, head_dim=128, num_key_value_heads=8)
    config_path.write_text(json.dumps(config))
    info = engine.inspect_checkpoint(root)
    assert info.family == family and not info.is_tiny
    assert info.is_edge == (family == "edge")
    # Real checkpoints get the family table, not tiny sizes.
    sizes = engine.sampling_defaults(info, "t2v")["resolutions"]
    assert ([1280, 720] in sizes) == (family != "edge")


def test_missing_and_malformed_checkpoints_name_the_file(tiny_family, tmp_path):
    with pytest.raises(CheckpointError, match="does not exist"):
        engine.inspect_checkpoint(tmp_path / "absent")
    root = _copy_config_only(tiny_family["nano"], tmp_path / "broken")
    (root / "transformer" / "config.json").write_text("{not json")
    with pytest.raises(CheckpointError, match=r"transformer/config.json.*not valid JSON"):
        engine.inspect_checkpoint(root)
    (root / "transformer" / "config.json").write_text(json.dumps({"hidden_size": 64}))
    with pytest.raises(CheckpointError, match=r"lacks the key 'num_hidden_layers'"):
        engine.inspect_checkpoint(root)
    (root / "model_index.json").unlink()
    with pytest.raises(CheckpointError, match=r"model_index.json' is missing"):
        engine.inspect_checkpoint(root)


def test_scheduler_key_filtering():
    from diffusers import FlowMatchEulerDiscreteScheduler, UniPCMultistepScheduler

    kept, dropped = filter_scheduler_config(
        FlowMatchEulerDiscreteScheduler,
        {"_class_name": "FlowMatchEulerDiscreteScheduler", "shift": 1.0, "stochastic_sampling": True,
         "fixed_step_sampler_config": {"t_list": [1.0, 0.5]}},
    )
    assert dropped == ["fixed_step_sampler_config"] and kept["stochastic_sampling"] is True
    kept, dropped = filter_scheduler_config(UniPCMultistepScheduler, {"flow_shift": 3.0, "stochastic_sampling": False})
    assert dropped == ["stochastic_sampling"] and kept == {"flow_shift": 3.0}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_load_round_trip(tiny_family, name):
    from safetensors.torch import load_file

    model = load_in_process(tiny_family[name], device="cpu")
    assert model.info == engine.inspect_checkpoint(tiny_family[name])
    assert model.dtype == torch.float32 and model.transformer.dtype == torch.float32
    on_disk = load_file(tiny_family[name] / "transformer" / "diffusion_pytorch_model.safetensors")
    state = model.transformer.state_dict()
    assert set(on_disk) == set(state)
    for key, value in on_disk.items():
        assert torch.equal(state[key], value), key
    scheduler = model.make_scheduler()
    expected = "FlowMatchEulerDiscreteScheduler" if model.info.is_distilled else "UniPCMultistepScheduler"
    assert type(scheduler).__name__ == expected
    assert model.dropped_scheduler_keys == (["fixed_step_sampler_config"] if model.info.is_distilled else ["stochastic_sampling"])
    assert (model.sound_tokenizer is not None) == (model.info.family == "nano")


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_diffusers_loads_and_runs_a_step(tiny_family, name):
    from diffusers import Cosmos3OmniPipeline

    pipe = Cosmos3OmniPipeline.from_pretrained(tiny_family[name], enable_safety_checker=False)
    out = pipe("a red ball", num_frames=1, height=64, width=64, num_inference_steps=1, guidance_scale=1.0,
               generator=torch.Generator().manual_seed(0), output_type="np")
    assert out.video.shape == (1, 64, 64, 3) and bool((out.video >= 0).all() and (out.video <= 1).all())


def test_quantizer_tensors_are_dropped(tiny_family, tmp_path):
    from safetensors.torch import load_file, save_file

    root = tmp_path / "quantized"
    shutil.copytree(tiny_family["edge"], root)
    weights = root / "transformer" / "diffusion_pytorch_model.safetensors"
    state = load_file(weights)
    state["layers.0.self_attn.to_q.input_quantizer._amax"] = torch.tensor(3.0)
    state["layers.1.mlp.up_proj.weight_quantizer._amax"] = torch.ones(4)
    save_file(state, weights, metadata={"format": "pt"})
    model = load_in_process(root, device="cpu")
    assert model.dropped_weight_keys == ["layers.0.self_attn.to_q.input_quantizer._amax",
                                         "layers.1.mlp.up_proj.weight_quantizer._amax"]
    assert not any("_quantizer" in k for k in model.transformer.state_dict())


def test_corrupt_weights_and_wrong_components_fail_clearly(tiny_family, tmp_path):
    root = tmp_path / "corrupt"
    shutil.copytree(tiny_family["super"], root)
    weights = root / "transformer" / "diffusion_pytorch_model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    with pytest.raises(CheckpointError, match=r"transformer/diffusion_pytorch_model.safetensors.*(corrupt|truncated)"):
        load_in_process(root, device="cpu")
    weights.unlink()
    (root / "transformer" / "weights.bin").write_bytes(b"\x80\x04pickle")
    with pytest.raises(CheckpointError, match="pickled weights are never loaded"):
        load_in_process(root, device="cpu")
    shutil.rmtree(root)
    shutil.copytree(tiny_family["super"], root)
    index = json.loads((root / "model_index.json").read_text())
    index["vae"] = ["diffusers", "AutoencoderKLCogVideoX"]
    (root / "model_index.json").write_text(json.dumps(index))
    variants.clear_inspection_cache()
    with pytest.raises(CheckpointError, match="component 'vae' is 'AutoencoderKLCogVideoX'"):
        load_in_process(root, device="cpu")
    shutil.rmtree(root / "vae")
    variants.clear_inspection_cache()
    with pytest.raises(CheckpointError, match=r"lacks the component folder 'vae/'"):
        load_in_process(root, device="cpu")


def test_super_refused_when_memory_budget_is_too_small(tiny_family):
    with pytest.raises(MemoryError, match="GiB"):
        load_in_process(tiny_family["super"], device="cpu", memory_budget_bytes=1024)


def test_missing_source_and_offline_hub_fail_clearly():
    with pytest.raises(CheckpointError, match="does not exist"):
        engine.resolve_source("./no/such/folder")
    with pytest.raises(CheckpointError, match="not in the local cache"):
        engine.resolve_source("nvidia/Cosmos3-Nano-Not-Cached-Here")
