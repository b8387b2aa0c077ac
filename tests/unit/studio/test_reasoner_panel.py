"""Where a checkpoint has no reasoner, the Studio's reasoner controls are disabled and say why, and the
engine refuses a reasoner job for it at once (issue 13: "where none is present, the control says why")."""
import pytest

import app
import engine
from cosmos3_ui.reasoner_panel import availability


@pytest.fixture(scope="module")
def bare_root(tiny_family, tmp_path_factory):
    """The tiny Edge checkpoint without its reasoner: the generator's files only (as a hub id fetches)."""
    root = tmp_path_factory.mktemp("edge-no-reasoner")
    for item in tiny_family["edge"].iterdir():
        if item.name not in ("config.json", "model.safetensors", "generation_config.json"):
            (root / item.name).symlink_to(item)
    return root


def _components(blocks) -> dict:
    return {b.elem_id: b for b in blocks.blocks.values() if getattr(b, "elem_id", None)}


def test_controls_are_disabled_and_say_why_without_a_reasoner(tiny_family, bare_root, tmp_path):
    argv = ["--outputs", str(tmp_path / "out"), "--cache-dir", str(tmp_path / "cache"),
            "--model", f"bare={bare_root}", "--model", f"edge={tiny_family['edge']}"]
    studio = app.create_studio(app.parse_args(argv))
    try:
        shown = _components(studio.blocks)
        for button in ("t2i-enhance", "t2v-enhance", "t2v-describe-image", "t2v-describe-video",
                       "action-describe-image", "action-describe-video"):
            assert shown[button].interactive is False, button
        for note in ("t2i-reasoner-note", "t2v-reasoner-note", "action-reasoner-note"):
            assert shown[note].visible and "no reasoner" in shown[note].value and "config.json" in shown[note].value
        # Switching the model picker re-reads it: the same words for the bare model, none for Edge.
        assert availability(studio.service, "bare") == (False, shown["t2v-reasoner-note"].value)
        assert availability(studio.service, "edge") == (True, "")
        # The engine refuses the job at submit (no model load first), saying why.
        with pytest.raises(engine.RequestError) as error:
            studio.service.queue.submit("bare", {"task": "enhance", "prompt": "a kite"})
        assert "no reasoner" in str(error.value)
    finally:
        studio.service.queue.close()
