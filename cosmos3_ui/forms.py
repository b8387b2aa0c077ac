"""Form <-> JSON: the tabs' values turned into engine requests, and requests, results and history
entries turned back into the tabs' values.

Everything here maps between components (`parts`) and plain data; nothing runs a job. Decisions
about what a model allows live in `controls`, request building in `requests`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import gradio as gr

from engine.model.defaults import quote_number

from . import controls as C
from . import downloads as D
from . import history as H
from .caption_editor import error_html, known
from .common import status_html
from .files import publish, publish_all, redact
from .parts import ActionTab, GenTab, Page, SamplingBox
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
    items = [page.model, *tab.editor.inputs, tab.editor.parsed, *tab.editor.form_components, tab.negative,
             tab.resolution, s.steps,
             s.guidance, s.flow_shift, s.seed, s.randomize, tab.result.live_preview]
    for optional in (s.use_interval, s.interval_lo, s.interval_hi, tab.frames, tab.fps, tab.image, tab.video,
                     tab.sound, tab.fit):
        if optional is not None:
            items.append(optional)
    return items


def gen_request(tab: GenTab, v: dict, sent_json: str | None = None) -> dict:
    """The engine request a generation tab's values describe, built once and sent as it is: the
    engine parses its caption once, into the `Request` the queue keeps. `sent_json` is the editor's
    `sent` text when the caller already has it (Generate merges the form once per run). Raises
    StudioError naming the input when a box is empty."""
    s = tab.sampling
    style, prose = v[tab.editor.style], v[tab.editor.prose]
    prompt = prompt_from_editor(style, tab.editor.sent_json(v) if sent_json is None else sent_json, prose)
    negative = negative_from_text(v[tab.negative])
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
                         sound=bool(v[tab.sound]), fit=v[tab.fit] if tab.fit is not None else None)


def gen_ui_state(tab: GenTab, v: dict, sent_json: str) -> dict:
    """What a history entry keeps to restore a generation tab's inputs (`sent_json`: the JSON the run sent)."""
    style, prose = v[tab.editor.style], v[tab.editor.prose]
    return {"editor": {"style": style, "json": sent_json, "prose": prose}, "negative": v[tab.negative]}


def synced_caption(tab: GenTab, v: dict, sent: tuple[str, dict | None]) -> dict:
    """The JSON box made to show what was sent (`sent`: the editor's `sent(v)`), when a form edit had
    not reached it yet."""
    text, caption = sent
    return {} if text == v[tab.editor.code] else {tab.editor.code: text, tab.editor.parsed: known(text, caption)}


def action_inputs(page: Page) -> list:
    a, s = page.action, page.action.sampling
    return [page.model, a.kind, a.domain, a.view_point, a.chunk_size, a.tier, a.fps, a.instruction, a.image,
            a.video, a.actions_file, s.steps, s.guidance, s.flow_shift, s.seed, s.randomize, a.result.live_preview]


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


def _uploads(tab) -> dict:
    """{history key: component} of the uploads a tab's run may use."""
    if isinstance(tab, GenTab):
        return {k: c for k, c in (("input_image", tab.image), ("input_video", tab.video)) if c is not None}
    return {"input_image": tab.image, "input_video": tab.video, "input_actions": tab.actions_file}


def kept_inputs(tab, v: dict, result) -> dict:
    """Copies of the run's uploads in its result folder (`inputs/`), so History can bring them back."""
    import shutil
    from pathlib import Path

    if result.output_dir is None:
        return {}
    out = {}
    for key, component in _uploads(tab).items():
        value = v.get(component)
        path = value if isinstance(value, str) else getattr(value, "name", None)
        if not path or not Path(path).is_file():
            continue
        folder = Path(result.output_dir) / "inputs"
        folder.mkdir(exist_ok=True)
        target = folder / Path(path).name
        shutil.copyfile(path, target)
        out[key] = str(target)
    return out


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
    from engine.pipeline.request import validate_request
    from engine.pipeline.prompts import preview_prompt_texts

    info = service.info(model)
    try:
        validated = validate_request(info, request["mode"], request)
    except ValueError as exc:
        raise StudioError.refused(exc) from None
    return preview_prompt_texts(info, validated)


# ==============================================================================================
# Results and errors -> form
# ==============================================================================================


def named_outputs(result, model: str) -> dict[str, str]:
    """A result's files under their download names, and the zip (see `downloads`)."""
    return D.named_files({k: str(p) for k, p in result.outputs.items()}, model=model,
                         mode=result.params.get("mode", ""), seed=result.seed, request_id=result.request_id)


