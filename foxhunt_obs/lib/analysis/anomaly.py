"""Anomaly maths for the alert rules (docs/design.md#alerts): robust statistics over short series, pure functions.

Every function takes a 1-D sequence of numbers and ignores NaN and ±Inf: a missing or broken point is
neither a spike nor a drop. Too few finite points give no verdict (None), never a guess.

The windowed medians and the least-squares slope are training_health's (one robust-window logic for the
daily health table and the alerts); this module adds the median/MAD baseline and the verdicts the alert
evaluators need.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from foxhunt_obs.lib.analysis import training_health
from foxhunt_obs.lib.analysis.training_health import slope_per_hour

__all__ = [
    "MAD_SCALE",
    "Baseline",
    "Verdict",
    "above_baseline",
    "collapse_below",
    "finite",
    "mad",
    "median",
    "robust_baseline",
    "slope_per_hour",
    "sudden_drop",
    "window_medians",
]

MAD_SCALE = 1.4826  # MAD × this estimates σ for normally distributed data
_EPS = 1e-9


@dataclass(frozen=True)
class Baseline:
    """median + k·MAD of a trailing window of `n` finite points."""

    median: float
    mad: float  # scaled (× MAD_SCALE)
    threshold: float
    n: int


@dataclass(frozen=True)
class Verdict:
    """A test's outcome: `value` (the statistic tested) compared with `baseline` (what it was held to)."""

    fired: bool
    value: float
    baseline: float


def finite(values: Sequence[float] | np.ndarray) -> np.ndarray:
    """The finite values, in order, as float64."""
    v = np.asarray(values, dtype=float).ravel()
    return v[np.isfinite(v)]


def median(values: Sequence[float] | np.ndarray) -> float | None:
    """Median of the finite values; None when there are none."""
    v = finite(values)
    return float(np.median(v)) if v.size else None


def mad(values: Sequence[float] | np.ndarray, scale: float = MAD_SCALE) -> float | None:
    """Median absolute deviation from the median of the finite values, × scale (1.4826: a σ estimate);
    0 for a constant series, None when there are no finite values."""
    v = finite(values)
    if not v.size:
        return None
    return float(scale * np.median(np.abs(v - np.median(v))))


def window_medians(values: Sequence[float] | np.ndarray, window: int) -> np.ndarray:
    """Medians of every run of `window` consecutive finite values (index i: finite[i:i+window])."""
    if window < 1:
        raise ValueError(f"window must be >= 1, got {window}")
    return training_health.window_medians(np.asarray(values, dtype=float), int(window))


def robust_baseline(
    history: Sequence[float] | np.ndarray, k: float, window: int | None = None, min_points: int = 1
) -> Baseline | None:
    """median + k·MAD over the last `window` finite points of `history` (all of them when None);
    None under `min_points` finite points."""
    v = finite(history)
    if window is not None:
        v = v[-int(window) :] if window > 0 else v[:0]
    if v.size < max(int(min_points), 1):
        return None
    med = float(np.median(v))
    m = float(MAD_SCALE * np.median(np.abs(v - med)))
    return Baseline(median=med, mad=m, threshold=med + k * m, n=int(v.size))


def above_baseline(
    history: Sequence[float] | np.ndarray,
    value: float,
    k: float,
    window: int | None = None,
    min_points: int = 1,
    min_ratio: float = 1.0,
) -> Verdict | None:
    """Is `value` strictly above median + k·MAD of the trailing history, and above median × `min_ratio`?
    None when the history is too short or `value` is not finite. baseline: the larger of the two bars.
    With a constant history (MAD 0) and min_ratio 1 anything above the median fires."""
    b = robust_baseline(history, k, window, min_points)
    if b is None or not np.isfinite(value):
        return None
    bar = max(b.threshold, b.median * float(min_ratio))
    return Verdict(fired=bool(value > bar), value=float(value), baseline=bar)


def sudden_drop(values: Sequence[float] | np.ndarray, window: int, drop: float) -> Verdict | None:
    """Has the median of the last `window` finite points fallen at least `drop` below the best median of
    the `window`-point runs entirely before them? value: the last window's median; baseline: that best
    trailing median. None under 2·window finite points (no trailing window to compare with).

    Medians, not single points: one bad evaluation neither raises the baseline nor makes a drop."""
    w = int(window)
    med = window_medians(values, w)
    last = med.size - 1  # the last window starts at finite index `last`
    before = med[: last - w + 1] if last - w + 1 > 0 else med[:0]  # windows ending before it starts
    if not before.size:
        return None
    best = float(before.max())
    # a tolerance so that 0.7 → 0.5 is a drop of 0.2 despite binary floating point
    return Verdict(fired=bool(best - med[-1] >= drop - _EPS), value=float(med[-1]), baseline=best)


def collapse_below(values: Sequence[float] | np.ndarray, window: int, floor: float) -> Verdict | None:
    """Is the median of the last `window` finite points strictly below `floor`? None under `window`
    finite points."""
    med = window_medians(values, int(window))
    if not med.size:
        return None
    return Verdict(fired=bool(med[-1] < floor), value=float(med[-1]), baseline=float(floor))
