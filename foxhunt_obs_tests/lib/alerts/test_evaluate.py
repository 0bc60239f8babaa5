import dataclasses
import inspect
import math
from dataclasses import replace
from datetime import date, datetime, timedelta, timezone

import pandas as pd
import pytest

from foxhunt_obs.lib.alerts.evaluate import (
    EVALUATORS,
    budget_burn,
    cost_spike,
    entropy_collapse,
    from_vector,
    fsx_low_space,
    nan_loss,
    success_rate_drop,
)
from foxhunt_obs.lib.alerts.rules import load_rules

NAN, INF = math.nan, math.inf
T0 = datetime(2026, 11, 22, 7, 0, tzinfo=timezone.utc)
RULES = {r.id: r for r in load_rules(overrides="")}


def minutes(m):
    return T0 + timedelta(minutes=m)


def mlflow(series: dict) -> pd.DataFrame:
    """{(run_id, key): [values]} → the mlflow frame, one point every 5 minutes from T0."""
    rows = []
    for (run_id, key), values in series.items():
        for step, v in enumerate(values):
            rows.append((run_id, f"name-{run_id}", "exp", key, step, pd.Timestamp(minutes(5 * step)), v))
    return pd.DataFrame(rows, columns=["run_id", "run_name", "experiment", "key", "step", "ts", "value"])


def rendered(rule, f):
    text = rule.render(rule.summary, f.labels, f.value, **f.extra)
    assert "?" not in text, text
    return text


def test_registry_covers_the_rules_without_promql_and_fits_the_caller():
    assert set(EVALUATORS) == {r.id for r in RULES.values() if r.promql is None}
    # collect.py passes `now` to an evaluator with three parameters, else (rule, frame)
    arity = {rid: len(inspect.signature(fn).parameters) for rid, fn in EVALUATORS.items()}
    assert arity == {
        rid: 3 if rid in ("fsx_low_space", "training_run_silent", "untracked_spend") else 2
        for rid in EVALUATORS
    }


# -- mlflow ------------------------------------------------------------------------------------------


def test_nan_loss_fires_from_the_first_nonfinite_point_and_not_after_recovery():
    rule = RULES["nan_loss"]
    frame = mlflow(
        {
            ("bad", "actor/loss"): [1.0, 0.9, 0.8, NAN, NAN, INF],  # seed: NaN, NaN, +Inf
            ("recovered", "actor/loss"): [1.0, NAN, 0.8],
            ("clean", "actor/loss"): [1.0, 0.9, 0.8],
            ("clean", "actor/entropy"): [NAN, NAN, NAN],  # another key's NaN is not a loss
            ("neg", "actor/loss"): [1.0, 0.5, -INF],
        }
    )
    found = {f.labels["run_id"]: f for f in nan_loss(rule, frame)}
    assert set(found) == {"bad", "neg"}
    f = found["bad"]
    assert f.labels == {"run_id": "bad", "run_name": "name-bad", "experiment": "exp"}
    assert f.value == INF and f.at == minutes(15)
    assert f.extra == {"step": 3, "last_step": 5, "nonfinite_points": 3}
    assert "name-bad" in rendered(rule, f) and "step 3" in rule.render(
        rule.description, f.labels, f.value, **f.extra
    )
    assert found["neg"].value == -INF and found["neg"].at == minutes(10)


def test_nan_loss_orders_points_by_time_and_ignores_empty_frames():
    rule = RULES["nan_loss"]
    frame = mlflow({("r", "actor/loss"): [NAN, 1.0]}).iloc[::-1]  # rows unsorted: the finite one is later
    assert nan_loss(rule, frame) == []
    assert nan_loss(rule, mlflow({})) == []
    assert nan_loss(rule, pd.DataFrame()) == []


def test_success_rate_drop():
    rule = RULES["success_rate_drop"]  # window 6, drop 0.2
    dip = [0.75] * 17
    dip[10] = 0.0
    frame = mlflow(
        {
            ("dropped", "success_rate"): [0.75] * 12 + [0.3] * 6,
            ("one_dip", "success_rate"): dip,
            ("short", "success_rate"): [0.75] * 5 + [0.1] * 6,  # 11 < 2 × 6 points: no verdict
            ("noisy", "success_rate"): [0.7, 0.8] * 9,
        }
    )
    found = success_rate_drop(rule, frame)
    assert [f.labels["run_id"] for f in found] == ["dropped"]
    f = found[0]
    assert f.value == pytest.approx(0.3) and f.extra["baseline"] == pytest.approx(0.75)
    assert f.at == minutes(5 * 17)
    assert "0.30 vs a trailing median of 0.75" in rendered(rule, f)
    assert success_rate_drop(replace(rule, thresholds={"window": 6, "drop": 0.5}), frame) == []


