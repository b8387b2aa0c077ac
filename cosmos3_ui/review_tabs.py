"""The Compare, Review and Batch tabs: Gradio layout and wiring over `compare`, `review` and `batch`.

Each tab is built inside the Studio's tab strip (`build`) and wired once the page's shared pieces
(history) exist (`wire`). Every event here is private (not part of the public API). Runs go through
the same "gpu" concurrency pool and job queue as the other tabs.
"""
from __future__ import annotations

import asyncio
import queue as stdlib_queue
import secrets
import threading
from dataclasses import dataclass
from typing import Any

import gradio as gr

from engine.pipeline import captions

from . import batch as B
from . import controls as C
from . import history as H
from .assets import PROSE_EXAMPLES
from .common import GPU_POOL, PRIVATE, UI_SEED_MAX, latest_counts, status_html
from .files import publish
from .compare import (
    COMPARE_MODES,
    EACH_DEFAULT,
    CompareSettings,
    outcome_summary,
    outcome_title,
    plan_compare,
    run_compare,
    size_choices,
)
from .jobs import JobFollower, session_of
from .parts import HistoryBox
from .requests import STYLE_JSON, STYLE_PROSE, caption_text, negative_from_text, seed_value
from .service import StudioError, StudioService

MAX_COMPARE_SLOTS = 6


# ==============================================================================================
# Compare
# ==============================================================================================


@dataclass
class SlotBox:
    column: gr.Column
    title: gr.Markdown
    image: gr.Image
    video: gr.Video
    params: gr.JSON


