"""What a dollar bought, per UTC day, from cost_allocation (docs/cost-model.md): utilization_per_dollar
(active GPU-hours per $, by experiment) and outcome_per_dollar (each MLflow run's success_rate at its start
and at the day's end beside what its pods' GPUs cost, from training_runs and training_metrics). One
partition per day each; the SQL is in cost_model.py."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from foxhunt_obs.lib.lake import Lake
from foxhunt_obs.lib.names import CLUSTER_IDLE
from foxhunt_obs.lib.schemas import (
    COST_ALLOCATION,
    OUTCOME_PER_DOLLAR,
    TRAINING_METRICS,
    TRAINING_RUNS,
    UTILIZATION_PER_DOLLAR,
)
from foxhunt_obs.lib.tables import Built, frame, md_table
from foxhunt_obs.lib.tables.cost_model import build_outcome_per_dollar, build_utilization_per_dollar
from foxhunt_obs.lib.tables.per_day import write_per_day


def utilization_per_dollar(lake: Lake, days: Sequence[datetime]) -> Built:
    tables = write_per_day(
        lake,
        days,
        [COST_ALLOCATION],
        UTILIZATION_PER_DOLLAR,
        lambda con, d: build_utilization_per_dollar(con, d.date()),
    )
    df = frame(tables)
    total, active = df.allocated_usd.sum(), df.active_gpu_hours.sum()
    held = df[df.experiment != CLUSTER_IDLE]
    # NaN where no GPU reported SM activity: unknown, not 0 (the cluster row's unheld $ make no basis)
    sm_known = total - df.sm_unknown_activity_usd.sum() if held.sm_active_gpu_hours.notna().any() else 0.0
    columns = [
        "day", "experiment", "gpu_hours", "active_gpu_hours", "allocated_usd", "idle_usd",
        "active_gpu_hours_per_usd", "sm_active_gpu_hours_per_usd", "usd_per_active_gpu_hour", "cost_source",
    ]  # fmt: skip
    summary = {
        "dagster/row_count": len(df),
        "allocated_usd": round(float(total), 2),
        "idle_usd": round(float(df.idle_usd.sum()), 2),
        "active_gpu_hours_per_usd": round(float(active / total), 5) if total else float("nan"),
        "sm_active_gpu_hours_per_usd": (
            round(float(df.sm_active_gpu_hours.sum() / sm_known), 5) if sm_known > 1e-9 else float("nan")
        ),
        "table": md_table(df[columns]),
    }
    return Built(tables, summary)


def outcome_per_dollar(lake: Lake, days: Sequence[datetime]) -> Built:
    reads = [TRAINING_RUNS, TRAINING_METRICS, COST_ALLOCATION]
    tables = write_per_day(
        lake, days, reads, OUTCOME_PER_DOLLAR, lambda con, d: build_outcome_per_dollar(con, d.date())
    )
    df = frame(tables)
    view = df[
        [
            "day",
            "run_name",
            "experiment",
            "success_start",
            "success_end",
            "usd",
            "usd_per_point",
            "charged_by",
        ]
    ]
    summary = {
        "dagster/row_count": len(df),
        "runs": md_table(view),
        "runs_without_known_gpu": int(df.usd.isna().sum()),
    }
    return Built(tables, summary)
