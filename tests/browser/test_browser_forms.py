"""Issue 45 in a real browser (Chromium): a form checked in one pass, one job status line, named
downloads, model switches that keep values, uploads that say how they are fitted, a locked Form on
broken JSON, Reuse seed, the results gallery and a 390 px phone layout.

Screenshots go to pytest's temporary folder, never into the repository.
"""
import time

import numpy as np
import pytest
from PIL import Image

playwright_api = pytest.importorskip("playwright.sync_api")

from harness import chromium_available, launched_studio  # noqa: E402
# The studio page's helpers, and its `browser` and `page` fixtures (each serves this module's `studio`).
from test_browser_studio import (  # noqa: E402, F401
    browser, open_tab, page, pick_model, restore_newest_after_reload, set_number, set_up_slow_action_run, wait_for_text)

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def studio(tiny_family, tmp_path_factory):
    if not chromium_available():
        pytest.skip("Chromium is missing: run scripts/ensure_chromium.sh (apt-get install chromium)")
    argv = ["--outputs", str(tmp_path_factory.mktemp("forms-outputs")),
            "--cache-dir", str(tmp_path_factory.mktemp("forms-cache")), "--queue-size", "4"]
    for name in ("nano", "nano-distilled", "edge"):
        argv += ["--model", f"{name}={tiny_family[name]}"]
    with launched_studio(argv) as (studio, url):
        studio.url = url
        yield studio


def number(page, elem_id: str) -> str:
    return page.locator(f"#{elem_id} input[type=number]").first.input_value()


def type_seed(page, prefix: str, seed: str) -> None:
    page.locator(f"#{prefix}-randomize input").uncheck()
    box = page.locator(f"#{prefix}-seed input, #{prefix}-seed textarea").first
    box.fill(seed)
    box.press("Tab")


# ---------------------------------------------------------------------------------------------
# 1. every bad field at once, at its control, in the page's words
# ---------------------------------------------------------------------------------------------

def test_every_bad_field_is_shown_at_once_at_its_control(page, studio, tmp_path):
    pick_model(page, "nano")
    open_tab(page, "Text to Video")
    page.locator("#t2v-sampling").click()
    set_number(page, "t2v-frames", 6)
    set_number(page, "t2v-fps", 0)
    set_number(page, "t2v-steps", 500)
    set_number(page, "t2v-guidance", -3)
    type_seed(page, "t2v", "99999999999999999999")
    page.locator("#t2v-generate").click()
    sampling = wait_for_text(page, "#t2v-sampling-message", "Seed", timeout_s=30)
    canvas = page.locator("#t2v-canvas-message").inner_text()
    page.screenshot(path=str(tmp_path / "all-errors.png"), full_page=True)
    assert "Steps must be in [1, 200], got 500" in sampling
    assert "Guidance scale must be in [0, 30], got -3" in sampling
    assert "got 99999999999999999999" in sampling and "e+" not in sampling
    assert "Frames must be in" in canvas and "FPS must be in (0, 120], got 0" in canvas
    for text in (sampling, canvas, page.locator("#t2v-status").inner_text()):
        assert "num_frames" not in text and "guidance_scale" not in text
    for elem in ("t2v-frames", "t2v-fps", "t2v-steps", "t2v-guidance", "t2v-seed"):
        assert "field-error" in (page.locator(f"#{elem}").get_attribute("class") or ""), elem
    # Each hint quotes the range its refusal quotes.
    steps_hint = page.locator("#t2v-steps").inner_text()
    for said in ("in [1, 200]", "at most 100 steps are allowed at this shift (flow shift 10)"):
        assert said in steps_hint.lower() and said in sampling
    assert "9223372036854775807" in page.locator("#t2v-seed").inner_text()
    assert "(0, 120]" in page.locator("#t2v-fps").inner_text()


# ---------------------------------------------------------------------------------------------
# 2. one status line from the click: the queue position within a second; Cancel clears
# ---------------------------------------------------------------------------------------------

