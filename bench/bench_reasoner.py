"""Reasoner speed and the numbers behind its memory policy, at real dimensions with random weights.

    python3 bench/bench_reasoner.py --out $OUT        # on a GPU; writes reasoner_bench.json
    python3 bench/bench_reasoner.py --families nano --out $OUT --budget-s 120    # Nano alone, ~80 s


For the Edge (`cosmos3_edge`) and Nano (`cosmos3_omni`, Qwen3-VL-8B sized) reasoners in bf16 on cuda:0:
time to first token and decode tokens/s through Transformers' `generate` (what `engine.reason` runs),
for an enhance-sized text prompt and for the same prompt with one 832x480 image; the reasoner's bytes;
and what each memory policy costs per job: host->device and device->host copies of the whole reasoner
(`offloaded`), and reading it back from a safetensors file (`on_demand`, Edge only: the page cache
makes it a lower bound). Random weights never stop early: `min_new_tokens` fixes the length.
The JSON is rewritten after every measurement, so a run stopped by its time limit keeps what it
measured; `--budget-s` skips what is left once that many seconds have passed (marked in the JSON).
"""
from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

import torch

# Tokens forced per measurement. The Transformers generate loop is host-bound (~60 ms a token for Edge,
# more for Nano's 36 layers), so Nano decodes fewer to keep its run near 80 s of GPU time; tokens/s
# is a per-token rate either way.
DECODE_TOKENS = {"edge": 256, "nano": 128}
PROMPT_TOKENS = 1200  # an enhance request: the schema prompt plus a short idea (measured ~1.1k on tiny)
IMAGE_GRID = (30, 52)  # 480x832 in 16-pixel patches


def configs() -> dict:
    from transformers import Cosmos3EdgeConfig, Cosmos3OmniConfig

    edge = Cosmos3EdgeConfig()  # the library's defaults are the released Edge dimensions
    nano = Cosmos3OmniConfig(
        text_config=dict(vocab_size=151936, hidden_size=4096, intermediate_size=12288, num_hidden_layers=36,
                         num_attention_heads=32, num_key_value_heads=8, head_dim=128, rms_norm_eps=1e-6,
                         max_position_embeddings=262144,
                         rope_parameters={"rope_type": "default", "rope_theta": 5e6, "mrope_section": [24, 20, 20],
                                          "mrope_interleaved": True}),
        vision_config=dict(depth=27, hidden_size=1152, intermediate_size=4304, num_heads=16, patch_size=16,
                           temporal_patch_size=2, spatial_merge_size=2, out_hidden_size=4096,
                           num_position_embeddings=2304, deepstack_visual_indexes=[8, 16, 24]))
    return {"edge": edge, "nano": nano}


def build(config, device):
    """The model built on the GPU with Transformers' own random initialisation (buffers included)."""
    from transformers import AutoModelForImageTextToText

    with torch.device(device):
        model = AutoModelForImageTextToText.from_config(config, dtype=torch.bfloat16)
    return model.eval()


def shrink(config) -> None:
    """A CPU dry run of this script (`--dry-run`): same code, two layers, a short prompt and a small image."""
    global PROMPT_TOKENS, IMAGE_GRID
    PROMPT_TOKENS, IMAGE_GRID = 48, (4, 6)
    text, vision = config.text_config, config.vision_config
    text.num_hidden_layers = 2
    for attr in ("num_hidden_layers", "depth"):
        if hasattr(vision, attr):
            setattr(vision, attr, 2)
    if hasattr(vision, "deepstack_visual_indexes"):
        vision.deepstack_visual_indexes = [0, 1]


def inputs(name: str, config, device, with_image: bool) -> dict:
    g = torch.Generator().manual_seed(1)
    text_ids = torch.randint(100, 20000, (PROMPT_TOKENS,), generator=g)
    out = {}
    if with_image:
        h, w = IMAGE_GRID
        count = h * w // 4
        ids = torch.cat([torch.tensor([config.vision_start_token_id]),
                         torch.full((count,), config.image_token_id), torch.tensor([config.vision_end_token_id]),
                         text_ids])
        width = 3 * 16 * 16 * (1 if name == "edge" else 2)
        out.update(pixel_values=torch.randn(h * w, width, generator=g).to(device, torch.bfloat16),
                   image_grid_thw=torch.tensor([[1, h, w]], device=device))
    else:
        ids = text_ids
    ids = ids[None].to(device)
    types = (ids == config.image_token_id).long()
    out.update(input_ids=ids, attention_mask=torch.ones_like(ids), mm_token_type_ids=types)
    return out


