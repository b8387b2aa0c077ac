"""Review mode in a real browser (Playwright driving Debian's Chromium) against tiny models.

- Review lists results made before review mode was switched on (and says why a folder cannot be
  reviewed); a rating is saved under the login, with no name box on the page.
- Compare three models with one seed, rate one result, reload, and find the rating again.
- Blind mode: neither the DOM nor any network response names the configurations; a choice is
  recorded and shows on the leaderboard. The run's HTML report opens offline with every configuration.
- Blind videos play in sync from one control; the pair is revealed only after the vote is stored.
- Two pages: the studio (generate tabs, history) and the review desk (its six tabs), linked both ways.

Screenshots go to pytest's temporary folder, never into the repository.
"""
import json
import re

import pytest

playwright_api = pytest.importorskip("playwright.sync_api")

from harness import browser_page, chromium_available, chromium_browser, launched_studio  # noqa: E402

pytestmark = pytest.mark.browser

MODELS = ("nano", "edge", "super-distilled")
USER, PASSWORD = "alice", "kite-42"
CONFIGS = [{"name": "cfg-sun", "model": "nano", "overrides": {"steps": 1}},
           {"name": "cfg-moon", "model": "edge", "overrides": {"steps": 1}}]


def make_earlier_results(tiny_family, outputs):
    """Results made by a plain (public) run before review mode was switched on, and a broken folder."""
    from engine.serving.queue import JobQueue
    from engine.serving.registry import ModelEntry, ModelRegistry

    queue = JobQueue(ModelRegistry([ModelEntry("nano", str(tiny_family["nano"]))]), outputs)
    try:
        result = queue.submit("nano", {"mode": "t2i", "prompt": "An earlier lighthouse at dusk.", "steps": 1,
                                       "seed": 8}).result(timeout=300)
    finally:
        queue.close()
    broken = outputs / "20261130-080000-00000000beef"
    broken.mkdir()
    (broken / "params.json").write_text("{not json")
    return result.request_id, broken.name


@pytest.fixture(scope="module")
def studio(tiny_family, tmp_path_factory):
    if not chromium_available():
        pytest.skip("Chromium is missing: run scripts/ensure_chromium.sh (apt-get install chromium)")
    outputs = tmp_path_factory.mktemp("review-outputs")
    earlier, broken = make_earlier_results(tiny_family, outputs)
    argv = ["--review", "--auth", f"{USER}:{PASSWORD}", "--outputs", str(outputs),
            "--cache-dir", str(tmp_path_factory.mktemp("review-cache")), "--queue-size", "4"]
    for name in MODELS:
        argv += ["--model", f"{name}={tiny_family[name]}"]
    with launched_studio(argv) as (studio, url):
        studio.url, studio.earlier, studio.broken = url, earlier, broken
        yield studio


@pytest.fixture
def page(studio, tmp_path):
    with chromium_browser() as browser, browser_page(browser, tmp_path) as page:
        yield page


def log_in(page, url):
    page.goto(url)
    page.get_by_label("username").fill(USER)
    page.get_by_label("password").fill(PASSWORD)
    page.get_by_role("button", name="Login").click()
    page.wait_for_selector("#model-picker")


def pick(page, elem_id: str, option: str) -> None:
    page.locator(f"#{elem_id} input").click()
    page.get_by_role("option", name=re.compile(re.escape(option))).click()


def wait_text(page, elem_id: str, text: str, timeout: int = 30_000) -> None:
    page.wait_for_function(f"() => (document.querySelector('#{elem_id}')?.innerText || '').includes({text!r})",
                           timeout=timeout)


def open_desk(page, url) -> None:
    """The review desk's own page (cosmos3_ui/layout.py, REVIEW_PATH)."""
    page.goto(url + "review")
    page.wait_for_selector("#review-tabs")


def draw_blind_pair(page, url, run_id: str) -> None:
    """Logged in at the review desk's Blind tab, the next pair of `run_id` drawn."""
    log_in(page, url)
    open_desk(page, url)
    page.get_by_role("tab", name="Blind").click()
    pick(page, "blind-run", run_id)
    page.locator("#blind-draw").click()
    wait_text(page, "blind-status", "left for you")


def open_review_and_pick(page, request_id: str) -> None:
    page.locator("#review-tabs").get_by_role("tab", name="Review").click()
    pick(page, "review-result", request_id)
    wait_text(page, "review-status", "so far")


