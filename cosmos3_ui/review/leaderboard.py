"""The pairwise leaderboard: Bayesian Bradley-Terry strengths with credible intervals, win rates, agreement.

Bradley-Terry: P(i beats j) = sigmoid(s_i - s_j); a tie counts half a win each way. Each strength has
a weak normal prior, s_i ~ N(0, PRIOR_SD^2) (PRIOR_SD = 2.5 log-odds: the difference of two
configurations then has a prior sd of 3.5, so nearly any win rate is plausible before the first
judgement; 1.0 and 1.5 shrank a true 95% win rate too far, see the coverage table). The scores are the posterior mode
(scipy's BFGS with the exact gradient) and the intervals come from the Laplace approximation of the
posterior (the inverse Hessian at the mode), reported for the scores centred on zero. The prior keeps
every interval at least as wide as the data allow: three judgements, all won by one side, give
intervals about 4 log-odds wide, never a point. A percentile bootstrap (the earlier method) collapsed there:
every resample of a 3-0 sweep is the same sweep. `scripts/bt_coverage.py` simulates the intervals'
coverage (table in docs/REVIEW.md).

Below MIN_PAIR_JUDGEMENTS judgements for some pair of configurations the board does not rank: it says
"too few judgements" and which pair is short (the scores and intervals are still shown).

Agreement: where two or more reviewers judged the same item under the same two configurations,
Cohen's kappa for each pair of reviewers over the subjects both judged, and Fleiss' kappa over the
subjects that the largest panel (three or more reviewers) all judged. Labels are the winning
configuration's name or "tie", so a swapped A/B order does not count as disagreement.
"""
from __future__ import annotations

import itertools
from collections import Counter, defaultdict
from dataclasses import dataclass, field

import numpy as np
from scipy.optimize import minimize
from scipy.special import expit, log_expit
from scipy.stats import norm

PRIOR_SD = 2.5
INTERVAL = 0.95
MIN_PAIR_JUDGEMENTS = 5


@dataclass(frozen=True)
class Judgement:
    """One criterion of one pairwise judgement; `score_a` 1 = a won, 0 = b won, 0.5 = tie."""

    a: str
    b: str
    score_a: float
    subject: str = ""
    reviewer: str = ""


@dataclass
class Board:
    configs: list[str]
    scores: np.ndarray  # Bradley-Terry strength per config, centred
    low: np.ndarray
    high: np.ndarray
    counts: np.ndarray  # judgements each config took part in
    win_rate: np.ndarray  # [i, j]: share of i-vs-j judgements i won (ties half); nan where never met
    met: np.ndarray  # [i, j]: number of i-vs-j judgements
    agreement: list[dict] = field(default_factory=list)
    too_few: str = ""  # why the board does not rank (some pair below MIN_PAIR_JUDGEMENTS); "" when it does

    def rows(self) -> list[dict]:
        """Best first with ranks; with too few judgements, by name with no rank (rank None)."""
        if self.too_few:
            return [{"rank": None, "config": name, "score": float(self.scores[i]), "low": float(self.low[i]),
                     "high": float(self.high[i]), "judgements": int(self.counts[i])}
                    for i, name in enumerate(self.configs)]
        order = np.argsort(-self.scores, kind="stable")
        return [{"rank": rank + 1, "config": self.configs[i], "score": float(self.scores[i]),
                 "low": float(self.low[i]), "high": float(self.high[i]), "judgements": int(self.counts[i])}
                for rank, i in enumerate(order)]


def _arrays(configs: list[str], judgements: list[Judgement]):
    index = {name: i for i, name in enumerate(configs)}
    a = np.array([index[j.a] for j in judgements], dtype=np.int64)
    b = np.array([index[j.b] for j in judgements], dtype=np.int64)
    y = np.array([j.score_a for j in judgements], dtype=np.float64)
    return a, b, y


def _grouped(a: np.ndarray, b: np.ndarray, y: np.ndarray):
    """Distinct (a, b, outcome) rows and how often each occurs: the likelihood only needs these counts,
    so a fit costs the same for ten judgements or ten thousand."""
    rows, counts = np.unique(np.stack([a, b, y]), axis=1, return_counts=True)
    return rows[0].astype(np.int64), rows[1].astype(np.int64), rows[2], counts.astype(np.float64)


def _posterior_mode(n: int, a: np.ndarray, b: np.ndarray, y: np.ndarray, w: np.ndarray) -> np.ndarray:
    precision = 1.0 / PRIOR_SD**2

    def objective(theta):
        diff = theta[a] - theta[b]
        loss = -(w * (y * log_expit(diff) + (1.0 - y) * log_expit(-diff))).sum() + 0.5 * precision * theta @ theta
        residual = w * (expit(diff) - y)  # d loss / d diff
        grad = np.bincount(a, residual, minlength=n) - np.bincount(b, residual, minlength=n) + precision * theta
        return loss, grad

    # BFGS, not L-BFGS-B: a handful of parameters, and L-BFGS-B's compiled core was 15x slower here
    # (it calls into a multi-threaded BLAS that fights the other processes for the cores).
    found = minimize(objective, np.zeros(n), jac=True, method="BFGS")
    if not np.all(np.isfinite(found.x)):
        raise RuntimeError(f"Bradley-Terry fit did not converge: {found.message}")
    return found.x


