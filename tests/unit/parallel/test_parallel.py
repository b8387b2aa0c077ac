"""GPU groups on the CPU: `gpus=N` runs N gloo processes; their frames and actions equal `gpus=1`.

Each group is started once per module (a forkserver holds the engine's imports, so ranks start in
a fork). fp32 tiny checkpoints; every mode, CFG on and off, and a guidance interval that switches
mid-run (CFG-parallel steps, then single-branch steps over every rank). Plus the runtime: cancel,
a worker killed mid-job (reported, group restarted, next job served), FSDP2-sharded weights, and the
arithmetic of the plan.
"""
from __future__ import annotations

import os
import signal

import numpy as np
import pytest
from PIL import Image

import engine
from engine.model.loader import component_parameter_count
from engine.parallel.plan import check_group_size, choose_plan, kv_head_range, token_split
from engine.parallel.runtime import GroupWorkerDied
from engine.events import JobCancelled, Progress

TOL = 1e-5


def _image(seed=0, size=(80, 120)):
    rng = np.random.default_rng(seed)
    return Image.fromarray((rng.random((*size, 3)) * 255).astype(np.uint8))


REQUESTS = {
    # T2I default interval [400, 1000] would be every step here; [500, 1000] switches mid-run.
    "t2i_interval": dict(mode="t2i", prompt="a kite", seed=3, steps=4, guidance_interval=[500, 1000]),
    "t2v_cfg": dict(mode="t2v", prompt="a kite over a beach", seed=4, steps=3),
    "t2v_no_cfg": dict(mode="t2v", prompt="a kite over a beach", seed=4, steps=3, guidance_scale=1.0),
    "i2v": dict(mode="i2v", prompt="the kite climbs", seed=5, steps=3, image=_image()),
    "v2v": dict(mode="v2v", prompt="the kite dives", seed=6, steps=2, guidance_interval=[0, 700],
                video=[_image(i, (64, 96)) for i in range(9)]),
    "policy": dict(mode="action", prompt="pick up the blue cup", seed=7, steps=3, image=_image(),
                   action=dict(kind="policy", domain="bridge_orig_lerobot", chunk_size=8, resolution_tier=256,
                               view_point="wrist_view")),
}


@pytest.fixture(scope="module")
def single(tiny_family):
    return engine.load_model(tiny_family["nano"])


@pytest.fixture(scope="module")
def references(single):
    return {name: engine.generate(single, dict(request)) for name, request in REQUESTS.items()}


@pytest.fixture(scope="module", params=[2, 4])
def group(request, tiny_family):
    model = engine.load_model(tiny_family["nano"], gpus=request.param)
    yield model
    model.close()


def _agree(ours, theirs):
    assert ours.frames.shape == theirs.frames.shape
    assert np.abs(ours.frames - theirs.frames).max() <= TOL
    if theirs.actions is None:
        assert ours.actions is None
    else:
        assert np.abs(ours.actions - theirs.actions).max() <= TOL


def test_every_mode_on_the_group_equals_one_gpu(group, references):
    assert group.describe()["gpus"] in (2, 4) and group.describe()["backend"] == "gloo"
    for name, request in REQUESTS.items():
        _agree(engine.generate(group, dict(request)), references[name])


def test_progress_and_cancel_on_the_group(group, references):
    seen, cancel = [], __import__("threading").Event()

    def on_progress(event):
        seen.append(event)
        if isinstance(event, Progress) and event.stage == "denoise" and event.step == 1:
            cancel.set()

    with pytest.raises(JobCancelled):
        engine.generate(group, dict(REQUESTS["t2v_cfg"], steps=6), on_progress=on_progress, cancel=cancel)
    steps = [e.step for e in seen if isinstance(e, Progress) and e.stage == "denoise"]
    assert steps and max(steps) <= 3  # stopped within a step or two of the request, not at 6
    _agree(engine.generate(group, dict(REQUESTS["t2v_cfg"])), references["t2v_cfg"])  # and serves on


def test_a_killed_worker_fails_its_job_and_the_group_restarts(tiny_family, references):
    model = engine.load_model(tiny_family["nano"], gpus=2)
    try:
        victim = model._processes[1].pid

        def kill_on_first_step(event):
            if isinstance(event, Progress) and event.stage == "denoise" and event.step == 1:
                os.kill(victim, signal.SIGKILL)

        with pytest.raises(GroupWorkerDied, match="rank 1"):
            engine.generate(model, dict(REQUESTS["t2v_cfg"], steps=30), on_progress=kill_on_first_step)
        assert model.restarts == 1 and model._processes[1].pid != victim
        _agree(engine.generate(model, dict(REQUESTS["t2v_cfg"])), references["t2v_cfg"])
    finally:
        model.close()


def test_sharded_weights_equal_replicated(tiny_family):
    """FSDP2 over gloo: each rank holds half of every linear layer; outputs equal one process."""
    single = engine.load_model(tiny_family["super"])
    sharded = engine.load_model(tiny_family["super"], gpus=2, weights="sharded")
    try:
        assert sharded.describe()["weights"] == "sharded"
        for request in (REQUESTS["t2i_interval"], REQUESTS["t2v_cfg"]):
            _agree(engine.generate(sharded, dict(request)), engine.generate(single, dict(request)))
    finally:
        sharded.close()


