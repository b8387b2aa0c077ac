"""engine.config: one configuration, read once from the environment, documented from its own fields."""
from __future__ import annotations

import ast
import re
import subprocess
import sys
from dataclasses import FrozenInstanceError, fields
from pathlib import Path

import pytest

from engine import config as cfg

ROOT = Path(__file__).resolve().parents[3]
SCANNED = ("engine", "cosmos3_kernels", "cosmos3_ui")
# The only modules that may read os.environ: the configuration itself and the command-line entry points.
MAY_READ = {"engine/config.py", "engine/__main__.py", "app.py",
            # It forwards the host's variables into the Ray replicas' own environment (a child's, not a read).
            "engine/serving/ray_replicas.py"}


def environment_reads(source: str) -> list[int]:
    """Lines of `source` that touch the process environment: `os.environ`, `os.getenv`, `os.putenv`, or a bare
    `environ`/`getenv` imported from os."""
    tree = ast.parse(source)
    from_os = {alias.asname or alias.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
               and node.module == "os" for alias in node.names if alias.name in ("environ", "getenv", "putenv")}
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in ("environ", "getenv", "putenv", "unsetenv") \
                and isinstance(node.value, ast.Name) and node.value.id == "os":
            lines.append(node.lineno)
        elif isinstance(node, ast.Name) and node.id in from_os:
            lines.append(node.lineno)
    return lines


def test_no_module_reads_the_environment_outside_the_configuration():
    found = {}
    for package in SCANNED:
        for path in sorted((ROOT / package).rglob("*.py")):
            name = path.relative_to(ROOT).as_posix()
            lines = environment_reads(path.read_text(encoding="utf-8"))
            if lines and name not in MAY_READ:
                found[name] = lines
    assert found == {}, "read the variable in engine/config.py (a field) and pass the value down"


def test_the_scan_catches_each_spelling_of_a_read():
    assert environment_reads('import os\nx = os.environ.get("COSMOS3_X", "1")\n') == [2]
    assert environment_reads('import os\nx = os.getenv("COSMOS3_X")\n') == [2]
    assert environment_reads('from os import environ\nx = environ["COSMOS3_X"]\n') == [2]
    assert environment_reads('import os\nx = os.path.join("a", "b")\nenviron = {}\n') == []


def test_every_variable_the_code_names_has_one_field():
    """Each COSMOS3_* name in the engine, the kernels, the UI, app.py, bench/ and scripts/ is a field's variable."""
    named = set()
    for place in (*SCANNED, "bench", "scripts"):
        for path in (ROOT / place).rglob("*.py"):
            named |= set(re.findall(r"COSMOS3_[A-Z_0-9]*[A-Z0-9]", path.read_text(encoding="utf-8")))
    named |= set(re.findall(r"COSMOS3_[A-Z_0-9]*[A-Z0-9]", (ROOT / "app.py").read_text(encoding="utf-8")))
    variables = [env for _, env, _ in cfg.variables()]
    assert len(variables) == len(set(variables)), "a variable is read by two fields"
    assert sorted(named - set(variables)) == []


