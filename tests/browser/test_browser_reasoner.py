"""The reasoner in the Studio (issue 13): Enhance on the T2V tab fills the caption editor and the filled
form generates; `/reason` over the scripting API with the tiny checkpoint's real reasoner.

The browser test scripts the reasoner's answer (a tiny random-weight reasoner never writes a caption);
everything else, the queue, the events, the editor and the generation, is the real app.
"""
import json
import re
import time

import imageio
import numpy as np
import pytest
from PIL import Image

from engine.reasoner.runtime import ChatOutput
from engine.events import JobCancelled
from engine.reasoner.runtime import reasoner_for as REAL_REASONER_FOR

playwright_api = pytest.importorskip("playwright.sync_api")

from harness import launched_studio, t2v_page  # noqa: E402

CAPTION = {"subjects": [{"description": "a red kite with a long tail", "action": "climbs and loops"}],
           "background_setting": "a windy beach at noon", "lighting": {"conditions": "hard midday sun"},
           "cinematography": {"camera_motion": "slow tilt up", "framing": "wide shot"},
           "actions": [{"time": "0:00-0:03", "description": "The kite climbs."}]}


class ScriptedReasoner:
    """Answers with CAPTION, a few characters per token, like the real backend streams."""

    def __init__(self):
        self.asked = []
        self.delay = 0.02
        self.emitted = 0  # tokens the last job streamed
        self.ended = None  # how the last job ended: "finished" | "cancelled"

    def video_config(self):
        return {"fps": 2, "min_frames": 2, "max_frames": 8, "temporal_patch_size": 1}

    def chat(self, system, text, *, image, video, max_new_tokens, temperature, seed, on_text=None, cancel=None):
        self.asked.append(text)
        answer = json.dumps(CAPTION)
        pieces = [answer[i:i + 12] for i in range(0, len(answer), 12)]
        self.emitted, self.ended = 0, None
        for count, piece in enumerate(pieces, 1):
            time.sleep(self.delay)
            if cancel is not None and cancel.is_set():  # as the real streamer: checked before each token
                self.ended = "cancelled"
                raise JobCancelled()
            self.emitted = count
            if on_text:
                on_text(piece, count)
        self.ended = "finished"
        return ChatOutput(answer, list(range(len(pieces))), 30, 0.01, 0.5)


@pytest.fixture(scope="module")
def scripted():
    import engine.reasoner.runtime as runtime

    backend = ScriptedReasoner()
    patch = pytest.MonkeyPatch()
    patch.setattr(runtime, "reasoner_for", lambda model, policy=None: backend)
    yield backend
    patch.undo()


@pytest.fixture(scope="module")
def studio(tiny_family, tmp_path_factory, scripted):
    argv = ["--outputs", str(tmp_path_factory.mktemp("reasoner-outputs")),
            "--cache-dir", str(tmp_path_factory.mktemp("reasoner-cache")), "--model", f"edge={tiny_family['edge']}"]
    with launched_studio(argv) as (studio, url):
        studio.url = url
        yield studio


def test_enhance_on_t2v_fills_the_form_and_the_form_generates(studio, scripted, tmp_path):
    with t2v_page(studio, tmp_path) as page:
        assert page.locator("#t2v-enhance").is_enabled()
        page.locator("#t2v-idea textarea").fill("a kite on a windy beach")
        page.locator("#t2v-enhance").click()
        deadline = time.time() + 60
        field = page.locator("#t2v-field-background_setting textarea")
        while time.time() < deadline and field.input_value() != "a windy beach at noon":
            time.sleep(0.1)
        assert field.input_value() == "a windy beach at noon"
        assert "Done" in page.locator("#t2v-reasoner-status").inner_text()
        assert "red kite" in page.locator("#t2v-reasoner-stream textarea").input_value()
        assert "a kite on a windy beach" in scripted.asked[-1]
        # The filled form is editable and generates.
        field.fill("a stormy beach at dusk")
        field.press("Tab")
        page.wait_for_timeout(500)
        page.locator("#t2v-sampling").click()
        box = page.locator("#t2v-steps input[type=number]").first
        box.fill("2")
        box.press("Enter")
        page.wait_for_timeout(300)
        page.locator("#t2v-generate").click()
        page.wait_for_selector("#t2v-output video", timeout=120_000)
        page.locator("#t2v-final-text").click()
        sent = page.locator("#t2v-prompt-text textarea").input_value()
        assert "a stormy beach at dusk" in sent and "a red kite with a long tail" in sent

        # Describe beside T2V's conditioning image and video fills the caption editor.
        frame = tmp_path / "frame.png"
        Image.new("RGB", (64, 48), (200, 40, 40)).save(frame)
        clip = tmp_path / "clip.mp4"
        imageio.mimwrite(clip, [np.full((48, 64, 3), 10 * i, np.uint8) for i in range(8)], fps=8)
        page.get_by_text("Start from an image or a video (optional)").click()
        for source, upload in (("image", frame), ("video", clip)):
            field.fill("something else")
            field.press("Tab")
            page.locator(f"#t2v-{source} input[type=file]").set_input_files(str(upload))
            page.wait_for_timeout(1000)
            page.locator(f"#t2v-describe-{source}").click()
            deadline = time.time() + 60
            while time.time() < deadline and field.input_value() != "a windy beach at noon":
                time.sleep(0.1)
            assert field.input_value() == "a windy beach at noon"
            assert f"Describe this {source}" in scripted.asked[-1]

        # Describe beside the Action tab's upload fills its instruction.
        page.get_by_role("tab", name="Action", exact=True).click()
        page.locator("#action-image input[type=file]").set_input_files(str(frame))
        page.wait_for_timeout(1000)
        page.locator("#action-describe-image").click()
        instruction = page.locator("#action-instruction textarea")
        deadline = time.time() + 60
        while time.time() < deadline and instruction.input_value() != "The kite climbs.":
            time.sleep(0.1)
        assert instruction.input_value() == "The kite climbs."


