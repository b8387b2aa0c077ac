"""The pairwise leaderboard: Bradley-Terry strengths with bootstrap intervals, win rates, agreement.

Bradley-Terry: P(i beats j) = sigmoid(s_i - s_j). The strengths maximise the likelihood of the
judgements (a tie counts half a win each way), found by scipy's BFGS with the exact gradient. A
small ridge term (RIDGE) keeps a configuration that won or lost everything finite and fixes the
free offset; scores are reported centred on zero (log-odds units: +1 beats 0 in 73% of pairs).
Intervals are percentile bootstrap intervals over judgements resampled with replacement.

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

RIDGE = 1e-3
BOOTSTRAP_ROUNDS = 200
INTERVAL = 0.95


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

    def rows(self) -> list[dict]:
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


def fit_bradley_terry(n: int, a: np.ndarray, b: np.ndarray, y: np.ndarray, w: np.ndarray | None = None) -> np.ndarray:
    """Maximum-likelihood strengths for `n` configs from index arrays, outcomes and weights; centred."""
    w = np.ones_like(y) if w is None else w

    def objective(theta):
        diff = theta[a] - theta[b]
        loss = -(w * (y * log_expit(diff) + (1.0 - y) * log_expit(-diff))).sum() + 0.5 * RIDGE * theta @ theta
        residual = w * (expit(diff) - y)  # d loss / d diff
        grad = np.bincount(a, residual, minlength=n) - np.bincount(b, residual, minlength=n) + RIDGE * theta
        return loss, grad

    # BFGS, not L-BFGS-B: a handful of parameters, and L-BFGS-B's compiled core was 15x slower here
    # (it calls into a multi-threaded BLAS that fights the other processes for the cores).
    found = minimize(objective, np.zeros(n), jac=True, method="BFGS")
    if not np.all(np.isfinite(found.x)):
        raise RuntimeError(f"Bradley-Terry fit did not converge: {found.message}")
    return found.x - found.x.mean()


def bootstrap(n: int, a: np.ndarray, b: np.ndarray, y: np.ndarray, rounds: int = BOOTSTRAP_ROUNDS,
              seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Percentile intervals (INTERVAL) of each strength over judgements resampled with replacement
    (a multinomial draw over the distinct rows is exactly that resampling)."""
    rng = np.random.default_rng(seed)
    ga, gb, gy, counts = _grouped(a, b, y)
    draws = np.empty((rounds, n))
    for r in range(rounds):
        draws[r] = fit_bradley_terry(n, ga, gb, gy, rng.multinomial(len(y), counts / counts.sum()).astype(np.float64))
    tail = (1.0 - INTERVAL) / 2 * 100
    return np.percentile(draws, tail, axis=0), np.percentile(draws, 100 - tail, axis=0)


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


def leaderboard(judgements: list[Judgement], configs: list[str] | None = None, *, rounds: int = BOOTSTRAP_ROUNDS,
                seed: int = 0) -> Board | None:
    """The board for one criterion; None when there is nothing to rank yet."""
    names = sorted({j.a for j in judgements} | {j.b for j in judgements} | set(configs or ()))
    if not judgements or len(names) < 2:
        return None
    a, b, y = _arrays(names, judgements)
    n = len(names)
    scores = fit_bradley_terry(n, *_grouped(a, b, y))
    low, high = bootstrap(n, a, b, y, rounds=rounds, seed=seed)
    rates, met = win_rates(n, a, b, y)
    counts = np.bincount(a, minlength=n) + np.bincount(b, minlength=n)
    return Board(names, scores, low, high, counts, rates, met, agreement(judgements))
