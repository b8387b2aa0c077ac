"""bench/e2e.py's step benches reach their inputs (the GPU runs are the bench's; this checks the call)."""
import pytest


class _Reached(Exception):
    pass


@pytest.mark.parametrize("name", ["fp8_step", "profile_step"])
def test_step_benches_build_their_inputs_at_the_default_prefixes(name, monkeypatch):
    from bench import e2e, models

    seen = {}

    def step_inputs(model, **kwargs):
        seen.update(kwargs)
        raise _Reached

    monkeypatch.setattr(models, "step_inputs", step_inputs)
    with pytest.raises(_Reached):
        getattr(e2e, name)(None, 64, 64, 1, log=lambda *a: None)
    assert seen == dict(width=64, height=64, frames=1, prefix_lens=(1615, 2866))
