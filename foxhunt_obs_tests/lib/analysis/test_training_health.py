import math
from datetime import date, datetime, timedelta, timezone

import numpy as np
import pandas as pd
import pytest

from foxhunt_obs.lib.analysis.training_health import (
    build_training_health,
    first_below,
    first_drop,
    load_thresholds,
    slope_per_hour,
)


def test_first_drop_needs_a_sustained_fall_not_one_bad_point():
    rng = np.random.default_rng(1)
    flat = 0.7 + rng.normal(0, 0.03, 60)
    assert first_drop(flat, 5, 0.2) is None
    spike = flat.copy()
    spike[30] = 0.0  # one bad evaluation is not a drop
    assert first_drop(spike, 5, 0.2) is None
    dropped = np.concatenate([flat[:30], 0.3 + rng.normal(0, 0.03, 30)])
    assert first_drop(dropped, 5, 0.2) == pytest.approx(30, abs=3)


def test_first_drop_ignores_nan():
    v = np.array([0.7] * 10 + [math.nan] * 3 + [0.3] * 10)
    assert first_drop(v, 5, 0.2) is not None


def test_first_below():
    v = np.array([1.0, 0.9, 0.8, 0.04, 0.03, 0.02, 0.02, 0.01])
    assert (
        first_below(v, 3, 0.05) == 4
    )  # [0.8, 0.04, 0.03]: the first window with a median under the limit ends here
    assert first_below(np.array([1.0, 0.01, 1.0, 1.0, 0.01, 1.0, 1.0]), 3, 0.05) is None  # single dips


def test_slope_per_hour():
    ts = np.arange(0, 3 * 3600, 600, dtype=float)
    assert slope_per_hour(ts, 0.1 + 0.05 * ts / 3600) == pytest.approx(0.05)
    assert slope_per_hour(ts[:1], ts[:1]) is None


def _run(run_id, status, start, **kw):
    return {
        "run_id": run_id,
        "run_name": run_id,
        "experiment": "exp",
        "status": status,
        "deleted": False,
        "pod": "",
        "start_time": start,
        **kw,
    }


def test_build_training_health_flags_and_stall():
    t = load_thresholds()
    day = date(2026, 11, 16)
    t0 = datetime(2026, 11, 16, tzinfo=timezone.utc)
    rows = []
    for i in range(48):  # every 5 min for 4 hours
        ts = t0 + timedelta(minutes=5 * i)
        rows += [
            ("ok", "success_rate", i, ts, 0.5 + 0.005 * i),
            ("ok", "actor/loss", i, ts, 1.0 / (i + 1)),
            ("ok", "actor/entropy", i, ts, 1.0 - 0.005 * i),
            ("ok", "timing/generate", i, ts, 3.0),
            ("ok", "timing/update", i, ts, 1.0),
            ("ok", "timing/total", i, ts, 4.1),
            ("ok", "accuracy", i, ts, 0.5),
        ]
        if i < 12:  # 'quiet' stops logging after an hour
            rows.append(("quiet", "actor/loss", i, ts, math.nan if i == 5 else 0.5))
    history = pd.DataFrame(rows, columns=["run_id", "key", "step", "ts", "value"])
    runs = pd.DataFrame([_run("ok", "RUNNING", t0), _run("quiet", "RUNNING", t0)])
    as_of = history["ts"].max()
    table = build_training_health(runs, history, day, as_of, t).to_pandas().set_index("run_id")
    ok, quiet = table.loc["ok"], table.loc["quiet"]
    assert not ok["stalled"] and quiet["stalled"] and quiet["minutes_since_last_metric"] > 150
    assert ok["bottleneck"] == "rollout" and ok["rollout_share"] == pytest.approx(3 / 4.1)
    assert ok["success_rate_trend_per_hour"] == pytest.approx(0.06)
    assert not ok["success_drop"] and not ok["entropy_collapse"] and not ok["accuracy_out_of_band"]
    assert ok["loss_nonfinite"] == 0 and quiet["loss_nonfinite"] == 1
    assert ok["points"] == 48 * 7
