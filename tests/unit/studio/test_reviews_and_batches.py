"""Review storage (concurrent writers, restarts, exports) and batch runs (bad lines don't stop a batch)."""
import json
import multiprocessing
import threading

import pytest

from engine.serving.batch import parse_batch, run_batch
from engine.serving.queue import JobQueue
from engine.serving.registry import ModelEntry, ModelRegistry
from cosmos3_ui.review.store import DEFAULT_CRITERIA, ReviewStore, parse_criteria

RID = "20261129-101500-0123456789ab"


def _store_with_result(tmp_path):
    store = ReviewStore(tmp_path / "db" / "reviews.sqlite3")
    folder = tmp_path / RID
    folder.mkdir()
    (folder / "image.png").write_bytes(b"png")
    (folder / "params.json").write_text("{}")
    store.register_result(RID, folder, model="nano", mode="t2i", origin="history")
    return store


def _rate_in_process(root, reviewer, score):
    ReviewStore(root / "db" / "reviews.sqlite3").rate(RID, reviewer, {"visual_quality": score}, notes=f"from {reviewer}")


def test_concurrent_reviewers_are_all_stored_and_survive_a_restart(tmp_path):
    _store_with_result(tmp_path)
    threads = [threading.Thread(target=_rate_in_process, args=(tmp_path, f"thread-{i}", 1 + i % 5)) for i in range(8)]
    context = multiprocessing.get_context("spawn")
    processes = [context.Process(target=_rate_in_process, args=(tmp_path, f"proc-{i}", 5)) for i in range(2)]
    for worker in threads + processes:
        worker.start()
    for worker in threads + processes:
        worker.join(60)
    reopened = ReviewStore(tmp_path / "db" / "reviews.sqlite3")  # a fresh store, as after an app restart
    ratings = reopened.ratings(RID)
    assert sorted(r["reviewer"] for r in ratings) == sorted([f"thread-{i}" for i in range(8)] + ["proc-0", "proc-1"])
    assert all(r["files"] == ["image.png", "params.json"] for r in ratings)


def test_rating_rules(tmp_path):
    store = _store_with_result(tmp_path)
    with pytest.raises(ValueError, match="from 1 to 5"):
        store.rate(RID, "ana", {"visual_quality": 6})
    with pytest.raises(ValueError, match="Unknown criteria"):
        store.rate(RID, "ana", {"vibes": 3})
    with pytest.raises(ValueError, match="not a result id"):
        store.rate("../../etc/passwd", "ana", {"visual_quality": 3})
    with pytest.raises(ValueError, match="No result"):
        store.rate("20261129-101500-ffffffffffff", "ana", {"visual_quality": 3})
    store.rate(RID, "ana", {"visual_quality": 2})
    store.rate(RID, "ana", {"visual_quality": 4}, notes="second look")  # a reviewer's newer rating replaces theirs
    assert [(r["scores"], r["notes"]) for r in store.ratings(RID)] == [({"visual_quality": 4}, "second look")]
    assert parse_criteria("sharpness, motion_smoothness") == ("sharpness", "motion_smoothness")
    assert parse_criteria("") == DEFAULT_CRITERIA
    with pytest.raises(ValueError):
        parse_criteria("Bad Name")


def test_exports_round_trip(tmp_path):
    store = _store_with_result(tmp_path)
    store.rate(RID, "ana", {"prompt_adherence": 5, "visual_quality": 3}, notes='likes the "sky", dislikes, commas')
    store.rate(RID, "ben", {"physics_plausibility": 1})
    jsonl = ReviewStore.read_jsonl(store.export_jsonl())
    assert jsonl == store.ratings()
    rows = ReviewStore.read_csv(store.export_csv())
    assert [(r["reviewer"], r["scores"], r["notes"]) for r in rows] == [(r["reviewer"], r["scores"], r["notes"]) for r in jsonl]
    assert rows[0]["sidecar"].endswith(f"{RID}/params.json")


def test_batch_with_a_bad_line_finishes_the_good_ones(tiny_family, tmp_path):
    registry = ModelRegistry([ModelEntry(n, str(tiny_family[n])) for n in ("nano", "edge")])
    queue = JobQueue(registry, tmp_path / "out")
    reviews = ReviewStore(tmp_path / "db" / "reviews.sqlite3")
    text = "\n".join([
        json.dumps({"model": "nano", "mode": "t2i", "prompt": "a kite", "steps": 1, "seed": 3}),
        "{this is not json",
        json.dumps({"model": "edge", "mode": "t2i", "prompt": "a kite", "width": 4096, "height": 4096}),
        "",
        json.dumps({"model": "unknown", "mode": "t2i", "prompt": "x"}),
        json.dumps({"model": "edge", "mode": "t2v", "prompt": "a kite", "steps": 1, "num_frames": 9}),
    ])
    try:
        batch_id, lines = run_batch(queue, parse_batch(text), on_result=lambda line, result: reviews.register_result(
            result.request_id, result.output_dir, model=line.model, mode=result.params["mode"], origin="batch"))
    finally:
        queue.close()
    assert [(l.line, l.status) for l in lines] == [(1, "done"), (2, "failed"), (3, "failed"), (5, "failed"), (6, "done")]
    assert "not valid JSON" in lines[1].message and "Allowed sizes" in lines[2].message
    assert "Unknown model 'unknown'" in lines[3].message
    report = [json.loads(l) for l in (tmp_path / "out" / batch_id / "report.jsonl").read_text().splitlines()]
    assert [r["status"] for r in report] == ["done", "failed", "failed", "failed", "done"]
    for entry in (lines[0], lines[4]):
        folder = tmp_path / "out" / batch_id / entry.request_id
        assert (folder / "params.json").is_file()
    assert {r["request_id"] for r in reviews.results()} == {lines[0].request_id, lines[4].request_id}


