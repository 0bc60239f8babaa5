"""`foxhunt-obs demo`: the sandbox up, every job over its last week through Dagster (runs cut as a backfill
cuts them, two at a time in worker processes: cli/jobs.py run_steps), the summaries, and the alert
sensor's code replayed over the last day (beside the last jobs, once the tables it reads are in)."""

from __future__ import annotations

import logging
import os
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path

from foxhunt_obs.cli.jobs import ensure_dagster_home, workers
from foxhunt_obs.cli.sandbox import up
from foxhunt_obs.cli.summaries import costs_summary, summary, training_summary, weekly_summary

log = logging.getLogger(__name__)  # progress lines, on stderr (cli/__init__.py)
REPLAY_PROGRESS_TICKS = 36  # a progress line every 36 ticks (6 hours of the replay at 10 min)


def alerts_replay(
    info: dict, state_dir: Path, start: datetime, end: datetime, every_s: int = 600
) -> tuple[str, bool]:
    """The alert sensor's code replayed over [start, end] as if it had ticked every `every_s` seconds,
    notifying a local Alertmanager and the alerts table: what arrived, in order, and whether every
    incident the scenario injected there was found (sandbox/story/expected_alerts.py). The tick at `end` sees
    the last day's costs complete (a cost spike the day before resolves there)."""
    import foxhunt_obs.cli.config as config
    from foxhunt_obs.lib.alerts.collect import Sources
    from foxhunt_obs.lib.alerts.engine import replay
    from foxhunt_obs.lib.alerts.rules import load_rules
    from foxhunt_obs.lib.delivery.alert_sinks import AlertmanagerSink, LakeAlertSink
    from foxhunt_obs.lib.sources.fsx import FsxSource
    from foxhunt_obs.sandbox.servers.alertmanager import AlertmanagerServer
    from foxhunt_obs.sandbox.story import expected_alerts
    from foxhunt_obs.sandbox.story.scenario import load_scenario

    aws, lake, prometheus = config.aws(), config.lake(), config.prometheus()
    sources = Sources(
        prometheus=prometheus,
        mlflow=StaticMlflow(config.mlflow()),
        fsx=FsxSource(aws.client("fsx"), aws.client("cloudwatch")),
        fsx_ids=config.fsx_ids(),
        lake=lake,
        ec2=config.costs().untracked(aws, prometheus),
    )
    scenario = load_scenario(info["scenario"])
    # the sandbox cluster's own settings (gpu_node_missing: its node count), unless FOXHUNT_ALERT_RULES says
    overrides = config.alerting().rules_file or expected_alerts.write_rule_overrides(
        scenario, Path(state_dir) / "run" / "alert-rules.yaml"
    )
    with AlertmanagerServer(workdir=Path(state_dir) / "run") as alertmanager:
        sent, _ = replay(
            load_rules(overrides=overrides),
            sources,
            [AlertmanagerSink(alertmanager.url), LakeAlertSink(lake)],
            start,
            end + timedelta(seconds=1),
            every_s,
            before_tick=ReplayTicks(scenario, info["aws_url"], start, end, every_s),
        )
        active = alertmanager.alerts(active=True)
    lines = [
        f"Alerts, {start:%Y-%m-%d %H:%M} .. {end:%Y-%m-%d %H:%M} UTC: the alert sensor's code replayed every "
        f"{every_s // 60} min into Alertmanager {alertmanager.url} and the alerts table"
    ]
    lines += [
        f"  {tick:%m-%d %H:%M}  {n.status:<8} {n.severity:<8} {n.rule:<20} {n.summary}" for tick, n in sent
    ]
    lines.append(
        f"  Alertmanager at the end: {len(active)} active ("
        + (", ".join(sorted(a["labels"]["alertname"] for a in active)) or "none")
        + ")"
    )
    verdict = expected_alerts.check(
        expected_alerts.expected(scenario), sent, start, sent[-1][0] if sent else end
    )
    lines.append(
        f"  Injected incidents found: {len(verdict.found)} of {len(verdict.found) + len(verdict.missed)} "
        "(each fired once after it began and resolved once after it ended, or still fires)"
    )
    lines += [f"  MISSED {e.rule} for {e.what}: {why}" for e, why in verdict.missed]
    for stray in scenario.aws.strays if scenario.aws else ():
        lines.append("  " + stray_latency(stray, scenario.aws.default_tags.get("Project", ""), sent))
    if verdict.other:
        lines.append(
            "  Also fired (no injected incident; by the scenario's design): "
            + ", ".join(
                sorted({f"{n.rule} {expected_alerts.ident(n.rule, n.labels)}" for _, n in verdict.other})
            )
        )
    return "\n".join(lines), verdict.ok


