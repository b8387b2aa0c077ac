"""Form <-> JSON: the tabs' values turned into engine requests, and requests, results and history
entries turned back into the tabs' values.

Everything here maps between components (`parts`) and plain data; nothing runs a job. Decisions
about what a model allows live in `controls`, request building in `requests`.
"""
from __future__ import annotations

from typing import Any

import gradio as gr

from . import controls as C
from . import history as H
from .caption_editor import error_html
from .common import status_html
from .files import publish, publish_all
from .parts import ActionTab, GenTab, Page, ResultBox, SamplingBox
from .plots import actions_from_file, actions_plot
from .requests import (
    STYLE_JSON,
    ActionInputs,
    Sampling,
    action_request,
    image_request,
    negative_from_text,
    prompt_from_editor,
    video_request,
)
from .service import StudioError, StudioService

# ==============================================================================================
# Form -> request
# ==============================================================================================


def gen_inputs(page: Page, tab: GenTab) -> list:
    """The components a generation tab's request is read from."""
    s = tab.sampling
    items = [page.model, *tab.editor.inputs, tab.negative, tab.resolution, s.steps, s.guidance, s.flow_shift,
             s.seed, s.randomize]
    for optional in (s.use_interval, s.interval_lo, s.interval_hi, tab.frames, tab.fps, tab.image, tab.video,
                     tab.sound):
        if optional is not None:
            items.append(optional)
    return items


def gen_request(tab: GenTab, v: dict) -> dict:
    """The engine request a generation tab's values describe; raises StudioError naming the input."""
    s = tab.sampling
    style, code, prose = (v[c] for c in tab.editor.inputs)
    prompt, _warnings = prompt_from_editor(style, code, prose, tab.kind)
    negative = negative_from_text(v[tab.negative], tab.kind)
    sampling = Sampling(
        resolution=v[tab.resolution], steps=v[s.steps], guidance_scale=v[s.guidance], flow_shift=v[s.flow_shift],
        seed=v[s.seed], randomize=v[s.randomize],
    )
    if tab.mode == "t2i":
        sampling.use_interval = bool(v[s.use_interval])
        sampling.interval_lo, sampling.interval_hi = v[s.interval_lo], v[s.interval_hi]
        return image_request(prompt, negative, sampling)
    sampling.frames, sampling.fps = v[tab.frames], v[tab.fps]
    return video_request(prompt, negative, sampling, image=v[tab.image] or None, video=v[tab.video] or None,
                         sound=bool(v[tab.sound]))


def gen_ui_state(tab: GenTab, v: dict) -> dict:
    """What a history entry keeps to restore a generation tab's inputs."""
    style, code, prose = (v[c] for c in tab.editor.inputs)
    return {"editor": {"style": style, "json": code, "prose": prose}, "negative": v[tab.negative]}


def action_inputs(page: Page) -> list:
    a, s = page.action, page.action.sampling
    return [page.model, a.kind, a.domain, a.view_point, a.chunk_size, a.tier, a.fps, a.instruction, a.image,
            a.video, a.actions_file, s.steps, s.guidance, s.flow_shift, s.seed, s.randomize]


def action_tab_request(tab: ActionTab, v: dict) -> dict:
    """The engine request the Action tab's values describe; raises StudioError naming the input."""
    s = tab.sampling
    file_value = v[tab.actions_file]
    need = C.kind_inputs(v[tab.kind])
    inputs = ActionInputs(
        kind=v[tab.kind], domain=v[tab.domain], view_point=v[tab.view_point], chunk_size=v[tab.chunk_size],
        resolution_tier=v[tab.tier], instruction=v[tab.instruction], image=(v[tab.image] or None) if need.image else None,
        video=v[tab.video] or None,
        actions_file=(file_value if isinstance(file_value, str) else getattr(file_value, "name", None))
        if need.actions else None,
    )
    sampling = Sampling(fps=v[tab.fps], steps=v[s.steps], guidance_scale=v[s.guidance], flow_shift=v[s.flow_shift],
                        seed=v[s.seed], randomize=v[s.randomize])
    return action_request(inputs, sampling)


def action_ui_state(tab: ActionTab, v: dict) -> dict:
    return {"action": {"kind": v[tab.kind], "domain": v[tab.domain], "view_point": v[tab.view_point],
                       "chunk_size": v[tab.chunk_size], "tier": v[tab.tier], "fps": v[tab.fps],
                       "instruction": v[tab.instruction]}}


def text_only(request: dict) -> dict:
    """The request a text preview validates: uploads dropped, so the preview never reads a file."""
    out = dict(request)
    for key in ("image", "video"):
        out.pop(key, None)
    if out["mode"] in ("i2v", "v2v"):
        out["mode"] = "t2v"
    return out


def preview_texts(service: StudioService, model: str, request: dict) -> tuple[str, str]:
    """The prompt and negative prompt text the model will receive for `request`."""
    from engine.defaults import validate_request
    from engine.prompts import preview_prompt_texts

    info = service.info(model)
    try:
        validated = validate_request(info, request["mode"], request)
    except ValueError as exc:
        raise StudioError(str(exc)) from None
    return preview_prompt_texts(info, validated)


