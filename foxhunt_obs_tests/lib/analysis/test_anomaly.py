import math

import numpy as np
import pytest

from foxhunt_obs.lib.analysis.anomaly import (
    MAD_SCALE,
    above_baseline,
    collapse_below,
    mad,
    median,
    robust_baseline,
    slope_per_hour,
    sudden_drop,
    window_medians,
)

NAN, INF = math.nan, math.inf


def test_median_and_mad_by_hand():
    # median 3; |deviations| 2, 1, 0, 1, 97 → median 1 → × 1.4826: one outlier does not move either
    assert median([1, 2, 3, 4, 100]) == 3
    assert mad([1, 2, 3, 4, 100]) == pytest.approx(1.4826)
    assert mad([1, 2, 3, 4, 100], scale=1.0) == 1.0
    assert MAD_SCALE == 1.4826
    assert median([4, 1, 3, 2]) == 2.5


def test_constant_series_has_mad_zero():
    assert mad([5.0] * 10) == 0.0
    assert median([5.0] * 10) == 5.0


def test_nan_and_inf_are_ignored():
    assert median([1, NAN, 2, INF, 3, -INF]) == 2
    assert mad([1, NAN, 2, INF, 3]) == pytest.approx(MAD_SCALE)
    assert median([]) is None and mad([]) is None
    assert median([NAN, INF]) is None and mad([NAN, -INF]) is None


def test_robust_baseline_by_hand():
    # median 11; |dev| 1, 1, 0, 2, 2 → 1 → MAD 1.4826; k = 3 → 11 + 4.4478
    b = robust_baseline([10, 12, 11, 13, 9], k=3)
    assert (b.median, b.mad, b.n) == (11, pytest.approx(1.4826), 5)
    assert b.threshold == pytest.approx(15.4478)
    # the trailing window: the old 100 is outside the last 5 points
    assert robust_baseline([100, 10, 12, 11, 13, 9], k=3, window=5) == b
    # too few points: no verdict
    assert robust_baseline([10, 12, 11, NAN, 13], k=3, min_points=5) is None
    assert robust_baseline([], k=3) is None


def test_above_baseline():
    hist = [10, 12, 11, 13, 9]
    v = above_baseline(hist, 16, k=3)
    assert v.fired and v.value == 16 and v.baseline == pytest.approx(15.4478)
    assert not above_baseline(hist, 15, k=3).fired
    assert above_baseline(hist, 16, k=3, min_points=6) is None
    assert above_baseline(hist, NAN, k=3) is None
    # constant history: MAD 0, the threshold is the median itself
    assert above_baseline([5, 5, 5], 5.01, k=3).fired
    assert not above_baseline([5, 5, 5], 5.0, k=3).fired
    # a minimum ratio over the median: the larger bar wins
    v = above_baseline([5, 5, 5], 5.5, k=3, min_ratio=1.2)
    assert not v.fired and v.baseline == 6.0
    assert above_baseline([5, 5, 5], 6.01, k=3, min_ratio=1.2).fired
    assert above_baseline(hist, 16, k=3, min_ratio=1.2).baseline == pytest.approx(15.4478)


def test_sudden_drop_by_hand():
    v = sudden_drop([0.7] * 6 + [0.5] * 3, window=3, drop=0.2)
    assert v.fired and v.value == 0.5 and v.baseline == 0.7  # 0.7 − 0.5 = 0.2 counts despite floating point
    assert not sudden_drop([0.7] * 6 + [0.55] * 3, window=3, drop=0.2).fired
    # the best trailing median, not the previous one: .9 two windows back
    v = sudden_drop([0.5, 0.5, 0.5, 0.9, 0.9, 0.9, 0.6, 0.6, 0.6], window=3, drop=0.2)
    assert v.fired and v.value == 0.6 and v.baseline == 0.9


def test_sudden_drop_single_dip_is_not_a_drop():
    v = sudden_drop([0.7, 0.7, 0.7, 0.7, 0.7, 0.0, 0.7, 0.7], window=3, drop=0.2)
    assert v is not None and not v.fired and v.value == 0.7


def test_sudden_drop_ignores_nan_and_needs_two_windows():
    v = sudden_drop([0.7, 0.7, NAN, 0.7, INF, 0.5, 0.5, 0.5], window=3, drop=0.2)
    assert v.fired
    assert sudden_drop([0.7, 0.7, 0.7, 0.1, 0.1], window=3, drop=0.2) is None  # 5 < 2 × 3 points
    assert sudden_drop([0.7, 0.7, 0.7, NAN, 0.1, 0.1], window=3, drop=0.2) is None


def test_collapse_below():
    v = collapse_below([1.0, 0.9, 0.8, 0.04, 0.03, 0.02], window=3, floor=0.05)
    assert v.fired and v.value == 0.03 and v.baseline == 0.05
    assert not collapse_below([1.0, 0.01, 1.0], window=3, floor=0.05).fired  # one low point
    assert collapse_below([0.01, 0.01], window=3, floor=0.05) is None  # too few
    assert collapse_below([0.01, NAN, 0.01, INF], window=3, floor=0.05) is None
    assert not collapse_below([0.05] * 3, window=3, floor=0.05).fired  # strictly below


def test_window_medians_and_slope():
    assert window_medians([1, 5, 2, NAN, 8], 3).tolist() == [2, 5]
    with pytest.raises(ValueError):
        window_medians([1, 2], 0)
    ts = np.array([0.0, 1800.0, 3600.0])
    assert slope_per_hour(ts, np.array([1.0, 2.0, 3.0])) == pytest.approx(2.0)
    assert slope_per_hour(ts, np.array([1.0, NAN, 3.0])) == pytest.approx(2.0)
    assert slope_per_hour(ts[:1], np.array([1.0])) is None
