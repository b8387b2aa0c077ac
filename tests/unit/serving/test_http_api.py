"""The /v1 HTTP API against the launched app (tiny models): the official `openai` client, the video
lifecycle over httpx, 400 naming the field, 401, 429 and per-key ownership."""
import base64
import io
import time

import httpx
import pytest
from PIL import Image

from harness import TERMINAL, launched_studio, wait_for_job

openai = pytest.importorskip("openai")

KEY_A, KEY_B, KEY_ONE, KEY_HOURLY = "sk-test-alpha-0001", "sk-test-bravo-0002", "sk-test-single-03", "sk-test-hourly-04"


@pytest.fixture(scope="module")
def api(tiny_family, tmp_path_factory):
    keys = tmp_path_factory.mktemp("keys") / "keys.txt"
    keys.write_text(f"# test keys\n{KEY_A} name=alpha concurrency=3\n{KEY_B} name=bravo\n"
                    f"{KEY_ONE} name=single concurrency=1\n{KEY_HOURLY} name=hourly per_hour=1\n")
    argv = ["--outputs", str(tmp_path_factory.mktemp("http-out")), "--cache-dir", str(tmp_path_factory.mktemp("c")),
            "--api-keys", str(keys), "--model", f"nano={tiny_family['nano']}",
            "--model", f"edge={tiny_family['edge']}"]
    with launched_studio(argv) as (studio, url):
        yield url


def client(url, key=KEY_A):
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.Client(base_url=url + "v1/", headers=headers, timeout=120)


def test_openai_client_creates_an_image(api):
    oa = openai.OpenAI(base_url=api + "v1", api_key=KEY_A, max_retries=0)
    assert {m.id for m in oa.models.list()} == {"nano", "edge"}
    made = oa.images.generate(model="nano", prompt="a lighthouse at dusk", size="96x64", response_format="b64_json",
                              extra_body={"steps": 2, "seed": 11})
    with Image.open(io.BytesIO(base64.b64decode(made.data[0].b64_json))) as image:
        assert image.size == (96, 64) and image.format == "PNG"
    by_url = oa.images.generate(model="nano", prompt="a lighthouse at dusk", size="96x64", response_format="url",
                                extra_body={"steps": 2, "seed": 11})
    png = client(api).get(by_url.data[0].url)
    assert png.status_code == 200 and png.headers["content-type"] == "image/png"
    assert png.content == base64.b64decode(made.data[0].b64_json)  # same seed, same image
    assert client(api, KEY_B).get(by_url.data[0].url).status_code == 404  # another key's file
    with pytest.raises(openai.BadRequestError) as refused:
        oa.images.generate(model="nano", prompt="x", size="100x100")
    assert refused.value.body["param"] == "size" and "Allowed sizes" in refused.value.body["message"]


def test_video_lifecycle_create_poll_download(api):
    http = client(api)
    created = http.post("videos", json={"model": "nano", "prompt": "a kite", "size": "64x64", "num_frames": 5,
                                        "steps": 3, "seed": 4})
    assert created.status_code == 200 and created.json()["status"] in ("queued", "generating")
    job_id = created.json()["id"]
    seen, deadline = set(), time.monotonic() + 120
    while time.monotonic() < deadline:
        job = http.get(f"videos/{job_id}").json()
        seen.add(job["status"])
        if job["status"] in TERMINAL:
            break
    assert job["status"] == "completed" and job["progress"] == 100 and job["error"] is None
    assert seen <= {"queued", "generating", "encoding", "completed"}
    assert job["result"]["params"]["num_frames"] == 5 and job["result"]["seed"] == 4
    video = http.get(f"videos/{job_id}/content")
    assert video.status_code == 200 and video.headers["content-type"] == "video/mp4" and video.content[4:8] == b"ftyp"
    params = http.get(f"videos/{job_id}/content", params={"variant": "params"}).json()
    assert params["seed"] == 4
    assert job_id in [j["id"] for j in http.get("videos").json()["data"]]
    assert http.delete(f"videos/{job_id}").json()["deleted"] is True
    assert http.get(f"videos/{job_id}").status_code == 404


def test_cancel_mid_run(api):
    http = client(api)
    job_id = http.post("videos", json={"model": "nano", "prompt": "a long one", "size": "64x64", "num_frames": 17,
                                       "steps": 100}).json()["id"]
    running = wait_for_job(http, job_id, until=("generating",) + TERMINAL)
    while running["stage"] != "denoise" and running["status"] not in TERMINAL:
        running = http.get(f"videos/{job_id}").json()
    assert running["status"] == "generating"
    cancelled = http.delete(f"videos/{job_id}").json()
    assert cancelled["status"] == "cancelled" and cancelled["error"]["code"] == "cancelled"
    assert http.get(f"videos/{job_id}/content").status_code == 409


