"""Ratings from a pool of games: one joint fit of every game, as BayesElo and Ordo make them.

Each game gives its first player a score s (1, 0.5 or 0). The model is Elo's logistic one: a player rated R_a
scores E = 1 / (1 + 10^((R_b - R_a) / 400)) on average against one rated R_b. The fit maximises the likelihood
sum s log E + (1 - s) log(1 - E) over every game at once, so a player who never met another is still placed
against it through the players both met.

Two choices keep every rating finite:
- A prior of `prior_draws` virtual drawn games for each pair of players that met. Without it a player who won
  every game would be rated infinitely high. BayesElo's prior is of the same kind.
- One player is the anchor, held at a stated rating (for instance Stockfish's UCI_Elo 1350). Elo ratings only say
  differences, so the fit needs one fixed point.

The 95% interval of each rating comes from the curvature of the likelihood at its peak (the inverse of the
observed Fisher information), with the anchor held fixed.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from rookworld.lm.games import Z95

#: d E / d R at E = 1/2 is K / 4: the logistic's slope per Elo point.
K = math.log(10) / 400
#: Newton steps at most; a fit that has not settled by then is refused, not returned.
MAX_STEPS = 200


@dataclass(frozen=True)
class Rating:
    """One player's rating with its 95% interval, and what it rests on: games played and points scored."""

    name: str
    elo: float
    low: float
    high: float
    games: int
    points: float


def expected_score(diff: np.ndarray | float) -> np.ndarray | float:
    """Elo's expected score of a player rated `diff` points above its opponent."""
    return 1.0 / (1.0 + 10.0 ** (-np.asarray(diff, dtype=np.float64) / 400.0))


def fit_ratings(games: Sequence[tuple[str, str, float]], anchor: str, anchor_elo: float,
                prior_draws: float = 1.0) -> dict[str, Rating]:
    """Every player's rating from `games` (first player, second player, the first player's score), the `anchor`
    held at `anchor_elo`. ValueError for a score that is not 0, 0.5 or 1, an anchor that played no game, or a pool
    not joined up (a player with no chain of games to the anchor has no rating)."""
    names = sorted({p for a, b, _ in games for p in (a, b)})
    if anchor not in names:
        raise ValueError(f"the anchor {anchor!r} played no game")
    index = {n: i for i, n in enumerate(names)}
    n = len(names)
    count, points = np.zeros((n, n)), np.zeros((n, n))  # games between i and j; i's points against j
    for a, b, s in games:
        if s not in (0.0, 0.5, 1.0):
            raise ValueError(f"a game's score is 1, 0.5 or 0, not {s!r}")
        i, j = index[a], index[b]
        if i == j:
            raise ValueError(f"{a!r} cannot play itself")
        count[i, j] += 1
        count[j, i] += 1
        points[i, j] += s
        points[j, i] += 1 - s
    met = count > 0
    _check_joined(met, index[anchor], names)
    weight = count + prior_draws * met  # each virtual draw is half a point each way
    points = points + 0.5 * prior_draws * met
    ratings = _newton(weight, points, index[anchor], anchor_elo)
    half = Z95 * np.sqrt(np.diag(_covariance(weight, ratings, index[anchor])))
    return {name: Rating(name, float(ratings[i]), float(ratings[i] - half[i]), float(ratings[i] + half[i]),
                         int(count[i].sum()), float(points[i].sum() - 0.5 * prior_draws * met[i].sum()))
            for name, i in index.items()}


def _check_joined(met: np.ndarray, anchor: int, names: list[str]) -> None:
    """Every player reached from the anchor through games played."""
    seen, frontier = {anchor}, [anchor]
    while frontier:
        i = frontier.pop()
        for j in np.flatnonzero(met[i]):
            if int(j) not in seen:
                seen.add(int(j))
                frontier.append(int(j))
    apart = [names[i] for i in range(len(names)) if i not in seen]
    if apart:
        raise ValueError(f"no chain of games joins {', '.join(map(repr, apart))} to the anchor {names[anchor]!r}")


def _newton(weight: np.ndarray, points: np.ndarray, anchor: int, anchor_elo: float) -> np.ndarray:
    """The ratings where the likelihood peaks (its gradient is zero for every player but the anchor)."""
    r = np.full(len(weight), float(anchor_elo))
    free = np.arange(len(weight)) != anchor
    for _ in range(MAX_STEPS):
        e = expected_score(r[:, None] - r[None, :])
        grad = K * (points - weight * e).sum(1)
        hess = _information(weight, e)
        step = np.linalg.solve(hess[np.ix_(free, free)], grad[free])
        # A step of at most 400 points (a factor of 10 in the odds) keeps the first steps from far off.
        step *= min(1.0, 400.0 / max(np.abs(step).max(), 1e-300))
        r[free] += step
        if np.abs(step).max() < 1e-9:
            return r
    raise ValueError(f"the rating fit did not settle in {MAX_STEPS} steps")


def _information(weight: np.ndarray, e: np.ndarray) -> np.ndarray:
    """The observed information (minus the likelihood's Hessian) in the ratings, at expected scores `e`."""
    w = K * K * weight * e * (1 - e)
    return np.diag(w.sum(1)) - w


def _covariance(weight: np.ndarray, ratings: np.ndarray, anchor: int) -> np.ndarray:
    """The ratings' covariance at the peak, the anchor's row and column 0 (it is fixed, not estimated)."""
    free = np.arange(len(ratings)) != anchor
    e = expected_score(ratings[:, None] - ratings[None, :])
    cov = np.zeros((len(ratings), len(ratings)))
    cov[np.ix_(free, free)] = np.linalg.inv(_information(weight, e)[np.ix_(free, free)])
    return cov
