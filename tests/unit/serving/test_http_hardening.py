"""The /v1 API's hardening (issue 42, items 4-8): bad inputs that were bare 500s, server paths in
answers, the job book across a restart, JSON only without keys, the keys file re-read, and the
official `openai` client's multipart video jobs.

Two setups: the launched app with a keys file (`studio`), and `HttpApi` over an engine queue served by
FastAPI's TestClient (`v1_over`), which can be built twice over one outputs folder (a restart).
"""
import base64
import io
import json
import struct
import tempfile
import time
import zlib
from pathlib import Path

import httpx
import numpy as np
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from PIL import Image

from harness import TERMINAL, launched_studio, wait_for_job
from bad_inputs import CATALOGUE

openai = pytest.importorskip("openai")
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")  # openai marks its videos API deprecated

KEY_A, KEY_B = "sk-hard-alpha-0001", "sk-hard-bravo-0002"
KEYS_TEXT = f"{KEY_A} name=alpha concurrency=4\n{KEY_B} name=bravo\n"
SHORT_VIDEO = {"model": "nano", "prompt": "a kite", "size": "64x64", "num_frames": 5, "steps": 2, "seed": 4}
LONG_VIDEO = {"model": "nano", "prompt": "a long one", "size": "64x64", "num_frames": 17, "steps": 100}


def png_declaring(width: int, height: int) -> bytes:
    """A valid PNG header declaring width x height pixels, a few dozen bytes long (a decompression bomb)."""
    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(b"\0" * 64)) + chunk(b"IEND", b"")


def png_bytes(width=64, height=64, value=120) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(np.full((height, width, 3), value, np.uint8)).save(buffer, format="PNG")
    return buffer.getvalue()


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


@pytest.fixture(scope="module")
def studio(tiny_family, tmp_path_factory):
    keys = tmp_path_factory.mktemp("keys") / "keys.txt"
    keys.write_text(KEYS_TEXT)
    outputs, cache = tmp_path_factory.mktemp("hard-out"), tmp_path_factory.mktemp("hard-cache")
    argv = ["--outputs", str(outputs), "--cache-dir", str(cache), "--api-keys", str(keys),
            "--model", f"nano={tiny_family['nano']}", "--model", f"edge={tiny_family['edge']}"]
    with launched_studio(argv) as (_, url):
        yield {"url": url, "keys": keys, "outputs": outputs, "cache": cache, "models": Path(tiny_family["nano"]).parent}


def http(studio, key=KEY_A):
    return httpx.Client(base_url=studio["url"] + "v1/", headers={"Authorization": f"Bearer {key}"}, timeout=120)


# ----------------------------------------------------------------------------------------------
# Item 4: the bare 500s are 400s naming the field
# ----------------------------------------------------------------------------------------------


def test_a_png_declaring_50000x50000_pixels_is_400_naming_image(studio):
    answer = http(studio).post("videos", json={"model": "nano", "prompt": "x", "image": b64(png_declaring(50000, 50000))})
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert error["param"] == "image" and "at most 40,000,000 pixels" in error["message"], error


def test_the_engine_refuses_a_decompression_bomb_as_a_request_error(tmp_path):
    """The UI's path (engine.pipeline.media) gets the same refusal, naming the field and the limit."""
    from engine.pipeline.media import load_image
    from engine.pipeline.request import RequestError

    bomb = tmp_path / "bomb.png"
    bomb.write_bytes(png_declaring(50000, 50000))
    with pytest.raises(RequestError) as refused:
        load_image(bomb)
    assert refused.value.field == "image" and "at most 40,000,000 pixels" in str(refused.value)
    assert str(tmp_path) not in str(refused.value)


@pytest.mark.parametrize("fps", ["NaN", "Infinity", "-Infinity"])
def test_fps_nan_or_infinite_is_400_naming_fps(studio, fps):
    raw = f'{{"model": "nano", "prompt": "waves", "seconds": 1, "fps": {fps}}}'
    answer = http(studio).post("videos", content=raw, headers={"Content-Type": "application/json"})
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["param"] == "fps" and "finite" in answer.json()["error"]["message"]


def test_a_100000_deep_json_body_is_400_naming_the_body(studio):
    raw = '{"prompt": ' + "[" * 100_000 + "]" * 100_000 + "}"
    answer = http(studio).post("videos", content=raw, headers={"Content-Type": "application/json"})
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["param"] == "body" and "nested too deeply" in answer.json()["error"]["message"]


