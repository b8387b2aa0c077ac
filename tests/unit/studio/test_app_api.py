"""The scripting API against the launched app (in-process, tiny family): `/models` and `/generate`."""
import json
import time

import numpy as np
import pytest
from PIL import Image

gradio_client = pytest.importorskip("gradio_client")
from gradio_client import Client  # noqa: E402
from gradio_client.exceptions import AppError  # noqa: E402

from harness import generate_through_api, launched_studio  # noqa: E402

TINY_NAMES = ("nano", "nano-distilled", "super", "super-distilled", "edge", "edge-distilled")


@pytest.fixture(scope="module")
def studio_url(tiny_family, tmp_path_factory):
    outputs = tmp_path_factory.mktemp("api-outputs")
    argv = ["--outputs", str(outputs), "--cache-dir", str(tmp_path_factory.mktemp("api-cache")), "--queue-size", "2"]
    for name in TINY_NAMES:
        argv += ["--model", f"{name}={tiny_family[name]}"]
    with launched_studio(argv) as (studio, url):
        yield url, studio, outputs


@pytest.fixture(scope="module")
def client(studio_url):
    return Client(studio_url[0], verbose=False)


def test_only_models_generate_and_reason_are_public(client):
    endpoints = client.view_api(return_format="dict", print_info=False)
    assert set(endpoints["named_endpoints"]) == {"/models", "/generate", "/reason"}
    reason = endpoints["named_endpoints"]["/reason"]["parameters"]
    assert [p["parameter_name"] for p in reason] == ["model_name", "request_json", "file"]
    assert not endpoints["unnamed_endpoints"]
    params = endpoints["named_endpoints"]["/generate"]["parameters"]
    assert [p["parameter_name"] for p in params] == ["model_name", "request_json", "file"]
    assert params[2]["parameter_has_default"]


def test_models_lists_the_six_tiny_variants(client):
    models = client.predict(api_name="/models")
    assert [m["name"] for m in models] == list(TINY_NAMES)
    by_name = {m["name"]: m for m in models}
    for m in models:
        assert {"name", "family", "is_edge", "is_distilled", "modes", "defaults"} <= set(m)
        assert set(m["defaults"]) == set(m["modes"]) - {"sound"}
    assert by_name["edge"]["is_edge"] and by_name["edge"]["family"] == "edge"
    assert by_name["nano-distilled"]["is_distilled"] and "action" not in by_name["nano-distilled"]["modes"]
    assert "sound" in by_name["nano"]["modes"] and "action" not in by_name["super"]["modes"]
    t2i = by_name["nano"]["defaults"]["t2i"]
    assert t2i["resolutions"] == [[64, 64], [96, 64], [64, 96], [128, 64]] and t2i["guidance_interval"]
    distilled = by_name["super-distilled"]["defaults"]["t2v"]
    assert distilled["steps_locked"] and distilled["guidance_scale"] == 1.0 and distilled["steps"] == 4


def test_t2i_png_from_a_json_caption(client, studio_url):
    caption = {"subjects": [{"description": "a red kite over a beach"}], "lighting": {"conditions": "noon sun"},
               "resolution": {"H": 1, "W": 1}}
    media, result = generate_through_api(client, "nano", {"mode": "t2i", "prompt": json.dumps(caption), "width": 96,
                                               "height": 64, "steps": 3, "seed": 1234})
    assert media.endswith(".png")
    with Image.open(media) as image:
        assert image.size == (96, 64)
    assert result["seed"] == 1234 and result["model"] == "nano"
    sent = json.loads(result["prompt_text"])
    assert sent["resolution"] == {"H": 64, "W": 96} and sent["aspect_ratio"] == "4,3"  # metadata injected (nearest of the five)
    assert sent["subjects"] == caption["subjects"] and "duration" not in sent
    assert result["params"]["steps"] == 3 and result["params"]["mode"] == "t2i"
    assert result["timings"]["denoise"] > 0 and result["timings"]["total"] > 0
    assert set(result["files"]) == {"image", "sidecar"}
    # The files were written under the app's outputs root, one folder per request.
    outputs = studio_url[2]
    assert (outputs / result["request_id"] / "image.png").is_file()


def test_same_seed_same_image(client):
    request = {"mode": "t2i", "prompt": "a lighthouse at dusk", "steps": 2, "seed": 7}
    first, _ = generate_through_api(client, "edge", request)
    second, result = generate_through_api(client, "edge", request)
    assert np.array_equal(np.asarray(Image.open(first)), np.asarray(Image.open(second)))
    random_media, random_result = generate_through_api(client, "edge", dict(request, seed=-1))
    assert random_result["seed"] >= 0 and random_result["params"]["seed"] == random_result["seed"]


def test_t2v_mp4(client):
    media, result = generate_through_api(client, "edge", {"mode": "t2v", "prompt": "waves roll onto a pebble beach",
                                               "num_frames": 9, "steps": 2, "fps": 12, "seed": 3})
    assert media.endswith(".mp4")
    import av

    with av.open(media) as container:
        frames = [f for f in container.decode(video=0)]
    assert len(frames) == 9 and (frames[0].width, frames[0].height) == (64, 64)
    assert result["frames"][:1] == [9] and result["params"]["fps"] == 12.0
    assert "The video is" in result["prompt_text"]  # prose takes the sentence templates