class CompareTab:
    def __init__(self, service: StudioService, jobs: JobFollower):
        self.service = service
        self.jobs = jobs
        self.history: HistoryBox | None = None  # the page's history, given at `wire` (none on the review desk)

    def build(self) -> "CompareTab":
        models = self.service.describe_all()
        names = [m["name"] for m in models]
        self.slot_count = min(len(names), MAX_COMPARE_SLOTS)
        with gr.Tab("Compare", id="compare", elem_id="tab-compare") as self.tab:
            gr.Markdown("One prompt and one seed over several models, run one after another through the same "
                        "queue. A model that cannot run the settings says why in its place. (The studio's model picker "
                        "is not used here.)")
            with gr.Row(equal_height=False):
                with gr.Column(scale=5):
                    self.models = gr.CheckboxGroup(C.model_choices(models), value=names[:3],
                                                   label=f"Models (2 to {self.slot_count})", elem_id="compare-models")
                    self.mode = gr.Radio([("Text to image", "t2i"), ("Text to video", "t2v")], value="t2i",
                                         label="Mode", elem_id="compare-mode")
                    self.prompt = gr.Textbox(PROSE_EXAMPLES["image"], label="Prompt (prose, or one JSON caption object)", lines=4,
                                             max_lines=14, elem_id="compare-prompt")
                    self.negative = gr.Textbox("", label="Negative prompt (optional; distilled models ignore it)",
                                               lines=2, elem_id="compare-negative")
                with gr.Column(scale=4):
                    self.size = gr.Dropdown(size_choices(models, "t2i"), value=EACH_DEFAULT, label="Size",
                                            info="A fixed size applies only to the models that offer it.",
                                            elem_id="compare-size")
                    self.frames = gr.Number(0, label="Frames (0: each model's default)", precision=0, minimum=0,
                                            visible=False, elem_id="compare-frames")
                    self.steps = gr.Number(0, label="Steps (0: each model's default; distilled models keep theirs)",
                                           precision=0, minimum=0, elem_id="compare-steps")
                    with gr.Row(equal_height=True):
                        self.seed = gr.Number(0, label="Seed (the same for every model)", precision=0, minimum=0,
                                              maximum=UI_SEED_MAX, interactive=False, scale=3, elem_id="compare-seed")
                        self.randomize = gr.Checkbox(True, label="Random seed", scale=1, elem_id="compare-randomize")
                    with gr.Row():
                        self.run = gr.Button("Compare", variant="primary", scale=3, elem_id="compare-run")
                        self.cancel = gr.Button("Cancel", variant="stop", scale=1, elem_id="compare-cancel")
                    self.status = gr.HTML("", elem_id="compare-status")
            self.slots: list[SlotBox] = []
            for start in range(0, self.slot_count, 3):
                with gr.Row(equal_height=False):
                    for i in range(start, min(self.slot_count, start + 3)):
                        with gr.Column(min_width=220, visible=False, elem_id=f"compare-slot-{i}") as column:
                            title = gr.Markdown("", elem_id=f"compare-title-{i}")
                            image = gr.Image(label="Result", type="filepath", interactive=False, height=260,
                                             buttons=["download", "fullscreen"], elem_id=f"compare-image-{i}")
                            video = gr.Video(label="Result", interactive=False, format="mp4", height=260,
                                             buttons=["download"], visible=False, loop=True,
                                             elem_id=f"compare-video-{i}")
                            with gr.Accordion("Parameters and timings", open=False):
                                params = gr.JSON(elem_id=f"compare-params-{i}")
                        self.slots.append(SlotBox(column, title, image, video, params))
        return self

    def _outputs(self) -> list:
        out = [self.status] + ([self.history.state, self.history.gallery] if self.history else [])
        for s in self.slots:
            out += [s.column, s.title, s.image, s.video, s.params]
        return out

    def _settings(self, v: dict) -> tuple[CompareSettings, list[str]]:
        mode = v[self.mode]
        if mode not in COMPARE_MODES:
            raise StudioError(f"Pick a mode: text to image or text to video (got {mode!r}).")
        seed = seed_value(v[self.seed], bool(v[self.randomize]))
        if seed < 0:
            seed = secrets.randbelow(UI_SEED_MAX)  # one seed drawn here, so every model gets the same one
        frames = int(v[self.frames] or 0) if mode == "t2v" else 0
        steps = int(v[self.steps] or 0)
        settings = CompareSettings(mode=mode, prompt=caption_text(v[self.prompt], json_style=False), seed=seed,
                                   negative=negative_from_text(v[self.negative]),
                                   size=v[self.size] or EACH_DEFAULT, frames=frames or None, steps=steps or None)
        models = list(v[self.models] or [])
        if len(models) > self.slot_count:
            raise StudioError(f"Compare shows at most {self.slot_count} models at once; {len(models)} are picked.",
                              "model")
        return settings, models

    def _history_entry(self, v: dict, outcome) -> dict:
        text = (v[self.prompt] or "").strip()
        is_json = captions.looks_like_json(text)
        ui = {"editor": {"style": STYLE_JSON if is_json else STYLE_PROSE, "json": text if is_json else "",
                         "prose": "" if is_json else text}, "negative": v[self.negative] or ""}
        mode = outcome.result.params.get("mode", v[self.mode])
        return H.make_entry(model=outcome.model, tab=mode, result=outcome.result, ui=ui)

    def wire(self, history: HistoryBox | None) -> None:
        """`history`: the studio page's history, or None on the review desk (its results go to Review)."""
        self.history = history

        def on_mode(mode):
            models = self.service.describe_all()
            return {self.size: gr.update(choices=size_choices(models, mode), value=EACH_DEFAULT),
                    self.frames: gr.update(visible=mode == "t2v")}

        self.mode.change(on_mode, inputs=self.mode, outputs=[self.size, self.frames], queue=False,
                         api_visibility=PRIVATE)
        self.randomize.change(lambda random: gr.update(interactive=not random), inputs=self.randomize,
                              outputs=self.seed, queue=False, api_visibility=PRIVATE)

        async def compare(v: dict, request: gr.Request, progress=gr.Progress()):
            session = session_of(request)
            try:
                settings, models = self._settings(v)
                slots = plan_compare(self.service, models, settings)
            except StudioError as exc:
                yield {self.status: status_html(str(exc), "error")}
                return
            video = settings.mode == "t2v"
            out: dict[Any, Any] = {self.status: status_html(f"Comparing {len(slots)} models with seed {settings.seed}.",
                                                        "info")}
            for i, box in enumerate(self.slots):
                used = i < len(slots)
                out[box.column] = gr.update(visible=used)
                out[box.title] = f"**{slots[i].model}** · waiting" if used else ""
                out[box.image] = gr.update(value=None, visible=not video)
                out[box.video] = gr.update(value=None, visible=video)
                out[box.params] = None
            yield out
            history = v[self.history.state] if self.history else None
            done = 0

            async def follow(handle):
                return await self.jobs.drive(handle, session, progress)

            async for index, outcome in run_compare(self.service, slots, session, follow):
                box = self.slots[index]
                update: dict[Any, Any] = {box.title: outcome_title(outcome), box.params: outcome_summary(outcome)}
                if outcome.result is not None:
                    done += 1
                    media = outcome.result.outputs.get("video" if video else "image")
                    update[box.video if video else box.image] = publish(media)
                    if self.history is not None:
                        history = H.add(history, self._history_entry(v, outcome), self.service.history_seal)
                        update[self.history.state] = history
                        update[self.history.gallery] = H.gallery_items(history)
                yield update
            kind = "ok" if done == len(slots) else "warn"
            yield {self.status: status_html(f"{done} of {len(slots)} models produced a result with seed "
                                        f"{settings.seed}.", kind)}

        event = self.run.click(
            compare, inputs={self.models, self.mode, self.prompt, self.negative, self.size, self.frames, self.steps,
                             self.seed, self.randomize, *([self.history.state] if self.history else [])},
            outputs=self._outputs(), concurrency_id=GPU_POOL, concurrency_limit=1, trigger_mode="once",
            api_visibility=PRIVATE, api_name="ui_compare", show_progress="minimal", show_progress_on=[self.status],
        )
        self.cancel.click(self.jobs.cancel_handler(self.status), outputs=[self.status],
                          cancels=[event], queue=False, api_visibility=PRIVATE, api_name="ui_compare_cancel")


