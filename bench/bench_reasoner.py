"""Reasoner speed and the numbers behind its memory policy, at real dimensions with random weights.

    python3 bench/bench_reasoner.py --out $OUT        # on a GPU; writes reasoner_bench.json
    python3 bench/bench_reasoner.py --families nano --out $OUT --budget-s 120    # Nano alone, ~80 s
    python3 bench/bench_reasoner.py --constrained-only --out $OUT   # free vs schema-constrained decode only
    python3 bench/bench_reasoner.py --tiny --out $OUT    # the same comparison on the CPU, tiny checkpoints
    python3 bench/bench_reasoner.py --candidates llguidance,xgrammar,outlines_core --out $OUT   # the libraries

Constrained decoding (issue 46): the same prompt decoded free and under the video caption schema
(`engine.reasoner.schema`, through `engine.reasoner.constrained`: llguidance as a logits processor):
tokens/s and first-token delay of each, the processor's own time per token, and the one-off cost of
llguidance's view of the tokenizer. The GPU runs have no tokenizer of the real checkpoints (random
weights, no hub), so one is trained here: a byte-level BPE of the model's vocabulary size on the
installed Python packages' source (cached under --out); `--tiny` uses the tiny checkpoints' own.


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
import importlib.metadata
import importlib.util
import json
import os
import sys
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
    """A streamer that times the first new token and each later one, and feeds each to `on_token` (a schema
    constraint, as the engine's streamer does)."""

    def __init__(self, on_token=None):
        self.calls = 0
        self.first = None
        self.at: list[float] = []
        self.on_token = on_token

    def put(self, value):
        self.calls += 1
        if self.calls == 1:
            return  # the prompt
        if self.on_token is not None:
            self.on_token(value.reshape(-1).tolist())
        if self.calls == 2:
            _sync()
            self.first = time.perf_counter()
        self.at.append(time.perf_counter())

    def end(self):
        pass


def _sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def timed_generate(model, batch, tokens: int, processors: list | None = None, on_token=None) -> dict:
    """Greedy decode of `tokens` new tokens (forced with min_new_tokens); with `processors` (a schema
    constraint, which must be free to end the answer) at most `tokens`, each token fed to `on_token`."""
    stream = FirstToken(on_token)
    forced = {"min_new_tokens": tokens} if not processors else {"logits_processor": processors}
    _sync()
    start = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(**batch, max_new_tokens=tokens, do_sample=False, streamer=stream, **forced)
    _sync()
    end = time.perf_counter()
    new = out.shape[1] - batch["input_ids"].shape[1]
    steps = sorted(b - a for a, b in zip(stream.at, stream.at[1:]))
    return {"prompt_tokens": int(batch["input_ids"].shape[1]), "new_tokens": int(new),
            "ttft_s": round(stream.first - start, 4), "decode_tokens_per_s": round((new - 1) / (end - stream.first), 1),
            "step_ms_median": round(1e3 * steps[len(steps) // 2], 2) if steps else None,
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


class TimedConstraint:
    """The engine's schema constraint, timed: the host's seconds in it, per call (waits included: reading
    the last token back, or a mask not yet ready; no synchronize added, which would serialise the step)."""

    def __init__(self, constraint):
        self.constraint, self.seconds = constraint, []
        self.feed = constraint.feed

    def __call__(self, input_ids, scores):
        start = time.perf_counter()
        out = self.constraint(input_ids, scores)
        self.seconds.append(time.perf_counter() - start)
        return out


def bench_tokenizer(vocab_size: int, out: Path):
    """A byte-level BPE with `vocab_size` tokens, trained on the installed packages' Python source (no hub
    here); cached in `out`. It stands in for the checkpoints' tokenizer in llguidance's mask cost."""
    import sysconfig

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    folder = out / f"bench_tokenizer_{vocab_size}"
    if (folder / "tokenizer.json").is_file():
        return AutoTokenizer.from_pretrained(folder)

    def texts(limit=150_000_000):
        seen = 0
        for path in sorted(Path(sysconfig.get_paths()["purelib"]).rglob("*.py")):
            try:
                text = path.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError):
                continue
            seen += len(text)
            yield text
            if seen > limit:
                return

    special = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator(texts(), trainer=trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=special, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    tokenizer.save_pretrained(folder)
    return tokenizer


def _per_token(seconds: list[float]) -> dict:
    ordered = sorted(seconds)
    return {"median": round(1e3 * ordered[len(ordered) // 2], 3),
            "p90": round(1e3 * ordered[int(0.9 * (len(ordered) - 1))], 3), "max": round(1e3 * ordered[-1], 3)}


def constrained_vs_free(model, batch, tokenizer, eos_id: int, tokens: int, budget: int = 4096, repeats: int = 3) -> dict:
    """The same greedy decode under the video caption schema sized for `budget` tokens (at most `tokens`), as
    the engine runs it (the streamer feeds each token to the constraint, which computes the next mask while
    the next forward runs) and in line (the constraint reads the last token back and masks after it, as with
    Transformers' `generate` alone); then free with as many tokens forced as the constrained answer took.
    Alternated `repeats` times, the fastest of each kept (a shared machine's noise only slows a run down)."""
    from engine.reasoner.constrained import SchemaConstraint, grammar_tokenizer
    from engine.reasoner.schema import caption_schema

    started = time.perf_counter()
    grammar = grammar_tokenizer(tokenizer, [eos_id])
    row = {"vocab": len(tokenizer), "grammar_tokenizer_s": round(time.perf_counter() - started, 3)}
    schema = caption_schema("video", budget).schema
    warm = SchemaConstraint(grammar, schema)
    timed_generate(model, batch, 4, [warm], on_token=warm.feed)  # warm-up of the masked path
    best: dict = {}
    for _ in range(repeats):
        runs = {}
        for key in ("constrained", "constrained_in_line"):
            started = time.perf_counter()
            timed = TimedConstraint(SchemaConstraint(grammar, schema))
            compile_s = time.perf_counter() - started
            runs[key] = timed_generate(model, batch, tokens, [timed],
                                       on_token=timed.feed if key == "constrained" else None)
            runs[key]["first_token_with_compile_s"] = round(runs[key]["ttft_s"] + compile_s, 4)
            runs[key]["compile_s"] = round(compile_s, 4)
            runs[key]["constraint_ms_per_token"] = _per_token(timed.seconds)
        runs["free"] = timed_generate(model, batch, runs["constrained"]["new_tokens"])
        for key, run in runs.items():
            if key not in best or run["decode_tokens_per_s"] > best[key]["decode_tokens_per_s"]:
                best[key] = run
    row.update(best)
    free = row["free"]["decode_tokens_per_s"]
    for key in ("constrained", "constrained_in_line"):
        row[f"{key}_over_free_tokens_per_s"] = round(row[key]["decode_tokens_per_s"] / free, 3) if free else None
    return row


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


def measure_constrained(name: str, row: dict, report: Report, model, config, device, tokens: int,
                        dry_run: bool) -> None:
    if not report.due(row, "constrained"):
        return
    vocab = 2000 if dry_run else config.text_config.vocab_size  # a dry run checks the code, not the mask cost
    tokenizer = bench_tokenizer(vocab, report.path.parent)
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    row["constrained"] = constrained_vs_free(model, inputs(name, config, device, False), tokenizer, eos, tokens)
    print(name, "constrained", json.dumps(row["constrained"]), f"at {report.elapsed():.0f} s", flush=True)
    report.save()


def measure(name: str, report: Report, device, dry_run: bool, constrained_only: bool = False) -> None:
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
    measure_constrained(name, row, report, model, config, device, tokens, dry_run)
    if constrained_only:
        return
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


# A caption the video schema admits, for the candidates' token path (what a real model would write).
CANDIDATE_ANSWER = {
    "subjects": [{"description": "A red kite with a long ribbon tail climbs over a windy beach",
                  "appearance_details": "diamond-shaped, silk", "location": "center of frame", "action": "climbs"},
                 {"description": "A child in a yellow raincoat holding the kite string", "location": "lower left"}],
    "lighting": {"conditions": "overcast noon light", "direction": "from above"},
    "cinematography": {"camera_motion": "slow tilt up", "framing": "wide shot"},
    "background_setting": "A wide sandy beach under grey clouds with waves breaking in the distance",
    "actions": [{"time": "0:00-0:03", "description": "The kite rises from the sand."},
                {"time": "0:03-0:05", "description": "It loops twice."}],
    "temporal_caption": "A red kite lifts off the beach and climbs, looping twice as the child runs along the water.",
}


def _raw_vocab(tokenizer, eos_id: int) -> dict:
    """token bytes -> ids of a byte-level BPE (outlines-core's Vocabulary takes raw bytes)."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    to_char = {b: chr(b) for b in printable}
    to_char.update({b: chr(256 + n) for n, b in enumerate(b for b in range(256) if b not in to_char)})
    to_byte = {c: b for b, c in to_char.items()}
    vocab: dict = {}
    for text, token in tokenizer.get_vocab().items():
        if token != eos_id and not text.startswith("<|"):
            vocab.setdefault(bytes(to_byte[c] for c in text), []).append(token)
    return vocab


def _candidate(name: str, tokenizer, eos_id: int, schema: dict):
    """(setup seconds split, step(token) -> None) of one library: mask the next token, check the path's
    token is allowed, advance."""
    import numpy as np

    vocab = len(tokenizer)
    words = np.zeros((vocab + 31) // 32, np.int32)
    started = time.perf_counter()
    if name == "llguidance":
        import llguidance.hf

        view = llguidance.hf.from_tokenizer(tokenizer, n_vocab=vocab, eos_token=eos_id)
        ready = time.perf_counter()
        matcher = llguidance.LLMatcher(view, llguidance.LLMatcher.grammar_from_json_schema(
            schema, overrides={"whitespace_flexible": False, "item_separator": ",", "key_separator": ":"}))
        mask, advance = (lambda: matcher.unsafe_compute_mask_ptr(words.ctypes.data, words.nbytes)), matcher.consume_token
    elif name == "xgrammar":
        import xgrammar

        info = xgrammar.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab, stop_token_ids=[eos_id])
        ready = time.perf_counter()
        matcher = xgrammar.GrammarMatcher(xgrammar.GrammarCompiler(info).compile_json_schema(
            json.dumps(schema), any_whitespace=False, separators=(",", ":")))
        bitmask = xgrammar.allocate_token_bitmask(1, vocab)
        words = bitmask[0].numpy()
        mask, advance = (lambda: matcher.fill_next_token_bitmask(bitmask)), matcher.accept_token
    else:
        import outlines_core

        table = outlines_core.Vocabulary(eos_id, _raw_vocab(tokenizer, eos_id))
        ready = time.perf_counter()
        guide = outlines_core.Guide(outlines_core.Index(
            outlines_core.json_schema.build_regex_from_schema(json.dumps(schema), whitespace_pattern=""), table))
        mask, advance = (lambda: guide.write_mask_into(words.ctypes.data, words.size, 4)), guide.advance
    setup = {"tokenizer_s": round(ready - started, 3), "compile_s": round(time.perf_counter() - ready, 3)}

    def step(token: int) -> None:
        mask()
        assert (int(words[token // 32]) >> (token % 32)) & 1, f"{name} refused token {token} of a valid caption"
        if token != eos_id:
            advance(token)

    return setup, step


def measure_candidates(report: Report, names: list[str], vocab_size: int, budget: int = 4096) -> None:
    """Each candidate library on the CPU: its setup (the first-token delay it adds) and its per-token cost
    (mask + advance) along the token path of a valid caption, under the engine's video caption schema."""
    import statistics

    from engine.reasoner.schema import caption_schema

    tokenizer = bench_tokenizer(vocab_size, report.path.parent)
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    path = tokenizer(json.dumps(CANDIDATE_ANSWER, separators=(",", ":")), add_special_tokens=False)["input_ids"]
    schema = caption_schema("video", budget).schema
    rows = report.data.setdefault("candidates", {"vocab": len(tokenizer), "path_tokens": len(path) + 1})
    for name in names:
        if not report.due(rows, name):
            continue
        try:
            setup, step = _candidate(name, tokenizer, eos, schema)
            seconds = []
            for token in path + [eos]:
                started = time.perf_counter()
                step(token)
                seconds.append(time.perf_counter() - started)
        except Exception as exc:  # a candidate that fails is a result: record what it said
            rows[name] = {"failed": f"{type(exc).__name__}: {str(exc)[:300]}"}
        else:
            rows[name] = {**setup, "per_token_us_median": round(1e6 * statistics.median(seconds), 1),
                          "per_token_us_max": round(1e6 * max(seconds), 1)}
        print("candidate", name, json.dumps(rows[name]), flush=True)
        report.save()


def measure_tiny(report: Report, families: list[str], tokens: int = 512) -> None:
    """Free vs constrained decode on the CPU, on the tiny checkpoints' reasoners with their own
    tokenizer, for the engine's real enhance chat (system prompt of the schema, an idea)."""
    from transformers import AutoModelForImageTextToText

    from engine.model.tiny import write_family
    from engine.reasoner.inputs import build_inputs, load_preprocessor, messages_for
    from engine.reasoner.schema import caption_schema
    from engine.reasoner.tasks import caption_system_prompt, enhance_text

    with tempfile.TemporaryDirectory() as tmp:
        family = write_family(Path(tmp))
        for name in families:
            row = report.data["families"].setdefault(name, {})
            root = family[name]
            model = AutoModelForImageTextToText.from_pretrained(root).eval()
            pre = load_preprocessor(root, "edge" if name == "edge" else "omni")
            system = caption_system_prompt("video", caption_schema("video", 1300))
            batch = build_inputs(pre, messages_for(system, enhance_text("a red kite over a windy beach", False)))
            timed_generate(model, batch, 4)
            eos = model.generation_config.eos_token_id
            row["constrained"] = constrained_vs_free(model, batch, pre.tokenizer, eos, tokens, budget=1300)
            print(name, "constrained", json.dumps(row["constrained"]), flush=True)
            report.save()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=os.environ.get("OUT", "."))
    parser.add_argument("--families", default="edge,nano")
    parser.add_argument("--budget-s", type=float, default=None,
                        help="skip the measurements still to come once this many seconds have passed")
    parser.add_argument("--dry-run", action="store_true", help="CPU, two layers: checks the script only")
    parser.add_argument("--constrained-only", action="store_true",
                        help="only free vs schema-constrained decode (no image, no memory-policy costs)")
    parser.add_argument("--tiny", action="store_true",
                        help="CPU: free vs constrained decode on the tiny checkpoints (needs diffusers to write them)")
    parser.add_argument("--candidates", default=None,
                        help="CPU: compare grammar libraries, e.g. llguidance,xgrammar,outlines_core (each importable)")
    parser.add_argument("--vocab", type=int, default=151936, help="--candidates: the trained tokenizer's size")
    args = parser.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # engine, run as `python3 bench/...`
    import bench  # noqa: F401 - the engine's start-up settings (bench/__init__.py)
    cpu = args.dry_run or args.tiny or bool(args.candidates)
    device = torch.device("cpu" if cpu else "cuda:0")
    import transformers

    llguidance = importlib.util.find_spec("llguidance")
    report = Report(args.out, args.budget_s, {
        "torch": torch.__version__, "transformers": transformers.__version__,
        "llguidance": importlib.metadata.version("llguidance") if llguidance else None,
        "gpu": ("tiny checkpoints, CPU" if args.tiny else "dry run") if cpu else torch.cuda.get_device_name(0),
        "decode_tokens": DECODE_TOKENS})
    if args.candidates:
        measure_candidates(report, args.candidates.split(","), args.vocab)
        return 0
    if args.tiny:
        measure_tiny(report, args.families.split(","))
        return 0
    for name in args.families.split(","):
        if report.due(report.data["families"].setdefault(name, {}), "build"):
            measure(name, report, device, args.dry_run, args.constrained_only)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
