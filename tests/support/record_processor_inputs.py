"""Record what Transformers' own processors make of a fixed image and video on the tiny Edge and Nano
checkpoints, for `tests/unit/reasoner/test_reasoner.py::test_inputs_match_transformers_processor_as_recorded`, which
compares the parts route with it on machines without torchvision (CI's CPU machine among them).

    python3 tests/support/record_processor_inputs.py    # needs torchvision; writes tests/data/processor_inputs.safetensors

The file holds the media, the processor's outputs (token ids, pixels, grids) and, in its metadata, the
versions and a digest of the checkpoint files the processor read, so a change to either shows up as a
stale recording rather than as a wrong comparison.
"""
from __future__ import annotations

import hashlib
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = ROOT / "tests" / "data" / "processor_inputs.safetensors"
CHECKPOINTS = (("edge", "edge"), ("nano", "omni"))
PROCESSOR_FILES = ("preprocessor_config.json", "video_preprocessor_config.json", "processor_config.json",
                   "chat_template.jinja", "tokenizer.json", "tokenizer_config.json")
VIDEO_FPS = 6.0


def fixed_media():
    import numpy as np

    rng = np.random.default_rng(5)
    image = (rng.random((48, 64, 3)) * 255).astype(np.uint8)
    video = (rng.random((12, 48, 64, 3)) * 255).astype(np.uint8)
    return image, video


def processor_digest(root: Path) -> str:
    digest = hashlib.sha256()
    for name in PROCESSOR_FILES:
        path = root / name
        digest.update(name.encode() + b"\0" + (path.read_bytes() if path.is_file() else b"-") + b"\0")
    return digest.hexdigest()


def chats(video_config: dict):
    """(label, messages args, media kwargs) of each recorded input, the same on both sides."""
    from engine.pipeline.media import load_image, load_video
    from engine.reasoner.inputs import sample_video

    image, video = fixed_media()
    clip = sample_video(load_video(video), VIDEO_FPS, video_config)
    return (("image", {"image": load_image(image)}), ("video", {"video": clip}))


def main() -> int:
    import torch
    import torchvision
    import transformers
    from safetensors.torch import save_file

    sys.path.insert(0, str(ROOT))
    from engine.model.tiny import write_family
    from engine.reasoner.inputs import build_inputs, load_preprocessor, messages_for

    tensors, meta = {}, {"transformers": transformers.__version__, "torchvision": torchvision.__version__,
                         "torch": torch.__version__}
    image, video = fixed_media()
    tensors["media.image"], tensors["media.video"] = torch.from_numpy(image), torch.from_numpy(video)
    with tempfile.TemporaryDirectory() as tmp:
        family = write_family(Path(tmp))
        for name, kind in CHECKPOINTS:
            pre = load_preprocessor(family[name], kind)
            if pre.processor is None:
                raise SystemExit("Transformers built no processor here (is torchvision importable?)")
            meta[f"{name}.digest"] = processor_digest(family[name])
            for label, media in chats(pre.video_config):
                out = build_inputs(pre, messages_for(None, "Describe.", **media), **media)
                for key, value in out.items():
                    tensors[f"{name}.{label}.{key}"] = value.contiguous()
    FIXTURE.parent.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(FIXTURE), metadata={"recorded": json.dumps(meta)})
    print(f"wrote {FIXTURE} ({FIXTURE.stat().st_size} bytes): {json.dumps(meta)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
