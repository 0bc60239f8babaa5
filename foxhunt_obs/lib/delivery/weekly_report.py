"""The weekly GPU cost report: the week's frames in, Markdown (for the Dagster UI), a self-contained HTML
page and PNG charts out.

One document model, two renderers: the report is built once as a list of blocks (headings, paragraphs,
headline figures, tables, images) whose cells are already formatted strings, then written as Markdown and
as HTML, so the two never disagree. Every string that comes from data (experiment, pod, node and run
names, alert summaries) is escaped for the target: HTML entities in the page, HTML entities plus Markdown
punctuation in the Markdown. The page needs nothing from the network and runs no script (its Content
Security Policy forbids both): images are ``data:`` URIs, the CSS is inline.

Rendering is deterministic: no clock, no randomness, stable sort orders; the same data gives the same bytes.
Headline figures are computed from the frames (the per-experiment table is the source of truth); the
totals dict brings what the frames cannot: the bill, the estimate and their gap.
"""

from __future__ import annotations

import base64
import html
import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta

import numpy as np
import pandas as pd

from foxhunt_obs.lib.delivery.charts import CLUSTER_IDLE, render_charts

COST_POLICY = """\
How the dollars in this report are computed (the cost model):

- A GPU's cost for an hour is its node's cost for that hour divided by the GPUs on the node. The node cost comes from the AWS Cost and Usage Report (CUR) once it has landed, else from the dated price table (an estimate); the cost source column says which.
- That cost is split over every pod that held the GPU in the hour, by the time each held it (a hand-off at 14:20 charges the first pod 20 minutes and the second 40), and charged to the pod, then the pod's experiment label, then its namespace, then "unattributed". GPU time no pod held is unallocated and shown as "(cluster idle)".
- A time-sliced GPU (several pods on it at once: the device plugin's time-slicing, each pod's copy of the GPU's series) is split evenly over the replicas held at each scrape (a pod holding two replicas pays two shares); its activity is the GPU's, split the same way (per-process utilization does not move dollars).
- A MIG slice is a GPU of its own for this: it costs its share of its GPU (its compute slices over the GPU's, 3g.40gb = 3/7), and the part of a MIG GPU no slice covers is unallocated.
- Active GPU-hours = sum of utilization x time (on a MIG slice, GR_ENGINE_ACTIVE x time x its share). Idle $ = allocated $ x (1 - active fraction); all of "(cluster idle)" is idle. GPU time for which no utilization was reported is unknown activity: counted neither as active nor as idle.
- Utilization per dollar = active GPU-hours / $ (higher is better); its inverse is $ per active GPU-hour. It is given on two bases: utilization (DCGM_FI_DEV_GPU_UTIL, the share of time some kernel ran: every dashboard's figure) and SM activity (DCGM_FI_PROF_SM_ACTIVE, the share of cycles an SM had work: closer to what the GPU did), each over the dollars whose activity on that basis was reported.
- An MLflow run costs what its pods (its `pod` tag, a comma-separated list, in its `namespace`) were allocated between its start and its end: a pod name reused by a later run (a StatefulSet's trainer-0) or the same name in another namespace is not charged to it. In an hour two runs share, each gets the seconds its own window covers, at most what the pod held and together never more than the hour; a run MLflow still calls RUNNING ends where the next run on its pods starts.
- Bill lines on no node go to their Experiment tag (an experiment's S3 bucket); the rest (FSx, the EKS control plane) are shared by the GPU-hours each experiment held that day. Once the bill has landed every dollar comes from it, so the day's allocations sum to the bill.
- The estimate and the bill are both kept, and the gap between them is shown. Weeks run from Monday 00:00 UTC to the next Monday 00:00 UTC.
"""

DAILY_COLUMNS = ("day", "experiment", "allocated_usd", "idle_usd", "gpu_hours", "active_gpu_hours")
EXPERIMENT_COLUMNS = (
    "experiment", "gpu_hours", "active_gpu_hours", "mean_util", "allocated_usd", "idle_usd",
    "active_gpu_hours_per_usd", "usd_per_active_gpu_hour", "energy_kwh", "cost_source",
)  # fmt: skip
WASTE_COLUMNS = ("pod", "experiment", "node", "gpus", "held_gpu_hours", "mean_util", "idle_usd")
OUTCOME_COLUMNS = (
    "run_name", "experiment", "success_start", "success_end", "success_gained", "usd", "usd_per_point",
)  # fmt: skip
ALERT_COLUMNS = ("rule", "severity", "fired_at", "resolved_at", "summary")
TOTAL_KEYS = ("bill_usd", "estimate_usd", "allocated_usd", "idle_usd", "unallocated_usd", "gap_pct")
NO_VALUE = "—"

