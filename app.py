"""Cosmos3 Studio: the command line, and the wiring of registry, job queue and UI.

    python app.py                                  # six tiny random-weight models, built once
    python app.py --model nano=nvidia/Cosmos3-Nano --model edge=/models/cosmos3-edge --port 7860

Models load lazily on their first job, so the app starts in seconds.
"""
from __future__ import annotations

import argparse
import os
import re
import secrets
import sys
from pathlib import Path

TINY_LABEL = "tiny random weights"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


def default_cache_dir() -> Path:
    return Path(os.environ.get("COSMOS3_STUDIO_CACHE") or Path.home() / ".cache" / "cosmos3-studio")


def parse_model(text: str) -> tuple[str, str]:
    """NAME=SOURCE -> (name, source); argparse turns the ValueError into a usage message."""
    name, sep, source = text.partition("=")
    name, source = name.strip(), source.strip()
    if not sep or not name or not source:
        raise argparse.ArgumentTypeError(f"expected NAME=SOURCE (a folder or a hub repo id), got {text!r}")
    if not _NAME.match(name):
        raise argparse.ArgumentTypeError(
            f"model name {name!r} must be 1-64 letters, digits, '.', '_' or '-', starting with a letter or digit")
    return name, source


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="app.py", description="Cosmos3 Studio: a web app for Cosmos3 models.")
    parser.add_argument("--model", action="append", type=parse_model, default=[], metavar="NAME=SOURCE",
                        help="serve a checkpoint (a folder or a Hugging Face repo id) under NAME; repeatable. "
                             "Without any, six tiny random-weight models are built once and served.")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=7860, help="port (default 7860)")
    parser.add_argument("--outputs", default="outputs", help="folder for results, one subfolder per request "
                                                             "(default ./outputs)")
    parser.add_argument("--queue-size", type=int, default=16,
                        help="most jobs that may wait for the GPU at once; more are refused (default 16)")
    parser.add_argument("--cache-dir", default=None,
                        help="where the tiny models and the app's state key live "
                             "(default $COSMOS3_STUDIO_CACHE or ~/.cache/cosmos3-studio)")
    return parser


def parse_args(argv=None) -> argparse.Namespace:
    parser = build_parser()
    args = parser.parse_args(argv)
    names = [name for name, _ in args.model]
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        parser.error(f"model names must be unique; repeated: {', '.join(repeated)}")
    if args.queue_size < 1:
        parser.error("--queue-size must be at least 1")
    if not 0 < args.port < 65536:
        parser.error("--port must be in 1..65535")
    args.cache_dir = Path(args.cache_dir).expanduser() if args.cache_dir else default_cache_dir()
    args.outputs = Path(args.outputs).expanduser().resolve()
    return args


def model_entries(args: argparse.Namespace):
    """Registry entries: the --model list, or the tiny family built into the cache folder."""
    from engine.registry import ModelEntry

    if args.model:
        return [ModelEntry(name, source, "") for name, source in args.model]
    from engine.tiny import ensure_family

    paths = ensure_family(args.cache_dir / "tiny")
    return [ModelEntry(name, str(path), TINY_LABEL) for name, path in paths.items()]


def state_secret(cache_dir: Path) -> str:
    """The key that encrypts each browser's history; kept outside the outputs folder (which is served)."""
    path = cache_dir / "browser-state.key"
    try:
        if path.is_file():
            text = path.read_text(encoding="utf-8").strip()
            if len(text) >= 32:
                return text
        cache_dir.mkdir(parents=True, exist_ok=True)
        key = secrets.token_hex(32)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(key)
        return key
    except OSError:
        return secrets.token_hex(32)  # history then lasts until the server restarts


def create_studio(args: argparse.Namespace):
    """Registry, queue and UI for parsed arguments (tests use this to launch in-process)."""
    from cosmos3_ui import build_studio
    from engine.queue import JobQueue
    from engine.registry import ModelRegistry

    registry = ModelRegistry(model_entries(args))
    for name in registry.names():
        registry.info(name)  # config files only: a wrong path fails now, not on the first job
    args.outputs.mkdir(parents=True, exist_ok=True)
    job_queue = JobQueue(registry, args.outputs, max_size=args.queue_size)
    return build_studio(registry, job_queue, args.outputs, queue_size=args.queue_size,
                        state_secret=state_secret(args.cache_dir))


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        studio = create_studio(args)
    except ValueError as exc:  # unknown folders, malformed checkpoints: say which, without a traceback
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"Cosmos3 Studio: serving {', '.join(studio.service.model_names())} on http://{args.host}:{args.port}/ "
          f"(outputs in {args.outputs})")
    studio.launch(host=args.host, port=args.port)
    return 0


if __name__ == "__main__":
    sys.exit(main())
