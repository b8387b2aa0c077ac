"""The MLP input's dispatch (cosmos3_kernels.gemm, KernelDispatcher.mlp_in): the split path (cuBLAS, then the activation's
own pass), or QuACK's GEMM with the activation in its epilogue, only where the caller allows one rounding and it is
no further from fp32. The CPU tests cover the rules and the references; the GPU ones run QuACK where installed."""
import importlib.util
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

from cosmos3_kernels import dispatch as dsp
from cosmos3_kernels import gemm, settings
from broken_install import assert_repair_warning, broken_install

cuda = torch.cuda.is_available()
hopper_with_quack = pytest.mark.skipif(
    not (cuda and torch.cuda.get_device_capability()[0] == 9 and importlib.util.find_spec("quack") is not None),
    reason="needs an SM90 GPU with quack-kernels")


def _xw(m=64, k=32, n=48, dtype=torch.bfloat16, device="cpu", seed=0):
    g = torch.Generator(device=device).manual_seed(seed)
    x = torch.randn(m, k, dtype=dtype, device=device, generator=g)
    w = torch.randn(n, k, dtype=dtype, device=device, generator=g) / k ** 0.5
    return x, w


def test_config_label_spells_tile_kind_and_cluster():
    assert gemm.QuackConfig().label == "128x192p2x1"
    assert gemm.QuackConfig(256, 128, False, 1, 2).label == "256x128c1x2"


@pytest.mark.parametrize("case, expected", [
    ("switched_off", "COSMOS3_QUACK=0"),
    ("float32", "dtypes torch.float32"),
    ("subclass", "tensor subclass"),
    ("transposed", "contiguous rows"),
    ("k_not_multiple_of_8", "K 30"),
    ("mismatched", "x [M, K] and w [N, K]"),
    ("cpu", "device cpu"),
])
def test_quack_is_refused_with_the_reason(case, expected, monkeypatch):
    x, w = _xw()
    if case == "switched_off":
        monkeypatch.setattr(settings, "_current", replace(settings.current(), quack=False))
    elif case == "float32":
        x, w = x.float(), w.float()
    elif case == "subclass":
        class Twin(torch.Tensor):
            pass
        w = w.as_subclass(Twin)
    elif case == "transposed":
        x = x.T.contiguous().T
    elif case == "k_not_multiple_of_8":
        x, w = _xw(k=30)
    elif case == "mismatched":
        w = w[:, :16].contiguous()
    assert expected in gemm.quack_unsupported(x, w)


# ------------------------------------------------------------------------------------------------------
# The MLP's input GEMM with its activation
# ------------------------------------------------------------------------------------------------------
def test_mlp_in_reference_takes_the_gate_from_the_first_half_of_rows_and_rounds_once():
    x, w = _xw(m=16, k=32, n=48)
    y = x.float() @ w.float().T
    once = gemm.mlp_in_reference(x, w, "swiglu")
    assert once.dtype == torch.bfloat16 and once.shape == (16, 24)
    assert torch.equal(once, (F.silu(y[:, :24]) * y[:, 24:]).bfloat16())
    assert torch.equal(gemm.mlp_in_reference(x, w, "relu_sq", out_dtype=torch.float32), torch.relu(y).square())
    with pytest.raises(ValueError, match="activation must be one of .*'swiglu'.*got 'gelu'"):
        gemm.mlp_in_reference(x, w, "gelu")


def test_relu_sq_reference_squares_the_positive_part_only():
    x = torch.tensor([[1.0, 0.0]])
    w = torch.tensor([[2.0, 0.0], [-3.0, 0.0]])
    assert gemm.mlp_in_reference(x, w, "relu_sq").tolist() == [[4.0, 0.0]]