def _renderer():
    import importlib.util

    spec = importlib.util.spec_from_file_location("render_configuration", ROOT / "docs" / "render_configuration.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_document_is_rendered_from_the_fields():
    doc = (ROOT / "docs" / "CONFIGURATION.md").read_text(encoding="utf-8")
    assert doc == cfg.render_markdown(), "run: python3 docs/render_configuration.py"
    for section, env, item in cfg.variables():
        assert f"| `{env}` |" in doc and item.metadata["meaning"] in doc.replace("\\|", "|")
    assert _renderer().main(["--check"]) == 0


def test_the_check_fails_where_the_document_differs(tmp_path):
    stale = tmp_path / "CONFIGURATION.md"
    stale.write_text(cfg.render_markdown().replace("COSMOS3_FAST", "COSMOS3_FASTER"), encoding="utf-8")
    assert _renderer().main(["--check"], doc=stale) == 1
    assert _renderer().main([], doc=stale) == 0 and stale.read_text(encoding="utf-8") == cfg.render_markdown()


def test_unset_is_each_fields_default_and_the_config_is_frozen():
    built = cfg.build_config({})
    assert built == cfg.Config()
    assert built.fast_path.fast and not built.fp8.enabled and built.kernels.mode == "auto"
    assert built.kernels.dispatch_timing == "graph" and built.warmup.modes is None
    with pytest.raises(FrozenInstanceError):
        built.fp8.enabled = True


@pytest.mark.parametrize("text,on", [("0", False), ("false", False), ("OFF", False), (" no ", False),
                                     ("1", True), ("yes", True), ("", True)])
def test_switches_read_as_before(text, on):
    assert cfg.build_config({"COSMOS3_FAST": text}).fast_path.fast is on
    assert cfg.build_config({"COSMOS3_FP8": text}).fp8.enabled is (on and text != "")  # off unless asked for


@pytest.mark.parametrize("variable,value,allowed", [
    ("COSMOS3_FP8_POLICY", "bogus", "GRANULARITY"),
    ("COSMOS3_FP8", "maybe", "1, true, on, yes"),
    ("COSMOS3_WHOLE_STEP", "nope", "0, false, off, no"),
    ("COSMOS3_KERNELS", "cuda", "'auto', 'triton', 'torch'"),
    ("COSMOS3_DISPATCH_TIMING", "wall", "'graph', 'eager'"),
    ("COSMOS3_FP8_ATTENTION", "flash", "['fa3', 'cudnn']"),
    ("COSMOS3_FA3_PACK_GQA", "yes", "'1', '0', 'auto'"),
    ("COSMOS3_WARMUP", "t2i,i2v", "t2i, t2v"),
    ("COSMOS3_QUACK", "2", "0, false, off, no"),
    ("GRADIO_SERVER_PORT", "http", "must be a number"),
])
def test_a_bad_value_names_the_variable_what_it_holds_and_what_is_allowed(variable, value, allowed):
    with pytest.raises(cfg.ConfigError) as info:
        cfg.build_config({variable: value})
    message = str(info.value)
    assert variable in message and repr(value) in message and allowed in message


def test_secrets_stay_out_of_the_repr():
    built = cfg.build_config({"COSMOS3_AUTH": "ann:hunter2", "COSMOS3_API_KEYS": "sk-secret-key",
                              "COSMOS3_REMOTE_KEY": "sk-remote"})
    assert built.auth.auth == "ann:hunter2"
    assert not any(secret in repr(built) for secret in ("hunter2", "sk-secret-key", "sk-remote"))


def test_the_kernel_cache_folder(tmp_path):
    assert cfg.build_config({"COSMOS3_KERNEL_CACHE": f" {tmp_path} "}).kernel_cache_dir() == tmp_path
    assert cfg.build_config({"COSMOS3_KERNEL_CACHE": "none"}).kernel_cache_dir() is None
    home = Path("~/.cache/cosmos3-studio").expanduser()
    assert cfg.build_config({}).kernel_cache_dir() == home / "kernels"


def test_the_fast_path_options_come_from_the_configuration():
    import torch

    from engine.pipeline.fast_path import FastPathOptions

    built = cfg.build_config({"COSMOS3_WHOLE_STEP": "0", "COSMOS3_FP8": "1", "COSMOS3_FP8_POLICY": "row:in",
                              "COSMOS3_KERNELS": "torch", "COSMOS3_FP8_ATTENTION": "cudnn"})
    on_gpu = FastPathOptions.from_config(built, torch.device("cuda"))
    assert on_gpu.enabled and not on_gpu.whole_step and on_gpu.fp8 and on_gpu.fp8_policy == "row:in"
    assert on_gpu.kernels == "torch" and on_gpu.fp8_attention == "cudnn" and on_gpu.batched_cfg
    assert not FastPathOptions.from_config(built, torch.device("cpu")).enabled  # the exact tower off the GPU


def test_start_up_sets_what_the_libraries_read_and_keeps_what_is_set(tmp_path, monkeypatch):
    from cosmos3_kernels import settings

    monkeypatch.setattr(settings, "_current", settings.current())  # restored after the test
    environ = {"MSLK_PYTHON_ONLY": "0"}
    built = cfg.build_config({"COSMOS3_KERNEL_CACHE": str(tmp_path), "COSMOS3_QUACK": "0", "TRITON_INTERPRET": "1"})
    done = cfg.apply_process_environment(built, environ)
    assert environ["MSLK_PYTHON_ONLY"] == "0" and "MSLK_PYTHON_ONLY" not in done  # an explicit setting is kept
    assert environ["FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED"] == "1"
    assert environ["TRITON_CACHE_DIR"] == str(tmp_path / "triton")
    assert settings.current() == settings.KernelSettings(quack=False, flash4=True, interpret=True)
    fresh = {}
    cfg.apply_process_environment(cfg.build_config({"COSMOS3_KERNEL_CACHE": "off"}), fresh)
    assert fresh["MSLK_PYTHON_ONLY"] == "1" and "TRITON_CACHE_DIR" not in fresh


def test_importing_the_engine_leaves_the_environment_as_it_was():
    """No write at import: MSLK_PYTHON_ONLY and flash-attn-4's cache switch are set by the start-up call only."""
    script = ("import os, torch, triton\n"
              "before = dict(os.environ)\n"
              "import engine, engine.config, engine.pipeline.fp8, engine.serving.queue\n"
              "import cosmos3_kernels.prefix_attention, cosmos3_kernels.gemm, cosmos3_kernels.persist\n"
              "changed = {k for k in set(os.environ) | set(before) if os.environ.get(k) != before.get(k)}\n"
              "changed -= {'TORCHINDUCTOR_CACHE_DIR'}  # torch's own, set when its compiler is first imported\n"
              "print(sorted(changed))\n")
    env = {"PATH": "/usr/bin:/bin", "HOME": str(Path.home())}
    out = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]"


