"""The pairwise leaderboard's statistics on synthetic judgements from a seeded generator."""
import numpy as np
import pytest

from cosmos3_ui.review.leaderboard import Judgement, cohen_kappa, fleiss_kappa, leaderboard

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
        board = leaderboard(synthetic(per_pair, seed=per_pair), rounds=150, seed=1)
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
    big = leaderboard(synthetic(480, seed=480), rounds=20)
    assert np.max(np.abs(big.scores - truth)) < 0.15


def test_win_rates_ties_and_a_clean_sweep_stay_finite():
    judgements = [Judgement("x", "y", 1.0)] * 6 + [Judgement("y", "z", 0.5)] * 4
    board = leaderboard(judgements, rounds=30)
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
    result = leaderboard(judgements, rounds=10).agreement
    cohen = {tuple(r["reviewers"]): r for r in result if r["kind"] == "Cohen"}
    assert cohen[("ann", "bob")]["kappa"] == 1.0 and cohen[("ann", "bob")]["subjects"] == 2
    assert cohen[("ann", "cy")]["kappa"] < 1.0
    fleiss = [r for r in result if r["kind"] == "Fleiss"]
    assert len(fleiss) == 1 and fleiss[0]["subjects"] == 2 and fleiss[0]["kappa"] < 1.0
