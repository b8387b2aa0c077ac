"""Cosmos3 Studio: the command line, and the wiring of registry, job queue and UI.

    python app.py                                  # six tiny random-weight models, built once
    python app.py --model nano=nvidia/Cosmos3-Nano --model edge=/models/cosmos3-edge --port 7860
    python app.py --review --auth-file reviewers.txt --criteria realism,prompt_adherence

Models load lazily on their first job, so the app starts in seconds; on a CUDA host the first model
also loads and warms up in the background at start (engine.serving.warmup). Every flag that a hosted app
(a Hugging Face Space, which runs `python app.py` with no arguments) needs also has an environment
variable; a flag wins over its variable. The environment is read once, by `engine.config.build_config` (every
variable: docs/CONFIGURATION.md). See docs/HOSTING.md.
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import re
import secrets
import sys
from pathlib import Path

TINY_LABEL = "tiny random weights"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
_SIZE = re.compile(r"^\s*([0-9]+)\s*(b|kb|mb|gb)?\s*$", re.IGNORECASE)
_SIZE_UNITS = {"b": 1, "kb": 1024, "mb": 1024 ** 2, "gb": 1024 ** 3}  # Gradio's max_file_size units
DEFAULT_MAX_UPLOAD = "200mb"  # a V2V clip at 720p of a few seconds is tens of MB; room for more

SAFETY_MISSING = ("--safety was given, but the 'cosmos_guardrail' package is not installed. Install it "
                  "(pip install -r requirements-gpu.txt, on a GPU host) or run without --safety; the checker is never skipped silently.")

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


def parse_size(text: str) -> int:
    """"200mb" -> bytes (units b, kb, mb, gb, powers of 1024 as in Gradio); argparse turns the error into usage."""
    match = _SIZE.match(str(text))
    if match is None or int(match.group(1)) < 1:
        raise argparse.ArgumentTypeError(f"expected a size such as 200mb, 1gb or 500kb (a positive whole number "
                                         f"and b, kb, mb or gb), got {text!r}")
    return int(match.group(1)) * _SIZE_UNITS[(match.group(2) or "b").lower()]


def parse_auth(text: str) -> tuple[str, str]:
    """USER:PASS -> (user, password). The password is never echoed back in a message."""
    user, sep, password = text.partition(":")
    user = user.strip()
    if not sep or not user or not password:
        raise argparse.ArgumentTypeError("expected USER:PASS with a non-empty user and password")
    return user, password


def read_auth_file(path: Path) -> list[tuple[str, str]]:
    """Lines `user:pass`; blank lines and lines starting with # are skipped (a `#` later in a line is
    part of the password)."""
    from engine.serving.api_keys import entry_lines

    pairs = []
    for number, line in entry_lines(path, "--auth-file", "user:pass line"):
        try:
            pairs.append(parse_auth(line))
        except argparse.ArgumentTypeError:
            raise ValueError(f"--auth-file {str(path)!r}, line {number}: expected user:pass") from None
    return pairs


def env_models(text: str) -> list[tuple[str, str]]:
    """COSMOS3_MODELS="nano=org/repo,edge=/path" -> [(name, source), ...]."""
    out = []
    for item in text.split(","):
        if item.strip():
            try:
                out.append(parse_model(item))
            except argparse.ArgumentTypeError as exc:
                raise argparse.ArgumentTypeError(f"COSMOS3_MODELS: {exc}") from None
    return out


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="app.py", description="Cosmos3 Studio: a web app for Cosmos3 models.",
        epilog="Each flag has an environment variable (COSMOS3_MODELS, COSMOS3_OUTPUTS, ...; a flag wins over its "
               "variable); every variable the studio reads, with its default: docs/CONFIGURATION.md.")
    parser.add_argument("--model", action="append", type=parse_model, default=[], metavar="NAME=SOURCE",
                        help="serve a checkpoint (a folder or a Hugging Face repo id) under NAME; repeatable. "
                             "Without any (and without COSMOS3_MODELS), six tiny random-weight models are built "
                             "once and served.")
    parser.add_argument("--model-root", action="append", default=[], metavar="DIR",
                        help="serve only checkpoints inside DIR (repeatable); hub repo ids are then refused "
                             "unless --allow-hub is given")
    parser.add_argument("--allow-hub", action="store_true",
                        help="with --model-root, still allow Hugging Face repo ids as sources")
    parser.add_argument("--host", default=None,
                        help="address to listen on (default $GRADIO_SERVER_NAME, 0.0.0.0 on a Space, else 127.0.0.1)")
    parser.add_argument("--port", type=int, default=None, help="port (default $GRADIO_SERVER_PORT or 7860)")
    parser.add_argument("--outputs", default=None, help="folder for results, one subfolder per request "
                                                        "(default $COSMOS3_OUTPUTS or ./outputs)")
    parser.add_argument("--queue-size", type=int, default=16,
                        help="most jobs that may wait for the GPU at once; more are refused (default 16)")
    parser.add_argument("--max-upload", type=parse_size, default=None, metavar="SIZE",
                        help=f"largest file a browser or /generate caller may upload, e.g. 200mb or 1gb "
                             f"(default $COSMOS3_MAX_UPLOAD or {DEFAULT_MAX_UPLOAD}); larger uploads are refused "
                             "with the limit named")
    parser.add_argument("--cache-dir", default=None,
                        help="where the tiny models and the app's state key live "
                             "(default $COSMOS3_STUDIO_CACHE or ~/.cache/cosmos3-studio)")
    review = parser.add_argument_group("review mode (internal reviewers; never on a public demo)")
    review.add_argument("--review", action="store_true",
                        help="add the review desk, a page of its own at /review (Blind, Review, Suites, Leaderboard, Batch, "
                             "Compare); review data is kept in "
                             "SQLite outside the outputs folder (--review-db); needs --auth or --auth-file")
    review.add_argument("--auth", action="append", type=parse_auth, default=[], metavar="USER:PASS",
                        help="a login for the whole app; repeatable")
    review.add_argument("--auth-file", default=None, metavar="PATH", help="logins, one user:pass per line")
    review.add_argument("--criteria", default=None, metavar="A,B,C",
                        help="rating criteria, lowercase names (default prompt_adherence, visual_quality, "
                             "temporal_consistency, physics_plausibility)")
    review.add_argument("--review-db", default=None, metavar="PATH",
                        help="the review database (default $COSMOS3_REVIEW_DB or CACHE_DIR/reviews.sqlite3); "
                             "refused inside the outputs folder, which is served")
    serving = parser.add_argument_group("serving beyond the browser (docs/SERVING.md)")
    serving.add_argument("--api-keys", default=None, metavar="FILE",
                         help="API keys for the /v1 HTTP API, one a line with optional limits "
                              "('KEY concurrency=2 per_hour=120'); default $COSMOS3_API_KEYS (comma-separated). "
                              "With keys, every /v1 route needs 'Authorization: Bearer KEY'; without, /v1 is open")
    serving.add_argument("--ray", default=None, metavar="ADDRESS|CONFIG.json",
                         help="run the engine as Ray Serve replicas, one per GPU group: a cluster address "
                              "('auto', 'ray://head:10001', 'local' for a cluster in this process) or a JSON config "
                              "{address, replicas, gpus_per_replica, cpus_per_replica, num_cpus, env}")
    serving.add_argument("--remote", default=None, metavar="URL",
                         help="front a server that speaks the /v1 dialect (another studio, SGLang, vLLM-Omni) "
                              "instead of running models here; its key, if it needs one, in $COSMOS3_REMOTE_KEY")
    serving.add_argument("--no-api", action="store_true", help="do not serve the /v1 HTTP API")
    parser.add_argument("--gpus", default=None, metavar="N|auto",
                        help="GPUs each model runs on (default 1; $COSMOS3_GPUS): one worker process per GPU, "
                             "CFG-parallel and Ulysses sequence parallel, weights sharded where a model does not "
                             "fit one GPU (Super needs 2 H200s); 'auto' uses every visible GPU. docs/PERFORMANCE.md")
    parser.add_argument("--safety", action="store_true",
                        help="run the Cosmos guardrail on every prompt and every generated result (faces blurred, "
                             "unsafe content refused, nothing saved); never skipped silently: the app refuses to "
                             "start without the cosmos_guardrail package (requirements-gpu.txt) or its models, "
                             "and says which. Recommended for public demos (docs/HOSTING.md).")
    return parser


def _apply_environment(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    """Fill what the flags left unset from the configuration (a Space passes no arguments); `args.config` is
    the environment's, read once (`engine.config.build_config`)."""
    from engine.config import ConfigError, build_config

    try:
        args.config = config = build_config()
    except ConfigError as exc:
        parser.error(str(exc))
    serving, auth, host = config.serving, config.auth, config.host
    if not args.model and serving.models:
        try:
            args.model = env_models(serving.models)
        except argparse.ArgumentTypeError as exc:
            parser.error(str(exc))
    if not args.model_root and serving.model_roots:
        args.model_root = [p for p in serving.model_roots.split(os.pathsep) if p.strip()]
    if args.host is None:
        args.host = host.server_name or ("0.0.0.0" if host.system == "spaces" else "127.0.0.1")
    if args.port is None:
        args.port = 7860 if host.server_port is None else host.server_port
    if args.outputs is None:
        args.outputs = serving.outputs or "outputs"
    if args.max_upload is None:
        try:
            args.max_upload = parse_size(serving.max_upload or DEFAULT_MAX_UPLOAD)
        except argparse.ArgumentTypeError as exc:
            parser.error(f"COSMOS3_MAX_UPLOAD: {exc}")
    args.review = args.review or serving.review
    args.safety = args.safety or serving.safety
    if args.gpus is None:
        args.gpus = serving.gpus or "1"
    from engine.parallel.runtime import resolve_gpus

    try:
        args.gpus = resolve_gpus(args.gpus)
    except ValueError as exc:
        parser.error(str(exc))
    if not args.auth and auth.auth.strip():
        try:
            args.auth = [parse_auth(item) for item in auth.auth.split(",") if item.strip()]
        except argparse.ArgumentTypeError as exc:
            parser.error(f"COSMOS3_AUTH: {exc}")
    args.auth_file = args.auth_file or auth.auth_file or None
    args.criteria = args.criteria or serving.criteria or None
    args.review_db = args.review_db or serving.review_db or None


