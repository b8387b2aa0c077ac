"""The table-driven samplers are bit for bit diffusers' schedulers, step after step (CPU; the GPU
test repeats this on the H200).

Each case runs a whole schedule twice from the same start with the same random velocities: once
through the diffusers scheduler, once through `engine.pipeline.scheduler_tables`, and requires
`torch.equal` at every step. A wrong coefficient, a missed corrector, a history that rolls at the
wrong time or a lower-order step taken at the wrong index each changes bits and fails.
"""
import numpy as np
import pytest
import torch
from diffusers import FlowMatchEulerDiscreteScheduler, UniPCMultistepScheduler

from engine.pipeline.scheduler_tables import sampler_for, unipc_orders

UNIPC = dict(num_train_timesteps=1000, solver_order=2, prediction_type="flow_prediction", use_flow_sigmas=True,
             final_sigmas_type="zero", lower_order_final=True)


def _unipc(steps: int, native: bool = False, **overrides):
    scheduler = UniPCMultistepScheduler.from_config({**UNIPC, **overrides})
    if native:  # the checkpoints' `use_native_flow_schedule` path in the engine
        sigmas = np.linspace(1.0 - 1.0 / 1000, 0.0, steps + 1)[:-1]
        scheduler.set_timesteps(steps, sigmas=sigmas)
    else:
        scheduler.set_timesteps(steps)
    return scheduler


def _run_both(reference, ours, shape, seed, generator_seed=None, device="cpu"):
    torch.manual_seed(seed)
    start = torch.randn(shape, device=device)
    velocities = [torch.randn(shape, device=device) for _ in reference.timesteps]
    gen = torch.Generator().manual_seed(generator_seed) if generator_seed is not None else None
    ref_sample, our_sample = start.clone(), start.clone()
    for i, t in enumerate(reference.timesteps):
        kwargs = {"generator": gen} if generator_seed is not None else {}
        ref_sample = reference.step(velocities[i], t, ref_sample, return_dict=False, **kwargs)[0]
        ours.load_row(i)
        our_sample = ours.step(velocities[i], our_sample)
        assert torch.isfinite(our_sample).all()
        assert torch.equal(our_sample, ref_sample), f"step {i}: max diff {(our_sample - ref_sample).abs().max()}"
    return ref_sample


CASES = {
    "nano t2v defaults (shift 10, 35 steps)": dict(steps=35, flow_shift=10.0),
    "t2i defaults (shift 3, 50 steps)": dict(steps=50, flow_shift=3.0),
    "native flow schedule": dict(steps=20, flow_shift=10.0, native=True),
    "solver order 1": dict(steps=12, flow_shift=3.0, solver_order=1),
    "no lower-order final": dict(steps=10, flow_shift=5.0, lower_order_final=False, final_sigmas_type="sigma_min"),
    "corrector disabled at steps 0 and 3": dict(steps=9, flow_shift=3.0, disable_corrector=[0, 3]),
    "two steps": dict(steps=2, flow_shift=3.0),
}


@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_unipc_table_is_bitwise_diffusers(case):
    spec = dict(CASES[case])
    steps, native = spec.pop("steps"), spec.pop("native", False)
    reference, fresh = _unipc(steps, native, **spec), _unipc(steps, native, **spec)
    shape = (1, 1, 48, 3, 6, 5)
    ours = sampler_for(fresh, torch.empty(shape))
    assert ours is not None and ours.kind == "unipc" and ours.steps == steps
    _run_both(reference, ours, shape, seed=steps)


def test_unipc_orders_follow_warm_up_and_lower_order_final():
    assert unipc_orders(_unipc(6, flow_shift=3.0)) == [1, 2, 2, 2, 2, 1]
    assert unipc_orders(_unipc(4, flow_shift=3.0, lower_order_final=False)) == [1, 2, 2, 2]
    assert unipc_orders(_unipc(4, flow_shift=3.0, solver_order=1)) == [1, 1, 1, 1]


def test_distilled_sampler_is_bitwise_diffusers_with_the_same_generator():
    def make():
        scheduler = FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=1.0, use_dynamic_shifting=False,
                                                    stochastic_sampling=True)
        scheduler.set_timesteps(sigmas=[0.999, 0.75, 0.5, 0.25])
        return scheduler

    shape = (1, 1, 48, 2, 4, 4)
    ours = sampler_for(make(), torch.empty(shape), torch.Generator().manual_seed(11))
    assert ours is not None and ours.kind == "distilled" and ours.steps == 4
    _run_both(make(), ours, shape, seed=3, generator_seed=11)


