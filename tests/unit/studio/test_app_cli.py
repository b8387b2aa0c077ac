"""app.py's command line: --model NAME=SOURCE, defaults, refusals, and the tiny family by default."""
import argparse
import subprocess
import sys
from pathlib import Path

import pytest

import app

REPO = Path(__file__).resolve().parents[3]


def test_defaults():
    args = app.parse_args([])
    assert (args.host, args.port, args.queue_size, args.model) == ("127.0.0.1", 7860, 16, [])
    assert args.outputs == (Path.cwd() / "outputs").resolve()
    assert args.cache_dir == args.config.paths.studio_cache_dir()


def test_models_are_repeatable_name_source_pairs(tmp_path):
    args = app.parse_args(["--model", "nano=nvidia/Cosmos3-Nano", "--model", f"mine = {tmp_path}",
                           "--port", "9000", "--host", "0.0.0.0", "--queue-size", "3", "--outputs", str(tmp_path)])
    assert args.model == [("nano", "nvidia/Cosmos3-Nano"), ("mine", str(tmp_path))]
    assert (args.port, args.host, args.queue_size, args.outputs) == (9000, "0.0.0.0", 3, tmp_path.resolve())
    entries = app.model_entries(args)
    assert [(e.name, e.source, e.label) for e in entries] == [("nano", "nvidia/Cosmos3-Nano", ""),
                                                             ("mine", str(tmp_path), "")]


@pytest.mark.parametrize("text", ["nano", "=src", "nano=", "../x=src", "a b=src", "-x=src"])
def test_bad_model_arguments_are_refused(text):
    with pytest.raises(argparse.ArgumentTypeError):
        app.parse_model(text)


@pytest.mark.parametrize(
    "argv, fragment",
    [
        (["--model", "a=x", "--model", "a=y"], "repeated: a"),
        (["--queue-size", "0"], "--queue-size"),
        (["--port", "70000"], "--port"),
        (["--model", "nano"], "NAME=SOURCE"),
        (["--ray", "local", "--safety"], "--safety is not available with --ray or --remote"),
        (["--remote", "http://peer:7860", "--safety"], "--safety is not available with --ray or --remote"),
    ],
)
def test_usage_errors(argv, fragment, capsys):
    with pytest.raises(SystemExit):
        app.parse_args(argv)
    assert fragment in capsys.readouterr().err


def test_no_model_serves_the_tiny_family_labelled(tiny_family, tmp_path, monkeypatch):
    import engine.model.tiny

    calls = []

    def fake_ensure(cache):
        calls.append(Path(cache))
        return dict(tiny_family)

    monkeypatch.setattr(engine.model.tiny, "ensure_family", fake_ensure)
    args = app.parse_args(["--cache-dir", str(tmp_path)])
    entries = app.model_entries(args)
    assert calls == [tmp_path / "tiny"]
    assert [e.name for e in entries] == ["nano", "nano-distilled", "super", "super-distilled", "edge", "edge-distilled"]
    assert {e.label for e in entries} == {app.TINY_LABEL}


def test_state_key_is_kept_outside_the_outputs(tmp_path):
    first = app.state_secret(tmp_path / "cache")
    assert len(first) == 64 and app.state_secret(tmp_path / "cache") == first
    assert (tmp_path / "cache" / "browser-state.key").stat().st_mode & 0o077 == 0


def test_a_missing_model_folder_fails_at_startup_with_a_message(tmp_path):
    result = subprocess.run(
        [sys.executable, "app.py", "--model", f"ghost={tmp_path / 'nope'}", "--outputs", str(tmp_path / "out"),
         "--cache-dir", str(tmp_path / "cache")],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 2
    assert "does not exist" in result.stderr and "Traceback" not in result.stderr
