"""Compare, review and batch at the UI layer, without a server: the same functions the tabs call,
over a real job queue and the tiny family."""
import asyncio
import json

import anyio
import pytest

from cosmos3_ui import batch as B
from cosmos3_ui.compare import EACH_DEFAULT, CompareSettings, plan_compare, run_compare
from cosmos3_ui.review import ReviewDesk
from cosmos3_ui.service import StudioError, StudioService
from engine.serving.queue import JobFailed, JobQueue
from engine.serving.registry import ModelEntry, ModelRegistry
from cosmos3_ui.review.store import ReviewStore


@pytest.fixture(scope="module")
def service(tiny_family, tmp_path_factory):
    outputs = tmp_path_factory.mktemp("compare-outputs")
    registry = ModelRegistry([ModelEntry(name, str(path)) for name, path in tiny_family.items()])
    job_queue = JobQueue(registry, outputs, max_size=4)
    service = StudioService(registry, job_queue, outputs)
    service.reviews = ReviewStore(tmp_path_factory.mktemp("compare-db") / "reviews.sqlite3")
    try:
        yield service
    finally:
        job_queue.close()


async def _follow(handle):
    try:
        return await anyio.to_thread.run_sync(handle.result)
    except JobFailed as exc:
        raise StudioError(str(exc)) from None


def compare(service, models, settings):
    async def collect():
        slots = plan_compare(service, models, settings)
        return [outcome async for _, outcome in run_compare(service, slots, "test-session", _follow)]

    return asyncio.run(collect())


def test_three_tiny_variants_give_three_results_with_one_seed(service):
    settings = CompareSettings(mode="t2i", prompt="A red kite over a windy beach.", seed=4242, steps=3)
    outcomes = compare(service, ["nano", "edge", "super-distilled"], settings)
    assert [o.model for o in outcomes] == ["nano", "edge", "super-distilled"]
    assert [o.status for o in outcomes] == ["done"] * 3
    assert {o.result.seed for o in outcomes} == {4242}
    assert len({o.result.request_id for o in outcomes}) == 3
    for outcome in outcomes:
        sidecar = json.loads((outcome.result.output_dir / "params.json").read_text())
        assert sidecar["model"]["name"] == outcome.model and outcome.result.outputs["image"].is_file()
    # Steps apply where they are free; the distilled model keeps its fixed schedule and says so.
    assert outcomes[0].result.params["steps"] == 3 and outcomes[2].result.params["steps"] == 4
    assert any("fixed" in note for note in outcomes[2].notes)
    registered = {r["request_id"]: r for r in service.reviews.results()}
    assert all(registered[o.result.request_id]["origin"] == "compare" for o in outcomes)


def test_a_model_that_cannot_run_says_why_in_its_slot(service):
    # 128x64 is offered by the Nano/Super tiny canvases but not by Edge's.
    settings = CompareSettings(mode="t2i", prompt="a lighthouse at dusk", seed=7, size="128x64", steps=2)
    slots = plan_compare(service, ["nano", "edge"], settings)
    assert slots[0].request["width"] == 128 and slots[1].request is None
    assert "does not offer 128x64" in slots[1].reason and "64x64" in slots[1].reason
    outcomes = compare(service, ["nano", "edge"], settings)
    assert [o.status for o in outcomes] == ["done", "skipped"]
    # Frames outside a model's range: the engine's own message, in that slot only.
    video = CompareSettings(mode="t2v", prompt="waves", seed=1, frames=33, size=EACH_DEFAULT)
    slots = plan_compare(service, ["nano", "edge"], video)
    assert all(s.request is None and "num_frames" in s.reason for s in slots)


def test_compare_refuses_fewer_than_two_models(service):
    with pytest.raises(StudioError, match="at least two"):
        plan_compare(service, ["nano"], CompareSettings(mode="t2i", prompt="x", seed=1))


def test_review_desk_rates_shows_and_exports(service, tmp_path):
    desk = ReviewDesk(service.reviews, service.outputs_root)
    request_id = desk.choices()[0][1]
    message = desk.rate(request_id, "ann", {"prompt_adherence": "4", "visual_quality": None}, "kite too small")
    assert "1 of 4 criteria" in message
    view = desk.view(request_id, "ann")
    assert view.own_scores == {"prompt_adherence": 4} and view.own_notes == "kite too small"
    assert view.rows[0][:2] == ["ann", 4] and view.media.endswith("image.png")
    with pytest.raises(StudioError, match="signed-in user"):
        desk.rate(request_id, " ", {"prompt_adherence": "3"}, "")
    csv_rows = ReviewStore.read_csv(open(desk.export("csv")).read())
    jsonl_rows = ReviewStore.read_jsonl(open(desk.export("jsonl")).read())
    assert [r["scores"] for r in csv_rows] == [r["scores"] for r in jsonl_rows] == [{"prompt_adherence": 4}]
    assert not desk.export("csv").startswith(str(service.outputs_root))  # exports are not in the served folder


def test_batch_upload_runs_good_lines_and_reports_bad_ones(service, tmp_path):
    path = tmp_path / "batch.jsonl"
    path.write_text("\n".join([
        json.dumps({"model": "edge", "mode": "t2i", "prompt": "a red cube", "seed": 3, "steps": 2}),
        "{not json",
        json.dumps({"model": "nano", "mode": "i2v", "prompt": "x", "image": "/etc/hostname"}),
        json.dumps({"model": "nano-distilled", "mode": "t2i", "prompt": "a blue sphere", "seed": 4}),
    ]))
    lines = B.read_batch_file(str(path))
    assert [line.status for line in lines] == ["pending", "failed", "failed", "pending"]
    assert "must not name a file" in lines[2].message
    batch_id, report = B.run(service, lines, "batch-session")
    assert [line.status for line in lines] == ["done", "failed", "failed", "done"]
    rows = [json.loads(r) for r in report.read_text().splitlines()]
    assert [r["status"] for r in rows] == ["done", "failed", "failed", "done"] and report.parent.name == batch_id
    origins = {r["request_id"]: r["origin"] for r in service.reviews.results()}
    assert origins[lines[0].request_id] == f"batch:{batch_id}"


def test_the_ui_with_its_review_tabs_imports_neither_torch_nor_kernels():
    import subprocess
    import sys
    from pathlib import Path

    code = ("import sys, cosmos3_ui, cosmos3_ui.review_tabs, cosmos3_ui.review.tabs, cosmos3_ui.review.report, "
            "cosmos3_ui.review.listing, cosmos3_ui.review.runs, cosmos3_ui.batch, cosmos3_ui.zerogpu; "
            "print(sorted(m for m in ('torch', 'cosmos3_kernels', 'engine.pipeline.run') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).resolve().parents[3], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