# ==============================================================================================
# Results and errors -> form
# ==============================================================================================


def result_updates(box: ResultBox, result, model: str) -> dict:
    summary = dict(result.summary(), model=model)
    files = publish_all(p for k, p in result.outputs.items() if k in ("image", "video", "actions", "sidecar"))
    media = result.outputs.get("image") or result.outputs.get("video")
    took = result.timings.get("total")
    return {
        box.status: status_html(f"Done in {took:.1f} s · seed {result.seed}" if took else f"Done · seed {result.seed}",
                                "ok"),
        box.output: publish(media),
        box.used_seed: str(result.seed),
        box.downloads: files,
        box.result_json: summary,
        box.prompt_view: result.prompt_text,
        box.negative_view: result.negative_prompt_text,
    }


def action_result_updates(tab: ActionTab, actions_path, domain: str, params: dict) -> dict:
    if not actions_path:
        return {tab.plot: None, tab.actions_download: None}
    array = actions_from_file(actions_path)
    plot = actions_plot(array, domain=domain, fps=params.get("fps")) if array is not None else None
    return {tab.plot: plot, tab.actions_download: publish(actions_path)}


def history_updates(page: Page, history: list) -> dict:
    return {page.history.state: history, page.history.gallery: H.gallery_items(history)}


def error_updates(tab, exc: StudioError) -> dict:
    """The message in the tab's status line, and beside the input it concerns."""
    message = str(exc)
    out = {tab.result.status: status_html(message, "error")}
    if isinstance(tab, GenTab):
        if exc.field == "caption":
            out[tab.editor.message] = error_html(message)
        elif exc.field == "negative":
            out[tab.negative_message] = error_html(message)
    elif exc.field in ("image", "video", "actions"):
        out[tab.upload_message] = error_html(message)
    return out


def clear_errors(tab) -> dict:
    if isinstance(tab, GenTab):
        return {tab.negative_message: ""}
    return {tab.upload_message: ""}


# ==============================================================================================
# Model -> form
# ==============================================================================================


def sampling_updates(box: SamplingBox, spec: C.SamplingControls) -> dict:
    locked = spec.locked or not spec.available
    out = {
        box.lock_note: gr.update(value=spec.lock_note, visible=bool(spec.lock_note)),
        box.steps: gr.update(value=spec.steps, interactive=not locked),
        box.guidance: gr.update(value=spec.guidance_scale, interactive=not locked),
        box.flow_shift: gr.update(value=spec.flow_shift, interactive=not locked),
    }
    if box.use_interval is not None:
        lo, hi = spec.guidance_interval or (400.0, 1000.0)
        out[box.use_interval] = gr.update(value=spec.guidance_interval is not None, interactive=not locked,
                                          visible=spec.show_interval)
        out[box.interval_lo] = gr.update(value=lo, interactive=not locked, visible=spec.show_interval)
        out[box.interval_hi] = gr.update(value=hi, interactive=not locked, visible=spec.show_interval)
    return out


def gen_tab_updates(tab: GenTab, model: dict) -> dict:
    spec = C.sampling_controls(model, tab.mode)
    out = {
        tab.tab: gr.update(interactive=spec.available),
        tab.notice: gr.update(value=spec.reason or "", visible=not spec.available),
        tab.resolution: gr.update(choices=spec.resolution_choices, value=spec.resolution, interactive=spec.available),
        tab.negative: gr.update(interactive=spec.negative_enabled,
                                info=None if spec.negative_enabled else
                                "Distilled checkpoints do not use a negative prompt."),
        tab.negative_use: gr.update(interactive=spec.negative_enabled),
        tab.result.generate: gr.update(interactive=spec.available),
        **sampling_updates(tab.sampling, spec),
    }
    if tab.frames is not None and spec.frames_range:
        lo, hi = spec.frames_range
        out[tab.frames] = gr.update(minimum=lo, maximum=hi, step=4, value=spec.frames)
        out[tab.fps] = gr.update(value=spec.fps)
    if tab.sound is not None:
        out[tab.sound] = gr.update(value=False, interactive=spec.sound_available,
                                   info=spec.sound_reason or "Adds an audio track to the MP4.")
    return out


def action_updates(tab: ActionTab, model: dict) -> dict:
    spec = C.sampling_controls(model, "action")
    return {
        tab.tab: gr.update(interactive=spec.available),
        tab.notice: gr.update(value=spec.reason or "", visible=not spec.available),
        tab.result.generate: gr.update(interactive=spec.available),
        **sampling_updates(tab.sampling, spec),
    }


def model_updates(page: Page, model: dict, current_tab: str | None = None) -> dict:
    """Everything that follows the model: the variant panel and every tab's controls."""
    out = {page.variant: C.variant_markdown(model)}
    for tab in page.gen_tabs():
        out.update(gen_tab_updates(tab, model))
    out.update(action_updates(page.action, model))
    available = C.tab_availability(model)
    if current_tab and not getattr(available, current_tab)[0]:
        out[page.tabs] = gr.update(selected="t2i")
        out[page.current_tab] = "t2i"
    return out


