"""Headless use: `python -m engine generate ...` and `python -m engine inspect SOURCE`.

    python -m engine generate --model ./ckpt/nano --mode t2v --prompt "A red kite over a beach" \
        --params '{"num_frames": 9, "seed": 7}' --out outputs/

Prints the result as JSON (seed, final prompt text, parameters, timings, files). Exit status 2 on a
refused request, 1 on a failed run.
"""
from __future__ import annotations

import argparse
import json
import sys

from .model.defaults import sampling_defaults
from .model.variants import REQUEST_MODES


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m engine", description="Cosmos3 Studio engine, headless.")
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("generate", help="run one request and save its files")
    run.add_argument("--model", required=True, help="checkpoint folder or Hugging Face repo id")
    run.add_argument("--mode", required=True, choices=REQUEST_MODES)
    run.add_argument("--prompt", default="", help="prose, or a JSON caption object")
    run.add_argument("--prompt-file", help="read the prompt (e.g. a JSON caption) from this file instead")
    run.add_argument("--params", default="{}", help="JSON object of further request keys (steps, seed, ...)")
    run.add_argument("--out", required=True, help="outputs folder; each request gets its own subfolder")
    run.add_argument("--device", default=None, help="cuda or cpu (default: cuda when available)")
    run.add_argument("--gpus", default="1", help="GPUs to run on: a count, or 'auto' for every visible GPU "
                                                 "(one process per GPU; engine/parallel)")
    inspect = commands.add_parser("inspect", help="print what a checkpoint is and its defaults per mode")
    inspect.add_argument("source")
    return parser


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    from .config import ConfigError, apply_process_environment, build_config
    from .model.loader import resolve_source
    from .parallel.load import load_model
    from .model.variants import CheckpointError, inspect_checkpoint

    if args.command == "inspect":
        try:
            info = inspect_checkpoint(resolve_source(args.source, config_only=True))
        except CheckpointError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        defaults = {m: sampling_defaults(info, m) for m in REQUEST_MODES if info.supports(m)}
        print(json.dumps({**info.summary(), "defaults": defaults}, indent=2))
        return 0

    try:
        config = build_config()
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    apply_process_environment(config)  # before torch's libraries are imported
    from .pipeline.run import generate

    try:
        params = json.loads(args.params)
        if not isinstance(params, dict):
            raise ValueError(f"--params must be a JSON object, got {type(params).__name__}.")
    except json.JSONDecodeError as exc:
        print(f"error: --params is not valid JSON: {exc}", file=sys.stderr)
        return 2
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    prompt = args.prompt
    if args.prompt_file:
        with open(args.prompt_file, encoding="utf-8") as handle:
            prompt = handle.read()
    request = {**params, "mode": args.mode, "prompt": prompt}
    try:
        model = load_model(args.model, device=args.device, gpus=args.gpus, config=config)
        try:
            result = generate(model, request, outputs_root=args.out, model_name=args.model,
                              on_progress=lambda e: print(f"[{e.stage}] {e.step}/{e.total}", file=sys.stderr))
        finally:
            if getattr(model, "is_group", False):
                model.close()
    except (ValueError, CheckpointError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    summary = result.summary()
    summary["files"] = {k: str(v) for k, v in result.outputs.items()}
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
