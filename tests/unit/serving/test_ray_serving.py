"""Engine replicas on Ray Serve (`--ray`), on a local Ray cluster on this CPU machine: two tiny-model
replicas serve 20 concurrent API jobs, each landing on a replica; killing one replica mid-run fails
only the job it was running."""
import json
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from harness import launched_studio

ray = pytest.importorskip("ray")

KEY = "sk-ray-test-key-01"
TERMINAL = ("completed", "failed", "cancelled")


@pytest.fixture(scope="module")
def ray_studio(tiny_family, tmp_path_factory):
    folder = tmp_path_factory.mktemp("ray")
    config = folder / "ray.json"
    # Two CPU replicas on a 2-core machine: one torch thread each, so neither starves the other.
    config.write_text(json.dumps({"address": "local", "replicas": 2, "gpus_per_replica": 0, "cpus_per_replica": 0,
                                  "num_cpus": 2, "env": {"OMP_NUM_THREADS": "1"}}))
    (folder / "keys").write_text(f"{KEY} concurrency=30\n")
    argv = ["--outputs", str(folder / "out"), "--cache-dir", str(folder / "cache"), "--queue-size", "32",
            "--ray", str(config), "--api-keys", str(folder / "keys"), "--model", f"nano={tiny_family['nano']}"]
    with launched_studio(argv) as (studio, url):
        yield studio, httpx.Client(base_url=url + "v1/", headers={"Authorization": f"Bearer {KEY}"}, timeout=60)


def _replica_actors() -> dict[str, str]:
    """Replica id -> its Serve actor's name (listing the actors takes a while, so it is done before the race)."""
    names = [a["name"] for a in ray.util.list_named_actors(all_namespaces=True) if "#" in a["name"]]
    return {name.rsplit("#", 1)[1]: name for name in names}


def _kill_replica(actor: str) -> None:
    ray.kill(ray.get_actor(actor, namespace="serve"), no_restart=True)


def _wait_terminal(http, ids: list[str], seconds: float) -> dict[str, dict]:
    deadline = time.monotonic() + seconds
    jobs = {}
    while time.monotonic() < deadline:
        jobs = {j: http.get(f"videos/{j}").json() for j in ids}
        if all(job["status"] in TERMINAL for job in jobs.values()):
            break
        time.sleep(0.2)
    return jobs


def _lose_a_running_job(http, long: dict) -> tuple[dict, int]:
    """Post `long`, and kill its replica while it denoises. A tiny job can still finish before the kill lands (its
    200 steps take ~1 s here), which tests nothing, so then another long job is posted, up to three.
    Returns the job that lost its replica, and how many tries it took."""
    for attempt in range(1, 4):
        actors = _replica_actors()
        doomed = http.post("videos", json=long).json()["id"]
        deadline = time.monotonic() + 90
        while (job := http.get(f"videos/{doomed}").json())["stage"] != "denoise":
            assert job["status"] not in TERMINAL and time.monotonic() < deadline, job
            time.sleep(0.02)
        state = http.get("queue").json()
        assert state["backend"] == "ray" and state["running"] >= 1 and doomed.startswith("video_")
        _kill_replica(actors[job["replica"]])
        job = _wait_terminal(http, [doomed], 90)[doomed]
        if job["status"] != "completed":
            return job, attempt
    raise AssertionError("three long jobs in a row completed before their replica's kill landed")


