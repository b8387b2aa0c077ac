"""Issue 42, hosting hardening (second round), the studio's side: a hostile remote engine cannot write
outside the outputs folder, private Gradio handlers serve nothing that is not the caller's, uploads are
capped and Gradio's cache is cleaned, and no UI message names a server path (docs/HOSTING.md)."""
import base64
import io
import json
from pathlib import Path

import httpx
import pytest


# ----------------------------------------------------------------------------------------------
# 1. A remote engine's ids never become paths outside the outputs folder
# ----------------------------------------------------------------------------------------------


def _png() -> bytes:
    from PIL import Image

    data = io.BytesIO()
    Image.new("RGB", (8, 8), (200, 30, 30)).save(data, format="PNG")
    return data.getvalue()


def _hostile_remote(answered_id):
    """A plain /v1 server that names one Cosmos3 model and answers every image with `answered_id`."""
    png = base64.b64encode(_png()).decode()

    def server(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/models":
            return httpx.Response(200, json={"data": [{"id": "nvidia/Cosmos3-Nano"}]})
        return httpx.Response(200, json={"data": [{"b64_json": png}], "result": {"request_id": answered_id}})

    return httpx.MockTransport(server)


def _tree(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


@pytest.mark.parametrize("answered", ["../../escaped", "../escaped", "/ABSOLUTE", "a/b", "..", ".", "",
                                      "x" * 300, 12345, ["list"], "20260101-000000-0123456789ab/../../up"])
def test_a_remote_request_id_never_becomes_a_path_outside_outputs(tmp_path, answered):
    from engine.pipeline.outputs import is_request_id
    from engine.serving.remote import REMOTE_NAME, RemoteJobQueue, RemoteRegistry

    if answered == "/ABSOLUTE":
        answered = str(tmp_path / "absolute-target")
    outputs = tmp_path / "deep" / "outputs"
    outputs.mkdir(parents=True)
    before = _tree(tmp_path)
    registry = RemoteRegistry("http://peer:30000", transport=_hostile_remote(answered))
    queue = RemoteJobQueue(registry, outputs)
    result = queue.submit("nvidia/Cosmos3-Nano", {"mode": "t2i", "prompt": "a kite", "steps": 2, "seed": 3}).result(30)
    created = _tree(tmp_path) - before
    assert created and all(name.startswith("deep/outputs/") for name in created), created
    assert result.output_dir.parent == outputs and is_request_id(result.request_id)
    assert result.outputs["image"].read_bytes() == _png()
    kept = json.loads((result.output_dir / REMOTE_NAME).read_text())
    assert kept["server"] == "http://peer:30000"
    assert kept["request_id"] == (answered[:200] if isinstance(answered, str) else None)


def test_a_remote_id_of_a_result_already_here_gets_a_fresh_folder(tmp_path):
    """A well-shaped id that names an existing result (another user's) must not write into its folder."""
    from engine.serving.remote import RemoteJobQueue, RemoteRegistry

    taken = "20260101-000000-0123456789ab"
    (tmp_path / taken).mkdir()
    (tmp_path / taken / "image.png").write_bytes(b"someone else's result")
    registry = RemoteRegistry("http://peer:30000", transport=_hostile_remote(taken))
    result = RemoteJobQueue(registry, tmp_path).submit(
        "nvidia/Cosmos3-Nano", {"mode": "t2i", "prompt": "a kite", "steps": 2}).result(30)
    assert result.request_id != taken and result.output_dir.parent == tmp_path
    assert (tmp_path / taken / "image.png").read_bytes() == b"someone else's result"
    assert sorted(p.name for p in (tmp_path / taken).iterdir()) == ["image.png"]


def test_a_remote_with_a_well_formed_id_keeps_it(tmp_path):
    from engine.serving.remote import RemoteJobQueue, RemoteRegistry

    given = "20260102-030405-abcdefabcdef"
    registry = RemoteRegistry("http://peer:30000", transport=_hostile_remote(given))
    result = RemoteJobQueue(registry, tmp_path).submit(
        "nvidia/Cosmos3-Nano", {"mode": "t2i", "prompt": "a kite", "steps": 2}).result(30)
    assert result.request_id == given and result.output_dir == tmp_path / given


@pytest.mark.parametrize("group", ["../up", "/abs", "a/b", "..", ""])
def test_a_forwarded_output_group_must_be_a_plain_name(tmp_path, group):
    from engine.serving.remote import RemoteJobQueue, RemoteRegistry

    registry = RemoteRegistry("http://peer:30000", transport=_hostile_remote(None))
    with pytest.raises(ValueError, match="output_group must be a plain folder name"):
        RemoteJobQueue(registry, tmp_path).submit("nvidia/Cosmos3-Nano", {"mode": "t2i", "prompt": "x"},
                                                  output_group=group)
