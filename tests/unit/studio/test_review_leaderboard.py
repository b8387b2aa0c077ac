"""The pairwise leaderboard's statistics on synthetic judgements from a seeded generator, and its honesty
with few judgements (issue 44: a 3-0 sweep showed "+3.39 .. +3.39")."""
import numpy as np
import pytest

from cosmos3_ui.review.leaderboard import MIN_PAIR_JUDGEMENTS, Judgement, cohen_kappa, fleiss_kappa, leaderboard

TRUE = {"alpha": 1.0, "beta": 0.4, "gamma": 0.0, "delta": -1.2}


def synthetic(per_pair: int, seed: int, tie_band: float = 0.0) -> list[Judgement]:
    """Judgements drawn from the Bradley-Terry model with the TRUE strengths."""
    rng = np.random.default_rng(seed)
    names = list(TRUE)
    out = []
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            p = 1.0 / (1.0 + np.exp(-(TRUE[a] - TRUE[b])))
            for k in range(per_pair):
                u = rng.random()
                score = 0.5 if abs(u - p) < tie_band else float(u < p)
                first, second, s = (a, b, score) if k % 2 else (b, a, 1.0 - score)  # both orders, as A/B would
                out.append(Judgement(first, second, s, subject=f"item-{k}", reviewer="r"))
    return out


def test_bradley_terry_recovers_known_strengths_and_intervals_shrink():
    truth = np.array([TRUE[n] for n in sorted(TRUE)]) - np.mean(list(TRUE.values()))
    widths = []
    for per_pair in (30, 480):
        board = leaderboard(synthetic(per_pair, seed=per_pair))
        assert board.configs == sorted(TRUE)
        # The order is right, every true strength lies inside its interval, and the counts add up.
        assert [r["config"] for r in board.rows()] == ["alpha", "beta", "gamma", "delta"]
        # Each true strength lies inside its 95% interval, give or take half an interval (four
        # intervals at 95% miss now and then; a systematic bias would miss by far more).
        slack = 0.5 * (board.high - board.low)
        assert np.all((board.low - slack <= truth) & (truth <= board.high + slack)), (board.low, truth, board.high)
        assert np.mean((board.low <= truth) & (truth <= board.high)) >= 0.75
        assert np.all(board.counts == 3 * per_pair)
        widths.append(board.high - board.low)
    assert np.all(widths[1] < 0.5 * widths[0])  # 16x the judgements: intervals about 4x narrower
    big = leaderboard(synthetic(480, seed=480))
    assert np.max(np.abs(big.scores - truth)) < 0.15


def test_win_rates_ties_and_a_clean_sweep_stay_finite():
    judgements = [Judgement("x", "y", 1.0)] * 6 + [Judgement("y", "z", 0.5)] * 4
    board = leaderboard(judgements)
    assert np.all(np.isfinite(board.scores)) and board.rows()[0]["config"] == "x"
    x, y, z = (board.configs.index(n) for n in "xyz")
    assert board.win_rate[x, y] == 1.0 and board.win_rate[y, x] == 0.0 and board.win_rate[y, z] == 0.5
    assert np.isnan(board.win_rate[x, z]) and board.met[x, y] == 6
    assert leaderboard([]) is None


