"""The weekly GPU cost report: the week's data read from the lake, rendered as Markdown, a self-contained
HTML page and PNG charts."""

from foxhunt_obs.lib.report.render import render_weekly_report

__all__ = ["render_weekly_report"]
