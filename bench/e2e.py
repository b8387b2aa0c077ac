"""End to end through `engine.generate`, per workload: prefill, denoise, decode, total; cold and warm;
beside the best published numbers (sources named). Used by `bench/bench_engine.py --e2e`.

Full-size random weights (bench/models.py), the full-size random Wan2.2 VAE, the offline test
tokenizer, and a caption repeated to about 1.6k tokens (real captions run 1.5k-3k). "cold" is the
first request at that size in the process (the model already loaded; earlier sections of the same run
may have compiled shared kernels, which the table says); "warm" repeats the same request. Files are
not written (the device has no H.264 encoder wheel small enough to carry), so "total" ends with the
frames in host memory, ready to write.
"""
from __future__ import annotations

import cProfile
import gc
import io
import os
import pstats
import sys
import time
from contextlib import contextmanager, nullcontext

import torch

# Workload: (family, request, published numbers with their sources).
WORKLOADS = {
    "nano-t2v-720p": ("nano", dict(mode="t2v", width=1280, height=720, num_frames=189, steps=35, guidance_interval=None),
                      "NIM (FP8) 200.6 s, vLLM-Omni 208.4 s, PyTorch 214.3 s, Diffusers 239.6 s "
                      "(NVIDIA/cosmos inference_benchmarks, 1 H200)"),
    "edge-t2v-480p": ("edge", dict(mode="t2v", width=832, height=480, num_frames=121, steps=50),
                      "Edge I2V 480p/121f: PyTorch 12.3 s, vLLM-Omni 13.1 s (NVIDIA/cosmos inference_benchmarks, "
                      "1 H200)"),
    "nano-t2i-1024": ("nano", dict(mode="t2i", width=1024, height=1024, steps=35, guidance_interval=None),
                      "SGLang #36571 on an H100: denoise 1.60 s, end to end 2.81 s"),
    "edge-t2i-640": ("edge", dict(mode="t2i", width=640, height=640),
                     "SGLang: an Edge T2I step (both branches) profiles at ~6 ms on Hopper"),
    "edge-t2i-480-new-size": ("edge", dict(mode="t2i", width=480, height=480), ""),
    # Nano's T2V at a smaller whitelisted size, cold (a fresh process: nothing compiled, measured or captured)
    # against warm: the default warm-up leaves Nano's T2V unwarmed, so its first request is this cold one.
    "nano-t2v-480p": ("nano", dict(mode="t2v", width=832, height=480, num_frames=121, steps=35, guidance_interval=None), ""),
    # Super on one H200: built FP8-only (its bf16 weights do not fit), the text tower on the host between prefills
    # where the request needs its room (engine.pipeline.memory).
    "super-t2v-720p": ("super", dict(mode="t2v", width=1280, height=720, num_frames=189, steps=35),
                       "vLLM-Omni 769.6 s (NVIDIA/cosmos inference_benchmarks, 1 H200)"),
    "super-t2i-1024": ("super", dict(mode="t2i", width=1024, height=1024), ""),
}
# Issue 17's targets: workload -> (the stage it bounds, seconds), checked on the warm run where there is one.
TARGETS = {"nano-t2v-720p": ("total_s", 190.0), "edge-t2v-480p": ("total_s", 12.0),
           "nano-t2i-1024": ("denoise_s", 1.5), "edge-t2i-640": ("total_s", 0.6)}
# The same for a run in the FP8 mode (`bench_engine.py --fp8`); a workload without one has no FP8 target.
FP8_TARGETS = {"nano-t2v-720p": ("total_s", 150.0)}
# The first request at a size after warm-up, against the same request warm.
FIRST_REQUEST_LIMIT = 1.5
# docs/perf-log/2026-12-02.md's end-to-end table in sections, each one `bench_engine.py --table SECTION` that fits the
# device's 10-minute call: section -> the bench arguments it stands for.
TABLE_SECTIONS = {
    "short": ["--e2e", "edge-t2i-640,edge-t2i-480-new-size,edge-t2v-480p,nano-t2i-1024", "--warm-up-effect"],
    "edge-t2v-first": ["--warm-up-first", "edge-t2v-480p"],
    "nano-t2v-720p": ["--e2e", "nano-t2v-720p", "--cold-only", "none"],
}
PROMPT_TOKENS = 1600