def fit_bradley_terry(n: int, a: np.ndarray, b: np.ndarray, y: np.ndarray,
                      w: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(scores, low, high) for `n` configs from index arrays, outcomes and weights: the posterior mode
    centred on zero and its INTERVAL credible interval under the Laplace approximation."""
    w = np.ones_like(y) if w is None else w
    theta = _posterior_mode(n, a, b, y, w)
    # Hessian of the negative log posterior: the prior's precision plus each pairing's Fisher information.
    p = expit(theta[a] - theta[b])
    info = w * p * (1.0 - p)
    hessian = np.eye(n) / PRIOR_SD**2
    np.add.at(hessian, (a, a), info)
    np.add.at(hessian, (b, b), info)
    np.add.at(hessian, (a, b), -info)
    np.add.at(hessian, (b, a), -info)
    centre = np.eye(n) - 1.0 / n  # scores are reported centred: their covariance is C H^-1 C^T
    covariance = centre @ np.linalg.inv(hessian) @ centre.T
    half = norm.ppf(0.5 + INTERVAL / 2) * np.sqrt(np.clip(np.diag(covariance), 0.0, None))
    scores = centre @ theta
    return scores, scores - half, scores + half


def short_pairs(configs: list[str], met: np.ndarray) -> str:
    """"" when every pair of configurations has MIN_PAIR_JUDGEMENTS judgements; else which pairs are short."""
    short = [f"{configs[i]} vs {configs[j]}: {int(met[i, j])}" for i, j in itertools.combinations(range(len(configs)), 2)
             if met[i, j] < MIN_PAIR_JUDGEMENTS]
    if not short:
        return ""
    listed = ", ".join(short[:3]) + (f" and {len(short) - 3} more pairs" if len(short) > 3 else "")
    return f"too few judgements to rank: {listed} (each pair needs {MIN_PAIR_JUDGEMENTS})"


def win_rates(n: int, a: np.ndarray, b: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    won, met = np.zeros((n, n)), np.zeros((n, n))
    np.add.at(won, (a, b), y)
    np.add.at(won, (b, a), 1.0 - y)
    np.add.at(met, (a, b), 1.0)
    np.add.at(met, (b, a), 1.0)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(met > 0, won / np.maximum(met, 1), np.nan), met


def cohen_kappa(first: list[str], second: list[str]) -> float:
    """Cohen's kappa of two raters' labels over the same subjects (1 = perfect, 0 = chance)."""
    total = len(first)
    observed = sum(x == y for x, y in zip(first, second)) / total
    left, right = Counter(first), Counter(second)
    expected = sum(left[label] * right[label] for label in left) / total**2
    return 1.0 if expected >= 1.0 else (observed - expected) / (1.0 - expected)


def fleiss_kappa(table: np.ndarray) -> float:
    """Fleiss' kappa from a [subjects, categories] table of rater counts (same raters per subject)."""
    raters = table.sum(axis=1)[0]
    shares = table.sum(axis=0) / table.sum()
    per_subject = ((table * (table - 1)).sum(axis=1)) / (raters * (raters - 1))
    observed, expected = per_subject.mean(), (shares**2).sum()
    return 1.0 if expected >= 1.0 else float((observed - expected) / (1.0 - expected))


def _label(j: Judgement) -> str:
    return "tie" if j.score_a == 0.5 else (j.a if j.score_a == 1.0 else j.b)


def agreement(judgements: list[Judgement]) -> list[dict]:
    """Cohen's kappa per reviewer pair with shared subjects; Fleiss' kappa for panels of three or more."""
    labels: dict[tuple, dict[str, str]] = defaultdict(dict)
    for j in judgements:
        labels[(j.subject, frozenset((j.a, j.b)))][j.reviewer] = _label(j)
    shared = {k: v for k, v in labels.items() if len(v) >= 2}
    out = []
    reviewers = sorted({r for v in shared.values() for r in v})
    for left, right in itertools.combinations(reviewers, 2):
        both = [v for v in shared.values() if left in v and right in v]
        if both:
            out.append({"kind": "Cohen", "reviewers": [left, right], "subjects": len(both),
                        "kappa": cohen_kappa([v[left] for v in both], [v[right] for v in both])})
    panel = max((len(v) for v in shared.values()), default=0)
    full = [v for v in shared.values() if len(v) == panel]
    if panel >= 3 and full:
        categories = sorted({label for v in full for label in v.values()})
        table = np.array([[list(v.values()).count(c) for c in categories] for v in full], dtype=np.float64)
        out.append({"kind": "Fleiss", "reviewers": sorted({r for v in full for r in v}), "subjects": len(full),
                    "kappa": fleiss_kappa(table)})
    return out


def leaderboard(judgements: list[Judgement], configs: list[str] | None = None) -> Board | None:
    """The board for one criterion; None when there is nothing to show yet."""
    names = sorted({j.a for j in judgements} | {j.b for j in judgements} | set(configs or ()))
    if not judgements or len(names) < 2:
        return None
    a, b, y = _arrays(names, judgements)
    n = len(names)
    scores, low, high = fit_bradley_terry(n, *_grouped(a, b, y))
    rates, met = win_rates(n, a, b, y)
    counts = np.bincount(a, minlength=n) + np.bincount(b, minlength=n)
    return Board(names, scores, low, high, counts, rates, met, agreement(judgements), short_pairs(names, met))