@pytest.mark.parametrize("field", ["domain", "resolution_tier", "view_point"])
@pytest.mark.parametrize("value", [[], {"a": 1}])
def test_an_action_field_given_a_list_or_object_is_400_naming_it(studio, field, value):
    """Found by sending every field hostile JSON values: these were TypeErrors (unhashable) in validation."""
    action = {"kind": "policy", "domain": "umi", "chunk_size": 4, field: value}
    answer = http(studio).post("videos", json={"model": "nano", "prompt": "x", "mode": "action", "action": action,
                                               "image": b64(png_bytes())})
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["param"] == f"action.{field}"


# ----------------------------------------------------------------------------------------------
# Items 4 and 5: the bad-input catalogue through /v1: never a 500, never a server path
# ----------------------------------------------------------------------------------------------


def _catalogue_uploads() -> dict[str, bytes]:
    """The catalogue's upload files (tests/unit/studio/test_reliability.py), as the bytes a /v1 body carries inline."""
    npy = io.BytesIO()
    np.save(npy, np.zeros((4, 10, 2)))
    return {"frame.png": png_bytes(64, 48), "corrupt.png": b"\x89PNG\r\n\x1a\n this is not an image",
            "empty.png": b"", "notes.txt": b"not media", "huge.png": png_declaring(8000, 6000),
            "cube.npy": npy.getvalue(), "wide.npy": npy.getvalue(), "actions.yaml": b"- [0, 1]"}


def _v1_cases() -> list[tuple[str, dict]]:
    """Every catalogue entry as a /v1 call (route, httpx arguments), then the API's own bad inputs."""
    uploads, cases = _catalogue_uploads(), []
    for model, request_, upload, _ in CATALOGUE:
        if isinstance(request_, str):
            cases.append(("videos", {"content": request_, "headers": {"Content-Type": "application/json"}}))
            continue
        body = {**request_, "model": model}
        if upload is not None:
            body["image"] = b64(uploads[upload])
        route = "images/generations" if body.get("mode") == "t2i" else "videos"
        cases.append((route, {"json": body}))
    corrupt_video = b64(b"\x00\x00\x00\x18ftypisom" + b"garbage" * 200)
    raw = {"Content-Type": "application/json"}
    cases += [
        ("videos", {"json": {"model": "nano", "prompt": "x", "num_frames": 5, "steps": 1, "video": corrupt_video}}),
        ("videos", {"json": {"model": "nano", "prompt": "x", "video": "data:video/mp4;base64,%%%"}}),
        ("videos", {"json": {"model": "nano", "prompt": "x", "image": b64(png_declaring(50000, 50000))}}),
        ("videos", {"content": '{"model": "nano", "prompt": "x", "seconds": 1, "fps": NaN}', "headers": raw}),
        ("videos", {"content": "[" * 100_000, "headers": raw}),
        ("videos", {"json": {"model": "nano", "prompt": "x", "input_reference": {"file_id": "file-1"}}}),
    ]
    return cases


def _server_paths(studio) -> list[str]:
    roots = [studio["outputs"], studio["outputs"].resolve(), studio["cache"], studio["models"]]
    return [str(root) for root in roots] + [".api-uploads", tempfile.gettempdir().rstrip("/") + "/"]


def test_every_catalogue_error_through_v1_is_a_4xx_without_a_server_path(studio):
    client, texts = http(studio), []
    for route, arguments in _v1_cases():
        answer = client.post(route, **arguments)
        assert answer.status_code < 500, (route, arguments.get("json", arguments.get("content", ""))[:200], answer.text)
        if answer.status_code == 200 and route == "videos":  # accepted; the engine refuses it as it runs
            job = wait_for_job(client, answer.json()["id"])
            assert job["status"] == "failed", job
            answer = client.get(f"videos/{job['id']}")
        else:
            assert answer.status_code == 400 and answer.json()["error"]["message"], answer.text
        texts.append(answer.text)
    assert len(texts) >= len(CATALOGUE) + 6
    assert any("could not be decoded" in text and "video" in text for text in texts)  # the corrupt video's job
    leaks = [(path, text) for text in texts for path in _server_paths(studio) if path in text]
    assert not leaks, leaks[:3]


