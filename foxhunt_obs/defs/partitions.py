"""Time partitions shared by the assets (UTC; the first partition is FOXHUNT_PARTITIONS_START).

Partition definitions are built when Dagster loads the code location, before any resource exists, so
FOXHUNT_PARTITIONS_START is the one setting read here rather than through a resource."""

from datetime import datetime, timedelta

import dagster as dg

from foxhunt_obs.lib.settings import env, partitions_start

FIRST = partitions_start(env("FOXHUNT_PARTITIONS_START"))
_START = FIRST.strftime("%Y-%m-%d-%H:%M")
HOURLY = dg.HourlyPartitionsDefinition(start_date=_START, timezone="UTC")
DAILY = dg.DailyPartitionsDefinition(start_date=_START[:10], timezone="UTC")
# Weeks start Monday 00:00 UTC (day_offset=1); the first is the first Monday on or after the start.
WEEKLY = dg.WeeklyPartitionsDefinition(start_date=_START[:10], day_offset=1, timezone="UTC")


def hours_of(window: dg.TimeWindow) -> list[datetime]:
    """The UTC hour starts inside a (possibly multi-partition) run's time window."""
    t, out = window.start, []
    while t < window.end:
        out.append(t)
        t += timedelta(hours=1)
    return out


def days_of(window: dg.TimeWindow) -> list[datetime]:
    t, out = window.start, []
    while t < window.end:
        out.append(t)
        t += timedelta(days=1)
    return out


def range_request(first, last, why: str) -> list[dg.RunRequest]:
    """One run over the days first..last (clipped to the first partition; none when empty)."""
    first = max(first, FIRST.date())
    if first > last:
        return []
    a, b = first.strftime("%Y-%m-%d"), last.strftime("%Y-%m-%d")
    tags = {"dagster/asset_partition_range_start": a, "dagster/asset_partition_range_end": b, "why": why}
    return [dg.RunRequest(run_key=f"{why}-{a}-{b}", tags=tags)]


def trailing_days(today, days: int) -> tuple:
    """The `days` days up to yesterday (FOXHUNT_CE_RESTATE_DAYS): what Cost Explorer may still restate."""
    yesterday = today - timedelta(days=1)
    return yesterday - timedelta(days=days - 1), yesterday
