"""Time partitions shared by the assets (UTC; the first partition is FOXHUNT_PARTITIONS_START)."""

from datetime import datetime, timedelta

import dagster as dg

from foxhunt_obs.lib.settings import partitions_start

_START = partitions_start().strftime("%Y-%m-%d-%H:%M")
HOURLY = dg.HourlyPartitionsDefinition(start_date=_START, timezone="UTC")
DAILY = dg.DailyPartitionsDefinition(start_date=_START[:10], timezone="UTC")


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
