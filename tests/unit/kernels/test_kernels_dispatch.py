"""Which path dispatch picks, and that each path computes the op."""
import pytest
import torch

from cosmos3_kernels import autotune, dispatch as dsp
from cosmos3_kernels import prefix_attention as pa
from cosmos3_kernels import qk_norm_rope as qk
from cosmos3_kernels.packed_kv import PackedKVLayout

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
INTERPRET = DEVICE == "cpu"  # tests/conftest.py turns Triton's interpreter on there


def _qk_args(d=16, hq=4, hkv=2, n=8, prefixes=(3, 5), dtype=torch.bfloat16):
    layout = PackedKVLayout(prefixes, n)
    b = len(prefixes)
    q = torch.randn(b, n, hq, d, dtype=dtype, device=DEVICE)
    k = torch.randn(b, n, hkv, d, dtype=dtype, device=DEVICE)
    v = torch.randn(b, n, hkv, d, dtype=dtype, device=DEVICE)
    qw = torch.randn(d, dtype=dtype, device=DEVICE)
    kw = torch.randn(d, dtype=dtype, device=DEVICE)
    ang = torch.rand(n, d // 2, device=DEVICE).repeat(1, 2)
    buf = layout.allocate(hkv, d, dtype=dtype, device=DEVICE).normal_()
    return (q, k, v, qw, kw, ang.cos().to(dtype), ang.sin().to(dtype), buf, layout)


def test_mode_and_timing_are_validated_and_never_read_from_the_environment(monkeypatch):
    with pytest.raises(ValueError, match="mode must be one of .*got 'fast'"):
        dsp.KernelDispatcher("fast")
    with pytest.raises(ValueError, match="timing must be one of .*'graph', 'eager'.*got 'replay'"):
        dsp.KernelDispatcher("auto", timing="replay")
    # The settings are the constructor's: the variables the engine reads them from change nothing here.
    monkeypatch.setenv(dsp.ENV_VAR, "torch")
    monkeypatch.setenv(dsp.TIMING_ENV_VAR, "eager")
    d = dsp.KernelDispatcher()
    assert (d.mode, d.timing, d.interpret) == ("auto", "graph", False)
    assert dsp.KernelDispatcher("torch", timing="eager").timing == "eager"


def test_candidates_are_timed_as_graph_replays_unless_eager_is_asked_for(monkeypatch):
    from cosmos3_kernels.timing import Timing

    asked = []
    monkeypatch.setattr(autotune, "time_ms", lambda fn, **kw: asked.append(kw) or Timing((1.0,)))
    both = {"torch": {None: lambda: None}, "triton": {None: lambda: None}}
    dsp.KernelDispatcher("auto").tuner.measure(both)
    assert [kw["graphed"] for kw in asked] == [True, True]  # the PyTorch path and the kernel alike
    asked.clear()
    dsp.KernelDispatcher("auto", timing="eager").tuner.measure(both)
    assert [(kw["graphed"], kw["inner"]) for kw in asked] == [(False, 1), (False, 1)]


@pytest.mark.skipif(torch.cuda.is_available(), reason="CPU rule")
def test_cpu_auto_takes_the_torch_path_and_caches_nothing():
    d = dsp.KernelDispatcher("auto")
    args = _qk_args()
    decision = d.choose("qk_norm_rope", *args, eps=1e-6)
    assert decision.backend == "torch" and "device cpu" in decision.reason
    q, buf, layout = args[0], args[7], args[8]
    assert d.choose("prefix_attention", q, buf, layout).backend == "torch"
    out = d.qk_norm_rope_pack(*args, eps=1e-6, round_norm_before_rope=True)
    assert torch.equal(out, qk.qk_norm_rope_pack_reference(*args, eps=1e-6))
    assert d.decisions() == {}


def test_forced_paths():
    args = _qk_args()
    assert dsp.KernelDispatcher("torch").choose("qk_norm_rope", *args, eps=1e-6).reason == "forced"
    forced = dsp.KernelDispatcher("triton", interpret=INTERPRET)
    decision = forced.choose("qk_norm_rope", *args, eps=1e-6)
    assert decision.backend == "triton" and decision.reason == "forced"
    # Forced Triton still respects capability: attention has no fp32 kernel.
    q32 = torch.randn(2, 8, 4, 16, device=DEVICE)
    buf32 = args[8].allocate(2, 16, dtype=torch.float32, device=DEVICE)
    fp32 = forced.choose("prefix_attention", q32, buf32, args[8])
    assert fp32.backend == "torch" and fp32.reason.startswith("unsupported")


def test_forced_paths_compute_the_same_op():
    args = _qk_args()
    q, buf, layout = args[0], args[7], args[8]
    hidden = torch.randn(2, 8, 64, dtype=torch.bfloat16, device=DEVICE)
    weight = torch.rand(64, dtype=torch.bfloat16, device=DEVICE) + 0.5
    results = {}
    for mode in ("triton", "torch"):
        d = dsp.KernelDispatcher(mode, interpret=INTERPRET)
        kv = buf.clone()  # each op gets the same inputs in both modes; nothing chains
        q_rot = d.qk_norm_rope_pack(*args[:7], kv, layout, eps=1e-6, flavour="nemotron")
        out = d.prefix_attention(q, buf, layout)
        normed, summed = d.add_rms_norm(hidden, hidden, weight, eps=1e-5)
        results[mode] = (q_rot, kv, out, normed, summed, d.swiglu(hidden, hidden), d.relu2(hidden))
    for got, want in zip(results["triton"], results["torch"]):
        torch.testing.assert_close(got.float(), want.float(), atol=2e-2, rtol=2**-7)


def test_compiling_takes_the_split_path(monkeypatch):
    """Under torch.compile tracing even a forced Triton dispatcher must use the split path."""
    args = _qk_args()
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    d = dsp.KernelDispatcher("triton", interpret=INTERPRET)
    decision = d.choose("qk_norm_rope", *args, eps=1e-6)
    assert decision.backend == "torch" and decision.reason.startswith("compiling")
    assert d.choose("prefix_attention", args[0], args[7], args[8]).backend == "torch"


def test_torch_compile_runs_the_split_path(monkeypatch):
    args = _qk_args()

    def boom(*a, **k):
        raise AssertionError("the Triton wrapper ran inside torch.compile")

    monkeypatch.setattr(qk, "qk_norm_rope_pack", boom)
    d = dsp.KernelDispatcher("triton", interpret=INTERPRET)
    buf_ref = args[7].clone()
    ref = qk.qk_norm_rope_pack_reference(*args[:7], buf_ref, args[8], eps=1e-6)

    @torch.compile(backend="eager", fullgraph=False)
    def step(*a):
        return d.qk_norm_rope_pack(*a, eps=1e-6)

    torch._dynamo.reset()
    out = step(*args)
    assert torch.equal(out, ref)
    assert torch.equal(args[7], buf_ref)


def test_measure_keeps_the_fastest_of_torch_triton_and_flash4(monkeypatch):
    from cosmos3_kernels.timing import Timing

    ms = {}
    monkeypatch.setattr(autotune, "time_ms", lambda fn, **kw: Timing((ms[fn],)))
    tuner = dsp.KernelDispatcher("auto").tuner
    run_torch, run_triton = (lambda: "torch"), (lambda: "triton")
    lib, wide = pa.Flash4Config(), pa.Flash4Config(128, 176, pack_gqa=False)
    run_lib, run_wide = (lambda: "flash4 lib"), (lambda: "flash4 128x176")
    flash4 = {lib: run_lib, wide: run_wide}
    ms.update({run_torch: 2.0, run_triton: 1.5, run_lib: 1.0, run_wide: 0.9})

    def measure(flash4_configs=None, triton=None):
        candidates = {"torch": {None: run_torch}, "triton": triton or {"cfg": run_triton}}
        if flash4_configs is not None:
            candidates["flash4"] = flash4_configs
        return tuner.measure(candidates, tolerant=frozenset({"flash4"}))

    won = measure(flash4)
    assert (won.backend, won.config, won.ms) == ("flash4", wide, {"torch": 2.0, "triton": 1.5, "flash4": 0.9})
    assert won.chosen_ms == 0.9  # the fastest flash-attn-4 config, not the first
    ms[run_wide] = 1.2
    assert measure(flash4).config == lib
    ms[run_wide] = 1.0
    assert measure(flash4).config == lib  # a tie keeps the first listed
    ms.update({run_lib: 3.0, run_wide: 3.0})
    assert (measure(flash4).backend, measure(flash4).config) == ("triton", "cfg")
    assert "flash4" not in measure().ms  # not offered: not timed
    assert "flash4" not in measure({}).ms  # no configs: not timed
    # The fused elementwise and QK kernels have one launch config, keyed None: it is still timed and can win.
    single = measure(triton={None: run_triton})
    assert (single.backend, single.chosen_ms, single.config) == ("triton", 1.5, None)
    ms.update({run_triton: 2.0, run_lib: 2.0})
    assert measure(flash4).backend == "torch"  # a tie keeps PyTorch, listed first


def test_a_flash4_config_that_fails_to_build_is_left_out_not_fatal(monkeypatch, caplog):
    from cosmos3_kernels.timing import Timing

    def broken():
        raise RuntimeError("launch shared memory exceeds the limit")

    run_torch, run_triton, run_lib = (lambda: "torch"), (lambda: "triton"), (lambda: "flash4 lib")
    ms = {run_torch: 2.0, run_triton: 1.5, run_lib: 1.0}
    monkeypatch.setattr(autotune, "time_ms", lambda fn, **kw: Timing((ms[fn],)) if fn in ms else fn())
    tuner = dsp.KernelDispatcher("auto").tuner
    wide = pa.Flash4Config(192, 128, pack_gqa=False, mma_pv_is_rs=False, sm=9)

    def measure(flash4_configs, triton=run_triton):
        return tuner.measure({"torch": {None: run_torch}, "triton": {"cfg": triton}, "flash4": flash4_configs},
                             tolerant=frozenset({"flash4"}))

    won = measure({wide: broken, pa.Flash4Config(): run_lib})
    assert (won.backend, won.config, won.chosen_ms) == ("flash4", pa.Flash4Config(), 1.0)
    assert "launch shared memory" in caplog.text
    none = measure({wide: broken})
    assert (none.backend, none.reason, "flash4" in none.ms) == ("triton", "measured", False)
    with pytest.raises(RuntimeError):  # our own Triton configs are not excused
        measure({}, triton=broken)


def test_flash4_configs_are_offered_where_they_were_measured_and_can_be_passed():
    lib = pa.Flash4Config()
    wide = pa.Flash4Config(192, 128, pack_gqa=False, mma_pv_is_rs=False, sm=9)
    assert pa.usable_flash4_configs((lib, wide), 9, True) == (lib, wide)
    assert pa.usable_flash4_configs((lib, wide), 10, True) == (lib,)  # measured on SM90 only
    assert pa.usable_flash4_configs((lib, wide), 9, False) == (lib,)  # no private entry: library defaults only
    assert wide in pa.DEFAULT_FLASH4_CONFIGS and lib in pa.DEFAULT_FLASH4_CONFIGS
    assert pa.flash4_configs_for(torch.empty(1, 1, 1, 128), pa.DEFAULT_FLASH4_CONFIGS) == ()  # CPU: none


def test_a_flash4_decision_runs_flash4_with_its_config(monkeypatch):
    layout = PackedKVLayout((3, 5), 8)
    q = torch.randn(2, 8, 4, 16, dtype=torch.bfloat16)
    buf = torch.randn(2, layout.total_rows, 2, 16, dtype=torch.bfloat16)
    d = dsp.KernelDispatcher("auto")
    wide = pa.Flash4Config(128, 176, pack_gqa=False)
    monkeypatch.setattr(d, "choose", lambda op, *a, **k: dsp.Decision("flash4", "measured", config=wide))
    monkeypatch.setattr(pa, "prefix_attention_flash4", lambda *a, **k: ("flash4 ran", k["config"]))
    assert d.prefix_attention(q, buf, layout) == ("flash4 ran", wide)


@pytest.mark.gpu
@gpu
def test_gpu_auto_measures_once_per_shape_and_caches():
    d = dsp.KernelDispatcher("auto", warmup=1, iters=2)
    args = _qk_args(d=128, hq=32, hkv=8, n=1024, prefixes=(1615, 2866))
    first = d.choose("qk_norm_rope", *args, eps=1e-6, round_norm_before_rope=True)
    assert first.reason == "measured" and first.ms["triton"] > 0 and first.ms["torch"] > 0
    assert d.choose("qk_norm_rope", *args, eps=1e-6, round_norm_before_rope=True) is first
    q, buf, layout = args[0], args[7], args[8]
    buf.normal_()
    att = d.choose("prefix_attention", q, buf, layout)
    assert att.reason == "measured"
    if att.backend == "triton":
        assert att.config in d.attention_configs
    if att.backend == "flash4":
        assert att.config in d.flash4_configs
    assert ("flash4" not in att.ms) == (pa.flash4_unsupported(q) is not None)
    out = d.prefix_attention(q, buf, layout)
    ref = pa.prefix_attention_reference(q.float(), buf.float(), layout)
    assert ((out.float() - ref).norm() / ref.norm()).item() <= 1e-2
    assert len(d.decisions()) == 2


@pytest.mark.gpu
@gpu
def test_gpu_rounding_needs_head_dim_128():
    d = dsp.KernelDispatcher("triton", interpret=INTERPRET)
    decision = d.choose("qk_norm_rope", *_qk_args(d=64), eps=1e-6, round_norm_before_rope=True)
    assert decision.backend == "torch" and "head_dim 128" in decision.reason


def test_shared_first_layer_attention_rules_off_the_gpu():
    # On the CPU the shared op is the reference in every mode (the tiny towers' tests run it); where it does not
    # apply, the attention of every other layer runs, and the result says so.
    layout = PackedKVLayout((3, 5), 8)
    q = torch.randn(2, 8, 4, 16).expand(2, 8, 4, 16).contiguous()
    buf = layout.allocate(2, 16, dtype=torch.float32, device="cpu").normal_()
    for mode in dsp.MODES:
        decision = dsp.KernelDispatcher(mode).choose("shared_gen_attention", q, buf, layout)
        assert decision.backend == "torch" and decision.reason == "cpu: the reference"
    one = PackedKVLayout((3,), 8)
    declined = dsp.KernelDispatcher("auto").choose("shared_gen_attention", q[:1], buf[:, : one.total_rows], one)
    assert declined.backend == dsp.REGULAR and "two or more branches" in declined.reason
    d = dsp.KernelDispatcher("torch")
    out = d.shared_gen_attention(q[:1], buf[:, : one.total_rows], one)
    torch.testing.assert_close(out, pa.prefix_attention_reference(q[:1], buf[:, : one.total_rows], one))
    from cosmos3_kernels import shared_gen_attention as sga

    torch.testing.assert_close(d.shared_gen_attention(q, buf, layout), sga.shared_gen_attention_reference(q, buf, layout))


def test_a_decision_reports_the_time_of_the_path_it_chose():
    # The shared first layer's measurement takes its bar from here instead of timing the one-call attention again.
    measured = {"triton": 2.0, "torch": 3.0, "flash4": 1.0}
    for backend, ms in measured.items():
        assert dsp.Decision(backend, "measured", measured).chosen_ms == ms
    assert dsp.Decision("torch", "forced").chosen_ms is None


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU mirror of what auto mode times on a GPU")
def test_every_op_times_its_registered_backends_through_their_calls(monkeypatch):
    """What auto mode runs on the H200, run here: each op's candidates built from the registry (its calls, configs,
    scratch outputs) and timed, the kernels under Triton's interpreter; a library's call that cannot run (flash-attn-4,
    QuACK: no GPU) is left out, not fatal."""
    from cosmos3_kernels import gemm, registry
    from cosmos3_kernels.timing import Timing

    monkeypatch.setattr(autotune, "time_ms", lambda fn, **kw: (fn(), Timing((1.0,)))[1])  # runs each once
    d = dsp.KernelDispatcher("auto", interpret=True)
    args = _qk_args()
    q, buf, layout = args[0], args[7], args[8]
    x = torch.randn(2, 8, 64, dtype=torch.bfloat16)
    xw = (torch.randn(16, 32, dtype=torch.bfloat16), torch.randn(48, 32, dtype=torch.bfloat16))
    monkeypatch.setattr(gemm, "mlp_in_unsupported", lambda *a: None)  # offered, as on a Hopper GPU
    monkeypatch.setattr(pa, "flash4_configs_for", lambda q, configs: configs)  # offered, as on an SM90 GPU
    calls = {
        "qk_norm_rope": (args, dict(eps=1e-6, flavour="diffusers", round_norm_before_rope=False)),
        "prefix_attention": ((q, buf, layout), dict(scale=None)),
        "add_rms_norm": ((x, x, torch.ones(64, dtype=torch.bfloat16)), dict(eps=1e-6, flavour="diffusers")),
        "swiglu": ((x, x), {}),
        "relu2": ((x,), {}),
        "mlp_in": ((*xw, "swiglu"), {}),
    }
    q_before = q.clone()
    for op, (op_args, kwargs) in calls.items():
        kernels = [b for b in registry.backends(op) if not b.reference]
        measure = d._measure_mlp_in if op == "mlp_in" else d._measure
        decision = measure(op, kernels, op_args, kwargs)
        timed = {"mlp_in": {"torch"}}.get(op, {"torch", "triton"})  # flash-attn-4 and QuACK failed: left out
        assert (set(decision.ms), decision.backend) == (timed, "torch"), op  # a tie keeps the reference
    assert torch.equal(q, q_before)  # timed into scratch outputs, never in place