def test_review_lists_earlier_results_and_rates_under_the_login(page, studio, tmp_path):
    log_in(page, studio.url)
    open_desk(page, studio.url)
    page.get_by_role("tab", name="Review").click()
    wait_text(page, "review-signed-in", USER)
    # The result made before review mode is in the gallery and the list; the broken folder says why.
    page.wait_for_function(f"() => document.querySelector('#review-gallery').innerText.includes({studio.earlier!r})")
    assert "An earlier lighthouse" in page.locator("#review-gallery").inner_text()
    page.get_by_text("Results that cannot be reviewed").click()
    unreviewable = page.locator("#review-unreviewable").inner_text()
    assert studio.broken in unreviewable and "params.json cannot be read" in unreviewable
    open_review_and_pick(page, studio.earlier)
    # No box on the page carries a reviewer name: the login is the reviewer.
    assert page.locator("#review-reviewer").count() == 0
    assert page.locator(f"input[value='{USER}'], textarea").evaluate_all(
        "els => els.filter(e => e.value === 'alice').length") == 0
    page.locator("#review-score-visual_quality").get_by_label("3").check()
    page.locator("#review-save").click()
    wait_text(page, "review-status", "Saved")
    ratings = studio.service.reviews.ratings(studio.earlier)
    assert [(r["reviewer"], r["scores"]) for r in ratings] == [(USER, {"visual_quality": 3})]
    page.screenshot(path=str(tmp_path / "review-list.png"), full_page=True)


def test_compare_then_rate_a_result_and_see_it_after_a_reload(page, studio, tmp_path):
    log_in(page, studio.url)
    open_desk(page, studio.url)
    page.get_by_role("tab", name="Compare").click()
    page.locator("#compare-prompt textarea").fill("A red kite over a windy beach.")
    page.locator("#compare-run").click()
    wait_text(page, "compare-status", "3 of 3", timeout=120_000)
    titles = [page.locator(f"#compare-title-{i}").inner_text() for i in range(3)]
    seeds = {re.search(r"seed (\d+)", t).group(1) for t in titles}
    assert [t.split(" ·")[0] for t in titles] == list(MODELS) and len(seeds) == 1
    compared = [r for r in studio.service.reviews.results() if r["origin"] == "compare"]
    assert len(compared) == 3
    request_id = next(r["request_id"] for r in compared if r["model"] == "edge")

    open_review_and_pick(page, request_id)
    page.locator("#review-score-prompt_adherence").get_by_label("4").check()
    page.locator("#review-score-visual_quality").get_by_label("2").check()
    page.locator("#review-notes textarea").fill("The kite is lost in the noise.")
    page.locator("#review-save").click()
    wait_text(page, "review-status", "Saved")
    assert studio.service.reviews.ratings(request_id)[0]["scores"] == {"prompt_adherence": 4, "visual_quality": 2}

    page.reload()
    page.wait_for_selector("#review-tabs")
    open_review_and_pick(page, request_id)
    table = page.locator("#review-ratings").inner_text()
    assert USER in table and "The kite is lost in the noise." in table
    assert page.locator("#review-score-prompt_adherence").get_by_label("4").is_checked()
    assert page.locator("#review-notes textarea").input_value() == "The kite is lost in the noise."


