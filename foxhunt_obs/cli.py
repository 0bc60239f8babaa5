"""`foxhunt-obs`: the sandbox, job runs over partition ranges, summaries, and the demo."""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path

STATE_DIR = Path(".foxhunt/sandbox")
DEFAULT_PORT = 19090
MLFLOW_PORT = 15000
MOTO_PORT = 15005


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="foxhunt-obs", description=__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)

    sb = sub.add_parser("sandbox", help="the local stack: a real Prometheus backfilled with a scenario")
    sb.add_argument("action", choices=["up", "down", "status", "env"])
    sb.add_argument("--scenario", default="default", help="scenario name or YAML path (default: default)")
    sb.add_argument("--port", type=int, default=DEFAULT_PORT)
    sb.add_argument("--mlflow-port", type=int, default=MLFLOW_PORT)
    sb.add_argument("--moto-port", type=int, default=MOTO_PORT)
    sb.add_argument("--state-dir", type=Path, default=STATE_DIR)

    run = sub.add_parser("run", help="run a job over a partition range through Dagster (runs show in the UI)")
    run.add_argument("job")
    run.add_argument("--range", required=True, metavar="FIRST...LAST", help="partition keys, inclusive")

    sm = sub.add_parser("summary", help="GPU-hours and mean utilization per experiment and node")
    sm.add_argument("--start", required=True, help="UTC hour, e.g. 2026-11-22T00")
    sm.add_argument("--end", required=True, help="UTC hour, exclusive")

    rules = sub.add_parser("rules", help="Prometheus rules generated from the metric catalog")
    rules.add_argument("action", choices=["export"])
    rules.add_argument("--out", type=Path, default=Path("deploy/prometheus"))

    demo = sub.add_parser(
        "demo", help="sandbox up, ingest its last 24 hours through Dagster, print a summary"
    )
    demo.add_argument("--scenario", default="default")
    demo.add_argument("--port", type=int, default=DEFAULT_PORT)
    demo.add_argument("--mlflow-port", type=int, default=MLFLOW_PORT)
    demo.add_argument("--moto-port", type=int, default=MOTO_PORT)
    demo.add_argument("--state-dir", type=Path, default=STATE_DIR)
    demo.add_argument("--keep", action="store_true", help="leave the sandbox running afterwards")

    args = p.parse_args(argv)
    if args.cmd == "sandbox":
        return _sandbox(args)
    if args.cmd == "run":
        first, _, last = args.range.partition("...")
        return 0 if run_job(args.job, first, last or first) else 1
    if args.cmd == "rules":
        for path in export_rules(args.out):
            print(f"wrote {path}")
        return 0
    if args.cmd == "summary":
        print(summary(_hour(args.start), _hour(args.end)))
        return 0
    return _demo(args)


def _hour(s: str) -> datetime:
    return datetime.strptime(s, "%Y-%m-%dT%H").replace(tzinfo=timezone.utc)