def test_a_finished_jobs_answers_name_no_server_path(studio):
    client = http(studio)
    job = wait_for_job(client, client.post("videos", json={**SHORT_VIDEO, "image": b64(png_bytes())}).json()["id"])
    assert job["status"] == "completed", job
    texts = [client.get(f"videos/{job['id']}").text, client.get("videos").text,
             client.get(f"videos/{job['id']}/content", params={"variant": "params"}).text]
    leaks = [(path, text[:300]) for text in texts for path in _server_paths(studio) if path in text]
    assert not leaks, leaks


def test_an_engine_failure_quoting_the_outputs_folder_reaches_the_caller_without_it(studio, monkeypatch):
    """A full disk: the engine's message is the OSError's, which quotes the file it was writing."""
    import errno

    from engine.pipeline import outputs as output_files

    def full_disk(path, frame):
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr(output_files, "_write_png", full_disk)
    client = http(studio)
    image = client.post("images/generations", json={"model": "nano", "prompt": "x", "size": "64x64", "steps": 1})
    monkeypatch.setattr(output_files, "_write_mp4", lambda path, *rest: full_disk(path, None))
    job = wait_for_job(client, client.post("videos", json={**SHORT_VIDEO, "steps": 1}).json()["id"])
    texts = [image.json()["error"]["message"], job["error"]["message"], client.get("videos").text]
    assert all("No space left on device" in text for text in texts[:2]), texts
    assert "image.png" in texts[0] and "video.mp4" in texts[1]  # the file is still named, by its name
    leaks = [(path, text[:300]) for text in texts for path in _server_paths(studio) if path in text]
    assert not leaks, leaks


def test_public_text_cuts_server_paths_and_keeps_routes_and_urls(tmp_path):
    from engine.serving.http_api import HttpApi

    class Queue:
        registry, outputs_root = type("Registry", (), {"names": staticmethod(lambda: [])})(), tmp_path / "out"

    api = HttpApi(Queue())
    text = (f"could not write '{tmp_path}/out/api/x/video.mp4': full; see {tmp_path / 'out'}; "
            f"upload {tmp_path}/out/.api-uploads/ab.png, cache {tempfile.gettempdir()}/gradio/f/image.png. "
            "Videos use POST /v1/videos; docs at https://example.org/a/b; 3/4 done.")
    assert api.public_text(text) == ("could not write 'video.mp4': full; see <outputs>; upload ab.png, cache "
                                     "image.png. Videos use POST /v1/videos; docs at https://example.org/a/b; 3/4 done.")


# ----------------------------------------------------------------------------------------------
# Item 6: the job book survives a restart
# ----------------------------------------------------------------------------------------------


@pytest.fixture
def v1_over(tiny_family):
    """v1_over(outputs, keys) -> (TestClient, HttpApi): the API over a fresh engine queue writing into
    `outputs`; every queue built is closed at the end."""
    from engine.serving.api_keys import KeyRing
    from engine.serving.http_api import HttpApi
    from engine.serving.queue import JobQueue
    from engine.serving.registry import ModelEntry, ModelRegistry

    queues = []

    def build(outputs: Path, keys=()):
        queue = JobQueue(ModelRegistry([ModelEntry("nano", str(tiny_family["nano"]))]), outputs)
        queues.append(queue)
        api = HttpApi(queue, KeyRing(list(keys)))
        app = FastAPI()
        app.include_router(api.router)
        return TestClient(app, base_url="http://127.0.0.1", raise_server_exceptions=False), api

    yield build
    for queue in queues:
        queue.close()


def _keys():
    from engine.serving.api_keys import parse_key_line

    return [parse_key_line(f"{KEY_A} name=alpha concurrency=4", "test"), parse_key_line(f"{KEY_B} name=bravo", "test")]


