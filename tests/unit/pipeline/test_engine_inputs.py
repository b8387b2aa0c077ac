"""Bad media and model sources are refused with specific messages (the engine side of the catalogue)."""
import json

import numpy as np
import pytest
from PIL import Image

import engine
from engine.pipeline.media import load_actions_file, load_image, load_video
from engine.serving.registry import ModelEntry, ModelRegistry


@pytest.fixture
def files(tmp_path):
    good = tmp_path / "frame.png"
    Image.fromarray(np.zeros((32, 48, 3), np.uint8)).save(good)
    (tmp_path / "corrupt.png").write_bytes(b"\x89PNG\r\n\x1a\nnot really a png")
    (tmp_path / "empty.jpg").write_bytes(b"")
    (tmp_path / "notes.txt").write_text("hello")
    (tmp_path / "clip.mp4").write_bytes(b"\x00\x00\x00\x18ftypmp42 broken")
    return tmp_path


@pytest.mark.parametrize("name,fragment", [
    ("corrupt.png", "could not be decoded"),
    ("empty.jpg", "is empty"),
    ("notes.txt", "has type '.txt'; allowed"),
    ("missing.png", "does not exist"),
])
def test_bad_images(files, name, fragment):
    with pytest.raises(ValueError, match=fragment):
        load_image(files / name)


def test_image_pixel_cap(files, monkeypatch):
    from engine.pipeline import media

    monkeypatch.setattr(media, "MAX_IMAGE_PIXELS", 32 * 32)
    with pytest.raises(ValueError, match="at most 1,024 pixels"):
        load_image(files / "frame.png")


def test_nul_in_file_name_and_bad_video(files):
    with pytest.raises(ValueError, match="NUL"):
        load_image(str(files / "frame.png") + "\x00.png")
    with pytest.raises(ValueError, match="could not be decoded"):
        load_video(files / "clip.mp4")
    with pytest.raises(ValueError, match=r"must be \[T, H, W, 3\]"):
        load_video(np.zeros((4, 4, 3)))


@pytest.mark.parametrize("content,suffix,fragment", [
    ([[0.1] * 10] * 4, ".json", None),
    ({"actions": [[0.1] * 10] * 3}, ".json", None),
    ([[0.1] * 9] * 4, ".json", "takes exactly 10"),
    ([[0.1] * 70] * 4, ".json", "wider than the model's action width 64"),
    ("x,y\n1,2\n", ".csv", "takes exactly 10"),
    ("x0,x1,x2,x3,x4,x5,x6,x7,x8,g\n" + "\n".join(",".join(["0.5"] * 10) for _ in range(3)), ".csv", None),
    (",".join(["0.5"] * 10) + "\nfoo,bar\n", ".csv", "could not be read as CSV"),
    (np.zeros((3, 10)), ".npy", None),
    (np.zeros((3, 10, 2)), ".npy", "must be 2-D"),
    ("{not json", ".json", "could not be read as JSON"),
    ("[]", ".json", "non-empty list"),
])
def test_action_files(tmp_path, content, suffix, fragment):
    path = tmp_path / f"actions{suffix}"
    if suffix == ".npy":
        np.save(path, content)
    elif isinstance(content, str):
        path.write_text(content)
    else:
        path.write_text(json.dumps(content))
    if fragment is None:
        rows = load_actions_file(path, "bridge_orig_lerobot")
        assert len(rows[0]) == 10
    else:
        with pytest.raises(ValueError, match=fragment):
            load_actions_file(path, "bridge_orig_lerobot")


def test_pickled_npy_is_refused(tmp_path):
    path = tmp_path / "actions.npy"
    np.save(path, np.array([{"evil": 1}], dtype=object), allow_pickle=True)
    with pytest.raises(ValueError, match="could not be read as NPY"):
        load_actions_file(path, "bridge_orig_lerobot")


def test_generate_refuses_a_corrupt_upload(tiny_family, files):
    model = engine.load_model(tiny_family["edge"], device="cpu")
    with pytest.raises(ValueError, match="could not be decoded"):
        engine.generate(model, dict(mode="i2v", prompt="a boat", image=str(files / "corrupt.png"), steps=1))


def test_model_sources_must_stay_inside_the_allowed_roots(tiny_family, tmp_path):
    root = tiny_family["nano"].parent
    ModelRegistry([ModelEntry("nano", str(tiny_family["nano"]))], allowed_roots=[str(root)])
    with pytest.raises(ValueError, match="outside the allowed model folders"):
        ModelRegistry([ModelEntry("x", str(root / ".." / ".." / "etc"))], allowed_roots=[str(root)])
    with pytest.raises(ValueError, match="outside the allowed model folders"):
        ModelRegistry([ModelEntry("x", "/etc")], allowed_roots=[str(root)])
    with pytest.raises(ValueError, match="hub sources are turned off"):
        ModelRegistry([ModelEntry("x", "nvidia/Cosmos3-Nano")], allowed_roots=[str(root)], allow_hub=False)
    with pytest.raises(ValueError, match="repeated: \\['a'\\]"):
        ModelRegistry([ModelEntry("a", str(tiny_family["nano"])), ModelEntry("a", str(tiny_family["edge"]))])
