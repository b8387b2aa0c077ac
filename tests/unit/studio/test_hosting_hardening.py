"""Issue 42, hosting hardening (second round), the studio's side: a hostile remote engine cannot write
outside the outputs folder, private Gradio handlers serve nothing that is not the caller's, uploads are
capped and Gradio's cache is cleaned, and no UI message names a server path (docs/HOSTING.md)."""
import base64
import io
import json
import re
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


@pytest.mark.parametrize("group", ["../up", "/ABSOLUTE", "a/b", "..", ""])
def test_a_forwarded_output_group_must_be_a_plain_name(tmp_path, group):
    from engine.serving.remote import RemoteJobQueue, RemoteRegistry

    group = str(tmp_path / "absolute-group") if group == "/ABSOLUTE" else group  # old code wrote there
    registry = RemoteRegistry("http://peer:30000", transport=_hostile_remote(None))
    with pytest.raises(ValueError, match="output_group must be a plain folder name"):
        RemoteJobQueue(registry, tmp_path).submit("nvidia/Cosmos3-Nano", {"mode": "t2i", "prompt": "x"},
                                                  output_group=group)


# ----------------------------------------------------------------------------------------------
# 2. No private handler serves what is not the caller's
# ----------------------------------------------------------------------------------------------

FILE_URL = re.compile(r"/gradio_api/file=([^\"\\\\]+)")
CALLER = "attacker-session"


def _file_data(path: str) -> dict:
    return {"path": path, "url": None, "orig_name": Path(path).name, "meta": {"_type": "gradio.FileData"}}


def _forged_history(request_id: str, names: dict) -> list:
    entry = {"id": request_id, "model": "nano", "tab": "t2i", "mode": "t2i", "seed": 1, "created": "",
             "files": names, "summary": {"params": {}}, "ui": {}}
    return [entry, dict(entry, seal="0" * 64)]


def _forged_inputs(config: dict, dependency: dict, text: str | None, file_path: str | None, history: list) -> list:
    """One value per input: the forged history for a BrowserState, `text` for every text-like input,
    `file_path` for every file-like one, each other input at its default (so a form runs as sent)."""
    components = {c["id"]: c for c in config["components"]}
    data = []
    for component_id in dependency["inputs"]:
        component = components[component_id]
        kind, default = component["type"], component.get("props", {}).get("value")
        if kind == "browserstate":
            data.append(history)
        elif kind in ("textbox", "code", "dropdown", "radio", "markdown") and text is not None:
            data.append(text)
        elif kind == "checkboxgroup" and text is not None:
            data.append([text])
        elif kind in ("image", "video", "file", "gallery") and file_path is not None:
            data.append(_file_data(file_path))
        else:
            data.append(default)
    return data


def _call(client: httpx.Client, fn_index: int, dependency: dict, data: list) -> str:
    """Everything the app answers to one call of handler `fn_index`, as the browser would call it."""
    body = {"data": data, "fn_index": fn_index, "session_hash": CALLER, "trigger_id": None,
            "event_data": {"index": 0, "value": None, "selected": True}}
    if dependency.get("queue") is False:
        return client.post("gradio_api/run/predict", json=body).text
    joined = client.post("gradio_api/queue/join", json=body)
    if joined.status_code != 200:
        return joined.text
    event_id, text = joined.json()["event_id"], []
    with client.stream("GET", f"gradio_api/queue/data?session_hash={CALLER}", timeout=180) as stream:
        for line in stream.iter_lines():
            text.append(line)
            if line.startswith("data:") and event_id in line and '"process_completed"' in line:
                break
    return "\n".join(text)


def _served_copies(client: httpx.Client, answer: str, secrets_: dict[str, bytes]) -> list[str]:
    """The file URLs in `answer` that serve one of `secrets_`'s contents (names the leak, if any)."""
    leaks = []
    for path in set(FILE_URL.findall(answer)):
        fetched = client.get(f"gradio_api/file={path}")
        for name, content in secrets_.items():
            if fetched.status_code == 200 and fetched.content == content:
                leaks.append(f"{name} via {path}")
    return leaks


