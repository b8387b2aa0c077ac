"""What a request at a new prompt length costs on top of a warm one, and where that time goes.

Every user prompt has its own token count, so whatever the engine keys on the text length (the step's
CUDA graphs, the dispatcher's attention buckets, the libraries' plans for the text tower's attention)
is paid again on a user's request. This runs the full-size random Edge (bench/models.py) through
`engine.pipeline.run.generate`, T2I at 640x640 with its defaults, at a sequence of prompt lengths:
each new length once, then again (the warm figure for that length). Between them a short T2V request
shows whether a video run in between makes the next image request pay again. Every run records its
wall time (GPU synchronised), the engine's stage times, the dispatch decisions it added and how many
kept whole-step graphs it added (the JSON files before 2026-12-01 13:30 UTC have `whole_step_reused`
instead, which read true for a video run too); a second series of new lengths runs under cProfile, whose top
functions say where a slow run spends its host time.

    python3 bench/bench_prompt_lengths.py [--json PATH] [--family edge]
"""
from __future__ import annotations

import argparse
import cProfile
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import bench  # noqa: E402, F401 - the engine's start-up settings (bench/__init__.py)

SENTENCE = ("A weathered lighthouse keeper climbs the spiral stairs at dusk, lantern in hand, "
            "the sea below rough and grey. ")

# (label, mode, prompt sentences, profiled). Sentences are ~25 tokens each; the warm-up's prompts are 1
# and 25 of its own sentence, so 1 here is a length the app warms and the rest are not.
PLAN = [
    ("first request of the process", "t2i", 1, False),
    ("same prompt again (warm)", "t2i", 1, False),
    ("new length, near the first", "t2i", 8, False),
    ("that length again", "t2i", 8, False),
    ("new length", "t2i", 9, False),
    ("new length, longer", "t2i", 40, False),
    ("that length again", "t2i", 40, False),
    ("new length, profiled", "t2i", 12, True),
    ("new length, longer, profiled", "t2i", 45, True),
    ("a short video in between", "t2v", 1, False),
    ("a known length after the video", "t2i", 8, False),
    ("new length after the video, profiled", "t2i", 14, True),
    ("that length again", "t2i", 14, False),
]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", default=None)
    ap.add_argument("--family", default="edge", choices=("edge", "nano"))
    ap.add_argument("--video-steps", type=int, default=4)
    ap.add_argument("--cpu-check", action="store_true", help="the tiny checkpoint on the CPU: the script's own code "
                    "path only, nothing timed means anything")
    args = ap.parse_args()

    import torch

    from bench.e2e import profile_text
    from bench.models import as_loaded_model, build_transformer, build_vae
    from engine.model.defaults import sampling_defaults
    from engine.model.tiny import build_tokenizer
    from engine.pipeline.prompts import build_prompt_texts, tokenize
    from engine.pipeline.request import validate_request
    from engine.pipeline.run import generate

    began = time.perf_counter()
    if args.cpu_check:
        import tempfile

        from engine.model.loader import load_in_process
        from engine.model.tiny import write_family

        model = load_in_process(write_family(Path(tempfile.mkdtemp()))[args.family], device="cpu")
    else:
        model = as_loaded_model(build_transformer(args.family), args.family, vae=build_vae(), tokenizer=build_tokenizer())
    on_gpu = model.device.type == "cuda"
    sync = torch.cuda.synchronize if on_gpu else (lambda: None)
    out = {"family": args.family, "load_s": round(time.perf_counter() - began, 2), "torch": torch.__version__,
           "gpu": torch.cuda.get_device_name() if on_gpu else "cpu", "runs": []}
    image_sizes = [tuple(size) for size in sampling_defaults(model.info, "t2i")["resolutions"]]
    image_size = (640, 640) if (640, 640) in image_sizes else image_sizes[0]  # the tiny checkpoints have tiny sizes
    video_size = tuple(sampling_defaults(model.info, "t2v")["resolutions"][0])

    def request_for(mode: str, sentences: int) -> dict:
        if mode == "t2i":
            return dict(mode="t2i", prompt=SENTENCE * sentences, width=image_size[0], height=image_size[1], seed=3)
        return dict(mode="t2v", prompt=SENTENCE * sentences, width=video_size[0], height=video_size[1],
                    steps=args.video_steps, seed=3)

    for label, mode, sentences, profiled in PLAN:
        request = validate_request(model.info, mode, request_for(mode, sentences))
        texts = build_prompt_texts(model.info, request)
        lengths = [len(tokenize(model.tokenizer, t, is_image=mode == "t2i", use_system_prompt=texts.use_system_prompt))
                   for t in (texts.prompt_text, texts.negative_prompt_text)]
        dispatch = model.runtime.dispatchers.get("auto")
        decisions_before = set(dispatch.decisions()) if dispatch is not None else set()
        steps_before = list(model.runtime.kept_steps)
        profiler = cProfile.Profile() if profiled else None
        sync()
        t0 = time.perf_counter()
        if profiler is not None:
            profiler.enable()
        result = generate(model, request)
        sync()
        if profiler is not None:
            profiler.disable()
        wall = time.perf_counter() - t0
        dispatch = model.runtime.dispatchers.get("auto")
        added = [k for k in dispatch.decisions() if k not in decisions_before] if dispatch is not None else []
        steps_after = list(model.runtime.kept_steps)
        row = {
            "label": label, "mode": mode, "sentences": sentences, "token_lens": lengths, "wall_s": round(wall, 3),
            "stage_s": result.timings,
            "new_dispatch_decisions": [str(k[:1] + k[3:]) for k in added],
            "kept_steps_added": len(set(steps_after) - set(steps_before)),  # 0: no capture kept for it
            "profiled": profiled,
        }
        print(json.dumps(row), flush=True)
        if profiler is not None:
            row["profile"] = profile_text(profiler)
            print(row["profile"][:6000], flush=True)
        out["runs"].append(row)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
