"""Render docs/PERFORMANCE.md and README's Speed table from docs/data/current.json.

    python3 docs/render_performance.py            # rewrite both from current.json
    python3 docs/render_performance.py --check    # exit 1, naming the file, if either differs from a render

current.json holds one current figure per workload (the newest measurement, with its date, GPU, clock, versions,
command, data file and log section) and what each fast-path pass is worth. Change a figure there, never in the
rendered files: tests/unit/project/test_docs_data.py fails when a committed file differs from what this script renders.
Pure Python (no torch), so the check runs anywhere.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CURRENT = ROOT / "docs" / "data" / "current.json"
# The dated log the page links for what current.json does not hold (memory, several GPUs, the reasoner, previews).
LOG = "docs/perf-log/2026-12-02.md"
README_BEGIN = "<!-- speed table: rendered by docs/render_performance.py from docs/data/current.json -->"
README_END = "<!-- end of the speed table -->"

# Checked in order: "_tokens_per_s" before "_s".
UNITS = {"_tokens_per_s": "tokens/s", "_s": "s", "_ms": "ms", "_ratio": "x"}
FIGURE_NAMES = {"total_s": "total", "denoise_s": "denoise", "prefill_s": "prefill", "decode_s": "decode",
                "step_ms": "a step", "diffusers_step_ms": "diffusers' step", "step_2gpu_ms": "a step on 2 GPUs",
                "step_1gpu_ms": "on one GPU", "first_total_s": "first request", "warm_total_s": "warm request",
                "first_over_warm_ratio": "first / warm", "warm_up_s": "start-up warm-up",
                "free_tokens_per_s": "free", "constrained_tokens_per_s": "constrained"}
# The fields that say where and how a figure was measured; a group's rows that share them are described once.
PROVENANCE = ("measured", "command", "data", "log")


def load(path: Path = CURRENT) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def anchor(heading: str) -> str:
    """GitHub's anchor for a Markdown heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def log_heading(root: Path, log: dict) -> str:
    """The full heading in the log file that starts with `log["section"]` (sections are cited by their start)."""
    lines = (root / log["file"]).read_text(encoding="utf-8").splitlines()
    for line in lines:
        if line.startswith("#"):
            title = line.lstrip("#").strip()
            if title.startswith(log["section"]):
                return title
    raise ValueError(f"{log['file']} has no heading starting with {log['section']!r} (cited by docs/data/current.json)")


def log_link(root: Path, log: dict) -> str:
    """A Markdown link to a log section from a page in docs/."""
    return f"[{log['section']}]({log['file'].removeprefix('docs/')}#{anchor(log_heading(root, log))})"


def unit(name: str) -> str:
    return next(u for suffix, u in UNITS.items() if name.endswith(suffix))


def value(entry: dict, name: str) -> str:
    """A figure as the docs show it: seconds to 10 ms, ratios to 0.01, milliseconds and tokens/s to one decimal
    (whole ones as given)."""
    number = entry["figures"][name]
    if unit(name) == "x":
        return f"{number:.2f}x"
    if isinstance(number, int):
        return f"{number} {unit(name)}"
    return f"{number:.2f} s" if unit(name) == "s" else f"{number:.1f} {unit(name)}"


def published(entry: dict) -> str:
    pub = entry.get("published")
    if not pub:
        return "none found"
    return f"{pub['figure']} ({pub['who']}, {pub['precision']}, {pub['gpu']})"


def target_status(entry: dict) -> str:
    target = entry.get("target")
    if not target:
        return ""
    measured = entry["figures"][target["figure"]]
    verdict = "met" if measured <= target["max"] else f"missed by {100 * (measured / target['max'] - 1):.1f}%"
    bound = f"{target['max']:g}" + ("x" if unit(target["figure"]) == "x" else f" {unit(target['figure'])}")
    return f"{FIGURE_NAMES[target['figure']]} <= {bound}: {verdict}"


def heading(entry: dict) -> str:
    return entry["workload"] + (f", {entry['process']}" if entry.get("process") else "")


def group(current: dict, name: str) -> list[dict]:
    return [entry for entry in current["workloads"] if entry["group"] == name]


def ours(entry: dict) -> str:
    head = entry["headline"]
    text = f"**{value(entry, head)}**"
    return text if head == "total_s" else f"{text} {FIGURE_NAMES[head]}"