def test_twenty_jobs_over_two_replicas_and_a_replica_dies(ray_studio):
    studio, http = ray_studio
    assert http.get("queue").json()["replicas"] == {"RUNNING": 2}
    short = {"model": "nano", "prompt": "a kite", "size": "64x64", "num_frames": 5, "steps": 2}
    # The longest job the tiny model takes: 200 steps need a flow shift below 10 to stay distinct.
    long = {**short, "prompt": "the long one", "size": "96x64", "num_frames": 17, "steps": 200, "flow_shift": 5.0}
    # 20 jobs at once: ten short ones, then the long one that will lose its replica while nine more short ones queue.
    with ThreadPoolExecutor(8) as pool:
        first = list(pool.map(lambda i: http.post("videos", json={**short, "seed": i}), range(10)))
        later = pool.map(lambda i: http.post("videos", json={**short, "seed": i}), range(10, 19))
        lost, tries = _lose_a_running_job(http, long)
        answers = first + list(later)
    assert all(a.status_code == 200 for a in answers), [a.text for a in answers if a.status_code != 200]
    others = [a.json()["id"] for a in answers]

    jobs = _wait_terminal(http, others, 90)
    assert lost["status"] == "failed" and lost["error"]["code"] == "replica", (lost, tries)
    assert [jobs[j]["status"] for j in others] == ["completed"] * 19, [jobs[j]["error"] for j in others]
    replicas = {jobs[j]["replica"] for j in others}
    assert None not in replicas and len(replicas) >= 2  # both replicas (and the one Serve restarts) served jobs
    assert http.get(f"videos/{others[0]}/content").content[4:8] == b"ftyp"


def test_the_ui_routes_to_the_replicas_too(ray_studio):
    from gradio_client import Client

    studio, http = ray_studio
    url = str(http.base_url).removesuffix("v1/")
    media, result = Client(url, verbose=False).predict(
        "nano", json.dumps({"mode": "t2i", "prompt": "a kite", "width": 64, "height": 64, "steps": 2, "seed": 8}),
        None, api_name="/generate")
    assert media.endswith(".png") and result["seed"] == 8
    # A conditioning image travels to the replica with the job (the replica may be on another machine).
    import base64
    import io

    from PIL import Image

    png = io.BytesIO()
    Image.new("RGB", (64, 64), (200, 30, 30)).save(png, format="PNG")
    job = http.post("videos", json={"model": "nano", "prompt": "the kite climbs", "size": "64x64", "num_frames": 5,
                                    "steps": 2, "image": base64.b64encode(png.getvalue()).decode()}).json()
    deadline = time.monotonic() + 60
    while (job := http.get(f"videos/{job['id']}").json())["status"] not in TERMINAL:
        assert time.monotonic() < deadline
        time.sleep(0.1)
    assert job["status"] == "completed" and job["result"]["params"]["mode"] == "i2v", job
    # Progress and cancel cross the boundary: a running job reports its denoising steps and stops on DELETE.
    job_id = http.post("videos", json={"model": "nano", "prompt": "long", "size": "64x64", "num_frames": 17,
                                       "steps": 100}).json()["id"]
    deadline = time.monotonic() + 60
    while (job := http.get(f"videos/{job_id}").json())["progress"] < 5:
        assert job["status"] not in TERMINAL and time.monotonic() < deadline, job
        time.sleep(0.05)
    assert job["stage"] == "denoise" and job["replica"]
    cancelled = http.delete(f"videos/{job_id}").json()
    assert cancelled["status"] == "cancelled" and cancelled["progress"] < 94, cancelled
    replicas = http.get("queue").json()["replicas"]
    assert sum(replicas.values()) == 2 and replicas["RUNNING"] >= 1  # Serve replaces the killed replica


def test_replicas_start_ffmpeg_without_pythons_preexec_fork(monkeypatch):
    """imageio-ffmpeg's default start of ffmpeg (`preexec_fn=os.setpgrp`) makes Python fork() with the
    at-fork handlers, and in a replica gRPC's handlers sometimes aborted the child before it became ffmpeg
    (CI: SIGABRT, no video). The replicas' environment turns that preexec step off, so Python can vfork."""
    from imageio_ffmpeg._utils import _popen_kwargs

    from engine.serving.ray_replicas import RayConfig, start_cluster

    options = {}
    monkeypatch.setattr(ray, "init", lambda **kwargs: options.update(kwargs))
    start_cluster(RayConfig(address="local", env={"OMP_NUM_THREADS": "1"}))
    env = options["runtime_env"]["env_vars"]
    assert env["OMP_NUM_THREADS"] == "1"
    assert _popen_kwargs(prevent_sigint=True)["preexec_fn"] is not None  # this process: the default
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert _popen_kwargs(prevent_sigint=True)["preexec_fn"] is None  # a replica