def parse_args(argv=None) -> argparse.Namespace:
    parser = build_parser()
    args = parser.parse_args(argv)
    _apply_environment(args, parser)
    names = [name for name, _ in args.model]
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        parser.error(f"model names must be unique; repeated: {', '.join(repeated)}")
    if args.queue_size < 1:
        parser.error("--queue-size must be at least 1")
    if not 0 < args.port < 65536:
        parser.error("--port must be in 1..65535")
    args.cache_dir = Path(args.cache_dir).expanduser() if args.cache_dir else args.config.paths.studio_cache_dir()
    args.outputs = Path(args.outputs).expanduser().resolve()
    if args.auth_file:
        try:
            args.auth = list(args.auth) + read_auth_file(Path(args.auth_file).expanduser())
        except ValueError as exc:
            parser.error(str(exc))
    if args.review and not args.auth:
        parser.error("--review needs a login: give --auth USER:PASS (repeatable) or --auth-file PATH "
                     "(or COSMOS3_AUTH / COSMOS3_AUTH_FILE), so that review mode is never open to the public")
    if args.criteria and not args.review:
        parser.error("--criteria only applies with --review")
    if args.review_db and not args.review:
        parser.error("--review-db only applies with --review")
    if args.review:
        from cosmos3_ui.review.store import DB_NAME, check_db_location

        args.review_db = Path(args.review_db).expanduser().resolve() if args.review_db else args.cache_dir / DB_NAME
        try:
            check_db_location(args.review_db, [args.outputs])
        except ValueError as exc:
            parser.error(f"--review-db: {exc}")
    if args.criteria:
        from cosmos3_ui.review.store import parse_criteria

        try:
            args.criteria = parse_criteria(args.criteria)
        except ValueError as exc:
            parser.error(f"--criteria: {exc}")
    if args.remote and (args.model or args.model_root or args.ray):
        parser.error("--remote serves the remote server's models: it does not combine with --model, --model-root "
                     "or --ray")
    if args.safety and (args.ray or args.remote):
        parser.error("--safety is not available with --ray or --remote yet: the guardrail runs in this process's "
                     "job queue, which neither uses (Ray replicas do not load it; a remote studio applies its own "
                     "--safety)")
    if args.allow_hub and not args.model_root:
        parser.error("--allow-hub only applies with --model-root")
    return args