def test_finished_failed_and_interrupted_jobs_survive_a_restart_for_their_owner_only(v1_over, tmp_path):
    alpha, bravo = {"Authorization": f"Bearer {KEY_A}"}, {"Authorization": f"Bearer {KEY_B}"}
    before, _ = v1_over(tmp_path, _keys())
    done = before.post("/v1/videos", json=SHORT_VIDEO, headers=alpha).json()["id"]
    failed = before.post("/v1/videos", headers=alpha, json={**SHORT_VIDEO, "video": b64(b"\0\0\0\x18ftypisom junk")}).json()["id"]
    for job_id in (done, failed):
        while before.get(f"/v1/videos/{job_id}", headers=alpha).json()["status"] not in TERMINAL:
            time.sleep(0.05)
    video = before.get(f"/v1/videos/{done}/content", headers=alpha).content
    image = before.post("/v1/images/generations", headers=alpha, json={"model": "nano", "prompt": "a lighthouse",
                                                                       "size": "64x64", "steps": 1, "response_format": "url"})
    image_url = image.json()["data"][0]["url"]
    png = before.get(image_url, headers=alpha).content
    running = before.post("/v1/videos", json=LONG_VIDEO, headers=alpha).json()["id"]
    while before.get(f"/v1/videos/{running}", headers=alpha).json()["stage"] != "denoise":
        time.sleep(0.05)
    waiting = before.post("/v1/videos", json={**SHORT_VIDEO, "image": b64(png_bytes())}, headers=alpha).json()["id"]
    assert len(list((tmp_path / ".api-uploads").iterdir())) == 1  # the waiting job's image

    after, _ = v1_over(tmp_path, _keys())  # a second server over the same outputs folder, the first mid-job
    listed = {job["id"]: job for job in after.get("/v1/videos", headers=alpha).json()["data"]}
    assert set(listed) == {done, failed, running, waiting}
    assert listed[done]["status"] == "completed" and listed[done]["result"]["seed"] == 4
    assert after.get(f"/v1/videos/{done}/content", headers=alpha).content == video
    assert after.get(f"/v1/videos/{done}/content", params={"variant": "params"}, headers=alpha).json()["seed"] == 4
    assert listed[failed]["status"] == "failed" and "could not be decoded" in listed[failed]["error"]["message"]
    interrupted = after.get(f"/v1/videos/{running}", headers=alpha).json()
    assert interrupted["status"] == "failed" and interrupted["error"]["code"] == "interrupted"
    assert "server stopped while this job was generating" in interrupted["error"]["message"]
    assert listed[waiting]["status"] == "failed" and "while this job was queued" in listed[waiting]["error"]["message"]
    assert not list((tmp_path / ".api-uploads").iterdir())  # its input will never be read: removed
    assert after.get(image_url, headers=alpha).content == png  # image jobs too
    assert after.get(image_url, headers=bravo).status_code == 404
    assert after.get("/v1/videos", headers=bravo).json()["data"] == []  # ownership kept across the restart
    for job_id in (done, failed, running):
        assert after.get(f"/v1/videos/{job_id}", headers=bravo).status_code == 404
    assert after.get(f"/v1/videos/{done}/content", headers=bravo).status_code == 404
    for job_id in (running, waiting):  # the first server's jobs end (its "crash" is over)
        before.delete(f"/v1/videos/{job_id}", headers=alpha)

    assert after.delete(f"/v1/videos/{done}", headers=alpha).json()["deleted"] is True
    again, _ = v1_over(tmp_path, _keys())
    assert done not in {job["id"] for job in again.get("/v1/videos", headers=alpha).json()["data"]}
    assert not list((tmp_path / "api").glob("*/video.mp4"))  # the deleted job's files went with it


# ----------------------------------------------------------------------------------------------
# Item 7: without keys JSON only; the keys file re-read
# ----------------------------------------------------------------------------------------------


def test_without_keys_only_json_starts_a_job(v1_over, tmp_path):
    client, api = v1_over(tmp_path)
    body = json.dumps({**SHORT_VIDEO, "steps": 1})
    simple = [{"content": body, "headers": {"Content-Type": "text/plain"}},  # what a cross-site form can send
              {"content": body, "headers": {"Content-Type": "application/x-www-form-urlencoded"}},
              {"content": body, "headers": {}},
              {"data": {"prompt": "x", "model": "nano"}, "files": {"image": ("f.png", png_bytes(), "image/png")}}]
    for arguments in simple:
        answer = client.post("/v1/videos", **arguments)
        assert answer.status_code == 415, answer.text
        assert answer.json()["error"]["code"] == "unsupported_media_type" and "application/json" in answer.text
    assert client.post("/v1/images/generations", content=body, headers={"Content-Type": "text/plain"}).status_code == 415
    assert api.book.owned("anonymous", "video") == [] and api.queue.state()["waiting"] == 0  # nothing started
    cross_site = client.post("/v1/videos", content=body, headers={"Content-Type": "application/json",
                                                                  "Sec-Fetch-Site": "cross-site"})
    assert cross_site.status_code == 403
    assert client.post("/v1/videos", content=body, headers={"Content-Type": "application/json"}).status_code == 200


