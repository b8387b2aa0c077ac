"""Files shipped in `assets/`: example captions, the negative captions, the stylesheet, example media."""
from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

ASSETS = Path(__file__).resolve().parent.parent / "assets"
CAPTIONS = ASSETS / "captions"
MEDIA = ASSETS / "media"
CSS_PATH = ASSETS / "studio.css"


def _title(stem: str) -> str:
    return stem.split("_", 1)[1].replace("_", " ").capitalize()


@lru_cache(maxsize=None)
def example_captions(kind: str) -> dict[str, str]:
    """{title: pretty JSON text} of the example captions for "image" or "video"."""
    out = {}
    for path in sorted(CAPTIONS.glob(f"{kind}_*.json")):
        out[_title(path.stem)] = json.dumps(json.loads(path.read_text(encoding="utf-8")), ensure_ascii=False, indent=2)
    return out


@lru_cache(maxsize=None)
def negative_caption(kind: str) -> str:
    """The studio's own negative caption for "image" or "video", as pretty JSON text."""
    path = CAPTIONS / f"negative_{kind}.json"
    return json.dumps(json.loads(path.read_text(encoding="utf-8")), ensure_ascii=False, indent=2)


PROSE_EXAMPLES = {
    "image": "A lighthouse keeper holding a brass lamp on a windy balcony at dusk, photographed with a long lens.",
    "video": "A harbour crane swings a blue container onto the quay at sunrise while a worker waves it down; "
             "the camera slowly pushes in.",
}


def example_media(name: str) -> str | None:
    path = MEDIA / name
    return str(path) if path.is_file() else None