def result_updates(tab, result, model: str) -> dict:
    box = tab.result
    summary = dict(result.summary(), model=model)
    named = named_outputs(result, model)
    files = publish_all(D.download_list(named, with_actions=not isinstance(tab, ActionTab)))
    media = D.named_media(named, result.outputs.get("image") or result.outputs.get("video"))
    took = result.timings.get("total")
    done = f"Done in {took:.1f} s · seed {result.seed}" if took else f"Done · seed {result.seed}"
    if summary.get("precision", "bf16") != "bf16":  # e.g. "FP8 (faster, approximate)": say it where it is seen
        done += f" · {summary['precision']}"
    return {
        box.live: gr.update(value=None, visible=False),
        box.progress: "",
        box.status: status_html(done, "ok"),
        box.output: gr.update(value=publish(media), label=RESULT_LABEL),
        box.used_seed: str(result.seed),
        box.downloads: files,
        box.result_json: summary,
        box.prompt_view: result.prompt_text,
        box.negative_view: result.negative_prompt_text,
    }


RESULT_LABEL = "Result"


def running_updates(tab) -> dict:
    """While a run waits or works: the last run's media is labelled as such, never taken for this one's."""
    return {tab.result.output: gr.update(label=f"{RESULT_LABEL} of the previous run")}


def cancelled_updates(tab) -> dict:
    """A cancelled run: no progress, no preview, and a result area that says it holds nothing of it."""
    box = tab.result
    return {box.progress: "", box.live: gr.update(value=None, visible=False),
            box.output: gr.update(value=None, label=f"{RESULT_LABEL}: cancelled, nothing was made")}


def result_outputs(tab) -> list:
    """Every component `result_updates` and `preview_updates` may touch."""
    box = tab.result
    return [box.status, box.progress, box.live, box.output, box.used_seed, box.downloads, box.result_json, box.prompt_view,
            box.negative_view]


def preview_updates(tab, preview) -> dict:
    """The latest denoising preview, above where the result will be."""
    return {tab.result.live: gr.update(value=preview.image, visible=True,
                                       label=f"Preview at step {preview.step} of {preview.total}")}


def action_result_updates(tab: ActionTab, actions_path, domain: str, params: dict) -> dict:
    if not actions_path:
        return {tab.plot: None, tab.actions_download: None}
    array = actions_from_file(actions_path)
    plot = (actions_plot(array, domain=domain, fps=params.get("fps"), names=C.channel_names(domain))
            if array is not None else None)
    return {tab.plot: plot, tab.actions_download: publish(actions_path)}


def history_updates(page: Page, history: list) -> dict:
    return {page.history.state: history, page.history.gallery: H.gallery_items(history)}


# Where a refusal is shown, by the request key at fault (`RequestError.field`, the engine's words, or
# the UI's own "resolution" and "file"): a place in the tab. Sub-keys ("prompt.subjects[0].age") go
# where their top key goes, unless they are listed themselves.
PLACES = {
    "prompt": "caption", "negative_prompt": "negative",
    "steps": "sampling", "guidance_scale": "sampling", "guidance_interval": "sampling", "flow_shift": "sampling",
    "seed": "sampling",
    "resolution": "canvas", "width": "canvas", "height": "canvas", "num_frames": "canvas", "fps": "canvas",
    "sound": "canvas", "action": "canvas",
    "image": "upload", "video": "upload", "action.actions": "upload", "file": "upload",
}


def _top_key(field: str) -> str:
    return (field or "").split("[")[0].split(".")[0]


def _place(field: str) -> str:
    field = (field or "").split("[")[0]
    return PLACES.get(field) or PLACES.get(_top_key(field), "")


def _control_table(tab) -> dict:
    """{request key: the controls that set it} for one tab."""
    s = tab.sampling
    table = {
        "steps": [s.steps], "guidance_scale": [s.guidance], "flow_shift": [s.flow_shift],
        "guidance_interval": [s.interval_lo, s.interval_hi], "seed": [s.seed], "fps": [tab.fps],
        "image": [tab.image], "video": [tab.video],
    }
    if isinstance(tab, GenTab):
        table.update({"prompt": [tab.editor.code], "negative_prompt": [tab.negative], "resolution": [tab.resolution],
                      "width": [tab.resolution], "height": [tab.resolution], "num_frames": [tab.frames],
                      "sound": [tab.sound]})
    else:
        table.update({"prompt": [tab.instruction], "action.actions": [tab.actions_file], "file": [tab.actions_file],
                      "action.chunk_size": [tab.chunk_size], "action.resolution_tier": [tab.tier],
                      "action.domain": [tab.domain], "action.view_point": [tab.view_point], "action.kind": [tab.kind]})
    return table


