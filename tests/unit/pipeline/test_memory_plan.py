"""A request's memory plan on one GPU (engine.pipeline.memory): Super FP8 on an H200's 139.8 GiB, the text tower on
the host between prefills where a request needs its room, and the refusal, before anything runs, that names what
fits. No GPU: Super's dimensions with its weights' sizes as numbers, and the tiny checkpoints on the CPU."""
from __future__ import annotations

import re
from types import SimpleNamespace

import pytest
import torch

from engine.model.variants import VariantInfo
from engine.pipeline import memory
from engine.pipeline.fp8 import FP8Policy

GIB = 2**30
H200 = int(139.8 * GIB)
SUPER = dict(hidden_size=5120, num_hidden_layers=64, num_attention_heads=64, num_key_value_heads=8, head_dim=128,
             intermediate_size=25600, hidden_act="silu")
# Super built FP8-only with row:in, as measured on the H200 (docs/PERFORMANCE.md): 103.6 GiB, ~58 GiB of it the
# text tower (its bf16 attention and MLP in 64 layers, and the token embedding).
SUPER_WEIGHTS = (45.6 * GIB, 58.0 * GIB)


@pytest.fixture
def super_fp8(monkeypatch):
    monkeypatch.setattr(memory, "model_weight_bytes", lambda model, text_tower: tuple(map(int, SUPER_WEIGHTS)))
    return SimpleNamespace(info=VariantInfo.released("super"), transformer=SimpleNamespace(config=SimpleNamespace(**SUPER)),
                           runtime=SimpleNamespace(fp8_weights=SimpleNamespace(resident=True, policy=FP8Policy.parse("row:in"))),
                           text_tower=None, device=torch.device("cuda"), parallel=None)


def test_super_720p_fits_one_h200_only_with_the_text_tower_off_the_gpu_while_it_denoises(super_fp8):
    plan = memory.request_memory(super_fp8, 1280, 720, 189, (1615, 64))
    assert memory.gen_tokens(1280, 720, 189) == 44160
    assert plan.kv_cache / GIB == pytest.approx(64 * 2 * (1615 + 64 + 2 * 44160) * 1024 * 2 / GIB)
    assert plan.peak(text_on_gpu=True) > H200  # what ran out of memory on the H200
    plan, text_on_gpu = memory.plan_request(super_fp8, "t2v", 1280, 720, 189, (1615, 64), capacity=H200)
    assert not text_on_gpu and memory.fits(plan.peak(text_on_gpu=False), H200)
    # An image keeps the text tower on the GPU: no copy to pay for each request.
    _, text_on_gpu = memory.plan_request(super_fp8, "t2i", 1024, 1024, 1, (1615, 64), capacity=H200)
    assert text_on_gpu


def test_a_request_that_cannot_fit_is_refused_naming_the_sizes_that_do(super_fp8):
    small_gpu = 120 * GIB  # the prefill alone (all weights and the K/V) leaves 720p/189f out
    with pytest.raises(memory.RequestTooLarge) as refused:
        memory.plan_request(super_fp8, "t2v", 1280, 720, 189, (1615, 64), capacity=small_gpu)
    text = str(refused.value)
    assert refused.value.field == "num_frames"
    assert "1280x720/189f" in text and "120.0 GiB" in text and "What fits:" in text
    named = re.findall(r"(\d+)x(\d+) up to (\d+) frames", text.split("What fits:")[1])
    assert named, text
    for width, height, frames in named:  # each size named fits, and four more frames would not
        plan = memory.request_memory(super_fp8, int(width), int(height), int(frames), (1615, 64))
        assert memory.fits(plan.peak(text_on_gpu=False), small_gpu)
        if int(frames) < 189:
            bigger = memory.request_memory(super_fp8, int(width), int(height), int(frames) + 4, (1615, 64))
            assert not memory.fits(bigger.peak(text_on_gpu=False), small_gpu)
    with pytest.raises(memory.RequestTooLarge, match="What fits: no size of this mode"):
        memory.plan_request(super_fp8, "t2i", 1024, 1024, 1, (1615, 64), capacity=40 * GIB)


def test_the_plan_is_printed_at_load(super_fp8, monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "NVIDIA H200")
    line = memory.describe_at_load(super_fp8, capacity=H200)
    assert re.fullmatch(r"Super FP8 on 1 H200: weights 45\.6 GiB \(text tower 58\.0 GiB, on the host between "
                        r"prefills\), peak \d+\.\d GiB at 1280x720/189f of 139\.8 GiB", line), line


