"""Review mode: the rating store (SQLite), and the Review tab's logic over it.

Nothing here needs torch or the denoising stack: review data is bookkeeping over finished results,
so it lives beside the UI rather than in the inference engine. Metrics that need torch (PSNR, SSIM)
are computed by the engine and only stored here.
"""
from .desk import MEDIA_NAMES, SCORE_CHOICES, ResultView, ReviewDesk, criterion_label
from .store import DEFAULT_CRITERIA, ReviewStore, parse_criteria

__all__ = ["DEFAULT_CRITERIA", "MEDIA_NAMES", "SCORE_CHOICES", "ResultView", "ReviewDesk", "ReviewStore",
           "criterion_label", "parse_criteria"]