@pytest.mark.parametrize("activation", gemm.MLP_ACTIVATIONS)
def test_one_rounding_is_closer_to_fp64_than_the_split_path(activation):
    # What the fast tower's MLP epilogue rests on: rounding once (the fused op's reference) is no less accurate
    # than rounding the GEMM's output and then the activation's steps, as diffusers and the split path do.
    x, w = _xw(m=256, k=512, n=384)
    exact = gemm.mlp_in_reference(x.double(), w.double(), activation, out_dtype=torch.float64)
    y = F.linear(x, w)
    split = (F.silu(y[:, :192]) * y[:, 192:]) if activation == "swiglu" else torch.relu(y).square()
    once = gemm.mlp_in_reference(x, w, activation)
    assert not torch.equal(once, split)  # a deliberate difference: other bytes

    def error(out):
        return ((out.double() - exact).norm() / exact.norm()).item()

    assert error(once) < error(split)


@pytest.mark.parametrize("activation, w_rows, expected", [
    ("gelu", 48, "activation 'gelu'"),
    ("swiglu", 40, "N 40: [gate; up] halves"),
    ("relu_sq", 48, "device cpu"),
])
def test_mlp_in_epilogue_is_refused_with_the_reason(activation, w_rows, expected):
    x, w = _xw(n=w_rows)
    assert expected in gemm.mlp_in_unsupported(x, w, activation)


def test_an_epilogue_library_that_does_not_import_is_the_reason_given(monkeypatch):
    # QuACK installed outside a site-packages folder imports, but its epilogue library fails to fingerprint.
    monkeypatch.setattr(gemm, "quack_unsupported", lambda x, w: None)
    monkeypatch.setattr(gemm, "_epilogue_entry", lambda: (None, "QuACK's epilogue GEMMs not importable (TypeError: x)"))
    x, w = _xw()
    assert gemm.mlp_in_unsupported(x, w, "swiglu").startswith("QuACK's epilogue GEMMs not importable (TypeError")
    with pytest.raises(RuntimeError, match="not importable"):
        gemm.mlp_in_quack(x, w, "swiglu")


def test_closer_candidates_keep_only_those_no_further_from_fp32_than_the_split_path():
    exact = torch.linspace(1, 2, 12).view(4, 3)
    split = exact + 0.01
    closer, further = gemm.QuackConfig(), gemm.QuackConfig(256, 128, False, 2, 1)

    def raises():
        raise RuntimeError("no such tile on this GPU")

    kept, left_out = dsp.closer_candidates(
        {closer: lambda: exact + 0.001, further: lambda: exact - 0.02, "broken": raises},
        lambda: split, lambda: exact[:2], rows=2)
    assert list(kept) == [closer]
    assert left_out[0].startswith("256x128c2x1: further from fp32 than the split path (")
    assert left_out[1].startswith("broken: RuntimeError: no such tile")
    # As accurate as the split path is enough: one rounding is never required to be strictly better.
    kept, _ = dsp.closer_candidates({closer: lambda: split.clone()}, lambda: split, lambda: exact[:2], rows=2)
    assert list(kept) == [closer]


def test_measured_choice_takes_a_closer_library_config_only_when_faster():
    exact = torch.ones(4, 3)
    split_out = exact + 0.01
    fast, less_accurate = gemm.QuackConfig(), gemm.QuackConfig(256, 128, False, 2, 1)
    split = lambda: split_out  # noqa: E731
    candidates = {fast: lambda: exact + 0.001, less_accurate: lambda: exact * 3}
    d = dsp.KernelDispatcher()
    timings = {split: 2.0, candidates[fast]: 1.5, candidates[less_accurate]: 0.1}
    d.tuner.time = lambda fn: timings[fn]

    def measure():  # what dispatch's MLP-input measurement composes: the accuracy gate, then alternating rounds
        kept, left_out = dsp.closer_candidates(candidates, split, lambda: exact, rows=4)
        return d.tuner.measure_alternating({"torch": {None: split}, "quack": kept}, left_out=tuple(left_out))

    decision = measure()
    # The fastest candidate of all (0.1 ms) is the less accurate, so it is never timed against the rest.
    assert (decision.backend, decision.config, decision.ms) == ("quack", fast, {"torch": 2.0, "quack": 1.5})
    assert decision.chosen_ms == 1.5
    assert "256x128c2x1: further from fp32" in decision.reason
    timings[candidates[fast]] = 2.0  # a tie keeps the split path
    assert measure().backend == "torch"


