"""Reliability against the launched app: the bad-input catalogue, fault drills, isolation, and a soak run.

Every refusal must carry its specific message, and after each one the app must still serve. The soak
prints its figures (jobs, wall time, memory) for docs/RELIABILITY.md.
"""
import errno
import json
import re
import shutil
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch
from PIL import Image

from gradio_client import Client, handle_file
from gradio_client.exceptions import AppError
from gradio_client.utils import Status

import app
from harness import generate_through_api, launched_studio  # noqa: E402
from bad_inputs import CATALOGUE, T2I

MODELS = ("nano", "super", "edge")
REQUEST_ID = re.compile(r"^\d{8}-\d{6}-[0-9a-f]{12}$")


@pytest.fixture(scope="module")
def studio(tiny_family, tmp_path_factory):
    broken = tmp_path_factory.mktemp("broken-model") / "edge-broken"
    shutil.copytree(tiny_family["edge"], broken)
    weights = broken / "transformer" / "diffusion_pytorch_model.safetensors"
    weights.write_bytes(weights.read_bytes()[:4096])
    outputs = tmp_path_factory.mktemp("reliability-outputs")
    argv = ["--outputs", str(outputs), "--cache-dir", str(tmp_path_factory.mktemp("cache")), "--queue-size", "64"]
    for name in MODELS:
        argv += ["--model", f"{name}={tiny_family[name]}"]
    argv += ["--model", f"broken={broken}"]
    with launched_studio(argv) as (studio, url):
        yield url, studio, outputs


@pytest.fixture(scope="module")
def client(studio):
    return Client(studio[0], verbose=False)


def _still_serving(client):
    media, result = generate_through_api(client, "edge", {"mode": "t2i", "prompt": "a quiet harbour", "steps": 1, "seed": 5})
    assert Path(media).is_file() and result["seed"] == 5


@pytest.fixture(scope="module")
def upload_files(tmp_path_factory):
    root = tmp_path_factory.mktemp("uploads")
    Image.fromarray(np.full((48, 64, 3), 120, np.uint8)).save(root / "frame.png")
    (root / "corrupt.png").write_bytes(b"\x89PNG\r\n\x1a\n this is not an image")
    (root / "empty.png").write_bytes(b"")
    (root / "notes.txt").write_text("not media")
    Image.new("1", (8000, 6000)).save(root / "huge.png")  # 48 MP declared, a few KB on disk
    np.save(root / "cube.npy", np.zeros((4, 10, 2)))
    np.save(root / "wide.npy", np.zeros((4, 70)))
    (root / "actions.yaml").write_text("- [0, 1]")
    return root


@pytest.mark.parametrize("model,request_,upload,fragment", CATALOGUE,
                         ids=[f"{i:02d}" for i in range(len(CATALOGUE))])
def test_bad_input_catalogue(client, upload_files, model, request_, upload, fragment):
    with pytest.raises(AppError) as caught:
        generate_through_api(client, model, request_, upload_files / upload if upload else None)
    message = str(caught.value)
    assert "Traceback" not in message and len(message) < 2000
    if fragment is None:  # an upload of a type nothing takes: the message names what is allowed
        assert "takes" in message or "allowed" in message or "type" in message, message
    else:
        assert fragment in message, message


def test_catalogue_is_large_and_app_still_serves(client):
    assert len(CATALOGUE) >= 30
    _still_serving(client)


def test_oversized_upload_in_bytes(client, upload_files, monkeypatch):
    from engine.pipeline import media

    monkeypatch.setattr(media, "MAX_UPLOAD_BYTES", 100)
    with pytest.raises(AppError, match="at most 0 MiB|MiB"):
        generate_through_api(client, "nano", {"mode": "i2v", "prompt": "a boat", "steps": 1}, upload_files / "frame.png")


# ----------------------------------------------------------------------------------------------
# Fault drills
# ----------------------------------------------------------------------------------------------


def test_drill_cancel_mid_denoise(client, studio):
    outputs = studio[2]
    before = set(outputs.iterdir())
    job = client.submit("nano", json.dumps({"mode": "t2i", "prompt": "a long one", "steps": 200}), None,
                        api_name="/generate")
    deadline = time.time() + 60
    while time.time() < deadline and not studio[1].service.queue._running:
        time.sleep(0.05)
    time.sleep(0.3)
    job.cancel()
    # The GPU slot frees within a step: a short job right after finishes promptly.
    _still_serving(client)
    time.sleep(0.5)
    after = {p for p in outputs.iterdir() if not p.name.startswith(".")} - before
    assert all(json.loads((p / "params.json").read_text())["prompt_text"].startswith("a quiet harbour") for p in after)


