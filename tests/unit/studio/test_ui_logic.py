"""The UI's decisions without a server: control specs from the engine's table, request building,
history checks, and the caption editor's messages."""
import copy
import json
import zipfile
from pathlib import Path

import numpy as np
import pytest

from cosmos3_ui import controls as C
from cosmos3_ui import forms as F
from cosmos3_ui import history as H
from cosmos3_ui.caption_editor import describe_problem
from cosmos3_ui.requests import (
    STYLE_JSON,
    STYLE_PROSE,
    ActionInputs,
    Sampling,
    action_request,
    api_request,
    file_kind,
    image_request,
    negative_from_text,
    parse_request_json,
    prompt_from_editor,
    video_request,
)
from cosmos3_ui.service import ActiveJobs, JobStatus, StudioError, apply_event
from engine.model.action import ACTION_DOMAINS, CHUNK_RANGE, SUPPORTED_DOMAINS
from engine.model.defaults import FAMILY_TABLE
from engine.events import Cancelled, Failed, Finished, Progress, Queued, Started
from engine.serving.registry import ModelEntry, ModelRegistry

ASSETS = Path(__file__).resolve().parents[3] / "assets"


@pytest.fixture(scope="module")
def models(tiny_family, tmp_path_factory):
    from types import SimpleNamespace

    from cosmos3_ui.service import StudioService

    registry = ModelRegistry([ModelEntry(n, str(p), "tiny random weights") for n, p in tiny_family.items()])
    queue = SimpleNamespace(submit=lambda model_name, request, session_id=None: None)
    service = StudioService(registry, queue, tmp_path_factory.mktemp("models-outputs"))
    return {m["name"]: m for m in service.describe_all()}  # the engine's limits included


# ---------------------------------------------------------------------------------------------
# Controls follow the variant and the mode
# ---------------------------------------------------------------------------------------------

def test_resolution_choices_are_exactly_the_allowed_sizes(models):
    for name, model in models.items():
        for mode in ("t2i", "t2v"):
            spec = C.sampling_controls(model, mode)
            allowed = model["defaults"][mode]["resolutions"]
            assert [value for _, value in spec.resolution_choices] == [f"{w}x{h}" for w, h in allowed]
            assert spec.resolution == f"{model['defaults'][mode]['width']}x{model['defaults'][mode]['height']}"
    assert C.resolution_choices([[1280, 720], [832, 480], [640, 640]]) == [
        ("1280 x 720 (16:9)", "1280x720"), ("832 x 480 (~16:9)", "832x480"), ("640 x 640 (1:1)", "640x640")]
    assert C.parse_size("832x480") == (832, 480)
    with pytest.raises(ValueError, match="WIDTHxHEIGHT"):
        C.parse_size("big")


def test_frames_follow_the_range_in_steps_of_four(models):
    spec = C.sampling_controls(models["edge"], "t2v")
    assert spec.frames_range == tuple(models["edge"]["defaults"]["t2v"]["frame_range"])
    lo, hi = spec.frames_range
    assert (lo - 1) % 4 == 0 and (hi - 1) % 4 == 0 and lo <= spec.frames <= hi
    assert C.sampling_controls(models["edge"], "t2i").frames_range is None


def test_distilled_locks_steps_and_guidance_and_says_why(models):
    spec = C.sampling_controls(models["super-distilled"], "t2v")
    assert spec.locked and spec.steps == 4 and spec.guidance_scale == 1.0 and spec.flow_shift == 1.0
    assert "distilled" in spec.lock_note and "[1.0, 0.9375, 0.8333, 0.625]" in spec.lock_note
    assert not spec.negative_enabled
    full = C.sampling_controls(models["super"], "t2v")
    assert not full.locked and full.lock_note == "" and full.negative_enabled


def test_guidance_interval_is_shown_for_t2i_only(models):
    t2i = C.sampling_controls(models["nano"], "t2i")
    assert t2i.show_interval and t2i.guidance_interval == (400.0, 1000.0)
    assert not C.sampling_controls(models["nano"], "t2v").show_interval
    assert C.sampling_controls(models["nano-distilled"], "t2i").guidance_interval is None


def test_unsupported_modes_are_off_with_a_reason(models):
    action = C.sampling_controls(models["super"], "action")
    assert not action.available and "no action head" in action.reason
    assert "Distilled" in C.unsupported_reason(models["edge-distilled"], "action")
    assert C.unsupported_reason(models["edge"], "action") is None
    assert C.sampling_controls(models["nano"], "t2v").sound_available
    edge_video = C.sampling_controls(models["edge"], "t2v")
    assert not edge_video.sound_available and "sound" in edge_video.sound_reason
    availability = C.tab_availability(models["super"])
    assert availability.t2i[0] and availability.t2v[0] and not availability.action[0]


def test_variant_panel_names_family_flags_and_limits(models):
    text = C.variant_markdown(models["edge-distilled"])
    assert "Edge" in text and "distilled, 4 steps" in text and "tiny random weights" in text
    assert "Fixed sigmas" in text and "Not available: action" in text
    assert "Not available" not in C.variant_markdown(models["nano"])