CHART_TITLES = {
    "daily_spend.png": "Daily spend by experiment",
    "utilization_per_dollar.png": "Utilization per dollar by experiment",
    "idle_by_day.png": "Idle dollars by day",
}


class ReportDataError(ValueError):
    """The report's input frames do not fit the contract; the message names the frame and the columns."""


@dataclass
class WeeklyReportData:
    """One week's input. Frames need at least the ``*_COLUMNS`` above (extra columns are ignored):
    daily (experiment x day), experiments (one row each, "(cluster idle)" included), previous (the same
    for the week before; None or empty: no deltas), wastes (the five biggest, already sorted), outcomes
    (per MLflow run; success points on the 0-100 scale), alerts (None: no alerts table yet).
    totals: bill_usd (NaN: no bill yet), estimate_usd, allocated_usd, idle_usd, unallocated_usd, gap_pct
    ((estimate - bill) / bill x 100; computed here when NaN but both amounts are known)."""

    week_start: date
    daily: pd.DataFrame
    experiments: pd.DataFrame
    previous: pd.DataFrame | None
    wastes: pd.DataFrame
    outcomes: pd.DataFrame
    totals: dict[str, float]
    alerts: pd.DataFrame | None
    cost_policy: str | None = None
    activity_basis: str = (
        "util"  # the headline basis of active GPU-hours: util or sm (FOXHUNT_ACTIVITY_BASIS)
    )


@dataclass
class Report:
    """markdown: for dg.MetadataValue.md (charts as data: URIs); html: the self-contained page; charts:
    name.png -> PNG bytes; figures: headline numbers for numeric metadata, NaN where unknown."""

    markdown: str
    html: str
    charts: dict[str, bytes] = field(default_factory=dict)
    figures: dict[str, float] = field(default_factory=dict)


def render_weekly_report(data: WeeklyReportData) -> Report:
    """Render the week: Markdown with data-URI charts, a self-contained HTML page, the PNGs and the headline
    figures (NaN where unknown: no bill, no previous week)."""
    week_start = _check(data)
    experiments = _experiment_frame(data.experiments, "experiments")
    previous = None
    if data.previous is not None and not data.previous.empty:
        previous = _experiment_frame(data.previous, "previous")
    daily = data.daily.assign(experiment=_names(data.daily["experiment"]))

    figures = _figures(experiments, previous, data.totals, data.wastes, data.outcomes)
    charts = render_charts(daily, experiments, week_start)
    title = f"Weekly GPU cost report — week of {week_start.isoformat()}"
    blocks = _document(title, week_start, figures, experiments, previous, data, charts)
    return Report(
        markdown=_to_markdown(blocks, charts),
        html=_to_html(title, blocks, charts),
        charts=charts,
        figures=figures,
    )


# -- input -------------------------------------------------------------------------------------------------
def _check(data: WeeklyReportData) -> date:
    week_start = data.week_start
    if isinstance(week_start, datetime):
        week_start = week_start.date()
    if not isinstance(week_start, date) or week_start.weekday() != 0:
        raise ReportDataError(
            f"weekly report: week_start {data.week_start!r} is not a Monday (weeks start Monday 00:00 UTC)"
        )
    frames = [
        ("daily", data.daily, DAILY_COLUMNS),
        ("experiments", data.experiments, EXPERIMENT_COLUMNS),
        ("wastes", data.wastes, WASTE_COLUMNS),
        ("outcomes", data.outcomes, OUTCOME_COLUMNS),
    ]
    if data.previous is not None and not data.previous.empty:
        frames.append(("previous", data.previous, EXPERIMENT_COLUMNS))
    if data.alerts is not None:
        frames.append(("alerts", data.alerts, ALERT_COLUMNS))
    for name, frame, columns in frames:
        if not isinstance(frame, pd.DataFrame):
            raise ReportDataError(
                f"weekly report {week_start}: {name} is {type(frame).__name__}, not a DataFrame"
            )
        missing = [c for c in columns if c not in frame.columns]
        if missing:
            raise ReportDataError(
                f"weekly report {week_start}: frame {name!r} misses columns {missing} (has {list(frame.columns)})"
            )
    return week_start


def _names(values: pd.Series) -> pd.Series:
    return values.astype(object).where(values.notna(), "unattributed").astype(str)