def _drive_every_private_handler(client: httpx.Client, targets: list, secrets_: dict, history: list) -> dict:
    config = client.get("config").json()
    dependencies = [(i, d) for i, d in enumerate(config["dependencies"]) if d.get("api_visibility") != "public"]
    assert len(dependencies) > 100, len(dependencies)  # every tab's handlers, not a handful
    leaks: dict[str, list] = {}
    for text, file_path in [(None, None), *targets]:
        for fn_index, dependency in dependencies:
            answer = _call(client, fn_index, dependency, _forged_inputs(config, dependency, text, file_path, history))
            found = _served_copies(client, answer, secrets_)
            if found:
                leaks.setdefault(f"{fn_index} {dependency.get('api_name')}", []).extend(found)
    return leaks


@pytest.fixture(scope="module")
def public_studio(tiny_family, tmp_path_factory):
    from harness import launched_studio

    outputs = tmp_path_factory.mktemp("hardening-outputs")
    argv = ["--outputs", str(outputs), "--cache-dir", str(tmp_path_factory.mktemp("hardening-cache")),
            "--model", f"nano={tiny_family['nano']}"]
    with launched_studio(argv) as (studio, url):
        yield studio, url, outputs


def _victims_result(url: str, outputs: Path) -> tuple[str, dict[str, bytes]]:
    """Another user's result, made through the public /generate API: its request id and file contents."""
    from gradio_client import Client

    _, result = Client(url, verbose=False).predict(
        "nano", json.dumps({"mode": "t2i", "prompt": "the victim's private prompt", "steps": 1, "seed": 777}), None,
        api_name="/generate")
    folder = outputs / result["request_id"]
    return result["request_id"], {name: (folder / name).read_bytes() for name in ("image.png", "params.json")}


def test_no_private_handler_hands_out_another_users_result(public_studio):
    studio, url, outputs = public_studio
    request_id, secrets_ = _victims_result(url, outputs)
    names = {"image": f"{request_id}/image.png", "sidecar": f"{request_id}/params.json"}
    history = _forged_history(request_id, names)
    client = httpx.Client(base_url=url, timeout=180)
    # The check can see a leak: the same entry, sealed by this server, is shown on page load.
    config = client.get("config").json()
    on_load = next(i for i, d in enumerate(config["dependencies"]) if d.get("api_name") == "on_load")
    sealed = [studio.service.history_seal.sign(history[0])]
    answer = _call(client, on_load, config["dependencies"][on_load],
                   _forged_inputs(config, config["dependencies"][on_load], None, None, sealed))
    assert _served_copies(client, answer, secrets_) == ["image.png via " + FILE_URL.search(answer).group(1)]
    # Forged (unsealed or wrongly sealed) entries, the request id, its path, its server path: nothing.
    image = str(outputs / request_id / "image.png")
    targets = [(request_id, image), (f"{request_id}/image.png", image), (image, image)]
    assert _drive_every_private_handler(client, targets, secrets_, history) == {}


def test_the_seal_key_never_reaches_a_browser(public_studio):
    """Gradio sends the BrowserState's secret to every browser in /config: it is derived one way from the
    app's key file, which (like the seal's key) appears in no page."""
    studio, url, _ = public_studio
    pages = [httpx.get(url + path).text for path in ("config", "", "gradio_api/info")]
    seal = studio.service.history_seal.key.hex()
    assert len(studio.state_secret) >= 32
    for text in pages:
        assert studio.state_secret not in text and seal not in text


def test_no_review_mode_handler_hands_out_a_file_that_is_not_a_registered_result(tiny_family, tmp_path):
    """Review mode shares every registered result among its logged-in reviewers (docs/HOSTING.md); any
    other file under outputs (here an API caller's upload) is handed out by no handler, to no reviewer."""
    from harness import launched_studio

    outputs = tmp_path / "outputs"
    upload = outputs / ".api-uploads" / "someones-upload.png"
    upload.parent.mkdir(parents=True)
    upload.write_bytes(_png() + b"an API caller's own image")
    argv = ["--outputs", str(outputs), "--cache-dir", str(tmp_path / "cache"), "--model", f"nano={tiny_family['nano']}",
            "--review", "--auth", "alice:pw-a", "--auth", "bob:pw-b"]
    with launched_studio(argv) as (studio, url):
        client = httpx.Client(base_url=url, timeout=180)
        assert client.post("login", data={"username": "bob", "password": "pw-b"}).status_code == 200
        history = _forged_history("someones-upload", {"image": ".api-uploads/someones-upload.png"})
        targets = [(".api-uploads/someones-upload.png", str(upload)), (str(upload), str(upload)),
                   ("someones-upload.png", str(upload))]
        secrets_ = {"the upload": upload.read_bytes()}
        assert _drive_every_private_handler(client, targets, secrets_, history) == {}


