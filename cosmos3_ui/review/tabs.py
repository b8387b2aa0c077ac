"""Review mode's tabs: Review (rate any result), Blind (A/B), Suites (runs) and Leaderboard.

Every event is private and every handler takes the reviewer from the login (`gr.Request.username`);
no component carries a name the page could change. Lists that name models or configurations are
filled when their tab is opened, never in the page's initial configuration, so a reviewer working in
the Blind tab has no configuration name anywhere in the page.
"""
from __future__ import annotations

from typing import Any

import gradio as gr

from ..common import PRIVATE, status_html
from ..critique import CritiqueBox
from ..files import publish
from ..service import StudioError
from .blind import BlindDesk
from .desk import SCORE_CHOICES, ReviewDesk, criterion_label, reviewer_of
from .pairwise import CHOICES
from .run_tabs import LeaderboardTab, SuitesTab

# One control for both videos of a blind pair: it starts (or pauses) A and B together from the same
# time, and from the first click on, playing, pausing or seeking either one does the same to the other.
SYNC_PLAY_JS = """
() => {
  const [a, b] = ['A', 'B'].map(side => document.querySelector(`#blind-video-${side} video`));
  if (!a || !b) return;
  for (const [self, other] of [[a, b], [b, a]]) {
    if (self.dataset.synced) continue;
    self.dataset.synced = '1';
    self.addEventListener('play', () => { if (other.paused) { other.currentTime = self.currentTime; other.play(); } });
    self.addEventListener('pause', () => { if (!other.paused) { other.pause(); other.currentTime = self.currentTime; } });
    self.addEventListener('seeked', () => {
      if (Math.abs(other.currentTime - self.currentTime) > 0.05) other.currentTime = self.currentTime;
    });
  }
  if (a.paused) { b.currentTime = a.currentTime; a.play(); b.play(); }
  else { a.pause(); b.pause(); b.currentTime = a.currentTime; }
}
"""

def _table(desk: ReviewDesk, rows: list[list[Any]]) -> dict:
    return {"headers": desk.columns(), "data": rows}