def _experiment_frame(frame: pd.DataFrame, name: str) -> pd.DataFrame:
    """One row per experiment (rows of the same experiment summed), largest $ first, cluster idle last."""
    frame = frame.assign(experiment=_names(frame["experiment"]))
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
def _sum(frame: pd.DataFrame | None, column: str) -> float:
    if frame is None or frame.empty or column not in frame:  # an optional column (unknown, SM) absent: none
        return 0.0
    return float(pd.to_numeric(frame[column], errors="coerce").fillna(0.0).sum())


def _sm_basis(experiments: pd.DataFrame) -> tuple[float, float]:
    """(SM-active GPU-hours, the dollars whose SM activity is known): NaN, NaN when no experiment's GPUs
    reported SM activity at all (the cluster-idle row's unheld dollars alone make no basis)."""
    if "sm_active_gpu_hours" not in experiments:
        return math.nan, math.nan
    held = experiments[experiments["experiment"] != CLUSTER_IDLE]
    if not pd.to_numeric(held["sm_active_gpu_hours"], errors="coerce").notna().any():
        return math.nan, math.nan
    known = _sum(experiments, "allocated_usd") - _sum(experiments, "sm_unknown_activity_usd")
    return _sum(experiments, "sm_active_gpu_hours"), known


def _ratio(num: float, den: float) -> float:
    return num / den if den and math.isfinite(den) and math.isfinite(num) else math.nan


def _num(value) -> float:
    try:
        value = float(value)
    except (TypeError, ValueError):
        return math.nan
    return value


def _figures(
    experiments: pd.DataFrame,
    previous: pd.DataFrame | None,
    totals: dict,
    wastes: pd.DataFrame,
    outcomes: pd.DataFrame,
) -> dict[str, float]:
    total = _sum(experiments, "allocated_usd")
    idle = _sum(experiments, "idle_usd")
    unheld = experiments[experiments["experiment"] == CLUSTER_IDLE]
    gpu_hours = _sum(experiments, "gpu_hours")
    active = _sum(experiments, "active_gpu_hours")
    util_known_usd = total - _sum(experiments, "unknown_activity_usd")
    sm_active, sm_known_usd = _sm_basis(experiments)
    bill = _num(totals.get("bill_usd"))
    estimate = _num(totals.get("estimate_usd"))
    gap = _num(totals.get("gap_pct"))
    if not math.isfinite(gap) and math.isfinite(bill) and math.isfinite(estimate) and bill:
        gap = (estimate - bill) / bill * 100.0
    previous_total = _sum(previous, "allocated_usd") if previous is not None else math.nan
    per_point = pd.to_numeric(outcomes["usd_per_point"], errors="coerce").to_numpy(dtype=float)
    per_point = per_point[np.isfinite(per_point)]
    return {
        "total_usd": total,
        "unallocated_usd": _sum(unheld, "allocated_usd"),
        "idle_usd": idle,
        "idle_pct": _ratio(idle, total) * 100.0,
        "gpu_hours": gpu_hours,
        "active_gpu_hours": active,
        "util_pct": _ratio(active, gpu_hours) * 100.0,
        # over the dollars whose activity is known, on each basis (unknown is neither busy nor idle)
        "active_gpu_hours_per_usd": _ratio(active, util_known_usd),
        "usd_per_active_gpu_hour": _ratio(total, active),
        # NaN where no GPU reported SM activity: the basis is unknown, not zero
        "sm_active_gpu_hours": sm_active,
        "sm_active_gpu_hours_per_usd": _ratio(sm_active, sm_known_usd),
        "energy_kwh": _sum(experiments, "energy_kwh"),
        "experiments": float((experiments["experiment"] != CLUSTER_IDLE).sum()),
        "bill_usd": bill,
        "estimate_usd": estimate,
        "estimate_gap_pct": gap,
        "previous_total_usd": previous_total,
        "week_over_week_usd_pct": (_ratio(total - previous_total, previous_total) * 100.0),
        "top_wastes_idle_usd": _sum(wastes, "idle_usd"),
        "best_usd_per_point": float(per_point.min()) if len(per_point) else math.nan,
    }


# -- formatting --------------------------------------------------------------------------------------------
def _finite(value) -> bool:
    try:
        return math.isfinite(float(value))
    except (TypeError, ValueError):
        return False


def money(value, signed: bool = False) -> str:
    """$1,234.56; -$12.00; +$3.10 when signed; an em dash when unknown."""
    if not _finite(value):
        return NO_VALUE
    value = float(value)
    sign = "-" if value < 0 and round(value, 2) != 0 else ("+" if signed else "")
    return f"{sign}${abs(value):,.2f}"


