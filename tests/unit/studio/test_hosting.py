"""Hosting and review-mode startup: the Space front matter, refusals at start (review without a login,
--safety without the guardrail), configuration from the environment, ZeroGPU sizing, and the login
guarding the launched review app."""
import importlib.machinery
import json
import os
import subprocess
import sys
import time
import types
from pathlib import Path

import httpx
import pytest
import yaml

import app
from harness import launched_studio  # noqa: E402
from cosmos3_ui import zerogpu

REPO = Path(__file__).resolve().parents[3]
README = REPO / "README.md"
SPACE_KEYS = {"title", "sdk", "sdk_version", "app_file", "python_version", "suggested_hardware",
              "startup_duration_timeout"}
# HF Spaces hardware flavours (huggingface_hub SpaceHardware values).
HARDWARE = {"cpu-basic", "cpu-upgrade", "t4-small", "t4-medium", "l4x1", "l4x4", "a10g-small", "a10g-large",
            "a10g-largex2", "a10g-largex4", "a100-large", "h100", "h100x8", "l40sx1", "l40sx4", "l40sx8",
            "zero-a10g"}


def front_matter() -> dict:
    text = README.read_text(encoding="utf-8")
    assert text.startswith("---\n"), "the Space front matter must be the very first thing in README.md"
    block, sep, _ = text[4:].partition("\n---\n")
    assert sep
    return yaml.safe_load(block)


def test_front_matter_parses_with_the_space_keys():
    meta = front_matter()
    assert SPACE_KEYS <= set(meta)
    assert meta["sdk"] == "gradio" and meta["app_file"] == "app.py" and (REPO / meta["app_file"]).is_file()
    import gradio

    assert meta["sdk_version"] == gradio.__version__
    assert isinstance(meta["python_version"], str) and meta["python_version"].startswith("3.")
    assert meta["suggested_hardware"] in HARDWARE
    assert len(meta.get("short_description", "")) <= 60


def test_readme_first_code_block_is_still_the_two_commands():
    lines = [l for l in README.read_text(encoding="utf-8").split("```")[1].splitlines() if l.strip()]
    assert len(lines) == 2
    assert lines[0].endswith(".venv/bin/python app.py --host 127.0.0.1 --port 7860")
    assert lines[1].endswith(".venv/bin/python -m pytest -q")


# ----------------------------------------------------------------------------------------------
# Refusals at start
# ----------------------------------------------------------------------------------------------


def test_review_mode_without_a_login_refuses_to_start(tmp_path):
    result = subprocess.run([sys.executable, "app.py", "--review", "--outputs", str(tmp_path / "out"),
                             "--cache-dir", str(tmp_path / "cache")],
                            cwd=REPO, capture_output=True, text=True, timeout=60,
                            env={"PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1"})
    assert result.returncode == 2
    assert "--review needs a login" in result.stderr and "--auth" in result.stderr
    assert "Traceback" not in result.stderr and not (tmp_path / "out").exists()


@pytest.mark.parametrize("argv, fragment", [
    (["--review", "--auth", "ann"], "USER:PASS"),
    (["--review", "--auth", ":pw"], "USER:PASS"),
    (["--criteria", "a,b"], "only applies with --review"),
    (["--review", "--auth", "a:b", "--criteria", "Bad Name"], "--criteria"),
    (["--allow-hub"], "--model-root"),
])
def test_review_usage_errors(argv, fragment, capsys):
    with pytest.raises(SystemExit) as exit_info:
        app.parse_args(argv)
    assert exit_info.value.code == 2 and fragment in capsys.readouterr().err


def test_auth_file_and_criteria(tmp_path, capsys):
    auth = tmp_path / "logins.txt"
    auth.write_text("# reviewers\nann:pw:with:colons\n\nbob:secret\n")
    args = app.parse_args(["--review", "--auth-file", str(auth), "--auth", "cy:x", "--criteria", "realism, motion"])
    assert args.auth == [("cy", "x"), ("ann", "pw:with:colons"), ("bob", "secret")]
    assert args.criteria == ("realism", "motion")
    auth.write_text("ann:pw\nno-colon-here\n")
    with pytest.raises(SystemExit):
        app.parse_args(["--review", "--auth-file", str(auth)])
    err = capsys.readouterr().err
    assert "line 2" in err and "pw" not in err.split("line 2")[1]


def test_safety_fails_loudly_without_the_guardrail(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p])  # no stray cosmos_guardrail
    assert app.main(["--safety", "--outputs", str(tmp_path / "o"), "--cache-dir", str(tmp_path / "c")]) == 2
    assert "cosmos_guardrail" in capsys.readouterr().err