# ----------------------------------------------------------------------------------------------
# 3. Uploads are capped; Gradio's cache is swept, published result copies included
# ----------------------------------------------------------------------------------------------


def test_the_upload_cap_defaults_to_a_v2v_clip_and_follows_flag_and_environment(monkeypatch):
    import app

    monkeypatch.delenv("COSMOS3_MAX_UPLOAD", raising=False)
    assert app.parse_args([]).max_upload == 200 * 1024 ** 2
    assert app.parse_args(["--max-upload", "1gb"]).max_upload == 1024 ** 3
    monkeypatch.setenv("COSMOS3_MAX_UPLOAD", "50mb")
    assert app.parse_args([]).max_upload == 50 * 1024 ** 2
    assert app.parse_args(["--max-upload", "300kb"]).max_upload == 300 * 1024  # the flag wins
    monkeypatch.setenv("COSMOS3_MAX_UPLOAD", "lots")
    with pytest.raises(SystemExit):
        app.parse_args([])
    with pytest.raises(app.argparse.ArgumentTypeError, match="200mb"):
        app.parse_size("12 parsecs")


@pytest.fixture(scope="module")
def capped_studio(tiny_family, tmp_path_factory):
    from harness import launched_studio

    outputs = tmp_path_factory.mktemp("capped-outputs")
    argv = ["--outputs", str(outputs), "--cache-dir", str(tmp_path_factory.mktemp("capped-cache")),
            "--model", f"nano={tiny_family['nano']}", "--max-upload", "1mb"]
    with launched_studio(argv) as (studio, url):
        yield studio, url, outputs


def _upload_folder() -> Path:
    from gradio.utils import get_upload_folder

    return Path(get_upload_folder())


def test_an_upload_over_the_cap_is_refused_naming_the_limit_and_not_kept(capped_studio):
    studio, url, _ = capped_studio
    client = httpx.Client(base_url=url, timeout=60)
    assert client.get("config").json()["max_file_size"] == 1024 ** 2
    before = {p for p in _upload_folder().rglob("*")}
    too_big = client.post("gradio_api/upload", files={"files": ("clip.mp4", b"\0" * (1024 ** 2 + 1), "video/mp4")})
    assert too_big.status_code == 413 and "1048576 bytes" in too_big.text, (too_big.status_code, too_big.text)
    assert not [p for p in _upload_folder().rglob("*") if p not in before and p.is_file()]
    fits = client.post("gradio_api/upload", files={"files": ("clip.mp4", b"\0" * (1024 ** 2 - 1024), "video/mp4")})
    assert fits.status_code == 200 and Path(fits.json()[0]).stat().st_size == 1024 ** 2 - 1024


def test_the_cache_sweep_removes_uploads_and_published_result_copies(capped_studio):
    from gradio.route_utils import delete_files_created_by_app

    from cosmos3_ui import files

    studio, url, outputs = capped_studio
    assert studio.blocks.delete_cache == files.CACHE_CLEANUP
    client = httpx.Client(base_url=url, timeout=120)
    uploaded = Path(client.post("gradio_api/upload", files={"files": ("a.png", _png(), "image/png")}).json()[0])
    joined = client.post("gradio_api/call/generate", json={"data": ["nano", json.dumps(
        {"mode": "t2i", "prompt": "a kite", "steps": 1, "seed": 4}), None]}).json()["event_id"]
    answer = client.get(f"gradio_api/call/generate/{joined}").text
    media, result = json.loads(answer.split("data: ")[-1])
    published = Path(media["path"])
    assert uploaded.is_file() and published.is_file() and published.parent.parent == _upload_folder()
    delete_files_created_by_app(studio.blocks, 0)  # what Gradio's sweep runs every CACHE_CLEANUP[0] seconds
    assert not uploaded.exists() and not published.exists()
    assert (outputs / result["request_id"] / "image.png").is_file()  # the result itself stays
    assert files.publish(outputs / result["request_id"] / "image.png") is not None  # and is published again


