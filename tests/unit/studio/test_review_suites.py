"""Prompt suites and suite runs: the JSONL format, a run interrupted by a restart that resumes and skips
finished items, the automatic checks (SHA256 determinism, PSNR/SSIM against a reference), blind pairs
that name no configuration, and the offline HTML report, over the tiny family on CPU."""
import json
import re
from types import SimpleNamespace

import pytest

from cosmos3_ui.review.blind import BlindDesk
from cosmos3_ui.review.report import CHECK_COLUMNS, check_summary, html_report
from cosmos3_ui.review.run_tabs import SuitesTab
from cosmos3_ui.review.runs import run_state, run_suite
from cosmos3_ui.review.store import ReviewStore
from cosmos3_ui.review.suites import SuiteError, load_shipped, parse_configurations, parse_suite, shipped_suites
from engine.serving.queue import JobQueue
from engine.serving.registry import ModelEntry, ModelRegistry

SUITE = "\n".join(json.dumps(line) for line in [
    {"id": "kite", "mode": "t2i", "prompt": "A red kite over a windy beach.", "seed": 3},
    {"id": "cube", "mode": "t2i", "prompt": "A blue cube on a wooden table.", "seed": 5},
])
CONFIGS = json.dumps([{"name": "cfg-sun", "model": "nano", "overrides": {"steps": 1}},
                      {"name": "cfg-moon", "model": "nano", "overrides": {"steps": 2}}])


def test_suite_format_and_its_refusals():
    items = parse_suite(SUITE)
    assert [(i.id, i.mode, i.seed) for i in items] == [("kite", "t2i", 3), ("cube", "t2i", 5)]
    shipped = load_shipped("physical_ai_mini")
    assert "physical_ai_mini" in shipped_suites() and len(shipped) >= 8
    assert {i.mode for i in shipped} >= {"t2v", "i2v", "t2i"} and all(i.image for i in shipped if i.mode == "i2v")
    for text, fragment in [
        ('{"id": "a", "mode": "i2v", "prompt": "x", "image": "/etc/hostname"}', "only suites shipped"),
        ('{"id": "a", "mode": "t2i", "prompt": "x", "overrides": {"prompt": "y"}}', "may not set ['prompt']"),
        ('{"id": "a b", "mode": "t2i", "prompt": "x"}', "'id' must be"),
        ('{"id": "a", "mode": "t2i", "prompt": "x"}\n{"id": "a", "mode": "t2i", "prompt": "y"}', "appears twice"),
        ('{"id": "a", "mode": "t2i", "prompt": "x", "sede": 1}', "unknown keys ['sede']"),
        ("{nope", "line 1: not valid JSON"),
    ]:
        with pytest.raises(SuiteError, match=fragment.replace("[", r"\[").replace("]", r"\]")):
            parse_suite(text)
    with pytest.raises(SuiteError, match="unknown model 'nope'"):
        parse_configurations('[{"name": "a", "model": "nope"}]', ["nano"])
    with pytest.raises(SuiteError, match="unique"):
        parse_configurations('[{"name": "a", "model": "nano"}, {"name": "a", "model": "nano"}]', ["nano"])


class CountingQueue:
    """The real queue, counting what is submitted (to see what a resumed run skips)."""

    def __init__(self, queue):
        self.queue, self.submitted = queue, []
        self.outputs_root = queue.outputs_root

    def submit(self, model, request, **kwargs):
        self.submitted.append((model, dict(request)))
        return self.queue.submit(model, request, **kwargs)


