"""Simulated coverage of the leaderboard's 95% Bradley-Terry intervals (the table in docs/REVIEW.md).

    python scripts/bt_coverage.py [--sims 400] [--seed 0]

Judgements are drawn from the Bradley-Terry model with known strengths, `n` per pair of configurations
(both A/B orders, no ties), and the board of `cosmos3_ui.review.leaderboard` is fitted to them. Coverage
is the share of the intervals that hold the true (centred) strength; the width is the mean interval width
in log-odds. Prints a Markdown table.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cosmos3_ui.review.leaderboard import PRIOR_SD, Judgement, leaderboard  # noqa: E402

SCENARIOS = {
    "4 configs, strengths +1.0, +0.4, 0, -1.2": {"alpha": 1.0, "beta": 0.4, "gamma": 0.0, "delta": -1.2},
    "2 configs, 3 log-odds apart (95% wins)": {"strong": 1.5, "weak": -1.5},
}
PER_PAIR = (3, 5, 10, 30, 100)


def simulate(truth: dict[str, float], per_pair: int, rng: np.random.Generator) -> list[Judgement]:
    names = list(truth)
    out = []
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            wins = rng.random(per_pair) < 1.0 / (1.0 + np.exp(-(truth[a] - truth[b])))
            out += [Judgement(a, b, float(w)) if k % 2 else Judgement(b, a, 1.0 - float(w)) for k, w in enumerate(wins)]
    return out


def coverage(truth: dict[str, float], per_pair: int, sims: int, seed: int) -> tuple[float, float]:
    """(share of intervals holding the true centred strength, mean interval width)."""
    rng = np.random.default_rng(seed)
    names = sorted(truth)
    centred = np.array([truth[n] for n in names]) - np.mean(list(truth.values()))
    held, widths = [], []
    for _ in range(sims):
        board = leaderboard(simulate(truth, per_pair, rng))
        held.append((board.low <= centred) & (centred <= board.high))
        widths.append(board.high - board.low)
    return float(np.mean(held)), float(np.mean(widths))


def table(sims: int, seed: int) -> str:
    lines = [f"| scenario (prior sd {PRIOR_SD}) | judgements per pair | coverage of 95% intervals | mean width |",
             "|---|---|---|---|"]
    for label, truth in SCENARIOS.items():
        for per_pair in PER_PAIR:
            held, width = coverage(truth, per_pair, sims, seed)
            lines.append(f"| {label} | {per_pair} | {held:.1%} | {width:.2f} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sims", type=int, default=400, help="simulated boards per row (default 400)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    print(table(args.sims, args.seed))
    return 0


if __name__ == "__main__":
    sys.exit(main())