def test_drill_out_of_memory_in_a_step(client, monkeypatch):
    from engine.pipeline import denoise as pipeline  # the loop calls gen_tokens there

    original = pipeline.gen_tokens
    state = {"raised": False}

    def failing(*args, **kwargs):
        if not state["raised"]:
            state["raised"] = True
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")
        return original(*args, **kwargs)

    monkeypatch.setattr(pipeline, "gen_tokens", failing)
    with pytest.raises(AppError, match="ran out of memory"):
        generate_through_api(client, "nano", {**T2I, "steps": 2})
    _still_serving(client)


def test_drill_corrupt_model_keeps_the_others_serving(client):
    _still_serving(client)
    with pytest.raises(AppError, match="could not be loaded.*(corrupt|truncated)"):
        generate_through_api(client, "broken", T2I)
    _still_serving(client)


def test_drill_disk_full_writes_no_partial_result(client, studio, monkeypatch):
    from engine.pipeline import outputs as output_files

    def full_disk(path, frame):
        path.write_bytes(b"half a png")
        raise OSError(errno.ENOSPC, "No space left on device")

    before = set(studio[2].iterdir())
    monkeypatch.setattr(output_files, "_write_png", full_disk)
    with pytest.raises(AppError, match="No space left on device"):
        generate_through_api(client, "nano", T2I)
    assert set(studio[2].iterdir()) == before
    monkeypatch.undo()
    _still_serving(client)


def test_drill_client_disconnects_mid_job(studio, client):
    script = textwrap.dedent(f"""
        import json, time
        from gradio_client import Client
        job = Client({studio[0]!r}, verbose=False).submit(
            "nano", json.dumps({{"mode": "t2i", "prompt": "abandoned", "steps": 150}}), None, api_name="/generate")
        time.sleep(2.0)
        print("submitted", flush=True)
    """)
    process = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert process.stdout.readline().strip() == "submitted"
    process.kill()  # gone without a goodbye
    process.wait(10)
    began = time.time()
    _still_serving(client)
    assert time.time() - began < 120


# ----------------------------------------------------------------------------------------------
# Isolation
# ----------------------------------------------------------------------------------------------


def test_no_file_is_served_by_its_server_path(client, studio):
    """Result files reach their caller as Gradio cache copies; a server path serves nothing (tests/unit/studio/test_isolation.py)."""
    media, result = generate_through_api(client, "nano", {**T2I, "seed": 77})
    folder = studio[2] / result["request_id"]
    assert REQUEST_ID.match(result["request_id"]) and sorted(p.name for p in folder.iterdir()) == ["image.png", "params.json"]
    assert Path(media).read_bytes() == (folder / "image.png").read_bytes()
    base = studio[0].rstrip("/")
    for path in (folder / "image.png", "/etc/hostname", str(Path(app.__file__).resolve()),
                 str(folder / ".." / ".." / "etc" / "passwd")):
        assert httpx.get(f"{base}/gradio_api/file={path}").status_code == 404


def test_upload_names_never_become_output_names(client, studio, tmp_path):
    tricky = tmp_path / "..%2F..%2Fevil name.png"
    Image.fromarray(np.full((48, 64, 3), 30, np.uint8)).save(tricky, format="PNG")
    _, result = generate_through_api(client, "nano", {"mode": "i2v", "prompt": "a boat", "steps": 1, "num_frames": 5}, tricky)
    folder = studio[2] / result["request_id"]
    assert sorted(p.name for p in folder.iterdir()) == ["params.json", "video.mp4"]
    assert not any("evil" in p.name for p in studio[2].rglob("*"))


def test_only_the_public_api_is_callable(client):
    endpoints = client.view_api(return_format="dict", print_info=False)
    assert set(endpoints["named_endpoints"]) == {"/models", "/generate", "/reason"}


# ----------------------------------------------------------------------------------------------
# Soak
# ----------------------------------------------------------------------------------------------


