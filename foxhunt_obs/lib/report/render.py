"""The week rendered: its frames checked, its figures, charts and document built once, then written as
Markdown and as HTML from the same blocks.

Rendering is deterministic: no clock, no randomness, stable sort orders; the same data gives the same bytes.
"""

from __future__ import annotations

from foxhunt_obs.lib.report.charts import render_charts
from foxhunt_obs.lib.report.document import document
from foxhunt_obs.lib.report.figures import experiment_frame, experiment_names, headline_figures
from foxhunt_obs.lib.report.html import to_html
from foxhunt_obs.lib.report.markdown import to_markdown
from foxhunt_obs.lib.report.model import Report, WeeklyReportData, check_input


def render_weekly_report(data: WeeklyReportData) -> Report:
    """Render the week: Markdown with data-URI charts, a self-contained HTML page, the PNGs and the headline
    figures (NaN where unknown: no bill, no previous week)."""
    week_start = check_input(data)
    experiments = experiment_frame(data.experiments, "experiments")
    previous = None
    if data.previous is not None and not data.previous.empty:
        previous = experiment_frame(data.previous, "previous")
    daily = data.daily.assign(experiment=experiment_names(data.daily["experiment"]))

    figures = headline_figures(experiments, previous, data.totals, data.wastes, data.outcomes)
    charts = render_charts(daily, experiments, week_start)
    title = f"Weekly GPU cost report — week of {week_start.isoformat()}"
    blocks = document(title, week_start, figures, experiments, previous, data, charts)
    return Report(
        markdown=to_markdown(blocks, charts),
        html=to_html(title, blocks, charts),
        charts=charts,
        figures=figures,
    )