def _field_controls(tab, field: str) -> list:
    """The controls a refusal of `field` is about, to mark them."""
    table = _control_table(tab)
    key = (field or "").split("[")[0]
    controls = table.get(key) or table.get(_top_key(key), [])
    return [c for c in controls if c is not None]


def marked_controls(tab) -> list:
    """Every control a refusal may mark (so the next run can unmark them)."""
    return list(dict.fromkeys(c for controls in _control_table(tab).values() for c in controls if c is not None))


def _message_box(tab, place: str):
    if place == "sampling":
        return tab.sampling.message
    if isinstance(tab, GenTab):
        return {"caption": tab.editor.message, "negative": tab.negative_message,
                "canvas": tab.canvas_message, "upload": tab.canvas_message}.get(place)
    return tab.upload_message if place in ("canvas", "upload", "caption") else None


# Engine names a message may use anywhere (no plain word is one of them), and the plain-word keys
# that are renamed only where a message starts with them ("steps must be ...").
_ENGINE_NAMES = ("num_frames", "guidance_scale", "flow_shift", "guidance_interval", "negative_prompt")


def labelled(tab, field: str, message: str) -> str:
    """`message` in the page's words: the engine's names of the field's controls become their labels
    ("num_frames must be ..." reads "Frames must be ...")."""
    import re

    for key in _ENGINE_NAMES:
        controls = _field_controls(tab, key)
        if controls and key in message:
            message = re.sub(rf"\b{key}\b", _label(controls[0]), message)
    key = _top_key(field)
    controls = _field_controls(tab, field)
    if controls and re.match(rf"{re.escape(key)}\b", message):
        message = _label(controls[0]) + message[len(key):]
    return message


def _label(control) -> str:
    return str(control.label or "").split(" (")[0]  # "Resolution (W x H)" -> "Resolution"


def error_updates(tab, exc: StudioError) -> dict:
    """Every refusal of a run (`exc.errors`, one per bad field), each beside the input it concerns in
    the page's words, those inputs marked, and the status line listing them: placed by each refusal's
    field (`RequestError.field`), never by its wording."""
    errors = getattr(exc, "errors", None) or [(exc.field, str(exc))]
    out: dict[Any, Any] = {}
    shown: dict[Any, list[str]] = {}
    for field, message in errors:
        text = labelled(tab, field, message)
        place = _place(field)
        box = _message_box(tab, place)
        controls = _field_controls(tab, field)
        if box is not None:
            # An upload's message names the input it is about, as the page labels it.
            shown.setdefault(box, []).append(f"{controls[0].label}: {text}" if place == "upload" and controls else text)
        if place == "sampling":
            out[tab.sampling.accordion] = gr.update(open=True)
        for control in controls:
            out[control] = gr.update(elem_classes=["field-error"])
    for box, messages in shown.items():
        # The caption's excerpt (its line, a caret) goes with the first refusal, the one it belongs to.
        out[box] = "".join(error_html(m, exc.excerpt if i == 0 and box is _message_box(tab, _place(exc.field)) else "")
                           for i, m in enumerate(messages))
    texts = [labelled(tab, field, message) for field, message in errors]
    head = texts[0] if len(texts) == 1 else f"{len(texts)} inputs need a change: " + " ".join(texts)
    out[tab.result.status] = status_html(head, "error")
    return out


def clear_errors(tab) -> dict:
    """Before a run: no message from the last one, nothing marked."""
    out: dict[Any, Any] = {tab.result.status: "", tab.sampling.message: ""}
    if isinstance(tab, GenTab):
        out.update({tab.negative_message: "", tab.canvas_message: ""})
    else:
        out[tab.upload_message] = ""
    for control in marked_controls(tab):
        out[control] = gr.update(elem_classes=[])
    return out


def error_outputs(tab) -> list:
    """Every component `error_updates` and `clear_errors` may touch."""
    s = tab.sampling
    out = [tab.result.status, s.message, s.accordion, *marked_controls(tab)]
    if isinstance(tab, GenTab):
        out += [tab.editor.message, tab.negative_message, tab.canvas_message]
    else:
        out.append(tab.upload_message)
    return out


