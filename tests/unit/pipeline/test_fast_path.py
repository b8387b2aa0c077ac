"""The fast path's passes (batched CFG, dispatched kernels) agree with the exact eager engine.

On the CPU the kernels run in Triton's interpreter, so this checks the wiring and the numerics of
every pass; the GPU tests (tests/gpu/test_gpu_fast_path.py) check the same on the H200 at full size.
"""
import numpy as np
import pytest
import torch

import engine
from engine.config import build_config
from engine.pipeline.fast_path import FastGenTower, FastPathOptions
from engine.pipeline.outputs import frames_to_uint8
from engine.pipeline import run
from engine.pipeline.request import validate_request
from engine.pipeline.run import generate
from engine.pipeline.state import GenTower, RunState
from engine.pipeline.tower import EagerGenTower


@pytest.fixture(scope="module", params=["nano", "edge"])
def model(request, tiny_family):
    return engine.load_model(tiny_family[request.param], device="cpu")


REQUEST = dict(mode="t2i", prompt="a lighthouse at dusk", negative_prompt="blurry", seed=4, steps=3,
               guidance_scale=5.0, guidance_interval=None)


@pytest.mark.parametrize("kernels,batched,fused", [("torch", True, True), ("torch", False, False),
                                                   ("triton", True, True)])
def test_fast_tower_matches_the_exact_engine(model, kernels, batched, fused, monkeypatch):
    model.fast_path = None
    exact = generate(model, REQUEST)
    assert exact.trace.tower == "eager" and exact.trace.passes == []
    # Count which implementation each op actually ran: a silently skipped pass must fail this test.
    from cosmos3_kernels import norms, prefix_attention, qk_norm_rope

    calls = {}
    targets = [(qk_norm_rope, "qk_norm_rope_pack"), (qk_norm_rope, "qk_norm_rope_pack_reference"),
               (prefix_attention, "prefix_attention"), (prefix_attention, "prefix_attention_reference"),
               (norms, "add_rms_norm"), (norms, "add_rms_norm_reference")]
    for module, name in targets:
        fn = getattr(module, name)
        monkeypatch.setattr(module, name, lambda *a, _fn=fn, _n=name, **k: calls.update({_n: calls.get(_n, 0) + 1}) or _fn(*a, **k))
    model.fast_path = FastPathOptions(enabled=True, batched_cfg=batched, cuda_graphs=False, kernels=kernels,
                                      fused_projections=fused)
    try:
        fast = generate(model, REQUEST)
    finally:
        model.fast_path = None
    # The run's trace names the tower and the passes it applied: a silently skipped switch fails here too.
    assert fast.trace.tower == "fast"
    assert ("batched_cfg" in fast.trace.passes) is batched and ("fused_projections" in fast.trace.passes) is fused
    assert fast.trace.tower_steps == [2] * REQUEST["steps"]
    # The fast path hands uint8 frames (engine.pipeline.decode); the exact path float32 that the output stage rounds.
    assert fast.frames.dtype == np.uint8 and exact.frames.dtype == np.float32
    assert np.abs(fast.frames.astype(int) - frames_to_uint8(exact.frames).astype(int)).max() <= 1
    conv = next(p for p in model.vae.parameters() if p.dim() == 5)
    assert model.runtime.vae_channels_last and conv.is_contiguous(memory_format=torch.channels_last_3d)
    if fused:
        # The pass made each projection's weight a view of one fused tensor: one copy of the weights.
        attn = model.transformer.layers[0].self_attn
        fused_qkv = model.runtime.fused.qkv[0]
        assert attn.add_k_proj.weight.data_ptr() == fused_qkv[attn.add_q_proj.weight.shape[0]:].data_ptr()
        # And the exact engine still gives the same frames through the views.
        assert np.array_equal(generate(model, REQUEST).frames, exact.frames)
    layers, steps = len(model.transformer.layers), REQUEST["steps"]
    launches = steps * layers * (1 if batched else 2)
    suffix = "" if kernels == "triton" else "_reference"
    assert calls.get("qk_norm_rope_pack" + suffix) == launches
    assert calls.get("add_rms_norm" + suffix) == launches * 2 + steps * (1 if batched else 2)
    other = "_reference" if kernels == "triton" else ""
    assert not calls.get("qk_norm_rope_pack" + other)
    # The attention kernel takes bf16/fp16 only; the CPU model is fp32, so dispatch keeps SDPA there
    # (the kernel itself is tested in tests/unit/kernels/test_kernels_attention.py and on the GPU).
    assert calls.get("prefix_attention_reference") == launches and not calls.get("prefix_attention")