def test_blind_mode_names_nothing_then_the_choice_reaches_the_leaderboard_and_the_offline_report(page, studio,
                                                                                                 tmp_path):
    from cosmos3_ui.review.report import html_report
    from cosmos3_ui.review.runs import run_suite
    from cosmos3_ui.review.suites import parse_configurations, parse_suite

    store = studio.service.reviews
    suite = parse_suite(json.dumps({"id": "kite", "mode": "t2i", "prompt": "A red kite over a beach.", "seed": 2}))
    run = store.runs.create("blind-mini", suite, parse_configurations(json.dumps(CONFIGS), list(MODELS)),
                            reference=None, repeat=False, reviewer=USER)
    assert run_suite(store.runs, studio.service.queue, run.run_id) == (2, 2)
    secrets = ["cfg-sun", "cfg-moon", *[r["request_id"] for r in store.runs.items(run.run_id)]]

    bodies = []

    def keep(response):
        try:
            bodies.append(response.text())
        except Exception:  # noqa: BLE001 - binary or streamed bodies (images) carry no names
            pass

    page.on("response", keep)
    draw_blind_pair(page, studio.url, run.run_id)
    page.wait_for_function("() => [...document.querySelectorAll('#blind-image-A img, #blind-image-B img')]"
                           ".filter(i => i.complete && i.naturalWidth > 0).length == 2")
    dom = page.content()
    for secret in secrets:
        assert secret not in dom, (secret, dom[max(0, dom.find(secret) - 600):dom.find(secret) + 100])
        assert not [b for b in bodies if secret in b], secret
    assert [u for u in re.findall(r"/gradio_api/file=[^\"' ]+", dom) if "/A.png" in u or "/B.png" in u]
    page.screenshot(path=str(tmp_path / "blind.png"), full_page=True)

    page.locator("#blind-choice-visual_quality").get_by_label("A", exact=True).check()
    page.locator("#blind-note textarea").fill("A is sharper.")
    page.locator("#blind-save").click()
    wait_text(page, "blind-status", "Recorded 1 of")
    [judgement] = store.pairs.judgements(run.run_id)
    assert judgement["reviewer"] == USER and judgement["choices"] == {"visual_quality": "A"}
    winner = judgement["config_a"]

    page.get_by_role("tab", name="Leaderboard").click()
    pick(page, "board-run", run.run_id)
    pick(page, "board-criterion", "Visual quality")
    wait_text(page, "board-table", "cfg-moon")
    wait_text(page, "board-table", "cfg-sun")
    page.screenshot(path=str(tmp_path / "leaderboard.png"), full_page=True)
    table = page.locator("#board-table").inner_text()
    # One judgement ranks nothing: the board says so, and no interval is a point.
    assert table.count("too few judgements") == 2 and "+3.39 .. +3.39" not in table
    status = page.locator("#board-status").inner_text()
    assert "1 judgement(s)" in status and "Too few judgements to rank: cfg-moon vs cfg-sun: 1" in status
    assert winner in ("cfg-sun", "cfg-moon")

    # The report: one file, opened with every network request refused; every configuration is shown.
    report = tmp_path / "report.html"
    report.write_text(html_report(store, store.runs.run(run.run_id)), encoding="utf-8")
    refused = []
    page.context.route("**/*", lambda route: route.continue_() if route.request.url.startswith("file:")
                       else (refused.append(route.request.url), route.abort()))
    page.goto(report.as_uri())
    text = page.locator("body").inner_text()
    assert "cfg-sun" in text and "cfg-moon" in text
    loaded = page.locator(".grid img").evaluate_all("imgs => imgs.filter(i => i.complete && i.naturalWidth > 0).length")
    assert loaded == 2 and refused == []
    page.screenshot(path=str(tmp_path / "report.png"), full_page=True)


def top_tabs(page, tabs_id: str) -> list[str]:
    """The labels of a Tabs' own tab strip (its first tab list; nested tabs, such as the caption editor's, are
    further down)."""
    return page.evaluate(f"""() => [...document.querySelector('#{tabs_id} [role=tablist]').querySelectorAll('[role=tab]')]
                                  .map(t => t.innerText.trim())""")


def test_the_studio_and_the_review_desk_are_two_linked_pages_each_with_its_own_tabs(page, studio):
    log_in(page, studio.url)
    assert top_tabs(page, "mode-tabs") == ["Text to Image", "Text to Video", "Action"]
    assert page.locator("#history").count() == 1 and page.locator("#review-tabs").count() == 0
    page.locator("#to-review-desk").click()
    page.wait_for_selector("#review-tabs")
    assert page.url.rstrip("/").endswith("/review")
    assert top_tabs(page, "review-tabs") == ["Review", "Blind", "Suites", "Leaderboard", "Batch", "Compare"]
    for studio_only in ("#model-picker", "#history", "#mode-tabs", "#tab-t2i"):
        assert page.locator(studio_only).count() == 0, studio_only
    page.locator("#to-studio").click()
    page.wait_for_selector("#model-picker")
    assert page.locator("#review-tabs").count() == 0


VIDEO_CONFIGS = [{"name": "cfg-tide", "model": "nano", "overrides": {"steps": 1, "num_frames": 17}},
                 {"name": "cfg-reef", "model": "edge", "overrides": {"steps": 1, "num_frames": 17}}]


def videos_state(page) -> dict:
    return page.evaluate("""() => {
        const [a, b] = ['A', 'B'].map(s => document.querySelector(`#blind-video-${s} video`));
        return {paused: [a.paused, b.paused], times: [a.currentTime, b.currentTime], ready: [a.readyState, b.readyState]};
    }""")