def readme_table(current: dict) -> str:
    rows = ["| workload (one H200, warm, bf16 unless marked) | ours | best published | how, data, log |",
            "|---|---|---|---|"]
    for entry in group(current, "end to end"):
        link = f"[{entry['measured']['date'][:10]}](docs/PERFORMANCE.md#{anchor(heading(entry))})"
        rows.append(f"| {entry['workload']} | {ours(entry)} | {published(entry)} | {link} |")
    return "\n".join(rows)


def _end_to_end_table(current: dict) -> list[str]:
    rows = ["| workload | ours | a step | decode | best published | target | measured |",
            "|---|---|---|---|---|---|---|"]
    for entry in group(current, "end to end"):
        m = entry["measured"]
        when = f"{m['date'][:10]}, {m['sm_clock_mhz']} MHz, {m['commit']}"
        rows.append(f"| [{entry['workload']}](#{anchor(heading(entry))}) | {ours(entry)} | {value(entry, 'step_ms')} | "
                    f"{value(entry, 'decode_s')} | {published(entry)} | {target_status(entry)} | {when} |")
    return rows


def _ratio_table(current: dict, group_name: str, columns: tuple[str, ...], base: str, other: str,
                 with_published: bool = False) -> list[str]:
    """One row per workload of the group: `base`, `other`, and other / base (plus the published figure)."""
    rows = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for entry in group(current, group_name):
        f = entry["figures"]
        cells = [entry["workload"], value(entry, base), value(entry, other), f"{f[other] / f[base]:.2f}x"]
        if with_published:
            cells.append(published(entry) if entry["published"] else "")
        rows.append("| " + " | ".join(cells) + " |")
    return rows


def _first_request_table(current: dict) -> list[str]:
    rows = ["| workload | process | first request | warm request | first / warm | start-up warm-up | target |",
            "|---|---|---|---|---|---|---|"]
    for entry in group(current, "fresh process"):
        warm_up = value(entry, "warm_up_s") if "warm_up_s" in entry["figures"] else ""
        target = target_status(entry) if entry["target"] else ""
        rows.append(f"| {entry['workload']} | {entry['process']} | {value(entry, 'first_total_s')} | "
                    f"{value(entry, 'warm_total_s')} | {value(entry, 'first_over_warm_ratio')} | {warm_up} | {target} |")
    return rows


def _where(entry: dict) -> str:
    return " / ".join(p if isinstance(p, str) else ",".join(f"{k}={v}" for k, v in p.items())
                      for p in entry["data_path"])


def _measured_lines(root: Path, entry: dict, rows: str) -> list[str]:
    m = entry["measured"]
    clock = f", SM clock {m['sm_clock_mhz']} MHz (median)" if m.get("sm_clock_mhz") else ""
    commit = f", commit {m['commit']}" if m.get("commit") else ""
    versions = ", ".join(f"{k} {v}" for k, v in m["versions"].items())
    return [f"- {m['date']}, {m['gpu']} (driver {m['driver']}){clock}{commit}; {versions}",
            f"- `{entry['command']}`",
            f"- data: [{entry['data']}]({entry['data'].removeprefix('docs/')}) ({rows}); "
            f"log: {log_link(root, entry['log'])}"]


def _provenance(root: Path, entry: dict) -> list[str]:
    figures = ", ".join(f"{FIGURE_NAMES[k]} {value(entry, k)}" for k in entry["figures"])
    lines = [f"- {figures}; {entry['precision']}, CFG {entry['cfg']}"] + _measured_lines(root, entry, _where(entry))
    if entry.get("published") and entry["published"].get("also"):
        lines.append(f"- published: {published(entry)}, {entry['published']['source']}; "
                     f"also {entry['published']['also']}")
    if entry.get("note"):
        lines.append(f"- {entry['note']}")
    return lines


def _group_provenance(root: Path, entries: list[dict]) -> list[str]:
    """One description for a group's rows when they come from one run; else one per row."""
    first = entries[0]
    if any(entry[key] != first[key] for entry in entries for key in PROVENANCE):
        return [line for entry in entries for line in [f"#### {heading(entry)}", ""] + _provenance(root, entry) + [""]]
    rows = "; ".join(_where(entry) for entry in entries)
    return _measured_lines(root, first, rows) + [""]