def test_agreement_cohen_per_reviewer_pair_and_fleiss_for_a_panel():
    # Scikit-learn's documented example values, computed by hand: 2 raters, 4 subjects.
    assert cohen_kappa(["a", "a", "b", "b"], ["a", "a", "b", "b"]) == 1.0
    assert cohen_kappa(["a", "b", "a", "b"], ["a", "a", "b", "b"]) == pytest.approx(0.0)
    # Fleiss' 1971 style check: perfect agreement is 1.
    assert fleiss_kappa(np.array([[3, 0], [0, 3], [3, 0]], dtype=float)) == 1.0
    # Three reviewers on two subjects; A/B order swapped between reviewers must not count as disagreement.
    judgements = [
        Judgement("p", "q", 1.0, "s1", "ann"), Judgement("q", "p", 0.0, "s1", "bob"), Judgement("p", "q", 1.0, "s1", "cy"),
        Judgement("p", "q", 0.0, "s2", "ann"), Judgement("q", "p", 1.0, "s2", "bob"), Judgement("p", "q", 0.5, "s2", "cy"),
    ]
    result = leaderboard(judgements).agreement
    cohen = {tuple(r["reviewers"]): r for r in result if r["kind"] == "Cohen"}
    assert cohen[("ann", "bob")]["kappa"] == 1.0 and cohen[("ann", "bob")]["subjects"] == 2
    assert cohen[("ann", "cy")]["kappa"] < 1.0
    fleiss = [r for r in result if r["kind"] == "Fleiss"]
    assert len(fleiss) == 1 and fleiss[0]["subjects"] == 2 and fleiss[0]["kappa"] < 1.0


def test_a_three_judgement_sweep_has_wide_intervals_and_says_too_few_judgements_on_board_chart_and_report(tmp_path):
    from cosmos3_ui.review.report import board_figure, board_rows, boards, figure_svg, html_report
    from cosmos3_ui.review.store import ReviewStore
    from cosmos3_ui.review.suites import Configuration, SuiteItem

    store = ReviewStore(tmp_path / "private" / "reviews.sqlite3")
    items = [SuiteItem(f"item-{k}", "t2i", f"Prompt {k}.") for k in range(3)]
    run = store.runs.create("sweep", items, [Configuration("cfg-sun", "nano"), Configuration("cfg-moon", "nano")],
                            reference=None, repeat=False, reviewer="ann")
    for item in items:  # three judgements, all for cfg-sun: a 3-0 sweep
        pair = store.pairs.open_pair(run.run_id, item.id, ("cfg-sun", "r1"), ("cfg-moon", "r2"), "ann")
        store.pairs.judge(pair.pair_id, "ann", {"visual_quality": "A" if pair.config_a == "cfg-sun" else "B"})
    board = boards(store, run)["visual_quality"]
    assert board.met.max() == 3 and "too few judgements" in board.too_few
    widths = board.high - board.low
    assert np.all(widths > 2.0), widths  # log-odds; the bootstrap gave 0.0 here
    sun = board.configs.index("cfg-sun")
    assert board.scores[sun] > 0 and board.low[sun] < 0 < board.high[sun]  # three wins do not settle it
    rows = board_rows(board)
    assert [r[0] for r in rows] == ["too few judgements"] * 2
    assert all(low != high for low, high in (r[3].split(" .. ") for r in rows))
    chart = figure_svg(board_figure({"visual_quality": board}))
    assert "too few judgements" in chart
    report = html_report(store, run)
    assert "Too few judgements to rank: cfg-moon vs cfg-sun: 3" in report and "+3.39 .. +3.39" not in report


def test_the_board_ranks_once_every_pair_has_enough_judgements():
    enough = [Judgement("x", "y", 1.0)] * MIN_PAIR_JUDGEMENTS + [Judgement("y", "x", 0.0)] * 2
    board = leaderboard(enough)
    assert board.too_few == "" and [r["rank"] for r in board.rows()] == [1, 2] and board.rows()[0]["config"] == "x"
    short = leaderboard(enough + [Judgement("x", "z", 1.0)] * MIN_PAIR_JUDGEMENTS)  # y and z never met
    assert short.too_few.startswith("too few judgements to rank: y vs z: 0")


def test_simulated_coverage_of_the_intervals_is_near_95_percent():
    """A short run of scripts/bt_coverage.py's simulation (the table in docs/REVIEW.md uses 400 boards)."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location("bt_coverage", Path(__file__).parents[3] / "scripts" / "bt_coverage.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    held, width = module.coverage(TRUE, per_pair=10, sims=60, seed=5)
    assert 0.88 <= held <= 1.0 and 0.8 < width < 2.5