def test_entropy_collapse():
    rule = RULES["entropy_collapse"]  # window 3, entropy_min 0.05
    frame = mlflow(
        {
            ("collapsed", "actor/entropy"): [1.0, 0.9, 0.8, 0.02, 0.01, 0.01],
            ("one_low", "actor/entropy"): [1.0, 0.9, 0.8, 0.01, 0.7, 0.7],
            ("nan_tail", "actor/entropy"): [1.0, 0.9, 0.01, 0.01, 0.01, NAN],
            ("short", "actor/entropy"): [0.01, 0.01],
        }
    )
    found = {f.labels["run_id"]: f for f in entropy_collapse(rule, frame)}
    assert set(found) == {"collapsed", "nan_tail"}
    assert found["collapsed"].value == 0.01 and found["collapsed"].at == minutes(25)
    assert found["nan_tail"].at == minutes(20)  # the newest finite point
    assert "0.010" in rendered(rule, found["collapsed"])


# -- cloudwatch --------------------------------------------------------------------------------------


def fsx(points: dict) -> pd.DataFrame:
    """{file_system_id: [free bytes every 5 min from T0]} → fsx_metrics rows (plus noise rows)."""
    rows = []
    for fs, values in points.items():
        for i, v in enumerate(values):
            ts = pd.Timestamp(minutes(5 * i))
            rows.append((ts, fs, f"name-{fs}", "FreeDataStorageCapacity", "Minimum", 300, v, None))
            rows.append((ts, fs, f"name-{fs}", "DataReadBytes", "Sum", 300, 1.0, 1 / 300))
    return pd.DataFrame(
        rows,
        columns=[
            "ts",
            "file_system_id",
            "file_system_name",
            "metric",
            "statistic",
            "period_seconds",
            "value",
            "per_second",
        ],
    )


def test_fsx_low_space_at_is_the_start_of_the_current_run_below():
    rule = RULES["fsx_low_space"]  # free_min_bytes 500e9
    frame = fsx(
        {
            "fs-low": [900e9, 800e9, 450e9, 420e9, 400e9],
            "fs-ok": [300e9, 600e9, 600e9, 600e9, 600e9],  # recovered
            "fs-again": [400e9, 600e9, 450e9, 440e9, 430e9],  # below, back up, below again
            "fs-clean": [2e12] * 5,
        }
    )
    now = minutes(21)
    found = {f.labels["file_system_id"]: f for f in fsx_low_space(rule, frame, now)}
    assert set(found) == {"fs-low", "fs-again"}
    f = found["fs-low"]
    assert f.labels == {"file_system_id": "fs-low", "file_system_name": "name-fs-low"}
    assert f.at == minutes(10) and f.value == 400e9 and f.extra["value_gb"] == pytest.approx(400)
    assert found["fs-again"].at == minutes(10)
    assert rendered(rule, f) == "FSx name-fs-low (fs-low): 400 GB free on the fullest disk"


def test_fsx_low_space_ignores_points_after_now_and_other_statistics():
    rule = RULES["fsx_low_space"]
    frame = fsx({"fs-later": [900e9, 900e9, 100e9]})
    assert fsx_low_space(rule, frame, minutes(7)) == []  # the low point is after now
    assert len(fsx_low_space(rule, frame, minutes(12))) == 1
    noise = frame[frame["metric"] != "FreeDataStorageCapacity"]
    assert fsx_low_space(rule, noise, minutes(12)) == []
    assert fsx_low_space(rule, frame.iloc[0:0], minutes(12)) == []


# -- lake --------------------------------------------------------------------------------------------


def budgets(rows):
    return pd.DataFrame(
        rows, columns=["day", "source", "budget_name", "limit_usd", "actual_usd", "forecast_usd", "synced_at"]
    )


def test_budget_burn_uses_the_whole_period_forecast_of_aws_budgets():
    rule = RULES["budget_burn"]  # burn_pct 80
    day, synced = date(2026, 11, 22), pd.Timestamp(T0)
    frame = budgets(
        [
            (day, "budgets", "monthly", 10_000.0, 8_500.0, 11_900.0, synced),  # forecast 119 %: fires
            # 30 % spent, forecast 70 %: silent (actual + forecast would be 100 % — counted twice)
            (day, "budgets", "on_track", 10_000.0, 3_000.0, 7_000.0, synced),
            (day, "budgets", "no_forecast_yet", 1_000.0, 900.0, None, synced),  # actual alone: 90 %
            (day, "budgets", "at_the_line", 1_000.0, 500.0, 800.0, synced),  # exactly 80 %: not above
            (day, "budgets", "usage_hours", None, None, None, synced),  # not dollars
            (day, "ce_forecast", "Cost Explorer forecast", None, None, 5_000.0, synced),  # no limit
        ]
    )
    found = {f.labels["budget_name"]: f for f in budget_burn(rule, frame)}
    assert set(found) == {"monthly", "no_forecast_yet"}
    f = found["monthly"]
    assert f.value == 11_900.0 and f.at == T0
    assert f.extra["pct"] == pytest.approx(119) and f.extra["limit_usd"] == 10_000.0
    assert f.extra["basis"] == "forecast"
    assert rendered(rule, f) == "Budget monthly: $11,900 spent and forecast, 119 % of $10,000"
    g = found["no_forecast_yet"]
    assert (g.value, g.extra["basis"], g.extra["pct"]) == (900.0, "actual", pytest.approx(90))