def test_eager_tower_is_the_default_off_the_gpu(model, monkeypatch):
    model.fast_path = None
    result = generate(model, dict(REQUEST, steps=1))
    assert result.trace.tower == "eager" and result.trace.whole_step is None and not result.trace.passes
    state = _through_the_tower_stage(model, dict(REQUEST, steps=1), FastPathOptions.for_model(model))
    assert isinstance(state.tower, EagerGenTower) and isinstance(state.tower, GenTower)
    monkeypatch.setenv("COSMOS3_FAST", "0")
    assert not FastPathOptions.from_config(build_config(), model.device).enabled


@pytest.mark.parametrize("video_qk_fp32,frames,rounded", [
    (True, None, True), (True, 1, True), (True, 2, False), (True, 48, False),
    (False, 1, True), (False, 48, True),
])
def test_rounds_qk_norm_keeps_diffusers_roundings_for_images_only(video_qk_fp32, frames, rounded):
    from engine.pipeline.fast_path import rounds_qk_norm

    options = FastPathOptions(enabled=True, video_qk_fp32=video_qk_fp32)
    assert rounds_qk_norm(options, frames) is rounded


@pytest.mark.parametrize("variable,field", [("COSMOS3_VIDEO_QK_FP32", "video_qk_fp32"),
                                            ("COSMOS3_MLP_EPILOGUE", "mlp_epilogue"),
                                            ("COSMOS3_RESIDUAL_EPILOGUE", "residual_epilogue")])
def test_rounding_switches_come_from_the_configuration(variable, field, monkeypatch):
    monkeypatch.setenv(variable, "0")
    assert getattr(FastPathOptions.from_config(build_config(), torch.device("cpu")), field) is False
    monkeypatch.delenv(variable)
    assert getattr(FastPathOptions.from_config(build_config(), torch.device("cpu")), field) is True


def _exact_and_fast(model, mode: str, **options):
    """One short request on the exact path, then on the fast path with ``options`` (Triton kernels, no graphs)."""
    request = dict(REQUEST, mode=mode, steps=2)
    if mode == "t2v":
        request["num_frames"] = 9  # three latent frames
    model.fast_path = None
    exact = generate(model, request)
    model.fast_path = FastPathOptions(enabled=True, cuda_graphs=False, kernels="triton", **options)
    try:
        fast = generate(model, request)
    finally:
        model.fast_path = None
    return exact, fast


@pytest.mark.parametrize("mode,video_qk_fp32,rounded", [
    ("t2i", True, True), ("t2v", True, False), ("t2v", False, True),
])
def test_each_request_runs_the_qk_norm_rounding_its_frames_call_for(model, mode, video_qk_fp32, rounded, monkeypatch):
    # The rule must reach the kernel through the real prefill stage: a tower built without the request's
    # layout would round every video (the default), and one built for the wrong layout would not round an image.
    from cosmos3_kernels import qk_norm_rope

    seen = []
    fn = qk_norm_rope.qk_norm_rope_pack
    monkeypatch.setattr(qk_norm_rope, "qk_norm_rope_pack",
                        lambda *a, **k: seen.append(k["round_norm_before_rope"]) or fn(*a, **k))
    exact, fast = _exact_and_fast(model, mode, video_qk_fp32=video_qk_fp32)
    assert seen and set(seen) == {rounded}
    assert np.abs(fast.frames.astype(int) - frames_to_uint8(exact.frames).astype(int)).max() <= 1


@pytest.mark.parametrize("rule,switch", [("fuses_mlp_activation", "mlp_epilogue"),
                                         ("fuses_residual_add", "residual_epilogue")])
@pytest.mark.parametrize("on,frames,applies", [
    (True, None, False), (True, 1, False), (True, 2, True), (True, 48, True), (False, 48, False),
])
def test_the_one_rounding_epilogues_apply_to_videos_only(rule, switch, on, frames, applies):
    from engine.pipeline import fast_path

    assert getattr(fast_path, rule)(FastPathOptions(enabled=True, **{switch: on}), frames) is applies


@pytest.mark.parametrize("mode,mlp_epilogue,one_rounding", [
    ("t2i", True, False), ("t2v", True, True), ("t2v", False, False),
])
def test_each_request_lets_its_mlp_round_once_only_as_its_frames_allow(model, mode, mlp_epilogue, one_rounding,
                                                                       monkeypatch):
    # Through the real prefill stage, for both MLPs (Nano's SwiGLU over the fused [gate; up], Edge's ReLU^2): every
    # layer's MLP input goes through dispatch's `mlp_in`, allowed one rounding only for a video with the switch on.
    # On the CPU dispatch then runs the split path, so the fast video stays within a level of the exact one.
    from cosmos3_kernels.dispatch import KernelDispatcher

    seen = []
    fn = KernelDispatcher.mlp_in
    monkeypatch.setattr(KernelDispatcher, "mlp_in",
                        lambda self, x, w, activation, *, one_rounding: seen.append((activation, one_rounding))
                        or fn(self, x, w, activation, one_rounding=one_rounding))
    exact, fast = _exact_and_fast(model, mode, mlp_epilogue=mlp_epilogue)
    activation = "swiglu" if model.transformer.config.hidden_act == "silu" else "relu_sq"
    layers = len(model.transformer.layers)
    assert len(seen) >= 2 * layers and set(seen) == {(activation, one_rounding)}
    assert np.abs(fast.frames.astype(int) - frames_to_uint8(exact.frames).astype(int)).max() <= 1


