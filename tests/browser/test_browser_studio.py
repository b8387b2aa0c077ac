"""The Studio in a real browser (Playwright driving Debian's Chromium) against the tiny family.

Screenshots go to pytest's temporary folder, never into the repository.
"""
import json
import time
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

playwright_api = pytest.importorskip("playwright.sync_api")

from harness import (  # noqa: E402
    browser_page,
    chromium_available,
    chromium_browser,
    launched_studio,
    with_family_canvases,
)
from engine.model.defaults import FAMILY_TABLE  # noqa: E402

pytestmark = pytest.mark.browser

TINY_NAMES = ("nano", "nano-distilled", "super", "super-distilled", "edge", "edge-distilled")


@pytest.fixture(scope="module")
def studio(tiny_family, tmp_path_factory):
    if not chromium_available():
        pytest.skip("Chromium is missing: run scripts/ensure_chromium.sh (apt-get install chromium)")
    extra = tmp_path_factory.mktemp("family-canvases")
    argv = ["--outputs", str(tmp_path_factory.mktemp("browser-outputs")),
            "--cache-dir", str(tmp_path_factory.mktemp("browser-cache")), "--queue-size", "4"]
    for name in TINY_NAMES:
        argv += ["--model", f"{name}={tiny_family[name]}"]
    for name in ("nano", "edge"):
        argv += ["--model", f"{name}-family-sizes={with_family_canvases(tiny_family[name], extra / name)}"]
    with launched_studio(argv) as (studio, url):
        studio.url = url
        yield studio


@pytest.fixture(scope="module")
def browser():
    with chromium_browser() as chromium:
        yield chromium


@pytest.fixture
def page(browser, studio, tmp_path):
    with browser_page(browser, tmp_path) as page:
        page.goto(studio.url)
        page.wait_for_selector("#model-picker")
        page.wait_for_timeout(500)
        yield page


# ---------------------------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------------------------

def pick_model(page, name: str) -> None:
    """Select a model and wait until the controls have followed it (the variant panel names it)."""
    if page.locator("#model-picker input").input_value() == name:
        return
    page.locator("#model-picker input").click()
    page.get_by_role("option", name=name, exact=True).click()
    deadline = time.time() + 15
    while time.time() < deadline:
        if page.locator("#variant-panel").inner_text().startswith(f"{name} ·"):
            page.wait_for_timeout(200)
            return
        time.sleep(0.05)
    raise AssertionError(f"the variant panel never showed {name!r}")


def open_tab(page, label: str) -> None:
    page.get_by_role("tab", name=label, exact=True).click()
    page.wait_for_timeout(200)


def dropdown_options(page, elem_id: str) -> list[str]:
    page.locator(f"#{elem_id} input").click()
    options = page.get_by_role("option").all_inner_texts()
    page.keyboard.press("Escape")
    # Option texts start with the size ("1280 x 720"); the selected one also carries a check mark.
    return [" ".join(o.replace("✓", " ").split()) for o in options]


def set_number(page, elem_id: str, value) -> None:
    """Type a number into a slider's or number box's input and check that it stuck.

    Controls inside an accordion mount when it opens, and a fresh mount can reset a value typed a
    moment earlier; so the value is typed again until it holds.
    """
    box = page.locator(f"#{elem_id} input[type=number]").first
    box.wait_for(state="visible")
    for _ in range(5):
        box.fill(str(value))
        box.press("Enter")
        page.wait_for_timeout(250)
        if box.input_value() == str(value):
            return
    raise AssertionError(f"#{elem_id} did not keep the value {value}")


def edge_t2i_with_steps(page, steps: int) -> None:
    """Edge picked, the Text to Image tab's sampling opened and its steps set."""
    pick_model(page, "edge")
    page.locator("#t2i-sampling").click()
    set_number(page, "t2i-steps", steps)


def wait_for_text(page, selector: str, fragment: str, timeout_s: float = 60) -> str:
    deadline = time.time() + timeout_s
    text = ""
    while time.time() < deadline:
        text = page.locator(selector).inner_text()
        if fragment in text:
            return text
        time.sleep(0.1)
    raise AssertionError(f"{fragment!r} never appeared in {selector}; last text: {text!r}")


# ---------------------------------------------------------------------------------------------
# tests
# ---------------------------------------------------------------------------------------------

