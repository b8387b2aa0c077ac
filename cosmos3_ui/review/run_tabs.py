"""The Suites tab (start or resume a suite x configurations run, with progress) and the Leaderboard
tab (Bradley-Terry boards, win rates, agreement, automatic checks, exports and the HTML report)."""
from __future__ import annotations

import asyncio
import json
import queue as stdlib_queue
import threading
from pathlib import Path

import gradio as gr

from ..common import GPU_POOL, PRIVATE, latest_counts, status_html
from ..service import StudioError, StudioService
from .desk import ReviewDesk, criterion_label, reviewer_of
from .report import (BOARD_COLUMNS, CHECK_COLUMNS, METHOD, agreement_rows, board_figure, board_rows, boards, check_summary,
                     html_report, win_rows)
from .runs import run_state, run_suite
from .suites import SuiteError, load_shipped, parse_configurations, parse_suite, shipped_suites

RUN_COLUMNS = ["run", "suite", "items", "configurations", "done", "state"]
FAILED_COLUMNS = ["run", "item", "configuration", "reason"]
MAX_SUITE_BYTES = 4 * 2**20


def default_configurations(service: StudioService) -> str:
    """Two configurations over the first two models: a starting point to edit."""
    configs = []
    for name in service.model_names()[:2]:
        overrides = {} if service.describe(name).get("is_distilled") else {"steps": 2}
        configs.append({"name": f"{name}-{'fixed' if not overrides else '2steps'}", "model": name, "overrides": overrides})
    return json.dumps(configs, indent=1)