@pytest.mark.parametrize("mode,residual_epilogue,fused", [
    ("t2i", True, False), ("t2v", True, True), ("t2v", False, False),
])
def test_each_request_adds_its_projections_to_the_stream_in_the_gemm_only_as_its_frames_allow(
        model, mode, residual_epilogue, fused, monkeypatch):
    # Through the real tower stage: a video with the switch on adds both output projections of every layer to the
    # residual stream in the GEMM, every step (the run's trace counts it); an image, or the switch off, never does.
    # The fast video stays within a level of the exact one.
    exact, fast = _exact_and_fast(model, mode, residual_epilogue=residual_epilogue)
    layers = len(model.transformer.layers)
    assert ("residual_epilogue" in fast.trace.passes) is fused
    assert fast.trace.ops["residual_add_in_gemm"] == (2 * layers * 2 if fused else 0)  # two a layer, two steps
    assert np.abs(fast.frames.astype(int) - frames_to_uint8(exact.frames).astype(int)).max() <= 1


VIDEO = dict(mode="t2v", prompt="waves on rocks at dawn", negative_prompt="blurry", seed=2, steps=2, num_frames=9,
             guidance_scale=6.0, guidance_interval=None)


def _through_the_tower_stage(model, request: dict, options: FastPathOptions) -> RunState:
    """The stages of `generate` up to the tower stage, run on one request: its state, with its cache, branches
    and gen tower (the public stage functions, as `engine.pipeline.run` calls them)."""
    checked = validate_request(model.info, request["mode"], request)
    state = RunState(model, checked, checked["seed"], torch.Generator().manual_seed(checked["seed"]), options)
    for stage in (run.conditioning_stage, run.prompt_stage, run.noise_stage, run.layout_stage, run.schedule_stage,
                  run.memory_stage, run.prefill_stage, run.tower_stage):
        stage(state)
    return state


def _one_step_video_tower(model) -> tuple:
    """A one-step video request on the fast path (PyTorch kernels, no graphs): ((model, cache, branches), its tower)."""
    state = _through_the_tower_stage(model, dict(VIDEO, steps=1),
                                     FastPathOptions(enabled=True, cuda_graphs=False, kernels="torch"))
    return (model, state.cache, state.branches), state.tower


def test_the_residual_add_in_the_gemm_leaves_the_callers_tokens_alone(model, monkeypatch):
    # The stream is added to in place. One branch's stream is a view of the tokens the caller passed (the whole
    # step's static buffer), so it must be copied first; the tower with the add in the GEMM must also agree with
    # the tower without it to fp32 rounding.
    args, tower = _one_step_video_tower(model)
    assert tower.fuse_residual_add and isinstance(tower, GenTower)
    model_, cache, branches = args[:3]
    split = FastGenTower(model_, cache, branches, FastPathOptions(enabled=True, cuda_graphs=False, kernels="torch"),
                         round_qk_norm=tower.round_qk_norm)
    assert not split.fuse_residual_add
    tokens = torch.randn(cache.layout.gen_len, model.transformer.config.hidden_size,
                         generator=torch.Generator().manual_seed(1))
    before = tokens.clone()
    for count in (1, 2):
        for a, b in zip(tower(tokens, count), split(tokens, count)):
            assert ((a - b).norm() / b.norm()).item() < 1e-5
        assert torch.equal(tokens, before)