def test_action_controls_come_from_the_domain_table():
    values = [v for _, v in C.domain_choices()]
    assert values == list(SUPPORTED_DOMAINS) and "libero" not in values and "no_action" not in values
    assert "libero" in C.unsupported_domains_note()
    for name in SUPPORTED_DOMAINS:
        spec = C.domain_controls(name)
        assert spec.chunk_size % 4 == 0 and CHUNK_RANGE[0] <= spec.chunk_size <= CHUNK_RANGE[1]
        assert spec.raw_dim == ACTION_DOMAINS[name].raw_dim and spec.fps == ACTION_DOMAINS[name].typical_fps
    assert C.domain_controls("av").chunk_size == 60 and C.domain_controls("av").fps == 10.0
    assert C.kind_inputs("inverse_dynamics") == C.KindInputs(False, True, False, C.kind_inputs("inverse_dynamics").note)
    assert C.kind_inputs("forward_dynamics").actions and not C.kind_inputs("policy").actions


# ---------------------------------------------------------------------------------------------
# Requests from the inputs
# ---------------------------------------------------------------------------------------------

def test_prompt_from_the_editor_is_sent_as_written_for_the_engine_to_parse_once(monkeypatch):
    from engine.pipeline import captions

    def no_parse(*args):
        raise AssertionError("the UI parsed the caption; the engine's Request is the one parse")

    monkeypatch.setattr(captions, "parse_caption", no_parse)
    assert prompt_from_editor(STYLE_JSON, '{\n "context": "café"\n}\n', "") == '{\n "context": "café"\n}'
    assert prompt_from_editor(STYLE_PROSE, "", "  a boat  ") == "a boat"
    # Broken or wrongly typed JSON goes as written: the engine refuses it, naming the field.
    assert prompt_from_editor(STYLE_JSON, '{"lighting": "dim"}', "") == '{"lighting": "dim"}'
    for style, code, prose, fragment in (
        (STYLE_JSON, " { } ", "", "empty object"),
        (STYLE_JSON, "a red kite", "", "must be a JSON object"),  # the engine would send it as prose
        (STYLE_JSON, "  ", "", "empty"),
        (STYLE_PROSE, "", "   ", "empty"),
    ):
        with pytest.raises(StudioError) as info:
            prompt_from_editor(style, code, prose)
        assert fragment in str(info.value) and info.value.field == "prompt"


def test_the_engines_refusal_reaches_the_ui_with_its_field_and_the_captions_excerpt(tiny_family):
    import engine

    info = engine.inspect_checkpoint(tiny_family["nano"])
    for prompt, field, fragment in (
        ('{"context": "x",}', "prompt", "Line 1, column 17"),
        ('{"lighting": "dim"}', "prompt.lighting", "lighting: must be an object"),
    ):
        with pytest.raises(engine.RequestError) as refused:
            engine.validate_request(info, "t2i", {"prompt": prompt})
        error = StudioError.refused(refused.value)
        assert error.field == field and fragment in str(error)
    with pytest.raises(engine.RequestError) as refused:
        engine.validate_request(info, "t2i", {"prompt": '{\n "a": 1\n "b": 2\n}'})
    excerpt = StudioError.refused(refused.value).excerpt
    assert '"b": 2' in excerpt and "^" in excerpt  # the line and a caret, as the editor shows them


def test_negative_prompt_is_sent_as_written():
    assert negative_from_text("") == "" and negative_from_text("   ") == ""
    assert negative_from_text(" blurry ") == "blurry"
    negative = (ASSETS / "captions" / "negative_video.json").read_text()
    assert json.loads(negative_from_text(negative)) == json.loads(negative)
    with pytest.raises(StudioError) as info:
        negative_from_text("{}")
    assert info.value.field == "negative_prompt"


def test_image_and_video_requests():
    sampling = Sampling(resolution="96x64", steps=3.0, guidance_scale=4, flow_shift=3, seed=12.0, randomize=False,
                        use_interval=True, interval_lo=400, interval_hi=1000)
    assert image_request("p", "", sampling) == {
        "mode": "t2i", "prompt": "p", "negative_prompt": "", "width": 96, "height": 64, "num_frames": 1,
        "guidance_interval": [400.0, 1000.0], "steps": 3, "guidance_scale": 4.0, "flow_shift": 3.0, "seed": 12}
    video = Sampling(resolution="64x64", frames=9, fps=24, steps=2, guidance_scale=6, flow_shift=10, randomize=True)
    assert video_request("p", "n", video, image=None, video=None, sound=False)["mode"] == "t2v"
    i2v = video_request("p", "n", video, image="/up/a.png", video=None, sound=True)
    assert i2v["mode"] == "i2v" and i2v["image"] == "/up/a.png" and i2v["sound"] and i2v["seed"] == -1
    assert video_request("p", "", video, image=None, video="/up/c.mp4", sound=False)["mode"] == "v2v"
    with pytest.raises(StudioError, match="not both"):
        video_request("p", "", video, image="/a.png", video="/c.mp4", sound=False)
    for bad, field in ((Sampling(resolution=None), "resolution"), (Sampling(resolution="64x64", steps=None), "steps"),
                       (Sampling(resolution="64x64", seed=None, randomize=False), "seed"),
                       (Sampling(resolution="64x64", guidance_scale=""), "guidance_scale")):
        with pytest.raises(StudioError) as info:
            image_request("p", "", bad)
        assert info.value.field == field
    # Anything else goes to the engine as typed, to be refused there in the API's own words.
    odd = image_request("p", "", Sampling(resolution="64x64", steps=2.5, guidance_scale=1000, seed=0, randomize=False))
    assert odd["steps"] == 2.5 and odd["guidance_scale"] == 1000


