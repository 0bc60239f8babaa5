"""The report's numbers, computed from the frames (the per-experiment table is their source of truth; the
totals bring only what the frames cannot: the bill, the estimate and their gap). A figure nobody can know
(no bill, no previous week, no SM activity reported) stays NaN rather than becoming a zero."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from foxhunt_obs.lib.names import CLUSTER_IDLE, UNATTRIBUTED
from foxhunt_obs.lib.report.model import ReportDataError


# -- frames ------------------------------------------------------------------------------------------------
def experiment_names(values: pd.Series) -> pd.Series:
    """Experiment names as text, a missing one as the unattributed experiment."""
    return values.astype(object).where(values.notna(), UNATTRIBUTED).astype(str)


def experiment_frame(frame: pd.DataFrame, name: str) -> pd.DataFrame:
    """One row per experiment (rows of the same experiment summed), largest $ first, cluster idle last."""
    frame = frame.assign(experiment=experiment_names(frame["experiment"]))
    if frame["experiment"].duplicated().any():
        raise ReportDataError(
            f"weekly report: frame {name!r} has several rows for experiments "
            f"{sorted(frame.loc[frame['experiment'].duplicated(), 'experiment'].unique())}"
        )
    order = frame.assign(
        _idle=frame["experiment"].eq(CLUSTER_IDLE), _usd=frame["allocated_usd"].fillna(0.0)
    ).sort_values(["_idle", "_usd", "experiment"], ascending=[True, False, True])
    return order.drop(columns=["_idle", "_usd"]).reset_index(drop=True)


# -- figures -----------------------------------------------------------------------------------------------
def column_sum(frame: pd.DataFrame | None, column: str) -> float:
    """The column's total, what is not a number counted as 0."""
    if frame is None or frame.empty or column not in frame:  # an optional column (unknown, SM) absent: none
        return 0.0
    return float(pd.to_numeric(frame[column], errors="coerce").fillna(0.0).sum())


def sm_basis(experiments: pd.DataFrame) -> tuple[float, float]:
    """(SM-active GPU-hours, the dollars whose SM activity is known): NaN, NaN when no experiment's GPUs
    reported SM activity at all (the cluster-idle row's unheld dollars alone make no basis)."""
    if "sm_active_gpu_hours" not in experiments:
        return math.nan, math.nan
    held = experiments[experiments["experiment"] != CLUSTER_IDLE]
    if not pd.to_numeric(held["sm_active_gpu_hours"], errors="coerce").notna().any():
        return math.nan, math.nan
    known = column_sum(experiments, "allocated_usd") - column_sum(experiments, "sm_unknown_activity_usd")
    return column_sum(experiments, "sm_active_gpu_hours"), known


def ratio(num: float, den: float) -> float:
    """num / den, NaN when either is unknown or den is 0."""
    return num / den if den and math.isfinite(den) and math.isfinite(num) else math.nan


def to_float(value) -> float:
    """float(value), NaN when it is none."""
    try:
        value = float(value)
    except (TypeError, ValueError):
        return math.nan
    return value


def headline_figures(
    experiments: pd.DataFrame,
    previous: pd.DataFrame | None,
    totals: dict,
    wastes: pd.DataFrame,
    outcomes: pd.DataFrame,
) -> dict[str, float]:
    """The headline numbers, name -> value (Report.figures), NaN where unknown."""
    total = column_sum(experiments, "allocated_usd")
    idle = column_sum(experiments, "idle_usd")
    unheld = experiments[experiments["experiment"] == CLUSTER_IDLE]
    gpu_hours = column_sum(experiments, "gpu_hours")
    active = column_sum(experiments, "active_gpu_hours")
    util_known_usd = total - column_sum(experiments, "unknown_activity_usd")
    sm_active, sm_known_usd = sm_basis(experiments)
    bill = to_float(totals.get("bill_usd"))
    estimate = to_float(totals.get("estimate_usd"))
    gap = to_float(totals.get("gap_pct"))
    if not math.isfinite(gap) and math.isfinite(bill) and math.isfinite(estimate) and bill:
        gap = (estimate - bill) / bill * 100.0
    previous_total = column_sum(previous, "allocated_usd") if previous is not None else math.nan
    per_point = pd.to_numeric(outcomes["usd_per_point"], errors="coerce").to_numpy(dtype=float)
    per_point = per_point[np.isfinite(per_point)]
    return {
        "total_usd": total,
        "unallocated_usd": column_sum(unheld, "allocated_usd"),
        "idle_usd": idle,
        "idle_pct": ratio(idle, total) * 100.0,
        "gpu_hours": gpu_hours,
        "active_gpu_hours": active,
        "util_pct": ratio(active, gpu_hours) * 100.0,
        # over the dollars whose activity is known, on each basis (unknown is neither busy nor idle)
        "active_gpu_hours_per_usd": ratio(active, util_known_usd),
        "usd_per_active_gpu_hour": ratio(total, active),
        # NaN where no GPU reported SM activity: the basis is unknown, not zero
        "sm_active_gpu_hours": sm_active,
        "sm_active_gpu_hours_per_usd": ratio(sm_active, sm_known_usd),
        "energy_kwh": column_sum(experiments, "energy_kwh"),
        "experiments": float((experiments["experiment"] != CLUSTER_IDLE).sum()),
        "bill_usd": bill,
        "estimate_usd": estimate,
        "estimate_gap_pct": gap,
        "previous_total_usd": previous_total,
        "week_over_week_usd_pct": (ratio(total - previous_total, previous_total) * 100.0),
        "top_wastes_idle_usd": column_sum(wastes, "idle_usd"),
        "best_usd_per_point": float(per_point.min()) if len(per_point) else math.nan,
    }
