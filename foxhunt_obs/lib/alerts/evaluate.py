"""Evaluators of the rules without PromQL, and the PromQL result → findings conversion (docs/design.md#alerts).

Each evaluator is a pure function of a source's latest data (a pandas frame) and its `Rule`, thresholds
from `rule.thresholds`; it returns one `Finding` per alert instance whose condition holds now. A finding's
`at` is when its condition started where the data shows it (FSx: the first point of the current run below
the floor; NaN loss: the first non-finite point of the trailing run), else the time of the newest data
that shows it; the state machine (state.py) keeps the earliest `at` of a continuing alert as its `since`
and applies the rule's `for`.

Frames (columns used; others are ignored):
  mlflow      run_id, run_name, experiment, key, step, ts, value — recent points of the running runs
  cloudwatch  ts, file_system_id, file_system_name, metric, statistic, value — fsx_metrics rows
  lake        budgets rows (budget_name, limit_usd, actual_usd, forecast_usd [, source, day, synced_at]);
              daily costs (day, project, cost_usd) of one source
  ec2         running instances outside the cluster (lib/ingest/untracked.COLUMNS)
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import date, datetime, time, timedelta, timezone
from typing import Any

import numpy as np
import pandas as pd

from foxhunt_obs.lib.alerts.rules import Rule
from foxhunt_obs.lib.analysis import anomaly
from foxhunt_obs.lib.analysis.training_health import mlflow_key
from foxhunt_obs.lib.ingest import untracked

FSX_FREE_METRIC = "FreeDataStorageCapacity"
FSX_FREE_STATISTIC = "Minimum"  # the fullest OST
BUDGETS_SOURCE = "budgets"  # AWS Budgets: forecast_usd is the whole period's forecast (ForecastedSpend)
CE_FORECAST_SOURCE = "ce_forecast"  # Cost Explorer: forecast_usd covers [today, end of period) only
SPEND_SOURCE = "spend_now"  # spend_now rows beside the budgets: usd_per_hour, month_usd, run_rate_usd, as_of
ALL_SPEND = "(all)"  # a live budget's name for everything spend_now sees: the cluster and untracked instances


@dataclass(frozen=True)
class Finding:
    """One alert instance whose condition holds now.

    labels: what identifies and describes it (the rule's `key` labels make its fingerprint);
    value: the number the summary shows as {value}; at: when the condition started, as far as the data
    shows (None: unknown, the state machine uses the tick's time); extra: more template fields."""

    rule: str
    labels: dict[str, str]
    value: float
    at: datetime | None
    extra: dict[str, Any] = field(default_factory=dict)

    __hash__ = None  # dict fields


# -- helpers -----------------------------------------------------------------------------------------


def utc(t: Any) -> datetime:
    """A datetime, pandas Timestamp, numpy datetime64 or date as an aware UTC datetime (naive = UTC)."""
    if isinstance(t, date) and not isinstance(t, datetime):
        return datetime.combine(t, time.min, tzinfo=timezone.utc)
    ts = pd.Timestamp(t)
    ts = ts.tz_localize("UTC") if ts.tzinfo is None else ts.tz_convert("UTC")
    return ts.to_pydatetime()


def _day(d: Any) -> date:
    if isinstance(d, datetime):
        return d.date()
    if isinstance(d, date):
        return d
    return pd.Timestamp(d).date()


def _label(v: Any) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return ""
    return str(v)


def _empty(frame: pd.DataFrame | None, *cols: str) -> bool:
    return frame is None or frame.empty or any(c not in frame.columns for c in cols)


def _int(x: Any) -> int | None:
    try:
        return None if x is None or pd.isna(x) else int(x)
    except (TypeError, ValueError):
        return None


# -- mlflow ------------------------------------------------------------------------------------------


# the training_health names (data/training_health.yaml's `keys`) of what the training rules read: nan_loss
# loss, success_rate_drop success_rate, entropy_collapse entropy; training_run_silent the newest of them
MLFLOW_NAMES = ("loss", "success_rate", "entropy")


def mlflow_keys() -> tuple[str, ...]:
    """The MLflow metric keys the training rules read (what collect fetches), as
    data/training_health.yaml spells them."""
    return tuple(mlflow_key(name) for name in MLFLOW_NAMES)


def _run_series(metrics: pd.DataFrame | None, key: str) -> Iterator[tuple[dict[str, str], pd.DataFrame]]:
    """Per run (by run_id), the run's labels and its points of `key` in logging order (ts, then step)."""
    if _empty(metrics, "run_id", "key", "ts", "value"):
        return
    m = metrics[metrics["key"] == key]
    if m.empty:
        return
    sort = ["run_id", "ts", "step"] if "step" in m.columns else ["run_id", "ts"]
    m = m.sort_values(sort, kind="stable")
    for run_id, g in m.groupby("run_id", sort=True):
        last = g.iloc[-1]
        labels = {
            "run_id": _label(run_id),
            "run_name": _label(last.get("run_name")),
            "experiment": _label(last.get("experiment")),
        }
        yield labels, g


def nan_loss(rule: Rule, metrics: pd.DataFrame) -> list[Finding]:
    """A finding per run whose latest actor/loss is NaN or ±Inf. at/step: the first non-finite point of
    the trailing non-finite run; a later finite value means the run recovered (no finding)."""
    out = []
    for labels, g in _run_series(metrics, mlflow_key("loss")):
        values = g["value"].to_numpy(dtype=float)
        if np.isfinite(values[-1]):
            continue
        finite_at = np.nonzero(np.isfinite(values))[0]
        first = int(finite_at[-1]) + 1 if finite_at.size else 0
        steps = g["step"].to_numpy() if "step" in g.columns else [None] * len(g)
        out.append(
            Finding(
                rule=rule.id,
                labels=labels,
                value=float(values[-1]),
                at=utc(g["ts"].iloc[first]),
                extra={
                    "step": _int(steps[first]),
                    "last_step": _int(steps[-1]),
                    "nonfinite_points": len(values) - first,
                },
            )
        )
    return out


def training_run_silent(rule: Rule, metrics: pd.DataFrame, now: datetime) -> list[Finding]:
    """A finding per running run whose newest point of any key is older than silent_minutes: the trainer
    hangs or died without ending its run (its MLflow heartbeat stopped). at: the newest
    point + the limit, when the silence became an alert; value: minutes silent."""
    if _empty(metrics, "run_id", "ts"):
        return []
    limit = timedelta(minutes=rule.thresholds["silent_minutes"])
    out = []
    for run_id, g in metrics.groupby("run_id", sort=True):
        last_ts = utc(g["ts"].max())
        if now - last_ts <= limit:
            continue
        last = g.sort_values("ts", kind="stable").iloc[-1]
        labels = {
            "run_id": _label(run_id),
            "run_name": _label(last.get("run_name")),
            "experiment": _label(last.get("experiment")),
        }
        minutes = (now - last_ts).total_seconds() / 60
        out.append(Finding(rule.id, labels, minutes, last_ts + limit, {"last_metric": last_ts.isoformat()}))
    return out


def _windowed(rule: Rule, metrics: pd.DataFrame, key: str, test: Callable) -> list[Finding]:
    out = []
    for labels, g in _run_series(metrics, key):
        values = g["value"].to_numpy(dtype=float)
        verdict = test(values)
        if verdict is None or not verdict.fired:
            continue
        ok = np.isfinite(values)
        out.append(
            Finding(
                rule=rule.id,
                labels=labels,
                value=verdict.value,
                at=utc(g["ts"].to_numpy()[ok][-1]),
                extra={"baseline": verdict.baseline},
            )
        )
    return out


def success_rate_drop(rule: Rule, metrics: pd.DataFrame) -> list[Finding]:
    """A finding per run whose success_rate median over the last `window` points is at least `drop` below
    the best median of a `window`-point run before them (anomaly.sudden_drop). value: the last window's
    median; extra baseline: the best trailing median; at: the newest point."""
    w, drop = int(rule.thresholds["window"]), float(rule.thresholds["drop"])
    return _windowed(rule, metrics, mlflow_key("success_rate"), lambda v: anomaly.sudden_drop(v, w, drop))


def entropy_collapse(rule: Rule, metrics: pd.DataFrame) -> list[Finding]:
    """A finding per run whose actor/entropy median over the last `window` points is below `entropy_min`
    (anomaly.collapse_below). value: that median; at: the newest point."""
    w, floor = int(rule.thresholds["window"]), float(rule.thresholds["entropy_min"])
    return _windowed(rule, metrics, mlflow_key("entropy"), lambda v: anomaly.collapse_below(v, w, floor))


# -- cloudwatch --------------------------------------------------------------------------------------


def fsx_low_space(rule: Rule, fsx: pd.DataFrame, now: datetime) -> list[Finding]:
    """A finding per file system whose newest FreeDataStorageCapacity Minimum (at or before `now`) is
    below `free_min_bytes`. at: the start of the first point of the current run of points below it (the
    rule's `for` counts from there); value: the newest value in bytes; extra value_gb (10⁹ bytes)."""
    if _empty(fsx, "ts", "file_system_id", "metric", "statistic", "value"):
        return []
    floor = float(rule.thresholds["free_min_bytes"])
    f = fsx[(fsx["metric"] == FSX_FREE_METRIC) & (fsx["statistic"] == FSX_FREE_STATISTIC)].copy()
    if f.empty:
        return []
    f["ts"] = pd.to_datetime(f["ts"], utc=True)
    f = f[f["ts"] <= pd.Timestamp(utc(now))]
    f = f[np.isfinite(f["value"].to_numpy(dtype=float))]
    out = []
    for fs_id, g in f.groupby("file_system_id", sort=True):
        per_ts = g.groupby("ts", sort=True)["value"].min()  # a point read twice: the lower one
        values = per_ts.to_numpy(dtype=float)
        if not values.size or values[-1] >= floor:
            continue
        above = np.nonzero(values >= floor)[0]
        first = int(above[-1]) + 1 if above.size else 0
        name = g["file_system_name"].iloc[-1] if "file_system_name" in g.columns else ""
        out.append(
            Finding(
                rule=rule.id,
                labels={"file_system_id": _label(fs_id), "file_system_name": _label(name)},
                value=float(values[-1]),
                at=utc(per_ts.index[first]),
                extra={"value_gb": float(values[-1]) / 1e9, "points_below": int(values.size - first)},
            )
        )
    return out


# -- lake --------------------------------------------------------------------------------------------


def _projected(row: Mapping[str, Any]) -> tuple[float | None, str]:
    """A budget's spend for its whole period and what it rests on.

    AWS Budgets' ForecastedSpend (source `budgets`, the table's default) is already the whole period's
    forecast, actual spend included: adding the actual would count the month-to-date twice. It can lag or
    be missing (Budgets needs some history to forecast), so the projection is max(actual, forecast).
    A Cost Explorer forecast (source `ce_forecast`) covers the rest of the period only: actual + forecast.
    """
    actual, forecast = row.get("actual_usd"), row.get("forecast_usd")
    actual = float(actual) if actual is not None and pd.notna(actual) else None
    forecast = float(forecast) if forecast is not None and pd.notna(forecast) else None
    if row.get("source") == CE_FORECAST_SOURCE:
        if forecast is None:
            return actual, "actual"
        return (actual or 0.0) + forecast, "actual+forecast"
    if forecast is None:
        return actual, "actual"
    if actual is None or forecast >= actual:
        return forecast, "forecast"
    return actual, "actual"


def _live_budgets(rule: Rule, spend: pd.DataFrame, burn: float) -> list[Finding]:
    """The rule's live budgets (`budgets`: experiment -> monthly limit, `(all)` for everything) against
    spend_now's run rate (the lake's allocated $ so far + $/h now x the hours left), the cluster's and
    the untracked instances' together."""
    out = []
    for name, limit in sorted(rule.budgets.items()):
        mine = spend if name == ALL_SPEND else spend[spend["experiment"] == name]
        if mine.empty:
            continue
        value = float(mine["run_rate_usd"].sum())
        pct = 100.0 * value / limit
        if pct <= burn:
            continue
        out.append(
            Finding(
                rule=rule.id,
                labels={"budget_name": name if name == ALL_SPEND else f"{name} (experiment)"},
                value=value,
                at=utc(mine["as_of"].max()),
                extra={
                    "pct": pct,
                    "limit_usd": limit,
                    "actual_usd": float(mine["month_usd"].sum()),
                    "forecast_usd": value,
                    "basis": "spend_now run rate",
                },
            )
        )
    return out


def budget_burn(rule: Rule, budgets: pd.DataFrame) -> list[Finding]:
    """A finding per budget whose projected spend for the period (see _projected) exceeds `burn_pct` % of
    its limit. Budgets without a dollar limit (USAGE budgets, the Cost Explorer forecast row) are skipped;
    of several rows of one budget the newest (day, then synced_at) counts. value: the projection;
    extra pct, limit_usd, actual_usd, forecast_usd, basis; at: the row's synced_at, else its day.

    Live budgets: spend_now rows beside them (source `spend_now`) price the rule's `budgets` on the run
    rate, so a stray instance started an hour ago is warned about before any forecast has it. AWS Budgets
    keep AWS's own forecast: a budget's cost filters are its scope, which the live figure cannot match."""
    burn = float(rule.thresholds["burn_pct"])
    spend = pd.DataFrame()
    if not _empty(budgets, "source") and "run_rate_usd" in budgets.columns:
        spend = budgets[budgets["source"] == SPEND_SOURCE]
        budgets = budgets[budgets["source"] != SPEND_SOURCE]
    out = _live_budgets(rule, spend, burn) if not spend.empty else []
    if _empty(budgets, "budget_name", "limit_usd"):
        return out
    b = budgets
    order = [c for c in ("day", "synced_at") if c in b.columns]
    if order:
        b = b.sort_values(order, kind="stable")
    for _, row in b.groupby("budget_name", sort=True).tail(1).sort_values("budget_name").iterrows():
        limit = row.get("limit_usd")
        if limit is None or pd.isna(limit) or float(limit) <= 0:
            continue
        value, basis = _projected(row)
        if value is None:
            continue
        pct = 100.0 * value / float(limit)
        if pct <= burn:
            continue
        at = None
        if "synced_at" in row and pd.notna(row["synced_at"]):
            at = utc(row["synced_at"])
        elif "day" in row and pd.notna(row["day"]):
            at = utc(_day(row["day"]))
        actual, forecast = row.get("actual_usd"), row.get("forecast_usd")
        out.append(
            Finding(
                rule=rule.id,
                labels={"budget_name": _label(row["budget_name"])},
                value=value,
                at=at,
                extra={
                    "pct": pct,
                    "limit_usd": float(limit),
                    "actual_usd": float(actual) if actual is not None and pd.notna(actual) else None,
                    "forecast_usd": float(forecast) if forecast is not None and pd.notna(forecast) else None,
                    "basis": basis,
                },
            )
        )
    return out


def cost_spike(rule: Rule, daily: pd.DataFrame) -> list[Finding]:
    """A finding per project whose cost on the latest day of `daily` is above median + k·MAD of its costs
    on the `days` days before (anomaly.above_baseline), given at least `min_days` of those days have
    cost rows (a project's first days are not a spike), and at least `min_increase_pct` % above the median
    (a steady project's MAD is ~0, and a cent is not a spike). Several rows of a project and day are
    summed. value: the day's cost; extra threshold (the larger bar), day, median, mad; at: the day's
    midnight (UTC)."""
    if _empty(daily, "day", "project", "cost_usd"):
        return []
    k = float(rule.thresholds["k"])
    days = int(rule.thresholds["days"])
    min_days = int(rule.thresholds["min_days"])
    margin = 1 + float(rule.thresholds["min_increase_pct"]) / 100
    d = daily[["day", "project", "cost_usd"]].copy()
    d["day"] = d["day"].map(_day)
    d["project"] = d["project"].map(_label)
    d = d[np.isfinite(d["cost_usd"].to_numpy(dtype=float))]
    if d.empty:
        return []
    per_day = d.groupby(["project", "day"], sort=True)["cost_usd"].sum()
    latest = max(d["day"])
    first = latest - timedelta(days=days)
    out = []
    for project, s in per_day.groupby(level="project", sort=True):
        s = s.droplevel("project")
        if latest not in s.index:
            continue
        history = s[(s.index >= first) & (s.index < latest)].to_numpy(dtype=float)
        value = float(s[latest])
        verdict = anomaly.above_baseline(history, value, k, min_points=max(min_days, 1), min_ratio=margin)
        if verdict is None or not verdict.fired:
            continue
        base = anomaly.robust_baseline(history, k)
        out.append(
            Finding(
                rule=rule.id,
                labels={"project": project},
                value=value,
                at=utc(latest),
                extra={
                    "threshold": verdict.baseline,
                    "day": latest.isoformat(),
                    "median": base.median,
                    "mad": base.mad,
                    "history_days": base.n,
                },
            )
        )
    return out


# -- ec2 ---------------------------------------------------------------------------------------------


def untracked_spend(rule: Rule, instances: pd.DataFrame, now: datetime) -> list[Finding]:
    """A finding per running instance outside the cluster (lib/ingest/untracked) that costs at least
    `usd_per_hour_min` on demand, or whose price the table lacks (unpriced is shown, not taken as $0).
    An instance carrying a Kubernetes cluster's tag gets `join_grace_minutes` from its launch to appear
    in kube_node_info (a node still joining is no stray). value: $/h (NaN unpriced); at: the launch
    time, the tick's time when that is unknown or later."""
    if _empty(instances, "instance_id", "usd_per_hour"):
        return []
    floor = float(rule.thresholds["usd_per_hour_min"])
    grace = timedelta(minutes=rule.thresholds["join_grace_minutes"])
    now = utc(now)
    out = []
    for _, row in instances.sort_values("instance_id").iterrows():
        usd = float(row["usd_per_hour"])
        if math.isfinite(usd) and usd < floor:
            continue
        launched = utc(row["launch_time"]) if pd.notna(row.get("launch_time")) else None
        since = min(launched, now) if launched is not None else now
        if bool(row.get("cluster_tagged")) and now - since < grace:
            continue
        hours = (now - since).total_seconds() / 3600
        out.append(
            Finding(
                rule=rule.id,
                labels={k: _label(row.get(k)) for k in untracked.LABELS},
                value=usd,
                at=since,
                extra={
                    "price": f"${usd:,.2f}/h" if math.isfinite(usd) else "unpriced (no price table row)",
                    "launched": launched.strftime("%Y-%m-%d %H:%M UTC") if launched else "unknown",
                    "spent_usd": usd * hours if math.isfinite(usd) else None,
                    "price_as_of": _label(row.get("price_as_of")),
                },
            )
        )
    return out


# -- prometheus --------------------------------------------------------------------------------------


def from_vector(rule: Rule, result: Any, now: datetime) -> list[Finding]:
    """An instant query's vector (`[{"metric": {...}, "value": [ts, "str"]}]`, or the whole `data` object
    holding it as `result`) as findings: one per series, labels = its labels minus __name__, value = its
    sample, at = `now` (a PromQL result does not say since when; the state machine keeps the first)."""
    if isinstance(result, Mapping):
        result = result.get("result") or []
    out = []
    at = utc(now)
    for series in result or []:
        metric = series.get("metric") or {}
        sample = series.get("value") or [None, "NaN"]
        try:
            value = float(sample[1])
        except (TypeError, ValueError, IndexError):
            value = math.nan
        labels = {str(k): _label(v) for k, v in metric.items() if k != "__name__"}
        out.append(Finding(rule=rule.id, labels=labels, value=value, at=at))
    return out


EVALUATORS: dict[str, Callable[..., list[Finding]]] = {
    "nan_loss": nan_loss,
    "training_run_silent": training_run_silent,
    "success_rate_drop": success_rate_drop,
    "entropy_collapse": entropy_collapse,
    "fsx_low_space": fsx_low_space,
    "budget_burn": budget_burn,
    "cost_spike": cost_spike,
    "untracked_spend": untracked_spend,
}