def test_start_up_says_where_flash4_would_help_and_is_missing(tmp_path, capsys, monkeypatch):
    from cosmos3_kernels import prefix_attention

    launched = []
    studio = types.SimpleNamespace(service=types.SimpleNamespace(model_names=lambda: ["edge"]),
                                   launch=lambda **kw: launched.append(kw))
    monkeypatch.setattr(app, "create_studio", lambda args: studio)
    argv = ["--outputs", str(tmp_path / "o"), "--cache-dir", str(tmp_path / "c")]
    monkeypatch.setattr(prefix_attention, "flash4_advice", lambda: "flash-attn-4 is not installed (test).")
    assert app.main(argv) == 0 and launched
    assert "note: flash-attn-4 is not installed (test)." in capsys.readouterr().err
    monkeypatch.setattr(prefix_attention, "flash4_advice", lambda: None)
    assert app.main(argv) == 0
    assert "flash-attn-4" not in capsys.readouterr().err


def test_safety_with_the_guardrail_installed_checks_every_job(tmp_path, tiny_family, monkeypatch):
    fake = tmp_path / "site"
    (fake / "cosmos_guardrail").mkdir(parents=True)
    # A stand-in with the guardrail's interface: it refuses prompts that mention "forbidden".
    (fake / "cosmos_guardrail" / "__init__.py").write_text(
        "class CosmosSafetyChecker:\n"
        "    def check_text_safety(self, prompt):\n        return 'forbidden' not in prompt\n"
        "    def check_video_safety(self, frames):\n        return frames\n")
    monkeypatch.syspath_prepend(str(fake))
    argv = ["--safety", "--model", f"edge={tiny_family['edge']}", "--outputs", str(tmp_path / "o"),
            "--cache-dir", str(tmp_path / "c")]
    studio = app.create_studio(app.parse_args(argv))
    queue = studio.service.queue
    try:
        ok = queue.submit("edge", {"mode": "t2i", "prompt": "a calm lake", "steps": 1})
        assert ok.result(timeout=120).outputs["image"].is_file()
        refused = queue.submit("edge", {"mode": "t2i", "prompt": "a forbidden scene", "steps": 1})
        with pytest.raises(Exception, match="safety checker refused this prompt"):
            refused.result(timeout=120)
    finally:
        queue.close()


# ----------------------------------------------------------------------------------------------
# Environment (a Space runs `python app.py` with no arguments)
# ----------------------------------------------------------------------------------------------


def test_models_and_settings_from_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("COSMOS3_MODELS", f"nano=org/Cosmos3-Nano, edge={tmp_path}")
    monkeypatch.setenv("COSMOS3_OUTPUTS", str(tmp_path / "data"))
    monkeypatch.setenv("COSMOS3_REVIEW", "1")
    monkeypatch.setenv("COSMOS3_AUTH", "ann:pw,bob:pw2")
    monkeypatch.setenv("COSMOS3_CRITERIA", "realism")
    monkeypatch.setenv("SYSTEM", "spaces")
    args = app.parse_args([])
    assert args.model == [("nano", "org/Cosmos3-Nano"), ("edge", str(tmp_path))]
    assert args.outputs == (tmp_path / "data").resolve() and args.review and args.criteria == ("realism",)
    assert args.auth == [("ann", "pw"), ("bob", "pw2")] and (args.host, args.port) == ("0.0.0.0", 7860)
    flags = app.parse_args(["--model", f"x={tmp_path}", "--host", "127.0.0.1", "--auth", "cy:z"])
    assert flags.model == [("x", str(tmp_path))] and flags.host == "127.0.0.1" and flags.auth == [("cy", "z")]
    monkeypatch.setenv("COSMOS3_MODELS", "bad name=x")
    with pytest.raises(SystemExit):
        app.parse_args([])


def test_model_root_confines_the_sources(tmp_path, tiny_family):
    argv = ["--model", f"edge={tiny_family['edge']}", "--model-root", str(tmp_path / "elsewhere"),
            "--outputs", str(tmp_path / "o"), "--cache-dir", str(tmp_path / "c")]
    with pytest.raises(ValueError, match="outside the allowed model folders"):
        app.create_studio(app.parse_args(argv))
    with pytest.raises(ValueError, match="hub sources are turned off"):
        app.create_studio(app.parse_args(["--model", "nano=org/not-local-repo", "--model-root", str(tmp_path)]))


# ----------------------------------------------------------------------------------------------
# ZeroGPU
# ----------------------------------------------------------------------------------------------


def fake_spaces(calls: list) -> types.ModuleType:
    module = types.ModuleType("spaces")
    module.__spec__ = importlib.machinery.ModuleSpec("spaces", None)

    def GPU(duration=None):
        def wrap(fn):
            def run(*args, **kwargs):
                calls.append(duration(*args, **kwargs))
                return fn(*args, **kwargs)
            return run
        return wrap

    module.GPU = GPU
    return module