def test_a_run_interrupted_by_a_restart_resumes_skips_finished_items_and_records_checks(tiny_family, tmp_path):
    registry = ModelRegistry([ModelEntry("nano", str(tiny_family["nano"]))])
    db = tmp_path / "private" / "reviews.sqlite3"
    store = ReviewStore(db)
    run = store.runs.create("mini", parse_suite(SUITE), parse_configurations(CONFIGS, ["nano"]),
                            reference="cfg-sun", repeat=True, reviewer="alice")
    assert len(run.tasks()) == 2 * 2 + 2  # items x configs, plus one repeat per configuration

    import threading

    first = CountingQueue(JobQueue(registry, tmp_path / "out"))
    stop = threading.Event()
    try:
        done, total = run_suite(store.runs, first, run.run_id, cancel=stop,
                                on_task=lambda d, t: stop.set() if d >= 2 else None)
    finally:
        first.queue.close()
    assert (done, total) == (2, 6) and len(first.submitted) == 2
    assert store.runs.done_counts() == {run.run_id: 2} and store.runs.progress(run.run_id) == (2, 6)
    finished = {k: v["request_id"] for k, v in store.runs.done(run.run_id).items()}
    assert store.runs.checks(run.run_id) == []  # no checks on a partial run

    # "Restart": a fresh store on the same database and a fresh queue.
    store = ReviewStore(db)
    second = CountingQueue(JobQueue(registry, tmp_path / "out"))
    registered = []
    try:
        done, total = run_suite(store.runs, second, run.run_id, register=lambda c, r: registered.append(c.name))
    finally:
        second.queue.close()
    assert (done, total) == (6, 6) and len(second.submitted) == 4 and len(registered) == 4
    assert store.runs.done_counts() == {run.run_id: 6} and [r.run_id for r in store.runs.runs()] == [run.run_id]
    after = store.runs.done(run.run_id)
    assert all(after[k]["request_id"] == rid for k, rid in finished.items())  # finished items were not redone
    checks = {(c["item_id"], c["config"], c["metric"]): c for c in store.runs.checks(run.run_id)}
    assert checks[("kite", "cfg-sun", "deterministic")]["value"] == 1.0
    assert checks[("kite", "cfg-moon", "deterministic")]["value"] == 1.0
    for item in ("kite", "cube"):  # PSNR/SSIM of the two-step result against the one-step reference
        assert 0 < checks[(item, "cfg-moon", "psnr")]["value"] < 100 and -1 <= checks[(item, "cfg-moon", "ssim")]["value"] < 1
        assert (item, "cfg-sun", "psnr") not in checks
    for key in (("kite", "cfg-sun", 0), ("kite", "cfg-sun", 1)):
        assert (tmp_path / "out" / run.run_id / after[key]["request_id"] / "image.png").is_file()

    # Blind pairs: files under neutral names, nothing that names a configuration, a request id or a model.
    blind = BlindDesk(store)
    assert all("cfg-" not in label for label, _ in blind.run_choices())
    view = blind.draw(run.run_id, "bob")
    shown = json.dumps(view.__dict__)
    assert view.media_a.endswith("/A.png") and view.media_b.endswith("/B.png")
    for secret in ("cfg-sun", "cfg-moon", "nano", str(tmp_path), *[r["request_id"] for r in after.values()]):
        assert secret not in shown
    pair = store.pairs.pair(view.pair_id)
    assert {pair.config_a, pair.config_b} == {"cfg-sun", "cfg-moon"} and pair.reviewer == "bob"
    with pytest.raises(Exception, match="another reviewer"):
        blind.judge(view.pair_id, "carol", {"visual_quality": "A"}, "")
    for who in ("bob", "carol"):  # no reveal before the vote is stored, nor to another reviewer
        with pytest.raises(Exception, match="Save your choice first|another reviewer"):
            blind.reveal(view.pair_id, who)
    blind.judge(view.pair_id, "bob", {"visual_quality": "A", "prompt_adherence": "tie"}, "A is sharper")
    assert blind.reveal(view.pair_id, "bob") == f"A was {pair.config_a} (nano); B was {pair.config_b} (nano)."
    with pytest.raises(Exception, match="another reviewer"):
        blind.reveal(view.pair_id, "carol")
    outcome = {o.criterion: o for o in store.pairs.outcomes(run.run_id)}
    assert outcome["visual_quality"].score_a == 1.0 and outcome["visual_quality"].config_a == pair.config_a
    assert blind.draw(run.run_id, "bob").remaining == 1  # the judged pair is not drawn again

    report = html_report(store, store.runs.run(run.run_id))
    (tmp_path / "report.html").write_text(report)
    assert "cfg-sun" in report and "cfg-moon" in report and report.count("data:image/png;base64,") == 4
    # Nothing to fetch: no scripts, no stylesheets, no remote sources (XML namespace ids are not fetched).
    assert "<script" not in report and "<link" not in report
    assert not re.findall(r"""(?:src|href)=["']?(?:https?:|//)|url\(\s*["']?https?:""", report)


TWO_TINY = json.dumps([{"name": "nano-1step", "model": "nano", "overrides": {"steps": 1}},
                       {"name": "nano-2steps", "model": "nano", "overrides": {"steps": 2}}])


