"""The costs job and its daily schedule (STOPPED by default: turn it on in the UI)."""

from datetime import timedelta

import dagster as dg

from foxhunt_obs.lib.settings import env, partitions_start

costs_job = dg.define_asset_job(
    "costs_job",
    selection=dg.AssetSelection.assets("costs_hourly", "costs_daily", "budgets"),
    description="CUR line items, Cost Explorer, the price-table estimate and budgets for a range of days.",
)

# The bill keeps moving after a day ends: Cost Explorer restates the last days, and a closed month's
# CUR can change for about two weeks. Re-reading replaces partitions; it never adds rows twice.
PREVIOUS_MONTH_UNTIL_DAY = 15


def _range(first, last, why: str) -> list[dg.RunRequest]:
    first = max(first, partitions_start().date())
    if first > last:
        return []
    a, b = first.strftime("%Y-%m-%d"), last.strftime("%Y-%m-%d")
    tags = {"dagster/asset_partition_range_start": a, "dagster/asset_partition_range_end": b, "why": why}
    return [dg.RunRequest(run_key=f"{why}-{a}-{b}", tags=tags)]


@dg.schedule(cron_schedule="0 7 * * *", job=costs_job, execution_timezone="UTC")
def costs_daily_schedule(context: dg.ScheduleEvaluationContext):
    """At 07:00 UTC: the trailing FOXHUNT_CE_RESTATE_DAYS days up to yesterday, and in the first half of
    a month the whole previous month once more."""
    today = context.scheduled_execution_time.date()
    yesterday = today - timedelta(days=1)
    days = max(1, int(env("FOXHUNT_CE_RESTATE_DAYS")))
    requests = _range(yesterday - timedelta(days=days - 1), yesterday, "trailing")
    if today.day <= PREVIOUS_MONTH_UNTIL_DAY:
        last_of_previous = today.replace(day=1) - timedelta(days=1)
        requests += _range(last_of_previous.replace(day=1), last_of_previous, "previous-month")
    return requests