def upload_check(image, label: str) -> str:
    """The message under an image input right after an upload: empty when the engine can read it."""
    from engine.pipeline.media import load_image

    if not image:
        return ""
    try:
        load_image(image)
    except ValueError as exc:  # the engine quotes the file it read: in Gradio's cache, so its base name only
        return error_html(redact(f"{label}: {exc}"))
    return ""


def reuse_seed(tab):
    """A click handler for "Reuse seed": the seed of the tab's last result in the box, Random off."""
    s = tab.sampling

    def reuse(used: str):
        used = (used or "").strip()
        if not used:
            return {s.seed: gr.skip(), s.randomize: gr.skip(),
                    s.message: status_html("No result yet in this tab: there is no seed to reuse.", "info")}
        return {s.seed: gr.update(value=used, interactive=True), s.randomize: False, s.message: ""}

    return reuse


def fit_note_for(image, resolution, fit) -> str:
    """The note under the fit choice for the image uploaded now (its size read from the file)."""
    from engine.pipeline.media import load_image

    size = None
    if image:
        try:
            picture = load_image(image)
            size = (picture.width, picture.height)
        except ValueError:
            size = None  # the upload's own message says why it cannot be read
    try:
        canvas = C.parse_size(resolution) if resolution else None
    except ValueError:
        canvas = None
    return C.fit_note(size, canvas, fit or "crop")


# ==============================================================================================
# Model -> form
# ==============================================================================================


def sampling_updates(box: SamplingBox, spec: C.SamplingControls) -> dict:
    """The sampling controls at the model's defaults (values, locks and the limits in their info)."""
    locked = spec.locked or not spec.available
    notes = C.limit_notes(spec)
    out = {
        box.lock_note: gr.update(value=spec.lock_note, visible=bool(spec.lock_note)),
        box.steps: gr.update(value=spec.steps, interactive=not locked, info=notes.steps),
        box.guidance: gr.update(value=spec.guidance_scale, interactive=not locked, info=notes.guidance),
        box.flow_shift: gr.update(value=spec.flow_shift, interactive=not locked, info=notes.flow_shift),
    }
    if box.use_interval is not None:
        lo, hi = spec.guidance_interval or C.INTERVAL_FALLBACK
        out[box.use_interval] = gr.update(value=spec.guidance_interval is not None, interactive=not locked,
                                          visible=spec.show_interval)
        out[box.interval_lo] = gr.update(value=lo, interactive=not locked, visible=spec.show_interval)
        out[box.interval_hi] = gr.update(value=hi, interactive=not locked, visible=spec.show_interval)
    return out


def gen_tab_updates(tab: GenTab, model: dict) -> dict:
    """A generation tab at the model's defaults."""
    spec = C.sampling_controls(model, tab.mode)
    out = {
        tab.tab: gr.update(interactive=spec.available),
        tab.notice: gr.update(value=spec.reason or "", visible=not spec.available),
        tab.resolution: gr.update(choices=spec.resolution_choices, value=spec.resolution, interactive=spec.available),
        # An empty info (not None) so the distilled note goes away on a full checkpoint.
        tab.negative: gr.update(interactive=spec.negative_enabled,
                                info="" if spec.negative_enabled else C.NEGATIVE_UNUSED),
        tab.negative_use: gr.update(interactive=spec.negative_enabled),
        tab.result.generate: gr.update(interactive=spec.available),
        **sampling_updates(tab.sampling, spec),
    }
    if tab.frames is not None and spec.frames_range:
        notes = C.limit_notes(spec)
        out[tab.frames] = gr.update(value=spec.frames, info=notes.frames)
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
    """Everything that follows the model, at its defaults: the variant panel and every tab's controls."""
    out = {page.variant: C.variant_markdown(model), page.shown_model: model["name"], page.switch_note: ""}
    for tab in page.gen_tabs():
        out.update(gen_tab_updates(tab, model))
    out.update(action_updates(page.action, model))
    available = C.tab_availability(model)
    if current_tab and not getattr(available, current_tab)[0]:
        out[page.tabs] = gr.update(selected="t2i")
        out[page.current_tab] = "t2i"
    return out


# -- switching models, keeping what still holds --------------------------------------------------