def test_action_requests(tmp_path):
    sampling = Sampling(fps=5, steps=2, guidance_scale=1, flow_shift=10, randomize=True)
    policy = action_request(ActionInputs("policy", "bridge_orig_lerobot", "ego_view", 16, 480, "stack the cups",
                                         image="/up/f.png"), sampling)
    assert policy["action"] == {"kind": "policy", "domain": "bridge_orig_lerobot", "view_point": "ego_view",
                                "chunk_size": 16, "resolution_tier": 480}
    assert policy["image"] == "/up/f.png" and policy["prompt"] == "stack the cups" and "video" not in policy
    actions_file = tmp_path / "a.csv"
    actions_file.write_text("x0,x1\n0.1,0.2\n0.3,0.4\n")
    forward = action_request(ActionInputs("forward_dynamics", "pusht", "ego_view", 4, 256, image="/f.png",
                                          actions_file=str(actions_file)), sampling)
    assert forward["action"]["actions"] == [[0.1, 0.2], [0.3, 0.4]]
    inverse = action_request(ActionInputs("inverse_dynamics", "umi", "wrist_view", 16, 256, video="/c.mp4",
                                          image="/ignored.png"), sampling)
    assert inverse["video"] == "/c.mp4" and "image" not in inverse
    wide = tmp_path / "wide.json"
    wide.write_text(json.dumps([[0.0] * 3] * 4))
    cases = (
        (ActionInputs("inverse_dynamics", "umi", "ego_view", 16, 256), "video", "needs a video"),
        (ActionInputs("policy", "umi", "ego_view", 16, 256), "image", "needs a first frame"),
        (ActionInputs("policy", "umi", "ego_view", 16, 256, image="/a.png", video="/b.mp4"), "image", "not both"),
        (ActionInputs("forward_dynamics", "umi", "ego_view", 16, 256, image="/a.png"), "action.actions", "actions file"),
        (ActionInputs("forward_dynamics", "pusht", "ego_view", 4, 256, image="/a.png", actions_file=str(wide)),
         "action.actions", "takes exactly 2"),
    )
    for inputs, field, fragment in cases:
        with pytest.raises(StudioError) as info:
            action_request(inputs, sampling)
        assert info.value.field == field and fragment in str(info.value), str(info.value)


def test_api_request_routes_the_file_and_refuses_paths(tmp_path):
    assert parse_request_json('{"mode": "t2i"}') == {"mode": "t2i"}
    for text, fragment in (("", "empty"), ("{", "line 1, column 2"), ("[]", "JSON object"), ("null", "JSON object")):
        with pytest.raises(StudioError, match=fragment):
            parse_request_json(text)
    assert api_request({"mode": "i2v", "prompt": "p"}, "/u/x.png")["image"] == "/u/x.png"
    assert api_request({"mode": "v2v", "prompt": "p"}, "/u/x.mp4")["video"] == "/u/x.mp4"
    policy = {"mode": "action", "action": {"kind": "policy", "domain": "umi"}}
    assert api_request(policy, "/u/x.webp")["image"] == "/u/x.webp"
    assert api_request(policy, "/u/x.mov")["video"] == "/u/x.mov"
    actions = tmp_path / "a.npy"
    np.save(actions, np.zeros((4, 10)))
    forward = api_request({"mode": "action", "action": {"kind": "forward_dynamics", "domain": "umi"}}, str(actions))
    assert forward["action"]["actions"] == [[0.0] * 10] * 4
    refusals = (
        ({"mode": "i2v", "image": "/etc/passwd"}, None, "must not name a file"),
        ({"mode": "v2v", "video": "../x.mp4"}, None, "must not name a file"),
        ({"mode": "action", "action": {"kind": "forward_dynamics", "actions": "/srv/a.npy"}}, None, "not a file name"),
        ({"mode": "t2i"}, "/u/x.png", "takes no file"),
        ({"mode": "i2v"}, "/u/x.mp4", "takes an image"),
        (policy, str(actions), "only used by forward_dynamics"),
        ({"mode": "action", "action": {"kind": "inverse_dynamics", "domain": "umi"}}, "/u/x.png", "video file"),
        ({"mode": "i2v"}, "/u/x.exe", "has type '.exe'"),
    )
    for request, file, fragment in refusals:
        with pytest.raises(StudioError) as info:
            api_request(request, file)
        assert fragment in str(info.value), str(info.value)
    assert file_kind("/a/b.JPG") == "image"


# ---------------------------------------------------------------------------------------------
# Job events, Cancel bookkeeping, history
# ---------------------------------------------------------------------------------------------

class FakeHandle:
    def __init__(self, job_id="job-1"):
        self.id = job_id
        self.cancelled = False

    def cancel(self):
        self.cancelled = True