def slow_action_request(image: str) -> dict:
    """A policy run that takes well over a second per step on the CPU, even with tiny weights."""
    return {"mode": "action", "prompt": "", "image": image, "steps": 100,
            "action": {"kind": "policy", "domain": "bridge_orig_lerobot", "chunk_size": 32, "resolution_tier": 720}}


def first_frame(tmp_path):
    path = tmp_path / "first-frame.png"
    Image.fromarray(np.tile(np.linspace(0, 255, 1280, dtype=np.uint8)[None, :, None], (720, 1, 3))).save(path)
    return path


def test_the_queue_position_shows_within_a_second_while_another_job_runs(page, studio, tmp_path):
    pick_model(page, "nano")
    page.locator("#t2i-sampling").click()
    set_number(page, "t2i-steps", 2)
    running = studio.service.queue.submit("nano", slow_action_request(str(first_frame(tmp_path))),
                                          session_id="someone-else")
    try:
        deadline = time.time() + 60
        while time.time() < deadline and running.position() != 0:
            time.sleep(0.1)
        clicked = time.time()
        page.locator("#t2i-generate").click()
        line = wait_for_text(page, "#t2i-progress", "Queued: position 2", timeout_s=5)
        assert time.time() - clicked < 1.5, line  # Playwright's click and polling take a few hundred ms
    finally:
        running.cancel()
    wait_for_text(page, "#t2i-status", "Done", timeout_s=120)
    assert page.locator("#t2i-progress").inner_text().strip() == ""


def test_cancel_clears_the_progress_and_preview_and_marks_the_result_cancelled(page, studio, tmp_path):
    set_up_slow_action_run(page, "nano", first_frame(tmp_path))
    page.locator("#action-generate").click()
    wait_for_text(page, "#action-progress", "Denoising: step", timeout_s=120)
    page.wait_for_selector("#action-live img", timeout=120_000)
    page.locator("#action-cancel").click()
    wait_for_text(page, "#action-status", "Cancelled", timeout_s=30)
    page.wait_for_timeout(1000)  # the job's own handler ends after Cancel's answer: nothing may come back
    page.screenshot(path=str(tmp_path / "cancelled.png"), full_page=True)
    assert page.locator("#action-progress").inner_text().strip() == ""
    assert not page.locator("#action-live").is_visible()
    assert "cancelled" in page.locator("#action-output").inner_text().lower()
    assert page.locator("#action-output video").count() == 0


# ---------------------------------------------------------------------------------------------
# 3. the media's own download icon saves the named file
# ---------------------------------------------------------------------------------------------

def test_the_results_own_download_icon_saves_the_named_file(page, studio, tmp_path):
    pick_model(page, "nano")
    page.locator("#t2i-sampling").click()
    set_number(page, "t2i-steps", 2)
    before = {p.name for p in studio.service.outputs_root.iterdir()}
    page.locator("#t2i-generate").click()
    wait_for_text(page, "#t2i-status", "Done", timeout_s=120)
    request_id = next(p.name for p in studio.service.outputs_root.iterdir() if p.name not in before)
    seed = page.locator("#t2i-used-seed textarea, #t2i-used-seed input").first.input_value()
    page.locator("#t2i-output").hover()
    with page.expect_download() as caught:
        page.locator("#t2i-output a[download], #t2i-output button[aria-label*='ownload']").first.click()
    assert caught.value.suggested_filename == f"nano_t2i_seed{seed}_{request_id}.png"


# ---------------------------------------------------------------------------------------------
# 4. a model switch sets aside what the new model cannot take, and brings it back
# ---------------------------------------------------------------------------------------------

