"""`python -m engine` end to end, as a subprocess, as a headless user would run it."""
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def _run(*args):
    return subprocess.run([sys.executable, "-m", "engine", *args], cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_cli_generate_and_refuse(tiny_family, tmp_path):
    done = _run("generate", "--model", str(tiny_family["edge"]), "--mode", "t2v", "--prompt", "a kite over a beach",
                "--params", json.dumps({"steps": 2, "seed": 7, "num_frames": 9}), "--out", str(tmp_path), "--device", "cpu")
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert summary["seed"] == 7 and summary["params"]["num_frames"] == 9
    assert Path(summary["files"]["video"]).is_file() and Path(summary["files"]["sidecar"]).is_file()
    assert "[denoise] 2/2" in done.stderr

    refused = _run("generate", "--model", str(tiny_family["edge"]), "--mode", "t2i", "--prompt", "a kite",
                   "--params", json.dumps({"width": 1024, "height": 1024}), "--out", str(tmp_path))
    assert refused.returncode == 2 and "Allowed sizes (WxH): 64x64" in refused.stderr

    inspected = _run("inspect", str(tiny_family["nano-distilled"]))
    assert inspected.returncode == 0
    info = json.loads(inspected.stdout)
    assert info["is_distilled"] and info["defaults"]["t2i"]["steps"] == 4
