"""`foxhunt-obs demo`: the sandbox up, every job over its last week through Dagster, the summaries, and
the alert sensor's code replayed over the last day."""

from __future__ import annotations

import os
from datetime import datetime, timedelta, timezone
from pathlib import Path

from foxhunt_obs.cli.jobs import ensure_dagster_home, run_job
from foxhunt_obs.cli.sandbox import up
from foxhunt_obs.cli.summaries import costs_summary, summary, training_summary, weekly_summary


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
    from foxhunt_obs.sandbox.servers.moto_server import set_ec2_as_of
    from foxhunt_obs.sandbox.story import expected_alerts
    from foxhunt_obs.sandbox.story.scenario import load_scenario

    aws, lake, prometheus = config.aws(), config.lake(), config.prometheus()
    sources = Sources(
        prometheus=prometheus,
        mlflow=config.mlflow(),
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
            # moto's running EC2 instances follow the scenario: its nodes, and a stray while it runs
            before_tick=lambda now: set_ec2_as_of(scenario, info["aws_url"], now),
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


def run_demo(args) -> int:
    from foxhunt_obs.sandbox.servers import prometheus as sandbox

    ensure_dagster_home()
    info = up(args)
    os.environ["FOXHUNT_PROMETHEUS_URL"] = info["url"]
    os.environ["MLFLOW_TRACKING_URI"] = info["mlflow_url"]
    os.environ.update(info["aws_env"])
    print(
        f"sandbox: Prometheus {info['url']}, MLflow {info['mlflow_url']}, AWS (moto) {info['aws_url']}, "
        f"scenario {info['scenario']}"
    )
    try:
        end = datetime.fromisoformat(str(info["end"])).astimezone(timezone.utc)
        # the last full week (Monday 00:00 UTC) the scenario covers, or else its last day
        start = end - timedelta(days=7)
        week = start + timedelta(days=(7 - start.weekday()) % 7)
        week = week.replace(hour=0, minute=0, second=0, microsecond=0)
        start = week if week + timedelta(days=7) <= end else end - timedelta(hours=24)
        first_day, last_day = start.strftime("%Y-%m-%d"), (end - timedelta(hours=1)).strftime("%Y-%m-%d")
        hours = (start.strftime("%Y-%m-%d-%H:%M"), (end - timedelta(hours=1)).strftime("%Y-%m-%d-%H:%M"))
        ok = True
        for job, first, last in [
            ("gpu_ingest_job", *hours),
            ("ray_ingest_job", *hours),
            ("gpu_hourly_job", first_day, last_day),
            ("training_job", first_day, last_day),
            ("fsx_ingest_job", *hours),
            ("costs_job", first_day, last_day),
            ("daily_reports_job", first_day, last_day),
        ]:
            ok = ok and run_job(job, first, last)
        if ok and week + timedelta(days=7) <= end:
            ok = run_job("weekly_report_job", week.strftime("%Y-%m-%d"), week.strftime("%Y-%m-%d"))
        if not ok:
            return 1
        day_start = end - timedelta(hours=24)
        print()
        print(summary(day_start, end))
        print()
        print(training_summary(last_day))
        print()
        print(costs_summary(last_day))
        if week + timedelta(days=7) <= end:
            print()
            print(weekly_summary(week.strftime("%Y-%m-%d")))
        print()
        text, found_all = alerts_replay(info, args.state_dir, alerts_start(info, start, day_start), end)
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