def check_safety(args: argparse.Namespace) -> None:
    """--safety fails loudly at start when the package is missing; it is never skipped silently."""
    if not args.safety:
        return
    if importlib.util.find_spec("cosmos_guardrail") is None:
        raise ValueError(SAFETY_MISSING)


def use_zero_gpu(args: argparse.Namespace, job_queue, registry) -> bool:
    """On a ZeroGPU Space: weights loaded at start, each job run inside `spaces.GPU` sized from it."""
    from cosmos3_ui.zerogpu import gpu_wrapper, job_duration, on_zero_gpu

    space = {"SPACES_ZERO_GPU": args.config.host.zero_gpu}
    if not on_zero_gpu(space):
        return False
    # The GPU call first: a queue running jobs through it plans no warm-up, which would run outside any GPU call.
    job_queue.use_gpu_call(gpu_wrapper(job_queue.run, job_duration(registry), space))
    job_queue.preload()
    return True


def model_entries(args: argparse.Namespace):
    """Registry entries: the --model list, or the tiny family built into the cache folder."""
    from engine.serving.registry import ModelEntry

    if args.model:
        return [ModelEntry(name, source, "") for name, source in args.model]
    from engine.model.tiny import ensure_family

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
    from engine.serving.queue import JobQueue
    from engine.serving.registry import ModelRegistry

    check_safety(args)
    roots = args.model_root or None
    if args.remote:
        registry = remote_registry(args)
    else:
        registry = ModelRegistry(model_entries(args), allowed_roots=roots, allow_hub=args.allow_hub or not roots,
                                 gpus=args.gpus)
    for name in registry.names():
        registry.info(name)  # config files only: a wrong path fails now, not on the first job
    args.outputs.mkdir(parents=True, exist_ok=True)
    queue_options = {}
    if args.safety:
        from engine.model.loader import make_safety_checker

        # One guardrail for every model: it carries a guard model of its own, loaded once at start.
        queue_options["safety_checker"] = make_safety_checker()
    if args.remote:
        from engine.serving.remote import RemoteJobQueue

        job_queue = RemoteJobQueue(registry, args.outputs, max_size=args.queue_size)
    elif args.ray:
        job_queue = ray_queue(args, registry)
    else:
        if args.gpus > 1:  # each model loads on a group of worker processes (engine.parallel.runtime)
            from functools import partial

            from engine.parallel.load import load_model

            queue_options["loader"] = partial(load_model, gpus=args.gpus, config=args.config)
        else:
            from functools import partial

            from engine.model.loader import load_in_process

            queue_options["loader"] = partial(load_in_process, config=args.config)
        job_queue = JobQueue(registry, args.outputs, max_size=args.queue_size, config=args.config, **queue_options)
        use_zero_gpu(args, job_queue, registry)
        job_queue.warm_default(registry.names()[0])  # the UI's first model, in the background; a no-op off CUDA
    from cosmos3_ui.review.store import DB_NAME, DEFAULT_CRITERIA, ReviewStore, adopt_legacy_db

    # Earlier versions kept the review database in the outputs folder: move it out, in public mode too,
    # so that no later run on the same folder can hand it out.
    review_db = args.review_db or args.cache_dir / DB_NAME
    moved = adopt_legacy_db(args.outputs, review_db)
    if moved is not None:
        print(f"Moved the review database out of the outputs folder to {moved}", file=sys.stderr)
    reviews = ReviewStore(review_db, args.criteria or DEFAULT_CRITERIA) if args.review else None
    studio = build_studio(registry, job_queue, args.outputs, queue_size=args.queue_size,
                          state_secret=state_secret(args.cache_dir), reviews=reviews,
                          auth=args.auth or None, max_upload_bytes=args.max_upload)
    if not args.no_api:
        studio.http_routes.extend(http_api(args, job_queue).router.routes)
    return studio


