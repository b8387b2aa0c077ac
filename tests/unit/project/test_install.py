"""The install: no project package shadows a dependency, every install is pinned, and a broken import at start
is one line that names the package and the fix.

transformers 5.25 made Hugging Face's `kernels` distribution a hard dependency and imports it through
diffusers' loaders; our own top-level `kernels/` came first on sys.path and every import of diffusers failed.
"""
from __future__ import annotations

import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

from engine import install_check

ROOT = Path(__file__).resolve().parents[3]
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(\[[A-Za-z0-9,._-]+\])?==([^=\s;]+)(\s*;.*)?$")


def project_top_level_names(root: Path = ROOT) -> set[str]:
    """Every name `import X` could take from the project's root: its packages and its top-level modules."""
    packages = {p.name for p in root.iterdir() if (p / "__init__.py").is_file()}
    modules = {p.stem for p in root.glob("*.py")}
    return packages | modules


def shadowed(names: set[str]) -> dict[str, list[str]]:
    """Project names that an installed distribution also provides as a top-level module: {name: [distributions]}."""
    provided = metadata.packages_distributions()
    return {name: provided[name] for name in sorted(names) if name in provided}


def test_no_project_package_shadows_an_installed_distribution():
    assert shadowed(project_top_level_names()) == {}


def test_the_shadow_check_catches_the_old_kernels_folder(tmp_path):
    """The old layout (a top-level `kernels/` package) fails the check wherever Hugging Face's `kernels` is
    installed, as it is with the pinned transformers."""
    assert "kernels" in metadata.packages_distributions(), "the pinned transformers no longer pulls in `kernels`"
    (tmp_path / "kernels").mkdir()
    (tmp_path / "kernels" / "__init__.py").write_text("")
    (tmp_path / "app.py").write_text("")
    assert shadowed(project_top_level_names(tmp_path)) == {"kernels": ["kernels"]}


def requirement_lines(path: Path) -> list[str]:
    lines = []
    for raw in path.read_text(encoding="utf-8").splitlines():
        line = raw.split(" #", 1)[0].strip()
        if line and not line.startswith("#"):
            lines.append(line)
    return lines


@pytest.mark.parametrize("name", ["requirements.txt", "requirements-gpu.txt"])
def test_every_install_line_is_pinned(name):
    loose = [line for line in requirement_lines(ROOT / name) if not line.startswith("-") and not PIN.match(line)]
    assert loose == [], f"{name}: every line must be NAME==VERSION"


def test_the_lock_names_no_distribution_like_a_project_package():
    """What `pip install -r requirements.txt` installs (the whole closure is pinned there) takes no project name."""
    names = {PIN.match(line).group(1).lower().replace("_", "-") for line in requirement_lines(ROOT / "requirements.txt")
             if PIN.match(line)}
    ours = {n.lower().replace("_", "-") for n in project_top_level_names()}
    assert names & ours == set()


def test_the_lock_matches_what_is_installed():
    """The tests run on exactly the pinned versions (README's second command installs them): a drifted venv
    would let CI pass on versions a fresh machine never gets."""
    drift = {}
    for line in requirement_lines(ROOT / "requirements.txt"):
        match = PIN.match(line)
        if not match or match.group(4):
            continue
        name, version = match.group(1), match.group(3)
        try:
            installed = metadata.version(name)
        except metadata.PackageNotFoundError:
            drift[name] = (version, None)
            continue
        if installed.split("+", 1)[0] != version.split("+", 1)[0]:
            drift[name] = (version, installed)
    assert drift == {}


def test_readme_commands_install_the_lock():
    block = ROOT.joinpath("README.md").read_text(encoding="utf-8").split("```")[1]
    run_app, run_tests = [line for line in block.splitlines() if line.strip()]
    for command in (run_app, run_tests):
        assert "-r requirements.txt" in command


def test_pinned_version_reads_the_lock():
    assert install_check.pinned_version("transformers") == metadata.version("transformers")
    assert install_check.pinned_version("no-such-distribution") is None


def test_a_shadowed_dependency_is_one_line_naming_it(tmp_path):
    """The failure of 2026-12-04, staged: a folder named like an installed distribution sits first on the path.
    Start-up says which package failed, which folder shadows what, and the fix, in one line."""
    shadow = tmp_path / "kernels"
    shadow.mkdir()
    (shadow / "__init__.py").write_text("")
    code = ("import sys; from engine import install_check; "
            "message = install_check.broken_import(('kernels',)); print(repr(message))")
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                         env={"PYTHONPATH": f"{tmp_path}:{ROOT}", "PATH": "/usr/bin:/bin"})
    message = eval(out.stdout.strip())  # noqa: S307 - our own repr
    assert "\n" not in message
    assert "kernels" in message and str(shadow) in message
    assert f"kernels {metadata.version('kernels')}" in message
    assert "shadows" in message


def test_a_missing_module_is_one_line_with_the_pinned_fix(monkeypatch):
    real_import = install_check.import_module

    def failing(name):
        if name.startswith("diffusers"):
            raise ImportError("cannot import name 'Cosmos3OmniTransformer' from 'diffusers'", name="diffusers")
        return real_import(name)

    monkeypatch.setattr(install_check, "import_module", failing)
    message = install_check.broken_import(("diffusers",))
    assert "\n" not in message
    assert message.startswith(f"diffusers {metadata.version('diffusers')} does not import")
    assert "Cosmos3OmniTransformer" in message
    assert "pip install -r requirements.txt" in message
    assert f"diffusers=={install_check.pinned_version('diffusers')}" in message


def test_app_exits_with_the_line_and_no_traceback(tmp_path):
    """The app's start-up runs the check before anything else: a shadowing folder on the path ends it with
    status 2 and one line."""
    (tmp_path / "kernels").mkdir()
    (tmp_path / "kernels" / "__init__.py").write_text("")
    out = subprocess.run([sys.executable, str(ROOT / "app.py"), "--port", "7861"], cwd=tmp_path, capture_output=True,
                         text=True, timeout=300, env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin",
                                                      "HOME": str(tmp_path), "HF_HUB_OFFLINE": "1"})
    assert out.returncode == 2
    lines = [line for line in out.stderr.splitlines() if line.strip() and not line.startswith(("W1", "Unable"))]
    assert len(lines) == 1 and lines[0].startswith("error: "), out.stderr[-2000:]
    assert "Traceback" not in out.stderr
    assert "kernels" in lines[0] and "shadows" in lines[0]


def test_the_healthy_install_passes_the_check():
    assert install_check.broken_import() is None