def _rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _soak_jobs(upload_files):
    jobs = []
    for i in range(50):
        tag = f"soak job {i:02d}"
        if i % 10 == 7:  # invalid: wrong size
            jobs.append(("invalid", "nano", {"mode": "t2i", "prompt": tag, "width": 500, "height": 500}, None))
        elif i % 10 == 3:  # cancelled while long (seconds, where the others take a fraction of one)
            jobs.append(("cancel", "nano", {"mode": "t2v", "prompt": tag, "steps": 200, "num_frames": 17, "seed": i},
                         None))
        elif i % 3 == 0:
            jobs.append(("video", "edge", {"mode": "t2v", "prompt": tag, "steps": 2, "num_frames": 9, "seed": i}, None))
        elif i % 3 == 1:
            jobs.append(("image", MODELS[i % 3], {"mode": "t2i", "prompt": tag, "steps": 2, "seed": i}, None))
        else:
            jobs.append(("action", "nano", {"mode": "action", "prompt": tag, "steps": 2, "seed": i,
                                            "action": {"kind": "policy", "domain": "umi", "chunk_size": 4,
                                                       "resolution_tier": 256}}, upload_files / "frame.png"))
    return jobs


def test_soak_fifty_mixed_jobs_from_four_clients(studio, upload_files):
    url, _, outputs = studio
    jobs = _soak_jobs(upload_files)
    folders_before = {p.name for p in outputs.iterdir()}
    outcomes: dict[int, tuple] = {}
    warm_rss = {}

    def client_loop(worker: int):
        client = Client(url, verbose=False)
        for index in range(worker, len(jobs), 4):
            kind, model, request, upload = jobs[index]
            payload = (model, json.dumps(request), handle_file(str(upload)) if upload else None)
            if kind == "cancel":
                job = client.submit(*payload, api_name="/generate")
                deadline = time.time() + 60
                while time.time() < deadline and job.status().code not in (Status.PROCESSING, Status.PROGRESS):
                    time.sleep(0.05)
                job.cancel()
                try:  # a cancelled job hands back no result
                    job.result(timeout=120)
                    outcomes[index] = ("finished", None)
                except Exception as exc:  # noqa: BLE001 - how gradio_client reports the cancel
                    outcomes[index] = ("cancelled", type(exc).__name__)
                continue
            try:
                media, result = client.predict(*payload, api_name="/generate")
                outcomes[index] = ("ok", (media, result))
            except AppError as exc:
                outcomes[index] = ("refused", str(exc))
            if index == 8:
                warm_rss["mib"] = _rss_mib()

    began = time.time()
    threads = [threading.Thread(target=client_loop, args=(w,)) for w in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(600)
    wall = time.time() - began
    end_rss = _rss_mib()

    assert len(outcomes) == 50
    counts = {}
    for index, (kind, model, request, _) in enumerate(jobs):
        status, payload = outcomes[index]
        counts[status] = counts.get(status, 0) + 1
        if kind == "invalid":
            assert status == "refused" and "Allowed sizes" in payload
        elif kind == "cancel":
            assert status == "cancelled"
        else:
            assert status == "ok", (index, payload)
            media, result = payload
            folder = outputs / result["request_id"]
            sidecar = json.loads((folder / "params.json").read_text())
            # Nothing mixed up: each result carries its own prompt, seed and model.
            assert sidecar["params"]["prompt"] == request["prompt"] and sidecar["seed"] == request["seed"]
            assert sidecar["model"]["name"] == model and result["prompt_text"] == sidecar["prompt_text"]
            expected = {"image": "image.png", "video": "video.mp4", "action": "video.mp4"}[kind]
            assert (folder / expected).is_file() and Path(media).name == expected
            if kind == "action":
                assert (folder / "actions.json").is_file()
    growth = end_rss - warm_rss.get("mib", end_rss)
    print(f"\nSOAK: 50 jobs from 4 clients in {wall:.1f} s; outcomes {counts}; "
          f"RSS {warm_rss.get('mib', float('nan')):.0f} MiB after 9 jobs -> {end_rss:.0f} MiB at the end "
          f"(+{growth:.0f} MiB)")
    # Flat memory: tiny models, so anything beyond allocator noise would be a leak of results or jobs.
    assert growth < 300
    leftovers = [p for p in outputs.iterdir() if p.name.startswith(".")]
    assert not leftovers, leftovers
    # The cancelled jobs really ended cancelled: the engine stopped those it had started, and none of
    # them left a folder (every new folder belongs to a finished job, none carries a cancelled prompt).
    new = [p for p in outputs.iterdir() if p.name not in folders_before]
    prompts = {json.loads((p / "params.json").read_text())["params"]["prompt"] for p in new}
    assert not prompts & {request["prompt"] for kind, _, request, _ in jobs if kind == "cancel"}
    assert len(new) == counts["ok"]
