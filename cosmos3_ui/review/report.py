"""What the Leaderboard tab and the HTML report show for one suite run: boards per criterion,
win rates, agreement, automatic checks, and the self-contained offline HTML report.

The report is one HTML file with everything inline (poster frames as data URIs, the plot as SVG, no
scripts, no links), so it opens from a disk or a mail attachment with no server and no network.
"""
from __future__ import annotations

import html
import io
import math
from collections import defaultdict

import numpy as np

from .leaderboard import INTERVAL, MIN_PAIR_JUDGEMENTS, PRIOR_SD, Board, Judgement, leaderboard
from .runs import Run
from .store import ReviewStore
from .thumbnails import data_uri

BOARD_COLUMNS = ["rank", "configuration", "score", "95% interval", "judgements"]
TOO_FEW = "too few judgements"
METHOD = (f"Bradley-Terry scores (log-odds) with a weak N(0, {PRIOR_SD}²) prior per configuration: the posterior "
          f"mode and its {INTERVAL:.0%} credible interval (Laplace approximation); a tie counts half a win. "
          f"A board ranks only when every pair of configurations has {MIN_PAIR_JUDGEMENTS} or more judgements.")
CHECK_COLUMNS = ["configuration", "model", "PSNR (mean)", "SSIM (mean)", "LPIPS (mean)", "determinism", "note"]


def boards(store: ReviewStore, run: Run) -> dict[str, Board | None]:
    """{criterion: Board or None} from the run's blind judgements."""
    by_criterion: dict[str, list[Judgement]] = defaultdict(list)
    for o in store.pairs.outcomes(run.run_id):
        by_criterion[o.criterion].append(Judgement(o.config_a, o.config_b, o.score_a, o.item_id, o.reviewer))
    configs = [c.name for c in run.configs]
    return {c: leaderboard(by_criterion.get(c, []), configs) for c in store.criteria}


def board_rows(board: Board | None) -> list[list]:
    if board is None:
        return []
    return [[TOO_FEW if r["rank"] is None else r["rank"], r["config"], round(r["score"], 3),
             f"{r['low']:+.2f} .. {r['high']:+.2f}", r["judgements"]] for r in board.rows()]


def win_rows(board: Board | None) -> tuple[list[str], list[list]]:
    """Headers and rows of the win-rate matrix: row beats column in this share of their judgements (n)."""
    if board is None:
        return ["configuration"], []
    rows = []
    for i, name in enumerate(board.configs):
        cells = []
        for j in range(len(board.configs)):
            met = int(board.met[i, j])
            cells.append("" if i == j else ("-" if met == 0 else f"{board.win_rate[i, j]:.0%} (n={met})"))
        rows.append([name, *cells])
    return ["configuration", *board.configs], rows


def agreement_rows(board: Board | None) -> list[list]:
    if board is None:
        return []
    return [[a["kind"], ", ".join(a["reviewers"]), a["subjects"], round(a["kappa"], 3)] for a in board.agreement]


def check_summary(store: ReviewStore, run: Run) -> list[list]:
    """CHECK_COLUMNS per configuration: mean PSNR, SSIM and LPIPS against the reference and the determinism
    verdict; a check that could not be made says why instead of showing a number."""
    values: dict[tuple[str, str], list[float]] = defaultdict(list)
    reasons: dict[tuple[str, str], str] = {}
    for check in store.runs.checks(run.run_id):
        if check["value"] is None:
            reasons.setdefault((check["config"], check["metric"]), check["detail"])
        else:
            values[(check["config"], check["metric"])].append(check["value"])
    ended = store.runs.ended(run.run_id)
    rows = []
    for config in run.configs:
        metrics = []
        for metric, fmt in (("psnr", "{:.2f} dB"), ("ssim", "{:.4f}"), ("lpips", "{:.4f}")):
            key = (config.name, metric)
            metrics.append("reference" if config.name == run.reference else
                           _mean(values.get(key), fmt) if values.get(key) else
                           _missing(reasons.get(key), ended, run.reference is not None, "no reference configuration"))
        failed = [f"{r['item_id']} failed: {r['message']}" for r in store.runs.failed(run.run_id)
                  if r["config"] == config.name]
        rows.append([config.name, config.model, *metrics, _determinism(store, run, config.name, ended),
                     "; ".join(failed)])
    return rows


def _missing(reason: str | None, ended: bool, asked: bool, off: str) -> str:
    if not asked:
        return f"not checked: {off}"
    if reason:
        return f"unavailable: {reason}" if not reason.startswith("not checked") else reason
    return "pending: the run has not ended" if not ended else "not checked: no result to compare"


def _determinism(store: ReviewStore, run: Run, config: str, ended: bool) -> str:
    check = next((c for c in store.runs.checks(run.run_id) if c["config"] == config and c["metric"] == "deterministic"),
                 None)
    if check is None:
        return _missing(None, ended, run.repeat, "the determinism check was off for this run")
    return check["detail"]  # "same SHA256 ...", "differs: SHA256 ... vs ..." or "not checked: why"


def _mean(values: list[float] | None, fmt: str) -> str:
    if not values:
        return "-"
    mean = float(np.mean(values))
    return "identical (inf)" if math.isinf(mean) else fmt.format(mean)