def test_a_blind_video_pair_plays_in_sync_and_is_revealed_only_after_the_vote(page, studio, tmp_path):
    from cosmos3_ui.review.runs import run_suite
    from cosmos3_ui.review.suites import parse_configurations, parse_suite

    store = studio.service.reviews
    suite = parse_suite(json.dumps({"id": "tide", "mode": "t2v", "prompt": "Waves roll onto a pebble beach.", "seed": 4}))
    run = store.runs.create("blind-video", suite, parse_configurations(json.dumps(VIDEO_CONFIGS), list(MODELS)),
                            reference=None, repeat=False, reviewer=USER)
    assert run_suite(store.runs, studio.service.queue, run.run_id) == (2, 2)
    draw_blind_pair(page, studio.url, run.run_id)
    page.wait_for_function("() => [...document.querySelectorAll('#blind-video-A video, #blind-video-B video')]"
                           ".filter(v => v.readyState >= 2).length == 2")
    # No reveal before the vote: the server refuses, and nothing names a configuration.
    page.locator("#blind-reveal").click()
    wait_text(page, "blind-status", "Save your choice first")
    assert "cfg-" not in page.content()

    page.locator("#blind-play").click()  # one control starts both, from the same time
    page.wait_for_function("() => [...document.querySelectorAll('#blind-video-A video, #blind-video-B video')]"
                           ".every(v => !v.paused && v.currentTime > 0)")
    playing = videos_state(page)
    assert playing["paused"] == [False, False] and abs(playing["times"][0] - playing["times"][1]) < 0.2, playing
    page.locator("#blind-play").click()  # and pauses both at the same time
    page.wait_for_function("() => [...document.querySelectorAll('#blind-video-A video, #blind-video-B video')]"
                           ".every(v => v.paused)")
    paused = videos_state(page)
    assert abs(paused["times"][0] - paused["times"][1]) < 0.05, paused
    page.screenshot(path=str(tmp_path / "blind-video.png"), full_page=True)

    page.locator("#blind-choice-visual_quality").get_by_label("B", exact=True).check()
    page.locator("#blind-save").click()
    wait_text(page, "blind-status", "Recorded 1 of")
    [judgement] = store.pairs.judgements(run.run_id)
    page.locator("#blind-reveal").click()
    wait_text(page, "blind-revealed", "A was")
    revealed = page.locator("#blind-revealed").inner_text()
    models = {c["name"]: c["model"] for c in VIDEO_CONFIGS}
    assert (f"A was {judgement['config_a']} ({models[judgement['config_a']]})" in revealed and
            f"B was {judgement['config_b']} ({models[judgement['config_b']]})" in revealed)


class RefusingQueue:
    """The studio's queue, refusing one prompt the way the engine refuses a request."""

    def __init__(self, queue, prompt: str):
        self.queue, self.outputs_root, self.prompt = queue, queue.outputs_root, prompt

    def submit(self, model, request, **kwargs):
        if request["prompt"] == self.prompt:
            raise ValueError("steps: refused for this test")
        return self.queue.submit(model, request, **kwargs)


def test_the_suites_tab_shows_a_failed_task_with_its_configuration_and_reason(page, studio):
    from cosmos3_ui.review.runs import run_suite
    from cosmos3_ui.review.suites import parse_configurations, parse_suite

    store = studio.service.reviews
    suite = parse_suite("\n".join(json.dumps({"id": i, "mode": "t2i", "prompt": f"A {i} on a table.", "seed": 1})
                                  for i in ("mug", "vase")))
    run = store.runs.create("failing", suite, parse_configurations(json.dumps(CONFIGS), list(MODELS)),
                            reference=None, repeat=False, reviewer=USER)
    assert run_suite(store.runs, RefusingQueue(studio.service.queue, "A vase on a table."), run.run_id) == (2, 4)
    log_in(page, studio.url)
    open_desk(page, studio.url)
    page.get_by_role("tab", name="Suites").click()
    wait_text(page, "suites-runs", run.run_id)
    runs = page.locator("#suites-runs").inner_text()
    assert "failed: 2 items; Resume retries them" in runs and "interrupted" not in runs.split(run.run_id)[1][:200]
    failed = page.locator("#suites-failed").inner_text()
    for text in ("vase", "cfg-sun", "cfg-moon", "steps: refused for this test"):
        assert text in failed, text
