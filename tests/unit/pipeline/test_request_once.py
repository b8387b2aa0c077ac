"""A request is validated and its caption parsed exactly once, from each entry point to the GPU, and
every entry point refuses a caption with a wrongly typed field, naming the field.

Counted by wrapping `sampling_limits` as `engine.pipeline.request` sees it (one call per validation)
and `engine.pipeline.captions.parse_caption` (every parse, the UI's included). Each run goes all the
way through the tiny Nano checkpoint (2 steps, T2I), so a parse in the prompt stage would count too.
"""
import asyncio
import json
import pickle

import pytest

import engine
from engine.pipeline import captions
from engine.pipeline import request as request_module
from engine.serving.batch import parse_batch, run_batch
from engine.events import Failed
from engine.serving.queue import JobQueue
from engine.serving.registry import ModelEntry, ModelRegistry

CAPTION = json.dumps({"context": "A red kite over a windy beach.", "subjects": [{"description": "a kite"}]})
BAD_CAPTION = json.dumps({"context": "A kite.", "subjects": "a kite"})  # subjects must be a list
REQUEST = {"mode": "t2i", "prompt": CAPTION, "steps": 2, "seed": 3}


@pytest.fixture(scope="module")
def queue(tiny_family, tmp_path_factory):
    registry = ModelRegistry([ModelEntry("nano", str(tiny_family["nano"]))])
    job_queue = JobQueue(registry, tmp_path_factory.mktemp("once-outputs"), max_size=4)
    try:
        yield job_queue
    finally:
        job_queue.close()


@pytest.fixture()
def counts(monkeypatch):
    seen = {"validations": 0, "parses": 0}
    limits, parse = request_module.sampling_limits, captions.parse_caption

    def counted_limits(*args):
        seen["validations"] += 1
        return limits(*args)

    def counted_parse(*args):
        seen["parses"] += 1
        return parse(*args)

    monkeypatch.setattr(request_module, "sampling_limits", counted_limits)
    monkeypatch.setattr(captions, "parse_caption", counted_parse)
    return seen


def _service(queue):
    from cosmos3_ui.service import StudioService

    return StudioService(queue.registry, queue, queue.outputs_root)


def _api(queue, request_json):
    from cosmos3_ui.api import generate_api
    from cosmos3_ui.jobs import JobFollower

    follower = JobFollower(_service(queue))
    return asyncio.run(generate_api(follower, "nano", request_json, None, "session-1", lambda *a, **k: None))


def test_generate_api_validates_and_parses_once(queue, counts):
    _media, summary = _api(queue, json.dumps(REQUEST))
    assert summary["seed"] == 3
    assert counts == {"validations": 1, "parses": 1}


def test_batch_validates_and_parses_once(queue, counts):
    lines = parse_batch(json.dumps({"model": "nano", **REQUEST}))
    _batch_id, done = run_batch(queue, lines)
    assert [line.status for line in done] == ["done"]
    assert counts == {"validations": 1, "parses": 1}


def test_cli_validates_and_parses_once(tiny_family, tmp_path, counts, capsys):
    from engine.__main__ import main

    params = json.dumps({"steps": 2, "seed": 3})
    assert main(["generate", "--model", str(tiny_family["nano"]), "--mode", "t2i", "--prompt", CAPTION,
                 "--params", params, "--out", str(tmp_path), "--device", "cpu"]) == 0
    assert counts == {"validations": 1, "parses": 1}


def test_the_queue_keeps_the_request_it_validated(queue, counts):
    handle = queue.submit("nano", dict(REQUEST))
    result = handle.result(timeout=300)
    assert counts == {"validations": 1, "parses": 1}
    assert result.params["prompt"] == CAPTION and result.params["steps"] == 2