def test_candidates_are_timed_in_alternating_order_and_a_failing_one_is_left_out():
    # Under the power cap the first candidate after a pause is timed at a higher clock: every round times each in
    # turn, reversing the order every other round, and the median of its rounds is its time.
    order = []
    split, good, bad = (lambda: None), (lambda: None), (lambda: None)
    ms = {split: iter([3.0, 1.0, 2.0]), good: iter([2.5, 0.5, 1.5])}

    def fake_time(fn):
        order.append({split: "split", good: "good", bad: "bad"}[fn])
        if fn is bad:
            raise RuntimeError("cannot capture")
        return next(ms[fn])

    d = dsp.KernelDispatcher()
    d.tuner.time = fake_time
    decision = d.tuner.measure_alternating({"torch": {None: split}, "quack": {"good": good, "bad": bad}}, rounds=3)
    assert (decision.ms, decision.backend, decision.config) == ({"torch": 2.0, "quack": 1.5}, "quack", "good")
    assert order == ["split", "good", "bad", "good", "split", "split", "good"]


def test_forced_modes_keep_the_split_mlp_input(monkeypatch):
    monkeypatch.setattr(gemm, "mlp_in_unsupported", lambda *a: None)  # as on a Hopper GPU with QuACK
    x, w = _xw()
    assert dsp.KernelDispatcher("torch").choose("mlp_in", x, w, "swiglu").reason == "forced"
    decision = dsp.KernelDispatcher("triton").choose("mlp_in", x, w, "swiglu")
    assert decision.backend == "torch" and "mlp_in has no triton kernel" in decision.reason


@pytest.mark.parametrize("one_rounding", [True, False])
@pytest.mark.parametrize("activation", gemm.MLP_ACTIVATIONS)
def test_on_the_cpu_the_mlp_input_is_the_split_path(activation, one_rounding):
    d = dsp.KernelDispatcher()
    x, w = _xw()
    y = F.linear(x, w)
    split = (F.silu(y[:, :24]) * y[:, 24:]) if activation == "swiglu" else torch.relu(y).square()
    assert torch.equal(d.mlp_in(x, w, activation, one_rounding=one_rounding), split)
    decision = d.choose("mlp_in", x, w, activation)
    assert decision.backend == "torch" and "device cpu" in decision.reason
    with pytest.raises(ValueError, match="activation must be one of .* got 'gelu'"):
        d.mlp_in(x, w, "gelu", one_rounding=one_rounding)


def test_without_one_rounding_dispatch_never_considers_the_epilogue(monkeypatch):
    d = dsp.KernelDispatcher()
    asked = []
    choose = dsp.KernelDispatcher.choose

    def spy(self, op, *a, **k):  # the activation's own pass is dispatched too: only the MLP input is counted
        if op != "mlp_in":
            return choose(self, op, *a, **k)
        asked.append(a)
        return dsp.Decision("torch", "stand-in")

    monkeypatch.setattr(dsp.KernelDispatcher, "choose", spy)
    x, w = _xw()
    d.mlp_in(x, w, "swiglu", one_rounding=False)
    assert asked == []
    d.mlp_in(x, w, "swiglu", one_rounding=True)
    assert len(asked) == 1


# ------------------------------------------------------------------------------------------------------
# On an SM90 GPU with QuACK
# ------------------------------------------------------------------------------------------------------
@pytest.mark.gpu
@hopper_with_quack
def test_quack_with_the_residual_in_its_epilogue_rounds_once_so_the_tower_does_not_use_it():
    # Why cosmos3_kernels.gemm leaves QuACK's epilogue add out: it adds the fp32 accumulator to the residual and rounds
    # once, where the tower (as diffusers) rounds the GEMM's output, then the sum. Same shapes as the bench's
    # attention-out row, fewer rows.
    from quack.gemm_interface import gemm_tuned

    x, w = _xw(2048, 4096, 4096, device="cuda")
    residual = torch.randn(2048, 4096, dtype=torch.bfloat16, device="cuda")
    fused = torch.empty_like(residual)
    gemm_tuned.fn(x, w.T, fused, residual, config=gemm._library_config(gemm.QuackConfig()))
    single = (x.float() @ w.float().T + residual.float())
    split = F.linear(x, w) + residual
    assert not torch.equal(fused, split)
    # Closer to the fp32 sum than the split path, as one rounding is.
    assert (fused.float() - single).abs().mean() < (split.float() - single).abs().mean()


