"""The costs schedule re-pulls the trailing days (Cost Explorer restates) and, in the first half of a
month, the previous month (its CUR can change for about two weeks)."""

from datetime import datetime, timezone

import dagster as dg
import pytest

from foxhunt_obs.defs.costs.schedules import costs_daily_schedule


def _ranges(when: datetime, monkeypatch, restate_days: str = "3") -> list[tuple[str, str, str]]:
    monkeypatch.setenv("FOXHUNT_CE_RESTATE_DAYS", restate_days)
    monkeypatch.setenv("FOXHUNT_PARTITIONS_START", "2026-01-01")
    with dg.instance_for_test() as instance:
        context = dg.build_schedule_context(instance=instance, scheduled_execution_time=when)
        requests = costs_daily_schedule(context)
    return [
        (
            r.tags["why"],
            r.tags["dagster/asset_partition_range_start"],
            r.tags["dagster/asset_partition_range_end"],
        )
        for r in requests
    ]


def test_late_in_the_month_only_the_trailing_window(monkeypatch):
    when = datetime(2026, 11, 29, 7, tzinfo=timezone.utc)
    assert _ranges(when, monkeypatch) == [("trailing", "2026-11-26", "2026-11-28")]
    assert _ranges(when, monkeypatch, "1") == [("trailing", "2026-11-28", "2026-11-28")]


@pytest.mark.parametrize("day", [1, 2, 15])
def test_early_in_the_month_the_previous_month_again(monkeypatch, day):
    when = datetime(2026, 12, day, 7, tzinfo=timezone.utc)
    ranges = _ranges(when, monkeypatch)
    assert ranges[1] == ("previous-month", "2026-11-01", "2026-11-30")
    assert (
        ranges[0][0] == "trailing"
        and ranges[0][2] == f"2026-{11 if day == 1 else 12}-{30 if day == 1 else day - 1:02d}"
    )
    assert len(_ranges(datetime(2026, 12, 16, 7, tzinfo=timezone.utc), monkeypatch)) == 1


def test_nothing_before_the_first_partition(monkeypatch):
    monkeypatch.setenv("FOXHUNT_PARTITIONS_START", "2026-11-01")
    monkeypatch.setenv("FOXHUNT_CE_RESTATE_DAYS", "3")
    with dg.instance_for_test() as instance:
        when = datetime(2026, 11, 2, 7, tzinfo=timezone.utc)
        requests = costs_daily_schedule(
            dg.build_schedule_context(instance=instance, scheduled_execution_time=when)
        )
    assert [
        (r.tags["dagster/asset_partition_range_start"], r.tags["dagster/asset_partition_range_end"])
        for r in requests
    ] == [("2026-11-01", "2026-11-01")]