def test_one_gpu_refusal_names_the_gpu_count_and_the_flag(tiny_family):
    root = tiny_family["super"]
    need = sum(component_parameter_count(root / part) for part in ("transformer", "vae")) * 4
    with pytest.raises(MemoryError, match=r"--gpus 2 .*gpus=2"):
        engine.load_model(root, memory_budget_bytes=int(need * 0.95), device="cpu")


def test_the_gpu_count_a_refusal_suggests_is_bounded():
    from engine.model.loader import MAX_GPUS, gpus_needed

    assert gpus_needed(100, 100) == 2 and gpus_needed(400, 100) == 8
    assert gpus_needed(10**12, 0) == MAX_GPUS  # no free memory at all: an answer, not an endless loop


def test_plan_arithmetic():
    assert choose_plan(4, [True, True, False]).cfg.degree == 2
    assert choose_plan(4, [True, True, False]).solo.degree == 4
    assert choose_plan(4, [False, False]).cfg is None and choose_plan(4, [True]).solo is None
    assert token_split(10, 4) == [3, 3, 2, 2]
    assert kv_head_range(3, 4, 8) == (6, 8)  # Nano, Ulysses 4: two key-value heads each
    assert kv_head_range(3, 16, 8) == (1, 2)  # more ranks than key-value heads: a copy of the one it reads
    check_group_size(8, 32, 8)
    with pytest.raises(ValueError, match=r"gpus=3 .*allowed GPU counts: \[1, 2, 4"):
        check_group_size(3, 32, 8, "nano")
    with pytest.raises(ValueError, match="gpus must be a positive integer or 'auto'"):
        engine.load_model("unused", gpus=0)


def test_the_queue_serves_a_group_and_models_report_it(tiny_family, references):
    """What `app.py --gpus 2` wires: the registry reports the group, the queue loads models on it."""
    from engine.parallel.load import load_model
    from engine.events import Finished
    from engine.serving.queue import JobQueue
    from engine.serving.registry import ModelEntry, ModelRegistry

    registry = ModelRegistry([ModelEntry("nano", str(tiny_family["nano"]))], gpus=2)
    described = registry.describe("nano")
    assert described["gpus"] == 2
    assert described["parallel"] == {"cfg_steps": "CFG 2", "single_branch_steps": "Ulysses 2"}
    loaded = []

    def loader(root):
        loaded.append(load_model(root, gpus=2))
        return loaded[-1]

    queue = JobQueue(registry, tiny_family["nano"].parent / "queue-outputs", loader=loader)
    try:
        handle = queue.submit("nano", dict(REQUESTS["t2v_cfg"]))
        events = list(handle.events(timeout=600))
        assert any(isinstance(e, Progress) and e.stage == "denoise" for e in events)
        assert isinstance(events[-1], Finished)
        result = handle.result()
        _agree(result, references["t2v_cfg"])
        assert result.outputs["video"].exists()  # rank 0 saved the files
    finally:
        queue.close()
        for model in loaded:
            model.close()


def test_a_rank_that_serves_a_whole_branch_runs_the_one_gpu_fast_tower_on_that_branch(tiny_family):
    """Where a rank runs a whole branch (a CFG half of one rank), it runs the one-GPU fast tower on its branch (the
    request's own `Branch`, with the rank's rotary rows), and gets what that tower gives on one GPU. In one process:
    a group of one, whose rank serves the only branch."""
    import torch

    from engine.parallel.group import GroupContext, GroupGenTower, GroupPrefix
    from engine.pipeline import run
    from engine.pipeline.fast_path import FastGenTower, FastPathOptions
    from engine.pipeline.request import validate_request
    from engine.pipeline.state import GenTower, RunState

    model = engine.load_model(tiny_family["nano"], device="cpu")
    options = FastPathOptions(enabled=True, cuda_graphs=False, kernels="torch")
    request = validate_request(model.info, "t2i", dict(prompt="a red kite", steps=1, seed=3, guidance_scale=1.0))
    state = RunState(model, request, 3, torch.Generator().manual_seed(3), options)
    for stage in (run.conditioning_stage, run.prompt_stage, run.noise_stage, run.layout_stage, run.schedule_stage,
                  run.prefill_stage, run.tower_stage):
        stage(state)
    assert len(state.branches) == 1 and isinstance(state.tower, FastGenTower)
    context = GroupContext(0, 1, torch.device("cpu"), seq_groups={(1, 0): None})
    model.parallel = context  # the rank's view of its group (a fresh model, loaded for this test)
    prefix = GroupPrefix(model, state.branches, state.layout.gen_len)
    part = prefix.for_layout(choose_plan(1, [False]).layout(1), context)
    rank_tower = GroupGenTower(model, prefix, options, round_qk_norm=state.tower.round_qk_norm)._fast_tower(part)
    assert isinstance(rank_tower, FastGenTower) and part.branch.token_ids == state.branches[0].token_ids
    assert isinstance(GroupGenTower(model, prefix, options, round_qk_norm=True), GenTower)  # the loop's protocol
    tokens = torch.randn(state.layout.gen_len, model.transformer.config.hidden_size,
                         generator=torch.Generator().manual_seed(0))
    assert torch.equal(rank_tower(part.exchange.shard(tokens), 1)[0], state.tower(tokens, 1)[0])