class SuitesTab:
    def __init__(self, service: StudioService, desk: ReviewDesk):
        self.service = service
        self.store = desk.store
        self._running: set[str] = set()
        self._lock = threading.Lock()

    def build(self) -> "SuitesTab":
        with gr.Tab("Suites", id="suites", elem_id="tab-suites") as self.tab:
            gr.Markdown("Run a prompt suite under several configurations through the queue. A suite is JSON Lines "
                        "(`id`, `mode`, `prompt`, `seed`, optional `image`/`video` for shipped suites, optional "
                        "`overrides`); a configuration is `{\"name\", \"model\", \"overrides\"}`. Finished items are "
                        "kept: a run cut short (restart, closed page) resumes where it stopped.")
            with gr.Row(equal_height=False):
                self.suite = gr.Dropdown(list(shipped_suites()), value=next(iter(shipped_suites()), None),
                                         label="Shipped suite", scale=2, elem_id="suites-suite")
                self.upload = gr.File(label="...or upload a suite (.jsonl)", file_types=[".jsonl"], scale=3,
                                      elem_id="suites-upload")
            self.configs = gr.Code(default_configurations(self.service), language="json", label="Configurations",
                                   elem_id="suites-configs")
            with gr.Row():
                self.reference = gr.Textbox("", label="Reference configuration (for PSNR/SSIM; optional)", max_lines=1,
                                            elem_id="suites-reference")
                self.repeat = gr.Checkbox(True, label="Determinism check: run each configuration's first item twice",
                                          elem_id="suites-repeat")
            self.start = gr.Button("Start run", variant="primary", elem_id="suites-start")
            self.status = gr.HTML("", elem_id="suites-status")
            self.table = gr.Dataframe(value={"headers": RUN_COLUMNS, "data": []}, label="Runs", interactive=False,
                                      wrap=True, elem_id="suites-runs")
            self.failures = gr.Dataframe(value={"headers": FAILED_COLUMNS, "data": []}, label="Failed tasks (Resume "
                                         "runs them again)", interactive=False, wrap=True, elem_id="suites-failed")
            with gr.Row(equal_height=False):
                self.resume_pick = gr.Dropdown([], value=None, label="Run to resume", scale=4, elem_id="suites-resume-run")
                self.resume = gr.Button("Resume", scale=0, min_width=120, elem_id="suites-resume")
        return self

    def rows(self) -> list[list]:
        rows = []
        for run in reversed(self.store.runs.runs()):
            items = self.store.runs.items(run.run_id)
            with self._lock:
                running = run.run_id in self._running
            done = sum(r["status"] == "done" for r in items)
            rows.append([run.run_id, run.suite, len(run.items), ", ".join(c.name for c in run.configs),
                         f"{done} of {len(run.tasks())}", run_state(run, items, running)])
        return rows

    def failed_rows(self) -> list[list]:
        """Every failed task of every run, newest run first: what failed, under which configuration, why."""
        return [[run.run_id, r["item_id"] + (" (repeat)" if r["attempt"] else ""), r["config"], r["message"]]
                for run in reversed(self.store.runs.runs()) for r in self.store.runs.failed(run.run_id)]

    def tables(self) -> dict:
        return {self.table: {"headers": RUN_COLUMNS, "data": self.rows()},
                self.failures: {"headers": FAILED_COLUMNS, "data": self.failed_rows()}}

    def outcome(self, run_id: str, done: int, total: int) -> str:
        """The status line at the end of a run: done, or how many failed and the first reason."""
        failed = self.store.runs.failed(run_id)
        if failed:
            first = failed[0]
            return status_html(f"{run_id}: {done} of {total} generations done; failed: {len(failed)} item(s), e.g. "
                               f"{first['item_id']} under {first['config']}: {first['message']} (see Failed tasks; "
                               "Resume runs them again).", "error")
        if done == total:
            return status_html(f"{run_id}: {done} of {total} generations done; checks recorded.", "ok")
        return status_html(f"{run_id}: {done} of {total} generations done; resume to finish.", "warn")

    def _items(self, suite_name, upload):
        path = upload if isinstance(upload, str) else getattr(upload, "name", None)
        if path:
            file = Path(path)
            if file.stat().st_size > MAX_SUITE_BYTES:
                raise SuiteError(f"The suite file is larger than {MAX_SUITE_BYTES} bytes.")
            return file.stem, parse_suite(file.read_text(encoding="utf-8"))
        if not suite_name:
            raise SuiteError("Pick a shipped suite or upload one.")
        return suite_name, load_shipped(suite_name)

    async def _follow(self, run_id: str, session: str, progress):
        """Run (or resume) `run_id` on a worker thread, yielding progress from this handler's own task."""
        with self._lock:
            if run_id in self._running:
                yield {self.status: status_html(f"{run_id} is already running.", "warn")}
                return
            self._running.add(run_id)
        counts: stdlib_queue.SimpleQueue = stdlib_queue.SimpleQueue()
        stop = threading.Event()

        def register(config, result):
            self.service.record(result, config.model, f"suite:{run_id}")

        loop = asyncio.get_running_loop()
        task = loop.run_in_executor(None, lambda: run_suite(self.store.runs, self.service.queue, run_id,
                                                            register=register, session_id=session,
                                                            on_task=lambda d, t: counts.put((d, t)), cancel=stop))
        try:
            yield self.tables()
            async for latest in latest_counts(task, counts):
                progress(latest, desc=f"Suite run: {latest[0]} of {latest[1]} done", unit="generations")
                yield self.tables()
            done, total = task.result()
        except (asyncio.CancelledError, GeneratorExit):
            stop.set()  # the page went away: stop the running item; the run can be resumed later
            raise
        except Exception as exc:  # noqa: BLE001 - the reviewer sees why; finished items stay recorded
            yield {self.status: status_html(f"The run stopped: {exc}", "error")}
            return
        finally:
            with self._lock:
                self._running.discard(run_id)
        yield {**self.tables(), self.status: self.outcome(run_id, done, total)}

    def wire(self) -> None:
        outputs = [self.status, self.table, self.failures]

        def on_open(current):
            runs = [r.run_id for r in reversed(self.store.runs.runs())]
            return {**self.tables(), self.resume_pick: gr.update(choices=runs, value=current if current in runs else None)}

        self.tab.select(on_open, inputs=self.resume_pick, outputs=[self.table, self.failures, self.resume_pick],
                        queue=False, api_visibility=PRIVATE)

        async def on_start(request: gr.Request, suite_name, upload, configs_text, reference, repeat,
                           progress=gr.Progress()):
            try:
                name, items = self._items(suite_name, upload)
                configs = parse_configurations(configs_text, self.service.model_names())
                run = self.store.runs.create(name, items, configs, reference=(reference or "").strip() or None,
                                             repeat=bool(repeat), reviewer=reviewer_of(request))
            except (SuiteError, StudioError, ValueError, OSError) as exc:
                yield {self.status: status_html(str(exc), "error")}
                return
            yield {self.status: status_html(f"Started {run.run_id}: {len(items)} items x {len(configs)} "
                                            "configurations.", "info")}
            async for update in self._follow(run.run_id, request.session_hash or "suites", progress):
                yield update

        self.start.click(on_start, inputs=[self.suite, self.upload, self.configs, self.reference, self.repeat],
                         outputs=outputs, concurrency_id=GPU_POOL, concurrency_limit=1, trigger_mode="once",
                         api_visibility=PRIVATE, show_progress="minimal", show_progress_on=[self.status])

        async def on_resume(request: gr.Request, run_id, progress=gr.Progress()):
            if not run_id:
                yield {self.status: status_html("Pick a run to resume.", "error")}
                return
            async for update in self._follow(run_id, request.session_hash or "suites", progress):
                yield update

        self.resume.click(on_resume, inputs=self.resume_pick, outputs=outputs, concurrency_id=GPU_POOL,
                          concurrency_limit=1, trigger_mode="once", api_visibility=PRIVATE, show_progress="minimal",
                          show_progress_on=[self.status])


