"""Shared plumbing for the tests that launch the app: a free port, the in-process launch, Chromium.

Kept in one place so every app-level test starts the Studio the same way and closes it fully.
"""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import time
from pathlib import Path

import app
from engine.model.defaults import FAMILY_TABLE
from engine.model.variants import TINY_MARKER

CHROMIUM = "/usr/bin/chromium"
# Chromium as root in a sandbox with no network beyond loopback (see docs: gradio-and-hosting).
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-quic"]


def with_family_canvases(source: Path, target: Path) -> Path:
    """A copy of a tiny checkpoint that declares its real family's canvases (sizes and frame range).

    The six stock tiny checkpoints share one small canvas list, so switching between them cannot show
    that Nano and Edge allow different sizes; these copies carry the family table's lists instead.
    """
    shutil.copytree(source, target)
    marker = json.loads((target / TINY_MARKER).read_text())
    limits = FAMILY_TABLE[marker["family"]]
    marker.update(image_sizes=[list(s) for s in limits.image_sizes], video_sizes=[list(s) for s in limits.video_sizes],
                  frame_range=list(limits.frame_range), default_frames=limits.video.num_frames)
    (target / TINY_MARKER).write_text(json.dumps(marker))
    return target


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
def chromium_browser():
    """Debian's Chromium driven by Playwright, closed on exit; the test skips where Chromium is missing."""
    import pytest

    if not chromium_available():
        pytest.skip("Chromium is missing: run scripts/ensure_chromium.sh (apt-get install chromium)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()


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


@contextlib.contextmanager
def t2v_page(studio, tmp_path):
    """A fresh browser page on the studio's Text to Video tab (skips where Chromium is missing)."""
    with chromium_browser() as browser, browser_page(browser, tmp_path) as page:
        page.goto(studio.url)
        page.wait_for_selector("#model-picker")
        page.get_by_role("tab", name="Text to Video", exact=True).click()
        yield page


# The /v1 job statuses that end a job.
TERMINAL = ("completed", "failed", "cancelled")


def wait_for_job(client, job_id: str, until=TERMINAL, timeout: float = 120) -> dict:
    """Poll a /v1 job (`client`: an httpx client based at the API's /v1/) until its status is one of `until`."""
    deadline = time.monotonic() + timeout
    job = None
    while time.monotonic() < deadline:
        job = client.get(f"videos/{job_id}").json()
        if job["status"] in until:
            return job
        time.sleep(0.05)
    raise AssertionError(f"job {job_id} never reached {until}: {job}")


def generate_through_api(client, model: str, request, file=None):
    """The studio's scripting `/generate` through gradio_client: `request` a dict, or raw JSON text as sent."""
    from gradio_client import handle_file

    payload = request if isinstance(request, str) else json.dumps(request)
    return client.predict(model, payload, handle_file(str(file)) if file else None, api_name="/generate")
