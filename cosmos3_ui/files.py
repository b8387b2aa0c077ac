"""Which result files a client can fetch, and how: a result's files belong to the session that made it.

The outputs folder is never served as a folder: it is not in Gradio's `allowed_paths`, and it is in
`blocked_paths`, so no URL built from a server path or a request id reaches it. A handler hands its
caller a result file through `publish`, which copies the file into Gradio's upload cache with Gradio's
own `save_file_to_cache`: the copy sits in a folder named by a keyed hash of its content (the key is
the Gradio installation's private hash seed), so its URL can be neither guessed nor derived from the
request id, and it reaches only the session or API caller whose response carried it. In review mode
every page is behind the login, so a reviewer's handler may `publish` any registered result.

Gradio answers a refused file with 403; `NotFoundForRefusedFiles` turns that into a plain 404, so a
guessed URL learns nothing more than a URL of a file that never existed.
"""
from __future__ import annotations

import logging
import os
import re
import threading
from pathlib import Path

log = logging.getLogger("cosmos3_ui")

FILE_ROUTES = ("/gradio_api/file=", "/gradio_api/file/", "/file=", "/file/")
DEFAULT_MAX_UPLOAD_BYTES = 209_715_200  # 200 MiB, app.py's --max-upload default
# Gradio's cache (uploads and the copies `publish` hands out) is swept every hour of files older than six:
# a page left open longer loses its previews (a reload publishes them again), and no upload outlives the
# jobs that read it (a job is refused, or run, long before).
CACHE_CLEANUP = (3600, 6 * 3600)
_roots: set[Path] = set()
_published: dict[tuple[str, int, int], str] = {}  # (path, size, mtime_ns) -> its cache copy
_lock = threading.Lock()


def serve_results_from(outputs_root: str | Path) -> Path:
    """Register the folder whose result files `publish` may hand out (the app's outputs root)."""
    root = Path(outputs_root).resolve()
    with _lock:
        _roots.add(root)
    return root


def result_file(path: str | Path | None) -> Path | None:
    """`path` if it is a regular file inside a registered outputs root, reached without a symlink or `..`."""
    if path is None or path == "":
        return None
    try:
        given = Path(path)
        if not given.is_absolute() or ".." in given.parts:
            return None
        resolved = given.resolve(strict=True)
    except (OSError, ValueError, TypeError, RuntimeError):
        return None
    if not resolved.is_file():
        return None
    with _lock:
        roots = tuple(_roots)
    for root in roots:
        if root in resolved.parents:
            # The part below the root must be the very path given: no symlink inside the outputs folder.
            tail = resolved.relative_to(root).parts
            if Path(os.path.abspath(given)).parts[-len(tail):] == tail and not any(
                    (root.joinpath(*tail[:i + 1])).is_symlink() for i in range(len(tail))):
                return resolved
    return None


def locate(name: str | Path | None) -> Path | None:
    """The result file a history entry names: relative to an outputs root, or (older entries) absolute."""
    if name is None or name == "":
        return None
    given = Path(name)
    if given.is_absolute():
        return result_file(given)
    with _lock:
        roots = tuple(_roots)
    for root in roots:
        found = result_file(root / given)
        if found is not None:
            return found
    return None


def relative(path: str | Path | None) -> str | None:
    """A result file's name relative to its outputs root (what a browser may keep), or None."""
    found = locate(path)
    if found is None:
        return None
    with _lock:
        roots = tuple(_roots)
    for root in roots:
        if root in found.parents:
            return found.relative_to(root).as_posix()
    return None


def publish(path: str | Path | None) -> str | None:
    """A capability copy of one result file for the caller of this handler, or None.

    Returns the copy's path in Gradio's cache (a component value; Gradio turns it into a
    `/gradio_api/file=` URL). None for no path, and for anything that is not a result file (logged).
    """
    if path is None or path == "":
        return None
    found = locate(path)
    if found is None:
        log.warning("refused to publish %r: not a result file under the outputs folder", str(path))
        return None
    from gradio.processing_utils import save_file_to_cache
    from gradio.utils import get_upload_folder

    stat = found.stat()
    key = (str(found), stat.st_size, stat.st_mtime_ns)
    with _lock:
        copy = _published.get(key)
    if copy is not None and Path(copy).is_file():
        try:
            os.utime(copy)  # handed out again now: the cache sweep ages copies by their change time
        except OSError:
            pass
        return copy
    copy = save_file_to_cache(found, get_upload_folder())
    with _lock:
        _published[key] = copy
    return copy


def publish_all(paths) -> list[str]:
    """`publish` over a list, dropping what cannot be published."""
    return [copy for copy in (publish(p) for p in paths or []) if copy is not None]


def _server_folders() -> list[tuple[str, str]]:
    """(folder, what a message calls it): the outputs roots, Gradio's upload cache, the temp folder."""
    import tempfile

    from gradio.utils import get_upload_folder

    with _lock:
        folders = [(str(root), "<outputs>") for root in _roots]
    folders += [(str(Path(get_upload_folder()).resolve()), "<uploads>"), (get_upload_folder(), "<uploads>"),
                (str(Path(tempfile.gettempdir()).resolve()), "<temp>"), (tempfile.gettempdir(), "<temp>")]
    return sorted(set(folders), key=lambda item: -len(item[0]))


def redact(text: str) -> str:
    """`text` with every server path in it (under the outputs folder, Gradio's upload cache or the temp
    folder) replaced by its base name, and each of those folders alone by a label (for messages)."""
    for folder, label in _server_folders():
        pattern = re.compile(re.escape(folder.rstrip("/")) + r"(?:(/[^\s'\"<>`]*)|(?![\w-]))")
        text = pattern.sub(lambda m: Path(m.group(1)).name or label if m.group(1) else label, text)
    return text


class NotFoundForRefusedFiles:
    """ASGI middleware: a file route's refusal (403) becomes 404 with a body that echoes nothing."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope.get("type") != "http" or not scope.get("path", "").startswith(FILE_ROUTES):
            await self.app(scope, receive, send)
            return
        refused = False

        async def guarded_send(message):
            nonlocal refused
            if message["type"] == "http.response.start" and message.get("status") == 403:
                refused = True
                await send({"type": "http.response.start", "status": 404,
                            "headers": [(b"content-type", b"text/plain; charset=utf-8"), (b"content-length", b"9")]})
                await send({"type": "http.response.body", "body": b"Not found", "more_body": False})
                return
            if not refused:
                await send(message)

        await self.app(scope, receive, guarded_send)


def launch_options(outputs_root: str | Path, app_kwargs: dict | None = None,
                   max_file_size: int = DEFAULT_MAX_UPLOAD_BYTES) -> dict:
    """The keyword arguments of `Blocks.launch` that keep the outputs folder unserved (`app_kwargs`:
    the FastAPI app's other arguments, which are kept) and cap every upload at `max_file_size` bytes."""
    from starlette.middleware import Middleware

    root = serve_results_from(outputs_root)
    app_kwargs = dict(app_kwargs or {})
    app_kwargs["middleware"] = [*app_kwargs.get("middleware", []), Middleware(NotFoundForRefusedFiles)]
    return {"allowed_paths": [], "blocked_paths": [str(root)], "app_kwargs": app_kwargs, "max_file_size": max_file_size}