def test_events_drive_the_status_text():
    status = JobStatus()
    apply_event(status, Queued(position=2))
    assert status.describe() == "Waiting for the GPU: 2 jobs ahead"
    apply_event(status, Started(model_name="nano"))
    assert status.describe() == "Loading the model"
    apply_event(status, Progress("denoise", 3, 10, 1.0, 2.4))
    assert status.describe() == "Denoising: step 3/10 · about 2 s left"
    assert apply_event(status, Finished(result="R")) == "R"
    with pytest.raises(StudioError) as info:
        apply_event(JobStatus(), Failed("Size 8x8 is not allowed", kind="invalid", field="width"))
    assert info.value.field == "width"  # the engine's field, never guessed from the words
    with pytest.raises(Exception) as info:
        apply_event(status, Cancelled())
    assert info.value.message() == "Cancelled after denoising step 3 of 10; nothing was saved."


def test_the_line_beside_generate_gives_the_queue_position_its_wait_and_the_step_eta():
    from types import SimpleNamespace

    from cosmos3_ui.jobs import JobFollower

    waits = {2: 42.0}
    follower = JobFollower(SimpleNamespace(queue=SimpleNamespace(eta_seconds=lambda position: waits.get(position))))
    assert "Queued: position 3, about 42 s" in follower.status_line(JobStatus(position=2))
    running = JobStatus(stage="denoise", step=3, total=10, eta_s=2.4)
    assert "Denoising: step 3/10 · about 2 s left" in follower.status_line(running)


def test_the_line_beside_generate_says_which_model_still_warms_up_in_the_background():
    from types import SimpleNamespace

    from cosmos3_ui.jobs import JobFollower

    warming = {"edge": {"done": 3, "total": 36}}
    follower = JobFollower(SimpleNamespace(queue=SimpleNamespace(eta_seconds=lambda position: None,
                                                                 warming=lambda: dict(warming))))
    running = JobStatus(stage="denoise", step=3, total=10, eta_s=2.4)
    assert "Denoising: step 3/10 · about 2 s left · edge warming up (3 of 36 runs)" in follower.status_line(running)
    warming.clear()  # done: the note goes
    assert "warming" not in follower.status_line(running)


def test_the_note_under_the_model_picker_shows_and_polls_only_while_a_model_warms(tiny_family, tmp_path):
    from types import SimpleNamespace

    from cosmos3_ui.layout import Studio
    from cosmos3_ui.service import StudioService

    warming = {"edge": {"done": 3, "total": 36}}
    registry = ModelRegistry([ModelEntry(n, str(p), "tiny random weights") for n, p in tiny_family.items()])
    queue = SimpleNamespace(submit=lambda *a, **k: None, warming=lambda: dict(warming))
    studio = Studio(StudioService(registry, queue, tmp_path))
    try:
        note, timer = studio.warming_updates()
        assert note["visible"] and note["value"].startswith("Edge warming up (3 of 36 runs) in the background")
        assert "your jobs always go first" in note["value"]
        assert timer.active is True  # polled while it warms
        warming.clear()
        note, timer = studio.warming_updates()
        assert (note["visible"], note["value"], timer.active) == (False, "", False)  # hidden, no more polling
        studio.service.queue = SimpleNamespace(submit=lambda *a, **k: None)  # a forwarding queue: nothing to say
        note, timer = studio.warming_updates()
        assert (note["visible"], timer.active) == (False, False)
    finally:
        studio.close()


def test_cancel_reaches_only_the_sessions_own_job():
    jobs = ActiveJobs()
    mine, theirs = FakeHandle("job-1"), FakeHandle("job-2")
    jobs.add("me", mine)
    jobs.add("you", theirs)
    assert jobs.cancel("me").handle is mine and mine.cancelled and not theirs.cancelled
    assert jobs.cancel("nobody") is None
    jobs.remove("me", mine)
    assert jobs.count() == 1 and jobs.cancel("me").handle is mine  # recently cancelled: still reportable
    assert jobs.cancelled_ids == ["job-1"]
    jobs.remove("you", theirs)
    assert jobs.cancel("you") is None  # finished normally: nothing to cancel


def test_a_job_read_to_its_end_is_not_counted_cancelled_and_one_abandoned_midway_is():
    import asyncio
    from types import SimpleNamespace

    from cosmos3_ui.jobs import JobFollower
    from cosmos3_ui.reasoner_panel import follow_reasoner
    from engine.reasoner import ReasonerText

    def handle(events):
        h = FakeHandle()
        h.events = lambda: iter(events)
        return h

    async def drive():
        # /generate and the review tabs return from `drive` at the result: that job finished.
        active, done = ActiveJobs(), handle([Queued(position=0), Finished(result="R")])
        follower = JobFollower(SimpleNamespace(active=active, queue=None))
        assert await follower.drive(done, "me", lambda *a, **k: None) == "R"
        await asyncio.sleep(0.05)  # the loop closes the generator `drive` left at its last yield
        assert active.cancelled_ids == [] and not done.cancelled and active.cancel("me") is None
        # A reasoner stream whose reader goes away (a closed tab) stops its engine job.
        active, streaming = ActiveJobs(), handle([ReasonerText("a", 1), ReasonerText("b", 2), Finished(result="R")])
        stream = follow_reasoner(SimpleNamespace(active=active, submit=lambda *a, **k: streaming), "m", {}, "me")
        assert await stream.__anext__() == ("text", "a")
        await stream.aclose()
        assert active.cancelled_ids == ["job-1"] and streaming.cancelled and active.count() == 0

    asyncio.run(drive())