def test_each_field_has_a_variable_and_a_meaning():
    for name, cls in cfg.SECTIONS:
        for item in fields(cls):
            assert item.metadata["env"] and item.metadata["meaning"], f"{name}.{item.name}"


def test_a_loaded_model_carries_its_configuration_and_the_fast_path_reads_it(tiny_family, monkeypatch):
    """Given one, the model runs under it whatever the environment says; given none, `load_model` reads the
    environment once, at load."""
    import engine
    from engine.pipeline.fast_path import FastPathOptions

    monkeypatch.setenv("COSMOS3_BATCHED_CFG", "1")
    given = cfg.build_config({"COSMOS3_BATCHED_CFG": "0", "COSMOS3_KERNEL_CACHE": "off"})
    model = engine.load_model(tiny_family["edge"], device="cpu", config=given)
    assert model.config is given and not FastPathOptions.for_model(model).batched_cfg
    monkeypatch.setenv("COSMOS3_BATCHED_CFG", "0")
    monkeypatch.setenv("COSMOS3_KERNEL_CACHE", "off")
    model = engine.load_model(tiny_family["edge"], device="cpu")
    monkeypatch.setenv("COSMOS3_BATCHED_CFG", "1")  # after the load: not read again
    assert not model.config.fast_path.batched_cfg and not FastPathOptions.for_model(model).batched_cfg


def test_the_entry_points_stop_at_a_bad_value_naming_it(tiny_family, tmp_path, monkeypatch, capsys):
    import app
    from engine.__main__ import main as engine_main

    monkeypatch.setenv("COSMOS3_FP8_POLICY", "bogus")
    with pytest.raises(SystemExit):
        app.parse_args([])
    assert "COSMOS3_FP8_POLICY='bogus'" in capsys.readouterr().err
    argv = ["generate", "--model", str(tiny_family["edge"]), "--mode", "t2i", "--out", str(tmp_path)]
    assert engine_main(argv) == 2
    assert "COSMOS3_FP8_POLICY='bogus'" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())  # refused before anything ran


def test_the_allowed_values_agree_with_the_code_that_takes_them():
    from cosmos3_kernels import dispatch

    from engine.pipeline import fp8

    assert cfg.KERNEL_MODES == dispatch.MODES and cfg.DISPATCH_TIMINGS == dispatch.TIMINGS
    for spelling in cfg.FA3_PACK_GQA_SPELLINGS:
        fp8.fa3_pack_gqa(spelling)  # each one the FP8 mode takes
    assert cfg.build_config({"COSMOS3_FP8_ATTENTION": "FA3"}).fp8.attention in fp8.FP8_ATTENTION_BACKENDS
