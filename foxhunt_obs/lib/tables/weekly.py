"""The weekly cost report as a table function: the week's data from the lake, rendered (Markdown, HTML,
PNG charts), written under reports/week=…/ and delivered to the configured sinks. A failed sink fails the
`delivered` check, never the report, which is in the lake by then."""

from __future__ import annotations

from collections.abc import Callable
from datetime import date, timedelta
from typing import TYPE_CHECKING

from foxhunt_obs.lib.lake import Lake
from foxhunt_obs.lib.schemas import COST_ALLOCATION, COSTS_DAILY, OUTCOME_PER_DOLLAR, UTILIZATION_PER_DOLLAR
from foxhunt_obs.lib.tables import Built, Check, LakePath, Markdown, MissingInput

if TYPE_CHECKING:
    from foxhunt_obs.lib.delivery.send import ReportDelivery
    from foxhunt_obs.lib.report.model import ReportLinks


def weekly_cost_report(
    lake: Lake,
    week_start: date,
    activity_basis: str,
    delivery: ReportDelivery,
    slack_client: Callable | None = None,
    links: ReportLinks | None = None,
) -> Built:
    """The report on activity_basis (util or sm), sent where `delivery` says (Slack through slack_client);
    links: its run's trace and its pods' logs (none when None or the templates are unset)."""
    # imported here: matplotlib costs ~1 s, which every code-location load would pay otherwise
    from foxhunt_obs.lib.delivery.send import DeliveryError, deliver
    from foxhunt_obs.lib.report import render_weekly_report
    from foxhunt_obs.lib.report.data import weekly_report_data

    con = lake.connect([UTILIZATION_PER_DOLLAR, COST_ALLOCATION, OUTCOME_PER_DOLLAR, COSTS_DAILY])
    try:
        data = weekly_report_data(con, week_start, activity_basis)
    finally:
        con.close()
    if links is not None:
        data.links = links
    if data.daily.empty:
        raise MissingInput(
            f"weekly_cost_report week={week_start}: no utilization_per_dollar rows for "
            f"{week_start}..{week_start + timedelta(days=6)} in {lake.root}: materialize the week's "
            "cost_allocation and utilization_per_dollar first"
        )
    report = render_weekly_report(data)
    files = {"report.md": report.markdown.encode(), "report.html": report.html.encode()}
    files.update(report.charts)  # the PNGs beside the report (the HTML embeds its own copies)
    paths = lake.write_files(f"reports/week={week_start.isoformat()}", files)
    summary: dict[str, object] = {
        "report": Markdown(report.markdown),
        "html": LakePath(next(p for p in paths if p.endswith("report.html"))),
        "files": "\n".join(paths),
    }
    summary.update({k: round(float(v), 4) for k, v in report.figures.items() if v == v})
    error = None
    try:
        sent, failures = deliver(report, week_start, delivery=delivery, slack_client=slack_client), {}
    except DeliveryError as e:
        sent, failures, error = e.delivered, e.failures, str(e)
    summary["delivered_to"] = ", ".join(sent) or "no sink configured"
    check = Check("delivered", not failures, {"sent": ", ".join(sent) or "none",
                                               "failures": "\n".join(failures.values()) or "none"})  # fmt: skip
    return Built({}, summary, [check], extra={"delivery_error": error, "report": report})
