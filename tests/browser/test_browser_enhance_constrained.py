"""Issue 46 in Chromium: Enhance on the T2V tab with the tiny checkpoint's real, random-weight reasoner.
Decoded under the caption schema, its answer streams into the reasoner box and fills the caption editor
on the first attempt (without the schema such a reasoner never writes a caption)."""
import json
import time

import pytest

pytest.importorskip("llguidance")
playwright_api = pytest.importorskip("playwright.sync_api")

from harness import launched_studio, t2v_page  # noqa: E402


@pytest.fixture(scope="module")
def studio(tiny_family, tmp_path_factory):
    argv = ["--outputs", str(tmp_path_factory.mktemp("constrained-outputs")),
            "--cache-dir", str(tmp_path_factory.mktemp("constrained-cache")), "--model", f"edge={tiny_family['edge']}"]
    with launched_studio(argv) as (studio, url):
        studio.url = url
        yield studio


def test_enhance_with_random_weights_fills_the_caption_editor(studio, tmp_path):
    with t2v_page(studio, tmp_path) as page:
        page.locator("#t2v-idea textarea").fill("a kite on a windy beach")
        page.locator("#t2v-enhance").click()
        status = page.locator("#t2v-reasoner-status")
        deadline = time.time() + 240
        while time.time() < deadline and "Done" not in status.inner_text():
            assert "error" not in status.inner_text().lower(), status.inner_text()
            time.sleep(0.2)
        assert "Done" in status.inner_text()
        answer = json.loads(page.locator("#t2v-reasoner-stream textarea").input_value())
        field = page.locator("#t2v-field-background_setting textarea")
        # The editor shows the caption's text as written (a random-weight answer may end in a space; editing the
        # field back into the caption strips it, engine.pipeline.captions.form_to_caption).
        assert answer["background_setting"] and field.input_value() == answer["background_setting"]
