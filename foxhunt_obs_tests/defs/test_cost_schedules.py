"""The costs schedule re-pulls the trailing days (Cost Explorer restates) and, in the first half of a
month, the previous month (its CUR can change for about two weeks)."""

from datetime import datetime, timezone

import dagster as dg
import pytest

from foxhunt_obs.defs.costs.schedules import costs_daily_schedule
from foxhunt_obs.defs.partitions import FIRST
from foxhunt_obs.defs.reports.schedules import daily_reports_schedule
from foxhunt_obs.defs.resources import CostsResource


def _requests(when: datetime, restate_days: str = "3", schedule=costs_daily_schedule) -> list:
    """The schedule's run requests at `when`, its costs resource given explicitly (FOXHUNT_CE_RESTATE_DAYS)."""
    resources = {"costs": CostsResource(ce_restate_days=restate_days)}
    with dg.build_schedule_context(scheduled_execution_time=when, resources=resources) as context:
        return schedule(context)


def _ranges(when: datetime, restate_days: str = "3", schedule=costs_daily_schedule) -> list:
    requests = _requests(when, restate_days, schedule)
    return [
        (
            r.tags["why"],
            r.tags["dagster/asset_partition_range_start"],
            r.tags["dagster/asset_partition_range_end"],
        )
        for r in requests
    ]


def test_late_in_the_month_only_the_trailing_window():
    when = datetime(2026, 11, 29, 7, tzinfo=timezone.utc)
    assert _ranges(when) == [("trailing", "2026-11-26", "2026-11-28")]
    assert _ranges(when, "1") == [("trailing", "2026-11-28", "2026-11-28")]


@pytest.mark.parametrize("day", [1, 2, 15])
def test_early_in_the_month_the_previous_month_again(day):
    when = datetime(2026, 12, day, 7, tzinfo=timezone.utc)
    ranges = _ranges(when)
    assert ranges[1] == ("previous-month", "2026-11-01", "2026-11-30")
    assert (
        ranges[0][0] == "trailing"
        and ranges[0][2] == f"2026-{11 if day == 1 else 12}-{30 if day == 1 else day - 1:02d}"
    )
    assert len(_ranges(datetime(2026, 12, 16, 7, tzinfo=timezone.utc))) == 1


def test_nothing_before_the_first_partition():
    assert FIRST.date().isoformat() == "2026-11-01"  # FOXHUNT_PARTITIONS_START's default, read at load
    requests = _requests(datetime(2026, 11, 2, 7, tzinfo=timezone.utc))
    assert [
        (r.tags["dagster/asset_partition_range_start"], r.tags["dagster/asset_partition_range_end"])
        for r in requests
    ] == [("2026-11-01", "2026-11-01")]


def test_the_daily_reports_follow_the_same_trailing_days():
    when = datetime(2026, 11, 29, 7, 30, tzinfo=timezone.utc)
    assert _ranges(when, "2", daily_reports_schedule) == [("trailing", "2026-11-27", "2026-11-28")]
