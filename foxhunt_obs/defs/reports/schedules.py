"""The reports job and the weekly schedule (STOPPED by default: turn it on in the UI)."""

import dagster as dg

from foxhunt_obs.defs.partitions import WEEKLY, range_request, trailing_days
from foxhunt_obs.defs.resources import CostsResource

daily_reports_job = dg.define_asset_job(
    "daily_reports_job",
    selection=dg.AssetSelection.assets("cost_allocation", "utilization_per_dollar", "outcome_per_dollar"),
    description="Cost allocation per GPU-hour, utilization per dollar and outcome per dollar for a range of days.",
)

weekly_report_job = dg.define_asset_job(
    "weekly_report_job",
    selection=dg.AssetSelection.assets("weekly_cost_report"),
    description="The weekly cost report (Markdown + HTML + charts) for one week.",
)


@dg.schedule(cron_schedule="30 7 * * *", job=daily_reports_job, execution_timezone="UTC")
def daily_reports_schedule(context: dg.ScheduleEvaluationContext, costs: CostsResource):
    """07:30 UTC, after the costs: the same trailing days, whose bill may have been restated."""
    today = context.scheduled_execution_time.date()
    return range_request(*trailing_days(today, costs.restate_days()), "trailing")


@dg.schedule(cron_schedule="0 8 * * 1", job=weekly_report_job, execution_timezone="UTC")
def weekly_report_schedule(context: dg.ScheduleEvaluationContext):
    """Monday 08:00 UTC: the week that ended at midnight (its costs ran at 07:00)."""
    week = WEEKLY.get_last_partition_key(current_time=context.scheduled_execution_time)
    return dg.RunRequest(partition_key=week, run_key=f"week-{week}")