def _passes_table(root: Path, current: dict) -> list[str]:
    rows = ["| switch | pass | worth, as measured | measured | log |", "|---|---|---|---|---|"]
    for p in current["passes"]:
        rows.append(f"| `{p['switch']}` | {p['pass']} | {p['worth']} | {p['measured']} | "
                    f"{log_link(root, p['log'])} |")
    return rows


INTRO = """\
Through `engine.generate` on one NVIDIA H200, prompt to frames ready to write, warm (the same request run once
before in the process), full-size random weights, the full-size random Wan2.2 VAE and a 1606-token JSON caption
with the default empty negative prompt; every fast-path pass on unless marked. Each figure is the newest
measurement of its workload. An H200 held at its 700 W power cap ran these requests at {clocks} MHz, and a video
request's time follows that clock, so each row names its clock: the same code moves by a few percent from machine
to machine. Published figures are as gathered on 2026-11-30 (NVIDIA's inference benchmarks, github.com/NVIDIA/cosmos
`inference_benchmarks/`, bf16, batch 1 unless marked; SGLang pull request #36571; SGLang's Edge T2I step profile)."""

METHOD = """\
`bench/bench_engine.py` (`bench/e2e.py`) runs each workload twice in one process, cold then warm, and writes one
JSON file with a header (date, GPU, driver, commit, the installed versions, the command) and, per run, the stage
times, the denoise's median step, and the SM clock, power and temperature nvidia-smi sampled every 50 ms.
`--table short|edge-t2v-first|nano-t2v-720p` runs the sections of the full table, each within a 10-minute device
call; `--render FILE...` prints a saved run's table on any machine. "a step" is the denoise stage over its steps,
both CFG branches where the request has them; "decode" is latents to uint8 frames in host memory. Step timings use
the project's one timing helper (`cosmos3_kernels/timing.py`: CUDA events around the timed calls)."""


def _clock_range(current: dict) -> str:
    clocks = sorted(entry["measured"]["sm_clock_mhz"] for entry in group(current, "end to end"))
    return f"{clocks[0]}-{clocks[-1]}"