def test_history_keeps_only_files_the_server_wrote(tmp_path):
    from cosmos3_ui import files

    root = files.serve_results_from(tmp_path / "outputs")
    folder = root / "20260101-000000-abc"
    folder.mkdir(parents=True)
    (folder / "image.png").write_bytes(b"png")
    (folder / "params.json").write_text("{}")
    outside = tmp_path / "secret.txt"
    outside.write_text("x")
    seal = H.HistorySeal.fresh()

    # Entries name their files relative to the outputs folder, never by the server's path.
    good = {"id": "a", "model": "nano", "tab": "t2i", "mode": "t2i", "seed": 1,
            "files": {"image": f"{folder.name}/image.png", "sidecar": f"{folder.name}/params.json"}}
    unsealed = dict(good, id="d")  # before issue 42 entries had no seal: they are dropped
    forged = dict(good, id="b", files={"image": str(outside)})
    sneaky = dict(good, id="c", files={"image": f"{folder.name}/../../secret.txt"})
    broken = [None, "x", dict(good, files="nope"), dict(good, tab="admin"), dict(good, files={})]
    sealed = [seal.sign(e) for e in (good, forged, sneaky, *broken[2:])]
    cleaned = H.clean([*sealed, unsealed, *broken[:2]], seal)
    assert [e["id"] for e in cleaned] == ["a"]
    assert H.clean([H.HistorySeal.fresh().sign(good)], seal) == []  # another server's (or a guessed) key
    assert H.clean("not a list", seal) == []
    shown = H.gallery_items(cleaned[:1])
    assert len(shown) == 1 and shown[0][1] == "nano · T2I · seed 1"
    assert Path(shown[0][0]).read_bytes() == b"png" and str(root) not in shown[0][0]  # a capability copy
    assert H.entry_at(cleaned, 0) is cleaned[0] and H.entry_at(cleaned, 2) is None
    # Downloads are named by model, mode, seed and request id, beside the result, plus one zip.
    named = folder / "downloads" / "nano_t2i_seed1_a"
    assert H.download_paths(good) == [f"{named}.png", f"{named}_params.json", f"{named}.zip"]
    assert Path(f"{named}.png").read_bytes() == b"png"
    with zipfile.ZipFile(f"{named}.zip") as bundle:
        assert sorted(bundle.namelist()) == ["nano_t2i_seed1_a.png", "nano_t2i_seed1_a_params.json"]
    many = H.add([seal.sign(good)] * (H.HISTORY_LIMIT + 5), dict(good, id="new"), seal)
    assert len(many) == H.HISTORY_LIMIT and many[0]["id"] == "new" and seal.verifies(many[0])


def test_caption_editor_messages():
    caption, message = describe_problem('{\n  "a": 1\n  "b": 2\n}', "video")
    assert caption is None and "Line 3, column 3" in message and "^" in message
    caption, message = describe_problem('{"subjects": {"x": 1}}', "video")
    assert caption is not None and "subjects" in message and "must be a list" in message
    caption, message = describe_problem('{"quadrant_scan": {}}', "video")
    assert caption is not None and "image captions" in message  # a warning, shown but not blocking
    assert describe_problem('{"context": "fine"}', "image") == ({"context": "fine"}, "")
    escaped = describe_problem('{"context": "<script>" "oops"}', "image")[1]
    assert "&lt;script&gt;" in escaped and "<script>" not in escaped  # user text is escaped in the HTML


def test_actions_plot_is_an_image():
    from cosmos3_ui.plots import actions_from_file, actions_plot

    image = actions_plot(np.random.default_rng(0).normal(size=(16, 10)), domain="umi", fps=20)
    assert image.dtype == np.uint8 and image.ndim == 3 and image.shape[2] == 3 and image.std() > 0
    assert actions_from_file(ASSETS / "media" / "umi_push_right.json").shape == (16, 10)
    assert actions_from_file(ASSETS / "captions" / "negative_video.json") is None


def test_the_actions_plot_names_channels_from_the_domain_table_and_keeps_the_legend_off_the_curves():
    from cosmos3_ui.plots import actions_figure, actions_plot

    figure = actions_figure(np.random.default_rng(0).random((16, 10)), domain="umi", fps=20.0,
                            names=C.channel_names("umi"))
    axes = figure.axes[0]
    legend = axes.get_legend()
    assert [t.get_text() for t in legend.get_texts()] == ["x", "y", "z", "rot1", "rot2", "rot3", "rot4", "rot5",
                                                          "rot6", "gripper"]
    figure.canvas.draw()
    renderer = figure.canvas.get_renderer()
    assert not legend.get_window_extent(renderer).overlaps(axes.get_window_extent(renderer))
    assert actions_plot(np.zeros((4, 2)), names=C.channel_names("pusht")).dtype == np.uint8
    for name in SUPPORTED_DOMAINS:
        assert len(C.channel_names(name)) == ACTION_DOMAINS[name].raw_dim


def _built_studio(models: dict, outputs):
    """The Studio for {name: checkpoint folder}, built (not launched), over a queue that runs nothing."""
    from types import SimpleNamespace

    from cosmos3_ui.layout import Studio
    from cosmos3_ui.service import StudioService

    registry = ModelRegistry([ModelEntry(n, str(p), "tiny random weights") for n, p in models.items()])
    queue = SimpleNamespace(submit=lambda model_name, request, session_id=None: None)
    return Studio(StudioService(registry, queue, outputs))