def pct(value, digits: int = 1, signed: bool = False) -> str:
    """A percentage already on the 0-100 scale."""
    if not _finite(value):
        return NO_VALUE
    return f"{float(value):{'+' if signed else ''},.{digits}f}%"


def util(value) -> str:
    """A utilization on the 0-1 scale, shown as a percentage."""
    return pct(float(value) * 100.0) if _finite(value) else NO_VALUE


def number(value, digits: int = 1) -> str:
    return f"{float(value):,.{digits}f}" if _finite(value) else NO_VALUE


def _missing(value) -> bool:
    return value is None or (not isinstance(value, str) and bool(pd.isna(value)))


def _text(value) -> str:
    return "" if _missing(value) else str(value)


def _timestamp(value) -> str:
    if _missing(value):
        return ""
    ts = pd.Timestamp(value)
    ts = ts.tz_localize("UTC") if ts.tzinfo is None else ts.tz_convert("UTC")
    return f"{ts:%Y-%m-%d %H:%M} UTC"


# -- document model ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Span:
    text: str
    strong: bool = False


@dataclass(frozen=True)
class Heading:
    level: int
    text: str


@dataclass(frozen=True)
class Para:
    spans: tuple[Span, ...]
    note: bool = False


@dataclass(frozen=True)
class Bullets:
    items: tuple[tuple[Span, ...], ...]


@dataclass(frozen=True)
class Stat:
    label: str
    value: str
    note: str


@dataclass(frozen=True)
class Stats:
    items: tuple[Stat, ...]


@dataclass(frozen=True)
class Table:
    columns: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]
    numeric: tuple[bool, ...]  # right-aligned columns
    total: tuple[str, ...] | None = None  # a bold last row


@dataclass(frozen=True)
class Image:
    name: str
    alt: str


def _p(*parts: str | Span, note: bool = False) -> Para:
    return Para(tuple(p if isinstance(p, Span) else Span(p) for p in parts), note=note)


def _document(
    title: str,
    week_start: date,
    figures: dict[str, float],
    experiments: pd.DataFrame,
    previous: pd.DataFrame | None,
    data: WeeklyReportData,
    charts: dict[str, bytes],
) -> list:
    week_end = week_start + timedelta(days=7)
    blocks: list = [
        Heading(1, title),
        _p(f"{week_start:%a %Y-%m-%d} 00:00 UTC to {week_end:%a %Y-%m-%d} 00:00 UTC.", note=True),
        Heading(2, "Headline"),
        _headline(figures, data.activity_basis),
        *_reconciliation(figures, data.totals),
        Heading(2, "Week over week"),
        *_week_over_week(experiments, previous, figures),
        Heading(2, "Experiments"),
        _p(
            "Every experiment that held GPUs this week, largest spend first; ",
            Span(CLUSTER_IDLE, strong=True),
            " is GPUs that no pod held.",
        ),
        _experiment_table(experiments),
        Heading(2, "Charts"),
        *(Image(name, CHART_TITLES.get(name, name)) for name in charts),
        Heading(2, "The five biggest wastes"),
        *_wastes(data.wastes),
        Heading(2, "Outcome per dollar"),
        *_outcomes(data.outcomes),
        Heading(2, "Alerts"),
        *_alerts(data.alerts),
        Heading(2, "Cost policy"),
        *_policy(data.cost_policy if data.cost_policy is not None else COST_POLICY),
    ]
    return blocks


def _per_dollar(f: dict[str, float], basis: str) -> Stat:
    """Active GPU-hours per $ on the headline basis, the other one beside it."""
    by_util = (
        f"{number(f['active_gpu_hours_per_usd'], 3)} by utilization ({number(f['active_gpu_hours'])} active "
        f"GPU-hours, mean {pct(f['util_pct'])})"
    )
    sm = f["sm_active_gpu_hours_per_usd"]
    by_sm = f"{number(sm, 3)} by SM activity" if _finite(sm) else "SM activity not reported"
    if basis == "sm" and _finite(sm):
        return Stat("Active GPU-hours per $ (SM activity)", number(sm, 3), by_util)
    return Stat("Active GPU-hours per $ (utilization)", number(f["active_gpu_hours_per_usd"], 3), by_sm)