def test_the_shipped_suite_runs_to_the_end_under_two_configurations_with_the_determinism_check(tiny_family, tmp_path):
    """Issue 44's acceptance: its caption-object item (`t2v-caption-dock`) failed with "prompt must be a
    string, got dict" and the run never finished."""
    registry = ModelRegistry([ModelEntry("nano", str(tiny_family["nano"]))])
    store = ReviewStore(tmp_path / "private" / "reviews.sqlite3")
    items = load_shipped("physical_ai_mini")
    caption = next(i for i in items if isinstance(i.prompt, dict))
    run = store.runs.create("physical_ai_mini", items, parse_configurations(TWO_TINY, ["nano"]),
                            reference="nano-1step", repeat=True, reviewer="alice")
    queue = CountingQueue(JobQueue(registry, tmp_path / "out"))
    try:
        assert run_suite(store.runs, queue, run.run_id) == (2 * len(items) + 2, 2 * len(items) + 2)
    finally:
        queue.queue.close()
    assert store.runs.failed(run.run_id) == [] and store.runs.ended(run.run_id)
    assert run_state(run, store.runs.items(run.run_id)) == "finished"
    sent = [request for _, request in queue.submitted if request["seed"] == caption.seed and
            request["mode"] == caption.mode and request["prompt"].startswith("{")]
    assert len(sent) == 2 and all(json.loads(r["prompt"]) == caption.prompt for r in sent)  # the caption, as text
    summary = {row[0]: dict(zip(CHECK_COLUMNS, row)) for row in check_summary(store, run)}
    for name in ("nano-1step", "nano-2steps"):
        assert summary[name]["determinism"].startswith("same SHA256"), summary[name]
    assert summary["nano-2steps"]["SSIM (mean)"] not in ("-", "") and summary["nano-1step"]["PSNR (mean)"] == "reference"


class FailingOnce:
    """The real queue, but the first submission of `item_prompt` is refused the way the engine refuses a
    request (a ValueError naming the field)."""

    def __init__(self, queue, item_prompt: str):
        self.queue, self.outputs_root, self.prompt, self.refused = queue, queue.outputs_root, item_prompt, 0

    def submit(self, model, request, **kwargs):
        if request["prompt"] == self.prompt and not self.refused:
            self.refused += 1
            raise ValueError("steps: the GPU said no (a simulated refusal)")
        return self.queue.submit(model, request, **kwargs)


def test_a_failed_task_is_shown_with_its_reason_the_run_says_failed_and_resume_retries_it(tiny_family, tmp_path):
    registry = ModelRegistry([ModelEntry("nano", str(tiny_family["nano"]))])
    store = ReviewStore(tmp_path / "private" / "reviews.sqlite3")
    items = parse_suite(SUITE)
    run = store.runs.create("mini", items, parse_configurations(CONFIGS, ["nano"]), reference="cfg-sun",
                            repeat=True, reviewer="alice")
    assert check_summary(store, run)[0][5] == "pending: the run has not ended"
    queue = FailingOnce(JobQueue(registry, tmp_path / "out"), items[0].prompt)  # kite, cfg-sun, attempt 0
    try:
        assert run_suite(store.runs, queue, run.run_id) == (5, 6)
        state = run_state(run, store.runs.items(run.run_id))
        assert state.startswith("failed: 1 item;") and "interrupted" not in state
        suites = SuitesTab(None, SimpleNamespace(store=store))
        assert suites.failed_rows() == [[run.run_id, "kite", "cfg-sun", "steps: the GPU said no (a simulated refusal)"]]
        assert suites.rows()[0][5] == state and suites.rows()[0][4] == "5 of 6"
        # The run ended, so the checks say why they are missing: the first item failed under cfg-sun.
        summary = {row[0]: dict(zip(CHECK_COLUMNS, row)) for row in check_summary(store, run)}
        assert summary["cfg-sun"]["determinism"].startswith("not checked: 'kite' failed: steps: the GPU said no")
        assert summary["cfg-moon"]["determinism"].startswith("same SHA256")
        assert "kite failed: steps: the GPU said no" in summary["cfg-sun"]["note"]
        # Resume runs the failed task again, and only it.
        assert run_suite(store.runs, queue, run.run_id) == (6, 6)
    finally:
        queue.queue.close()
    assert run_state(run, store.runs.items(run.run_id)) == "finished" and store.runs.failed(run.run_id) == []
    summary = {row[0]: dict(zip(CHECK_COLUMNS, row)) for row in check_summary(store, run)}
    assert summary["cfg-sun"]["determinism"].startswith("same SHA256") and summary["cfg-sun"]["note"] == ""
