"""Shared plumbing for the tests that launch the app: a free port, the in-process launch, Chromium.

Kept in one place so every app-level test starts the Studio the same way and closes it fully.
"""
from __future__ import annotations

import contextlib
import os
import socket

import app

CHROMIUM = "/usr/bin/chromium"
# Chromium as root in a sandbox with no network beyond loopback (see docs: gradio-and-hosting).
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-quic"]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def chromium_available() -> bool:
    return os.path.exists(CHROMIUM)


@contextlib.contextmanager
def launched_studio(argv: list[str]):
    """The Studio for `app.py` arguments `argv`, serving on a free loopback port; yields (studio, url)."""
    studio = app.create_studio(app.parse_args(argv))
    port = free_port()
    studio.launch(host="127.0.0.1", port=port, prevent_thread_lock=True, quiet=True)
    try:
        yield studio, f"http://127.0.0.1:{port}/"
    finally:
        studio.close()
        studio.service.queue.close()


@contextlib.contextmanager
def browser_page(browser, screenshot_dir):
    """A fresh page in its own context; its last state is screenshotted into `screenshot_dir` (a temp dir)."""
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    page = context.new_page()
    page.set_default_timeout(30_000)
    try:
        yield page
    finally:
        page.screenshot(path=str(screenshot_dir / "last.png"), full_page=True)
        context.close()
