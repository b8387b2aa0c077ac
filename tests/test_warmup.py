"""Warm-up by default, in the background: which modes each family warms, COSMOS3_WARMUP, and how the job
queue's single worker runs warm requests only while no user job waits (engine.serving.warmup).

No GPU work runs here: the queue loads stand-in models (the tiny checkpoints' own VariantInfo, no
weights) and `generate` is replaced by `FakeGpu`, which records every call in order, can hold warm
requests until the test lets them through, and honours the cancel event the way `generate` does.
"""
from __future__ import annotations

import pytest

from engine.serving import warmup


# -- the family table and COSMOS3_WARMUP -----------------------------------------------------------

def test_each_family_warms_the_modes_whose_cold_first_request_exceeds_1_5x_warm():
    assert warmup.modes_for("edge", None) == ("t2i", "t2v")  # T2I 10.6x, T2V 1.88x
    assert warmup.modes_for("nano", None) == ("t2i",)  # T2I 2.5x; T2V 1.03x and minutes to warm
    assert warmup.modes_for("super", None) == ("t2i",)
    assert warmup.modes_for("custom", None) == ()  # nothing measured, nothing warmed
    assert warmup.modes_for("nano", ("t2v",)) == ("t2v",)  # what the variable names wins
    assert warmup.modes_for("edge", ()) == ()


@pytest.mark.parametrize("value, modes", [
    (None, None),  # unset: each family's default
    ("t2i,t2v", ("t2i", "t2v")),
    (" T2V , t2i,t2v, ", ("t2v", "t2i")),
    ("t2i", ("t2i",)),
    ("off", ()), ("OFF", ()), ("none", ()), ("0", ()), ("", ()), ("  ", ()),
])
def test_cosmos3_warmup_names_the_modes_or_turns_warm_up_off(value, modes):
    environ = {} if value is None else {"COSMOS3_WARMUP": value}
    assert warmup.modes_from_env(environ) == modes


def test_an_unknown_mode_in_cosmos3_warmup_says_what_was_received_and_what_is_allowed():
    with pytest.raises(ValueError) as info:
        warmup.modes_from_env({"COSMOS3_WARMUP": "t2i,i2v"})
    message = str(info.value)
    assert "COSMOS3_WARMUP='t2i,i2v'" in message and "'i2v'" in message
    assert "t2i, t2v" in message and "'off'" in message