@pytest.fixture(scope="module")
def studio(tiny_family, tmp_path_factory):
    """The Studio for the tiny family: its components and events for form tests."""
    studio = _built_studio(tiny_family, tmp_path_factory.mktemp("page-outputs"))
    yield studio
    studio.close()


@pytest.fixture(scope="module")
def page(studio):
    return studio.page


def _event(blocks, component, trigger: str):
    """The one handler wired to `component`'s `trigger` event."""
    (fn,) = [fn for fn in blocks.fns.values() if (component._id, trigger) in fn.targets]
    return fn


def _call(blocks, fn, inputs: list, session=None) -> dict:
    """`fn` run the way the server runs it for a browser's event (Gradio's checks and conversions included)."""
    import asyncio

    from gradio.state_holder import SessionState

    return asyncio.run(blocks.process_api(fn, inputs, state=session or SessionState(blocks)))


def _values(page, changes: dict) -> dict:
    """The switch's inputs at their built values, with `changes` ({component: value})."""
    values = {c: c.value for c in F.switch_inputs(page)}
    values.update(changes)
    return values


def test_a_model_switch_keeps_what_still_holds_and_says_what_it_reset(page, models):
    t2i, t2v = page.t2i, page.t2v
    edge = copy.deepcopy(models["edge"])
    edge["defaults"]["t2i"].update(resolutions=[[96, 64]], width=96, height=64)  # 64x64 is not offered there
    v = _values(page, {page.shown_model: "nano", t2i.sampling.steps: 7, t2i.sampling.guidance: 2.5,
                       t2i.resolution: "64x64", t2v.frames: 9, t2v.sampling.steps: 99999})
    out = F.switch_updates(page, models["nano"], edge, v, "t2i")
    assert out[t2i.sampling.steps]["value"] == 7 and out[t2i.sampling.guidance]["value"] == 2.5
    assert out[t2i.resolution]["value"] == "96x64" and out[t2v.frames]["value"] == 9
    note = out[page.switch_note]
    assert "Switched from nano to edge" in note and "resolution 64x64" in note and "does not offer it" in note
    assert "steps 99999" in note  # a value the new model cannot run is reset, and said so
    assert out[page.set_aside] == {"t2i.resolution": "64x64", "t2v.steps": 99999}
    distilled = F.switch_updates(page, models["nano"], models["nano-distilled"], v, "t2i")
    assert distilled[t2i.sampling.steps]["value"] == 4 and "fixed by the distilled" in distilled[page.switch_note]
    aside = distilled[page.set_aside]
    assert aside["t2i.steps"] == 7 and aside["t2i.guidance"] == 2.5
    # Back on a full checkpoint, the values set aside come back, and the note says so.
    now = {**v, page.shown_model: "nano-distilled", page.set_aside: aside, t2i.sampling.steps: 4,
           t2i.sampling.guidance: 1.0}
    back = F.switch_updates(page, models["nano-distilled"], models["nano"], now, "t2i")
    assert back[t2i.sampling.steps]["value"] == 7 and back[t2i.sampling.guidance]["value"] == 2.5
    assert "steps 4 → 7: restored" in back[page.switch_note] and "t2i.steps" not in back[page.set_aside]
    # A switch that changes nothing says nothing.
    same = F.switch_updates(page, models["nano"], models["super"], {**v, t2v.sampling.steps: 30}, "t2i")
    assert same[page.switch_note] == "", same[page.switch_note]


def test_the_variant_panel_says_each_flag_once(models):
    head = C.variant_markdown(models["edge"]).split("\n\n")[0]
    assert head.count("Edge") == 1 and "tiny random weights" in head
    assert C.variant_markdown(models["edge"]).count("tiny random weights") == 1


# Keywords that place or size a component on the page, never a value of a request.
LAYOUT_KEYWORDS = {"height", "width", "min_width", "scale", "lines", "max_lines", "max_height", "max_chars",
                   "columns", "examples_per_page", "figsize", "dpi", "fontsize", "queue_size", "port", "ncol",
                   "default_concurrency_limit"}
# Named constants of the UI that are budgets of its own (time, page size), not limits of a request.
UI_CONSTANTS = {"RECENT_CANCEL_S", "DURATION_EXTRA_S", "DURATION_MIN_S", "DURATION_MAX_S", "HISTORY_LIMIT",
                "MAX_BATCH_BYTES", "LEGEND_MAX_CHANNELS", "SHORT_ASPECT_TERM"}


def _literal_numbers(tree) -> list:
    """Every int/float literal of a module, except layout keywords' values and the UI's own budgets."""
    import ast

    skipped = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.keyword) and node.arg in LAYOUT_KEYWORDS:
            skipped |= {id(n) for n in ast.walk(node.value)}
        if isinstance(node, ast.arguments):  # a parameter's default, e.g. queue_size: int = 16
            named = node.posonlyargs + node.args
            pairs = list(zip(named[len(named) - len(node.defaults):], node.defaults))
            pairs += [(a, d) for a, d in zip(node.kwonlyargs, node.kw_defaults) if d is not None]
            skipped |= {id(n) for a, d in pairs if a.arg in LAYOUT_KEYWORDS for n in ast.walk(d)}
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") in UI_CONSTANTS for t in node.targets):
            skipped |= {id(n) for n in ast.walk(node.value)}
    return [n for n in ast.walk(tree) if isinstance(n, ast.Constant) and type(n.value) in (int, float)
            and id(n) not in skipped]