def test_budget_burn_takes_the_newest_row_of_a_budget():
    rule = RULES["budget_burn"]
    frame = budgets(
        [
            (date(2026, 11, 22), "budgets", "monthly", 10_000.0, 4_000.0, 5_000.0, pd.Timestamp(T0)),
            (date(2026, 11, 21), "budgets", "monthly", 10_000.0, 9_000.0, 9_500.0, pd.Timestamp(T0)),
        ]
    )
    assert budget_burn(rule, frame) == []
    assert len(budget_burn(rule, frame.iloc[::-1])) == 0
    assert budget_burn(rule, frame.iloc[0:0]) == []


def test_budget_burn_without_time_columns_and_with_actual_over_forecast():
    rule = RULES["budget_burn"]
    frame = pd.DataFrame(
        [("b", 100.0, 95.0, 90.0)], columns=["budget_name", "limit_usd", "actual_usd", "forecast_usd"]
    )
    (f,) = budget_burn(rule, frame)
    assert f.at is None and f.value == 95.0 and f.extra["basis"] == "actual"


def test_budget_burn_warns_on_the_live_run_rate_before_the_bill_says_so():
    """A stray p5 started an hour ago: in spend_now's $/h, in no forecast yet. Live budgets (`budgets`:
    an experiment, or (all)) project spend_now's run rate; AWS's budget keeps AWS's own forecast (its
    cost filters are a scope the live figure cannot match)."""
    rule = RULES["budget_burn"]
    as_of = pd.Timestamp("2026-11-21T11:00:00Z")
    frame = pd.concat(
        [
            budgets(
                [(date(2026, 11, 21), "budgets", "monthly", 30_000.0, 12_000.0, 20_000.0, pd.Timestamp(T0))]
            ),
            pd.DataFrame(
                [
                    (as_of, "ppo", "cluster", 60.0, 900.0, 1_000.0),
                    (as_of, "ppo", "untracked", 55.04, 55.04, 12_659.2),
                    (as_of, "(cluster idle)", "cluster", 22.0, 400.0, 5_000.0),
                ],
                columns=["as_of", "experiment", "spend_source", "usd_per_hour", "month_usd", "run_rate_usd"],
            ).assign(source="spend_now"),
        ],
        ignore_index=True,
    )
    assert budget_burn(rule, frame) == []  # no live budget configured; AWS's forecast: 67 %
    limited = dataclasses.replace(
        rule, budgets={"ppo": 15_000.0, "(cluster idle)": 10_000.0, "(all)": 20_000.0}
    )
    found = {x.labels["budget_name"]: x for x in budget_burn(limited, frame)}
    assert set(found) == {"ppo (experiment)", "(all)"}  # (cluster idle): 50 %, silent
    ppo = found["ppo (experiment)"]
    assert ppo.value == pytest.approx(13_659.2) and ppo.extra["pct"] == pytest.approx(13_659.2 / 150)
    assert ppo.extra["basis"] == "spend_now run rate" and ppo.extra["actual_usd"] == pytest.approx(955.04)
    assert found["(all)"].value == pytest.approx(18_659.2)  # 93 % of 20,000
    assert found["(all)"].at == as_of


def daily(costs: dict, last: date) -> pd.DataFrame:
    """{project: [cost of each day, oldest first, ending on `last`]} (None: no row that day)."""
    rows = []
    for project, values in costs.items():
        for i, v in enumerate(values):
            if v is not None:
                rows.append((last - timedelta(days=len(values) - 1 - i), project, v))
    return pd.DataFrame(rows, columns=["day", "project", "cost_usd"])


