"""How a conditioning upload meets the canvas: the request's `fit` (crop, letterbox, resize), validated
once and honoured by the conditioning stage."""
import numpy as np
import pytest
from PIL import Image

import engine
from engine.pipeline.conditioning import fitted_image
from engine.pipeline.media import fit_image


def _wide(tmp_path):
    """A 640x480 image: white, with a red left quarter and a blue right quarter."""
    pixels = np.full((480, 640, 3), 255, np.uint8)
    pixels[:, :160] = (255, 0, 0)
    pixels[:, 480:] = (0, 0, 255)
    path = tmp_path / "wide.png"
    Image.fromarray(pixels).save(path)
    return path


def test_fit_is_validated_once_with_the_references_default(tiny_family, tmp_path):
    info = engine.inspect_checkpoint(tiny_family["nano"])
    image = str(_wide(tmp_path))
    assert engine.validate_request(info, "i2v", {"prompt": "x", "image": image}).fit == "crop"
    assert engine.validate_request(info, "i2v", {"prompt": "x", "image": image, "fit": "letterbox"})["fit"] == "letterbox"
    assert engine.validate_request(info, "t2v", {"prompt": "x"}).fit is None
    with pytest.raises(ValueError) as caught:
        engine.validate_request(info, "i2v", {"prompt": "x", "image": image, "fit": "squash"})
    assert caught.value.field == "fit" and "['crop', 'letterbox', 'resize']" in str(caught.value)
    with pytest.raises(ValueError) as caught:
        engine.validate_request(info, "t2i", {"prompt": "x", "fit": "crop"})
    assert caught.value.field == "fit"


def test_each_fit_puts_the_upload_on_the_canvas_its_own_way(tiny_family, tmp_path):
    info = engine.inspect_checkpoint(tiny_family["nano"])
    size = engine.sampling_limits(info, "i2v").resolutions[0]
    square = next((s for s in engine.sampling_limits(info, "i2v").resolutions if s[0] == s[1]), size)
    width, height = square
    image = str(_wide(tmp_path))
    shown = {}
    for fit in ("crop", "letterbox", "resize"):
        request = engine.validate_request(info, "i2v", {"prompt": "x", "image": image, "fit": fit,
                                                        "width": width, "height": height})
        picture = fitted_image(request)
        shown[fit] = np.asarray(fit_image(picture, width, height, "crop") if fit == "crop" else picture)
        assert shown[fit].shape == (height, width, 3)
    crop, letterbox, resize = shown["crop"], shown["letterbox"], shown["resize"]
    # Letterbox: nothing cut (both coloured quarters at the edges), black bars above and below.
    assert letterbox[0, width // 2].tolist() == [0, 0, 0] and letterbox[height // 2, 1][0] > 200
    assert letterbox[height // 2, width - 2][2] > 200
    # Crop: no bars, the sides cut (the middle column is white).
    assert crop[0, width // 2].min() > 200 and crop[height // 2, 1][0] > 200
    # Resize: no bars and nothing cut; the red quarter is stretched to a quarter of the width.
    assert resize[0, width // 2].min() > 200 and resize[height // 2, width // 4 - 2][1] < 60


def test_an_undecodable_upload_is_refused_without_its_server_path(tmp_path):
    from engine.pipeline.media import load_image, load_video

    folder = tmp_path / "gradio" / "0123abcd"
    folder.mkdir(parents=True)
    for name, load in (("notes.png", load_image), ("notes.mp4", load_video)):
        fake = folder / name
        fake.write_text("a text file renamed")
        with pytest.raises(ValueError) as caught:
            load(str(fake))
        assert "could not be decoded" in str(caught.value) and name in str(caught.value)
        assert str(folder) not in str(caught.value) and "0123abcd" not in str(caught.value)