class ReplayTicks:
    """The replay's ``before_tick``: moto's running EC2 instances follow the scenario (its nodes, and a
    stray while it runs), and a progress line every REPLAY_PROGRESS_TICKS ticks.

    moto is told only at a tick where the scenario's set of running instances differs from the last one
    it was given (the first tick, a stray starting or ending, a node lost or back): ``set_ec2_as_of``
    makes moto's instances that set, so at any other tick it would find nothing to start or terminate,
    and nothing else changes moto's instances during the replay. Each call costs a boto3 client and
    three requests (about 0.9 s a tick on 2 cores, measured); the sources read the same instances."""

    def __init__(self, scenario, aws_url: str, start: datetime, end: datetime, every_s: int):
        from foxhunt_obs.sandbox.writers import bills

        self.scenario, self.aws_url = scenario, aws_url
        self.instances = bills.instances(scenario) + bills.stray_instances(scenario)
        self.applied: frozenset[str] | None = None
        self.ticks, self.total = 0, len(range(0, int((end - start).total_seconds()) + 1, every_s))
        self.moto_calls = 0

    def running(self, now: datetime) -> frozenset[str]:
        return frozenset(i.instance_id for i in self.instances if i.start <= now < i.end)

    def __call__(self, now: datetime) -> None:
        from foxhunt_obs.sandbox.servers.moto_server import set_ec2_as_of

        want = self.running(now)
        if want != self.applied:
            set_ec2_as_of(self.scenario, self.aws_url, now)
            self.applied, self.moto_calls = want, self.moto_calls + 1
        if self.ticks % REPLAY_PROGRESS_TICKS == 0:
            log.info("alert replay: tick %d of %d (%s UTC)", self.ticks + 1, self.total, f"{now:%m-%d %H:%M}")
        self.ticks += 1


class StaticMlflow:
    """The replay's MLflow source: each distinct read asked once, its answer reused by later ticks.

    The sandbox's MLflow store holds the scenario's runs, written before the demo starts, and nothing
    writes to it while the replay runs (the demo starts no trainer), so a tick asking again would get
    the same runs and the same points (the training rules' frame takes the points up to the tick's time
    from them: lib/alerts/collect.py). Asking again is ~0.4 s a tick of the mlflow server's CPU."""

    def __init__(self, source):
        self.source = source
        self._runs = None
        self._histories: dict[tuple, object] = {}

    def runs(self):
        if self._runs is None:
            self._runs = self.source.runs()
        return list(self._runs)

    def histories(self, runs):
        runs = list(runs)
        key = tuple((r.run_id, tuple(r.metric_keys)) for r in runs)
        if key not in self._histories:
            self._histories[key] = self.source.histories(runs)  # an Arrow table: immutable
        return self._histories[key]

    def __getattr__(self, name: str):
        return getattr(self.source, name)


RECORDS_MARGIN = timedelta(hours=2)  # before the replay's first tick: its rules look back an hour at most


def records_needed(scenario_name: str) -> datetime:
    """From when the demo reads the recorded series (foxhunt:gpu_*): its alert replay's start, less a
    margin for the rules' look-back. The jobs read the raw series, and nothing it runs reads the cost
    records, so a first history build for the demo records no more (prometheus.build_tsdb)."""
    from foxhunt_obs.sandbox.story.scenario import load_scenario

    end = load_scenario(scenario_name).end
    start, _, _ = demo_window(end)
    return alerts_start({"scenario": scenario_name}, start, end - timedelta(hours=24)) - RECORDS_MARGIN


def demo_window(end: datetime) -> tuple[datetime, datetime, bool]:
    """The demo's window: the last full week (Monday 00:00 UTC) the scenario covers, or else its last day;
    (its start, the week's Monday, whether the week is full)."""
    start = end - timedelta(days=7)
    week = start + timedelta(days=(7 - start.weekday()) % 7)
    week = week.replace(hour=0, minute=0, second=0, microsecond=0)
    full_week = week + timedelta(days=7) <= end
    return (week if full_week else end - timedelta(hours=24)), week, full_week


def alerts_start(info: dict, week_start: datetime, day_start: datetime) -> datetime:
    """Where the demo's alert replay begins: the last day, or an hour before the first stray instance of
    the week when one ran earlier, so its live alert is seen beside the bill's cost_spike of the day after."""
    from foxhunt_obs.sandbox.story.scenario import load_scenario

    scenario = load_scenario(info["scenario"])
    strays = [x.start for x in (scenario.aws.strays if scenario.aws else ()) if x.start >= week_start]
    first = [t.replace(minute=0, second=0, microsecond=0) - timedelta(hours=1) for t in strays]
    return min([day_start, *first])


def stray_latency(stray, project: str, sent: list) -> str:
    """How long after a stray instance started each cost alert about it fired: untracked_spend (live,
    EC2) against cost_spike (the bill's day, the morning after)."""

    def first(rule: str, match) -> str:
        ticks = [
            t for t, n in sent if n.rule == rule and n.status == "firing" and t >= stray.start and match(n)
        ]
        if not ticks:
            return "not fired"
        hours = (ticks[0] - stray.start).total_seconds() / 3600
        return f"{ticks[0]:%m-%d %H:%M} ({hours:.1f} h after it started)"

    live = first("untracked_spend", lambda n: n.labels.get("name") == stray.name)
    bill = first("cost_spike", lambda n: n.labels.get("project") == project)
    return (
        f"Stray {stray.instance_type} {stray.name} started {stray.start:%m-%d %H:%M}: untracked_spend {live}; "
        f"cost_spike {bill} (on a real bill, add CUR's 24-48 h)"
    )