def test_gpu_wrapper_is_a_no_op_off_zerogpu_and_sized_from_the_request_on_it(tiny_family, monkeypatch):
    from engine.serving.registry import ModelEntry, ModelRegistry

    registry = ModelRegistry([ModelEntry(n, str(p)) for n, p in tiny_family.items()])
    duration = zerogpu.job_duration(registry)

    def work(model_name, request):
        return f"ran {model_name}"

    assert zerogpu.gpu_wrapper(work, duration, environ={}) is work
    calls = []
    monkeypatch.setitem(sys.modules, "spaces", fake_spaces(calls))
    assert zerogpu.gpu_wrapper(work, duration, environ={"SPACES_ZERO_GPU": "false"}) is work
    wrapped = zerogpu.gpu_wrapper(work, duration, environ={"SPACES_ZERO_GPU": "true"})
    assert wrapped("nano", {"mode": "t2i", "prompt": "x"}) == "ran nano"
    assert calls == [zerogpu.DURATION_MIN_S]  # tiny canvases: the floor
    # The reservation is the estimate with a margin, between the floor and the ceiling.
    import engine.serving.estimates

    for estimate, reserved in ((100.0, 165), (1000.0, zerogpu.DURATION_MAX_S)):
        monkeypatch.setattr(engine.serving.estimates, "estimate_seconds", lambda info, request, e=estimate: e)
        assert duration("edge", {"mode": "t2v", "prompt": "x"}) == reserved


def test_on_zerogpu_each_job_runs_inside_the_gpu_call(tiny_family, tmp_path, monkeypatch):
    """The wiring, with a stand-in `spaces` that runs the call in-process (no ZeroGPU here)."""
    calls = []
    monkeypatch.setitem(sys.modules, "spaces", fake_spaces(calls))
    monkeypatch.setattr(zerogpu, "spaces_installed", lambda: True)
    monkeypatch.setenv("SPACES_ZERO_GPU", "true")
    # A ZeroGPU Space reports CUDA; no warm-up may run there: it would run outside any GPU call.
    from engine.serving import queue as job_queue, warmup

    monkeypatch.setattr(job_queue, "torch_cuda_available", lambda: True)
    warmed = []
    monkeypatch.setattr(warmup, "warm_one", lambda model, request, cancel=None: warmed.append(request))
    argv = ["--model", f"edge={tiny_family['edge']}", "--model", f"nano={tiny_family['nano']}",
            "--outputs", str(tmp_path / "o"), "--cache-dir", str(tmp_path / "c")]
    studio = app.create_studio(app.parse_args(argv))
    queue = studio.service.queue
    try:
        assert sorted(queue.loaded_models()) == ["edge", "nano"]  # weights in place before any GPU call
        assert queue.warming() == {} and warmed == []
        handle = queue.submit("edge", {"mode": "t2i", "prompt": "a cube", "steps": 2, "seed": 4})
        result = handle.result(timeout=120)
        assert result.seed == 4 and result.outputs["image"].is_file()
        assert calls == [zerogpu.DURATION_MIN_S]  # one reservation, sized from this request
    finally:
        queue.close()


def test_on_a_cuda_host_the_app_loads_and_warms_its_first_model_in_the_background(tiny_family, tmp_path, monkeypatch):
    from engine.serving import queue as job_queue, warmup

    warmed = []
    monkeypatch.setattr(warmup, "warm_one", lambda model, request, cancel=None: warmed.append(model.info.family))
    monkeypatch.delenv("COSMOS3_WARMUP", raising=False)
    argv = ["--model", f"edge={tiny_family['edge']}", "--model", f"nano={tiny_family['nano']}",
            "--outputs", str(tmp_path / "o"), "--cache-dir", str(tmp_path / "c")]
    cpu = app.create_studio(app.parse_args(argv)).service.queue
    cpu.close()
    assert cpu.loaded_models() == [] and warmed == []  # on the CPU (CI), models still load on first use only
    monkeypatch.setattr(job_queue, "torch_cuda_available", lambda: True)
    queue = app.create_studio(app.parse_args(argv)).service.queue
    try:
        deadline = time.monotonic() + 10
        while len(warmed) < len(warmup.warm_requests(queue.registry.info("edge"), ("t2i", "t2v"))):
            assert time.monotonic() < deadline, f"warmed {warmed}"
            time.sleep(0.01)
        assert queue.loaded_models() == ["edge"] and set(warmed) == {"edge"}
    finally:
        queue.close()


# ----------------------------------------------------------------------------------------------
# The launched review app is behind its login
# ----------------------------------------------------------------------------------------------