def set_up_slow_action_run(page, model: str, first_frame: Path) -> None:
    """The Action tab set for a policy run on the 720p tier with a 32-step chunk and 100 steps, which takes well
    over a second a step on the CPU even with tiny weights: still denoising when the test acts on it."""
    pick_model(page, model)
    open_tab(page, "Action")
    page.locator("#action-image input[type=file]").set_input_files(str(first_frame))
    page.wait_for_selector("#action-image img")
    page.locator("#action-tier input").click()
    page.get_by_role("option", name="720p", exact=True).click()
    set_number(page, "action-chunk", 32)
    page.locator("#action-sampling").click()
    set_number(page, "action-steps", 100)


def restore_newest_after_reload(page) -> None:
    """Reload the page, then restore this browser's newest result from History."""
    page.reload()
    page.wait_for_selector("#model-picker")
    gallery = page.locator("#history-gallery .thumbnail-item")
    deadline = time.time() + 15
    while time.time() < deadline and gallery.count() < 1:
        time.sleep(0.1)
    gallery.first.click()
    wait_for_text(page, "#history", "Restored")


def test_switching_nano_to_edge_changes_the_resolution_choices(page, tmp_path):
    pick_model(page, "nano-family-sizes")
    wait_for_text(page, "#variant-panel", "nano-family-sizes")
    nano = dropdown_options(page, "t2i-resolution")
    pick_model(page, "edge-family-sizes")
    wait_for_text(page, "#variant-panel", "Edge")
    edge = dropdown_options(page, "t2i-resolution")
    page.screenshot(path=str(tmp_path / "edge.png"))
    assert any(o.startswith("1280 x 720") for o in nano) and not any(o.startswith("1280 x 720") for o in edge)
    assert [o.split(" (")[0] for o in edge] == [f"{w} x {h}" for w, h in FAMILY_TABLE["edge"].image_sizes]
    open_tab(page, "Text to Video")
    # The frame limits follow the model; the box itself never clamps (a refusal names the field instead).
    assert "49..149" in page.locator("#t2v-frames").inner_text()
    assert page.locator("#t2v-frames input[type=number]").get_attribute("step") == "4"


def test_unsupported_modes_are_disabled_and_distilled_locks_sampling(page):
    pick_model(page, "super")
    wait_for_text(page, "#variant-panel", "Not available: action")
    assert page.get_by_role("tab", name="Action", exact=True).is_disabled()
    pick_model(page, "nano-distilled")
    wait_for_text(page, "#variant-panel", "Fixed sigmas")
    assert page.get_by_role("tab", name="Action", exact=True).is_disabled()  # few-step: vision modes only
    page.locator("#t2i-sampling").click()
    assert page.locator("#t2i-steps input[type=number]").first.is_disabled()
    assert "distilled" in page.locator("#t2i-sampling").inner_text()
    page.locator("#t2i-negative-box").click()
    wait_for_text(page, "#t2i-negative-box", "do not use a negative prompt", timeout_s=10)
    # Switching to a full checkpoint takes every distilled note away with the locks.
    pick_model(page, "super")
    wait_for_text(page, "#variant-panel", "full sampler")
    assert "distilled" not in page.locator("#t2i-sampling").inner_text().lower()
    assert "do not use a negative prompt" not in page.locator("#t2i-negative-box").inner_text()
    assert not page.locator("#t2i-steps input[type=number]").first.is_disabled()
    pick_model(page, "nano")
    wait_for_text(page, "#variant-panel", "full sampler")
    assert not page.get_by_role("tab", name="Action", exact=True).is_disabled()


def test_malformed_json_caption_shows_a_positioned_error(page, tmp_path):
    page.locator("#t2i-json-tab-button").click() if page.locator("#t2i-json-tab-button").count() else \
        page.locator("#tab-t2i").get_by_role("tab", name="JSON", exact=True).click()
    editor = page.locator("#t2i-code .cm-content")
    editor.click()
    page.keyboard.press("Control+A")
    page.keyboard.press("Delete")
    page.keyboard.insert_text('{\n  "subjects": [{"description": "a kite"}]\n  "style_medium": "photo"\n}')
    message = wait_for_text(page, "#t2i-caption-message", "Line 3, column 3", timeout_s=15)
    page.screenshot(path=str(tmp_path / "json-error.png"))
    assert "Expecting ',' delimiter" in message
    assert '"style_medium": "photo"' in message and "^" in message  # the line and a caret under the column
    # A fix clears the error and the form follows the JSON.
    page.keyboard.press("Control+A")
    page.keyboard.press("Delete")
    page.keyboard.insert_text('{"subjects": [{"description": "a kite"}], "background_setting": "a windy beach"}')
    deadline = time.time() + 15
    while time.time() < deadline and page.locator("#t2i-caption-message").inner_text().strip():
        time.sleep(0.1)
    assert page.locator("#t2i-caption-message").inner_text().strip() == ""
    assert page.locator("#t2i-field-background_setting textarea").input_value() == "a windy beach"