def remote_registry(args: argparse.Namespace):
    """The models of the server that --remote fronts (docs/SERVING.md)."""
    from engine.serving.remote import RemoteRegistry

    return RemoteRegistry(args.remote, args.config.auth.remote_key or None)


def ray_queue(args: argparse.Namespace, registry):
    """Engine replicas on Ray Serve behind the UI and the API (docs/SERVING.md)."""
    from engine.serving.ray_replicas import RayConfig, RayJobQueue

    return RayJobQueue.start(RayConfig.parse(args.ray), registry, args.outputs, max_size=args.queue_size)


def http_api(args: argparse.Namespace, job_queue):
    """The /v1 HTTP API over the UI's own queue, with the configured keys (docs/SERVING.md)."""
    from engine.serving.api_keys import KeyRing, configured_keys
    from engine.serving.http_api import HttpApi

    closed = ("This studio needs a login (--auth), so its /v1 API needs API keys too: start it with "
              "--api-keys FILE or COSMOS3_API_KEYS.") if args.auth else None
    keys = configured_keys(args.api_keys, args.config.auth.api_keys)
    return HttpApi(job_queue, KeyRing(keys, closed_reason=closed), config=args.config)


def main(argv=None) -> int:
    args = parse_args(argv)
    from engine.config import apply_process_environment

    apply_process_environment(args.config)  # once, before the engine's libraries are imported
    from engine.install_check import ENGINE_IMPORTS, broken_import

    # A broken install ends here in one line (which package, what failed, the fix), not 40 frames into a job.
    if (problem := broken_import(("gradio",) if args.remote else ("gradio", *ENGINE_IMPORTS))) is not None:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    try:
        studio = create_studio(args)
    except ValueError as exc:  # unknown folders, malformed checkpoints, --safety: say which, no traceback
        print(f"error: {exc}", file=sys.stderr)
        return 2
    mode = " in review mode (login required)" if args.review else (" (login required)" if args.auth else "")
    print(f"Cosmos3 Studio: serving {', '.join(studio.service.model_names())} on http://{args.host}:{args.port}/"
          f"{mode} (outputs in {args.outputs})")
    from cosmos3_kernels.prefix_attention import flash4_advice

    if (advice := flash4_advice()) is not None:
        print(f"note: {advice}", file=sys.stderr)
    studio.launch(host=args.host, port=args.port)
    return 0


if __name__ == "__main__":
    sys.exit(main())