def replay_step(info: dict, state_dir: Path, start: datetime, end: datetime) -> tuple[bool, tuple[str, bool]]:
    """The alert replay as a step of ``run_steps`` (in a worker process): its text and verdict."""
    return True, alerts_replay(info, state_dir, start, end)


REPLAY = "alert replay"


def demo_steps(info: dict, state_dir: Path, end: datetime):
    """The demo's work, in the order a free worker takes it: every job over the scenario's last week (or
    its last day), cut into runs as a backfill would cut them, and the alert replay once the jobs whose
    tables it reads (costs_job: costs_daily, budgets) are done; the path to the replay first. Returns
    (steps, each job's partitions, the week or None, the replay's start, the last day)."""
    from foxhunt_obs.cli.jobs import Step, job_steps, plan_jobs

    start, week, full_week = demo_window(end)
    first_day, last_day = start.strftime("%Y-%m-%d"), (end - timedelta(hours=1)).strftime("%Y-%m-%d")
    hours = (start.strftime("%Y-%m-%d-%H:%M"), (end - timedelta(hours=1)).strftime("%Y-%m-%d-%H:%M"))
    jobs = [
        ("gpu_ingest_job", *hours),
        ("fsx_ingest_job", *hours),
        ("costs_job", first_day, last_day),
        ("ray_ingest_job", *hours),
        ("training_job", first_day, last_day),
        ("gpu_hourly_job", first_day, last_day),
        ("daily_reports_job", first_day, last_day),
    ]
    if full_week:
        jobs.append(("weekly_report_job", week.strftime("%Y-%m-%d"), week.strftime("%Y-%m-%d")))
    plans = plan_jobs(jobs)
    steps = job_steps(plans)
    replay_from = alerts_start(info, start, end - timedelta(hours=24))
    replay = Step(REPLAY, replay_step, (info, state_dir, replay_from, end), frozenset({"costs_job"}))
    at = max(n for n, s in enumerate(steps) if s.group == "costs_job") + 1
    steps.insert(at, replay)
    totals = {p.job: p.partitions for p in plans}
    return steps, totals, (week if full_week else None), last_day


def run_demo(args) -> int:
    from foxhunt_obs.cli.jobs import run_steps
    from foxhunt_obs.sandbox.servers import prometheus as sandbox

    ensure_dagster_home()
    info = up(args, records_from=records_needed(args.scenario))
    os.environ["FOXHUNT_PROMETHEUS_URL"] = info["url"]
    os.environ["MLFLOW_TRACKING_URI"] = info["mlflow_url"]
    os.environ.update(info["aws_env"])
    print(
        f"sandbox: Prometheus {info['url']}, MLflow {info['mlflow_url']}, AWS (moto) {info['aws_url']}, "
        f"scenario {info['scenario']}"
    )
    try:
        end = datetime.fromisoformat(str(info["end"])).astimezone(timezone.utc)
        steps, totals, week, last_day = demo_steps(info, args.state_dir, end)
        log.info(
            "running %d Dagster runs of %d jobs and the alert replay, %d at a time",
            sum(s.group != REPLAY for s in steps), len(totals), workers(),
        )  # fmt: skip
        ok, done = run_steps(steps, on_step_done=JobLines(totals))
        if not ok:
            return 1
        day_start = end - timedelta(hours=24)
        print()
        print(summary(day_start, end))
        print()
        print(training_summary(last_day))
        print()
        print(costs_summary(last_day))
        if week is not None:
            print()
            print(weekly_summary(week.strftime("%Y-%m-%d")))
        print()
        text, found_all = done[REPLAY][0]
        print(text)
        if not found_all:
            return 1
    finally:
        if not args.keep:
            sandbox.down(args.state_dir)
    print(
        f"\nRuns and materializations are in {os.environ['DAGSTER_HOME']}: `make ui` opens the Dagster UI "
        "on http://127.0.0.1:3000 over the sandbox."
    )
    return 0


class JobLines:
    """run_steps' ``on_step_done`` for the demo: each run's status line as it ends, with how far its job
    is ("48 of 168 partitions"), each failed step's message on stderr."""

    def __init__(self, totals: dict[str, int]):
        self.totals, self.done = totals, dict.fromkeys(totals, 0)

    def __call__(self, step, ok: bool, payload) -> None:
        if step.group not in self.totals:
            if not ok:
                print(f"{step.group} FAILED: {payload}", file=sys.stderr)
            return
        if isinstance(payload, str):  # the run raised instead of reporting
            print(payload, file=sys.stderr)
            return
        line, errors = payload
        total = self.totals[step.group]
        if ok and total > 1:
            self.done[step.group] += step.partitions
            line += f" ({self.done[step.group]} of {total} partitions)"
        print(line, flush=True)
        for error in errors:
            print(error, file=sys.stderr)