def test_an_image_and_a_video_are_generated_and_shown(page, tmp_path):
    edge_t2i_with_steps(page, 3)
    page.locator("#t2i-generate").click()
    page.wait_for_selector("#t2i-output img", timeout=90_000)
    status = wait_for_text(page, "#t2i-status", "Done")
    seed = page.locator("#t2i-used-seed textarea, #t2i-used-seed input").first.input_value()
    assert seed.isdigit() and f"seed {seed}" in status
    assert f"seed{seed}" in page.locator("#t2i-files").inner_text().replace("\n", "")
    page.locator("#t2i-final-text").click()
    assert '"resolution"' in page.locator("#t2i-prompt-text textarea").input_value()

    open_tab(page, "Text to Video")
    page.locator("#t2v-sampling").click()
    set_number(page, "t2v-steps", 2)
    page.locator("#t2v-generate").click()
    page.wait_for_selector("#t2v-output video", timeout=90_000)
    wait_for_text(page, "#t2v-status", "Done")
    page.screenshot(path=str(tmp_path / "generated.png"), full_page=True)
    assert "_t2v_seed" in page.locator("#t2v-files").inner_text().replace("\n", "")

    # Both results are in this browser's history; clicking one restores its settings and seed.
    gallery = page.locator("#history-gallery button.thumbnail-item, #history-gallery .thumbnail-item")
    deadline = time.time() + 10
    while time.time() < deadline and gallery.count() < 2:
        time.sleep(0.1)
    assert gallery.count() == 2
    open_tab(page, "Text to Video")
    gallery.nth(1).click()  # the older one: the image
    wait_for_text(page, "#history", "Restored")
    assert page.locator("#t2i-seed input").first.input_value() == seed
    assert not page.locator("#t2i-randomize input").is_checked()


def test_a_running_job_is_cancelled_then_a_policy_run_shows_actions(page, studio, tmp_path):
    # A policy run on the 720p tier with a 32-step chunk takes well over a second per step on the CPU
    # even with tiny weights, so it is still denoising when Cancel is pressed.
    first_frame = tmp_path / "first-frame.png"
    Image.fromarray(np.tile(np.linspace(0, 255, 1280, dtype=np.uint8)[None, :, None], (720, 1, 3))).save(first_frame)
    set_up_slow_action_run(page, "nano", first_frame)
    saved_before = len(list(studio.service.outputs_root.iterdir()))
    cancelled_before = len(studio.service.active.cancelled_ids)
    page.locator("#action-generate").click()
    # The per-step progress really reaches the browser.
    wait_for_text(page, "#action-output", "Denoising: step", timeout_s=90)
    page.screenshot(path=str(tmp_path / "running.png"))
    page.locator("#action-cancel").click()
    status = wait_for_text(page, "#action-status", "Cancelled after denoising step", timeout_s=30)
    step, total = (int(x) for x in status.split("denoising step ")[1].split(";")[0].split(" of "))
    assert total == 100 and 1 <= step < 20
    deadline = time.time() + 10
    while time.time() < deadline and studio.service.active.count():
        time.sleep(0.1)
    assert studio.service.active.count() == 0
    assert len(studio.service.active.cancelled_ids) == cancelled_before + 1
    assert len(list(studio.service.outputs_root.iterdir())) == saved_before  # nothing was saved
    # The inputs stay in place, and the GPU slot is free for the next run.
    assert page.locator("#action-steps input[type=number]").first.input_value() == "100"
    page.locator("#action-tier input").click()
    page.get_by_role("option", name="256p", exact=True).click()
    set_number(page, "action-chunk", 4)
    set_number(page, "action-steps", 2)
    page.locator("#action-generate").click()
    wait_for_text(page, "#action-status", "Done", timeout_s=90)
    page.wait_for_selector("#action-output video")
    page.wait_for_selector("#action-plot img")
    assert "actions.json" in page.locator("#action-json").inner_text().replace("\n", "")
    assert "actions" not in page.locator("#action-files").inner_text()  # each file listed once
    page.screenshot(path=str(tmp_path / "policy.png"), full_page=True)
    # After a reload the upload is gone; History brings the result back with its first frame.
    restore_newest_after_reload(page)
    page.wait_for_selector("#action-image img", timeout=15_000)
    assert "Upload the conditioning file again" not in page.locator("#action-status").inner_text()