@pytest.mark.parametrize("body, field", [
    ({"model": "nano", "prompt": "x", "steps": 0}, "steps"),
    ({"model": "nano", "prompt": "x", "colour": "red"}, "colour"),
    ({"model": "nope", "prompt": "x"}, "model"),
    ({"model": "nano", "prompt": "x", "image": "/etc/passwd"}, "image"),
    ({"model": "nano", "prompt": "x", "num_frames": 6}, "num_frames"),
    ({"model": "nano", "prompt": "x", "seconds": 1, "num_frames": 5}, "seconds"),
    ({"model": "nano", "prompt": "", "num_frames": 5}, "prompt"),
    ({"model": "edge", "prompt": "x", "sound": True}, "sound"),
])
def test_bad_video_request_is_400_naming_the_field(api, body, field):
    answer = client(api).post("videos", json=body)
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["param"] == field, answer.json()


def test_missing_or_wrong_key_is_401(api):
    for http in (client(api, None), client(api, "sk-not-a-configured-key")):
        for method, path in (("GET", "models"), ("POST", "videos"), ("GET", "videos/video_x"), ("GET", "queue")):
            answer = http.request(method, path, json={"model": "nano", "prompt": "x"} if method == "POST" else None)
            assert answer.status_code == 401 and answer.json()["error"]["code"] == "invalid_api_key"
    assert httpx.get(api + "v1/openapi.json").json()["paths"]["/v1/videos/{job_id}"]


def test_over_quota_is_429(api):
    single = client(api, KEY_ONE)
    first = single.post("videos", json={"model": "nano", "prompt": "x", "size": "64x64", "num_frames": 17,
                                        "steps": 100}).json()["id"]
    over = single.post("videos", json={"model": "nano", "prompt": "y", "size": "64x64", "num_frames": 5})
    assert over.status_code == 429 and "limit is 1" in over.json()["error"]["message"]
    single.delete(f"videos/{first}")
    wait_for_job(single, first)
    assert single.post("videos", json={"model": "nano", "prompt": "y", "size": "64x64", "num_frames": 5,
                                       "steps": 2}).status_code == 200  # the slot came back
    hourly = client(api, KEY_HOURLY)
    body = {"model": "nano", "prompt": "x", "size": "64x64", "steps": 2}
    assert hourly.post("images/generations", json=body).status_code == 200
    again = hourly.post("images/generations", json=body)
    assert again.status_code == 429 and int(again.headers["retry-after"]) > 3000


def test_key_b_cannot_read_key_a_job(api):
    alpha, bravo = client(api, KEY_A), client(api, KEY_B)
    job_id = alpha.post("videos", json={"model": "nano", "prompt": "mine", "size": "64x64", "num_frames": 5,
                                        "steps": 2}).json()["id"]
    wait_for_job(alpha, job_id)
    for method, path in (("GET", f"videos/{job_id}"), ("GET", f"videos/{job_id}/content"),
                         ("DELETE", f"videos/{job_id}")):
        assert bravo.request(method, path).status_code == 404
    assert job_id not in [j["id"] for j in bravo.get("videos").json()["data"]]
    assert alpha.get(f"videos/{job_id}/content").status_code == 200


def test_keys_file_lines_and_a_login_without_keys_closes_the_api(tmp_path, monkeypatch):
    import app
    from engine.serving.api_keys import KeyRing, Unauthorized, parse_key_line, read_keys_file

    key = parse_key_line("sk-abcdefgh concurrency=3 per_hour=9 name=ci", "test")
    assert (key.name, key.concurrency, key.per_hour) == ("ci", 3, 9)
    for bad, says in (("short", "at least 8"), ("sk-abcdefgh burst=2", "unknown option"),
                      ("sk-abcdefgh concurrency=0", "concurrency must be")):
        with pytest.raises(ValueError, match=says):
            parse_key_line(bad, "test")
    (tmp_path / "empty").write_text("# nothing\n")
    with pytest.raises(ValueError, match="holds no key"):
        read_keys_file(tmp_path / "empty")
    monkeypatch.delenv("COSMOS3_API_KEYS", raising=False)
    args = app.parse_args(["--auth", "ann:secret"])

    class Queue:
        registry, outputs_root = None, tmp_path

    ring = app.http_api(args, Queue()).keys
    with pytest.raises(Unauthorized, match="needs API keys too"):
        ring.authenticate("Bearer anything")
    assert KeyRing([]).authenticate(None).name == "anonymous"  # no login, no keys: open