def test_the_text_tower_moves_to_the_host_and_back_and_the_prefill_is_unchanged(tiny_family):
    from engine.model.loader import load_in_process
    from engine.pipeline.layout import positions
    from engine.pipeline.state import Branch
    from engine.pipeline.transformer import allocate_cache, prefill

    model = load_in_process(tiny_family["super"], device="cpu")
    tr = model.transformer
    ids = torch.arange(7)
    branch_positions = positions(model, SimpleNamespace(vision_shape=(1, 2, 2), num_vision=4, sound_len=0,
                                                        action_len=0), 7, 24.0)

    def text_kv():
        cache = allocate_cache(tr, (7,), 4, device=torch.device("cpu"))
        prefill(tr, cache, 0, ids, branch_positions)
        return [buffer[:, :7].clone() for buffer in cache.buffers]

    before = text_kv()
    gen_weight = tr.layers[0].self_attn.add_q_proj.weight
    tower = memory.TextTower(tr, "cpu")
    params = memory.text_tower_parameters(tr)
    assert tower.params == params and tr.embed_tokens.weight is params[0]
    assert gen_weight not in set(params) and tr.layers[0].mlp_moe_gen.up_proj.weight not in set(params)
    assert tower.bytes == sum(p.numel() * p.element_size() for p in params)
    tower.release()
    assert not tower.on_gpu and all(p.data_ptr() == h.data_ptr() for p, h in zip(params, tower.host))
    tower.to_gpu()
    assert tower.on_gpu and all(p.device == tower.device for p in params)  # on the CPU `to` keeps the same storage
    for got, want in zip(text_kv(), before):
        assert torch.equal(got, want)


def test_the_weights_are_counted_once_per_model_each_storage_once(tiny_family, monkeypatch):
    from engine.model.loader import load_in_process

    model = load_in_process(tiny_family["super"], device="cpu")
    text = memory.text_tower_parameters(model.transformer)
    text_ids = {id(p) for p in text}
    expected = sum(p.numel() * p.element_size() for p in model.transformer.parameters() if id(p) not in text_ids)
    expected += sum(b.numel() * b.element_size() for b in model.transformer.buffers())
    expected += sum(p.numel() * p.element_size() for p in model.vae.parameters())
    assert memory.model_weight_bytes(model, None) == (expected, sum(p.numel() * p.element_size() for p in text))

    def recount(*args):
        raise AssertionError("counted again")

    monkeypatch.setattr(memory, "_count_weight_bytes", recount)
    assert memory.model_weight_bytes(model, None)[0] == expected


def state_for(model, width, height, frames, prefixes=(1615, 64)):
    return SimpleNamespace(model=model, request={"mode": "t2v" if frames > 1 else "t2i"},
                           cond=SimpleNamespace(width=width, height=height),
                           latents=SimpleNamespace(vision=torch.zeros(1, 48, (frames - 1) // 4 + 1, 1, 1)),
                           token_ids=tuple([0] * n for n in prefixes), plan=[True])


def test_the_memory_stage_moves_the_text_tower_refuses_and_frees_kept_steps_first(super_fp8, monkeypatch):
    from engine.pipeline import whole_step

    made = []
    monkeypatch.setattr(memory, "TextTower", lambda tr, device: made.append(device) or SimpleNamespace(
        to_gpu=lambda: made.append("to_gpu"), release=lambda: made.append("release")))
    monkeypatch.setattr(memory, "gpu_capacity", lambda model: H200)
    state = state_for(super_fp8, 1280, 720, 189)
    memory.memory_stage(state)
    assert state.text_tower_leaves and made == [super_fp8.device, "to_gpu"]
    memory.after_prefill(state)
    assert made[-1] == "release"
    # Too large for this GPU even so: refused, nothing moved; kept step graphs are given back first and the plan
    # made again with their room (here it still does not fit).
    made.clear()
    released = []
    monkeypatch.setattr(whole_step, "release_kept_steps", lambda: released.append(1) or 1)
    monkeypatch.setattr(memory, "gpu_capacity", lambda model: 120 * GIB)
    with pytest.raises(memory.RequestTooLarge):
        memory.memory_stage(state_for(super_fp8, 1280, 720, 189))
    assert released == [1] and made == []
    # Where the kept steps held what was missing, the request runs.
    room = iter([120 * GIB, H200])
    monkeypatch.setattr(memory, "gpu_capacity", lambda model: next(room))
    memory.memory_stage(state_for(super_fp8, 1280, 720, 189))
    assert made[-1] == "to_gpu"


def test_generate_refuses_before_the_prefill(tiny_family, monkeypatch):
    from engine.model.loader import load_in_process
    from engine.pipeline import run

    model = load_in_process(tiny_family["nano"], device="cpu")
    prefilled = []
    monkeypatch.setattr(run, "prefill_stage", lambda state: prefilled.append(state))

    def too_large(state):
        raise memory.RequestTooLarge("t2i 1024x1024: does not fit. What fits: no size of this mode.", "width")

    monkeypatch.setattr(run, "memory_stage", too_large)
    with pytest.raises(memory.RequestTooLarge):
        run.generate(model, dict(mode="t2i", prompt="a lighthouse", seed=1, steps=2))
    assert prefilled == []