def test_review_app_serves_nothing_without_a_login(tiny_family, tmp_path):
    from gradio_client import Client

    argv = ["--review", "--auth", "ann:pw1", "--model", f"edge={tiny_family['edge']}", "--model",
            f"nano={tiny_family['nano']}", "--outputs", str(tmp_path / "o"), "--cache-dir", str(tmp_path / "c")]
    with launched_studio(argv) as (studio, url):
        base = url.rstrip("/")
        client = Client(url, auth=("ann", "pw1"), verbose=False)
        media, result = client.predict("edge", json.dumps({"mode": "t2i", "prompt": "a cube", "steps": 2}), None,
                                       api_name="/generate")
        stored = studio.service.reviews.results()
        assert [(r["request_id"], r["origin"]) for r in stored] == [(result["request_id"], "api")]
        assert set(client.view_api(return_format="dict", print_info=False)["named_endpoints"]) == {
            "/models", "/generate", "/reason"}
        for path in ("/config", "/gradio_api/info", f"/gradio_api/file={media}",
                     f"/gradio_api/file={tmp_path / 'o' / 'reviews.sqlite3'}"):
            assert httpx.get(base + path).status_code in (401, 403), path
        assert httpx.post(base + "/login", data={"username": "ann", "password": "wrong"}).status_code == 400


def test_safety_with_the_real_guardrail_fails_at_start_naming_what_is_missing(tmp_path, tiny_family):
    """The real `cosmos_guardrail`, built through its documented `CosmosSafetyChecker()` in a fresh process:
    offline (as here) it cannot fetch its models, or cannot even import (no torchvision for this CPU torch);
    either way the app refuses to start and says what is missing and how to provide it."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_HOME=str(tmp_path / "hf"))
    probe = "import importlib.util, sys; sys.exit(importlib.util.find_spec('cosmos_guardrail') is None)"
    if subprocess.run([sys.executable, "-c", probe], env=env, timeout=60).returncode != 0:
        pytest.skip("cosmos_guardrail is not installed (requirements-gpu.txt; not on a CPU-only torch)")
    importable = subprocess.run([sys.executable, "-c", "import cosmos_guardrail"], env=env,
                                capture_output=True, timeout=180).returncode == 0
    argv = [sys.executable, "app.py", "--safety", "--model", f"edge={tiny_family['edge']}",
            "--outputs", str(tmp_path / "o"), "--cache-dir", str(tmp_path / "c"), "--port", "1"]
    done = subprocess.run(argv, cwd=Path(app.__file__).parent, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stderr[-2000:]
    if importable:
        for fragment in ("nvidia/Cosmos-1.0-Guardrail", "Qwen/Qwen3Guard-Gen-0.6B", "hf download", "HF_HUB_OFFLINE"):
            assert fragment in done.stderr, done.stderr[-2000:]
    else:
        assert "cannot be imported" in done.stderr and "requirements-gpu.txt" in done.stderr, done.stderr[-2000:]


def test_the_real_spaces_package(tiny_family, tmp_path):
    """The real `spaces` (requirements.txt). Off ZeroGPU its decorator hands the job runner back untouched
    and the app runs jobs as usual. On ZeroGPU with a CPU-only torch (as here) its ZeroGPU support cannot
    load, and the app refuses to start saying so instead of crashing with a traceback."""
    import importlib.util

    assert importlib.util.find_spec("spaces") is not None, "requirements.txt installs spaces"
    root = Path(app.__file__).parent
    off = subprocess.run([sys.executable, "-c", (
        "import spaces\n"
        "run = lambda model_name, request, outputs_root: 'ran'\n"
        "assert spaces.GPU(duration=lambda *a: 30)(run) is run\n"
        "from cosmos3_ui import zerogpu\n"
        "from engine.config import build_config\n"
        "space = {'SPACES_ZERO_GPU': build_config().host.zero_gpu}\n"
        "assert zerogpu.gpu_wrapper(run, lambda *a: 30, space) is run and not zerogpu.on_zero_gpu(space)\n"
        "print('identity')")], cwd=root, env={k: v for k, v in os.environ.items() if k != "SPACES_ZERO_GPU"},
        capture_output=True, text=True, timeout=180)
    assert off.stdout.strip() == "identity", off.stderr[-2000:]
    import torch

    if torch.version.cuda is not None:
        pytest.skip("a CUDA torch: ZeroGPU itself needs a Space's device API, which is not reachable here")
    env = dict(os.environ, SPACES_ZERO_GPU="true", SPACES_ZERO_DEVICE_API_URL="http://127.0.0.1:9")
    on = subprocess.run([sys.executable, "app.py", "--model", f"edge={tiny_family['edge']}", "--outputs",
                         str(tmp_path / "o"), "--cache-dir", str(tmp_path / "c"), "--port", "1"],
                        cwd=root, env=env, capture_output=True, text=True, timeout=300)
    assert on.returncode == 2 and "ZeroGPU needs a CUDA build of torch" in on.stderr, on.stderr[-2000:]