def test_ui_handler_path_parses_once(queue, counts):
    """The Studio's own Generate path (the T2I tab's values -> `forms.gen_request` -> `StudioService.submit`),
    with a Form field edited whose event never reached the JSON (a paste): one validation, one parse."""
    from cosmos3_ui import forms
    from cosmos3_ui.layout import Studio

    studio = Studio(_service(queue))
    try:
        tab = studio.page.t2i
        v = {c: c.value for c in forms.gen_inputs(studio.page, tab)}
        v.update({studio.page.model: "nano", tab.resolution: "64x64", tab.sampling.steps: 2,
                  tab.sampling.randomize: False, tab.sampling.seed: 3,
                  tab.editor.texts["context"]: "PASTEDCONTEXT at a wedding"})
        counts.update(validations=0, parses=0)  # building the page parsed the example captions once each
        request = forms.gen_request(tab, v)
        result = studio.service.submit("nano", request, "session-2").result(timeout=300)
    finally:
        studio.close()
    assert counts == {"validations": 1, "parses": 1}
    assert "PASTEDCONTEXT at a wedding" in result.params["prompt"] and result.seed == 3


def test_every_entry_point_refuses_a_wrongly_typed_caption_field(queue, tiny_family, tmp_path, capsys):
    bad = {**REQUEST, "prompt": BAD_CAPTION}
    with pytest.raises(engine.RequestError) as refused:
        queue.submit("nano", bad)
    assert refused.value.field == "prompt.subjects" and "must be a list" in str(refused.value)
    with pytest.raises(Exception, match="subjects"):  # /generate: gr.Error carrying the engine's message
        _api(queue, json.dumps(bad))
    _batch_id, done = run_batch(queue, parse_batch(json.dumps({"model": "nano", **bad})))
    assert done[0].status == "failed" and "prompt: Caption field error: subjects" in done[0].message
    from engine.__main__ import main

    assert main(["generate", "--model", str(tiny_family["nano"]), "--mode", "t2i", "--prompt", BAD_CAPTION,
                 "--out", str(tmp_path), "--device", "cpu"]) == 2
    assert "subjects" in capsys.readouterr().err
    negative = {**REQUEST, "negative_prompt": json.dumps({"subjects": [{"age": []}]})}
    with pytest.raises(engine.RequestError) as refused:
        queue.submit("nano", negative)
    assert refused.value.field.startswith("negative_prompt.subjects[0]")


def test_a_request_is_frozen_typed_and_pickles(tiny_family):
    info = engine.inspect_checkpoint(tiny_family["nano"])
    request = engine.validate_request(info, "t2i", dict(REQUEST))
    assert isinstance(request, engine.Request) and request.steps == 2 and request.caption["context"]
    with pytest.raises(AttributeError):
        request.steps = 3
    assert engine.validate_request(info, "t2i", request) is request  # never validated twice
    again = pickle.loads(pickle.dumps(request))
    assert again.to_dict() == request.to_dict() and again.caption_of("prompt") == request.caption_of("prompt")
    assert request["guidance_interval"] == [400.0, 1000.0] and request.guidance_interval == (400.0, 1000.0)
    with pytest.raises(engine.RequestError) as refused:
        engine.validate_request(info, "t2i", {**REQUEST, "steps": 0})
    assert refused.value.field == "steps"
    assert Failed("x", kind="invalid", field="steps").field == "steps"


def test_compare_validates_each_models_request_once_and_submits_it_as_it_is(tiny_family, tmp_path, counts):
    """Compare plans with `validate_request` (to say why a model cannot run) and submits that Request:
    one validation and one parse per model, none again in the queue or the worker."""
    import anyio

    from cosmos3_ui.compare import CompareSettings, plan_compare, run_compare

    registry = ModelRegistry([ModelEntry(name, str(tiny_family["nano"])) for name in ("nano-a", "nano-b")])
    job_queue = JobQueue(registry, tmp_path, max_size=4)
    try:
        service = _service(job_queue)
        settings = CompareSettings(mode="t2i", prompt=CAPTION, seed=3, steps=2)

        async def run():
            slots = plan_compare(service, ["nano-a", "nano-b"], settings)
            follow = lambda handle: anyio.to_thread.run_sync(handle.result)  # noqa: E731
            return [outcome async for _, outcome in run_compare(service, slots, "session-3", follow)]

        outcomes = asyncio.run(run())
    finally:
        job_queue.close()
    assert [o.status for o in outcomes] == ["done", "done"]
    assert counts == {"validations": 2, "parses": 2}