# ==============================================================================================
# Batch
# ==============================================================================================


class BatchTab:
    def __init__(self, service: StudioService, jobs: JobFollower):
        self.service = service
        self.jobs = jobs

    def build(self) -> "BatchTab":
        with gr.Tab("Batch", id="batch", elem_id="tab-batch") as self.tab:
            gr.Markdown(
                "Upload a JSON Lines file: one request per line in the `/generate` format plus a `\"model\"` "
                f"name, e.g.\n\n`{B.EXAMPLE_LINE}`\n\nLines run through the queue in order; a bad line is "
                "reported and the batch carries on. Results land in `outputs/<batch id>/` with a `report.jsonl`, "
                "and are listed in the Review tab. Requests cannot name files (no image or video conditioning).")
            self.file = gr.File(label="Requests (.jsonl)", file_types=[".jsonl", ".json", ".txt"], file_count="single",
                                elem_id="batch-file")
            self.run = gr.Button("Run batch", variant="primary", elem_id="batch-run")
            self.status = gr.HTML("", elem_id="batch-status")
            self.table = gr.Dataframe(value={"headers": B.STATUS_COLUMNS, "data": []}, label="Lines",
                                      interactive=False, wrap=True, elem_id="batch-lines")
            self.report = gr.File(label="report.jsonl", interactive=False, elem_id="batch-report")
        return self

    def wire(self) -> None:
        service = self.service

        def table(lines):
            return {"headers": B.STATUS_COLUMNS, "data": B.status_rows(lines)}

        async def run(upload, request: gr.Request, progress=gr.Progress()):
            session = session_of(request)
            path = upload if isinstance(upload, str) else getattr(upload, "name", None)
            try:
                lines = B.read_batch_file(path)
            except StudioError as exc:
                yield {self.status: status_html(str(exc), "error")}
                return
            yield {self.table: table(lines), self.report: None,
                   self.status: status_html(f"Running {len(lines)} line(s): {B.counts(lines)}.", "info")}
            ended: stdlib_queue.SimpleQueue = stdlib_queue.SimpleQueue()
            loop = asyncio.get_running_loop()
            # run_batch blocks until every line ends; it runs on a worker thread (see latest_counts)
            stop = threading.Event()
            task = loop.run_in_executor(None, B.run, service, lines, session,
                                        lambda line, done, total: ended.put((done, total)), stop)
            try:
                async for latest in latest_counts(task, ended):
                    progress(latest, desc=f"Batch: {latest[0]} of {latest[1]} done", unit="requests")
                    yield {self.table: table(lines)}
            except (asyncio.CancelledError, GeneratorExit):
                stop.set()  # the page went away or the run was cancelled: stop the batch's running line
                raise
            try:
                batch_id, report = task.result()
            except Exception as exc:  # noqa: BLE001 - the reviewer sees what failed; lines keep their status
                yield {self.table: table(lines), self.status: status_html(f"The batch stopped: {exc}", "error")}
                return
            kind = "ok" if all(line.status == "done" for line in lines) else "warn"
            yield {self.table: table(lines), self.report: publish(report),
                   self.status: status_html(f"Batch {batch_id} finished: {B.counts(lines)}.", kind)}

        self.run.click(run, inputs=self.file, outputs=[self.status, self.table, self.report],
                       concurrency_id=GPU_POOL, concurrency_limit=1, trigger_mode="once", api_visibility=PRIVATE,
                       api_name="ui_batch", show_progress="minimal", show_progress_on=[self.status])