def test_closing_the_tab_cancels_its_running_job(browser, studio, tmp_path):
    first_frame = tmp_path / "first-frame.png"
    Image.fromarray(np.full((720, 1280, 3), 90, np.uint8)).save(first_frame)
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    page = context.new_page()
    page.goto(studio.url)
    page.wait_for_selector("#model-picker")
    set_up_slow_action_run(page, "edge", first_frame)
    cancelled_before = len(studio.service.active.cancelled_ids)
    page.locator("#action-generate").click()
    wait_for_text(page, "#action-output", "Denoising: step", timeout_s=90)
    context.close()
    deadline = time.time() + 30
    while time.time() < deadline and studio.service.active.count():
        time.sleep(0.2)
    assert studio.service.active.count() == 0
    assert len(studio.service.active.cancelled_ids) == cancelled_before + 1


# ---------------------------------------------------------------------------------------------
# issue 18: nothing typed is lost or silently changed, errors at their field, preview, downloads
# ---------------------------------------------------------------------------------------------

def result_names(studio) -> set:
    """The names of the result folders the server has written so far."""
    return {p.name for p in studio.service.outputs_root.iterdir()}


def newest_result(studio, before: set) -> Path:
    new = [p for p in studio.service.outputs_root.iterdir() if p.is_dir() and p.name not in before]
    assert len(new) == 1, new
    return new[0]


def test_a_pasted_form_field_reaches_the_sent_prompt_and_the_sidecar(page, studio):
    page.context.grant_permissions(["clipboard-read", "clipboard-write"], origin=studio.url.rstrip("/"))
    edge_t2i_with_steps(page, 2)
    page.locator("#tab-t2i").get_by_role("tab", name="Form", exact=True).click()
    field = page.locator("#t2i-field-context textarea")
    field.click()
    page.evaluate("navigator.clipboard.writeText('PASTEDCONTEXT at a wedding')")
    page.keyboard.press("Control+A")
    page.keyboard.press("Control+V")
    assert field.input_value() == "PASTEDCONTEXT at a wedding"
    before = result_names(studio)
    # Generate straight after the paste: the box's blur sync and the run race; Generate merges the Form
    # into the JSON itself (forms.gen_request; tests/unit/pipeline/test_request_once.py checks it without a browser).
    page.locator("#t2i-generate").click()
    wait_for_text(page, "#t2i-status", "Done", timeout_s=90)
    page.locator("#t2i-final-text").click()
    assert "PASTEDCONTEXT at a wedding" in page.locator("#t2i-prompt-text textarea").input_value()
    sidecar = json.loads((newest_result(studio, before) / "params.json").read_text())
    assert "PASTEDCONTEXT at a wedding" in json.dumps(sidecar)
    # The JSON view shows what was sent.
    page.locator("#tab-t2i").get_by_role("tab", name="JSON", exact=True).click()
    assert "PASTEDCONTEXT at a wedding" in page.locator("#t2i-code").inner_text()


def test_steps_out_of_range_is_refused_naming_steps_and_nothing_runs(page, studio):
    edge_t2i_with_steps(page, 99999)
    before = result_names(studio)
    page.locator("#t2i-generate").click()
    message = wait_for_text(page, "#t2i-sampling-message", "99999", timeout_s=30)
    assert "steps" in message.lower() and "200" in message  # the API's words: what came, what is allowed
    assert "99999" in page.locator("#t2i-status").inner_text()
    assert "field-error" in (page.locator("#t2i-steps").get_attribute("class") or "")
    page.wait_for_timeout(1500)
    assert result_names(studio) == before  # nothing ran
    assert page.locator("#t2i-steps input[type=number]").first.input_value() == "99999"  # the input stays


def test_an_undecodable_image_upload_names_the_image_input(page, tmp_path):
    fake = tmp_path / "not-an-image.png"
    fake.write_text("this is a text file, not a PNG")
    pick_model(page, "nano")
    open_tab(page, "Text to Video")
    page.get_by_text("Start from an image or a video (optional)").click()
    page.locator("#t2v-image input[type=file]").set_input_files(str(fake))
    message = wait_for_text(page, "#tab-t2v", "could not be decoded", timeout_s=30)
    assert "Conditioning image" in message and "not-an-image.png" in message
    # Generate anyway: the worker's refusal comes back with its field (RequestError.field "image"), so
    # the same message stands at the image input and marks it, not only in the status line.
    page.locator("#t2v-sampling").click()
    set_number(page, "t2v-steps", 2)
    page.locator("#t2v-generate").click()
    wait_for_text(page, "#t2v-status", "could not be decoded", timeout_s=60)
    assert "Conditioning image" in page.locator("#t2v-canvas-message").inner_text()
    assert "field-error" in (page.locator("#t2v-image").get_attribute("class") or "")


