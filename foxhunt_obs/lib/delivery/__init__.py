"""Delivery: what leaves the pipeline for people — the weekly cost report (Markdown, HTML, charts)."""

from foxhunt_obs.lib.delivery.weekly_report import (
    COST_POLICY,
    Report,
    ReportDataError,
    WeeklyReportData,
    render_weekly_report,
)

__all__ = ["COST_POLICY", "Report", "ReportDataError", "WeeklyReportData", "render_weekly_report"]