def model_outputs(page: Page, model: dict) -> list:
    """Every component `model_updates` may touch (a superset is fine for dict returns)."""
    keys = set(model_updates(page, model, "action").keys())
    keys |= {page.tabs, page.current_tab}
    return list(keys)


# ==============================================================================================
# History entry -> form
# ==============================================================================================


def _restore_gen_tab(tab: GenTab, ui: dict, params: dict) -> dict:
    s = tab.sampling
    editor = ui.get("editor", {})
    out = tab.editor.restore(editor.get("style", STYLE_JSON), editor.get("json", ""), editor.get("prose", ""))
    out[tab.negative] = ui.get("negative", "")
    out[tab.resolution] = C.size_label(params.get("width", 0), params.get("height", 0))
    if tab.frames is not None:
        out[tab.frames] = params.get("num_frames")
        out[tab.fps] = params.get("fps")
    if tab.sound is not None and params.get("sound"):
        out[tab.sound] = True
    if s.use_interval is not None:
        interval = params.get("guidance_interval")
        out[s.use_interval] = gr.update(value=interval is not None)
        if interval:
            out[s.interval_lo], out[s.interval_hi] = interval
    return out


def _restore_action_tab(tab: ActionTab, entry: dict, ui: dict, params: dict) -> dict:
    action_ui = ui.get("action", {})
    out: dict[Any, Any] = {}
    for key, component in (("kind", tab.kind), ("domain", tab.domain), ("view_point", tab.view_point),
                           ("chunk_size", tab.chunk_size), ("tier", tab.tier), ("fps", tab.fps),
                           ("instruction", tab.instruction)):
        if key in action_ui:
            out[component] = action_ui[key]
    out.update(action_result_updates(tab, H.file_path(entry, "actions"), action_ui.get("domain", ""), params))
    return out


def _restore_result(tab, entry: dict, model: str) -> dict:
    s, box = tab.sampling, tab.result
    params = entry.get("summary", {}).get("params", {})
    out: dict[Any, Any] = {}
    for key, component in (("steps", s.steps), ("guidance_scale", s.guidance), ("flow_shift", s.flow_shift)):
        if params.get(key) is not None:
            out[component] = params[key]
    out[s.seed] = entry.get("seed", 0)
    out[s.randomize] = False
    summary = entry.get("summary", {})
    out[box.output] = publish(H.media_path(entry))
    out[box.used_seed] = str(entry.get("seed", ""))
    out[box.downloads] = publish_all(H.download_paths(entry))
    out[box.result_json] = dict(summary, model=model)
    out[box.prompt_view] = summary.get("prompt_text", "")
    out[box.negative_view] = summary.get("negative_prompt_text", "")
    note = "Restored the settings of this result with its seed (Random seed is off)."
    if params.get("image") or params.get("video"):
        note += " Upload the conditioning file again to rerun it."
    out[box.status] = status_html(note, "info")
    return out


def restore(page: Page, service: StudioService, entry: dict) -> dict:
    """The updates that bring back a history entry's model, tab, inputs and outputs."""
    model = entry["model"]
    if model not in service.model_names():
        return {page.history.note: f"That result came from model {model!r}, which this server does not serve."}
    out = model_updates(page, service.describe(model))
    out[page.model] = model
    tab_id = entry["tab"]
    out[page.tabs] = gr.update(selected=tab_id)
    out[page.current_tab] = tab_id
    params = entry.get("summary", {}).get("params", {})
    ui = entry.get("ui", {})
    if tab_id in ("t2i", "t2v"):
        tab = page.t2i if tab_id == "t2i" else page.t2v
        out.update(_restore_gen_tab(tab, ui, params))
    else:
        tab = page.action
        out.update(_restore_action_tab(tab, entry, ui, params))
    out.update(_restore_result(tab, entry, model))
    summary = entry.get("summary", {})
    out[page.history.note] = f"Restored: {H.caption_of(entry)} ({entry.get('created', '')})."
    out[page.history.files] = publish_all(H.download_paths(entry))
    out[page.history.params] = summary.get("params", {})
    return out


def restore_outputs(page: Page, model: dict) -> list:
    """Every component `restore` may touch."""
    h = page.history
    keys = set(model_outputs(page, model))
    keys |= {page.model, page.tabs, page.current_tab, h.note, h.files, h.params}
    for tab in page.gen_tabs():
        keys |= set(tab.editor.outputs) | {tab.negative, tab.resolution}
        keys |= {c for c in (tab.frames, tab.fps, tab.sound) if c is not None}
    a = page.action
    keys |= {a.kind, a.domain, a.view_point, a.chunk_size, a.tier, a.fps, a.instruction, a.plot, a.actions_download}
    for tab in page.all_tabs():
        s, box = tab.sampling, tab.result
        keys |= {s.steps, s.guidance, s.flow_shift, s.seed, s.randomize, box.output, box.used_seed, box.downloads,
                 box.result_json, box.prompt_view, box.negative_view, box.status}
        keys |= {c for c in (s.use_interval, s.interval_lo, s.interval_hi) if c is not None}
    return list(keys)
