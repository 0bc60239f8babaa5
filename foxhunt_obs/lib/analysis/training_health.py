"""Training health per run and day, from MLflow metric histories: do its curves trend as a healthy run's do.

Pure functions over arrays: robust window medians (one bad point is not a trend), least-squares
slopes, and the run-day summary. Thresholds come from data/training_health.yaml.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date, datetime, timedelta, timezone
from functools import cache
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa

from foxhunt_obs.lib.schemas import TRAINING_HEALTH
from foxhunt_obs.lib.yaml_text import load_yaml

THRESHOLDS_PATH = Path(__file__).resolve().parents[2] / "data" / "training_health.yaml"


@dataclass(frozen=True)
class Thresholds:
    stall_minutes: float
    window_points: int
    success_drop: float
    entropy_collapse_below: float
    accuracy_band: tuple[float, float]
    keys: dict[str, str]


def mlflow_key(name: str) -> str:
    """The MLflow metric key behind one of training_health's names (success_rate, loss, entropy, ...):
    data/training_health.yaml's `keys`, the one place they are spelled."""
    return load_thresholds().keys[name]


@cache
def load_thresholds(path: str = str(THRESHOLDS_PATH)) -> Thresholds:
    raw = load_yaml(Path(path).read_text())
    return Thresholds(
        stall_minutes=float(raw["stall_minutes"]),
        window_points=int(raw["window_points"]),
        success_drop=float(raw["success_drop"]),
        entropy_collapse_below=float(raw["entropy_collapse_below"]),
        accuracy_band=(float(raw["accuracy_band"][0]), float(raw["accuracy_band"][1])),
        keys=dict(raw["keys"]),
    )


def window_medians(values: np.ndarray, w: int) -> np.ndarray:
    """Medians of every run of w consecutive finite values (index i: values[i:i+w])."""
    v = values[np.isfinite(values)]
    if v.size < w:
        return np.empty(0)
    return np.median(np.lib.stride_tricks.sliding_window_view(v, w), axis=1)


def first_drop(values: np.ndarray, w: int, threshold: float) -> int | None:
    """Index (into the finite values) where the median of the next w points is at least `threshold`
    below the median of the w points before: a sudden drop against a robust trailing baseline."""
    med = window_medians(values, w)
    for i in range(w, med.size):
        if med[i - w] - med[i] >= threshold:
            return i
    return None


def first_below(values: np.ndarray, w: int, limit: float) -> int | None:
    """Index where the median of w consecutive finite points first falls under `limit`."""
    below = np.nonzero(window_medians(values, w) < limit)[0]
    return int(below[0]) + w - 1 if below.size else None


def slope_per_hour(ts: np.ndarray, values: np.ndarray) -> float | None:
    """Least-squares slope of values over time (ts in seconds), per hour; None under two points."""
    ok = np.isfinite(values)
    if ok.sum() < 2 or np.ptp(ts[ok]) == 0:
        return None
    return float(np.polyfit(ts[ok] / 3600.0, values[ok], 1)[0])


def build_training_health(
    runs: pd.DataFrame, history: pd.DataFrame, day: date, as_of: datetime, t: Thresholds
) -> pa.Table:
    """Health rows for `day`.

    runs: training_runs rows; history: every point with ts before the day's end of those runs
    (run_id, key, step, ts, value). A run gets a row when it logged that day, or when it is RUNNING,
    started before the day ended and went quiet (a stall has no points to show for itself).
    as_of: the time "now" means for stall detection — the caller passes min(now, end of day, newest
    metric anywhere), so replaying old data does not call everything stalled.
    """
    start = datetime.combine(day, datetime.min.time(), tzinfo=timezone.utc)
    end = start + timedelta(days=1)
    hist = history.sort_values(["run_id", "key", "ts", "step"])
    by_run = {rid: g for rid, g in hist.groupby("run_id", sort=False)}
    rows = []
    for run in runs.itertuples(index=False):
        h = by_run.get(run.run_id, hist.iloc[0:0])
        today = h[h["ts"] >= start]
        quiet_running = run.status == "RUNNING" and pd.notna(run.start_time) and run.start_time < end
        if today.empty and not quiet_running:
            continue
        rows.append(_health_row(run, h, today, day, start, as_of, t))
    table = pd.DataFrame(rows, columns=TRAINING_HEALTH.schema.names)
    return pa.Table.from_pandas(table, schema=TRAINING_HEALTH.schema, preserve_index=False)


