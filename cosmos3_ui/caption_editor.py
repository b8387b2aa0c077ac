"""The structured caption editor: a form for the main fields, the raw JSON, and a prose mode.

The form and the JSON stay in sync both ways through `engine.captions` (the one schema): typing in
the JSON re-fills the form when it parses, and editing the form merges into the JSON without
touching fields the form does not show. Broken JSON is never overwritten; the error under the
editor gives its line and column. Only user input events drive the sync, so updates do not echo.
"""
from __future__ import annotations

import html
import json
from typing import Any

import gradio as gr

from engine import captions

from .assets import PROSE_EXAMPLES, example_captions
from .requests import PROMPT_STYLES, STYLE_JSON, STYLE_PROSE

PRIVATE = "private"


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


def describe_problem(text: str, kind: str) -> tuple[dict | None, str]:
    """(caption or None, HTML message) for the JSON text: positioned parse errors, named field errors."""
    try:
        caption = captions.parse_caption(text)
    except captions.CaptionParseError as exc:
        return None, error_html(str(exc), exc.excerpt())
    issues = captions.validate_caption(caption, kind)
    errors = [i for i in issues if i.severity == "error"]
    if errors:
        return caption, error_html("Caption field errors:") + warnings_html(errors)
    return caption, warnings_html(issues)


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
            with gr.Row():
                self.style = gr.Radio(list(PROMPT_STYLES), value=STYLE_JSON, label="Prompt style", scale=3,
                                      elem_id=f"{elem_prefix}-style")
                self.example = gr.Dropdown(
                    list(self.examples), value=first, label="Example caption", scale=2, interactive=True,
                    elem_id=f"{elem_prefix}-example",
                )
            with gr.Column(visible=True) as self.json_group:
                with gr.Tabs():
                    with gr.Tab("Form", id=f"{elem_prefix}-form-tab"):
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
            self.message = gr.HTML("", elem_id=f"{elem_prefix}-caption-message", padding=False)

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
        return [self.style, self.code, self.prose, self.message, self.json_group, *self.form_components]

    def form_updates(self, caption: dict) -> dict:
        form = captions.caption_to_form(caption, self.kind)
        out: dict[Any, Any] = {self.texts[k]: v for k, v in form.texts.items()}
        for table in self.layout.tables:
            out[self.tables[table.name]] = _table_value(form.tables[table.name], table.columns)
        return out

    def restore(self, style: str, json_text: str, prose: str) -> dict:
        """Updates that show a saved editor state (used by history)."""
        out: dict[Any, Any] = {
            self.style: style, self.code: json_text,
            self.json_group: gr.update(visible=style == STYLE_JSON), self.prose: gr.update(value=prose, visible=style == STYLE_PROSE),
        }
        caption, message = describe_problem(json_text, self.kind)
        out[self.message] = message if style == STYLE_JSON else ""
        if caption is not None:
            out.update(self.form_updates(caption))
        return out

    def show_error(self, message: str) -> dict:
        return {self.message: error_html(message)}

    # -- events ----------------------------------------------------------------------------------

    def wire(self) -> None:
        kind = self.kind
        text_keys = list(self.texts)
        table_names = list(self.tables)

        def on_code(text):
            caption, message = describe_problem(text, kind)
            out: dict[Any, Any] = {self.message: message}
            if caption is not None:
                out.update(self.form_updates(caption))
            return out

        self.code.input(on_code, inputs=self.code, outputs=[self.message, *self.form_components],
                        trigger_mode="always_last", queue=False, api_visibility=PRIVATE)

        def on_form(text, *values):
            try:
                base = captions.parse_caption(text)
            except captions.CaptionParseError as exc:
                return {self.message: error_html(
                    f"The form cannot update the JSON until it parses. {exc}", exc.excerpt())}
            texts = dict(zip(text_keys, values[: len(text_keys)]))
            tables = dict(zip(table_names, values[len(text_keys):]))
            caption = captions.form_to_caption(base, texts, tables, kind)
            _, message = describe_problem(captions.pretty(caption), kind)
            return {self.code: captions.pretty(caption), self.message: message}

        for component in self.form_components:
            component.input(on_form, inputs=[self.code, *self.form_components], outputs=[self.code, self.message],
                            trigger_mode="always_last", queue=False, api_visibility=PRIVATE)

        def on_style(style, text):
            is_json = style == STYLE_JSON
            message = describe_problem(text, kind)[1] if is_json else ""
            return {self.json_group: gr.update(visible=is_json), self.prose: gr.update(visible=not is_json),
                    self.example: gr.update(interactive=is_json), self.message: message}

        self.style.input(on_style, inputs=[self.style, self.code],
                         outputs=[self.json_group, self.prose, self.example, self.message],
                         queue=False, api_visibility=PRIVATE)

        def on_example(title):
            text = self.examples.get(title)
            if text is None:
                return {self.message: error_html(f"Unknown example {title!r}.")}
            caption = json.loads(text)
            return {self.code: text, self.message: "", **self.form_updates(caption)}

        self.example.input(on_example, inputs=self.example,
                           outputs=[self.code, self.message, *self.form_components],
                           queue=False, api_visibility=PRIVATE)