def board_figure(boards_by_criterion: dict[str, Board | None]):
    """A matplotlib Figure: per criterion, each configuration's score with its interval."""
    from matplotlib.figure import Figure

    ranked = [(c, b) for c, b in boards_by_criterion.items() if b is not None]
    figure = Figure(figsize=(7.0, 1.0 + 1.6 * max(1, len(ranked))), dpi=100)
    if not ranked:
        figure.text(0.5, 0.5, "No blind judgements yet", ha="center", va="center")
        return figure
    for index, (criterion, board) in enumerate(ranked, start=1):
        axes = figure.add_subplot(len(ranked), 1, index)
        y = np.arange(len(board.configs))
        axes.errorbar(board.scores, y, xerr=[board.scores - board.low, board.high - board.scores], fmt="o", capsize=4,
                      color="0.6" if board.too_few else None)
        axes.set_yticks(y, board.configs)
        axes.axvline(0.0, color="0.7", linewidth=0.8)
        title = criterion.replace("_", " ") + (f": {TOO_FEW} to rank" if board.too_few else "")
        axes.set_title(title, fontsize=10, loc="left", color="#b45309" if board.too_few else None)
        axes.grid(True, axis="x", alpha=0.3)
    axes.set_xlabel(f"Bradley-Terry score (log-odds), {INTERVAL:.0%} credible interval")
    figure.tight_layout()
    return figure


def figure_svg(figure) -> str:
    buffer = io.StringIO()
    figure.savefig(buffer, format="svg")
    text = buffer.getvalue()
    return text[text.index("<svg"):]  # drop the XML prolog and doctype: inline SVG in HTML


def _table(headers: list[str], rows: list[list], cls: str = "") -> str:
    head = "".join(f"<th>{html.escape(str(h))}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(v))}</td>" for v in row) + "</tr>" for row in rows)
    return f"<table class='{cls}'><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _grid(store: ReviewStore, run: Run) -> str:
    """Items as rows, configurations as columns: a poster frame with its PSNR/SSIM per cell."""
    done = store.runs.done(run.run_id)
    checks = {(c["item_id"], c["config"], c["metric"]): c for c in store.runs.checks(run.run_id)}
    head = "<th>item</th>" + "".join(f"<th>{html.escape(c.name)}<br><small>{html.escape(c.model)}</small></th>"
                                     for c in run.configs)
    rows = []
    for item in run.items:
        cells = [f"<td class='item'><b>{html.escape(item.id)}</b> <small>{item.mode}, seed {item.seed}</small><br>"
                 f"<small>{html.escape(str(item.prompt))[:240]}</small></td>"]
        for config in run.configs:
            entry = done.get((item.id, config.name, 0))
            uri = data_uri(entry["media"], (192, 192)) if entry and entry["media"] else None
            picture = f"<img alt='{html.escape(config.name)} {html.escape(item.id)}' src='{uri}'>" if uri else "<i>no result</i>"
            numbers = [f"{m.upper()} {checks[(item.id, config.name, m)]['value']:.3g}"
                       for m in ("psnr", "ssim", "lpips") if checks.get((item.id, config.name, m), {}).get("value") is not None]
            cells.append(f"<td>{picture}<br><small>{' · '.join(numbers)}</small></td>")
        rows.append("<tr>" + "".join(cells) + "</tr>")
    return f"<table class='grid'><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>"


_STYLE = """body{font-family:system-ui,sans-serif;margin:24px;color:#222}table{border-collapse:collapse;margin:8px 0 20px}
td,th{border:1px solid #ccc;padding:4px 8px;text-align:left;vertical-align:top}th{background:#f3f3f3}
.grid img{max-width:192px;display:block}.item{max-width:260px}h2{margin-top:28px}small{color:#555}"""


def html_report(store: ReviewStore, run: Run) -> str:
    """The whole report for one run as a single self-contained HTML document."""
    by_criterion = boards(store, run)
    done, total = store.runs.progress(run.run_id)
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>Cosmos3 review: {html.escape(run.run_id)}</title>"
             f"<style>{_STYLE}</style></head><body>",
             f"<h1>Suite run {html.escape(run.run_id)}</h1>",
             f"<p>Suite <b>{html.escape(run.suite)}</b>: {len(run.items)} items x {len(run.configs)} configurations, "
             f"{done} of {total} generations done. Started {html.escape(run.created)} by {html.escape(run.created_by)}. "
             f"Reference configuration: {html.escape(run.reference or 'none')}.</p>",
             "<h2>Configurations</h2>",
             _table(["configuration", "model", "overrides"], [[c.name, c.model, c.overrides or "-"] for c in run.configs]),
             "<h2>Automatic checks</h2>",
             _table(CHECK_COLUMNS, check_summary(store, run)),
             "<p><small>PSNR, SSIM and LPIPS (AlexNet) against the reference configuration (torchmetrics); "
             "a check that could not be made says why.</small></p>",
             "<h2>Blind pairwise leaderboard</h2>",
             f"<p><small>{METHOD}</small></p>"]
    for criterion, board in by_criterion.items():
        parts.append(f"<h3>{html.escape(criterion.replace('_', ' '))}</h3>")
        if board is None:
            parts.append("<p>No judgements yet.</p>")
            continue
        if board.too_few:
            parts.append(f"<p class='too-few'><b>{html.escape(board.too_few.capitalize())}.</b> Not ranked.</p>")
        parts.append(_table(BOARD_COLUMNS, board_rows(board)))
        parts.append(_table(*win_rows(board), cls="wins"))
        agreement = agreement_rows(board)
        parts.append(_table(["kappa", "reviewers", "shared pairs", "value"], agreement) if agreement else
                     "<p><small>Agreement: no pair was judged by two reviewers yet.</small></p>")
    parts.append(figure_svg(board_figure(by_criterion)))
    parts += ["<h2>Results</h2>", _grid(store, run), "</body></html>"]
    return "\n".join(parts)
