"""The MLflow sync: which runs' metric histories to read again, and a run as a training_runs row.

A sync reads every run's summary (cheap) and only the histories that can have changed (the expensive
part): a new run, one still running, one that ended since its history was last read (once more), or one
that logged something newer. The table function (tables/training.py) reads and writes the lake.
"""

from __future__ import annotations

import json
from datetime import datetime

import pyarrow as pa
import pyarrow.compute as pc

from foxhunt_obs.lib.sources.mlflow import MlflowRun

TERMINAL = {"FINISHED", "FAILED", "KILLED"}


def needs_history(run: MlflowRun, prev: dict | None, have_history: bool) -> bool:
    """Read a run's histories when they can have changed: new, still running, or ended since the
    last read (once more), or something newer was logged. A finished run read after it ended is done."""
    if prev is None or not have_history:
        return True
    if prev["history_status"] not in TERMINAL:
        return True
    last = prev["last_metric_time"]
    return run.last_metric_time is not None and (last is None or run.last_metric_time > last)


def snapshot_row(run: MlflowRun, history_status: str, points: int, synced_at: datetime) -> dict:
    duration = (run.end_time - run.start_time).total_seconds() if run.start_time and run.end_time else None
    return {
        "run_id": run.run_id,
        "experiment_id": run.experiment_id,
        "mlflow_experiment": run.experiment_name,
        "experiment": run.tags.get("experiment") or run.experiment_name,
        "run_name": run.run_name,
        "status": run.status,
        "deleted": run.deleted,
        "start_time": run.start_time,
        "end_time": run.end_time,
        "duration_seconds": duration,
        "user": run.user,
        "params": json.dumps(run.params, sort_keys=True),
        "tags": json.dumps(run.tags, sort_keys=True),
        "pod": run.tags.get("pod", ""),
        "namespace": run.tags.get("namespace", ""),
        "metric_keys": json.dumps(sorted(run.metric_keys)),
        "last_metric_time": run.last_metric_time,
        "history_status": history_status,
        "history_points": points,
        "synced_at": synced_at,
    }


def split_by_run(histories: pa.Table, run_ids: list[str]) -> dict[str, pa.Table]:
    """One table per run, empty ones included (a run that logged nothing has an empty history)."""
    return {rid: histories.filter(pc.equal(histories.column("run_id"), rid)) for rid in run_ids}