def test_no_limit_is_a_literal_in_the_ui():
    """Limits come from the engine (`engine.sampling_limits` and the tables beside it): no number control
    carries a literal bound, and no module of the UI (its review desk aside, which rates results and
    builds no request) holds one of the engine's limit values as a literal."""
    import ast

    from engine.model import action as A
    from engine.model import defaults as D

    root = Path(__file__).resolve().parents[3] / "cosmos3_ui"
    bounds = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call):
                for kw in node.keywords:
                    if kw.arg in ("minimum", "maximum") and isinstance(kw.value, ast.Constant) and kw.value.value:
                        bounds.append(f"{path.name}:{node.lineno} {kw.arg}={kw.value.value}")
    assert bounds == []
    limits = {D.STEPS_MAX, D.GUIDANCE_MAX, D.FLOW_SHIFT_MAX, D.FPS_MAX, D.PROMPT_MAX_CHARS, D.TIMESTEP_MAX,
              D.SEED_MAX, D.T2I_GUIDANCE_INTERVAL[0], D.DEFAULT_FPS, D.DEFAULT_ACTION_TIER, D.DEFAULT_ACTION_CHUNK,
              *A.CHUNK_RANGE, *A.RESOLUTION_TIERS, A.MODEL_ACTION_WIDTH}
    modules = sorted(root.glob("*.py"))
    assert len(modules) > 15  # every module of the UI, not a chosen few
    found = [f"{path.name}:{node.lineno} {node.value}" for path in modules
             for node in _literal_numbers(ast.parse(path.read_text(encoding="utf-8"))) if node.value in limits]
    assert found == []


def test_no_module_of_the_ui_reads_another_ones_private_names():
    """Modules talk through public names only: no `other._name` attribute and no `from x import _name`."""
    import ast

    root = Path(__file__).resolve().parents[3]
    found = []
    for path in [root / "app.py", *sorted((root / "cosmos3_ui").rglob("*.py"))]:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
                if not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):
                    found.append(f"{path.name}:{node.lineno} {ast.unparse(node)}")
            if isinstance(node, ast.ImportFrom):
                found += [f"{path.name}:{node.lineno} import {a.name}" for a in node.names
                          if a.name.startswith("_") and not a.name.startswith("__")]
    assert found == []


def test_a_refusal_marks_the_control_its_field_names_never_by_its_words(page):
    t2i, action = page.t2i, page.action
    marked = lambda out: {c for c, u in out.items() if isinstance(u, dict) and u.get("elem_classes") == ["field-error"]}
    out = F.error_updates(t2i, StudioError("prompt: Caption field error: subjects[0].age: ...", "prompt.subjects[0].age",
                                           excerpt="   3 | x\n     | ^"))
    assert marked(out) == {t2i.editor.code} and "^" in out[t2i.editor.message]
    out = F.error_updates(t2i, StudioError("guidance_interval must satisfy ...", "guidance_interval"))
    assert marked(out) == {t2i.sampling.interval_lo, t2i.sampling.interval_hi} and t2i.sampling.message in out
    out = F.error_updates(page.t2v, StudioError("Size 8x8 is not allowed", "width"))
    assert marked(out) == {page.t2v.resolution} and page.t2v.canvas_message in out
    out = F.error_updates(action, StudioError("action.chunk_size must be a multiple of 4", "action.chunk_size"))
    assert marked(out) == {action.chunk_size} and action.upload_message in out
    out = F.error_updates(action, StudioError("The image 'x.png' could not be decoded", "image"))
    assert marked(out) == {action.image} and "First frame (image): The image" in out[action.upload_message]
    # Words that name a control do not place the message: only the field does.
    out = F.error_updates(t2i, StudioError("steps must be in [1, 200], got 99999.", ""))
    assert marked(out) == set() and set(out) == {t2i.result.status}
    cleared = F.clear_errors(t2i)
    assert t2i.editor.code in cleared and all(c in F.error_outputs(t2i) for c in cleared)


def test_the_browsers_repeated_model_switch_event_is_harmless(tiny_family, tmp_path):
    """Gradio's dropdown sends its `input` event twice for one pick, and both calls carry the form as it
    was before the switch. The second one used to be refused by Gradio's own check of the size against
    the new model's choices (the first call had already changed them), and the browser showed that
    refusal instead of the switch. Here both calls run against one session, as they do in the server."""
    from gradio.state_holder import SessionState
    from harness import with_family_canvases

    edge_sizes = with_family_canvases(tiny_family["edge"], tmp_path / "edge-family-sizes")
    studio = _built_studio({"nano": tiny_family["nano"], "edge-family-sizes": edge_sizes}, tmp_path / "outputs")
    try:
        page, blocks = studio.page, studio.blocks
        switch = _event(blocks, page.model, "input")
        form = [c.value for c in switch.inputs]  # the built form, as the browser holds it before the switch
        form[switch.inputs.index(page.model)] = "edge-family-sizes"
        edge_choices = [f"{w}x{h}" for w, h in FAMILY_TABLE["edge"].image_sizes]
        assert page.t2i.resolution.value not in edge_choices  # the stale size the repeat carries
        session = SessionState(blocks)
        first, second = _call(blocks, switch, list(form), session), _call(blocks, switch, list(form), session)
        shown = session[page.shown_model._id]
        choices = [value for _, value in session[page.t2i.resolution._id].choices]
    finally:
        studio.close()
    assert shown == "edge-family-sizes"
    assert choices == edge_choices
    assert first["data"][switch.outputs.index(page.variant)].startswith("**edge-family-sizes** ·")
    # The repeat finds the controls already following the model: it changes nothing.
    assert all(set(update) <= {"__type__"} for update in second["data"] if isinstance(update, dict))


