"""The demo's runs (cli/jobs.py, cli/demo.py): each job cut into runs as a backfill would cut it, in
worker processes as soon as the jobs it reads from are done; each run's line says how far its job is.

run_steps is exercised with real worker processes on small steps that record when they ran (a file per
step), so the order asserted is the order they really ran in; the plan is checked against the code
location's own asset graph and partitions."""

import os
import time
from datetime import datetime, timezone
from pathlib import Path

import pytest

from foxhunt_obs.cli.demo import REPLAY, JobLines, demo_steps
from foxhunt_obs.cli.jobs import Step, plan_jobs, run_steps

pytestmark = pytest.mark.timeout(120)


def record(out: str, name: str, seconds: float, ok: bool = True) -> tuple[bool, str]:
    """A step: writes when it started and ended (monotonic clock, shared by the processes)."""
    start = time.monotonic()
    time.sleep(seconds)
    Path(out, name).write_text(f"{start} {time.monotonic()} {os.getpid()}")
    return ok, name


def boom(message: str) -> tuple[bool, str]:
    raise ValueError(message)


def spans(out: Path) -> dict[str, tuple[float, float, int]]:
    found = {}
    for f in out.iterdir():
        start, end, pid = f.read_text().split()
        found[f.name] = (float(start), float(end), int(pid))
    return found


@pytest.fixture(autouse=True)
def dagster_home(tmp_path, monkeypatch):
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "dagster_home"))


@pytest.mark.servers
def test_steps_wait_for_the_groups_they_read_and_run_side_by_side(tmp_path):
    out = tmp_path / "ran"
    out.mkdir()
    steps = [
        Step("a", record, (str(out), "a1", 0.5)),
        Step("a", record, (str(out), "a2", 0.5)),
        Step("b", record, (str(out), "b1", 0.1), frozenset({"a"})),
        Step("c", record, (str(out), "c1", 0.5)),
    ]
    seen = []
    ok, payloads = run_steps(steps, max_workers=2, on_step_done=lambda s, k, p: seen.append((p, k)))
    assert ok
    assert payloads == {"a": ["a1", "a2"], "b": ["b1"], "c": ["c1"]}
    ran = spans(out)
    # a's runs one after the other; c (waiting for nothing) beside a1, in another process (none this one)
    assert ran["a2"][0] >= ran["a1"][1]
    assert ran["c1"][0] < ran["a1"][1] and ran["a1"][0] < ran["c1"][1]
    assert ran["a1"][2] != ran["c1"][2] and os.getpid() not in {p for *_, p in ran.values()}
    # b waited for both of a's runs
    assert ran["b1"][0] >= ran["a2"][1]
    assert sorted(seen) == sorted([("a1", True), ("a2", True), ("b1", True), ("c1", True)])


@pytest.mark.servers
def test_a_failed_step_stops_what_has_not_started(tmp_path):
    out = tmp_path / "ran"
    out.mkdir()
    steps = [
        Step("a", record, (str(out), "a1", 0.1, False)),
        Step("b", record, (str(out), "b1", 0.1), frozenset({"a"})),
        Step("c", boom, ("no lake",)),
    ]
    seen = []
    ok, payloads = run_steps(steps, max_workers=1, on_step_done=lambda s, k, p: seen.append((s.group, k, p)))
    assert not ok
    assert [f.name for f in out.iterdir()] == ["a1"]  # b waited for a, which failed; c never started
    assert seen == [("a", False, "a1")]
    assert payloads == {"a": ["a1"], "b": [], "c": []}


@pytest.mark.servers
def test_an_exception_in_a_step_is_its_failure_with_its_message(tmp_path):
    ok, payloads = run_steps([Step("c", boom, ("no lake",))], max_workers=1)
    assert not ok and payloads == {"c": ["c: ValueError: no lake"]}


def test_hourly_jobs_run_a_day_at_a_time_and_wait_for_what_they_read():
    plans = {
        p.job: p
        for p in plan_jobs(
            [
                ("gpu_ingest_job", "2026-11-16-00:00", "2026-11-18-05:00"),
                ("costs_job", "2026-11-16", "2026-11-18"),
                ("fsx_ingest_job", "2026-11-16-00:00", "2026-11-18-05:00"),
                ("gpu_hourly_job", "2026-11-16", "2026-11-18"),
            ]
        )
    }
    gpu = plans["gpu_ingest_job"]
    # multi_run(max_partitions_per_run=24): 24, 24 and the 6 hours left, no hour twice or missed
    assert gpu.runs == (
        ("2026-11-16-00:00", "2026-11-16-23:00"),
        ("2026-11-17-00:00", "2026-11-17-23:00"),
        ("2026-11-18-00:00", "2026-11-18-05:00"),
    )
    assert gpu.partitions == 54 and gpu.after == frozenset()
    # single_run: one run; costs_hourly reads fsx_metrics and node_samples, gpu_hourly reads gpu_samples
    assert plans["costs_job"].runs == (("2026-11-16", "2026-11-18"),)
    assert plans["costs_job"].after == {"gpu_ingest_job", "fsx_ingest_job"}
    assert plans["gpu_hourly_job"].after == {"gpu_ingest_job"}


def test_the_demo_runs_its_week_and_replays_once_the_costs_are_in():
    end = datetime(2026, 11, 23, tzinfo=timezone.utc)
    steps, totals, week, last_day = demo_steps({"scenario": "default"}, Path("unused"), end)
    assert week == datetime(2026, 11, 16, tzinfo=timezone.utc) and last_day == "2026-11-22"
    assert totals["gpu_ingest_job"] == 168 and totals["weekly_report_job"] == 1
    for job, total in totals.items():
        assert sum(s.partitions for s in steps if s.group == job) == total, job
    (replay,) = [s for s in steps if s.group == REPLAY]
    assert replay.after == {"costs_job"}
    # the replay starts an hour before the scenario's stray instance (11-21 10:00), ends at its end
    assert replay.args[2:] == (datetime(2026, 11, 21, 9, tzinfo=timezone.utc), end)
    # a worker that frees up takes the path to the replay first: the ingest its costs read, then costs
    groups = [s.group for s in steps]
    assert groups.index(REPLAY) < groups.index("ray_ingest_job")
    assert groups.index("costs_job") < groups.index(REPLAY)


def test_each_run_line_says_how_far_its_job_is(capsys):
    lines = JobLines({"gpu_ingest_job": 48, "costs_job": 1})
    step = Step("gpu_ingest_job", record, (), partitions=24)
    lines(step, True, ("gpu_ingest_job 2026-11-16-00:00...2026-11-16-23:00: run r1 succeeded", []))
    lines(
        step,
        False,
        ("gpu_ingest_job 2026-11-17-00:00...2026-11-17-23:00: run r2 FAILED", ["  gpu_samples: no"]),
    )
    lines(
        Step("costs_job", record, (), partitions=1),
        True,
        ("costs_job 2026-11-16...2026-11-16: run r3 succeeded", []),
    )
    out, err = capsys.readouterr()
    assert out.splitlines() == [
        "gpu_ingest_job 2026-11-16-00:00...2026-11-16-23:00: run r1 succeeded (24 of 48 partitions)",
        "gpu_ingest_job 2026-11-17-00:00...2026-11-17-23:00: run r2 FAILED",
        "costs_job 2026-11-16...2026-11-16: run r3 succeeded",
    ]
    assert err.splitlines() == ["  gpu_samples: no"]
