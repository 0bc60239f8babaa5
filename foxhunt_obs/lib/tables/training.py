"""The MLflow tables, one function each: training_runs (the run snapshot, reading only the histories that
can have changed: ingest/mlflow_sync.py decides which), training_metrics (points by UTC day) and
training_health (per run and day)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta, timezone

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from foxhunt_obs.lib.analysis.training_health import Thresholds, build_training_health, mlflow_key, runs_frame
from foxhunt_obs.lib.ingest.mlflow_sync import needs_history, snapshot_row, split_by_run
from foxhunt_obs.lib.lake import Lake
from foxhunt_obs.lib.schemas import (
    SNAPSHOT,
    TRAINING_HEALTH,
    TRAINING_HISTORY,
    TRAINING_METRICS,
    TRAINING_RUNS,
)
from foxhunt_obs.lib.sources.mlflow import MlflowSource, MlflowSourceError
from foxhunt_obs.lib.tables import Built, MissingInput, md_table, row_count


def training_runs(lake: Lake, source: MlflowSource) -> Built:
    previous = lake.read_partition(TRAINING_RUNS, SNAPSHOT)
    prev = {r["run_id"]: r for r in previous.to_pylist()} if previous is not None else {}
    have = set(lake.partitions(TRAINING_HISTORY))
    try:
        runs = source.runs()
        stale = [r for r in runs if needs_history(r, prev.get(r.run_id), r.run_id in have)]
        histories = source.histories(stale)
    except MlflowSourceError as e:
        raise MlflowSourceError(f"training_runs: {e}") from None
    now = datetime.now(timezone.utc)
    rows, new_points = [], 0
    by_run = split_by_run(histories, [r.run_id for r in stale])
    for run in runs:
        if run.run_id in by_run:
            table = by_run[run.run_id]
            lake.write_partition(TRAINING_HISTORY, run.run_id, table)
            old = prev.get(run.run_id, {}).get("history_points") or 0
            new_points += max(0, table.num_rows - old)
            rows.append(snapshot_row(run, run.status, table.num_rows, now))
        else:
            p = prev[run.run_id]
            rows.append(snapshot_row(run, p["history_status"], p["history_points"], p["synced_at"]))
    snapshot = pa.Table.from_pylist(rows, schema=TRAINING_RUNS.schema)
    lake.write_partition(TRAINING_RUNS, SNAPSHOT, snapshot)
    nan_runs = (
        lake.query(
            "SELECT count(DISTINCT run_id) AS n FROM training_history WHERE key = $loss AND NOT isfinite(value)",
            {"loss": mlflow_key("loss")},
        )
        .column("n")[0]
        .as_py()
    )
    preview = snapshot.select(
        ["run_name", "experiment", "status", "deleted", "pod", "history_points"]
    ).to_pandas()
    summary = {
        "dagster/row_count": len(runs),
        "runs_seen": len(runs),
        "histories_read": len(stale),
        "new_points": new_points,
        "runs_with_nan_loss": int(nan_runs),
        "running": sum(r.status == "RUNNING" for r in runs),
        "deleted": sum(r.deleted for r in runs),
        "preview": md_table(preview.head(20), floatfmt=None),
    }
    return Built({SNAPSHOT: snapshot}, summary)


def training_metrics(lake: Lake, days: Sequence[datetime]) -> Built:
    tables, per_key = {}, {}
    for day in days:
        end = day + timedelta(days=1)
        table = lake.query(
            "SELECT run_id, key, step, ts, value FROM training_history WHERE ts >= ? AND ts < ? "
            "ORDER BY run_id, key, step, ts",
            [day, end],
            tables=[TRAINING_HISTORY],
        )
        lake.write_partition(TRAINING_METRICS, TRAINING_METRICS.key(day), table)
        tables[TRAINING_METRICS.key(day)] = table
        for key, n in zip(*_value_counts(table)):
            per_key[key] = per_key.get(key, 0) + n
    return Built(
        tables, {"dagster/row_count": row_count(tables), "points_by_key": dict(sorted(per_key.items()))}
    )


def _value_counts(table: pa.Table):
    counts = pc.value_counts(table.column("key")).to_pylist() if table.num_rows else []
    return [c["values"] for c in counts], [c["counts"] for c in counts]


def training_health(lake: Lake, days: Sequence[datetime], thresholds: Thresholds) -> Built:
    snapshot = lake.read_partition(TRAINING_RUNS, SNAPSHOT)
    if snapshot is None:
        raise MissingInput(f"training_health: no training_runs snapshot in the lake at {lake.root}")
    runs = runs_frame(snapshot)
    newest = runs["last_metric_time"].max() if len(runs) else None
    flagged, tables = {}, {}
    for day in days:
        end = day + timedelta(days=1)
        # "now" for stall detection: never past the day, nor past the newest metric anywhere
        as_of = min(datetime.now(timezone.utc), end, newest if pd.notna(newest) else end)
        history = lake.query(
            "SELECT run_id, key, step, ts, value FROM training_history WHERE ts < ?",
            [end],
            tables=[TRAINING_HISTORY],
        ).to_pandas()
        history["ts"] = history["ts"].dt.tz_convert("UTC") if len(history) else history["ts"]
        table = build_training_health(runs, history, day.date(), as_of, thresholds)
        lake.write_partition(TRAINING_HEALTH, TRAINING_HEALTH.key(day), table)
        tables[TRAINING_HEALTH.key(day)] = table
        df = table.to_pandas()
        for flag in ("success_drop", "entropy_collapse", "stalled", "accuracy_out_of_band"):
            flagged.setdefault(flag, []).extend(df.loc[df[flag], "run_name"].tolist())
        flagged.setdefault("nan_loss", []).extend(df.loc[df["loss_nonfinite"] > 0, "run_name"].tolist())
    summary = {
        "dagster/row_count": row_count(tables),
        **{f"runs_{k}": ", ".join(sorted(set(v))) or "none" for k, v in flagged.items()},
    }
    return Built(tables, summary)