@pytest.mark.gpu
@hopper_with_quack
@pytest.mark.parametrize("activation, k, n", [("swiglu", 4096, 24576), ("relu_sq", 2048, 9216), ("swiglu", 2048, 4096)])
def test_quack_mlp_epilogue_rounds_once_and_is_closer_to_fp32_than_the_split_path(activation, k, n):
    # Nano's gate|up, Edge's up, and a narrower gated shape, 2048 rows (one ragged tile of 1000 in the last case's
    # second seed): the fused op is its reference's math (one rounding) and at least as accurate as the split path.
    for seed, m in ((0, 2048), (1, 1000)):
        x, w = _xw(m, k, n, device="cuda", seed=seed)
        fused = gemm.mlp_in_quack(x, w, activation)
        exact = gemm.mlp_in_reference(x, w, activation, out_dtype=torch.float32)
        y = F.linear(x, w)
        split = (F.silu(y[:, :n // 2]) * y[:, n // 2:]) if activation == "swiglu" else torch.relu(y).square()

        def error(out):
            return ((out.float() - exact).norm() / exact.norm()).item()

        print(f"{activation} {m}x{k}x{n}: fused {error(fused):.3e}, split {error(split):.3e}, "
              f"one rounding in PyTorch {error(gemm.mlp_in_reference(x, w, activation)):.3e}")
        assert fused.shape == split.shape and not torch.equal(fused, split)
        assert error(fused) <= error(split)
        assert error(fused) <= 1.01 * error(gemm.mlp_in_reference(x, w, activation))


@pytest.mark.gpu
@hopper_with_quack
@pytest.mark.parametrize("activation", gemm.MLP_ACTIVATIONS)
def test_dispatch_measures_the_mlp_epilogue_and_replays_its_choice_in_a_graph(activation):
    d = dsp.KernelDispatcher()
    k, n = (4096, 24576) if activation == "swiglu" else (2048, 9216)
    x, w = _xw(8192, k, n, device="cuda")
    first = d.mlp_in(x, w, activation, one_rounding=True)
    (decision,) = [dec for key, dec in d.decisions().items() if key[0] == "mlp_in"]
    print((activation, decision.backend, decision.ms, decision.reason))
    assert decision.reason == "measured" and "quack" in decision.ms  # it built, and was no less accurate
    assert decision.backend == ("quack" if decision.ms["quack"] < decision.ms["torch"] else "torch")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        d.mlp_in(x, w, activation, one_rounding=True)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = d.mlp_in(x, w, activation, one_rounding=True)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured, first)


@pytest.mark.parametrize("is_installed", [True, False])
def test_an_installed_quack_that_does_not_import_is_logged_with_its_error_and_the_fix(is_installed, monkeypatch, caplog):
    """QuACK installed but broken (CuTe DSL missing a wheel, or installed outside site-packages): the split path
    serves, and the log says why and how to repair it; absent on purpose, nothing is logged."""
    with broken_install(monkeypatch, caplog, "quack", gemm.QUACK_DISTRIBUTION, is_installed,
                        gemm._epilogue_entry) as messages:
        entry, why = gemm._epilogue_entry()
    assert entry is None and why.startswith("QuACK's epilogue GEMMs not importable (ModuleNotFoundError")
    assert_repair_warning(messages, gemm.QUACK_DISTRIBUTION, is_installed, "cuBLAS", "(into site-packages)")
