"""Review mode in a real browser (Playwright driving Debian's Chromium) against tiny models: log in,
compare three models with one seed, rate one result, reload, and find the rating again.

Screenshots go to pytest's temporary folder, never into the repository.
"""
import re

import pytest

playwright_api = pytest.importorskip("playwright.sync_api")

from harness import CHROMIUM, CHROMIUM_ARGS, browser_page, chromium_available, launched_studio  # noqa: E402

pytestmark = pytest.mark.browser

MODELS = ("nano", "edge", "super-distilled")
USER, PASSWORD = "ann", "kite-42"


@pytest.fixture(scope="module")
def studio(tiny_family, tmp_path_factory):
    if not chromium_available():
        pytest.skip("Chromium is missing: run scripts/ensure_chromium.sh (apt-get install chromium)")
    argv = ["--review", "--auth", f"{USER}:{PASSWORD}", "--outputs", str(tmp_path_factory.mktemp("review-outputs")),
            "--cache-dir", str(tmp_path_factory.mktemp("review-cache")), "--queue-size", "4"]
    for name in MODELS:
        argv += ["--model", f"{name}={tiny_family[name]}"]
    with launched_studio(argv) as (studio, url):
        studio.url = url
        yield studio


@pytest.fixture
def page(studio, tmp_path):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            with browser_page(browser, tmp_path) as page:
                yield page
        finally:
            browser.close()


def open_review_and_pick(page, request_id: str) -> None:
    page.get_by_role("tab", name="Review").click()
    page.locator("#review-result input").click()
    page.get_by_role("option", name=re.compile(re.escape(request_id))).click()
    page.wait_for_function("() => (document.querySelector('#review-status')?.innerText || '').includes('so far')")


def test_compare_then_rate_a_result_and_see_it_after_a_reload(page, studio, tmp_path):
    page.goto(studio.url)
    page.get_by_label("username").fill(USER)
    page.get_by_label("password").fill(PASSWORD)
    page.get_by_role("button", name="Login").click()
    page.wait_for_selector("#model-picker")

    # Compare: the first three models are picked by default; one seed for all.
    page.get_by_role("tab", name="Compare").click()
    page.locator("#compare-prompt textarea").fill("A red kite over a windy beach.")
    page.locator("#compare-run").click()
    page.wait_for_function("() => (document.querySelector('#compare-status')?.innerText || '').includes('3 of 3')",
                           timeout=90_000)
    titles = [page.locator(f"#compare-title-{i}").inner_text() for i in range(3)]
    seeds = {re.search(r"seed (\d+)", t).group(1) for t in titles}
    assert [t.split(" ·")[0] for t in titles] == list(MODELS) and len(seeds) == 1
    page.screenshot(path=str(tmp_path / "compare.png"), full_page=True)
    compared = [r for r in studio.service.reviews.results() if r["origin"] == "compare"]
    assert len(compared) == 3
    request_id = next(r["request_id"] for r in compared if r["model"] == "edge")

    # Rate the Edge result.
    open_review_and_pick(page, request_id)
    assert page.locator("#review-reviewer input, #review-reviewer textarea").first.input_value() == USER
    page.locator("#review-score-prompt_adherence").get_by_label("4").check()
    page.locator("#review-score-visual_quality").get_by_label("2").check()
    page.locator("#review-notes textarea").fill("The kite is lost in the noise.")
    page.locator("#review-save").click()
    page.wait_for_function("() => (document.querySelector('#review-status')?.innerText || '').includes('Saved')")
    assert studio.service.reviews.ratings(request_id)[0]["scores"] == {"prompt_adherence": 4, "visual_quality": 2}

    # Reload: still logged in; the rating is shown again, and the reviewer's own choices are filled in.
    page.reload()
    page.wait_for_selector("#model-picker")
    open_review_and_pick(page, request_id)
    table = page.locator("#review-ratings").inner_text()
    assert USER in table and "The kite is lost in the noise." in table
    assert page.locator("#review-score-prompt_adherence").get_by_label("4").is_checked()
    assert page.locator("#review-score-visual_quality").get_by_label("2").is_checked()
    assert page.locator("#review-notes textarea").input_value() == "The kite is lost in the noise."
    page.screenshot(path=str(tmp_path / "review.png"), full_page=True)
