"""The engine's promises beyond parity: less work, cancel, failure isolation, outputs, the queue."""
import json
import threading
import time

import pytest
import torch

import engine
from engine.pipeline import denoise, tower  # the stages whose calls the tests below intercept
from engine.events import Cancelled, Failed, Finished, Progress, Queued, Started
from engine.pipeline.run import JobCancelled, generate
from engine.serving.queue import JobFailed, JobQueue, QueueFull
from engine.serving.registry import ModelEntry, ModelRegistry


@pytest.fixture(scope="module")
def nano(tiny_family):
    return engine.load_model(tiny_family["nano"], device="cpu")


def _count_calls(module):
    calls = []
    handle = module.register_forward_hook(lambda *args: calls.append(1))
    return calls, handle


def test_text_tower_runs_once_per_branch(nano):
    und_k = nano.transformer.layers[0].self_attn.to_k  # only the und tower uses it
    gen_q = nano.transformer.layers[0].self_attn.add_q_proj  # only the gen tower uses it
    und_calls, h1 = _count_calls(und_k)
    gen_calls, h2 = _count_calls(gen_q)
    try:
        generate(nano, dict(mode="t2i", prompt="a boat", steps=5, guidance_scale=3.0, guidance_interval=None))
    finally:
        h1.remove()
        h2.remove()
    assert len(und_calls) == 2  # cond and uncond, once each for the whole request
    assert len(gen_calls) == 10  # both branches at each of 5 steps

    # The reference recomputes the text tower at every step and branch.
    und_calls, h1 = _count_calls(und_k)
    try:
        pipe = nano.diffusers_pipeline(nano.make_scheduler(flow_shift=3.0))
        pipe("a boat", num_frames=1, height=64, width=64, num_inference_steps=5, guidance_scale=3.0)
    finally:
        h1.remove()
    assert len(und_calls) == 10


def test_guidance_one_runs_one_forward_per_step(nano):
    und_k = nano.transformer.layers[0].self_attn.to_k
    gen_q = nano.transformer.layers[0].self_attn.add_q_proj
    und_calls, h1 = _count_calls(und_k)
    gen_calls, h2 = _count_calls(gen_q)
    try:
        generate(nano, dict(mode="t2v", prompt="a boat", steps=4, guidance_scale=1.0))
    finally:
        h1.remove()
        h2.remove()
    assert len(und_calls) == 1 and len(gen_calls) == 4


def test_progress_reports_every_step_with_eta(nano):
    events = []
    generate(nano, dict(mode="t2i", prompt="a boat", steps=6), on_progress=events.append)
    denoise = [e for e in events if isinstance(e, Progress) and e.stage == "denoise"]
    assert [e.step for e in denoise] == [1, 2, 3, 4, 5, 6] and all(e.total == 6 for e in denoise)
    assert denoise[-1].eta_s == 0 and all(e.eta_s is not None and e.elapsed_s >= 0 for e in denoise)


def test_cancel_stops_within_one_step_and_writes_nothing(nano, tmp_path):
    cancel = threading.Event()
    seen = []

    def on_progress(event):
        seen.append(event.step)
        if event.step == 2:
            cancel.set()

    with pytest.raises(JobCancelled):
        generate(nano, dict(mode="t2i", prompt="a boat", steps=20), on_progress=on_progress, cancel=cancel,
                 outputs_root=tmp_path)
    assert seen == [1, 2]
    assert list(tmp_path.iterdir()) == []
    # The engine is ready for the next request.
    assert generate(nano, dict(mode="t2i", prompt="a boat", steps=2)).frames.shape == (1, 64, 64, 3)


