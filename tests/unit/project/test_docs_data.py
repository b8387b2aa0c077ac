"""The performance docs are data: docs/data/current.json holds each current figure once, the rendered pages equal
its render, each figure equals the row of the data file it names, and every citation of a doc or a log section
in the repository reaches an existing file and section. Pure Python, no GPU."""
from __future__ import annotations

import copy
import importlib.util
import json
import os
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


def _renderer():
    spec = importlib.util.spec_from_file_location("render_performance", ROOT / "docs" / "render_performance.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


render = _renderer()
CURRENT = render.load()
MEASURED = [entry for entry in CURRENT["workloads"] if entry.get("data_path")]


def test_performance_md_and_readme_speed_table_are_the_render_of_current_json():
    for path, text in render.rendered(ROOT).items():
        assert path.read_text(encoding="utf-8") == text, (
            f"{path.relative_to(ROOT)} differs from the render of docs/data/current.json: change the figure there "
            "and run python3 docs/render_performance.py")


def test_a_changed_figure_or_a_hand_edit_shows_as_a_difference():
    committed = (ROOT / "docs" / "PERFORMANCE.md").read_text(encoding="utf-8")
    changed = copy.deepcopy(CURRENT)
    changed["workloads"][0]["figures"]["total_s"] += 1.0
    assert render.performance_md(changed, ROOT) != committed
    assert render.readme_table(changed) not in (ROOT / "README.md").read_text(encoding="utf-8")
    first = render.value(CURRENT["workloads"][0], "total_s")
    assert first in committed
    assert render.performance_md(CURRENT, ROOT) != committed.replace(first, "1.00 s", 1)


def test_every_data_file_current_json_names_exists():
    named = [entry["data"] for entry in CURRENT["workloads"]]
    named += [path for item in CURRENT["passes"] for path in item["data"]]
    missing = [path for path in named if not (ROOT / path).is_file()]
    assert not missing, f"docs/data/current.json names data files that do not exist: {missing}"


def _row(data: object, path: list) -> dict:
    for step in path:
        if isinstance(step, dict):
            data = next(row for row in data if all(row.get(k) == v for k, v in step.items()))
        else:
            data = data[step]
    return data


def _field(row: dict, dotted: str) -> float:
    for key in dotted.split("."):
        row = row[key]
    return row


def _half_step(name: str, figure: float) -> float:
    """Half the last shown digit: figures are the data file's numbers rounded for the docs."""
    if isinstance(figure, int):
        return 0.5
    return 0.005 if render.unit(name) in ("s", "x") else 0.05


@pytest.mark.parametrize("entry", MEASURED, ids=[entry["id"] for entry in MEASURED])
def test_each_figure_is_its_data_file_row_rounded(entry):
    data = json.loads((ROOT / entry["data"]).read_text(encoding="utf-8"))
    row = _row(data, entry["data_path"])
    for name, figure in entry["figures"].items():
        measured = _field(row, entry["data_fields"][name])
        assert abs(measured - figure) <= _half_step(name, figure) + 1e-9, (
            f"{entry['id']}: {name} is {figure} in current.json, {measured} in {entry['data']}")
    if "sm_mhz_median" in row:
        assert entry["measured"]["sm_clock_mhz"] == row["sm_mhz_median"]
    header = data.get("header") if isinstance(data, dict) else None
    if header and "command" in header:
        assert entry["command"] == "python3 " + header["command"].replace("/root/out/", "$OUT/")
        assert header["commit"].startswith(entry["measured"]["commit"])
        assert entry["measured"]["date"] == header["date"] and entry["measured"]["gpu"] == header["gpu"]
        stated = {k: v for k, v in header.items() if k in entry["measured"]["versions"]}
        assert stated == entry["measured"]["versions"], f"{entry['id']}: versions differ from {entry['data']}"


def test_the_check_compares_against_the_data_file():
    entry = copy.deepcopy(next(e for e in MEASURED if e["id"] == "nano-t2v-720p"))
    entry["figures"]["total_s"] = 186.0
    with pytest.raises(AssertionError, match="total_s is 186.0"):
        test_each_figure_is_its_data_file_row_rounded(entry)


def _sections(path: Path) -> list[str]:
    """What a citation may name in a Markdown file: its headings and its bold paragraph titles."""
    text = path.read_text(encoding="utf-8")
    return ([line.lstrip("#").strip() for line in text.splitlines() if line.startswith("#")]
            + re.findall(r"^\*\*([^*]+)\*\*", text, flags=re.MULTILINE))


def test_every_log_section_current_json_cites_exists():
    logs = [entry["log"] for entry in CURRENT["workloads"]] + [item["log"] for item in CURRENT["passes"]]
    for log in logs:
        render.log_heading(ROOT, log)  # raises, naming the file and the section, when there is none


SCANNED = (".py", ".md", ".sh", ".txt", ".in")
SKIPPED = {".git", ".venv", "venv", "node_modules", "data", "outputs", "__pycache__"}


def _repo_texts():
    """The repository's text files, never descending into a virtual environment, git's folder or data."""
    for folder, subfolders, files in os.walk(ROOT):
        subfolders[:] = [name for name in subfolders if name not in SKIPPED and not name.startswith(".")]
        for name in files:
            if name.endswith(SCANNED):
                yield Path(folder) / name


def test_every_cited_doc_and_quoted_section_exists():
    """A doc's path anywhere in the repository names a file that exists, and the path followed by a quoted section
    (`, "Section"`, the quote closed on the same line) a heading or bold paragraph title that starts with it."""
    broken = []
    for path in _repo_texts():
        for number, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
            for match in re.finditer(r"(docs/[\w./-]+\.md)(?:'s)?(?:,? \"([^\"]+)\")?", line):
                doc, section = ROOT / match.group(1), match.group(2)
                where = f"{path.relative_to(ROOT)}:{number}"
                if not doc.is_file():
                    broken.append(f"{where}: {match.group(1)} does not exist")
                elif section and not any(s.startswith(section) for s in _sections(doc)):
                    broken.append(f"{where}: {match.group(1)} has no section {section!r}")
    assert not broken, "\n".join(broken)


def test_every_markdown_link_in_the_docs_reaches_its_file_and_anchor():
    broken = []
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    for page in pages:
        for target, fragment in re.findall(r"\]\(([^)#\s]*)(?:#([^)\s]+))?\)", page.read_text(encoding="utf-8")):
            if target.startswith(("http://", "https://", "mailto:")):
                continue
            file = (page.parent / target).resolve() if target else page
            if not file.is_relative_to(ROOT):
                broken.append(f"{page.relative_to(ROOT)}: {target} is outside the repository")
            elif not file.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target} does not exist")
            elif fragment and fragment not in {render.anchor(s) for s in _sections(file)}:
                broken.append(f"{page.relative_to(ROOT)}: {target}#{fragment} has no such heading")
    assert not broken, "\n".join(broken)