def test_unsupported_schedulers_fall_back_to_diffusers():
    for overrides in (dict(solver_order=3), dict(solver_type="bh1")):
        assert sampler_for(_unipc(5, flow_shift=3.0, **overrides), torch.empty(2, 3)) is None
    eps = UniPCMultistepScheduler(num_train_timesteps=1000, solver_order=2)
    eps.set_timesteps(5)
    assert sampler_for(eps, torch.empty(2, 3)) is None
    deterministic = FlowMatchEulerDiscreteScheduler(shift=1.0)
    deterministic.set_timesteps(4)
    assert sampler_for(deterministic, torch.empty(2, 3)) is None


def test_a_wrong_coefficient_is_caught():
    """The comparison above is sharp: one ulp in one coefficient of one step fails it."""
    reference, fresh = _unipc(6, flow_shift=3.0), _unipc(6, flow_shift=3.0)
    shape = (1, 1, 48, 2, 4, 4)
    ours = sampler_for(fresh, torch.empty(shape))
    ours.table[3, 0] = torch.nextafter(ours.table[3, 0], torch.tensor(2.0))
    with pytest.raises(AssertionError, match="step 3"):
        _run_both(reference, ours, shape, seed=1)


def test_a_schedule_is_built_once_and_each_request_gets_its_own_copy(monkeypatch):
    """The table of a schedule seen before comes from the model's kept tables (no second build), equal bit for
    bit, and is a copy: a request that changes its table does not change the next request's."""
    from engine.model.runtime import TableCache
    from engine.pipeline import scheduler_tables

    built = []
    real = scheduler_tables.unipc_table
    monkeypatch.setattr(scheduler_tables, "unipc_table", lambda *a, **k: built.append(1) or real(*a, **k))
    tables = TableCache()
    shape = (1, 1, 48, 2, 4, 4)
    first = sampler_for(_unipc(7, flow_shift=3.0), torch.empty(shape), tables=tables)
    second = sampler_for(_unipc(7, flow_shift=3.0), torch.empty(shape), tables=tables)
    assert len(built) == 1
    assert torch.equal(first.table, second.table) and first.table.data_ptr() != second.table.data_ptr()
    first.table[2, 0] = 0.5
    third = sampler_for(_unipc(7, flow_shift=3.0), torch.empty(shape), tables=tables)
    assert torch.equal(third.table, second.table)
    # Any change to what the table is computed from builds a new one: shift, steps, corrector.
    for other in (_unipc(7, flow_shift=5.0), _unipc(8, flow_shift=3.0), _unipc(7, flow_shift=3.0, disable_corrector=[2])):
        sampler_for(other, torch.empty(shape), tables=tables)
    assert len(built) == 4
    _run_both(_unipc(7, flow_shift=3.0), sampler_for(_unipc(7, flow_shift=3.0), torch.empty(shape), tables=tables),
              shape, seed=2)
    sampler_for(_unipc(7, flow_shift=3.0), torch.empty(shape))  # no tables given: built, and kept nowhere
    assert len(built) == 5 and len(tables) == 4


def test_the_table_cache_is_bounded():
    from engine.model.runtime import MAX_TABLES, TableCache

    tables = TableCache()
    for steps in range(2, 4 + MAX_TABLES):
        sampler_for(_unipc(steps, flow_shift=3.0), torch.empty(1, 1, 48, 1, 2, 2), tables=tables)
    assert len(tables) == MAX_TABLES


def test_a_models_runtime_keeps_its_sampler_tables(tiny_family):
    """The whole step takes its UniPC table from the model's runtime: a second request of the same schedule
    builds none."""
    import engine
    from engine.pipeline.fast_path import FastPathOptions
    from engine.pipeline.run import generate

    model = engine.load_model(tiny_family["nano"], device="cpu")
    model.fast_path = FastPathOptions(enabled=True, cuda_graphs=False, kernels="torch")
    request = dict(mode="t2i", prompt="a red kite", steps=3, seed=1)
    assert generate(model, request).trace.whole_step == "built" and len(model.runtime.unipc_tables) == 1
    generate(model, dict(request, seed=2))
    assert len(model.runtime.unipc_tables) == 1


def test_sampler_supported_says_what_sampler_for_will_do():
    """The whole step asks before prefill whether a table sampler (hence a kept step) will exist."""
    from engine.pipeline.scheduler_tables import sampler_supported

    for scheduler in (_unipc(5, flow_shift=3.0), FlowMatchEulerDiscreteScheduler(shift=1.0, stochastic_sampling=True),
                      FlowMatchEulerDiscreteScheduler(shift=1.0)):
        if isinstance(scheduler, FlowMatchEulerDiscreteScheduler):
            scheduler.set_timesteps(sigmas=[0.9, 0.5, 0.2])
        assert sampler_supported(scheduler) == (sampler_for(scheduler, torch.empty(1, 1, 48, 1, 2, 2)) is not None)
    assert not sampler_supported(FlowMatchEulerDiscreteScheduler(shift=1.0))
