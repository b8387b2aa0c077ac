"""The structured caption editor: a form for the main fields, the raw JSON, and a prose mode.

The form and the JSON stay in sync both ways through `engine.pipeline.captions` (the one schema): typing in
the JSON re-fills the form when it parses, and editing the form merges into the JSON without
touching fields the form does not show. Broken JSON is never overwritten; the error under the
editor gives its line and column. Only user input events drive the sync, so updates do not echo.

Each sync parses the JSON once to show it in the form; the editor keeps what it parsed (`parsed`, the
text and its caption), so Generate merges a form edit that never reached the JSON (a paste) without
parsing again, and sends the text for the engine to parse once, into its `Request`.
"""
from __future__ import annotations

import html
import json
from typing import Any

import gradio as gr

from engine.pipeline import captions

from .assets import PROSE_EXAMPLES, example_captions
from .requests import PROMPT_STYLES, STYLE_JSON, STYLE_PROSE

PRIVATE = "private"
QUICK_PROSE = "Quick prose example (one sentence)"


def _table_value(rows: list[list[str]], columns: tuple[str, ...]) -> list[list[str]]:
    # One blank row at the end gives the user somewhere to add an item; blank rows are ignored.
    return [list(r) for r in rows] + [[""] * len(columns)]


def error_html(message: str, excerpt: str = "") -> str:
    body = f"<div class='caption-error' role='alert'><strong>{html.escape(message)}</strong>"
    if excerpt:
        body += f"<pre>{html.escape(excerpt)}</pre>"
    return body + "</div>"


def warnings_html(issues: list) -> str:
    if not issues:
        return ""
    items = "".join(f"<li><code>{html.escape(i.path)}</code> {html.escape(i.message)}</li>" for i in issues)
    return f"<div class='caption-warning'><ul>{items}</ul></div>"


def unknown_keys(caption: Any, kind: str) -> list[str]:
    """Top-level keys no Cosmos3 caption has (neither this kind's nor the other kind's)."""
    if not isinstance(caption, dict):
        return []
    known = set(captions.fields_for(kind)) | set(captions.IMAGE_ONLY_FIELDS) | set(captions.VIDEO_ONLY_FIELDS)
    return [key for key in caption if key not in known]


def unknown_keys_html(keys: list[str]) -> str:
    if not keys:
        return ""
    names = ", ".join(f"<code>{html.escape(k)}</code>" for k in keys)
    return (f"<div class='caption-warning' role='status'>Unknown caption key{'s' if len(keys) > 1 else ''} {names}: "
            "the model was not trained on them. They are kept and sent as written unless you drop them.</div>")


def known(text: str, caption: Any) -> dict:
    """What the editor keeps after parsing `text`: the text and its caption (None if it did not parse)."""
    return {"text": text, "caption": caption if isinstance(caption, dict) else None}


def describe_problem(text: str, kind: str) -> tuple[dict | None, str]:
    """(caption or None, HTML message) for the JSON text: positioned parse errors, named field errors,
    warnings, and unknown keys."""
    try:
        caption = captions.parse_caption(text)
    except captions.CaptionParseError as exc:
        return None, error_html(str(exc), exc.excerpt())
    return caption, caption_message(caption, kind)


def caption_message(caption: dict, kind: str) -> str:
    """HTML for a parsed caption: named field errors, warnings, and unknown keys."""
    issues = captions.validate_caption(caption, kind)
    errors = [i for i in issues if i.severity == "error"]
    unknown = unknown_keys_html(unknown_keys(caption, kind))
    if errors:
        return error_html("Caption field errors:") + warnings_html(errors) + unknown
    return warnings_html(issues) + unknown


