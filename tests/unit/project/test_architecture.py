"""The walls, as tests: what may import what, no import circles, and the size rules.

- `cosmos3_ui` never imports torch (checked in a fresh interpreter: importing every UI module must
  leave torch unloaded, so the UI starts in seconds and never touches a GPU by accident);
- `engine` never imports gradio or the UI, at any depth, lazily or not (read from the source);
- `kernels` is a leaf: it imports nothing of the app (read from the source);
- no import circles among app, cosmos3_ui, engine, kernels and bench (import-time edges, from the
  source with `ast`: every `import` not inside a function);
- no class over 300 lines and no function over 80 in engine/, cosmos3_ui/ and cosmos3_kernels/.
"""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
PACKAGES = ("app", "cosmos3_ui", "engine", "cosmos3_kernels", "bench")
MAX_CLASS_LINES = 300
MAX_FUNCTION_LINES = 80
# Known offenders of the size rule when it was added, each with the helper who owns the code.
# Shrink this list; never grow it.
KNOWN_LONG: dict[str, str] = {
}


def _modules() -> dict[str, Path]:
    found = {}
    for name in PACKAGES:
        single = ROOT / f"{name}.py"
        if single.is_file():
            found[name] = single
            continue
        for path in sorted((ROOT / name).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join(parts)] = path
    return found


MODULES = _modules()


def _is_package(name: str) -> bool:
    return MODULES[name].name == "__init__.py"


def _resolve(module: str, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".") if _is_package(module) else module.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _imports(module: str, *, lazy: bool) -> set[str]:
    """Absolute names this module imports (at import time only, unless `lazy`)."""
    tree = ast.parse(MODULES[module].read_text(encoding="utf-8"))
    out: set[str] = set()

    def visit(node, in_function: bool):
        for child in ast.iter_child_nodes(node):
            inside = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if isinstance(child, ast.Import) and (lazy or not in_function):
                out.update(alias.name for alias in child.names)
            elif isinstance(child, ast.ImportFrom) and (lazy or not in_function):
                target = _resolve(module, child)
                for alias in child.names:
                    out.add(f"{target}.{alias.name}" if f"{target}.{alias.name}" in MODULES else target)
            visit(child, inside)

    visit(tree, False)
    return out


def _project_edges(*, lazy: bool) -> dict[str, set[str]]:
    edges = {}
    for module in MODULES:
        targets = set()
        for name in _imports(module, lazy=lazy):
            while name and name not in MODULES:  # `import engine.model.x.attr` -> the module it names
                name = name.rpartition(".")[0]
            if name and name != module:
                targets.add(name)
        edges[module] = targets
    return edges


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def connect(node):
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in edges.get(node, ()):
            if nxt not in index:
                connect(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                item = stack.pop()
                on_stack.discard(item)
                component.append(item)
                if item == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for node in edges:
        if node not in index:
            connect(node)
    return found


def _under(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def test_no_import_circles():
    """Imports inside functions count too: a lazy import that closes a loop is still a loop between
    the modules (it only moves the failure to whichever call runs first)."""
    assert _cycles(_project_edges(lazy=True)) == []


def test_the_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_engine_never_imports_gradio_or_the_ui():
    bad = {
        module: sorted(n for n in _imports(module, lazy=True)
                       if _under(n, "gradio") or _under(n, "cosmos3_ui") or _under(n, "app"))
        for module in MODULES if _under(module, "engine")
    }
    assert {m: names for m, names in bad.items() if names} == {}


def test_kernels_is_a_leaf():
    bad = {
        module: sorted(n for n in _imports(module, lazy=True)
                       if any(_under(n, p) for p in PACKAGES if p != "cosmos3_kernels"))
        for module in MODULES if _under(module, "cosmos3_kernels")
    }
    assert {m: names for m, names in bad.items() if names} == {}


def test_the_engine_floors_point_down():
    """model <- pipeline <- parallel, reasoner <- serving: a floor imports only the floors below it. The GPU group
    (parallel) hands the pipeline its prefill and tower through `engine.pipeline.state.TowerGroup`, and the job
    events every floor shares live under none (`engine.events`). Floors of one level (parallel, reasoner) do not
    import each other either."""
    order = {"engine.model": 0, "engine.pipeline": 1, "engine.parallel": 2, "engine.reasoner": 2,
             "engine.serving": 3}
    bad = []
    for module, targets in _project_edges(lazy=True).items():
        floor = next((f for f in order if _under(module, f)), None)
        for target in targets:
            up = next((f for f in order if _under(target, f)), None)
            if floor and up and up != floor and order[up] >= order[floor]:
                bad.append(f"{module} -> {target}")
    assert bad == []


def test_the_floors_test_sees_the_parallel_floor_reaching_down_only():
    """The floors above cover parallel/ and reasoner/: both import the pipeline, and the pipeline neither."""
    edges = _project_edges(lazy=True)
    assert any(_under(t, "engine.pipeline") for m in edges if _under(m, "engine.parallel") for t in edges[m])
    assert any(_under(t, "engine.pipeline") for m in edges if _under(m, "engine.reasoner") for t in edges[m])
    assert not [t for m in edges if _under(m, "engine.pipeline") for t in edges[m]
                if _under(t, "engine.parallel") or _under(t, "engine.reasoner")]


def test_the_ui_never_imports_torch():
    names = sorted(m for m in MODULES if _under(m, "cosmos3_ui"))
    code = ("import importlib, sys\n"
            f"for name in {names!r}:\n"
            "    importlib.import_module(name)\n"
            "print(sorted(m for m in ('torch', 'cosmos3_kernels', 'diffusers', 'engine.pipeline.run') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "[]"


def _long_definitions() -> dict[str, int]:
    found = {}
    for module, path in MODULES.items():
        if not any(_under(module, package) for package in ("engine", "cosmos3_ui", "cosmos3_kernels")):
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))

        def visit(node, prefix):
            for child in ast.iter_child_nodes(node):
                if isinstance(child, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                    lines = child.end_lineno - child.lineno + 1
                    limit = MAX_CLASS_LINES if isinstance(child, ast.ClassDef) else MAX_FUNCTION_LINES
                    name = f"{prefix}.{child.name}"
                    if lines > limit:
                        found[name] = lines
                    visit(child, name)
                else:
                    visit(child, prefix)

        visit(tree, module)
    return found


def test_no_class_over_300_lines_and_no_function_over_80():
    long = _long_definitions()
    assert sorted(set(long) - set(KNOWN_LONG)) == [], long
    # A known offender that was fixed leaves the list, so the list only shrinks.
    assert sorted(set(KNOWN_LONG) - set(long)) == []


def test_one_timing_helper_for_bench_and_dispatch():
    """GPU time is measured in one place (cosmos3_kernels.timing), so the dispatcher's choices and the tables in
    docs/PERFORMANCE.md are measured the same way: no other module times with CUDA events."""
    timers = sorted(module for module, path in MODULES.items()
                    if module != "cosmos3_kernels.timing" and ".elapsed_time(" in path.read_text(encoding="utf-8"))
    assert timers == []
    uses = {module for module, path in MODULES.items() if "cosmos3_kernels.timing import" in path.read_text(encoding="utf-8")}
    assert {"cosmos3_kernels.autotune", "bench.bench_engine", "bench.bench_kernels", "bench.bench_parallel"} <= uses
