"""The weekly report's document model: what goes in (WeeklyReportData, with the columns each frame must
have), what comes out (Report), and the blocks in between. The report is built once as a list of blocks
(headings, paragraphs, headline figures, tables, images) whose cells are already formatted strings, then
written as Markdown and as HTML, so the two renderings never disagree: a renderer only escapes and lays out.
"""

from __future__ import annotations

import base64
import re
from dataclasses import dataclass, field
from datetime import date, datetime, time, timedelta, timezone

import pandas as pd

from foxhunt_obs.lib.names import CLUSTER_IDLE, SHARED_COST_POLICY, UNATTRIBUTED
from foxhunt_obs.lib.settings import default
from foxhunt_obs.lib.tracing import LinkTemplates

COST_POLICY = f"""\
How the dollars in this report are computed (the cost model):

- A GPU's cost for an hour is its node's cost for that hour divided by the GPUs on the node. The node cost comes from the AWS Cost and Usage Report (CUR) once it has landed, else from the dated price table (an estimate); the cost source column says which.
- That cost is split over every pod that held the GPU in the hour, by the time each held it (a hand-off at 14:20 charges the first pod 20 minutes and the second 40), and charged to the pod, then the pod's experiment label, then its namespace, then "{UNATTRIBUTED}". GPU time no pod held is unallocated and shown as "{CLUSTER_IDLE}".
- A time-sliced GPU (several pods on it at once: the device plugin's time-slicing, each pod's copy of the GPU's series) is split evenly over the replicas held at each scrape (a pod holding two replicas pays two shares); its activity is the GPU's, split the same way (per-process utilization does not move dollars).
- A MIG slice is a GPU of its own for this: it costs its share of its GPU (its compute slices over the GPU's, 3g.40gb = 3/7), and the part of a MIG GPU no slice covers is unallocated.
- Active GPU-hours = sum of utilization x time (on a MIG slice, GR_ENGINE_ACTIVE x time x its share). Idle $ = allocated $ x (1 - active fraction); all of "{CLUSTER_IDLE}" is idle. GPU time for which no utilization was reported is unknown activity: counted neither as active nor as idle.
- Utilization per dollar = active GPU-hours / $ (higher is better); its inverse is $ per active GPU-hour. It is given on two bases: utilization (DCGM_FI_DEV_GPU_UTIL, the share of time some kernel ran: every dashboard's figure) and SM activity (DCGM_FI_PROF_SM_ACTIVE, the share of cycles an SM had work: closer to what the GPU did), each over the dollars whose activity on that basis was reported.
- An MLflow run costs what its pods (its `pod` tag, a comma-separated list, in its `namespace`) were allocated between its start and its end: a pod name reused by a later run (a StatefulSet's trainer-0) or the same name in another namespace is not charged to it. In an hour two runs share, each gets the seconds its own window covers, at most what the pod held and together never more than the hour; a run MLflow still calls RUNNING ends where the next run on its pods starts.
- Bill lines on no node go to their Experiment tag (an experiment's S3 bucket); the rest (FSx, the EKS control plane) are {SHARED_COST_POLICY}. Once the bill has landed every dollar comes from it, so the day's allocations sum to the bill.
- The estimate and the bill are both kept, and the gap between them is shown. Weeks run from Monday 00:00 UTC to the next Monday 00:00 UTC.
"""

# -- input -------------------------------------------------------------------------------------------------
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


@dataclass(frozen=True)
class ReportLinks:
    """Where the report links beyond itself: the trace of the Dagster run that built it, and each pod it
    names to that pod's logs over the week (FOXHUNT_TRACE_URL_TEMPLATE and FOXHUNT_LOGS_URL_TEMPLATE, filled
    by lib/tracing.LinkTemplates). No template, no run id or a URL that is not http(s): no link."""

    templates: LinkTemplates = field(default_factory=LinkTemplates)
    run_id: str = ""
    run_started: datetime | None = None  # the trace link opens here and ends "now" (the report is rendered
    # while its run still goes on)

    def run_trace(self) -> str:
        if not (self.run_id and self.run_started):
            return ""
        return _web(self.templates.run_trace(self.run_id, self.run_started, None).get("trace", ""))

    def week_logs(self, namespace: str, pod: str, week_start: date) -> str:
        start = datetime.combine(week_start, time(), tzinfo=timezone.utc)
        urls = self.templates.logs_between(namespace, pod, start, start + timedelta(days=7))
        return _web(urls.get("logs", ""))


def _web(url: str) -> str:
    return url if re.match(r"https?://", url) else ""


class ReportDataError(ValueError):
    """The report's input frames do not fit the contract; the message names the frame and the columns. The
    frames come from our own lake queries (lib/tables/weekly.py), so this is a bug, not an input's fault: no
    InputError, it keeps its traceback (lib/errors.py)."""


@dataclass
class WeeklyReportData:
    """One week's input. Frames need at least the ``*_COLUMNS`` above (extra columns are ignored):
    daily (experiment x day), experiments (one row each, "(cluster idle)" included), previous (the same
    for the week before; None or empty: no deltas), wastes (the five biggest, already sorted), outcomes
    (per MLflow run; success points on the 0-100 scale), alerts (None: no alerts table yet).
    totals: bill_usd (NaN: no bill yet), estimate_usd, allocated_usd, idle_usd, unallocated_usd, gap_pct
    ((estimate - bill) / bill x 100; computed from the two when NaN but both are known)."""

    week_start: date
    daily: pd.DataFrame
    experiments: pd.DataFrame
    previous: pd.DataFrame | None
    wastes: pd.DataFrame
    outcomes: pd.DataFrame
    totals: dict[str, float]
    alerts: pd.DataFrame | None
    cost_policy: str | None = None
    activity_basis: str = default("FOXHUNT_ACTIVITY_BASIS")  # the headline's basis: util or sm
    links: ReportLinks = field(default_factory=ReportLinks)  # none by default


@dataclass
class Report:
    """markdown: for dg.MetadataValue.md (charts as data: URIs); html: the self-contained page; charts:
    name.png -> PNG bytes; figures: headline numbers for numeric metadata, NaN where unknown."""

    markdown: str
    html: str
    charts: dict[str, bytes] = field(default_factory=dict)
    figures: dict[str, float] = field(default_factory=dict)


def check_input(data: WeeklyReportData) -> date:
    """The week's Monday, once every frame is a DataFrame with its columns; ReportDataError otherwise."""
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


# -- blocks ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Span:
    text: str
    strong: bool = False
    href: str = ""  # an http(s) URL: the text links there


@dataclass(frozen=True)
class Link:
    """A table cell that links to an http(s) URL (a pod's logs)."""

    text: str
    href: str


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
    rows: tuple[tuple[str | Link, ...], ...]
    numeric: tuple[bool, ...]  # right-aligned columns
    total: tuple[str, ...] | None = None  # a bold last row


@dataclass(frozen=True)
class Image:
    name: str  # a key of the charts, which both renderings embed as data_uri(png)
    alt: str


def data_uri(png: bytes) -> str:
    """A chart as both renderings embed it: the page and the Markdown need nothing from the network."""
    return "data:image/png;base64," + base64.b64encode(png).decode("ascii")