def test_dropping_unknown_keys_from_json_that_no_longer_parses_says_why_and_changes_nothing_else(studio):
    editor = studio.page.t2i.editor
    drop = _event(studio.blocks, editor.drop_unknown, "click")
    out = _call(studio.blocks, drop, ['{"subject": "a cat", "foo": 1'])  # edited into broken JSON since
    message = out["data"][drop.outputs.index(editor.message)]
    assert "caption-error" in message and "Line 1, column 30" in message  # where it stopped parsing
    code = out["data"][drop.outputs.index(editor.code)]
    assert code == {"__type__": "update"}  # the user's text stays as they left it


def test_every_refusal_of_a_run_stands_at_its_control_in_the_pages_words(page, studio, tiny_family):
    """Five bad fields refused at once by the engine: each is shown beside its control, named by the
    control's label (never num_frames/guidance_scale), each control marked, the seed quoted exactly."""
    import engine

    info = engine.inspect_checkpoint(tiny_family["nano"])
    t2v = page.t2v
    bad = {"prompt": "x", "num_frames": 6, "steps": 500, "fps": 0, "guidance_scale": -3, "seed": 99999999999999999999}
    with pytest.raises(ValueError) as caught:
        engine.validate_request(info, "t2v", bad)
    out = F.error_updates(t2v, StudioError.refused(caught.value))
    marked = {c for c, u in out.items() if isinstance(u, dict) and u.get("elem_classes") == ["field-error"]}
    s = t2v.sampling
    assert marked == {t2v.frames, t2v.fps, s.steps, s.guidance, s.seed}
    sampling, canvas = out[s.message], out[t2v.canvas_message]
    assert "Steps must be in [1, 200], got 500;" in sampling and "Seed must be in [-1," in sampling
    assert "Guidance scale must be in [0, 30], got -3." in sampling and "99999999999999999999" in sampling
    assert "Frames must be in" in canvas and "FPS must be in (0, 120], got 0." in canvas
    for text in (sampling, canvas, out[t2v.result.status]):
        assert "num_frames" not in text and "guidance_scale" not in text and "e+" not in text
    assert out[t2v.result.status].count("must be") == 5


def test_each_hint_says_the_range_its_refusal_says(models):
    """The hint under a control and the engine's refusal render one limit with one function."""
    import re

    import engine
    from engine.model import defaults as D

    spec = C.sampling_controls(models["nano"], "t2v")
    notes = C.limit_notes(spec)
    limits = spec.limits
    for note, rendered in ((notes.steps, D.render_range(*limits.steps)),
                           (notes.guidance, D.render_range(*limits.guidance_scale)),
                           (notes.flow_shift, D.render_range(*limits.flow_shift, lo_open=True)),
                           (notes.fps, D.render_range(*limits.fps, lo_open=True)),
                           (notes.seed, D.render_range(*limits.seed)),
                           (notes.frames, D.render_frames(*limits.frame_range, limits.frame_step))):
        assert rendered.lower() in note.lower(), (note, rendered)
    assert str(D.SEED_MAX) in notes.seed and "9007199254740991" not in notes.seed
    assert re.search(r"\[1, 200\]", notes.steps) and not hasattr(engine, "UI_SEED_MAX")


def test_the_reasoner_status_line_follows_its_job_queued_reading_writing_done():
    """Not "Queued for the reasoner" all through a Describe: the line says the queue position, then
    reading, then writing with the tokens so far, then done."""
    import asyncio
    from types import SimpleNamespace

    from cosmos3_ui.reasoner_panel import reasoner_updates
    from engine.reasoner import ReasonerText

    events = [Queued(position=1), Started(model_name="m"), ReasonerText("a", 1), ReasonerText("b", 2),
              Finished(result="R")]
    h = FakeHandle()
    h.events = lambda: iter(events)
    service = SimpleNamespace(active=ActiveJobs(), submit=lambda *a, **k: h,
                              queue=SimpleNamespace(eta_seconds=lambda ahead, model=None: 20.0 * ahead))
    box = SimpleNamespace(stream="stream", status="status")

    async def collect():
        return [u async for u in reasoner_updates(service, "m", {"image": "x.png"}, "me", box, "the editor",
                                                  lambda result: {"status": f"done {result}"})]

    statuses = [u["status"] for u in asyncio.run(collect()) if "status" in u]
    assert "Queued: position 2, about 20 s" in statuses[1]
    assert "Reading the image" in statuses[2]
    assert "Writing: 1 token so far" in statuses[3] and "Writing: 2 tokens so far" in statuses[4]
    assert statuses[-1] == "done R"