class ReviewTab:
    def __init__(self, desk: ReviewDesk):
        self.desk = desk

    def build(self) -> "ReviewTab":
        desk = self.desk
        with gr.Tab("Review", id="review", elem_id="tab-review") as self.tab:
            gr.Markdown("Every result in the outputs folder is listed here, including those made before review mode "
                        "was switched on. Pick one, score each criterion from 1 (poor) to 5 (excellent), add notes. "
                        "Ratings are saved under your login; saving again replaces your earlier rating.")
            self.signed_in = gr.Markdown("", elem_id="review-signed-in")
            self.ids = gr.State([])
            self.gallery = gr.Gallery(label="Results (newest first)", columns=8, height=260, allow_preview=False,
                                      elem_id="review-gallery")
            with gr.Row(equal_height=False):
                self.pick = gr.Dropdown([], value=None, label="Result (newest first)", filterable=True, scale=5,
                                        elem_id="review-result")
                self.refresh = gr.Button("Refresh list", size="sm", scale=0, min_width=120, elem_id="review-refresh")
            with gr.Accordion("Results that cannot be reviewed", open=False):
                self.unreviewable = gr.Dataframe(value={"headers": ["folder", "why"], "data": []}, interactive=False,
                                                 wrap=True, elem_id="review-unreviewable")
            with gr.Row(equal_height=False):
                with gr.Column(scale=5):
                    self.image = gr.Image(label="Result", type="filepath", interactive=False, height=320,
                                          elem_id="review-image")
                    self.video = gr.Video(label="Result", interactive=False, format="mp4", height=320, visible=False,
                                          elem_id="review-video")
                    with gr.Accordion("Parameters and timings", open=False):
                        self.summary = gr.JSON(elem_id="review-summary")
                with gr.Column(scale=5):
                    self.scores = {c: gr.Radio(list(SCORE_CHOICES), value=None, label=criterion_label(c),
                                               elem_id=f"review-score-{c}") for c in desk.criteria}
                    self.notes = gr.Textbox("", label="Notes", lines=3, max_lines=12, elem_id="review-notes")
                    self.save = gr.Button("Save rating", variant="primary", elem_id="review-save")
                    self.status = gr.HTML("", elem_id="review-status")
            self.table = gr.Dataframe(value=_table(desk, []), label="Ratings of this result", interactive=False,
                                      wrap=True, elem_id="review-ratings")
            self.critique = CritiqueBox()  # the reasoner's critique beside the ratings (cosmos3_ui/critique.py)
        return self

    def _view_updates(self, request_id, reviewer: str) -> dict:
        try:
            view = self.desk.view(request_id, reviewer)
        except StudioError as exc:
            return {self.status: status_html(str(exc), "error")}
        if view is None:
            return {self.image: None, self.video: gr.update(value=None, visible=False), self.summary: None,
                    self.table: _table(self.desk, []), self.status: ""}
        mine = " Yours is filled in below." if view.own_scores or view.own_notes else ""
        out: dict[Any, Any] = {
            self.image: gr.update(value=None if view.is_video else publish(view.media), visible=not view.is_video),
            self.video: gr.update(value=publish(view.media) if view.is_video else None, visible=view.is_video),
            self.summary: view.summary,
            self.table: _table(self.desk, view.rows),
            self.notes: view.own_notes,
            self.status: status_html(f"{len(view.rows)} rating(s) so far.{mine}", "info"),
        }
        for criterion, radio in self.scores.items():
            score = view.own_scores.get(criterion)
            out[radio] = str(score) if score is not None else None
        return out

    def wire(self) -> None:
        view_outputs = [self.image, self.video, self.summary, self.table, self.notes, self.status,
                        *self.scores.values()]

        def on_open(current, request: gr.Request):
            self.desk.refresh()
            choices = self.desk.choices()
            keep = current if current in [value for _, value in choices] else None
            gallery = self.desk.gallery()
            return {self.pick: gr.update(choices=choices, value=keep), self.gallery: [(t, c) for _, t, c in gallery],
                    self.ids: [request_id for request_id, _, _ in gallery],
                    self.unreviewable: {"headers": ["folder", "why"], "data": self.desk.unreviewable()},
                    self.signed_in: f"Signed in as **{getattr(request, 'username', None) or '?'}**."}

        open_outputs = [self.pick, self.gallery, self.ids, self.unreviewable, self.signed_in]
        for trigger in (self.refresh.click, self.tab.select):
            trigger(on_open, inputs=self.pick, outputs=open_outputs, queue=False, api_visibility=PRIVATE)

        def on_pick(request_id, request: gr.Request):
            return self._view_updates(request_id, getattr(request, "username", None) or "")

        self.pick.change(on_pick, inputs=self.pick, outputs=view_outputs, queue=False, api_visibility=PRIVATE)

        def on_gallery(ids, evt: gr.SelectData):
            index = evt.index if evt is not None else None
            return ids[index] if isinstance(index, int) and 0 <= index < len(ids) else gr.update()

        self.gallery.select(on_gallery, inputs=self.ids, outputs=self.pick, queue=False, api_visibility=PRIVATE)

        criteria = list(self.scores)

        def on_save(request: gr.Request, request_id, notes, *scores):  # gr.Request must precede *scores
            try:
                reviewer = reviewer_of(request)
                message = self.desk.rate(request_id, reviewer, dict(zip(criteria, scores)), notes)
            except StudioError as exc:
                return {self.status: status_html(str(exc), "error")}
            out = self._view_updates(request_id, reviewer)
            out[self.status] = status_html(message, "ok")
            return out

        self.save.click(on_save, inputs=[self.pick, self.notes, *self.scores.values()], outputs=view_outputs,
                        queue=False, api_visibility=PRIVATE)


