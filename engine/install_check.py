"""Start-up check of the install: one line naming what is broken and the fix, instead of a deep traceback.

Two ways an install breaks that we have seen: a folder on `sys.path` named like an installed distribution
shadows it (a top-level `kernels/` of ours hid Hugging Face's `kernels` once transformers 5.25 began importing
it, and every import of diffusers failed 40 frames down), and a version outside the pins that no longer
imports what we use. `broken_import` finds either before the app starts serving.
"""
from __future__ import annotations

import os
import re
import sys
import sysconfig
from importlib import import_module, metadata
from pathlib import Path

LOCK = Path(__file__).resolve().parents[1] / "requirements.txt"
FIX = "pip install -r requirements.txt"

# What the engine takes from each library, imported the way the engine imports it (diffusers' classes load
# lazily, so the import of the package alone proves nothing).
ENGINE_IMPORTS: dict[str, tuple[str, tuple[str, ...]]] = {
    "torch": ("torch", ()),
    "diffusers": ("diffusers", ("Cosmos3OmniTransformer", "AutoencoderKLWan", "UniPCMultistepScheduler")),
    "transformers": ("transformers", ("AutoModelForImageTextToText", "AutoTokenizer")),
}
_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(?:\[[^\]]*\])?==([^\s;#]+)")


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def pinned_version(distribution: str, lock: Path = LOCK) -> str | None:
    """The version requirements.txt pins for `distribution`, or None where it pins none."""
    try:
        lines = lock.read_text(encoding="utf-8").splitlines()
    except OSError:
        return None
    wanted = _canonical(distribution)
    for line in lines:
        match = _PIN.match(line.strip())
        if match and _canonical(match.group(1)) == wanted:
            return match.group(2)
    return None


def installed_version(distribution: str) -> str | None:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def _library_roots() -> set[Path]:
    """Where installed distributions and the standard library live: names found there are theirs."""
    roots = {sysconfig.get_paths()[key] for key in ("stdlib", "platstdlib", "purelib", "platlib")}
    return {Path(root).resolve() for root in roots if root}


def _is_library_dir(entry: Path, roots: set[Path]) -> bool:
    return any(entry == root or root in entry.parents for root in roots) or entry.name in ("site-packages",
                                                                                          "dist-packages")


def shadowing_folder() -> str | None:
    """One line where a module on a non-library entry of `sys.path` (the project, the working folder,
    PYTHONPATH) has the name of a top-level module that an installed distribution provides; else None."""
    provided = metadata.packages_distributions()
    roots = _library_roots()
    for raw in sys.path:
        entry = Path(raw or os.getcwd()).resolve()
        if not entry.is_dir() or _is_library_dir(entry, roots):
            continue
        for child in sorted(entry.iterdir()):
            name = child.stem if child.suffix == ".py" else child.name
            is_module = (child.is_dir() and (child / "__init__.py").is_file()) or child.suffix == ".py"
            if not is_module or name not in provided:
                continue
            owners = ", ".join(f"{dist} {installed_version(dist) or '?'}" for dist in provided[name])
            return (f"{child} shadows the installed distribution {owners} (it provides the module {name!r}, "
                    f"which a dependency imports): rename or move {child.name}, or run from another folder")
    return None


def _innermost(exc: BaseException) -> BaseException:
    """The first cause of a chain of import failures (diffusers wraps them in RuntimeErrors)."""
    seen = set()
    while id(exc) not in seen:
        seen.add(id(exc))
        nxt = exc.__cause__ or exc.__context__
        if nxt is None:
            break
        exc = nxt
    return exc


def import_failure(distribution: str, module: str, names: tuple[str, ...] = ()) -> str | None:
    """One line where `module` (or one of `names` from it) does not import; else None."""
    try:
        loaded = import_module(module)
        for name in names:
            getattr(loaded, name)
    except Exception as exc:  # noqa: BLE001 - any failure here is reported, in one line, and the app exits
        cause = _innermost(exc)
        reason = " ".join(f"{type(cause).__name__}: {cause}".split())
        installed, pinned = installed_version(distribution), pinned_version(distribution)
        have = f"{distribution} {installed}" if installed else f"{distribution} (not installed)"
        want = f"requirements.txt pins {distribution}=={pinned}" if pinned else "requirements.txt names the versions"
        return f"{have} does not import ({reason}); {want}: run `{FIX}`"
    return None


def broken_import(distributions: tuple[str, ...] = tuple(ENGINE_IMPORTS)) -> str | None:
    """None where the install is sound; otherwise one line naming the package, what failed, and the fix.
    Shadowing is checked first: it breaks imports far from where it shows."""
    if (line := shadowing_folder()) is not None:
        return line
    for distribution in distributions:
        module, names = ENGINE_IMPORTS.get(distribution, (distribution, ()))
        if (line := import_failure(distribution, module, names)) is not None:
            return line
    return None