def _press_cancel_while_streaming(page, scripted, prefix: str) -> str:
    """Wait for streamed text, press the box's Cancel, and check that the engine job itself stopped
    (Gradio's `cancels=` alone would only stop the page's updates); the text shown at the end."""
    stream = page.locator(f"#{prefix}-reasoner-stream textarea")
    deadline = time.time() + 30
    while time.time() < deadline and not stream.input_value():
        time.sleep(0.05)
    assert stream.input_value()
    page.locator(f"#{prefix}-reasoner-cancel").click()
    status = page.locator(f"#{prefix}-reasoner-status")
    deadline = time.time() + 30
    while time.time() < deadline and "Cancelled after" not in status.inner_text():
        time.sleep(0.1)
    # The reasoner saw the cancel flag at its next token and raised; the status counts the tokens shown
    # (Cancel's handler and the job's own handler both say so; whichever lands last, the same words).
    assert scripted.ended == "cancelled"
    total = len(range(0, len(json.dumps(CAPTION)), 12))
    assert 0 < scripted.emitted < total
    shown_tokens = re.search(r"Cancelled after (\d+) tokens?; ", status.inner_text())
    assert shown_tokens and 0 < int(shown_tokens.group(1)) <= scripted.emitted
    page.wait_for_timeout(600)  # an update in flight, if any, lands
    shown = stream.input_value()
    page.wait_for_timeout(1500)  # three more token periods: nothing else may arrive
    assert stream.input_value() == shown and len(shown) < len(json.dumps(CAPTION))
    return shown


def test_cancel_stops_a_streaming_enhance_and_leaves_the_editor(studio, scripted, tmp_path):
    scripted.delay = 0.5
    try:
        with t2v_page(studio, tmp_path) as page:
            before = page.locator("#t2v-field-background_setting textarea").input_value()
            page.locator("#t2v-idea textarea").fill("a slow kite")
            page.locator("#t2v-enhance").click()
            _press_cancel_while_streaming(page, scripted, "t2v")
            assert page.locator("#t2v-field-background_setting textarea").input_value() == before

            # Describe beside the Action tab's upload has its own Cancel.
            frame = tmp_path / "frame.png"
            Image.new("RGB", (64, 48), (20, 40, 200)).save(frame)
            page.get_by_role("tab", name="Action", exact=True).click()
            instruction = page.locator("#action-instruction textarea").input_value()
            page.locator("#action-image input[type=file]").set_input_files(str(frame))
            page.wait_for_timeout(1000)
            page.locator("#action-describe-image").click()
            _press_cancel_while_streaming(page, scripted, "action")
            assert page.locator("#action-instruction textarea").input_value() == instruction
    finally:
        scripted.delay = 0.02


def test_reason_api_streams_from_the_real_tiny_reasoner(studio, scripted, monkeypatch, tmp_path):
    import numpy as np
    from gradio_client import Client, handle_file
    from PIL import Image

    import engine.reasoner.runtime as runtime

    monkeypatch.setattr(runtime, "reasoner_for", REAL_REASONER_FOR)
    frame = tmp_path / "frame.png"
    Image.fromarray((np.random.default_rng(0).random((48, 64, 3)) * 255).astype(np.uint8)).save(frame)
    client = Client(studio.url, verbose=False)
    result = client.predict("edge", json.dumps({"task": "critique", "prompt": "a kite", "max_new_tokens": 5,
                                                "temperature": 0}), handle_file(str(frame)), api_name="/reason")
    assert result["task"] == "critique" and result["tokens"] == 5 and set(result["scores"]) == {
        "prompt_adherence", "physics_plausibility"}
    with pytest.raises(Exception) as error:
        client.predict("edge", json.dumps({"task": "describe"}), None, api_name="/reason")
    assert "needs an image or a video" in str(error.value)
    with pytest.raises(Exception) as error:  # a refusal names the field, as /generate's do
        client.predict("edge", json.dumps({"task": "enhance", "prompt": "a kite", "max_new_tokens": 0}), None,
                       api_name="/reason")
    assert "max_new_tokens must be in 1..4096, got 0" in str(error.value)