def test_first_layer_shares_its_gen_block_and_agrees_with_every_branch_on_its_own(model, monkeypatch):
    # The real M-RoPE positions of a video request (two prompts of different lengths): the first layer's gen
    # block computed once must give each branch's own attention, so both towers agree to fp32 rounding; and the
    # shared op must have run once per step (a pass that silently never applies fails here).
    from engine.pipeline import fast_path
    from cosmos3_kernels import shared_gen_attention as sga

    monkeypatch.setattr(fast_path, "SHARE_MIN_GEN_TOKENS", 1)
    calls = []
    fn = sga.shared_gen_attention_reference
    monkeypatch.setattr(sga, "shared_gen_attention_reference", lambda *a, **k: calls.append(1) or fn(*a, **k))
    options = FastPathOptions(enabled=True, cuda_graphs=False, kernels="torch")
    model.fast_path = options
    try:
        shared = generate(model, VIDEO)
        assert "share_first_attention" in shared.trace.passes
        assert shared.trace.ops["shared_gen_attention"] == len(calls) == VIDEO["steps"]
        state = _through_the_tower_stage(model, VIDEO, options)
        tower = state.tower
        assert tower.shares_gen_block and len(calls) == VIDEO["steps"]
        model_, cache, branches = model, state.cache, state.branches
        assert len(branches) == 2 and len(branches[0].token_ids) != len(branches[1].token_ids)
        own = FastGenTower(model_, cache, branches, FastPathOptions(enabled=True, cuda_graphs=False, kernels="torch",
                                                                   share_first_attention=False),
                           round_qk_norm=tower.round_qk_norm)
        assert not own.shares_gen_block
        width = model.transformer.config.hidden_size
        tokens = torch.randn(cache.layout.gen_len, width, generator=torch.Generator().manual_seed(0))
        before = len(calls)
        for a, b in zip(tower(tokens, 2), own(tokens, 2)):
            assert ((a - b).norm() / b.norm()).item() < 1e-5
        assert len(calls) == before + 1
        model.fast_path = FastPathOptions(enabled=True, cuda_graphs=False, kernels="torch", share_first_attention=False)
        separate = generate(model, VIDEO)
    finally:
        model.fast_path = None
    assert len(calls) == before + 1  # the switch turns it off
    assert np.abs(shared.frames.astype(int) - separate.frames.astype(int)).max() <= 1


def test_gen_block_is_not_shared_when_positions_do_not_shift_alike(model, monkeypatch):
    from engine.pipeline import fast_path

    monkeypatch.setattr(fast_path, "SHARE_MIN_GEN_TOKENS", 1)
    args, tower = _one_step_video_tower(model)
    branches = args[2]
    assert fast_path.gen_positions_shift_alike(branches)
    skewed = branches[1].position_ids.clone()
    text = len(branches[1].token_ids)
    skewed[1, text + 1:] += 1  # one axis shifted for all but the first gen token: no longer one shift per axis
    assert not fast_path.gen_positions_shift_alike([branches[0], type(branches[1])(1, branches[1].token_ids, skewed)])
    assert not fast_path.gen_positions_shift_alike(branches[:1])
    default = FastPathOptions.from_config(build_config(), torch.device("cpu"))
    assert default.share_first_attention
    monkeypatch.setenv("COSMOS3_SHARE_FIRST_ATTENTION", "0")
    assert not FastPathOptions.from_config(build_config(), torch.device("cpu")).share_first_attention


def test_gen_block_is_shared_only_from_a_videos_gen_length(model, monkeypatch):
    from cosmos3_kernels import shared_gen_attention as sga

    calls = []
    fn = sga.shared_gen_attention_reference
    monkeypatch.setattr(sga, "shared_gen_attention_reference", lambda *a, **k: calls.append(1) or fn(*a, **k))
    model.fast_path = FastPathOptions(enabled=True, cuda_graphs=False, kernels="torch")
    try:
        generate(model, dict(VIDEO, steps=1))  # the tiny model's video has far fewer gen tokens than the bound
    finally:
        model.fast_path = None
    assert not calls


@pytest.mark.parametrize("mode", ["auto", "triton", "torch"])
def test_load_kernels_imports_the_libraries_only_where_dispatch_may_choose_them(monkeypatch, mode):
    # A forced mode runs our own kernels, never a library's: importing flash-attn-4 or QuACK there would only slow
    # the start. No GPU: the dispatcher, Triton's key and the imports are stand-ins that record their calls.
    from types import SimpleNamespace

    from cosmos3_kernels import registry
    from engine.pipeline import fast_path

    opened = []
    monkeypatch.setattr(fast_path, "dispatcher_for", lambda model, kernels: opened.append(kernels))
    monkeypatch.setattr(fast_path, "load_triton_key", lambda: None)
    monkeypatch.setattr(registry, "load_libraries", lambda: {"some_op/some_library": None})
    model = SimpleNamespace(fast_path=fast_path.FastPathOptions(enabled=True, kernels=mode),
                            device=torch.device("cuda", 0))
    said = fast_path.load_kernels(model)
    assert opened == [mode] and said["triton/cache key"] is None
    assert ("some_op/some_library" in said) == (mode == "auto")
    # Nothing at all on the CPU or with the fast path off.
    assert fast_path.load_kernels(SimpleNamespace(fast_path=model.fast_path, device=torch.device("cpu"))) == {}
    off = fast_path.FastPathOptions(enabled=False, kernels=mode)
    assert fast_path.load_kernels(SimpleNamespace(fast_path=off, device=torch.device("cuda", 0))) == {}
    assert opened == [mode]