def test_policy_action_result(client, tmp_path):
    first_frame = tmp_path / "start.png"
    Image.fromarray(np.full((96, 96, 3), 120, np.uint8)).save(first_frame)
    request = {"mode": "action", "prompt": "push the cup to the left", "steps": 2, "seed": 5,
               "action": {"kind": "policy", "domain": "bridge_orig_lerobot", "chunk_size": 4,
                          "resolution_tier": 256, "view_point": "wrist_view"}}
    media, result = generate_through_api(client, "nano", request, first_frame)
    assert media.endswith(".mp4")
    actions = np.asarray(result["actions"])
    assert actions.shape == (4, 10) and np.isfinite(actions).all()
    assert set(result["files"]) == {"video", "actions", "sidecar"}
    sent = json.loads(result["prompt_text"])
    assert sent["actions"][0]["description"] == "push the cup to the left."
    assert "wrist" in sent["cinematography"]["framing"]


def test_forward_dynamics_with_an_actions_file(client, tmp_path):
    first_frame = tmp_path / "start.png"
    Image.fromarray(np.full((64, 64, 3), 60, np.uint8)).save(first_frame)
    # One file per call: the actions come inline, the image as the file.
    rows = np.linspace(-1, 1, 4 * 10).reshape(4, 10).round(3).tolist()
    request = {"mode": "action", "steps": 2, "seed": 1,
               "action": {"kind": "forward_dynamics", "domain": "umi", "chunk_size": 4, "resolution_tier": 256,
                          "actions": rows}}
    media, result = generate_through_api(client, "edge", request, first_frame)
    assert media.endswith(".mp4") and result["params"]["action"]["kind"] == "forward_dynamics"


def test_off_whitelist_size_is_refused_with_the_allowed_sizes(client):
    with pytest.raises(AppError) as info:
        generate_through_api(client, "nano", {"mode": "t2i", "prompt": "a cat", "width": 128, "height": 128, "steps": 2})
    message = str(info.value)
    assert "128x128" in message and "Allowed sizes (WxH): 64x64, 96x64, 64x96, 128x64" in message
    assert "Traceback" not in message


@pytest.mark.parametrize(
    "model, request_json, fragment",
    [
        ("nano", "{\"mode\": \"t2i\", \"prompt\": \"x\",}", "line 1, column"),
        ("nano", "[1, 2]", "must be a JSON object"),
        ("nope", json.dumps({"mode": "t2i", "prompt": "x"}), "Unknown model 'nope'"),
        ("super", json.dumps({"mode": "action", "action": {"kind": "policy", "domain": "umi"}}), "does not support"),
        ("nano", json.dumps({"mode": "i2v", "prompt": "x", "image": "/etc/passwd"}), "upload it as the `file`"),
        ("nano", json.dumps({"mode": "t2v", "prompt": "x", "num_frames": 8}), "4k+1"),
        ("nano-distilled", json.dumps({"mode": "t2i", "prompt": "x", "steps": 9}), "exactly 4 steps"),
        ("edge", json.dumps({"mode": "t2v", "prompt": "x", "sound": True}), "cannot generate sound"),
        ("nano", json.dumps({"mode": "t2i", "prompt": "{\"subjects\": [}"}), "line 1, column"),
    ],
)
def test_bad_requests_get_a_specific_message(client, model, request_json, fragment):
    with pytest.raises(AppError) as info:
        client.predict(model, request_json, None, api_name="/generate")
    assert fragment.lower() in str(info.value).lower()


def test_a_file_the_mode_does_not_take_is_refused(client, tmp_path):
    picture = tmp_path / "p.png"
    Image.fromarray(np.zeros((64, 64, 3), np.uint8)).save(picture)
    with pytest.raises(AppError, match="takes no file"):
        generate_through_api(client, "nano", {"mode": "t2v", "prompt": "x"}, picture)


def test_full_queue_answers_clearly_and_cancel_frees_it(studio_url):
    url, studio, _ = studio_url
    clients = [Client(url, verbose=False) for _ in range(4)]
    long_job = {"mode": "t2v", "prompt": "a slow pan", "num_frames": 17, "width": 96, "height": 64, "steps": 100}
    jobs = [clients[0].submit("nano", json.dumps(long_job), None, api_name="/generate")]
    deadline = time.time() + 60
    while studio.service.active.count() == 0 and time.time() < deadline:
        time.sleep(0.1)
    assert studio.service.active.count() == 1  # the first job holds the one GPU slot
    jobs += [c.submit("nano", json.dumps(dict(long_job, steps=2)), None, api_name="/generate") for c in clients[1:]]
    # Queue size 2: two wait and whichever arrives third is turned away with a clear message.
    deadline = time.time() + 30
    while time.time() < deadline and not any(j.done() for j in jobs[1:]):
        time.sleep(0.1)
    refused = [j for j in jobs[1:] if j.done()]
    assert len(refused) == 1
    with pytest.raises(Exception) as info:
        refused[0].result(timeout=5)
    assert "queue is full" in str(info.value).lower()
    assert all(not j.done() for j in jobs if j is not refused[0])
    for job in jobs:
        job.cancel()
    deadline = time.time() + 30
    while studio.service.active.count() and time.time() < deadline:
        time.sleep(0.1)
    assert studio.service.active.count() == 0  # the running job was stopped, not left to finish


def test_the_readme_scripting_example_runs_as_written(studio_url, monkeypatch):
    """README's `/generate` example, run verbatim (only the URL is this test's server) against the tiny
    family that `python app.py` embeds: it used to ask for 121 frames, which the tiny models refuse."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[3]
    readme = (root / "README.md").read_text(encoding="utf-8")
    section = readme.split("## Scripting API", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    assert "http://127.0.0.1:7860/" in code and "/generate" in code
    monkeypatch.chdir(root)  # the example names a file of the repository
    scope: dict = {}
    exec(compile(code.replace("http://127.0.0.1:7860/", studio_url[0]), "README.md", "exec"), scope)  # noqa: S102
    media, result = scope["media"], scope["result"]
    assert media and Path(media).is_file() and result["params"]["mode"] == "i2v"
    assert any(m["name"] == "nano" for m in scope["models"])