def _headline(f: dict[str, float], basis: str = "util") -> Stats:
    if _finite(f["bill_usd"]):
        bill = Stat(
            "Bill vs estimate",
            money(f["bill_usd"]),
            f"estimate {money(f['estimate_usd'])}, gap {pct(f['estimate_gap_pct'], signed=True)}",
        )
    else:
        bill = Stat("Bill vs estimate", "no bill yet", f"estimate {money(f['estimate_usd'])}")
    wow = (
        Stat(
            "Week over week",
            pct(f["week_over_week_usd_pct"], signed=True),
            f"{money(f['previous_total_usd'])} the week before",
        )
        if _finite(f["previous_total_usd"])
        else Stat("Week over week", NO_VALUE, "no previous week")
    )
    return Stats(
        (
            Stat(
                "Total spend",
                money(f["total_usd"]),
                f"{number(f['gpu_hours'])} GPU-hours, {number(f['experiments'], 0)} experiments",
            ),
            bill,
            Stat(
                "Idle",
                money(f["idle_usd"]),
                f"{pct(f['idle_pct'])} of spend; unheld GPUs {money(f['unallocated_usd'])}",
            ),
            _per_dollar(f, basis),
            Stat("$ per active GPU-hour", money(f["usd_per_active_gpu_hour"]), "lower is better"),
            wow,
        )
    )


def _reconciliation(f: dict[str, float], totals: dict) -> list:
    """Say so when the totals the pipeline computed disagree with the per-experiment table."""
    blocks = []
    if not _finite(f["bill_usd"]):
        blocks.append(
            _p(
                "No bill for this week yet (neither CUR nor Cost Explorer has it): "
                "the dollars below are the price-table estimate where the cost source says so.",
                note=True,
            )
        )
    unknown = _num(totals.get("unknown_activity_usd"))
    if _finite(unknown) and unknown > 0.005:
        blocks.append(
            _p(
                Span("Unknown activity: ", strong=True),
                f"{money(unknown)} of GPU time had no utilization reported (no DCGM_FI_DEV_GPU_UTIL, nor "
                "GR_ENGINE_ACTIVE on MIG slices): it is counted neither as active nor as idle, so the idle "
                "and per-dollar figures leave it out. gpu_samples' check core_columns_reported names the "
                "GPUs and the metric names it looked for.",
                note=True,
            )
        )
    allocated, unallocated = _num(totals.get("allocated_usd")), _num(totals.get("unallocated_usd"))
    if _finite(allocated):
        candidates = [allocated] + ([allocated + unallocated] if _finite(unallocated) else [])
        tolerance = max(0.01, abs(f["total_usd"]) * 1e-3)
        if all(abs(c - f["total_usd"]) > tolerance for c in candidates):
            blocks.append(
                _p(
                    Span("Check: ", strong=True),
                    f"the experiments table sums to {money(f['total_usd'])} but the week's totals say "
                    f"allocated {money(allocated)}, unallocated {money(unallocated)}.",
                )
            )
    return blocks


def _week_over_week(experiments: pd.DataFrame, previous: pd.DataFrame | None, f: dict[str, float]) -> list:
    if previous is None:
        return [_p("No previous week in the lake: no week-over-week deltas.")]
    now = experiments.set_index("experiment")
    before = previous.set_index("experiment")
    names = sorted(set(now.index) | set(before.index))
    rows = []
    for name in names:
        usd = _num(now["allocated_usd"].get(name, math.nan))
        usd_before = _num(before["allocated_usd"].get(name, math.nan))
        delta = (usd if _finite(usd) else 0.0) - (usd_before if _finite(usd_before) else 0.0)
        if name not in before.index:
            change = "new"
        elif name not in now.index:
            change = "gone"
        else:
            change = pct(_ratio(delta, usd_before) * 100.0, signed=True)
        rows.append(
            (
                abs(delta),
                name,
                (
                    name,
                    money(usd),
                    money(usd_before),
                    money(delta, signed=True),
                    change,
                    number(now["active_gpu_hours_per_usd"].get(name, math.nan), 3),
                    number(before["active_gpu_hours_per_usd"].get(name, math.nan), 3),
                ),
            )
        )
    rows.sort(key=lambda r: (-r[0], r[1]))
    total_delta = f["total_usd"] - f["previous_total_usd"]
    previous_per_usd = _ratio(_sum(previous, "active_gpu_hours"), f["previous_total_usd"])
    return [
        _p("Spend by experiment against the week before, biggest change first."),
        Table(
            columns=(
                "Experiment",
                "This week",
                "Week before",
                "Change $",
                "Change %",
                "Active GPU-h per $",
                "Week before per $",
            ),  # fmt: skip
            rows=tuple(r[2] for r in rows),
            numeric=(False, True, True, True, True, True, True),
            total=(
                "Total",
                money(f["total_usd"]),
                money(f["previous_total_usd"]),
                money(total_delta, signed=True),
                pct(f["week_over_week_usd_pct"], signed=True),
                number(f["active_gpu_hours_per_usd"], 3),
                number(previous_per_usd, 3),
            ),
        ),
    ]


