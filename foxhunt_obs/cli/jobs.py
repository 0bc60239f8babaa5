"""Dagster runs over partition ranges (recorded in DAGSTER_HOME's instance, so they show in the UI) and
the Prometheus rules export."""

from __future__ import annotations

import os
import sys
from pathlib import Path


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


def export_rules(out: Path) -> list[Path]:
    """The recording rules, the live cost rules (the price table of FOXHUNT_PRICE_REGION) and the alerting
    rules (alert_rules.yaml's enabled rules with promql, as overridden by FOXHUNT_ALERT_RULES), each as a
    Prometheus rules file and as a PrometheusRule (prometheus-operator)."""

    import foxhunt_obs.cli.config as config
    from foxhunt_obs.lib.alerts import prometheus_rules as alerting
    from foxhunt_obs.lib.alerts.prometheus_rules import prometheus_rule
    from foxhunt_obs.lib.alerts.rules import load_rules
    from foxhunt_obs.lib.analysis.prices import load_price_table
    from foxhunt_obs.lib.ingest.cost_rules import MODEL as COST_MODEL
    from foxhunt_obs.lib.ingest.cost_rules import cost_rules
    from foxhunt_obs.lib.ingest.metric_catalog import load_catalog
    from foxhunt_obs.lib.ingest.mig import model_slices
    from foxhunt_obs.lib.ingest.recording_rules import recording_rules, render

    cluster, catalog = config.cluster(), load_catalog()
    rules = recording_rules(catalog, cluster.node_labels, cluster.exporter_containers)
    costs = cost_rules(
        load_price_table(config.price_region()), catalog, cluster.experiment_label, model_slices()
    )
    priced = "foxhunt_obs/data/prices.yaml, mig_profiles.yaml and metric_catalog.yaml"
    alerts = alerting.alerting_rules(load_rules(overrides=config.alerting().rules_file))
    out.mkdir(parents=True, exist_ok=True)
    files = {
        out / "foxhunt-recording-rules.yaml": render(rules),
        out / "foxhunt-recording-rules.prometheusrule.yaml": render(
            prometheus_rule(rules, "foxhunt-recording-rules")
        ),
        out / "foxhunt-cost-rules.yaml": render(costs, priced, COST_MODEL),
        out / "foxhunt-cost-rules.prometheusrule.yaml": render(
            prometheus_rule(costs, "foxhunt-cost-rules"), priced, COST_MODEL
        ),
        out / "foxhunt-rules.yaml": alerting.render(alerts),
        out / "foxhunt-rules.prometheusrule.yaml": alerting.render(alerting.prometheus_rule(alerts)),
    }
    for path, text in files.items():
        path.write_text(text)
    return list(files)