def test_a_batch_line_may_hold_its_caption_as_an_object(tiny_family, tmp_path):
    """Issue 44: a caption object (as JSON Lines nests it) failed with "prompt must be a string, got dict"."""
    caption = {"subjects": [{"description": "a red kite with a long tail"}], "background_setting": "a windy beach"}
    queue = JobQueue(ModelRegistry([ModelEntry("nano", str(tiny_family["nano"]))]), tmp_path / "out")
    sent = []
    try:
        _, [line] = run_batch(queue, parse_batch(json.dumps({"model": "nano", "mode": "t2i", "prompt": caption,
                                                              "steps": 1, "seed": 2})),
                              on_result=lambda _line, result: sent.append(result.params["prompt"]))
    finally:
        queue.close()
    assert (line.status, line.message) == ("done", "")
    assert json.loads(sent[0]) == caption  # the engine got the caption as JSON text and parsed it


def test_a_batch_longer_than_the_queue_runs_and_can_be_cancelled(tiny_family, tmp_path, monkeypatch):
    registry = ModelRegistry([ModelEntry("edge", str(tiny_family["edge"]))])
    queue = JobQueue(registry, tmp_path / "out", max_size=1)
    lines_text = "\n".join(json.dumps({"model": "edge", "mode": "t2i", "prompt": f"cube {i}", "steps": 1, "seed": i})
                           for i in range(4))
    try:
        _, lines = run_batch(queue, parse_batch(lines_text))
        assert [l.status for l in lines] == ["done"] * 4  # four lines through a queue that holds one

        # Cancel the batch while its first line is at step 5 of 100.
        from engine.pipeline import denoise as pipeline  # the loop calls gen_tokens there

        stop, steps = threading.Event(), []
        original = pipeline.gen_tokens

        def counting(*args, **kwargs):
            steps.append(1)
            if len(steps) == 5:
                stop.set()
            return original(*args, **kwargs)

        monkeypatch.setattr(pipeline, "gen_tokens", counting)
        long_lines = parse_batch("\n".join(
            json.dumps({"model": "edge", "mode": "t2i", "prompt": f"slow {i}", "steps": 100}) for i in range(3)))
        _, lines = run_batch(queue, long_lines, cancel=stop)
        assert [l.status for l in lines] == ["cancelled"] * 3
        # The cancel reaches the running job at once, so it stops at its next step (a thread switch or
        # two at most); the others never start. Polling the cancel between waits let ~70 more steps run.
        assert len(steps) <= 8, len(steps)
    finally:
        queue.close()


def test_progress_of_a_worker_thread_reports_the_latest_count_and_ends_with_the_work():
    import asyncio
    import queue

    from cosmos3_ui.common import latest_counts

    async def follow():
        counts, release = queue.SimpleQueue(), threading.Event()

        counts.put((1, 3))  # two counts already waiting at the first look
        counts.put((2, 3))

        def work():
            release.wait(10)
            counts.put((3, 3))
            return "finished"

        task = asyncio.get_running_loop().run_in_executor(None, work)
        seen = []
        async for latest in latest_counts(task, counts, every=0.05):
            seen.append(latest)
            release.set()  # the count after this one comes only once the first look has been taken
        return seen, task.result()

    seen, result = asyncio.run(follow())
    assert seen == [(2, 3), (3, 3)]  # (1, 3) was superseded before the look; the last count is not lost
    assert result == "finished"


def test_a_scan_of_the_outputs_folder_registers_every_reviewable_result_once(tmp_path):
    from cosmos3_ui.review.listing import sync_outputs

    root = tmp_path / "outputs"
    made = {"20261129-101500-0123456789ab": root, "20261129-101501-0123456789ab": root / "batch-x",
            "20261129-101502-0123456789ab": root / "suite-y"}
    for rid, parent in made.items():
        folder = parent / rid
        folder.mkdir(parents=True)
        (folder / "image.png").write_bytes(b"png")
        (folder / "params.json").write_text(json.dumps({"model": {"name": "nano"}, "params": {"mode": "t2i"}}))
    (root / "20261129-101503-0123456789ab").mkdir()  # no params.json: listed with its reason, not registered
    store = ReviewStore(tmp_path / "db" / "reviews.sqlite3")
    listed = sync_outputs(store, root)
    assert [e.reviewable for e in listed] == [False, True, True, True]  # newest first
    results = {r["request_id"]: r["origin"] for r in store.results()}
    assert results == {"20261129-101500-0123456789ab": "outputs folder", "20261129-101501-0123456789ab": "batch:batch-x",
                       "20261129-101502-0123456789ab": "suite:suite-y"}
    sync_outputs(store, root)
    assert len(store.results()) == 3