def _experiment_table(e: pd.DataFrame) -> Table:
    rows = tuple(
        (
            r.experiment,
            number(r.gpu_hours),
            number(r.active_gpu_hours),
            util(r.mean_util),
            money(r.allocated_usd),
            money(r.idle_usd),
            number(r.active_gpu_hours_per_usd, 3),
            number(getattr(r, "sm_active_gpu_hours_per_usd", math.nan), 3),
            money(r.usd_per_active_gpu_hour),
            number(r.energy_kwh),
            _text(r.cost_source),
        )
        for r in e.itertuples(index=False)
    )
    total_usd, active, gpu_hours = (_sum(e, c) for c in ("allocated_usd", "active_gpu_hours", "gpu_hours"))
    sm_active, sm_known = _sm_basis(e)
    sm_per_usd = _ratio(sm_active, sm_known)
    util_known = total_usd - _sum(e, "unknown_activity_usd")
    return Table(
        columns=(
            "Experiment",
            "GPU-hours",
            "Active GPU-hours",
            "Mean util",
            "Spend",
            "Idle $",
            "Active GPU-h per $",
            "SM-active GPU-h per $",
            "$ per active GPU-h",
            "Energy kWh",
            "Cost source",
        ),  # fmt: skip
        rows=rows,
        numeric=(False, True, True, True, True, True, True, True, True, True, False),
        total=(
            "Total",
            number(gpu_hours),
            number(active),
            util(_ratio(active, gpu_hours)),
            money(total_usd),
            money(_sum(e, "idle_usd")),
            number(_ratio(active, util_known), 3),
            number(sm_per_usd, 3),
            money(_ratio(total_usd, active)),
            number(_sum(e, "energy_kwh")),
            "",
        ),
    )


def _wastes(w: pd.DataFrame) -> list:
    if w.empty:
        return [_p("No GPU was held idle this week.")]
    rows = tuple(
        (
            _text(f"{r.namespace}/{r.pod}" if getattr(r, "namespace", "") else r.pod),
            _text(r.experiment),
            _text(r.node),
            number(r.gpus, 0),
            number(r.held_gpu_hours),
            util(r.mean_util),
            money(r.idle_usd),
        )
        for r in w.head(5).itertuples(index=False)
    )
    return [
        _p("GPUs that pods held but did not use, by pod: the idle dollars they cost."),
        Table(
            columns=("Pod", "Experiment", "Node", "GPUs", "Held GPU-hours", "Mean util", "Idle $"),
            rows=rows,
            numeric=(False, False, False, True, True, True, True),
        ),
    ]


def _outcomes(o: pd.DataFrame) -> list:
    intro = _p(
        "What a point of success rate cost, per MLflow run: ",
        Span("the measure no other tool gives", strong=True),
        ". $ per point = the run's $ this week / the success-rate points it gained (0-100 scale); "
        "lower is better; runs that gained nothing show a dash.",
    )
    if o.empty:
        return [intro, _p("No MLflow run reported a success rate this week.")]
    per_point = pd.to_numeric(o["usd_per_point"], errors="coerce")
    ordered = o.assign(
        _none=~np.isfinite(per_point),
        _pp=per_point.fillna(0.0),
        _usd=pd.to_numeric(o["usd"], errors="coerce").fillna(0.0),
        _name=o["run_name"].astype(str),
    ).sort_values(["_none", "_pp", "_usd", "_name"], ascending=[True, True, False, True])
    rows = tuple(
        (
            _text(r.run_name),
            _text(r.experiment),
            number(r.success_start),
            number(r.success_end),
            number(r.success_gained) if _finite(r.success_gained) else NO_VALUE,
            money(r.usd),
            money(r.usd_per_point),
        )
        for r in ordered.itertuples(index=False)
    )
    return [
        intro,
        Table(
            columns=(
                "Run",
                "Experiment",
                "Success start",
                "Success end",
                "Points gained",
                "Spend",
                "$ per point",
            ),
            rows=rows,
            numeric=(False, False, True, True, True, True, True),
        ),
    ]