def _sandbox(args) -> int:
    from foxhunt_obs.sandbox import mlflow_server, moto_server
    from foxhunt_obs.sandbox import prometheus as sandbox

    if args.action == "up":
        info = _up(args)
        print(f"sandbox up, scenario {info['scenario']} {info['start']} .. {info['end']}:")
        print(f"  Prometheus {info['url']} (backfilled history; live fake exporter {info['exporter_url']})")
        print(f"  MLflow {info['mlflow_url']}")
        print(f"  AWS (moto: FSx, CloudWatch, S3 with CUR 2.0, Cost Explorer, Budgets) {info['aws_url']}")
        print('  eval "$(foxhunt-obs sandbox env)" points a shell at all three')
    elif args.action == "down":
        sandbox.down(args.state_dir)
        print("sandbox down")
    elif args.action == "status":
        info = sandbox.status(args.state_dir)
        ml = mlflow_server.mlflow_status(args.state_dir)
        aws = moto_server.moto_status(args.state_dir)
        print(
            json.dumps({"prometheus": info, "mlflow": ml, "aws": aws}, indent=2, default=str)
            if info
            else "sandbox not running"
        )
        return 0 if info and ml and aws else 1
    else:  # env: for eval "$(foxhunt-obs sandbox env)"
        info, ml = sandbox.status(args.state_dir), mlflow_server.mlflow_status(args.state_dir)
        aws = moto_server.moto_status(args.state_dir)
        if not info or not ml or not aws:
            print("sandbox not running", file=sys.stderr)
            return 1
        env = {"FOXHUNT_PROMETHEUS_URL": info["url"], "MLFLOW_TRACKING_URI": ml["url"]}
        env.update(moto_server.sandbox_env(aws))
        print("export " + " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items()))
    return 0


def _up(args) -> dict:
    """Prometheus (with the live exporter) first: its up() clears the run dir the others' files go in."""
    from foxhunt_obs.sandbox import prometheus as sandbox
    from foxhunt_obs.sandbox.mlflow_server import up_mlflow
    from foxhunt_obs.sandbox.moto_server import sandbox_env, up_moto

    info = sandbox.up(args.scenario, args.state_dir, args.port)
    try:
        info["mlflow_url"] = up_mlflow(args.scenario, args.state_dir, args.mlflow_port)["url"]
        aws = up_moto(args.scenario, args.state_dir, args.moto_port)
        info["aws_url"], info["aws_env"] = aws["endpoint_url"], sandbox_env(aws)
    except BaseException:
        sandbox.down(args.state_dir)
        raise
    return info


def export_rules(out: Path) -> list[Path]:
    """The recording rules and the alerting rules (alert_rules.yaml's enabled rules with promql, as
    overridden by FOXHUNT_ALERT_RULES), each as a Prometheus rules file and as a PrometheusRule
    (prometheus-operator)."""

    from foxhunt_obs.lib.alerts import prometheus_rules as alerting
    from foxhunt_obs.lib.analysis.catalog import load_catalog
    from foxhunt_obs.lib.analysis.recording_rules import recording_rules, render
    from foxhunt_obs.lib.settings import Settings

    settings = Settings.from_env()
    rules = recording_rules(load_catalog(), settings.node_labels, settings.exporter_containers)
    manifest = {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {
            "name": "foxhunt-recording-rules",
            "namespace": "monitoring",
            "labels": {"release": "prometheus"},
        },
        "spec": rules,
    }
    alerts = alerting.alerting_rules()
    out.mkdir(parents=True, exist_ok=True)
    files = {
        out / "foxhunt-recording-rules.yaml": render(rules),
        out / "foxhunt-recording-rules.prometheusrule.yaml": render(manifest),
        out / "foxhunt-rules.yaml": alerting.render(alerts),
        out / "foxhunt-rules.prometheusrule.yaml": alerting.render(alerting.prometheus_rule(alerts)),
    }
    for path, text in files.items():
        path.write_text(text)
    return list(files)


def ensure_dagster_home() -> Path:
    home = Path(os.environ.setdefault("DAGSTER_HOME", str(Path(".foxhunt/dagster_home").resolve())))
    home.mkdir(parents=True, exist_ok=True)
    (home / "dagster.yaml").touch()
    return home


def run_job(job_name: str, first: str, last: str) -> bool:
    """One Dagster run of `job_name` over partitions first..last, recorded in DAGSTER_HOME's instance."""
    import dagster as dg

    from foxhunt_obs.definitions import defs

    ensure_dagster_home()
    job = defs().resolve_job_def(job_name)
    with dg.DagsterInstance.get() as instance:
        result = job.execute_in_process(
            instance=instance,
            # the run's full event log is in the UI; the terminal gets warnings and our one-line status
            run_config={"loggers": {"console": {"config": {"log_level": "WARNING"}}}},
            tags={"dagster/asset_partition_range_start": first, "dagster/asset_partition_range_end": last},
            raise_on_error=False,
        )
    status = "succeeded" if result.success else "FAILED"
    print(f"{job_name} {first}...{last}: run {result.run_id} {status}")
    if not result.success:
        for event in result.all_events:
            if event.is_step_failure:
                print(f"  {event.step_key}: {event.step_failure_data.error.message.strip()}", file=sys.stderr)
    return result.success


def summary(start: datetime, end: datetime) -> str:
    """A plain-text summary of gpu_hourly for [start, end)."""
    from foxhunt_obs.lib.lake import Lake
    from foxhunt_obs.lib.schemas import GPU_HOURLY
    from foxhunt_obs.lib.settings import env

    lake = Lake(env("FOXHUNT_LAKE"))
    con = lake.connect([GPU_HOURLY])
    params = [start, end]
    where = "WHERE hour >= ? AND hour < ?"
    total = con.execute(
        # GPU-hours weighed by gpu_share: a MIG slice counts for its part of its GPU
        f"""SELECT count(DISTINCT uuid), sum(seconds_with_data * coalesce(gpu_share, 1)) / 3600, sum(active_gpu_seconds) / 3600,
                   sum(energy_kwh), sum(ecc_sbe_delta), sum(ecc_dbe_delta) FROM gpu_hourly {where}""",
        params,
    ).fetchone()
    if not total[0]:
        return f"no gpu_hourly rows for {start:%Y-%m-%dT%H} .. {end:%Y-%m-%dT%H} in {lake.root}"

    def table(by: str) -> str:
        rows = con.execute(
            f"""SELECT {by}, count(DISTINCT uuid) AS gpus,
                       round(sum(seconds_with_data * coalesce(gpu_share, 1)) / 3600, 1) AS gpu_hours,
                       round(sum(active_gpu_seconds) / 3600, 1) AS active_gpu_hours,
                       round(100 * sum(active_gpu_seconds) / sum(coalesce(activity_seconds, seconds_with_data) * coalesce(gpu_share, 1)), 1) AS mean_util_pct
                FROM gpu_hourly {where} GROUP BY {by} ORDER BY {by}""",
            params,
        ).fetch_df()
        return rows.to_string(index=False)

    out = [
        f"GPU summary {start:%Y-%m-%d %H:00} .. {end:%Y-%m-%d %H:00} UTC (lake {lake.root})",
        f"  GPUs {total[0]}, GPU-hours observed {total[1]:.1f}, active GPU-hours {total[2]:.1f} "
        f"(mean util {100 * total[2] / total[1]:.1f} %), energy {total[3]:.1f} kWh, "
        f"ECC SBE {total[4]:.0f}, DBE {total[5]:.0f}",
        "",
        "By experiment:",
        table("experiment"),
        "",
        "By node:",
        table("node"),
    ]
    con.close()
    return "\n".join(out)


def training_summary(day: str) -> str:
    """Per experiment: GPU utilization beside the day's training health."""
    from foxhunt_obs.lib.lake import Lake
    from foxhunt_obs.lib.settings import env

    lake = Lake(env("FOXHUNT_LAKE"))
    rows = lake.query(
        """
        WITH gpu AS (
          SELECT experiment, round(sum(seconds_with_data * coalesce(gpu_share, 1)) / 3600, 1) AS gpu_hours,
                 round(100 * sum(active_gpu_seconds) / sum(coalesce(activity_seconds, seconds_with_data) * coalesce(gpu_share, 1)), 1) AS gpu_util_pct
          FROM gpu_hourly WHERE strftime(hour, '%Y-%m-%d') = $day GROUP BY experiment
        ),
        h AS (
          SELECT experiment, count(*) AS runs,
                 count(*) FILTER (WHERE status = 'RUNNING') AS running,
                 round(max(success_rate_best), 2) AS best_success,
                 string_agg(DISTINCT bottleneck, '/') FILTER (WHERE bottleneck <> '') AS bottleneck,
                 string_agg(
                   run_name || ': ' || concat_ws(', ',
                     CASE WHEN loss_nonfinite > 0 THEN 'NaN/Inf loss' END,
                     CASE WHEN entropy_collapse THEN 'entropy collapse' END,
                     CASE WHEN success_drop THEN 'success drop' END,
                     CASE WHEN stalled THEN 'stalled' END,
                     CASE WHEN status = 'FAILED' THEN 'FAILED' END),
                   '; ') FILTER (WHERE loss_nonfinite > 0 OR entropy_collapse OR success_drop OR stalled
                                 OR status = 'FAILED') AS incidents
          FROM training_health WHERE day = CAST($day AS DATE) AND NOT deleted GROUP BY experiment
        )
        SELECT coalesce(h.experiment, gpu.experiment) AS experiment, gpu.gpu_hours, gpu.gpu_util_pct,
               h.runs, h.running, h.best_success, h.bottleneck, coalesce(h.incidents, '') AS incidents
        FROM h FULL OUTER JOIN gpu USING (experiment) ORDER BY experiment
        """,
        {"day": day},
    ).to_pandas()
    for col in ("runs", "running"):
        rows[col] = rows[col].astype("Int64")  # no training runs (unattributed GPUs): <NA>, not NaN
    return f"Training health and GPU use, {day} (lake {lake.root})\n" + rows.to_string(index=False)


def costs_summary(day: str) -> str:
    """Cost per experiment tag and source, the estimate-vs-bill gap, and FSx free space, for one day."""
    from foxhunt_obs.lib.lake import Lake
    from foxhunt_obs.lib.settings import env

    lake = Lake(env("FOXHUNT_LAKE"))
    con = lake.connect()
    by_experiment = con.execute(
        """SELECT coalesce(nullif(project, ''), '(untagged)') AS project,
                  coalesce(nullif(experiment, ''), CASE WHEN project = '' THEN '' ELSE '(shared)' END) AS experiment,
                  round(sum(cost_usd) FILTER (WHERE source = 'cur'), 2) AS cur_usd,
                  round(sum(cost_usd) FILTER (WHERE source = 'ce'), 2) AS cost_explorer_usd
           FROM costs_daily WHERE day = $day AND source IN ('cur', 'ce') GROUP BY ALL ORDER BY ALL""",
        {"day": day},
    ).fetch_df()
    gap = con.execute(
        """SELECT service, round(sum(cost_usd) FILTER (WHERE source = 'estimate'), 2) AS estimate_usd,
                  round(sum(cost_usd) FILTER (WHERE source = 'cur'), 2) AS cur_usd,
                  round(sum(cost_usd) FILTER (WHERE source = 'ce'), 2) AS cost_explorer_usd,
                  round(100 * (sum(cost_usd) FILTER (WHERE source = 'estimate')
                        / nullif(sum(cost_usd) FILTER (WHERE source = 'cur'), 0) - 1), 3) AS estimate_gap_pct
           FROM costs_daily WHERE day = $day GROUP BY ALL ORDER BY service""",
        {"day": day},
    ).fetch_df()
    fsx = con.execute(
        """SELECT file_system_name AS name, file_system_id,
                  round(min(value) FILTER (WHERE statistic = 'Sum') / 1e9, 1) AS min_free_gb,
                  round(min(value) FILTER (WHERE statistic = 'Minimum') / 1e9, 1) AS fullest_disk_free_gb
           FROM fsx_metrics WHERE metric = 'FreeDataStorageCapacity' AND hour LIKE $day || 'T%'
           GROUP BY ALL ORDER BY name""",
        {"day": day},
    ).fetch_df()
    con.close()
    return "\n".join(
        [
            f"Costs {day} by Project and Experiment tag (USD; lake {lake.root}). Shared GPU nodes and the",
            "file system carry no Experiment tag: their split by GPU-hours held is utilization_per_dollar's.",
            by_experiment.to_string(index=False),
            "",
            "Estimate (price table x node-hours and FSx storage-hours) vs the bill, by service (EKS and S3",
            "are not estimated: no usage series for them):",
            gap.to_string(index=False),
            "",
            "FSx free space:",
            fsx.to_string(index=False) if len(fsx) else "  no fsx_metrics rows",
        ]
    )


def weekly_summary(week: str) -> str:
    """Where the week's report is and its headline figures, from utilization_per_dollar."""
    from foxhunt_obs.lib.lake import Lake
    from foxhunt_obs.lib.schemas import UTILIZATION_PER_DOLLAR
    from foxhunt_obs.lib.settings import env

    lake = Lake(env("FOXHUNT_LAKE"))
    first, last = week, (datetime.fromisoformat(week) + timedelta(days=6)).strftime("%Y-%m-%d")
    rows = lake.query(
        """SELECT experiment, round(sum(gpu_hours), 1) AS gpu_hours, round(sum(active_gpu_hours), 1) AS active_gpu_hours,
                  round(sum(allocated_usd), 2) AS usd, round(sum(idle_usd), 2) AS idle_usd,
                  round(sum(active_gpu_hours) / nullif(sum(allocated_usd), 0), 4) AS active_gpu_hours_per_usd,
                  round(sum(allocated_usd) / nullif(sum(active_gpu_hours), 0), 2) AS usd_per_active_gpu_hour
           FROM utilization_per_dollar WHERE day >= $first AND day <= $last
           GROUP BY experiment ORDER BY experiment = '(cluster idle)', usd DESC""",
        {"first": first, "last": last},
        tables=[UTILIZATION_PER_DOLLAR],
    ).to_pandas()
    total, idle, active = rows.usd.sum(), rows.idle_usd.sum(), rows.active_gpu_hours.sum()
    path = f"{lake.root}/reports/week={week}/report.html"
    return "\n".join(
        [
            f"Weekly cost report, week of {week}: {path}",
            f"  total ${total:,.2f}, idle ${idle:,.2f} ({100 * idle / total:.1f} %), "
            f"{active / total:.4f} active GPU-hours per $, ${total / active:,.2f} per active GPU-hour",
            rows.to_string(index=False),
        ]
    )


def alerts_replay(
    info: dict, state_dir: Path, start: datetime, end: datetime, every_s: int = 600
) -> tuple[str, bool]:
    """The alert sensor's code replayed over [start, end] as if it had ticked every `every_s` seconds,
    notifying a local Alertmanager and the alerts table: what arrived, in order, and whether every
    incident the scenario injected there was found (sandbox/expected_alerts.py). The tick at `end` sees
    the last day's costs complete (a cost spike the day before resolves there)."""
    from foxhunt_obs.lib.alerts.catalog import load_rules
    from foxhunt_obs.lib.alerts.collect import Sources
    from foxhunt_obs.lib.alerts.engine import replay
    from foxhunt_obs.lib.delivery.alert_sinks import AlertmanagerSink, LakeAlertSink
    from foxhunt_obs.lib.lake import Lake
    from foxhunt_obs.lib.settings import Settings, csv_setting, env
    from foxhunt_obs.lib.sources.aws import AwsConfig
    from foxhunt_obs.lib.sources.fsx import FsxSource
    from foxhunt_obs.lib.sources.mlflow import MlflowSource
    from foxhunt_obs.lib.sources.prometheus import PrometheusClient
    from foxhunt_obs.sandbox import expected_alerts
    from foxhunt_obs.sandbox.alertmanager import AlertmanagerServer
    from foxhunt_obs.sandbox.scenario import load_scenario

    aws = AwsConfig(region_name=env("AWS_REGION"))
    lake = Lake(env("FOXHUNT_LAKE"))
    sources = Sources(
        prometheus=PrometheusClient.from_settings(Settings.from_env()),
        mlflow=MlflowSource(env("MLFLOW_TRACKING_URI")),
        fsx=FsxSource(aws.client("fsx"), aws.client("cloudwatch")),
        fsx_ids=csv_setting("FOXHUNT_FSX_IDS") or None,
        lake=lake,
    )
    scenario = load_scenario(info["scenario"])
    # the sandbox cluster's own settings (gpu_node_missing: its node count), unless FOXHUNT_ALERT_RULES says
    overrides = os.environ.get("FOXHUNT_ALERT_RULES") or expected_alerts.write_rule_overrides(
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
    if verdict.other:
        lines.append(
            "  Also fired (no injected incident; by the scenario's design): "
            + ", ".join(
                sorted({f"{n.rule} {expected_alerts.ident(n.rule, n.labels)}" for _, n in verdict.other})
            )
        )
    return "\n".join(lines), verdict.ok


def _demo(args) -> int:
    from foxhunt_obs.sandbox import prometheus as sandbox

    ensure_dagster_home()
    info = _up(args)
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
        text, found_all = alerts_replay(info, args.state_dir, day_start, end)
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


if __name__ == "__main__":
    sys.exit(main())