def test_outputs_and_sidecar(nano, tmp_path):
    result = generate(nano, dict(mode="t2v", prompt="a boat", steps=2, seed=42, sound=True), outputs_root=tmp_path,
                      model_name="nano")
    folder = result.output_dir
    assert folder.parent == tmp_path and sorted(p.name for p in folder.iterdir()) == ["params.json", "video.mp4"]
    sidecar = json.loads((folder / "params.json").read_text())
    assert sidecar["seed"] == 42 and sidecar["params"]["steps"] == 2 and sidecar["params"]["sound"] is True
    assert sidecar["prompt_text"] == result.prompt_text and sidecar["model"]["family"] == "nano"
    assert sidecar["files"] == {"video": "video.mp4"} and "denoise" in sidecar["timings"]
    import av

    with av.open(str(folder / "video.mp4")) as container:
        assert container.streams.video[0].codec_context.name == "h264"
        assert len(container.streams.audio) == 1
        assert sum(1 for _ in container.decode(video=0)) == 9
    image = generate(nano, dict(mode="t2i", prompt="a boat", steps=2), outputs_root=tmp_path)
    from PIL import Image

    with Image.open(image.outputs["image"]) as png:
        assert png.size == (64, 64)
    assert image.output_dir != result.output_dir


def test_unusable_outputs_folder_fails_clearly(nano, tmp_path):
    from engine.pipeline.outputs import OutputError

    blocked = tmp_path / "blocked"
    blocked.write_text("a file where the folder should be")
    with pytest.raises(OutputError, match="Cannot create an output folder under .*blocked"):
        generate(nano, dict(mode="t2i", prompt="a boat", steps=1), outputs_root=blocked)
    assert blocked.read_text() == "a file where the folder should be"