def test_cost_spike_by_hand():
    rule = RULES["cost_spike"]  # k 3, days 14, min_days 5
    last = date(2026, 11, 21)
    hist = [100.0, 110.0] * 7  # median 105, every |dev| 5 → MAD 7.413 → threshold 105 + 22.239
    frame = daily(
        {
            "spiky": hist + [200.0],
            "steady": hist + [120.0],
            "new": [50.0, 50.0, 50.0, 500.0],  # 3 days of history < min_days 5
            "old": [100.0] * 6 + [None] * 15 + [900.0],  # its history is older than 14 days
            "quiet_today": hist + [None],  # no cost on the latest day
        },
        last,
    )
    found = cost_spike(rule, frame)
    assert [f.labels for f in found] == [{"project": "spiky"}]
    f = found[0]
    assert f.value == 200.0 and f.at == datetime(2026, 11, 21, tzinfo=timezone.utc)
    assert f.extra["threshold"] == pytest.approx(105 + 3 * 5 * 1.4826)
    assert f.extra["day"] == "2026-11-21" and f.extra["median"] == 105.0
    assert rendered(rule, f).startswith("spiky spent $200.00 on 2026-11-21: above $127.24")


def test_cost_spike_sums_rows_of_a_day_and_reads_timestamps():
    rule = RULES["cost_spike"]
    last = date(2026, 11, 21)
    frame = daily({"p": [10.0] * 6 + [10.0]}, last)
    assert cost_spike(rule, frame) == []  # flat: not above the median
    more = pd.concat([frame, pd.DataFrame([(last, "p", 5.0)], columns=frame.columns)])
    more["day"] = pd.to_datetime(more["day"])  # a DATE read as datetime64
    (f,) = cost_spike(rule, more)
    # a flat history has MAD 0: the bar is min_increase_pct (20 %) over the median
    assert f.value == 15.0 and f.extra["threshold"] == 12.0
    a_bit_more = pd.concat([frame, pd.DataFrame([(last, "p", 1.5)], columns=frame.columns)])
    assert cost_spike(rule, a_bit_more) == []  # +15 %: not a spike
    assert cost_spike(rule, frame.iloc[0:0]) == []


# -- prometheus --------------------------------------------------------------------------------------


def test_from_vector():
    rule = RULES["gpu_overheat"]
    now = minutes(30)
    vector = [
        {
            "metric": {"__name__": "foxhunt:gpu_temp:celsius", "node": "n1", "gpu": "0", "uuid": "GPU-1"},
            "value": [now.timestamp(), "91.5"],
        },
        {"metric": {"node": "n2", "gpu": "3", "uuid": "GPU-2"}, "value": [now.timestamp(), "NaN"]},
    ]
    a, b = from_vector(rule, vector, now)
    assert a.rule == "gpu_overheat" and a.labels == {"node": "n1", "gpu": "0", "uuid": "GPU-1"}
    assert a.value == 91.5 and a.at == now and a.extra == {}
    assert rendered(rule, a) == "n1 GPU 0 at 92 °C"
    assert math.isnan(b.value)
    assert from_vector(rule, [], now) == []
    assert len(from_vector(rule, {"resultType": "vector", "result": vector}, now)) == 2
    # gpu_node_missing: `absent(...) * 0` is one series without labels
    (none,) = from_vector(RULES["gpu_node_missing"], [{"metric": {}, "value": [0, "0"]}], now)
    assert none.labels == {} and none.value == 0.0


def test_training_run_silent():
    from datetime import datetime, timedelta, timezone

    import pandas as pd

    from foxhunt_obs.lib.alerts.evaluate import training_run_silent
    from foxhunt_obs.lib.alerts.rules import load_rules

    rule = next(r for r in load_rules(overrides="") if r.id == "training_run_silent")
    t0 = datetime(2026, 11, 16, tzinfo=timezone.utc)
    rows = [
        {
            "run_id": "a",
            "run_name": "quiet",
            "experiment": "e",
            "key": "success_rate",
            "step": i,
            "ts": t0 + timedelta(minutes=5 * i),
            "value": 0.5,
        }
        for i in range(4)  # last point 00:15
    ] + [
        {
            "run_id": "b",
            "run_name": "busy",
            "experiment": "e",
            "key": "actor/loss",
            "step": i,
            "ts": t0 + timedelta(minutes=5 * i),
            "value": 0.1,
        }
        for i in range(10)  # last point 00:45
    ]
    frame = pd.DataFrame(rows)
    assert training_run_silent(rule, frame, t0 + timedelta(minutes=45)) == []  # 30 min exactly: not yet
    (f,) = training_run_silent(rule, frame, t0 + timedelta(minutes=50))
    assert f.labels["run_name"] == "quiet" and f.value == 35 and f.at == t0 + timedelta(minutes=45)
    assert rule.render(rule.summary, {**f.labels, **f.extra}, f.value) == (
        "quiet (e) is RUNNING but logged nothing for 35 minutes"
    )
    assert training_run_silent(rule, frame.iloc[0:0], t0) == []