# ----------------------------------------------------------------------------------------------
# 5. No UI message names a server path
# ----------------------------------------------------------------------------------------------

def _server_paths(outputs: Path) -> list[str]:
    import tempfile

    return [str(outputs), str(_upload_folder()), tempfile.gettempdir() + "/"]


def test_a_renamed_text_file_is_refused_by_its_name_not_its_server_path(public_studio):
    """A .txt renamed to .png, sent to each tab's image upload check and to /generate: the message names
    the file as the user called it, never the folder Gradio's cache keeps it in."""
    studio, url, outputs = public_studio
    client = httpx.Client(base_url=url, timeout=120)
    uploaded = client.post("gradio_api/upload", files={"files": ("holiday-notes.png", b"just some text\n", "image/png")})
    path = uploaded.json()[0]
    config = client.get("config").json()
    kinds = {c["id"]: c["type"] for c in config["components"]}
    checks = [(i, d) for i, d in enumerate(config["dependencies"])
              if [kinds[c] for c in d["inputs"]] == ["image"] and any(t[1] == "upload" for t in d["targets"])]
    assert len(checks) >= 2, checks  # the image-to-video tab's and the action tab's
    answers = [_call(client, i, d, [_file_data(path)]) for i, d in checks]
    joined = client.post("gradio_api/call/generate", json={"data": [
        "nano", json.dumps({"mode": "i2v", "prompt": "x", "steps": 1, "num_frames": 5}), _file_data(path)]})
    answers.append(client.get(f"gradio_api/call/generate/{joined.json()['event_id']}").text)
    for answer in answers:
        assert "holiday-notes.png" in answer and "could not" in answer, answer[:600]
        for server_path in _server_paths(outputs):
            assert server_path not in answer, (server_path, answer[:600])


def test_redact_quotes_base_names_only(public_studio):
    from cosmos3_ui.files import redact

    _, _, outputs = public_studio
    cache_file = _upload_folder() / ("ab" * 32) / "clip.mp4"
    text = redact(f"cannot identify image file '{cache_file}'; could not write {outputs}/2026-x/.part/image.png; "
                  f"see {outputs}")
    assert "'clip.mp4'" in text and "image.png" in text and "<outputs>" in text
    for server_path in _server_paths(outputs):
        assert server_path not in text, text


@pytest.mark.parametrize("folder, name", [("../20260101-000000-0123456789ab", "image.png"),
                                          ("{tmp}/abs/20260101-000000-0123456789ab", "image.png"),
                                          ("../../x", "image.png"),
                                          ("20260101-000000-0123456789ab", "../image.png"),
                                          ("batch-1/20260101-000000-0123456789ab", "{tmp}/escaped")])
def test_a_ray_replicas_shipped_names_must_be_plain(tmp_path, folder, name):
    """The Ray front end writes a replica's result from the names it ships: the same rule as a remote's."""
    from engine.serving.ray_replicas import RayJobQueue, ShippedFiles

    # Absolute names point into this test's folder: the code before the fix wrote wherever they pointed.
    folder, name = folder.format(tmp=tmp_path), name.format(tmp=tmp_path)
    outputs = tmp_path / "outputs"
    outputs.mkdir()
    front = object.__new__(RayJobQueue)  # only its outputs folder is used; no cluster is started
    front.outputs_root = outputs
    with pytest.raises(ValueError, match="plain (folder|file) name"):
        front._store(ShippedFiles(folder, {"image": (name, b"png")}))
    assert _tree(tmp_path) == {"outputs"}
    front._store(ShippedFiles("batch-1/20260101-000000-0123456789ab", {"image": ("image.png", b"png")}))
    assert (outputs / "batch-1" / "20260101-000000-0123456789ab" / "image.png").read_bytes() == b"png"


def test_a_status_line_quotes_no_server_path(tmp_path):
    """Broad failures (a batch or a suite run that stopped) show their exception in the status line."""
    from cosmos3_ui import files
    from cosmos3_ui.common import status_html

    root = files.serve_results_from(tmp_path / "outputs")
    shown = status_html(f"The batch stopped: [Errno 28] No space left on device: '{root / 'batch-1' / 'image.png'}'",
                        "error")
    assert str(tmp_path) not in shown and "image.png" in shown, shown
