"""`--remote URL`: a studio fronting a second studio instance generates through it (its UI's /generate,
its own /v1 API), shows the remote's models, and cancels on the remote."""
import json
import time

import httpx
import pytest
from gradio_client import Client

from harness import launched_studio

KEY = "sk-remote-peer-001"


@pytest.fixture(scope="module")
def studios(tiny_family, tmp_path_factory):
    folder = tmp_path_factory.mktemp("remote")
    (folder / "keys").write_text(f"{KEY} concurrency=8\n")
    backend_argv = ["--outputs", str(folder / "backend-out"), "--cache-dir", str(folder / "c1"),
                    "--api-keys", str(folder / "keys"), "--model", f"nano={tiny_family['nano']}",
                    "--model", f"super={tiny_family['super']}"]
    with launched_studio(backend_argv) as (_, backend_url):
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv("COSMOS3_REMOTE_KEY", KEY)
            front_argv = ["--outputs", str(folder / "front-out"), "--cache-dir", str(folder / "c2"),
                          "--remote", backend_url]
            with launched_studio(front_argv) as (front, front_url):
                yield front, front_url, folder, backend_url


def test_remote_models_appear_in_the_picker(studios):
    front, url, _, _ = studios
    models = {m["name"]: m for m in Client(url, verbose=False).predict(api_name="/models")}
    assert set(models) == {"nano", "super"}
    assert "action" in models["nano"]["modes"] and "action" not in models["super"]["modes"]
    assert models["nano"]["is_tiny"] and models["nano"]["defaults"]["t2i"]["resolutions"][0] == [64, 64]
    assert models["nano"]["label"].startswith("remote: http://127.0.0.1:")


def test_ui_generate_runs_on_the_remote(studios):
    front, url, folder, backend = studios
    media, result = Client(url, verbose=False).predict(
        "nano", json.dumps({"mode": "t2v", "prompt": "a kite", "width": 64, "height": 64, "num_frames": 5,
                            "steps": 2, "seed": 21}), None, api_name="/generate")
    assert media.endswith(".mp4") and result["seed"] == 21 and result["params"]["num_frames"] == 5
    request_id = result["request_id"]
    assert (folder / "backend-out" / "api" / request_id / "video.mp4").is_file()  # made by the remote
    assert (folder / "front-out" / request_id / "video.mp4").is_file()  # kept here for history and review
    assert (folder / "front-out" / request_id / "params.json").is_file()


def test_front_api_images_and_cancel_go_through_the_remote(studios):
    front, url, folder, backend = studios
    http = httpx.Client(base_url=url + "v1/", timeout=120)
    image = http.post("images/generations", json={"model": "super", "prompt": "a lighthouse", "size": "64x64",
                                                  "steps": 2, "seed": 5})
    assert image.status_code == 200, image.text
    request_id = image.json()["result"]["request_id"]
    assert (folder / "backend-out" / "api" / request_id / "image.png").is_file()
    refused = http.post("videos", json={"model": "super", "prompt": "x", "size": "64x64", "sound": True})
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "sound"  # the remote's own limits
    job_id = http.post("videos", json={"model": "nano", "prompt": "long", "size": "64x64", "num_frames": 17,
                                       "steps": 100}).json()["id"]
    deadline = time.monotonic() + 60
    while http.get(f"videos/{job_id}").json()["status"] != "generating":
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert http.delete(f"videos/{job_id}").json()["status"] == "cancelled"
    assert http.get("queue").json()["backend"] == "remote"
    listed = lambda: httpx.get(backend + "v1/videos", headers={"Authorization": f"Bearer {KEY}"}).json()["data"]
    deadline = time.monotonic() + 30
    while not any(job["status"] == "cancelled" for job in listed()):  # cancelled there too
        assert time.monotonic() < deadline, listed()
        time.sleep(0.1)


def test_a_plain_dialect_server_gets_text_modes_and_reasons(tmp_path):
    """A server that only names its models (SGLang, vLLM-Omni): the released variant of the family its id
    names, text-to-image and text-to-video, the rest unavailable with the reason; its request names."""
    import base64
    import io

    from PIL import Image

    from cosmos3_ui.controls import unsupported_reason
    from engine.serving.remote import RemoteJobQueue, RemoteRegistry

    png = io.BytesIO()
    Image.new("RGB", (1024, 1024)).save(png, format="PNG")
    sent = []

    def server(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/models":
            return httpx.Response(200, json={"data": [{"id": "nvidia/Cosmos3-Nano"}, {"id": "some-llm"}]})
        sent.append(json.loads(request.content))
        return httpx.Response(200, json={"data": [{"b64_json": base64.b64encode(png.getvalue()).decode()}]})

    registry = RemoteRegistry("http://peer:30000", transport=httpx.MockTransport(server))
    assert registry.names() == ["nvidia/Cosmos3-Nano"] and "some-llm" in registry.skipped
    described = registry.describe("nvidia/Cosmos3-Nano")
    assert described["modes"] == ["t2i", "t2v"] and set(described["unavailable"]) == {"i2v", "v2v", "action", "sound"}
    assert "plain /v1 dialect" in unsupported_reason(described, "action")
    queue = RemoteJobQueue(registry, tmp_path)
    with pytest.raises(ValueError, match="supports"):
        queue.submit("nvidia/Cosmos3-Nano", {"mode": "i2v", "prompt": "x", "image": "y.png"})
    result = queue.submit("nvidia/Cosmos3-Nano", {"mode": "t2i", "prompt": "a kite", "steps": 20, "seed": 3}).result(30)
    assert result.outputs["image"].is_file() and result.seed == 3
    assert sent == [{"model": "nvidia/Cosmos3-Nano", "prompt": "a kite", "size": "1024x1024", "seed": 3,
                     "num_inference_steps": 20, "response_format": "b64_json"}]


def test_a_forwarding_front_end_keeps_a_validated_request(tiny_family, tmp_path):
    """Compare submits an `engine.Request`: a front end whose jobs run elsewhere (--remote, --ray) takes it
    as it is (no second validation) and forwards its plain values; a bad request is refused by field."""
    import engine
    from engine.serving.forwarded import ForwardingQueue
    from engine.serving.registry import ModelEntry, ModelRegistry

    class Held(ForwardingQueue):
        def _forward(self, handle):  # the test reads the handle; nothing runs
            pass

    registry = ModelRegistry([ModelEntry("nano", str(tiny_family["nano"]))])
    request = engine.validate_request(registry.info("nano"), "t2i", {"mode": "t2i", "prompt": "a kite", "steps": 2})
    front = Held(registry, tmp_path)
    handle = front.submit("nano", request)
    assert handle.validated is request and handle.request == request.to_dict()
    with pytest.raises(engine.RequestError) as refused:
        front.submit("nano", {"prompt": "a kite"})
    assert refused.value.field == "mode"