def switch_inputs(page: Page) -> list:
    """What a model switch reads: the model shown so far, every setting it may keep, and the values
    set aside by earlier switches."""
    out = [page.model, page.current_tab, page.shown_model, page.set_aside]
    for tab in page.all_tabs():
        s = tab.sampling
        out += [s.steps, s.guidance, s.flow_shift]
        out += [c for c in (s.use_interval, s.interval_lo, s.interval_hi) if c is not None]
        if isinstance(tab, GenTab):
            out += [c for c in (tab.resolution, tab.frames, tab.fps, tab.sound) if c is not None]
    return out


def _keep(out: dict, component, value) -> None:
    """Show `value` instead of the default the update would set (other properties stay)."""
    update = dict(out.get(component) or {"__type__": "update"})
    update["value"] = value
    out[component] = update


def _shown(value) -> str:
    return quote_number(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else str(value)


@dataclass
class Settling:
    """One model switch, control by control: a value the new model takes stays; one it cannot take is
    set aside (by `tab.control` key, in the session's `set_aside`) and the model's default shown; a value
    set aside earlier comes back as soon as a model takes it. `changes` names each value that changed."""

    v: dict  # the form's values before the switch
    aside: dict  # {key: value} set aside, updated in place
    out: dict  # the switch's updates, updated in place
    changes: list = field(default_factory=list)

    def settle(self, key: str, component, label: str, fits, default, why: str, own: bool = True):
        """Settle one control; `own`: its value is the user's (not one a distilled checkpoint fixed).
        Returns the value it shows."""
        value = self.v[component]
        held = self.aside.get(key)
        if held is not None and fits(held):
            del self.aside[key]
            _keep(self.out, component, held)
            if held != value:
                self.changes.append(f"{label} {_shown(value)} → {_shown(held)}: restored (set aside at an earlier switch)")
            return held
        if own and fits(value):
            _keep(self.out, component, value)
            return value
        _keep(self.out, component, default)
        if own and key not in self.aside and value not in (None, ""):
            self.aside[key] = value
            why += "; set aside, and restored when you switch to a model that takes it"
        if value != default:
            self.changes.append(f"{label} {_shown(value)} → {_shown(default)}: {why}")
        return default


def _in_range(value, lo, hi) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and lo <= value <= hi


def _settle_sampling(tab, spec: C.SamplingControls, old: C.SamplingControls | None, act: Settling, key: str) -> None:
    """Steps, guidance, shift and interval: the user's values where the new model runs them."""
    s = tab.sampling
    own = not (old is not None and old.locked)  # values a distilled checkpoint fixed are not the user's
    fixed = "fixed by the distilled checkpoint"
    if spec.locked:
        for name, box, wanted in (("steps", s.steps, spec.steps), ("guidance", s.guidance, spec.guidance_scale),
                                  ("flow shift", s.flow_shift, spec.flow_shift)):
            act.settle(f"{key}.{name}", box, name, lambda x, w=wanted: x == w, wanted, fixed, own)
        return
    g_lo, g_hi = spec.limits.guidance_scale
    act.settle(f"{key}.guidance", s.guidance, "guidance", lambda x: _in_range(x, g_lo, g_hi), spec.guidance_scale,
               "outside this model's range", own)
    f_lo, f_hi = spec.limits.flow_shift
    shift = act.settle(f"{key}.flow shift", s.flow_shift, "flow shift", lambda x: _in_range(x, f_lo, f_hi) and x > f_lo,
                       spec.flow_shift, "outside this model's range", own)
    top = C.steps_max(spec, shift)
    act.settle(f"{key}.steps", s.steps, "steps", lambda x: _in_range(x, 1, top), spec.steps,
               f"at most {top} run at flow shift {_shown(shift)}", own)
    act.out[s.steps] = {**act.out[s.steps], "info": C.limit_notes(spec, shift).steps}
    if s.use_interval is not None and spec.show_interval and own:
        for box in (s.use_interval, s.interval_lo, s.interval_hi):
            _keep(act.out, box, act.v[box])


def _settle_canvas(tab: GenTab, spec: C.SamplingControls, act: Settling, key: str) -> None:
    allowed = [value for _, value in spec.resolution_choices]
    act.settle(f"{key}.resolution", tab.resolution, "resolution", lambda x: x in allowed, spec.resolution,
               "this model does not offer it")
    if tab.frames is not None and spec.frames_range:
        lo, hi = spec.frames_range
        act.settle(f"{key}.frames", tab.frames, "frames",
                   lambda x: _in_range(x, lo, hi) and (x - 1) % spec.limits.frame_step == 0, spec.frames,
                   f"this model runs {lo} to {hi}")
        _keep(act.out, tab.fps, act.v[tab.fps])
    if tab.sound is not None:
        act.settle(f"{key}.sound", tab.sound, "sound", lambda x: not x or spec.sound_available, False,
                   spec.sound_reason or "this model has no sound")


def switch_updates(page: Page, old_model: dict | None, model: dict, v: dict, current_tab: str | None) -> dict:
    """A model switch: every setting the new model allows is kept; one it cannot take goes to its
    default and is set aside until a model takes it again; the note under the picker names exactly
    what changed (and says nothing when nothing did)."""
    out = model_updates(page, model, current_tab)
    act = Settling(v, dict(v.get(page.set_aside) or {}), out)
    lines = []
    for tab in page.all_tabs():
        mode = tab.mode if isinstance(tab, GenTab) else "action"
        spec = C.sampling_controls(model, mode)
        if not spec.available:
            continue
        old = C.sampling_controls(old_model, mode) if old_model is not None else None
        old = old if old is not None and old.available else None
        act.changes = []
        if isinstance(tab, GenTab):
            _settle_canvas(tab, spec, act, mode)
        _settle_sampling(tab, spec, old, act, mode)
        lines += [f"{C.TAB_MODES[mode]}: {change}." for change in act.changes]
    out[page.set_aside] = act.aside
    if old_model is not None and old_model["name"] != model["name"]:
        head = f"Switched from {old_model['name']} to {model['name']}; changed:"
        out[page.switch_note] = head + "".join(f"\n- {line}" for line in lines) if lines else ""
    return out


def model_outputs(page: Page, model: dict) -> list:
    """Every component `model_updates` may touch (a superset is fine for dict returns)."""
    keys = set(model_updates(page, model, "action").keys())
    keys |= {page.tabs, page.current_tab, page.set_aside}
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
    if tab.fit is not None and params.get("fit"):
        out[tab.fit] = params["fit"]
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
    out.update(action_result_updates(tab, H.named_files(entry).get("actions"), action_ui.get("domain", ""), params))
    return out


def _restore_result(tab, entry: dict, model: str) -> dict:
    s, box = tab.sampling, tab.result
    params = entry.get("summary", {}).get("params", {})
    out: dict[Any, Any] = {}
    for key, component in (("steps", s.steps), ("guidance_scale", s.guidance), ("flow_shift", s.flow_shift)):
        if params.get(key) is not None:
            out[component] = params[key]
    out[s.seed] = str(entry.get("seed", 0))
    out[s.randomize] = False
    summary = entry.get("summary", {})
    out[box.output] = gr.update(value=publish(D.named_media(H.named_files(entry), H.media_path(entry))),
                                label=RESULT_LABEL)
    out[box.used_seed] = str(entry.get("seed", ""))
    out[box.downloads] = publish_all(H.download_paths(entry, with_actions=not isinstance(tab, ActionTab)))
    out[box.result_json] = dict(summary, model=model)
    out[box.prompt_view] = summary.get("prompt_text", "")
    out[box.negative_view] = summary.get("negative_prompt_text", "")
    note = "Restored the settings of this result with its seed (Random seed is off)."
    for key, component in _uploads(tab).items():
        out[component] = publish(H.file_path(entry, key))
    if getattr(tab, "uploads_box", None) is not None:  # the restored uploads are seen, not folded away
        out[tab.uploads_box] = gr.update(open=any(H.file_path(entry, k) for k in _uploads(tab)))
    if (params.get("image") or params.get("video")) and not any(H.file_path(entry, k) for k in _uploads(tab)):
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
        keys |= {c for c in (tab.frames, tab.fps, tab.sound, tab.uploads_box, tab.fit) if c is not None}
    a = page.action
    keys |= {a.kind, a.domain, a.view_point, a.chunk_size, a.tier, a.fps, a.instruction, a.plot, a.actions_download}
    for tab in page.all_tabs():
        keys |= set(_uploads(tab).values())
    for tab in page.all_tabs():
        s, box = tab.sampling, tab.result
        keys |= {s.steps, s.guidance, s.flow_shift, s.seed, s.randomize, box.output, box.used_seed, box.downloads,
                 box.result_json, box.prompt_view, box.negative_view, box.status}
        keys |= {c for c in (s.use_interval, s.interval_lo, s.interval_hi) if c is not None}
    return list(keys)