def test_a_switch_sets_values_aside_and_restores_them_and_says_only_what_changed(page):
    pick_model(page, "nano")
    page.locator("#t2i-sampling").click()
    set_number(page, "t2i-steps", 20)
    set_number(page, "t2i-guidance", 3)
    pick_model(page, "nano-distilled")
    note = wait_for_text(page, "#switch-note", "fixed by the distilled", timeout_s=10)
    assert "steps 20 → 4" in note and "guidance 3 → 1" in note
    assert number(page, "t2i-steps") == "4"
    pick_model(page, "nano")
    note = wait_for_text(page, "#switch-note", "restored", timeout_s=10)
    assert number(page, "t2i-steps") == "20" and number(page, "t2i-guidance") == "3"
    assert "steps 4 → 20: restored" in note
    # Nano -> Edge changes nothing here: the note says nothing at all.
    pick_model(page, "edge")
    page.wait_for_timeout(500)
    assert page.locator("#switch-note").inner_text().strip() == ""
    assert number(page, "t2i-steps") == "20" and number(page, "t2i-guidance") == "3"


# ---------------------------------------------------------------------------------------------
# 6. broken JSON locks the Form visibly, the error at the top of the editor
# ---------------------------------------------------------------------------------------------

def test_broken_json_locks_the_form_with_the_error_at_the_top(page, tmp_path):
    page.locator("#tab-t2i").get_by_role("tab", name="JSON", exact=True).click()
    page.locator("#t2i-code .cm-content").click()
    page.keyboard.press("Control+A")
    page.keyboard.press("Delete")
    page.keyboard.insert_text('{"subjects": [{"description": "a kite"}], "context": "broken')
    message = wait_for_text(page, "#t2i-caption-message", "Line 1", timeout_s=15)
    assert message
    # The error is above the editor's controls, not below the fold.
    assert page.locator("#t2i-caption-message").bounding_box()["y"] < page.locator("#t2i-style").bounding_box()["y"]
    page.locator("#tab-t2i").get_by_role("tab", name="Form", exact=True).click()
    lock = wait_for_text(page, "#t2i-form-lock", "The Form is locked", timeout_s=10)
    assert "does not parse" in lock
    page.screenshot(path=str(tmp_path / "form-locked.png"), full_page=True)
    assert page.locator("#t2i-field-context textarea").is_disabled()
    # A fix unlocks it and the Form follows the JSON.
    page.locator("#tab-t2i").get_by_role("tab", name="JSON", exact=True).click()
    page.locator("#t2i-code .cm-content").click()
    page.keyboard.press("Control+A")
    page.keyboard.press("Delete")
    page.keyboard.insert_text('{"subjects": [{"description": "a kite"}], "context": "fixed"}')
    page.wait_for_timeout(1500)
    page.locator("#tab-t2i").get_by_role("tab", name="Form", exact=True).click()
    assert page.locator("#t2i-form-lock").inner_text().strip() == ""
    assert not page.locator("#t2i-field-context textarea").is_disabled()
    assert page.locator("#t2i-field-context textarea").input_value() == "fixed"


# ---------------------------------------------------------------------------------------------
# 5. the page says how an upload is fitted, the choice reaches the run, History shows the upload
# ---------------------------------------------------------------------------------------------

def test_an_upload_says_how_it_is_fitted_and_the_run_and_history_keep_the_choice(page, studio, tmp_path):
    import json

    wide = tmp_path / "wide.png"
    Image.fromarray(np.full((48, 64, 3), 120, np.uint8)).save(wide)  # 4:3 against a 1:1 canvas
    pick_model(page, "nano")
    open_tab(page, "Text to Video")
    page.locator("#t2v-resolution input").click()
    page.get_by_role("option").filter(has_text="64 x 64").first.click()
    page.get_by_text("Start from an image or a video (optional)").click()
    page.locator("#t2v-image input[type=file]").set_input_files(str(wide))
    note = wait_for_text(page, "#t2v-fit-note", "64x48", timeout_s=15)
    assert "centre-cropped" in note and "16 px of its width" in note
    page.locator("#t2v-fit").get_by_text("Letterbox", exact=False).click()
    note = wait_for_text(page, "#t2v-fit-note", "black", timeout_s=10)
    assert "64x48 inside 64x64" in note and "nothing is cut" in note
    page.locator("#t2v-sampling").click()
    set_number(page, "t2v-steps", 2)
    before = {p.name for p in studio.service.outputs_root.iterdir()}
    page.locator("#t2v-generate").click()
    wait_for_text(page, "#t2v-status", "Done", timeout_s=180)
    folder = next(p for p in studio.service.outputs_root.iterdir() if p.name not in before)
    params = json.loads((folder / "params.json").read_text())
    assert json.dumps(params).count('"fit": "letterbox"') >= 1  # the engine ran the choice
    # History restore shows the upload, not inside a folded section.
    restore_newest_after_reload(page)
    page.wait_for_selector("#t2v-image img", state="visible", timeout=15_000)
    assert page.locator("#t2v-fit input[value=letterbox]").is_checked()


