"""The costs job and its daily schedule (STOPPED by default: turn it on in the UI)."""

from datetime import timedelta

import dagster as dg

from foxhunt_obs.defs.partitions import range_request, trailing_days
from foxhunt_obs.defs.resources import CostsResource

costs_job = dg.define_asset_job(
    "costs_job",
    selection=dg.AssetSelection.assets("costs_hourly", "costs_daily", "budgets"),
    description="CUR line items, Cost Explorer, the price-table estimate and budgets for a range of days.",
)

# The bill keeps moving after a day ends: Cost Explorer restates the last days, and a closed month's
# CUR can change for about two weeks. Re-reading replaces partitions; it never adds rows twice.
PREVIOUS_MONTH_UNTIL_DAY = 15


@dg.schedule(cron_schedule="0 7 * * *", job=costs_job, execution_timezone="UTC")
def costs_daily_schedule(context: dg.ScheduleEvaluationContext, costs: CostsResource):
    """At 07:00 UTC: the trailing FOXHUNT_CE_RESTATE_DAYS days up to yesterday, and in the first half of
    a month the whole previous month once more."""
    today = context.scheduled_execution_time.date()
    requests = range_request(*trailing_days(today, costs.restate_days()), "trailing")
    if today.day <= PREVIOUS_MONTH_UNTIL_DAY:
        last_of_previous = today.replace(day=1) - timedelta(days=1)
        requests += range_request(last_of_previous.replace(day=1), last_of_previous, "previous-month")
    return requests


spend_now_job = dg.define_asset_job(
    "spend_now_job",
    selection=dg.AssetSelection.assets("spend_now"),
    description="Live spend: $/h now, today, the month and its run rate; untracked EC2 instances.",
)


@dg.schedule(cron_schedule="*/15 * * * *", job=spend_now_job, execution_timezone="UTC")
def spend_now_schedule(context: dg.ScheduleEvaluationContext):
    """Every 15 minutes: the live figures budget_burn's run rate and the cost dashboard read (a refresh
    older than 2 h is not used)."""
    return dg.RunRequest(run_key=None)