def _alerts(a: pd.DataFrame | None) -> list:
    if a is None:
        return [_p("No alerts table yet.")]
    if a.empty:
        return [_p("No alert fired this week.")]
    ordered = a.assign(_at=pd.to_datetime(a["fired_at"], utc=True, errors="coerce")).sort_values(
        ["_at", "rule"], kind="stable"
    )
    rows = tuple(
        (
            _text(r.rule),
            _text(r.severity),
            _timestamp(r.fired_at),
            _timestamp(r.resolved_at) or "still firing",
            _text(r.summary),
        )
        for r in ordered.itertuples(index=False)
    )
    return [
        Table(
            columns=("Rule", "Severity", "Fired", "Resolved", "Summary"),
            rows=rows,
            numeric=(False, False, False, False, False),
        )
    ]


def _policy(text: str) -> list:
    """Plain text: paragraphs separated by blank lines, lines starting with "- " as bullets."""
    blocks: list = []
    for chunk in re.split(r"\n\s*\n", text.strip()):
        lines = [line.strip() for line in chunk.splitlines() if line.strip()]
        para = [line for line in lines if not line.startswith("- ")]
        items = [line[2:].strip() for line in lines if line.startswith("- ")]
        if para:
            blocks.append(_p(" ".join(para)))
        if items:
            blocks.append(Bullets(tuple((Span(item),) for item in items)))
    return blocks


# -- Markdown ----------------------------------------------------------------------------------------------
_MD_SPECIAL = re.compile(r"([\\`*_\[\]|#~!])")


def md_escape(text: str) -> str:
    """User text inside Markdown: one line, HTML entities for <>&, backslashes before Markdown punctuation
    (so a name can neither break a table with "|" nor inject a link, image or HTML)."""
    text = re.sub(r"\s+", " ", str(text))
    return html.escape(_MD_SPECIAL.sub(r"\\\1", text), quote=False)


def _md_spans(spans: Iterable[Span]) -> str:
    return "".join(f"**{md_escape(s.text)}**" if s.strong else md_escape(s.text) for s in spans)


def _md_table(t: Table) -> str:
    rows = [tuple(md_escape(c) for c in row) for row in t.rows]
    if t.total is not None:
        rows.append(tuple(f"**{md_escape(c)}**" if c else "" for c in t.total))
    frame = pd.DataFrame(rows, columns=[md_escape(c) for c in t.columns])
    align = ["right" if n else "left" for n in t.numeric]
    return frame.to_markdown(index=False, disable_numparse=True, colalign=align)


