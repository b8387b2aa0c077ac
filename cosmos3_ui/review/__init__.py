"""Review mode: the review store (SQLite outside every served folder), the listing of every result,
ratings, blind pairwise judgements, prompt suites and their runs, the leaderboard and the report.

Nothing here needs torch: review data is bookkeeping over finished results, so it lives beside the
UI rather than in the inference engine. Metrics that need torch (PSNR, SSIM) are computed by
`engine.pipeline.quality` and only stored here. Only `tabs.py` and `run_tabs.py` import gradio.
"""
from .desk import SCORE_CHOICES, ResultView, ReviewDesk, criterion_label, reviewer_of
from .store import DB_NAME, DEFAULT_CRITERIA, ReviewStore, adopt_legacy_db, check_db_location, parse_criteria

__all__ = ["DB_NAME", "DEFAULT_CRITERIA", "SCORE_CHOICES", "ResultView", "ReviewDesk", "ReviewStore",
           "adopt_legacy_db", "check_db_location", "criterion_label", "parse_criteria", "reviewer_of"]