class FirstToken:
    def __init__(self):
        self.calls = 0
        self.first = None

    def put(self, value):
        self.calls += 1
        if self.calls == 2:
            _sync()
            self.first = time.perf_counter()

    def end(self):
        pass


def _sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def timed_generate(model, batch, tokens: int) -> dict:
    stream = FirstToken()
    _sync()
    start = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(**batch, max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False, streamer=stream)
    _sync()
    end = time.perf_counter()
    new = out.shape[1] - batch["input_ids"].shape[1]
    return {"prompt_tokens": int(batch["input_ids"].shape[1]), "new_tokens": int(new),
            "ttft_s": round(stream.first - start, 4), "decode_tokens_per_s": round((new - 1) / (end - stream.first), 1),
            "total_s": round(end - start, 3)}


def copies(model, device) -> dict:
    nbytes = sum(p.numel() * p.element_size() for p in model.parameters())
    _sync()
    t = time.perf_counter()
    model.to("cpu")
    _sync()
    d2h = time.perf_counter() - t
    t = time.perf_counter()
    model.to(device)
    _sync()
    h2d = time.perf_counter() - t
    return {"bytes": nbytes, "to_cpu_s": round(d2h, 3), "to_gpu_s": round(h2d, 3)}


class Report:
    """The JSON, written again after each measurement; `due(what)` says whether the budget allows it."""

    def __init__(self, out: str, budget_s: float | None, head: dict):
        self.path = Path(out) / "reasoner_bench.json"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.budget_s, self.started = budget_s, time.perf_counter()
        self.data = dict(head, families={})
        self.save()

    def elapsed(self) -> float:
        return time.perf_counter() - self.started

    def due(self, row: dict, what: str) -> bool:
        if self.budget_s is not None and self.elapsed() > self.budget_s:
            row[what] = f"skipped: the {self.budget_s:.0f} s budget was spent ({self.elapsed():.0f} s)"
            self.save()
            return False
        return True

    def save(self) -> None:
        self.data["elapsed_s"] = round(self.elapsed(), 1)
        self.path.write_text(json.dumps(self.data, indent=2))


def measure(name: str, report: Report, device, dry_run: bool) -> None:
    row = report.data["families"].setdefault(name, {})
    tokens = 4 if dry_run else DECODE_TOKENS[name]
    config = configs()[name]
    if dry_run:
        shrink(config)
    started = time.perf_counter()
    model = build(config, device)
    _sync()
    row.update(build_s=round(time.perf_counter() - started, 1), decode_tokens=tokens)
    report.save()
    # Warm-up of both paths (text, and the vision tower's first call), so neither number is a cold one.
    timed_generate(model, inputs(name, config, device, False), 4)
    timed_generate(model, inputs(name, config, device, True), 2)
    for key, with_image in (("text", False), ("text_image", True)):
        if report.due(row, key):
            row[key] = timed_generate(model, inputs(name, config, device, with_image), tokens)
            print(name, key, json.dumps(row[key]), f"at {report.elapsed():.0f} s", flush=True)
            report.save()
    if not dry_run:
        row["peak_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
    if report.due(row, "policy_costs"):
        row["policy_costs"] = copies(model, device)
        if name == "edge":
            from safetensors.torch import load_file, save_file

            with tempfile.TemporaryDirectory() as tmp:
                path = Path(tmp) / "reasoner.safetensors"
                save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(path))
                t = time.perf_counter()
                state = load_file(str(path), device=str(device))
                _sync()
                row["policy_costs"]["from_disk_s"] = round(time.perf_counter() - t, 3)
                del state
        report.save()
    print(name, json.dumps(row), flush=True)
    del model
    if not dry_run:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=os.environ.get("OUT", "."))
    parser.add_argument("--families", default="edge,nano")
    parser.add_argument("--budget-s", type=float, default=None,
                        help="skip the measurements still to come once this many seconds have passed")
    parser.add_argument("--dry-run", action="store_true", help="CPU, two layers: checks the script only")
    args = parser.parse_args()
    device = torch.device("cpu" if args.dry_run else "cuda:0")
    import transformers

    report = Report(args.out, args.budget_s, {
        "torch": torch.__version__, "transformers": transformers.__version__,
        "gpu": "dry run" if args.dry_run else torch.cuda.get_device_name(0), "decode_tokens": DECODE_TOKENS})
    for name in args.families.split(","):
        if report.due(report.data["families"].setdefault(name, {}), "build"):
            measure(name, report, device, args.dry_run)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