def _series(h: pd.DataFrame, key: str) -> tuple[np.ndarray, np.ndarray]:
    s = h[h["key"] == key]
    ts = s["ts"].map(lambda x: x.timestamp()).to_numpy(dtype=float) if len(s) else np.empty(0)
    return ts, s["value"].to_numpy(dtype=float)


def _mean(h: pd.DataFrame, key: str) -> float:
    v = _series(h, key)[1]
    v = v[np.isfinite(v)]
    return float(v.mean()) if v.size else np.nan


def _health_row(run, h, today, day, start, as_of, t: Thresholds) -> dict:
    k, w = t.keys, t.window_points
    sr_ts_all, sr_all = _series(h, k["success_rate"])
    sr_ts, sr = _series(today, k["success_rate"])
    finite_sr = sr_all[np.isfinite(sr_all)]
    # a drop counts on the day its lower window ends: the baseline may come from the day before
    drop_at = first_drop(sr_all, w, t.success_drop)
    finite_ts = sr_ts_all[np.isfinite(sr_all)]
    drop_today = (
        drop_at is not None and finite_ts[min(drop_at + w - 1, finite_ts.size - 1)] >= start.timestamp()
    )
    loss = _series(today, k["loss"])[1]
    ent_ts_all, ent_all = _series(h, k["entropy"])
    ent_ts, ent = _series(today, k["entropy"])
    collapse_at = first_below(ent_all, w, t.entropy_collapse_below)
    ent_finite_ts = ent_ts_all[np.isfinite(ent_all)]
    collapse_today = collapse_at is not None and ent_finite_ts[collapse_at] >= start.timestamp()
    gen, upd, tot = (_mean(today, k[x]) for x in ("generate", "update", "total"))
    rollout_share = gen / tot if tot and np.isfinite(tot) else np.nan
    update_share = upd / tot if tot and np.isfinite(tot) else np.nan
    bottleneck = "" if np.isnan(rollout_share) else ("rollout" if rollout_share >= update_share else "update")
    acc = _series(today, k["accuracy"])[1]
    lo, hi = t.accuracy_band
    acc_f = acc[np.isfinite(acc)]
    acc_med = window_medians(acc, w)
    last = h["ts"].max() if len(h) else None
    minutes_quiet = (as_of - last).total_seconds() / 60 if last is not None and last <= as_of else None
    stalled = run.status == "RUNNING" and (
        (minutes_quiet is not None and minutes_quiet > t.stall_minutes)
        or (last is None and (as_of - run.start_time).total_seconds() / 60 > t.stall_minutes)
    )
    return {
        "day": day,
        "run_id": run.run_id,
        "run_name": run.run_name,
        "experiment": run.experiment,
        "status": run.status,
        "deleted": bool(run.deleted),
        "pod": run.pod,
        "points": len(today),
        "success_rate_last": float(sr[np.isfinite(sr)][-1]) if np.isfinite(sr).any() else None,
        "success_rate_best": float(finite_sr.max()) if finite_sr.size else None,
        "success_rate_trend_per_hour": slope_per_hour(sr_ts, sr),
        "success_drop": bool(drop_today),
        "loss_nonfinite": int((~np.isfinite(loss)).sum()),
        "entropy_last": float(ent[np.isfinite(ent)][-1]) if np.isfinite(ent).any() else None,
        "entropy_slope_per_hour": slope_per_hour(ent_ts, ent),
        "entropy_collapse": bool(collapse_today),
        "rollout_share": None if np.isnan(rollout_share) else float(rollout_share),
        "update_share": None if np.isnan(update_share) else float(update_share),
        "bottleneck": bottleneck,
        "accuracy_out_of_band_points": int(((acc_f < lo) | (acc_f > hi)).sum()),
        "accuracy_out_of_band": bool(((acc_med < lo) | (acc_med > hi)).any()),
        "last_metric_time": last,
        "minutes_since_last_metric": minutes_quiet,
        "stalled": bool(stalled),
    }


def runs_frame(table: pa.Table) -> pd.DataFrame:
    """training_runs as pandas with UTC datetimes (None for missing)."""
    df = table.to_pandas()
    for col in ("start_time", "end_time", "last_metric_time", "synced_at"):
        df[col] = pd.to_datetime(df[col], utc=True)
    return df