def _data_uri(png: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(png).decode("ascii")


def _to_markdown(blocks: Sequence, charts: dict[str, bytes]) -> str:
    out: list[str] = []
    for b in blocks:
        if isinstance(b, Heading):
            out.append("#" * b.level + " " + md_escape(b.text))
        elif isinstance(b, Para):
            text = _md_spans(b.spans)
            out.append(f"_{text}_" if b.note else text)
        elif isinstance(b, Bullets):
            out.append("\n".join("- " + _md_spans(item) for item in b.items))
        elif isinstance(b, Stats):
            out.append(
                "\n".join(
                    f"- **{md_escape(f.label)}: {md_escape(f.value)}** ({md_escape(f.note)})" for f in b.items
                )
            )
        elif isinstance(b, Table):
            out.append(_md_table(b))
        elif isinstance(b, Image):
            out.append(f"![{md_escape(b.alt)}]({_data_uri(charts[b.name])})")
    return "\n\n".join(out) + "\n"


# -- HTML --------------------------------------------------------------------------------------------------
CSS = """
:root { color-scheme: light; }
* { box-sizing: border-box; }
body { margin: 0; background: #f4f5f7; color: #1d2330;
  font: 15px/1.5 -apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial, "Liberation Sans", sans-serif; }
main { max-width: 1100px; margin: 0 auto; padding: 24px 32px 48px; background: #fff; }
h1 { font-size: 26px; margin: 0 0 4px; }
h2 { font-size: 19px; margin: 32px 0 8px; padding-bottom: 4px; border-bottom: 1px solid #dde1e7; }
p { margin: 8px 0; overflow-wrap: anywhere; }
p.note { color: #5b6473; font-size: 14px; }
ul { padding-left: 22px; }
li { margin: 4px 0; overflow-wrap: anywhere; }
.figures { display: grid; grid-template-columns: repeat(auto-fit, minmax(220px, 1fr)); gap: 12px; margin: 12px 0; }
.figure { border: 1px solid #dde1e7; border-radius: 6px; padding: 10px 14px; min-width: 0; }
.figure .label { font-size: 13px; color: #5b6473; }
.figure .value { font-size: 22px; font-weight: 600; font-variant-numeric: tabular-nums; }
.figure .note { font-size: 13px; color: #5b6473; overflow-wrap: anywhere; }
.table-wrap { max-width: 100%; overflow-x: auto; margin: 8px 0 16px; }
table { width: 100%; border-collapse: collapse; font-size: 13px; }
th, td { padding: 5px 8px; border-bottom: 1px solid #e6e9ee; vertical-align: top; text-align: left;
  overflow-wrap: anywhere; }
th { background: #f0f2f5; font-weight: 600; overflow-wrap: normal; }
th:first-child, td:first-child { min-width: 10em; }
td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; overflow-wrap: normal; }
td.num { white-space: nowrap; }
tfoot td { font-weight: 600; border-top: 2px solid #c9ced6; border-bottom: none; }
figure.chart { margin: 12px 0 20px; }
figure.chart img { display: block; max-width: 100%; height: auto; }
figure.chart figcaption { font-size: 13px; color: #5b6473; }
@media print {
  body { background: #fff; font-size: 11pt; }
  main { max-width: none; padding: 0; }
  h2 { break-after: avoid; }
  table, figure.chart, .figure { break-inside: avoid; }
  .table-wrap { overflow: visible; }
  td.num { white-space: normal; }
}
"""

# No network, no script, no plugins: the page is data. Images come only from data: URIs.
CSP = "default-src 'none'; img-src data:; style-src 'unsafe-inline'; base-uri 'none'; form-action 'none'"


def _h(text: str) -> str:
    return html.escape(str(text), quote=True)


def _html_spans(spans: Iterable[Span]) -> str:
    return "".join(f"<strong>{_h(s.text)}</strong>" if s.strong else _h(s.text) for s in spans)


def _html_table(t: Table) -> str:
    def cells(row: Sequence[str], tag: str) -> str:
        return "".join(
            f'<{tag} class="num">{_h(c)}</{tag}>' if num else f"<{tag}>{_h(c)}</{tag}>"
            for c, num in zip(row, t.numeric)
        )

    head = f"<thead><tr>{cells(t.columns, 'th')}</tr></thead>"
    body = "".join(f"<tr>{cells(row, 'td')}</tr>" for row in t.rows)
    foot = f"<tfoot><tr>{cells(t.total, 'td')}</tr></tfoot>" if t.total is not None else ""
    return f'<div class="table-wrap"><table>{head}<tbody>{body}</tbody>{foot}</table></div>'


def _to_html(title: str, blocks: Sequence, charts: dict[str, bytes]) -> str:
    parts: list[str] = []
    for b in blocks:
        if isinstance(b, Heading):
            parts.append(f"<h{b.level}>{_h(b.text)}</h{b.level}>")
        elif isinstance(b, Para):
            cls = ' class="note"' if b.note else ""
            parts.append(f"<p{cls}>{_html_spans(b.spans)}</p>")
        elif isinstance(b, Bullets):
            parts.append("<ul>" + "".join(f"<li>{_html_spans(i)}</li>" for i in b.items) + "</ul>")
        elif isinstance(b, Stats):
            parts.append(
                '<div class="figures">'
                + "".join(
                    f'<div class="figure"><div class="label">{_h(f.label)}</div>'
                    f'<div class="value">{_h(f.value)}</div><div class="note">{_h(f.note)}</div></div>'
                    for f in b.items
                )
                + "</div>"
            )
        elif isinstance(b, Table):
            parts.append(_html_table(b))
        elif isinstance(b, Image):
            parts.append(
                f'<figure class="chart"><img src="{_data_uri(charts[b.name])}" alt="{_h(b.alt)}" '
                f'width="900" height="400"><figcaption>{_h(b.alt)}</figcaption></figure>'
            )
    body = "\n".join(parts)
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        f'<meta http-equiv="Content-Security-Policy" content="{CSP}">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        f"<title>{_h(title)}</title>\n<style>{CSS}</style>\n</head>\n"
        f"<body>\n<main>\n{body}\n</main>\n</body>\n</html>\n"
    )


__all__ = [
    "COST_POLICY",
    "Report",
    "ReportDataError",
    "WeeklyReportData",
    "md_escape",
    "money",
    "pct",
    "render_weekly_report",
]