def test_failed_save_leaves_no_folder(nano, tmp_path, monkeypatch):
    from engine.pipeline import outputs

    def broken_png(path, frame):
        path.write_bytes(b"partial")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(outputs, "_write_png", broken_png)
    with pytest.raises(outputs.OutputError, match="No space left on device"):
        generate(nano, dict(mode="t2i", prompt="a boat", steps=1), outputs_root=tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_an_ffmpeg_that_dies_before_encoding_fails_the_save_instead_of_leaving_no_video(tmp_path, monkeypatch):
    """What CI met in a Ray replica: the fork that was to become ffmpeg aborted. A short clip fits in the
    pipe's buffer, so nothing complained, and the result folder had no video.mp4."""
    import imageio_ffmpeg._io
    import numpy as np

    from engine.pipeline import outputs

    # It takes every frame (as the pipe's buffer did in CI), then dies without writing anything. One that
    # died first would make the writes fail loudly instead, which was never the problem.
    aborting = tmp_path / "ffmpeg"
    aborting.write_text("#!/bin/sh\ncat > /dev/null\nkill -ABRT $$\n")
    aborting.chmod(0o755)
    monkeypatch.setattr(imageio_ffmpeg._io, "get_ffmpeg_exe", lambda: str(aborting))
    frames = np.zeros((5, 64, 64, 3), np.uint8)
    root = tmp_path / "out"
    with pytest.raises(outputs.OutputError, match="ffmpeg wrote no video to video.mp4 \\(5 frames of 64x64"):
        outputs.save_result(root, "r1", frames=frames, fps=16, actions=None, audio=None, sample_rate=None, sidecar={})
    assert list(root.iterdir()) == []


@pytest.fixture
def queue(tiny_family, tmp_path):
    registry = ModelRegistry([ModelEntry(n, str(tiny_family[n]), "tiny") for n in ("nano", "edge", "super")])
    jobs = JobQueue(registry, tmp_path / "out", max_size=3)
    yield jobs
    jobs.close()


def _drain(handle, timeout=120):
    return list(handle.events(timeout=timeout))


def test_queue_runs_jobs_with_typed_events(queue):
    handle = queue.submit("edge", dict(mode="t2i", prompt="a boat", steps=2), session_id="s1")
    events = _drain(handle)
    assert isinstance(events[0], Queued) and isinstance(events[1], Started) and isinstance(events[-1], Finished)
    assert any(isinstance(e, Progress) and e.stage == "denoise" for e in events)
    result = handle.result(timeout=1)
    assert result.outputs["image"].is_file() and handle.position() == 0


def test_queue_refuses_bad_requests_at_submit(queue):
    with pytest.raises(ValueError, match="Allowed sizes"):
        queue.submit("nano", dict(mode="t2i", prompt="x", width=1024, height=1024))
    with pytest.raises(ValueError, match="Unknown model 'nope'"):
        queue.submit("nope", dict(mode="t2i", prompt="x"))
    with pytest.raises(ValueError, match="does not support mode 'action'"):
        queue.submit("super", dict(mode="action", image="a.png", action={"kind": "policy", "domain": "av"}))


def test_queue_full_answers_clearly_and_cancel_of_waiting_jobs(queue):
    gate = threading.Event()
    original = denoise.gen_tokens

    def slow_tokens(*args, **kwargs):
        gate.wait(30)
        return original(*args, **kwargs)

    denoise.gen_tokens = slow_tokens
    try:
        running = queue.submit("nano", dict(mode="t2i", prompt="first", steps=1))
        while running.position() != 0 or queue._running is None:
            time.sleep(0.01)
        waiting = [queue.submit("nano", dict(mode="t2i", prompt=f"job {i}", steps=1)) for i in range(3)]
        assert [w.position() for w in waiting] == [1, 2, 3]
        with pytest.raises(QueueFull, match="queue is full"):
            queue.submit("nano", dict(mode="t2i", prompt="one too many", steps=1))
        waiting[1].cancel()
    finally:
        gate.set()
        denoise.gen_tokens = original
    assert isinstance(_drain(running)[-1], Finished)
    assert isinstance(_drain(waiting[0])[-1], Finished)
    assert isinstance(_drain(waiting[1])[-1], Cancelled)
    assert isinstance(_drain(waiting[2])[-1], Finished)


def test_running_job_cancel_stops_within_a_step(queue):
    handle = queue.submit("nano", dict(mode="t2i", prompt="long", steps=200))
    steps = []
    for event in handle.events(timeout=120):
        if isinstance(event, Progress) and event.stage == "denoise":
            steps.append(event.step)
            if event.step == 3:
                handle.cancel()
    assert isinstance(event, Cancelled) and steps[-1] <= 4
    with pytest.raises(JobCancelled):
        handle.result(timeout=1)


def test_out_of_memory_fails_the_job_and_the_worker_keeps_serving(queue, monkeypatch):
    original = tower.gen_forward
    calls = {"n": 0}

    def flaky(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 2:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 80.00 GiB")
        return original(*args, **kwargs)

    monkeypatch.setattr(tower, "gen_forward", flaky)
    failed = queue.submit("nano", dict(mode="t2i", prompt="big", steps=3))
    last = _drain(failed)[-1]
    assert isinstance(last, Failed) and last.kind == "oom" and "ran out of memory" in last.message
    with pytest.raises(JobFailed, match="ran out of memory"):
        failed.result(timeout=1)
    ok = queue.submit("nano", dict(mode="t2i", prompt="small", steps=2))
    assert isinstance(_drain(ok)[-1], Finished)


def test_failed_load_keeps_the_loaded_model_serving(tiny_family, tmp_path):
    import shutil

    broken = tmp_path / "broken"
    shutil.copytree(tiny_family["edge"], broken)
    weights = broken / "transformer" / "diffusion_pytorch_model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    registry = ModelRegistry([ModelEntry("nano", str(tiny_family["nano"])), ModelEntry("broken", str(broken))])
    jobs = JobQueue(registry, tmp_path / "out", memory_budget_bytes=1)  # any switch would evict
    try:
        assert isinstance(_drain(jobs.submit("nano", dict(mode="t2i", prompt="a", steps=1)))[-1], Finished)
        last = _drain(jobs.submit("broken", dict(mode="t2i", prompt="a", steps=1)))[-1]
        assert isinstance(last, Failed) and last.kind == "load" and "is corrupt" in last.message
        assert jobs.loaded_models() == ["nano"]
        assert isinstance(_drain(jobs.submit("nano", dict(mode="t2i", prompt="b", steps=1)))[-1], Finished)
    finally:
        jobs.close()


def test_switching_variants_evicts_under_a_small_budget(tiny_family, tmp_path):
    registry = ModelRegistry([ModelEntry(n, str(tiny_family[n])) for n in ("nano", "edge")])
    jobs = JobQueue(registry, tmp_path / "out", memory_budget_bytes=8 * 2**20)
    try:
        _drain(jobs.submit("nano", dict(mode="t2i", prompt="a", steps=1)))
        _drain(jobs.submit("edge", dict(mode="t2i", prompt="a", steps=1)))
        assert jobs.loaded_models() == ["edge"]
    finally:
        jobs.close()
    roomy = JobQueue(registry, tmp_path / "out2", memory_budget_bytes=2**30)
    try:
        _drain(roomy.submit("nano", dict(mode="t2i", prompt="a", steps=1)))
        _drain(roomy.submit("edge", dict(mode="t2i", prompt="a", steps=1)))
        assert roomy.loaded_models() == ["nano", "edge"]
    finally:
        roomy.close()


class _Guardrail:
    """A stand-in with the Cosmos guardrail's interface (the real one needs hub weights)."""

    def __init__(self):
        self.texts, self.videos = [], []

    def check_text_safety(self, prompt):
        self.texts.append(prompt)
        return "forbidden" not in prompt

    def check_video_safety(self, frames):
        self.videos.append(frames.shape)
        out = frames.copy()
        out[..., 0] = 0  # a visible edit, as face blurring would be
        return None if getattr(self, "refuse_video", False) else out


def test_safety_checker_runs_on_prompts_and_frames(tiny_family, tmp_path):
    registry = ModelRegistry([ModelEntry("edge", str(tiny_family["edge"]))])
    guard = _Guardrail()
    jobs = JobQueue(registry, tmp_path / "out", safety_checker=guard)
    try:
        done = _drain(jobs.submit("edge", dict(mode="t2i", prompt="a calm lake", steps=1)))[-1]
        assert isinstance(done, Finished) and guard.texts == ["a calm lake"] and guard.videos == [(1, 64, 64, 3)]
        assert float(done.result.frames[..., 0].max()) == 0.0  # what the checker returned is what was kept
        refused = _drain(jobs.submit("edge", dict(mode="t2i", prompt="something forbidden", steps=1)))[-1]
        assert isinstance(refused, Failed) and refused.kind == "refused" and "refused this prompt" in refused.message
        guard.refuse_video = True
        before = set((tmp_path / "out").iterdir())
        blocked = _drain(jobs.submit("edge", dict(mode="t2i", prompt="a calm lake", steps=1)))[-1]
        assert isinstance(blocked, Failed) and "refused the generated result" in blocked.message
        assert set((tmp_path / "out").iterdir()) == before  # nothing saved
    finally:
        jobs.close()


def test_the_guardrail_sees_the_frames_diffusers_would_hand_it():
    """float -> uint8 for the checker as diffusers' `_apply_video_safety_check` does it (np output:
    `(video * 255).astype(np.uint8)`), and back as it does; checked against diffusers' own method."""
    from types import SimpleNamespace

    import numpy as np
    from diffusers import Cosmos3OmniPipeline

    from engine.pipeline.decode import safety_check_frames

    rng = np.random.default_rng(0)
    frames = rng.random((3, 8, 8, 3), dtype=np.float32)
    frames[0, 0, 0] = [0.0, 1.0, 0.5 / 255]  # edges, and a value that rounding and truncation treat apart
    ours_guard, theirs_guard = _Guardrail(), _Guardrail()
    seen = {}
    for name, guard in (("ours", ours_guard), ("theirs", theirs_guard)):
        guard.check_video_safety = lambda pixels, name=name: seen.setdefault(name, pixels.copy())
    ours = safety_check_frames(SimpleNamespace(safety_checker=ours_guard), frames)
    holder = SimpleNamespace(safety_checker=SimpleNamespace(check_video_safety=theirs_guard.check_video_safety,
                                                            to=lambda *a, **k: None))
    theirs = Cosmos3OmniPipeline._apply_video_safety_check(holder, frames.copy(), output_type="np", device="cpu")
    assert seen["ours"].dtype == np.uint8 and np.array_equal(seen["ours"], seen["theirs"])
    assert ours.dtype == theirs.dtype and np.array_equal(ours, theirs)