def long_prompt(model, tokens: int = PROMPT_TOKENS, extra: str = "") -> str:
    """The example JSON caption, its `context` field lengthened until the tokenizer gives >= `tokens` tokens."""
    import json
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "assets" / "captions" / "image_lighthouse_keeper.json"
    caption = json.loads(path.read_text()) if path.is_file() else {}
    sentence = "The keeper's lantern throws long shadows over wet stone while waves break far below. "
    context = sentence
    while True:
        text = json.dumps({**caption, "context": context + extra}, ensure_ascii=False)
        if len(model.tokenizer(text)["input_ids"]) >= tokens:
            return text
        context += sentence


def _installed(distribution: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def _driver() -> str | None:
    import subprocess

    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else None


def _commit() -> str | None:
    """The tree's commit: `BENCH_COMMIT` where set (the device), else git's HEAD, marked where the tree differs."""
    import os
    import subprocess
    from pathlib import Path

    if os.environ.get("BENCH_COMMIT"):
        return os.environ["BENCH_COMMIT"]

    def git(*args: str) -> str | None:
        try:
            out = subprocess.run(["git", *args], capture_output=True, text=True, timeout=30,
                                 cwd=Path(__file__).resolve().parents[1])
        except (OSError, subprocess.SubprocessError):
            return None
        return out.stdout.strip() if out.returncode == 0 else None

    head = git("rev-parse", "--short", "HEAD")
    if not head:
        return None
    # The device copies a working tree over its own checkout of the landed main, so HEAD alone can name a commit the
    # tree is not: say so (set BENCH_COMMIT there to name the tree's commit).
    return head + ("+uncommitted changes" if git("status", "--porcelain", "--untracked-files=no") else "")


# The packages besides torch whose versions set a run's numbers (the header records and prints them where installed).
VERSIONED_PACKAGES = ("triton", "diffusers", "torchao", "flash-attn-4", "nvidia-cutlass-dsl", "nvidia-cudnn-frontend",
                      "mslk-cuda", "flashinfer-python", "quack-kernels", "fa3-fwd")


def run_header(gpu: str) -> dict:
    """A bench run's header: UTC date, the GPU and its driver, the command, the tree's commit and the versions
    of the packages that set the numbers."""
    header = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "gpu": gpu, "driver": _driver(),
              "command": " ".join(sys.argv), "commit": _commit(), "torch": torch.__version__,
              "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None}
    for package in VERSIONED_PACKAGES:
        header[package] = _installed(package)
    return header


# nvidia-smi's fields per sample: the clock and power always; temperature and the clock-event reasons
# (a bitmask: 0x4 the software power cap, 0x20 software thermal slowdown, 0x40 hardware thermal slowdown,
# 0x80 the hardware power brake) where this nvidia-smi knows them, so a low clock says why it was low.
CLOCK_FIELDS = ("timestamp", "clocks.sm", "power.draw")
CLOCK_EXTRA_FIELDS = ("temperature.gpu", "clocks_event_reasons.active")
POWER_CAP, THERMAL = 0x4, 0x20 | 0x40


class ClockSampler:
    """nvidia-smi's SM clock and board power (and, where it can, temperature and why the clock is held) every
    50 ms, in the background, so that each measured request can say what clock it ran at. Why: sustained bf16
    work can hold an H200 at its 700 W limit, and the clock it settles at differs between runs and machines
    enough to move a GEMM-bound request by ~17% (Nano T2I, docs/perf-log/2026-12-02.md). Off (every `during` empty)
    where nvidia-smi is missing."""

    def __init__(self):
        import atexit
        import os
        import subprocess
        import tempfile

        descriptor, self.path = tempfile.mkstemp(suffix=".csv")
        self._out = os.fdopen(descriptor, "w")
        self.fields = CLOCK_FIELDS
        try:
            if subprocess.run(["nvidia-smi", "--query-gpu=" + ",".join(CLOCK_FIELDS + CLOCK_EXTRA_FIELDS),
                               "--format=csv,noheader,nounits"], capture_output=True).returncode == 0:
                self.fields = CLOCK_FIELDS + CLOCK_EXTRA_FIELDS
            self.process = subprocess.Popen(
                ["nvidia-smi", "--query-gpu=" + ",".join(self.fields), "--format=csv,noheader,nounits", "-lms", "50"],
                stdout=self._out, stderr=subprocess.DEVNULL)
        except OSError:
            self.process = None
        atexit.register(self._stop)  # a run that fails half-way leaves no sampler behind

    def _stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait()
        self._out.close()

    def close(self) -> list[tuple]:
        """Stop sampling; (unix time, SM MHz, W[, deg C, clock-event bitmask]) per sample (nvidia-smi stamps
        local time, as time.mktime reads)."""
        from pathlib import Path

        self._stop()
        if self.process is None:
            return []
        return [sample for line in Path(self.path).read_text().splitlines()
                if (sample := parse_clock_sample(line)) is not None]


def parse_clock_sample(line: str) -> tuple | None:
    """One nvidia-smi line as a sample (see `ClockSampler.close`); None for a line that is not one."""
    parts = [part.strip() for part in line.split(",")]
    if len(parts) not in (len(CLOCK_FIELDS), len(CLOCK_FIELDS) + len(CLOCK_EXTRA_FIELDS)):
        return None
    try:
        whole, _, fraction = parts[0].partition(".")
        at = time.mktime(time.strptime(whole, "%Y/%m/%d %H:%M:%S")) + float("0." + (fraction or "0"))
        sample = (at, float(parts[1]), float(parts[2]))
        if len(parts) > len(CLOCK_FIELDS):
            sample += (float(parts[3]), int(parts[4], 16))
    except ValueError:
        return None
    return sample


def clocks_during(samples: list[tuple], began: float, ended: float) -> dict:
    """The median SM clock and power (and the lowest clock) of the samples in [began, ended]; with the extra
    fields, also the median temperature and the share of samples whose clock was held by the power cap or
    by a thermal slowdown."""
    inside = [sample for sample in samples if began <= sample[0] <= ended]
    if not inside:
        return {}
    clocks, powers = sorted(s[1] for s in inside), sorted(s[2] for s in inside)
    out = {"sm_mhz_median": clocks[len(clocks) // 2], "sm_mhz_min": clocks[0],
           "power_w_median": powers[len(powers) // 2], "clock_samples": len(inside)}
    extra = [s for s in inside if len(s) == len(CLOCK_FIELDS) + len(CLOCK_EXTRA_FIELDS)]
    if extra:
        temperatures = sorted(s[3] for s in extra)
        out.update(temp_c_median=temperatures[len(temperatures) // 2],
                   power_capped_share=round(sum(bool(s[4] & POWER_CAP) for s in extra) / len(extra), 3),
                   thermal_share=round(sum(bool(s[4] & THERMAL) for s in extra) / len(extra), 3))
    return out


def annotate_clocks(results, samples) -> None:
    """Every measured request in `results` (a dict with "began" and "ended", at any depth) gets `clocks_during`."""
    if isinstance(results, dict):
        if "began" in results and "ended" in results:
            results.update(clocks_during(samples, results["began"], results["ended"]))
        for value in results.values():
            annotate_clocks(value, samples)
    elif isinstance(results, list):
        for value in results:
            annotate_clocks(value, samples)


def stages(timings: dict) -> dict:
    """A result's stage times: prefill (conditioning, prompt and prefill together), denoise, decode, total."""
    prefill = sum(timings.get(k, 0.0) for k in ("conditioning", "prompt", "prefill"))
    return {"prefill_s": prefill, "denoise_s": timings["denoise"], "decode_s": timings["decode"],
            "total_s": timings["total"]}


def sync():
    """Wait for the GPU's queued work, where there is one."""
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def generate_marked(model, request) -> tuple:
    """`engine.generate` once, synchronised before and after: (result, the elapsed time progress saw
    at each denoising step's end, the wall time)."""
    from engine.pipeline.run import generate

    marks = []

    def on_progress(progress):
        if progress.stage == "denoise":
            marks.append(progress.elapsed_s)

    sync()
    began = time.perf_counter()
    result = generate(model, request, on_progress=on_progress)
    sync()
    return result, marks, time.perf_counter() - began


@contextmanager
def host_pauses():
    """What held the host up inside the block besides the code it ran, as a dict filled at the end:
    - `gc_full`: each full (oldest-generation) collection of Python's cyclic collector, as [seconds from the
      block's start, milliseconds it took]. It walks every tracked object (~0.47M in a process with the engine
      imported: 166 ms a walk on the CPU here, docs/perf-log/2026-12-02.md) and holds the GIL throughout, so in a
      host-bound stage (the text tower's eager launches, the decode's) the GPU waits for it;
    - `cuda_segments_allocated`: memory segments the CUDA caching allocator had to get from the driver
      (cudaMalloc), none for a warm request that fits its cache; None without CUDA.

    Why: warm Edge T2V requests on one H200 took 0.06 s and 0.13 s before denoising, in two runs of the same
    table with the same denoise and decode (docs/perf-log/2026-12-02.md), and these are the host's two pauses that no
    stage asks for."""
    oldest = len(gc.get_threshold()) - 1
    out = {"gc_full": [], "cuda_segments_allocated": None}
    began = time.perf_counter()
    started = []

    def on_collection(phase, info):
        if info["generation"] != oldest:
            return
        now = time.perf_counter()
        if phase == "start":
            started.append(now)
        elif started:
            start = started.pop()
            out["gc_full"].append([round(start - began, 4), round(1e3 * (now - start), 2)])

    segments = _cuda_segments()
    gc.callbacks.append(on_collection)
    try:
        yield out
    finally:
        gc.callbacks.remove(on_collection)
        if segments is not None:
            out["cuda_segments_allocated"] = _cuda_segments() - segments


def _cuda_segments() -> int | None:
    """How many segments the CUDA caching allocator has taken from the driver so far (None without CUDA)."""
    if not torch.cuda.is_available():
        return None
    return int(torch.cuda.memory_stats().get("segment.all.allocated", 0))


def timed_generate(model, request) -> dict:
    began = time.time()
    with host_pauses() as pauses:
        result, marks, wall = generate_marked(model, request)
    row = stages(result.timings)
    row["began"], row["ended"] = began, time.time()  # for `annotate_clocks`
    # Where a cold run's time goes: the step durations as progress saw them (first steps, median, max).
    marks.insert(0, row["prefill_s"])  # the denoise stage starts after the prefill (to within the noise draw)
    steps = sorted(b - a for a, b in zip(marks, marks[1:]))
    row["step_s"] = {"first": [round(b - a, 4) for a, b in zip(marks[:4], marks[1:5])],
                     "median": round(steps[len(steps) // 2], 4) if steps else None,
                     "max": round(steps[-1], 4) if steps else None}
    row["wall_s"] = wall
    row["steps"] = result.params["steps"]
    row["denoise_ms_per_step"] = 1000 * row["denoise_s"] / row["steps"]
    row["precision"], row["fp8_policy"] = result.precision, result.fp8_policy
    row["fp8_attention"] = result.fp8_attention  # which FP8 attention kernel ran (None: bf16 attention)
    row.update(pauses)
    return row


def projected_total(run_row: dict, steps: int) -> float:
    """A run's total at `steps` denoising steps (a projection, labelled so wherever it is shown, for a run made with
    fewer steps to fit the device's time): prefill + steps x its steady step + decode. The steady step is the median
    of the intervals between the step reports after the first (`step_s`): the pacer (engine.pipeline.pacing) reports a
    step when the GPU has finished it, the first interval carries the request's one-time work, and the last is cut
    short where the host had queued part of it ahead. Not the denoise stage's time after the first report: at Super
    720p that read 9.7 s a step where every step of a warm request took 15.3 s (45.95 s for three)."""
    intervals = run_row["step_s"]["first"][1:]
    later = sorted(intervals) or [run_row["denoise_s"] / max(1, run_row["steps"])]
    return run_row["prefill_s"] + steps * later[len(later) // 2] + run_row["decode_s"]


def profile_text(profiler: cProfile.Profile, cumulative: int = 30, own: int = 15) -> str:
    """A cProfile run's top functions by cumulative and by own time, without pstats' per-line path preamble."""
    out = io.StringIO()
    stats = pstats.Stats(profiler, stream=out)
    stats.sort_stats("cumulative").print_stats(cumulative)
    stats.sort_stats("tottime").print_stats(own)
    return "\n".join(line[:220] for line in out.getvalue().splitlines() if line.strip())


def run(model, names, *, warm: bool = True, log=print, rows: list | None = None, prompt_tokens: int = PROMPT_TOKENS,
        steps: int | None = None, profile_cold: bool = False) -> list[dict]:
    """Each workload of this model's family: cold, then (unless `warm` is False) warm; rows appended to `rows`.
    `prompt_tokens`: the caption's length; `steps`: run that many steps instead of the workload's (each row then
    also gets its total projected to the workload's steps); `profile_cold`: the cold request runs under cProfile
    (its time then includes the profiler's overhead) and its row gets the top functions as "cprofile"."""
    from engine.model.defaults import sampling_defaults

    prompt = long_prompt(model, tokens=prompt_tokens)
    rows = [] if rows is None else rows
    for name in names:
        family, request, published = WORKLOADS[name]
        request = dict(request, prompt=prompt, seed=1)
        default_steps = request.get("steps") or sampling_defaults(model.info, request["mode"])["steps"]
        if steps is not None:
            request["steps"] = steps
        row = {"workload": name, "family": family, "published": published,
               "prompt_tokens": len(model.tokenizer(prompt)["input_ids"])}
        rows.append(row)
        for run_name in ("cold", "warm") if warm else ("cold",):
            if torch.cuda.is_available():
                torch.cuda.reset_peak_memory_stats()
            profiler = cProfile.Profile() if profile_cold and run_name == "cold" else None
            with profiler or nullcontext():
                row[run_name] = timed_generate(model, request)
            if profiler is not None:
                row[run_name]["cprofile"] = profile_text(profiler)
            if torch.cuda.is_available():
                row[run_name]["peak_gib"] = torch.cuda.max_memory_allocated() / 2**30
            if steps is not None and steps != default_steps:
                row[run_name][f"projected_total_{default_steps}_steps_s (projection)"] = projected_total(
                    row[run_name], default_steps)
            log(row)
        gc.collect()
        torch.cuda.empty_cache()
    return rows


def kernel_rows(prof) -> list[dict]:
    """A torch.profiler run's GPU kernels by name, most device time first (`_by_name`)."""
    return _by_name(_profiled_stages(prof)[1])


STAGES_PROFILED = ("prefill_stage", "tower_stage", "denoise_stage", "decode_stage")


class _StageRanges:
    """Wraps `engine.pipeline.run`'s stage functions in profiler ranges named "stage:<name>" while active."""

    def __enter__(self):
        from engine.pipeline import run

        self.saved = {name: getattr(run, name) for name in STAGES_PROFILED}
        for name, stage in self.saved.items():
            setattr(run, name, self._ranged(name.removesuffix("_stage"), stage))
        return self

    def __exit__(self, *exc):
        from engine.pipeline import run

        for name, stage in self.saved.items():
            setattr(run, name, stage)

    @staticmethod
    def _ranged(label, stage):
        def ranged(state):
            with torch.profiler.record_function(f"stage:{label}"):
                return stage(state)
        return ranged


def _by_name(kernels: list[tuple[str, float, float]]) -> list[dict]:
    """(name, start, end) kernels, microseconds, summed by name: most device time first."""
    by_name: dict[str, list] = {}
    for n, a, b in kernels:
        row = by_name.setdefault(n[:120], [0, 0.0])
        row[0] += 1
        row[1] += (b - a) / 1e3
    return sorted(({"kernel": n, "calls": c, "ms": round(ms, 3)} for n, (c, ms) in by_name.items()),
                  key=lambda r: -r["ms"])


def stage_breakdown(ranges: dict[str, tuple[float, float]], kernels: list[tuple[str, float, float]],
                    top: int = 12) -> dict:
    """Per stage: its wall time (ms), the GPU kernel time that started inside it, that share of the wall,
    and its top kernels. `ranges`: stage -> (start, end) in microseconds; `kernels`: (name, start, end) on
    the same clock (the profiler aligns device timestamps to the host's). A kernel belongs to the stage in
    which it started; each stage ends in a host sync (the denoise stage's pacer, the decode's host copy),
    so nothing of one stage runs in the next."""
    out = {}
    for stage, (begin, end) in ranges.items():
        rows = _by_name([k for k in kernels if begin <= k[1] < end])
        busy = sum(r["ms"] for r in rows)
        wall = (end - begin) / 1e3
        out[stage] = {"wall_ms": round(wall, 3), "kernel_ms": round(busy, 3),
                      "kernel_share_of_wall": round(busy / wall, 4) if wall else None, "top": rows[:top]}
    return out


def _profiled_stages(prof) -> tuple[dict, list]:
    """The "stage:" ranges and the device kernels of a torch.profiler run, as `stage_breakdown` takes them."""
    from torch.autograd import DeviceType

    ranges, kernels = {}, []
    for evt in prof.events():
        if evt.name.startswith("stage:"):  # the range, on the host and (as a GPU annotation) on the device
            if evt.device_type == DeviceType.CPU:
                ranges[evt.name.removeprefix("stage:")] = (evt.time_range.start, evt.time_range.end)
        elif evt.device_type == DeviceType.CUDA:
            kernels.append((evt.name, evt.time_range.start, evt.time_range.end))
    return ranges, kernels


def profile_request(model, name: str, log=print, top: int = 20) -> dict:
    """One more warm request of workload `name` under torch.profiler: how much of its denoise the GPU was
    busy (kernel time summed, against the wall time), and the top kernels, over the request and per stage
    (prefill, denoise, decode). Run after `run` warmed it."""
    family, request, _ = WORKLOADS[name]
    request = dict(request, prompt=long_prompt(model), seed=1)
    torch.cuda.synchronize()
    with _StageRanges(), torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                                            torch.profiler.ProfilerActivity.CUDA]) as prof:
        timings = timed_generate(model, request)
        torch.cuda.synchronize()
    ranges, kernels = _profiled_stages(prof)
    rows = _by_name(kernels)  # as `kernel_rows`, with the kernels kept for the stages
    busy_ms = sum(r["ms"] for r in rows)
    out = {"workload": name, "timings": timings, "kernel_ms_total": busy_ms,
           "kernel_share_of_wall": busy_ms / 1e3 / timings["wall_s"], "top": rows[:top],
           "stages": stage_breakdown(ranges, kernels, top=top)}
    log(out)
    return out


def _status(value: float, limit: float) -> str:
    return "**met**" if value <= limit else f"**missed** by {100 * (value / limit - 1):.1f}%"


def _row(workload: str, run_name: str, r: dict, published: str = "", target: str = "", status: str = "") -> str:
    if r.get("sm_mhz_median"):
        run_name += f" ({r['sm_mhz_median']:.0f} MHz)"
    return (f"| {workload} | {run_name} | {r['prefill_s']:.2f} | {r['denoise_s']:.2f} ({r['denoise_ms_per_step']:.1f}) | "
            f"{r['decode_s']:.2f} | {r['total_s']:.2f} | {published} | {target} | {status} |")


def header_line(header: dict) -> str:
    """The run's facts as one line: date, GPU, driver, commit, versions, command."""
    versions = ", ".join(f"{k} {header[k]}" for k in ("torch", "cudnn") + VERSIONED_PACKAGES if header.get(k) is not None)
    return (f"{header.get('date')}, {header.get('gpu')} (driver {header.get('driver')}), commit {header.get('commit')}; "
            f"{versions}. Command: `{header.get('command')}`")


def table_markdown(results: dict) -> str:
    """One bench run (`bench_engine.py --e2e`, `--warm-up-effect`, `--warm-up-first`, or `--table SECTION`) as
    docs/perf-log/2026-12-02.md's end-to-end rows: seconds (denoise ms per step), published numbers, issue 17's target
    and whether it is met. A target is checked on the warm run (the cold one where no warm run was made);
    a first request after warm-up against the same request warm."""
    lines = [
        header_line(results.get("header", {})),
        "",
        "| workload | run (median SM clock) | prefill | denoise (ms/step) | decode | total | best published | target | status |",
        "|---|---|---|---|---|---|---|---|---|"]
    for row in results.get("e2e", []):
        name = row["workload"]
        checked = "warm" if "warm" in row else "cold"
        policy = row[checked].get("fp8_policy")  # None: bf16 (and rows recorded before the field existed)
        stage, limit = (FP8_TARGETS if policy else TARGETS).get(name, (None, None))
        kernel = row[checked].get("fp8_attention")  # absent from rows recorded before the field existed
        label = f"{name}, FP8 {policy}" + (f" ({kernel})" if kernel else "") if policy else name
        for run_name in ("cold", "warm"):
            r = row.get(run_name)
            if r is None:
                continue
            target = status = ""
            if stage is not None and run_name == checked:
                target = ("FP8 " if policy else "") + f"{stage[:-2]} <= {limit:g} s"
                status = _status(r[stage], limit)
            elif run_name == "warm" and "cold" in row:
                ratio = row["cold"]["total_s"] / r["total_s"]
                status = f"cold {ratio:.2f}x warm (no warm-up)"
            lines.append(_row(label, run_name, r, row["published"] if run_name == "cold" else "", target, status))
    firsts = [dict(f, label=f"{f['workload']}, first request after warming its mode") for f in results.get("warm_up_first", [])]
    if results.get("warm_up"):
        firsts.append(dict(results["warm_up"], label="edge-t2i-640x480, first request after warming T2I"))
    for first in firsts:
        ratio = first["first after warm-up"]["total_s"] / first["warm"]["total_s"]
        status = f"{ratio:.2f}x: " + ("**met**" if ratio <= FIRST_REQUEST_LIMIT else "**missed**")
        lines.append(_row(first["label"], f"first (warm-up {first['warm_up_s']:.1f} s)", first["first after warm-up"]))
        lines.append(_row(first["label"], "warm", first["warm"], "", f"first <= {FIRST_REQUEST_LIMIT:g}x warm", status))
    return "\n".join(lines)


def _with_options(model, **changes):
    from engine.config import build_config
    from engine.pipeline.fast_path import FastPathOptions

    base = FastPathOptions.from_config(build_config(), model.device)
    model.fast_path = FastPathOptions(**{**base.__dict__, **changes})


def ablate(model, name: str, log=print) -> dict:
    """The new pieces one at a time on one workload (warm, each after its own warm-up request):
    whole step off, uint8 decode off, FP8 on; a new prompt length against a kept graph, with the lengths on
    the device (the kept graph replays) and without (it recaptures)."""
    family, request, _ = WORKLOADS[name]
    prompt = long_prompt(model)
    request = dict(request, prompt=prompt, seed=1)
    out = {"workload": name}
    variants = {"fast path (all on)": {}, "whole step off": {"whole_step": False},
                "uint8 decode off": {"uint8_frames": False}}
    try:
        import torchao  # noqa: F401

        variants["FP8 on"] = {"fp8": True}
    except ImportError:
        out["FP8 on"] = "torchao not installed"
    for label, changes in variants.items():
        _with_options(model, **changes)
        try:
            timed_generate(model, request)  # its own warm-up
            out[label] = timed_generate(model, request)
        finally:
            model.fast_path = None
        log({label: out[label]})
    # Same shape, a prompt of another length: with the lengths on the device (the default) the kept step
    # replays for it; without, it recaptures.
    timed_generate(model, request)
    out["kept graph, same prompt"] = timed_generate(model, request)
    out["new prompt length"] = timed_generate(model, dict(request, prompt=long_prompt(model, extra=" At dawn.")))
    _with_options(model, lengths_on_device=False)
    try:
        timed_generate(model, request)
        out["new prompt length, lengths on the device off (recapture)"] = timed_generate(
            model, dict(request, prompt=long_prompt(model, extra=" At dusk, the tide out.")))
    finally:
        model.fast_path = None
    log(out)
    return out


def warm_up_effect(model, name: str, log=print, **size) -> dict:
    """`engine.serving.warmup.warm_up` over the mode's sizes, then the first request at a size not used before
    (`size` overrides the workload's) against the same request warm."""
    from engine.serving.warmup import warm_up

    family, request, _ = WORKLOADS[name]
    request = dict(request, prompt=long_prompt(model), seed=1, **size)
    began = time.perf_counter()
    sizes = warm_up(model, modes=(request["mode"],))
    out = {"warm_up_s": time.perf_counter() - began, "sizes": sizes}
    kept = model.runtime.kept_steps
    out["kept_steps"] = len(kept)
    out["kept_steps_gib"] = sum(step.bytes for step in kept.values()) / 2**30
    out["first after warm-up"] = timed_generate(model, request)
    out["warm"] = timed_generate(model, request)
    log(out)
    return out


def decode_variants(vae, log=print) -> list[dict]:
    """Decode stage, latents to uint8 frames in host memory: the exact path's route (VAE, float32 frames on
    the host, the output stage's rounding) against `engine.pipeline.decode.decode_uint8`; channels-last weights."""
    import numpy as np
    from diffusers.video_processor import VideoProcessor

    from engine.pipeline.decode import decode_uint8
    from engine.pipeline.outputs import frames_to_uint8

    for param in vae.parameters():
        if param.dim() == 5:
            param.data = param.data.contiguous(memory_format=torch.channels_last_3d)
    rows = []
    for label, frames, height, width in (("832x480 121f", 121, 480, 832), ("1280x720 189f", 189, 720, 1280)):
        z = torch.randn(1, 48, (frames - 1) // 4 + 1, height // 16, width // 16, device="cuda", dtype=vae.dtype)
        z = z.contiguous(memory_format=torch.channels_last_3d)

        def exact():
            with torch.no_grad():
                decoded = vae.decode(z).sample.float()
            video = VideoProcessor(vae_scale_factor=16).postprocess_video(decoded, output_type="np")[0].astype(np.float32)
            return frames_to_uint8(video)

        row = {"decode": label}
        for name, fn in (("float32 host frames (before)", exact), ("uint8 on the GPU (now)", lambda: decode_uint8(vae, z))):
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            began = time.perf_counter()
            out = fn()
            row[name] = time.perf_counter() - began
            row[name + " peak GiB"] = torch.cuda.max_memory_allocated() / 2**30
            row.setdefault("frames", out)
        row["equal"] = bool(np.array_equal(row.pop("frames"), decode_uint8(vae, z)))
        log(row)
        rows.append(row)
        del z
        gc.collect()
        torch.cuda.empty_cache()
    return rows


def fp8_step(model, width: int, height: int, frames: int, log=print, policies: tuple[str, ...] = ("",),
             prefix_lens: tuple[int, int] = (1615, 2866), attention_backends: tuple[str, ...] = ("",)) -> dict:
    """One denoising step (both CFG branches with `prefix_lens` text tokens) bf16 against FP8 under each of
    `policies` ("": the family's FP8 mode), warm, CUDA events. A policy naming the attention runs once per entry
    of `attention_backends` in order (`FastPathOptions.fp8_attention`, as COSMOS3_FP8_ATTENTION sets it, for that
    run; "": the engine's choice; "fa3/pack=0", "fa3/pack=1" or "fa3/pack=auto" also sets `fa3_pack_gqa`, as
    COSMOS3_FA3_PACK_GQA), so listing them twice alternates them."""
    from bench.models import step_inputs
    from engine.pipeline import fp8
    from engine.pipeline.fast_path import FastPathOptions
    from engine.pipeline.tower import make_gen_tower
    from cosmos3_kernels.timing import time_ms

    inputs = step_inputs(model, width=width, height=height, frames=frames, prefix_lens=tuple(prefix_lens))
    out = {"shape": f"{width}x{height} {frames}f", "prefix_lens": list(prefix_lens)}
    runs = [("bf16", FastPathOptions(enabled=True))]
    for policy in policies:
        names_attention = fp8.policy_for(model.info.family, policy).attention
        for number, backend in enumerate(attention_backends if names_attention else ("",)):
            label = f"FP8 {policy or 'default'}" + (f" [{backend or 'engine'}]" if names_attention else "")
            label += f" #{number + 1}" if names_attention and attention_backends.count(backend) > 1 else ""
            name, _, pack = backend.partition("/pack=")
            runs.append((label, FastPathOptions(enabled=True, fp8=True, fp8_policy=policy, fp8_attention=name,
                                                fa3_pack_gqa=pack)))
    with torch.no_grad():
        for label, options in runs:
            model.fast_path = options
            try:
                tower = make_gen_tower(model, inputs.cache, inputs.branches, layout=inputs.layout)
                # One warm-up call (dispatch, quantisation, cuDNN's graph builds), one timed step.
                out[label + " ms/step"] = time_ms(lambda: inputs.engine_step(tower), warmup=1, iters=1).median_ms
                del tower
            except Exception as error:  # noqa: BLE001 - one policy's failure must not lose the others
                out[label + " failed"] = f"{type(error).__name__}: {error}"[:300]
            finally:
                model.fast_path, model.runtime.fp8_weights = None, None
            log({label: out.get(label + " ms/step", out.get(label + " failed"))})
    log(out)
    return out


def profile_step(model, width: int, height: int, frames: int, log=print, top: int = 25,
                 prefix_lens: tuple[int, int] = (1615, 2866)) -> dict:
    """Where one warm denoising step's GPU time goes (both CFG branches with `prefix_lens` text tokens, the
    default fast path): torch.profiler's kernel table, the `top` kernels by total device time, grouped by
    kernel name."""
    from bench.models import step_inputs
    from engine.config import build_config
    from engine.pipeline.fast_path import FastPathOptions
    from engine.pipeline.tower import make_gen_tower

    inputs = step_inputs(model, width=width, height=height, frames=frames, prefix_lens=tuple(prefix_lens))
    model.fast_path = FastPathOptions.from_config(build_config(), model.device)
    try:
        with torch.no_grad():
            tower = make_gen_tower(model, inputs.cache, inputs.branches, layout=inputs.layout)
            inputs.engine_step(tower)  # dispatch measures, kernels compile
            torch.cuda.synchronize()
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
                inputs.engine_step(tower)
                torch.cuda.synchronize()
    finally:
        model.fast_path = None
    rows = kernel_rows(prof)
    out = {"shape": f"{width}x{height} {frames}f", "prefix_lens": list(prefix_lens),
           "total_ms": sum(r["ms"] for r in rows), "top": rows[:top]}
    log(out)
    return out
