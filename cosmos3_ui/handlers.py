"""The events of the generation tabs, the history and the scripting API.

Each handler reads the form through `forms`, runs jobs through `jobs.JobFollower` and writes its
result back through `forms`; the page itself is built in `layout`.
"""
from __future__ import annotations

from typing import Callable

import gradio as gr

from . import controls as C
from . import forms as F
from . import history as H
from .assets import negative_caption
from .common import FOLLOW_POOL, GPU_POOL, PRIVATE, status_html
from .jobs import JobFollower, guarded, session_of
from .parts import ActionTab, GenTab, Page
from .service import JobWasCancelled, StudioError, StudioService


class Handlers:
    """Wires the events of one page to one service."""

    def __init__(self, blocks: gr.Blocks, page: Page, service: StudioService, jobs: JobFollower):
        self.blocks = blocks
        self.page = page
        self.service = service
        self.jobs = jobs

    async def run(self, tab, v: dict, build: Callable[[], dict], request: gr.Request, progress):
        """Run the request `build` makes, yielding updates: first the cleared errors, then the job's
        status beside Generate and its previews, last a ("result", result) pair, or the updates that
        say why there is none. Refusals go next to the inputs they concern; the inputs stay as they are.
        """
        box = tab.result
        hide = {box.live: gr.update(visible=False, value=None), box.progress: ""}
        yield {**F.clear_errors(tab), **hide, **F.running_updates(tab),
               box.progress: status_html("Sending the job to the queue ...", "info")}
        shown = ""
        try:
            watching = self.jobs.follow(v[self.page.model], build(), session_of(request), progress,
                                        previews=bool(v[box.live_preview]))
            async for watched in watching:
                if watched.result is not None:
                    yield ("result", watched.result)
                    return
                if watched.cancelling:
                    continue  # Cancel cleared the progress and preview: a step still in flight must not bring them back
                update: dict = {}
                line = self.jobs.status_line(watched.status)
                if line != shown:
                    shown = update[box.progress] = line
                if watched.preview is not None:
                    update.update(F.preview_updates(tab, watched.preview))
                if update:
                    yield update
        except JobWasCancelled as exc:
            yield {box.status: status_html(exc.message(), "warn"), **F.cancelled_updates(tab)}
        except StudioError as exc:
            gr.Warning(str(exc))
            yield {**F.error_updates(tab, exc), **hide, box.output: gr.update(label=F.RESULT_LABEL)}

    def finish(self, tab, model: str, result, ui: dict, history: list, v: dict) -> dict:
        """The updates a finished run shows: its result and the new history entry (which keeps the
        run's uploads beside its result, so History restores them too)."""
        entry = H.make_entry(model=model, tab="action" if isinstance(tab, ActionTab) else tab.mode,
                             result=result, ui=ui)
        entry = H.with_inputs(entry, F.kept_inputs(tab, v, result))
        out = F.result_updates(tab, result, model)
        out.update(F.history_updates(self.page, H.add(history, entry, self.service.history_seal)))
        return out

    def wire_run(self, tab, generate, inputs: list, outputs: list, name: str) -> None:
        """Generate (one GPU slot, once at a time) and its Cancel."""
        box = tab.result
        event = box.generate.click(
            guarded(box.status)(generate), inputs={*inputs, self.page.history.state}, outputs=outputs,
            concurrency_id=FOLLOW_POOL, concurrency_limit=None, trigger_mode="once", api_visibility=PRIVATE,
            show_progress="full", show_progress_on=[box.output], api_name=f"ui_{name}_generate",
        )
        cleared = F.cancelled_updates(tab)
        box.cancel.click(self.jobs.cancel_handler(box.status, box.progress, cleared),
                         outputs=[box.status, *cleared],
                         cancels=[event], queue=False,
                         api_visibility=PRIVATE, api_name=f"ui_{name}_cancel")

    def wire_preview(self, tab, build: Callable[[dict], dict], inputs: list, outputs: list, note: str,
                     name: str) -> None:
        box = tab.result

        def preview(v: dict):
            try:
                prompt_text, negative_text = F.preview_texts(self.service, v[self.page.model], build(dict(v)))
            except StudioError as exc:
                return F.error_updates(tab, exc)
            return {box.prompt_view: prompt_text, box.negative_view: negative_text, box.status: status_html(note, "info")}

        box.preview.click(preview, inputs=set(inputs), outputs=outputs, queue=False, api_visibility=PRIVATE,
                          api_name=f"ui_{name}_preview")

    def wire_limits(self, tab) -> None:
        """Steps follow the flow shift (the scheduler repeats timesteps past a shift's limit); an upload
        is checked as soon as it arrives."""
        page, s = self.page, tab.sampling
        mode = tab.mode if isinstance(tab, GenTab) else "action"

        def on_shift(model, shift):
            spec = C.sampling_controls(self.service.describe(model), mode)
            return gr.update(info=C.steps_note(spec, shift))

        for event in (s.flow_shift.change, self.blocks.load):
            event(on_shift, inputs=[page.model, s.flow_shift], outputs=s.steps, queue=False, api_visibility=PRIVATE)
        if s.reuse is not None:
            s.reuse.click(F.reuse_seed(tab), inputs=tab.result.used_seed, outputs=[s.seed, s.randomize, s.message],
                          queue=False, api_visibility=PRIVATE)
        if isinstance(tab, GenTab) and tab.fit is not None:
            # The page says how this upload will meet the canvas, as the choice and the size change.
            for event in (tab.image.change, tab.fit.change, tab.resolution.change):
                event(F.fit_note_for, inputs=[tab.image, tab.resolution, tab.fit], outputs=tab.fit_note, queue=False,
                      api_visibility=PRIVATE)
        if tab.image is not None:
            message = tab.canvas_message if isinstance(tab, GenTab) else tab.upload_message
            tab.image.upload(lambda image, label=tab.image.label: F.upload_check(image, label), inputs=tab.image,
                             outputs=message, queue=False, api_visibility=PRIVATE)

    # -- text to image / video -------------------------------------------------------------------

    def wire_gen_tab(self, tab: GenTab) -> None:
        page = self.page
        inputs = F.gen_inputs(page, tab)
        outputs = list(dict.fromkeys([*F.result_outputs(tab), tab.editor.code, tab.editor.parsed, *F.error_outputs(tab),
                                      page.history.state, page.history.gallery]))

        async def generate(v: dict, request: gr.Request, progress=gr.Progress()):
            model = v[page.model]
            # The form merged into the JSON once: the request, the history entry and the JSON box share
            # it (each merged, and when the JSON was written from outside the editor parsed, again).
            sent = tab.editor.sent(v)
            async for update in self.run(tab, v, lambda: F.gen_request(tab, v, sent[0]), request, progress):
                if isinstance(update, tuple):
                    out = self.finish(tab, model, update[1], F.gen_ui_state(tab, v, sent[0]), v[page.history.state], v)
                    yield {**out, **F.synced_caption(tab, v, sent)}
                else:
                    yield update

        self.wire_run(tab, generate, inputs, outputs, tab.mode)
        self.wire_limits(tab)
        self.wire_preview(tab, lambda v: F.text_only(F.gen_request(tab, v)), inputs, outputs,
                          "Preview of the text the model will receive.", tab.mode)
        tab.negative_use.click(lambda: negative_caption(tab.kind), outputs=tab.negative, queue=False,
                               api_visibility=PRIVATE)

    # -- action ------------------------------------------------------------------------------------

    def wire_action_controls(self, a: ActionTab) -> None:
        def on_kind(kind):
            need = C.kind_inputs(kind)
            return {a.kind_note: need.note, a.image: gr.update(visible=need.image),
                    a.actions_file: gr.update(visible=need.actions)}

        # `.change` (not `.input`) so that examples and history restores update the uploads shown too.
        a.kind.change(on_kind, inputs=a.kind, outputs=[a.kind_note, a.image, a.actions_file], queue=False,
                      api_visibility=PRIVATE)
        a.domain.change(lambda domain: C.domain_controls(domain).note, inputs=a.domain, outputs=a.domain_note,
                        queue=False, api_visibility=PRIVATE)

        def on_domain(domain):
            # Only a user's pick resets chunk and fps to the domain's typical clip; examples set their own.
            spec = C.domain_controls(domain)
            return {a.chunk_size: spec.chunk_size, a.fps: spec.fps}

        a.domain.input(on_domain, inputs=a.domain, outputs=[a.chunk_size, a.fps], queue=False, api_visibility=PRIVATE)

    def wire_action_tab(self) -> None:
        page, a = self.page, self.page.action
        inputs = F.action_inputs(page)
        outputs = list(dict.fromkeys([*F.result_outputs(a), a.plot, a.actions_download, *F.error_outputs(a),
                                      page.history.state, page.history.gallery]))
        self.wire_action_controls(a)

        async def generate(v: dict, request: gr.Request, progress=gr.Progress()):
            model = v[page.model]
            async for update in self.run(a, v, lambda: F.action_tab_request(a, v), request, progress):
                if isinstance(update, tuple):
                    result = update[1]
                    out = self.finish(a, model, result, F.action_ui_state(a, v), v[page.history.state], v)
                    actions = F.named_outputs(result, model).get("actions")
                    out.update(F.action_result_updates(a, actions, v[a.domain], result.params))
                    yield out
                else:
                    yield update

        self.wire_run(a, generate, inputs, outputs, "action")
        self.wire_limits(a)
        self.wire_preview(a, lambda v: F.action_tab_request(a, v), inputs, outputs,
                          "Preview of the caption the engine builds (canvas from the tier's default; "
                          "the run uses the input's aspect).", "action")

    # -- history -----------------------------------------------------------------------------------

    def wire_history(self, restore_outputs: list) -> None:
        h, seal, blocks = self.page.history, self.service.history_seal, self.blocks

        def on_load(history):
            history = H.clean(history, seal)
            return {h.state: history, h.gallery: H.gallery_items(history)}

        blocks.load(on_load, inputs=h.state, outputs=[h.state, h.gallery], queue=False, api_visibility=PRIVATE)

        def on_select(history, evt: gr.SelectData):
            entry = H.entry_at(H.clean(history, seal), evt.index if evt is not None else None)
            if entry is None:
                return {h.note: "That result is no longer available."}
            return F.restore(self.page, self.service, entry)

        h.gallery.select(on_select, inputs=h.state, outputs=restore_outputs, queue=False, api_visibility=PRIVATE)
        if self.page.results_gallery is not None:
            self.page.results_gallery.wire(h.state, seal, lambda entry: F.restore(self.page, self.service, entry),
                                           restore_outputs)

        def on_clear():
            return {h.state: [], h.gallery: [], h.files: None, h.params: None,
                    h.note: "History cleared (the files stay on the server)."}

        h.clear.click(on_clear, outputs=[h.state, h.gallery, h.files, h.params, h.note], queue=False,
                      api_visibility=PRIVATE)

    # -- scripting API -----------------------------------------------------------------------------

    def wire_api(self) -> None:
        from .api import generate_api, models_api

        service, jobs, api = self.service, self.jobs, self.page.api

        def models() -> list[dict]:
            """Every served model: {name, label, family, is_edge, is_distilled, modes, defaults}.

            `defaults` maps each supported mode to its sampling defaults and limits."""
            return models_api(service)

        gr.api(models, api_name="models", queue=False)

        async def generate(model_name: str, request_json: str, file=None, request: gr.Request = None,
                           progress=gr.Progress()):
            return await generate_api(jobs, model_name, request_json, file, session_of(request), progress)

        api.button.click(
            generate, inputs=[api.model, api.request, api.file], outputs=[api.media, api.result],
            api_name="generate", concurrency_id=GPU_POOL, concurrency_limit=1,
            api_description="Run one request. `request_json` is the engine's request (mode, prompt, width, height, "
                            "num_frames, fps, steps, guidance_scale, guidance_interval, flow_shift, seed, sound, "
                            "action); `file` is the image, video or actions file its mode needs. Returns the image "
                            "or video (or the actions JSON) and a JSON with seed, prompt_text, params and timings.",
        )