def test_with_keys_any_content_type_still_reads_json(v1_over, tmp_path):
    client, _ = v1_over(tmp_path, _keys())
    answer = client.post("/v1/videos", content=json.dumps({**SHORT_VIDEO, "steps": 1}),
                         headers={"Content-Type": "text/plain", "Authorization": f"Bearer {KEY_A}"})
    assert answer.status_code == 200, answer.text


def test_a_key_removed_from_the_keys_file_stops_working_within_seconds(studio):
    keys = studio["keys"]
    assert http(studio, KEY_B).get("models").status_code == 200
    try:
        keys.write_text(f"{KEY_A} name=alpha concurrency=4\n")
        deadline = time.monotonic() + 5
        while http(studio, KEY_B).get("models").status_code != 401:
            assert time.monotonic() < deadline, "the removed key still works after 5 s"
            time.sleep(0.2)
        assert http(studio, KEY_A).get("models").status_code == 200
        keys.write_text("# every key removed\n")  # a file with no key closes the API; the old keys do not linger
        deadline = time.monotonic() + 5
        while http(studio, KEY_A).get("models").status_code != 401:
            assert time.monotonic() < deadline, "an emptied keys file left the API open"
            time.sleep(0.2)
        assert str(keys) not in http(studio, KEY_A).get("models").text
    finally:
        keys.write_text(KEYS_TEXT)
    deadline = time.monotonic() + 5
    while http(studio, KEY_B).get("models").status_code != 200:
        assert time.monotonic() < deadline, "a key added back was not taken"
        time.sleep(0.2)


# ----------------------------------------------------------------------------------------------
# Item 8: the official client's multipart video jobs
# ----------------------------------------------------------------------------------------------


def test_the_openai_client_creates_retrieves_downloads_and_deletes_a_video(studio):
    client = openai.OpenAI(base_url=studio["url"] + "v1", api_key=KEY_A, max_retries=0)
    made = client.videos.create(model="nano", prompt="the kite climbs", size="64x64",
                                input_reference=("frame.png", png_bytes(), "image/png"),
                                extra_body={"num_frames": 5, "steps": 2, "seed": 9})
    assert made.id.startswith("video_") and made.status in ("queued", "generating")
    deadline = time.monotonic() + 120
    while (video := client.videos.retrieve(made.id)).status not in TERMINAL:
        assert time.monotonic() < deadline
        time.sleep(0.1)
    assert video.status == "completed" and video.progress == 100, video
    params = video.model_extra["result"]["params"]
    assert params["mode"] == "i2v" and params["num_frames"] == 5 and params["steps"] == 2 and video.size == "64x64"
    content = client.videos.download_content(made.id)
    assert content.content[4:8] == b"ftyp"
    text_only = client.videos.create(model="nano", prompt="waves", size="64x64", extra_body={"num_frames": 5, "steps": 1})
    assert client.videos.retrieve(text_only.id).model  # a form without a file part is taken too
    deleted = client.videos.delete(made.id)
    assert deleted.deleted is True and deleted.id == made.id
    with pytest.raises(openai.NotFoundError):
        client.videos.retrieve(made.id)
    with pytest.raises(openai.BadRequestError) as refused:  # 4 s at the tiny model's fps is out of its frame range
        client.videos.create(model="nano", prompt="waves", size="64x64", seconds="4")
    assert refused.value.body["param"] == "seconds"


def test_a_body_over_the_cap_is_413_before_it_is_read_whole(v1_over, tmp_path, monkeypatch):
    from engine.serving import http_api

    monkeypatch.setattr(http_api, "MAX_BODY_BYTES", 1000)
    client, _ = v1_over(tmp_path)
    big = json.dumps({**SHORT_VIDEO, "prompt": "x" * 2000})
    answer = client.post("/v1/videos", content=big, headers={"Content-Type": "application/json"})
    assert answer.status_code == 413 and answer.json()["error"]["param"] == "body"
    chunked = client.post("/v1/videos", content=iter([big[:600].encode(), big[600:].encode()]),
                          headers={"Content-Type": "application/json"})  # no Content-Length: counted as it comes
    assert chunked.status_code == 413