def test_the_citation_check_catches_a_missing_section(tmp_path):
    page = tmp_path / "log.md"
    page.write_text("# Log\n\n## The clock a request runs at (2026-12-01)\n\n**GEMMs: QuACK** (a paragraph)\n")
    assert any(s.startswith("The clock a request runs at") for s in _sections(page))
    assert any(s.startswith("GEMMs: QuACK") for s in _sections(page))
    assert not any(s.startswith("Where a step goes") for s in _sections(page))


ARCHITECTURE = ROOT / "docs" / "ARCHITECTURE.md"


def test_architecture_md_names_only_files_that_exist_and_covers_the_fast_path_and_the_group():
    text = ARCHITECTURE.read_text(encoding="utf-8")
    assert "../" not in text, "docs/ARCHITECTURE.md must not point outside the repository"
    for module in ("cosmos3_kernels/dispatch.py", "engine/pipeline/whole_step.py", "engine/pipeline/fp8.py",
                   "engine/parallel/"):
        assert module in text, f"docs/ARCHITECTURE.md does not describe {module}"
    missing = []
    for path in re.findall(r"`((?:[\w-]+/)+[\w.-]*)`", text):
        if path == "kernels/":  # the package's old name, which the page explains
            continue
        if not any((base / name).exists() for base in (ROOT, ROOT / "engine") for name in (path, path + ".py")):
            missing.append(path)
    assert not missing, f"docs/ARCHITECTURE.md names paths that do not exist: {missing}"


def test_every_fast_path_switch_is_listed_in_performance_md():
    from dataclasses import fields

    from engine.config import FastPathConfig, FP8Config, KernelConfig

    # The variables `FastPathOptions.from_config` reads: every pass's switch, the kernels' mode, the FP8 mode's policy.
    switches = {item.metadata["env"] for item in fields(FastPathConfig)}
    switches |= {fields(KernelConfig)[0].metadata["env"], fields(FP8Config)[1].metadata["env"]}
    assert len(switches) > 10 and {"COSMOS3_KERNELS", "COSMOS3_FP8_POLICY"} <= switches
    page = (ROOT / "docs" / "PERFORMANCE.md").read_text(encoding="utf-8")
    assert not [s for s in sorted(switches) if s not in page], "switches missing from docs/PERFORMANCE.md"