# ---------------------------------------------------------------------------------------------
# 7. Reuse seed, the gallery of results, and a phone's 390 px
# ---------------------------------------------------------------------------------------------

def test_reuse_seed_and_the_gallery_of_results(page, studio):
    pick_model(page, "nano")
    page.locator("#t2i-sampling").click()
    set_number(page, "t2i-steps", 2)
    page.locator("#t2i-generate").click()
    wait_for_text(page, "#t2i-status", "Done", timeout_s=120)
    used = page.locator("#t2i-used-seed textarea, #t2i-used-seed input").first.input_value()
    assert page.locator("#t2i-randomize input").is_checked()
    page.locator("#t2i-reuse-seed").click()
    page.wait_for_timeout(500)
    assert not page.locator("#t2i-randomize input").is_checked()
    assert page.locator("#t2i-seed input, #t2i-seed textarea").first.input_value() == used
    # The gallery shows this browser's results as large tiles; a pick restores the result.
    page.locator("#results-gallery-box").click()
    tiles = page.locator("#results-gallery .thumbnail-item, #results-gallery button.thumbnail-item")
    deadline = time.time() + 15
    while time.time() < deadline and tiles.count() < 1:
        time.sleep(0.1)
    assert tiles.count() >= 1
    assert tiles.first.bounding_box()["width"] >= 150  # a gallery, not the History strip's thumbnails
    assert f"seed {used}" in page.locator("#results-gallery").inner_text()


def _cut_labels(page) -> list[str]:
    """Control labels on screen whose text is cut off (wider than their box) or past the viewport's edge."""
    return page.evaluate("""() => {
        const out = [];
        const width = document.documentElement.clientWidth;
        for (const el of document.querySelectorAll(
                '[data-testid=block-info], label span, .seed-row label')) {
            const box = el.getBoundingClientRect();
            if (!box.width || !el.offsetParent || !el.innerText.trim()) continue;
            if (el.scrollWidth > el.clientWidth + 1 || box.right > width + 1) out.push(el.innerText.trim());
        }
        return out;
    }""")


def test_a_390px_phone_shows_whole_labels_and_the_tabs_on_one_row(browser, studio, tmp_path):
    context = browser.new_context(viewport={"width": 390, "height": 844}, is_mobile=True, has_touch=True)
    page = context.new_page()
    try:
        page.goto(studio.url)
        page.wait_for_selector("#model-picker")
        page.wait_for_timeout(800)
        page.screenshot(path=str(tmp_path / "phone-top.png"))
        tabs = page.locator("#mode-tabs > .tab-wrapper button[role=tab]")  # the page's tabs, not a tab's own
        rows = {round(tabs.nth(i).bounding_box()["y"]) for i in range(tabs.count()) if tabs.nth(i).is_visible()}
        assert tabs.count() >= 4 and len(rows) == 1, rows  # one row (it scrolls sideways), not a stack of rows
        page.locator("#t2i-sampling").click()
        page.wait_for_timeout(500)
        page.locator("#t2i-randomize").scroll_into_view_if_needed()
        page.screenshot(path=str(tmp_path / "phone-seed.png"))
        cut = _cut_labels(page)
        assert cut == [], cut
        for elem in ("t2i-randomize", "t2i-example", "t2i-reuse-seed"):
            box = page.locator(f"#{elem}").bounding_box()
            assert box["x"] >= 0 and box["x"] + box["width"] <= 390 + 1, (elem, box)
        page.screenshot(path="/tmp/h45/phone-full.png", full_page=True)
    finally:
        context.close()