class BlindTab:
    def __init__(self, blind: BlindDesk):
        self.blind = blind

    def build(self) -> "BlindTab":
        with gr.Tab("Blind", id="blind", elem_id="tab-blind") as self.tab:
            gr.Markdown("Two results of the same prompt and seed under two configurations, shown as **A** and **B** "
                        "in random order. Nothing on this page says which is which. Choose A, B or tie per "
                        "criterion; the choice is saved under your login with the hidden mapping. (The Suites and "
                        "Leaderboard tabs do show configuration names: open them after judging.)")
            with gr.Row(equal_height=False):
                self.run = gr.Dropdown([], value=None, label="Suite run", scale=5, elem_id="blind-run")
                self.draw = gr.Button("Draw a pair", variant="primary", scale=0, min_width=140, elem_id="blind-draw")
            self.pair = gr.State(None)  # the pair id stays on the server
            self.prompt = gr.Textbox("", label="Prompt (the same for A and B)", interactive=False, lines=2,
                                     max_lines=8, elem_id="blind-prompt")
            with gr.Row(equal_height=False):
                self.media = {}
                for side in ("A", "B"):
                    with gr.Column():
                        self.media[side] = (
                            gr.Image(label=side, type="filepath", interactive=False, height=320, elem_id=f"blind-image-{side}"),
                            gr.Video(label=side, interactive=False, format="mp4", height=320, visible=False, loop=True,
                                     autoplay=False, elem_id=f"blind-video-{side}"))
            self.play = gr.Button("Play / pause A and B together", size="sm", visible=False, elem_id="blind-play")
            self.choices = {c: gr.Radio(list(CHOICES), value=None, label=criterion_label(c), elem_id=f"blind-choice-{c}")
                            for c in self.blind.criteria}
            self.note = gr.Textbox("", label="Note (optional)", lines=2, max_lines=8, elem_id="blind-note")
            with gr.Row():
                self.save = gr.Button("Save choice", variant="primary", elem_id="blind-save")
                self.reveal = gr.Button("Reveal which was which", elem_id="blind-reveal")
            self.status = gr.HTML("", elem_id="blind-status")
            self.revealed = gr.Markdown("", elem_id="blind-revealed")
        return self

    def wire(self) -> None:
        self.tab.select(lambda current: gr.update(choices=self.blind.run_choices(), value=current), inputs=self.run,
                        outputs=self.run, queue=False, api_visibility=PRIVATE)
        shown = [c for side in ("A", "B") for c in self.media[side]]
        outputs = [self.pair, self.prompt, *shown, self.play, *self.choices.values(), self.note, self.status,
                   self.revealed]

        def on_draw(run_id, request: gr.Request):
            try:
                view = self.blind.draw(run_id, reviewer_of(request))
            except StudioError as exc:
                return {self.status: status_html(str(exc), "error")}
            cleared = {**{radio: None for radio in self.choices.values()}, self.revealed: ""}
            if view is None:
                return {self.pair: None, self.prompt: "", **{c: gr.update(value=None) for c in shown}, **cleared,
                        self.play: gr.update(visible=False), self.status: status_html("You have judged every pair of this run.", "ok")}
            out = {self.pair: view.pair_id, self.prompt: f"[{view.mode}] {view.prompt}", self.note: "", **cleared,
                   self.play: gr.update(visible=view.is_video),
                   self.status: status_html(f"{view.remaining} pair(s) left for you in this run, this one included.",
                                            "info")}
            for side, path in (("A", view.media_a), ("B", view.media_b)):
                image, video = self.media[side]
                out[image] = gr.update(value=None if view.is_video else path, visible=not view.is_video)
                out[video] = gr.update(value=path if view.is_video else None, visible=view.is_video)
            return out

        self.draw.click(on_draw, inputs=self.run, outputs=outputs, queue=False, api_visibility=PRIVATE)
        criteria = list(self.choices)

        def on_save(request: gr.Request, pair_id, note, *choices):
            try:
                message = self.blind.judge(pair_id, reviewer_of(request), dict(zip(criteria, choices)), note)
            except StudioError as exc:
                return {self.status: status_html(str(exc), "error")}
            return {self.status: status_html(message + " Reveal shows which was which.", "ok")}

        self.save.click(on_save, inputs=[self.pair, self.note, *self.choices.values()], outputs=[self.status],
                        queue=False, api_visibility=PRIVATE)

        def on_reveal(pair_id, request: gr.Request):
            try:  # BlindDesk.reveal reads the stored vote: nothing on the page can reveal a pair before it
                return {self.revealed: self.blind.reveal(pair_id, reviewer_of(request)), self.status: ""}
            except StudioError as exc:
                return {self.revealed: "", self.status: status_html(str(exc), "error")}

        self.reveal.click(on_reveal, inputs=self.pair, outputs=[self.revealed, self.status], queue=False,
                          api_visibility=PRIVATE)
        self.play.click(None, js=SYNC_PLAY_JS, api_visibility=PRIVATE)


class ReviewTabs:
    """All of review mode's own tabs, built into the Studio's tab strip."""

    def __init__(self, studio, desk: ReviewDesk):
        """`studio`: the `layout.Studio` building the page (only its `service` is used)."""
        self.desk = desk
        self.review = ReviewTab(desk)
        self.service = studio.service  # for the model critique box (cosmos3_ui/critique.py)
        self.blind = BlindTab(BlindDesk(desk.store))
        self.suites = SuitesTab(studio.service, desk)
        self.leaderboard = LeaderboardTab(desk)

    def build(self) -> "ReviewTabs":
        for tab in (self.review, self.blind, self.suites, self.leaderboard):
            tab.build()
        return self

    def wire(self, blocks: gr.Blocks | None = None) -> None:
        for tab in (self.review, self.blind, self.suites, self.leaderboard):
            tab.wire()
        self.review.critique.wire(self.review.pick, self.desk.store, self.service)
