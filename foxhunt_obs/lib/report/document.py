"""What the weekly report says, in order: the headline figures, notes where the numbers need one, week over
week, the experiments, the charts, the biggest wastes, outcome per dollar, the alerts and the cost policy.
Each section is blocks of the document model with its cells already formatted; how they look is up to
markdown.py and html.py."""

from __future__ import annotations

import math
import re
from datetime import date, timedelta

import numpy as np
import pandas as pd

from foxhunt_obs.lib.names import CLUSTER_IDLE
from foxhunt_obs.lib.report.figures import column_sum, ratio, sm_basis, to_float
from foxhunt_obs.lib.report.formatting import (
    NO_VALUE,
    finite,
    money,
    number,
    pct,
    plain_text,
    utc_timestamp,
    util,
)
from foxhunt_obs.lib.report.model import (
    COST_POLICY,
    Bullets,
    Heading,
    Image,
    Link,
    Para,
    ReportLinks,
    Span,
    Stat,
    Stats,
    Table,
    WeeklyReportData,
)

CHART_TITLES = {
    "daily_spend.png": "Daily spend by experiment",
    "utilization_per_dollar.png": "Utilization per dollar by experiment",
    "idle_by_day.png": "Idle dollars by day",
}


def _p(*parts: str | Span, note: bool = False) -> Para:
    return Para(tuple(p if isinstance(p, Span) else Span(p) for p in parts), note=note)


def document(
    title: str,
    week_start: date,
    figures: dict[str, float],
    experiments: pd.DataFrame,
    previous: pd.DataFrame | None,
    data: WeeklyReportData,
    charts: dict[str, bytes],
) -> list:
    """The report's blocks, the title first and the cost policy last."""
    week_end = week_start + timedelta(days=7)
    blocks: list = [
        Heading(1, title),
        _p(f"{week_start:%a %Y-%m-%d} 00:00 UTC to {week_end:%a %Y-%m-%d} 00:00 UTC.", note=True),
        *_run_trace(data.links),
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
        *_wastes(data.wastes, data.links, week_start),
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
    by_sm = f"{number(sm, 3)} by SM activity" if finite(sm) else "SM activity not reported"
    if basis == "sm" and finite(sm):
        return Stat("Active GPU-hours per $ (SM activity)", number(sm, 3), by_util)
    return Stat("Active GPU-hours per $ (utilization)", number(f["active_gpu_hours_per_usd"], 3), by_sm)


def _headline(f: dict[str, float], basis: str = "util") -> Stats:
    if finite(f["bill_usd"]):
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
        if finite(f["previous_total_usd"])
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
    if not finite(f["bill_usd"]):
        blocks.append(
            _p(
                "No bill for this week yet (neither CUR nor Cost Explorer has it): "
                "the dollars below are the price-table estimate where the cost source says so.",
                note=True,
            )
        )
    unknown = to_float(totals.get("unknown_activity_usd"))
    if finite(unknown) and unknown > 0.005:
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
    allocated, unallocated = to_float(totals.get("allocated_usd")), to_float(totals.get("unallocated_usd"))
    if finite(allocated):
        candidates = [allocated] + ([allocated + unallocated] if finite(unallocated) else [])
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
        usd = to_float(now["allocated_usd"].get(name, math.nan))
        usd_before = to_float(before["allocated_usd"].get(name, math.nan))
        delta = (usd if finite(usd) else 0.0) - (usd_before if finite(usd_before) else 0.0)
        if name not in before.index:
            change = "new"
        elif name not in now.index:
            change = "gone"
        else:
            change = pct(ratio(delta, usd_before) * 100.0, signed=True)
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
    previous_per_usd = ratio(column_sum(previous, "active_gpu_hours"), f["previous_total_usd"])
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
            plain_text(r.cost_source),
        )
        for r in e.itertuples(index=False)
    )
    total_usd, active, gpu_hours = (
        column_sum(e, c) for c in ("allocated_usd", "active_gpu_hours", "gpu_hours")
    )
    sm_active, sm_known = sm_basis(e)
    sm_per_usd = ratio(sm_active, sm_known)
    util_known = total_usd - column_sum(e, "unknown_activity_usd")
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
            util(ratio(active, gpu_hours)),
            money(total_usd),
            money(column_sum(e, "idle_usd")),
            number(ratio(active, util_known), 3),
            number(sm_per_usd, 3),
            money(ratio(total_usd, active)),
            number(column_sum(e, "energy_kwh")),
            "",
        ),
    )


def _run_trace(links: ReportLinks) -> list:
    url = links.run_trace()
    if not url:
        return []
    return [_p("Built by Dagster run ", links.run_id, ": ", Span("its trace", href=url), ".", note=True)]


def _text_or_empty(value) -> str:
    """A name from a frame: "" for a missing one (None, NaN), never the text "nan"."""
    return value if isinstance(value, str) else ""


def _wastes(w: pd.DataFrame, links: ReportLinks | None = None, week_start: date | None = None) -> list:
    """The five biggest wastes; with a logs template, a column linking each pod to its logs of the week."""
    if w.empty:
        return [_p("No GPU was held idle this week.")]
    top = w.head(5)
    logs = [
        links.week_logs(_text_or_empty(getattr(r, "namespace", "")), _text_or_empty(r.pod), week_start)
        if links and week_start
        else ""
        for r in top.itertuples(index=False)
    ]
    rows = tuple(
        (
            plain_text(f"{r.namespace}/{r.pod}" if getattr(r, "namespace", "") else r.pod),
            plain_text(r.experiment),
            plain_text(r.node),
            number(r.gpus, 0),
            number(r.held_gpu_hours),
            util(r.mean_util),
            money(r.idle_usd),
            *((Link("week's logs", url) if url else "",) if any(logs) else ()),
        )
        for r, url in zip(top.itertuples(index=False), logs)
    )
    columns = ("Pod", "Experiment", "Node", "GPUs", "Held GPU-hours", "Mean util", "Idle $")
    numeric = (False, False, False, True, True, True, True)
    return [
        _p("GPUs that pods held but did not use, by pod: the idle dollars they cost."),
        Table(
            columns=columns + (("Logs",) if any(logs) else ()),
            rows=rows,
            numeric=numeric + ((False,) if any(logs) else ()),
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
            plain_text(r.run_name),
            plain_text(r.experiment),
            number(r.success_start),
            number(r.success_end),
            number(r.success_gained) if finite(r.success_gained) else NO_VALUE,
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
            plain_text(r.rule),
            plain_text(r.severity),
            utc_timestamp(r.fired_at),
            utc_timestamp(r.resolved_at) or "still firing",
            plain_text(r.summary),
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