def test_a_t2i_run_shows_a_preview_before_its_result(page):
    edge_t2i_with_steps(page, 8)
    # Record, in the page, the order in which a preview image and the final "Done" appear.
    page.evaluate("""() => {
        window.seen = [];
        const note = (what) => { if (!window.seen.includes(what)) window.seen.push(what); };
        new MutationObserver(() => {
            if (document.querySelector('#t2i-live img')) note('preview');
            const status = document.querySelector('#t2i-status');
            const line = document.querySelector('#t2i-progress');
            if (line && line.innerText.includes('Denoising')) note('progress');
            if (status && status.innerText.includes('Done')) note('done');
        }).observe(document.body, {subtree: true, childList: true, characterData: true, attributes: true});
    }""")
    page.locator("#t2i-generate").click()
    wait_for_text(page, "#t2i-status", "Done", timeout_s=90)
    seen = page.evaluate("window.seen")
    assert "preview" in seen and seen.index("preview") < seen.index("done"), seen
    assert "progress" in seen  # progress shows beside Generate, not only over the result


def test_downloads_are_named_by_model_mode_seed_and_request_id(page, studio):
    edge_t2i_with_steps(page, 2)
    before = result_names(studio)
    page.locator("#t2i-generate").click()
    wait_for_text(page, "#t2i-status", "Done", timeout_s=90)
    request_id = newest_result(studio, before).name
    seed = page.locator("#t2i-used-seed textarea, #t2i-used-seed input").first.input_value()
    files = page.locator("#t2i-files").inner_text().replace("\n", "")
    stem = f"edge_t2i_seed{seed}_{request_id}"
    for name in (f"{stem}.png", f"{stem}_params.json", f"{stem}.zip"):
        assert name.replace(".", "") in files.replace(".", "").replace(" ", ""), (name, files)
    removes = page.locator("#t2i-files button[aria-label='Remove this file']")
    assert all(not removes.nth(i).is_visible() for i in range(removes.count()))
    # The next run clears the last one's status line before anything else.
    page.evaluate("""() => {
        window.statuses = [];
        new MutationObserver(() => {
            const text = document.querySelector('#t2i-status').innerText.trim();
            if (window.statuses[window.statuses.length - 1] !== text) window.statuses.push(text);
        }).observe(document.querySelector('#t2i-status'), {subtree: true, childList: true, characterData: true});
    }""")
    page.locator("#t2i-generate").click()
    deadline = time.time() + 90
    while time.time() < deadline and not any(t.startswith("Done") for t in page.evaluate("window.statuses")):
        time.sleep(0.1)
    statuses = page.evaluate("window.statuses")
    assert statuses[0] == "" and statuses[-1].startswith("Done"), statuses


def test_unknown_caption_keys_are_named_and_can_be_dropped(page):
    page.locator("#tab-t2i").get_by_role("tab", name="JSON", exact=True).click()
    page.locator("#t2i-code .cm-content").click()
    page.keyboard.press("Control+A")
    page.keyboard.press("Delete")
    page.keyboard.insert_text('{"subjects": [{"description": "a kite"}], "foo": "bar"}')
    wait_for_text(page, "#t2i-caption-message", "foo", timeout_s=15)
    page.locator("#t2i-drop-unknown").click()
    wait_for_text(page, "#t2i-caption-message", "Dropped foo", timeout_s=15)
    assert '"foo"' not in page.locator("#t2i-code").inner_text()


def test_a_400px_viewport_reaches_every_tab_and_stacks_the_picker(browser, studio, tmp_path):
    context = browser.new_context(viewport={"width": 400, "height": 800}, is_mobile=True, has_touch=True)
    page = context.new_page()
    try:
        page.goto(studio.url)
        page.wait_for_selector("#model-picker")
        page.wait_for_timeout(500)
        picker, panel = page.locator("#model-picker").bounding_box(), page.locator("#variant-panel").bounding_box()
        assert picker["y"] + picker["height"] <= panel["y"] + 1  # stacked, not squeezed side by side
        assert picker["width"] >= 300
        for label, elem in (("Text to Video", "tab-t2v"), ("Action", "tab-action"), ("Compare", "tab-compare"),
                            ("Text to Image", "tab-t2i")):
            tab = page.locator("#mode-tabs").get_by_role("tab", name=label, exact=True)
            assert tab.is_visible(), f"{label} is hidden behind a menu"
            tab.tap()
            page.wait_for_selector(f"#{elem}", state="visible", timeout=5_000)
        page.screenshot(path=str(tmp_path / "mobile.png"), full_page=True)
    finally:
        context.close()