def performance_md(current: dict, root: Path = ROOT) -> str:
    out = ["# Performance", "",
           "<!-- Rendered by docs/render_performance.py from docs/data/current.json: edit that file, then run",
           "     `python3 docs/render_performance.py`. tests/unit/project/test_docs_data.py fails on a hand edit. -->", "",
           INTRO.format(clocks=_clock_range(current)), "", "## End to end on one H200", ""]
    out += _end_to_end_table(current)
    out += ["", "### One step against diffusers' transformer", "",
            "Both CFG branches, the same weights and inputs in one process, JSON-caption prefixes of 1615 and 2866 "
            "tokens (ours reuses the text K/V cached at prefill; diffusers runs two full forwards). Measured on "
            f"{group(current, 'step against diffusers')[0]['measured']['date']}, before most of the passes below, "
            "so ours is slower here than the end-to-end steps above; not measured since.", ""]
    out += _ratio_table(current, "step against diffusers", ("workload", "ours", "diffusers", "speed-up", "published"),
                        "step_ms", "diffusers_step_ms", with_published=True)
    out += ["", "### Two GPUs", "",
            "One CFG step with each branch on its own H200 (`engine/parallel/`, CFG-parallel), against the engine's "
            "one-GPU step in the same run.", ""]
    out += _ratio_table(current, "two GPUs", ("workload", "one GPU", "two GPUs", "ratio"), "step_1gpu_ms", "step_2gpu_ms")
    out += ["", "### The first request of a restarted process", "",
            "A second process over the kernel cache the first one filled (`COSMOS3_KERNEL_CACHE`, "
            "`cosmos3_kernels/persist.py`), bf16, with the GPU extras installed: its first request against its warm "
            "one. \"restarted\": the request comes as soon as the model is loaded (the kernel libraries are imported "
            "at load); \"after the start-up warm-up\": the app's background warm-up over the mode's sizes "
            "(`engine/serving/warmup.py`, from the cache) ran first, as on a Space a user arriving after it sees; the "
            "warm-up held the GPU for the seconds shown. The target is the restarted row's.", ""]
    out += _first_request_table(current)
    out += ["", "### The reasoner: constrained decoding", "",
            "Decode tokens/s of the reasoner's free decode against the grammar-constrained one (llguidance), "
            "random weights at the released dimensions, the fastest of three alternated runs.", ""]
    out += _ratio_table(current, "reasoner", ("reasoner", "free", "constrained", "constrained / free"),
                        "free_tokens_per_s", "constrained_tokens_per_s")
    out += ["", "## How each figure is measured", "", METHOD, ""]
    for entry in group(current, "end to end"):
        out += [f"### {heading(entry)}", ""] + _provenance(root, entry) + [""]
    for name, title in (("step against diffusers", "One step against diffusers"), ("two GPUs", "Two GPUs"),
                        ("fresh process", "The first request of a restarted process"),
                        ("reasoner", "The reasoner: constrained decoding")):
        out += [f"### {title}: the run", ""] + _group_provenance(root, group(current, name))
    out += ["## What each pass is worth", "",
            "Every pass is on by default where it applies (FP8 is opt-in) and has an environment switch. The worth is "
            "the pass's own A/B from the log, on the workload named. The switches without a row here: "
            "`COSMOS3_FAST=0` (the whole fast path off: the exact tower, bit for bit diffusers), `COSMOS3_BATCHED_CFG=0`, "
            "`COSMOS3_CUDA_GRAPHS=0`, `COSMOS3_WHOLE_STEP=0`, `COSMOS3_FUSED_PROJECTIONS=0`, `COSMOS3_UINT8_FRAMES=0`, "
            "`COSMOS3_VAE_CHANNELS_LAST=0` and `COSMOS3_QUACK=0` (`engine/pipeline/fast_path.py` `FastPathOptions`, "
            "`cosmos3_kernels/gemm.py`); `COSMOS3_FP8_POLICY` names the FP8 GEMMs (`engine/pipeline/fp8.py`).", ""]
    out += _passes_table(root, current)
    out += ["", "On a Hopper GPU host `pip install -r requirements-gpu.txt` adds flash-attn-4, QuACK, FA3's FP8 "
            "forward (`fa3-fwd`), cuDNN's frontend and MSLK; the app says at start when such a GPU lacks them, and "
            "logs a warning when one is installed and does not import (`bash scripts/gpu_host_wheels.sh` installs "
            "them on a host without a registry).", "",
            "## Memory, several GPUs, the reasoner", "",
            "Memory per model and GPU size: "
            + log_link(root, {"file": LOG, "section": "Memory"})
            + ". Scaling over 2 GPUs, Super with FSDP2 and the 4/8-GPU projection: "
            + log_link(root, {"file": LOG, "section": "Multi-GPU"})
            + ". The reasoner's speed and its GPU memory policy: "
            + log_link(root, {"file": LOG, "section": "Reasoner"})
            + ". The live preview's cost: "
            + log_link(root, {"file": LOG, "section": "Live preview"}) + ".",
            "", "## The log", "",
            "How each figure was reached, what missed its target and why, the profiles, and every earlier run: "
            f"[{LOG.removeprefix('docs/')}]({LOG.removeprefix('docs/')}) (2026-11-29 to 2026-12-02). A new measurement goes "
            "into a new dated file there, its data file into docs/data/, and its figure into current.json.", ""]
    return "\n".join(out)


def readme_with_table(readme: str, table: str) -> str:
    """README's text with the block between the speed-table markers replaced by `table`."""
    begin, end = readme.find(README_BEGIN), readme.find(README_END)
    if begin < 0 or end < begin:
        raise ValueError(f"README.md lacks the markers {README_BEGIN!r} ... {README_END!r} around its speed table")
    return readme[: begin + len(README_BEGIN)] + "\n" + table + "\n" + readme[end:]


def rendered(root: Path = ROOT) -> dict[Path, str]:
    """Each rendered file and the text it should have."""
    current = load(root / "docs" / "data" / "current.json")
    readme = (root / "README.md").read_text(encoding="utf-8")
    return {root / "docs" / "PERFORMANCE.md": performance_md(current, root),
            root / "README.md": readme_with_table(readme, readme_table(current))}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only compare; exit 1 if a file differs")
    args = parser.parse_args(argv)
    stale = []
    for path, text in rendered().items():
        if path.exists() and path.read_text(encoding="utf-8") == text:
            continue
        if args.check:
            stale.append(str(path.relative_to(ROOT)))
        else:
            path.write_text(text, encoding="utf-8")
            print(f"wrote {path.relative_to(ROOT)}")
    if stale:
        print(f"differs from docs/data/current.json's render: {', '.join(stale)}; "
              "run python3 docs/render_performance.py", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