class CaptionEditor:
    """Builds the editor's components inside the current Blocks context. Call `wire()` after."""

    def __init__(self, kind: str, *, elem_prefix: str, initial_example: str | None = None):
        self.kind = kind
        self.layout = captions.form_layout(kind)
        self.examples = example_captions(kind)
        first = initial_example or next(iter(self.examples))
        initial_text = self.examples[first]
        initial = json.loads(initial_text)
        form = captions.caption_to_form(initial, kind)

        with gr.Group(elem_classes=["caption-editor"]):
            # At the top, so a JSON error is seen where the editing starts, not below the fold.
            self.message = gr.HTML("", elem_id=f"{elem_prefix}-caption-message", padding=False)
            with gr.Row(elem_classes=["stack-on-phone"]):
                self.style = gr.Radio(list(PROMPT_STYLES), value=STYLE_JSON, label="Prompt style", scale=3,
                                      elem_id=f"{elem_prefix}-style")
                self.example = gr.Dropdown(
                    [*self.examples, QUICK_PROSE], value=first, label="Example", scale=2, interactive=True,
                    elem_id=f"{elem_prefix}-example",
                )
            with gr.Column(visible=True) as self.json_group:
                with gr.Tabs():
                    with gr.Tab("Form", id=f"{elem_prefix}-form-tab"):
                        self.form_lock = gr.HTML("", elem_id=f"{elem_prefix}-form-lock", padding=False)
                        self.tables: dict[str, gr.Dataframe] = {}
                        for table in self.layout.tables:
                            self.tables[table.name] = gr.Dataframe(
                                value=_table_value(form.tables[table.name], table.columns),
                                headers=list(table.columns), datatype="str", type="array", interactive=True,
                                label=table.label, column_count=len(table.columns),
                                wrap=False, max_height=260, max_chars=60, elem_id=f"{elem_prefix}-table-{table.name}",
                            )
                        self.texts: dict[str, gr.Textbox] = {}
                        groups = self._text_groups()
                        for title, keys in groups:
                            with gr.Accordion(title, open=title == "Scene"):
                                for key in keys:
                                    spec = next(t for t in self.layout.texts if t.key == key)
                                    self.texts[key] = gr.Textbox(
                                        value=form.texts[key], label=spec.label, lines=1, max_lines=4,
                                        elem_id=f"{elem_prefix}-field-{key.replace('.', '-')}",
                                    )
                    with gr.Tab("JSON", id=f"{elem_prefix}-json-tab"):
                        self.code = gr.Code(value=initial_text, language="json", lines=14, max_lines=30,
                                            label="Caption JSON", interactive=True, elem_id=f"{elem_prefix}-code")
            self.prose = gr.Textbox(value=PROSE_EXAMPLES[kind], label="Prompt (prose)", lines=4, visible=False,
                                    elem_id=f"{elem_prefix}-prose")
            self.parsed = gr.State(known(initial_text, initial))  # the JSON text last parsed, and its caption
            with gr.Row():
                self.keep_unknown = gr.Button("Keep unknown keys", size="sm", visible=False,
                                              elem_id=f"{elem_prefix}-keep-unknown")
                self.drop_unknown = gr.Button("Drop unknown keys", size="sm", visible=False,
                                              elem_id=f"{elem_prefix}-drop-unknown")

    def _text_groups(self) -> list[tuple[str, list[str]]]:
        keys = self.layout.text_keys()
        groups = [
            ("Scene", [k for k in keys if k in ("background_setting", "context", "temporal_caption",
                                                "audio_description", "comprehensive_t2i_caption")]),
            ("Lighting", [k for k in keys if k.startswith("lighting.")]),
            ("Aesthetics", [k for k in keys if k.startswith("aesthetics.")]),
            ("Cinematography", [k for k in keys if k.startswith("cinematography.")]),
            ("Style", [k for k in keys if k in ("style_medium", "artistic_style")]),
        ]
        return [(title, group) for title, group in groups if group]

    # -- values ----------------------------------------------------------------------------------

    @property
    def form_components(self) -> list:
        return list(self.texts.values()) + list(self.tables.values())

    @property
    def inputs(self) -> list:
        """What a generate handler reads: style, JSON text, prose."""
        return [self.style, self.code, self.prose]

    @property
    def outputs(self) -> list:
        return [self.style, self.code, self.prose, self.message, self.json_group, self.keep_unknown,
                self.drop_unknown, self.parsed, self.form_lock, *self.form_components]

    def sent(self, v: dict) -> tuple[str, dict | None]:
        """The JSON text a run sends, and its caption (None when the JSON does not parse): the JSON with
        the form merged in, so a form edit whose input event never reached the server (a paste) is sent
        too. The JSON is parsed here only when something outside the editor wrote it since its last
        sync; otherwise the editor's own parse is reused and the engine's is the only one of the run."""
        code = v[self.code] or ""
        last = v.get(self.parsed) or {}
        if last.get("text") == code:
            base = last.get("caption")
        else:
            try:
                base = captions.parse_caption(code)
            except captions.CaptionParseError:
                base = None
        if not isinstance(base, dict):
            return code, None  # broken JSON goes as it is: the engine refuses it, naming its line
        texts = {key: v[box] for key, box in self.texts.items()}
        tables = {name: v[table] for name, table in self.tables.items()}
        caption = captions.form_to_caption(base, texts, tables, self.kind)
        return (code, base) if caption == base else (captions.pretty(caption), caption)

    def sent_json(self, v: dict) -> str:
        return self.sent(v)[0]

    def choice_updates(self, caption: Any) -> dict:
        """Keep/Drop show only while the caption has keys the model does not know."""
        visible = bool(unknown_keys(caption, self.kind))
        return {self.keep_unknown: gr.update(visible=visible), self.drop_unknown: gr.update(visible=visible)}

    def form_updates(self, caption: dict) -> dict:
        form = captions.caption_to_form(caption, self.kind)
        out: dict[Any, Any] = {self.texts[k]: v for k, v in form.texts.items()}
        for table in self.layout.tables:
            out[self.tables[table.name]] = _table_value(form.tables[table.name], table.columns)
        return out

    def lock_updates(self, parses: bool) -> dict:
        """The Form locked while the JSON does not parse (it would show an older caption as if current,
        and an edit there could not be merged), with a banner saying why; unlocked once it parses."""
        banner = "" if parses else (
            "<div class='caption-error form-locked' role='alert'><strong>The Form is locked: the JSON does not "
            "parse.</strong> It shows the last caption that did. Fix the JSON (the error is at the top of the "
            "editor) and the Form follows it again.</div>")
        out: dict[Any, Any] = {self.form_lock: banner}
        out.update({c: gr.update(interactive=parses) for c in self.form_components})
        return out

    def shown_updates(self, caption: Any) -> dict:
        """The Form for what the JSON holds now: filled from `caption` and open, or locked (None)."""
        out = self.lock_updates(caption is not None)
        if caption is not None:
            for component, value in self.form_updates(caption).items():
                out[component] = gr.update(value=value, interactive=True)
        return out

    def restore(self, style: str, json_text: str, prose: str) -> dict:
        """Updates that show a saved editor state (used by history)."""
        out: dict[Any, Any] = {
            self.style: style, self.code: json_text,
            self.json_group: gr.update(visible=style == STYLE_JSON), self.prose: gr.update(value=prose, visible=style == STYLE_PROSE),
        }
        caption, message = describe_problem(json_text, self.kind)
        out[self.parsed] = known(json_text, caption)
        out[self.message] = message if style == STYLE_JSON else ""
        out.update(self.choice_updates(caption))
        out.update(self.shown_updates(caption))
        return out

    def show_error(self, message: str) -> dict:
        return {self.message: error_html(message)}

    # -- events ----------------------------------------------------------------------------------

    def wire(self) -> None:
        kind = self.kind
        text_keys = list(self.texts)
        table_names = list(self.tables)

        choices = [self.keep_unknown, self.drop_unknown]

        def on_code(text):
            caption, message = describe_problem(text, kind)
            out: dict[Any, Any] = {self.message: message, self.parsed: known(text, caption),
                                   **self.choice_updates(caption), **self.shown_updates(caption)}
            return out

        self.code.input(on_code, inputs=self.code,
                        outputs=[self.message, self.parsed, self.form_lock, *choices, *self.form_components],
                        trigger_mode="always_last", queue=False, api_visibility=PRIVATE)

        def on_form(text, last, *values):
            # Each form keystroke reuses the editor's last parse of this very JSON (`parsed`), as `sent` does.
            base = (last or {}).get("caption") if (last or {}).get("text") == text else None
            if base is None:
                try:
                    base = captions.parse_caption(text)
                except captions.CaptionParseError as exc:
                    return {self.message: error_html(
                        f"The form cannot update the JSON until it parses. {exc}", exc.excerpt())}
            texts = dict(zip(text_keys, values[: len(text_keys)]))
            tables = dict(zip(table_names, values[len(text_keys):]))
            caption = captions.form_to_caption(base, texts, tables, kind)
            if caption == base:
                return {self.parsed: known(text, base)}
            text = captions.pretty(caption)
            return {self.code: text, self.parsed: known(text, caption),
                    self.message: caption_message(caption, kind), **self.choice_updates(caption)}

        form_sync = dict(inputs=[self.code, self.parsed, *self.form_components],
                         outputs=[self.code, self.parsed, self.message, *choices],
                         trigger_mode="always_last", queue=False, api_visibility=PRIVATE)
        for component in self.form_components:
            component.input(on_form, **form_sync)
        for box in self.texts.values():
            # A paste does not always raise an input event; leaving the box syncs whatever it holds.
            box.blur(on_form, **form_sync)

        self._wire_unknown_keys()

        def on_style(style, text):
            is_json = style == STYLE_JSON
            message = describe_problem(text, kind)[1] if is_json else ""
            return {self.json_group: gr.update(visible=is_json), self.prose: gr.update(visible=not is_json),
                    self.message: message}

        self.style.input(on_style, inputs=[self.style, self.code],
                         outputs=[self.json_group, self.prose, self.message],
                         queue=False, api_visibility=PRIVATE)

        def on_example(title):
            if title == QUICK_PROSE:  # one sentence, no JSON: the quickest way to a first result
                return {self.style: STYLE_PROSE, self.prose: gr.update(value=PROSE_EXAMPLES[kind], visible=True),
                        self.json_group: gr.update(visible=False), self.message: ""}
            text = self.examples.get(title)
            if text is None:
                return {self.message: error_html(f"Unknown example {title!r}.")}
            caption = json.loads(text)
            return {self.code: text, self.parsed: known(text, caption), self.message: "", self.style: STYLE_JSON,
                    self.prose: gr.update(visible=False), self.json_group: gr.update(visible=True),
                    **self.choice_updates(caption), **self.shown_updates(caption)}

        self.example.input(on_example, inputs=self.example,
                           outputs=[self.code, self.parsed, self.message, self.style, self.prose, self.json_group,
                                    self.form_lock, *choices, *self.form_components],
                           queue=False, api_visibility=PRIVATE)

    def _wire_unknown_keys(self) -> None:
        kind = self.kind
        choices = [self.keep_unknown, self.drop_unknown]

        def on_keep(text):
            caption, _ = describe_problem(text, kind)
            keys = ", ".join(unknown_keys(caption, kind))
            note = f"<div class='caption-warning' role='status'>Kept {html.escape(keys)}; sent as written.</div>"
            return {self.message: note, self.keep_unknown: gr.update(visible=False),
                    self.drop_unknown: gr.update(visible=False)}

        self.keep_unknown.click(on_keep, inputs=self.code, outputs=[self.message, *choices], queue=False,
                                api_visibility=PRIVATE)

        def on_drop(text):
            caption, problem = describe_problem(text, kind)
            if not isinstance(caption, dict):  # edited since the button appeared: say why nothing is dropped
                return {self.message: problem}
            dropped = unknown_keys(caption, kind)
            kept = {k: value for k, value in caption.items() if k not in dropped}
            message = caption_message(kept, kind)
            note = f"<div class='caption-warning' role='status'>Dropped {html.escape(', '.join(dropped))}.</div>"
            return {self.code: captions.pretty(kept), self.parsed: known(captions.pretty(kept), kept),
                    self.message: note + message, **self.choice_updates(kept), **self.form_updates(kept)}

        self.drop_unknown.click(on_drop, inputs=self.code, outputs=[self.code, self.parsed, self.message, *choices,
                                                                    *self.form_components],
                                queue=False, api_visibility=PRIVATE)