class LeaderboardTab:
    def __init__(self, desk: ReviewDesk):
        self.desk = desk
        self.store = desk.store

    def build(self) -> "LeaderboardTab":
        criteria = self.store.criteria
        with gr.Tab("Leaderboard", id="leaderboard", elem_id="tab-leaderboard") as self.tab:
            gr.Markdown("Blind judgements of a suite run, per criterion: " + METHOD + " Beside them the win-rate "
                        "matrix, inter-rater agreement (Cohen's / Fleiss' kappa) and the automatic checks (PSNR, "
                        "SSIM and LPIPS against the reference, SHA256 determinism).")
            with gr.Row(equal_height=False):
                self.run = gr.Dropdown([], value=None, label="Suite run", scale=4, elem_id="board-run")
                self.criterion = gr.Dropdown([(criterion_label(c), c) for c in criteria], value=criteria[0],
                                             label="Criterion", scale=2, elem_id="board-criterion")
                self.show = gr.Button("Show", variant="primary", scale=0, min_width=100, elem_id="board-show")
            self.status = gr.HTML("", elem_id="board-status")
            self.board = gr.Dataframe(value={"headers": BOARD_COLUMNS, "data": []}, label="Leaderboard",
                                      interactive=False, elem_id="board-table")
            self.wins = gr.Dataframe(value={"headers": ["configuration"], "data": []}, interactive=False,
                                     label="Win rate: row beats column", elem_id="board-wins")
            self.agreement = gr.Dataframe(value={"headers": ["kappa", "reviewers", "shared pairs", "value"], "data": []},
                                          interactive=False, label="Agreement", elem_id="board-agreement")
            self.plot = gr.Plot(label="Scores with intervals, every criterion", elem_id="board-plot")
            self.checks = gr.Dataframe(value={"headers": CHECK_COLUMNS, "data": []}, interactive=False,
                                       label="Automatic checks", elem_id="board-checks")
            with gr.Row():
                self.exports = {key: gr.Button(label, size="sm", elem_id=f"board-export-{key}") for key, label in (
                    ("ratings-csv", "Ratings CSV"), ("ratings-jsonl", "Ratings JSONL"),
                    ("judgements-csv", "Blind judgements CSV"), ("judgements-jsonl", "Blind judgements JSONL"),
                    ("report", "HTML report of the run"))}
            self.file = gr.File(label="Export", interactive=False, height=120, elem_id="board-export")
        return self

    def _show(self, run_id, criterion) -> dict:
        if not run_id:
            return {self.status: status_html("Pick a suite run.", "error")}
        try:
            run = self.store.runs.run(run_id)
        except ValueError as exc:
            return {self.status: status_html(str(exc), "error")}
        by_criterion = boards(self.store, run)
        board = by_criterion.get(criterion)
        headers, rows = win_rows(board)
        judged = sum(int(b.counts.sum()) // 2 for b in by_criterion.values() if b is not None)
        return {self.board: {"headers": BOARD_COLUMNS, "data": board_rows(board)},
                self.wins: {"headers": headers, "data": rows},
                self.agreement: {"headers": ["kappa", "reviewers", "shared pairs", "value"], "data": agreement_rows(board)},
                self.plot: board_figure(by_criterion),
                self.checks: {"headers": CHECK_COLUMNS, "data": check_summary(self.store, run)},
                self.status: status_html(f"{judged} judgement(s) over all criteria in {run_id}." +
                                         (f" {board.too_few.capitalize()}: not ranked." if board and board.too_few else ""),
                                         "warn" if board and board.too_few else "info")}

    def wire(self) -> None:
        choices = lambda current: gr.update(choices=[r.run_id for r in reversed(self.store.runs.runs())], value=current)  # noqa: E731
        self.tab.select(choices, inputs=self.run, outputs=self.run, queue=False, api_visibility=PRIVATE)
        outputs = [self.board, self.wins, self.agreement, self.plot, self.checks, self.status]
        for trigger in (self.show.click, self.run.change, self.criterion.change):
            trigger(self._show, inputs=[self.run, self.criterion], outputs=outputs, api_visibility=PRIVATE)

        def export(key, run_id, request: gr.Request):
            try:
                reviewer_of(request)  # exports are made for a signed-in reviewer, on request only
                if key == "report":
                    if not run_id:
                        raise StudioError("Pick a suite run for the report.")
                    run = self.store.runs.run(run_id)
                    return {self.file: str(self.desk.write_export(f"report-{run_id}.html", html_report(self.store, run))),
                            self.status: status_html("Report ready: one HTML file, readable offline.", "ok")}
                what, kind = key.split("-")
                return {self.file: self.desk.export(kind, what), self.status: ""}
            except (StudioError, ValueError) as exc:
                return {self.status: status_html(str(exc), "error")}

        def exporter(key):
            def handler(run_id, request: gr.Request):
                return export(key, run_id, request)
            return handler

        for key, button in self.exports.items():
            button.click(exporter(key), inputs=self.run, outputs=[self.file, self.status], api_visibility=PRIVATE)
