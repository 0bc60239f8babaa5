"""Dagster runs over partition ranges (recorded in DAGSTER_HOME's instance, so they show in the UI) and
the Prometheus rules export."""

from __future__ import annotations

import functools
import multiprocessing
import os
import sys
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path


def ensure_dagster_home() -> Path:
    home = Path(os.environ.setdefault("DAGSTER_HOME", str(Path(".foxhunt/dagster_home").resolve())))
    home.mkdir(parents=True, exist_ok=True)
    (home / "dagster.yaml").touch()
    return home


@functools.cache
def _defs():
    """The code location, loaded once per process (a forked worker inherits it loaded)."""
    from foxhunt_obs.definitions import defs

    return defs()


def run_job(job_name: str, first: str, last: str) -> bool:
    """One Dagster run of `job_name` over partitions first..last, recorded in DAGSTER_HOME's instance."""
    ok, line, errors = execute(job_name, first, last)
    print(line)
    for error in errors:
        print(error, file=sys.stderr)
    return ok


def execute(job_name: str, first: str, last: str) -> tuple[bool, str, list[str]]:
    """run_job's run: whether it succeeded, its one-line status and its failed steps' messages."""
    import dagster as dg

    ensure_dagster_home()
    job = _defs().resolve_job_def(job_name)
    with dg.DagsterInstance.get() as instance:
        result = job.execute_in_process(
            instance=instance,
            # the run's full event log is in the UI; the terminal gets warnings and our one-line status
            run_config={"loggers": {"console": {"config": {"log_level": "WARNING"}}}},
            tags={"dagster/asset_partition_range_start": first, "dagster/asset_partition_range_end": last},
            raise_on_error=False,
        )
    status = "succeeded" if result.success else "FAILED"
    errors = [
        f"  {event.step_key}: {event.step_failure_data.error.message.strip()}"
        for event in result.all_events
        if event.is_step_failure
    ]
    return result.success, f"{job_name} {first}...{last}: run {result.run_id} {status}", errors


@dataclass(frozen=True)
class JobPlan:
    """A job over first..last as a backfill would run it: its runs' partition ranges (at most its assets'
    BackfillPolicy.max_partitions_per_run partitions each; one run for single_run), and the jobs of the
    same plan it must wait for (they materialize assets its assets read)."""

    job: str
    first: str
    last: str
    runs: tuple[tuple[str, str], ...]
    partitions: int
    after: frozenset[str]


def plan_jobs(jobs: list[tuple[str, str, str]]) -> list[JobPlan]:
    """(job, first, last) in order -> their plans, from the code location's asset graph."""
    import dagster as dg

    graph = _defs().resolve_asset_graph()
    selected = {job: _defs().resolve_job_def(job).asset_layer.selected_asset_keys for job, _, _ in jobs}
    plans = []
    for job, first, last in jobs:
        keys = selected[job]
        parents = set().union(*(graph.get(k).parent_keys for k in keys)) - set(keys)
        after = frozenset(j for j, _, _ in jobs if j != job and parents & set(selected[j]))
        partitioned = _defs().resolve_job_def(job).partitions_def
        pkeys = (
            partitioned.get_partition_keys_in_range(dg.PartitionKeyRange(first, last))
            if partitioned
            else [first]
        )
        limits = [
            graph.get(k).backfill_policy.max_partitions_per_run or len(pkeys)
            for k in keys
            if graph.get(k).backfill_policy
        ]
        size = min(limits, default=len(pkeys))
        runs = tuple((pkeys[i], pkeys[min(i + size, len(pkeys)) - 1]) for i in range(0, len(pkeys), size))
        plans.append(JobPlan(job, first, last, runs, len(pkeys), after))
    return plans


@dataclass(frozen=True)
class Step:
    """Work for a worker process: ``fn(*args)`` (module-level, so it pickles) returning (ok, payload).
    It belongs to ``group`` (a job: its runs complete it together) and starts once every group of
    ``after`` has completed; ``partitions``: how far it takes its group."""

    group: str
    fn: Callable
    args: tuple
    after: frozenset[str] = frozenset()
    partitions: int = 0


def job_steps(plans: list[JobPlan]) -> list[Step]:
    """Each plan's runs as steps; a step's payload is its run's status line and failed steps."""
    return [
        Step(p.job, _job_step, (p.job, first, last), p.after, _count(p, first, last))
        for p in plans
        for first, last in p.runs
    ]


def _job_step(job_name: str, first: str, last: str) -> tuple[bool, tuple[str, list[str]]]:
    ok, line, errors = execute(job_name, first, last)
    return ok, (line, errors)


def _count(plan: JobPlan, first: str, last: str) -> int:
    if len(plan.runs) == 1:
        return plan.partitions
    import dagster as dg

    partitions_def = _defs().resolve_job_def(plan.job).partitions_def
    return len(partitions_def.get_partition_keys_in_range(dg.PartitionKeyRange(first, last)))


def workers() -> int:
    """Runs at a time: one per core, at most 4 (each run's Prometheus queries need a core too)."""
    return max(1, min(4, os.cpu_count() or 1))


def run_steps(
    steps: list[Step],
    max_workers: int | None = None,
    on_step_done: Callable[[Step, bool, object], None] | None = None,
) -> tuple[bool, dict[str, list]]:
    """The steps in worker processes, ``max_workers`` at a time (default ``workers()``): whenever a worker
    is free, the first step in the list whose groups to wait for have completed and none of whose group
    runs (two runs of one job at once would each read the other's materializations as the newest, and
    Dagster warns "Data version mismatch" and tracks provenance from them). A failed step (ok False,
    or an exception: its text is the payload) stops new ones from starting. Returns whether every step
    ran and succeeded, and each group's payloads in the order of its steps; ``on_step_done(step, ok,
    payload)`` as each step ends (the caller's progress line)."""
    max_workers = max_workers or workers()
    prepare_instance()  # before the workers, which would race to create its storage
    pending, running = list(range(len(steps))), {}
    payloads: dict[int, object] = {}
    left = {s.group: sum(1 for t in steps if t.group == s.group) for s in steps}
    completed: set[str] = set()
    ok = True
    # fork: a worker starts with the code location already loaded (spawn would import it again, ~5 s)
    context = multiprocessing.get_context("fork" if sys.platform != "win32" else "spawn")
    with ProcessPoolExecutor(max_workers, mp_context=context) as pool:
        while running or (ok and pending):
            while ok and len(running) < max_workers:
                busy = {steps[m].group for m in running.values()}
                ready = next(
                    (n for n in pending if steps[n].after <= completed and steps[n].group not in busy), None
                )
                if ready is None:
                    break
                pending.remove(ready)
                running[pool.submit(steps[ready].fn, *steps[ready].args)] = ready
            if not running:
                break  # what is left waits for a group that cannot complete
            finished, _ = wait(running, return_when=FIRST_COMPLETED)
            for future in finished:
                n = running.pop(future)
                step = steps[n]
                try:
                    step_ok, payloads[n] = future.result()
                except Exception as exc:  # noqa: BLE001 - reported as the step's failure, the others end
                    step_ok, payloads[n] = False, f"{step.group}: {type(exc).__name__}: {exc}"
                ok = ok and step_ok
                left[step.group] -= 1
                if step_ok and not left[step.group]:
                    completed.add(step.group)
                if on_step_done:
                    on_step_done(step, step_ok, payloads[n])
    groups = {s.group: _of(steps, payloads, s.group) for s in steps}
    return ok and not pending, groups


def prepare_instance() -> None:
    """DAGSTER_HOME's instance opened once here: a fresh one creates its SQLite storage then."""
    import dagster as dg

    ensure_dagster_home()
    with dg.DagsterInstance.get() as instance:
        instance.get_runs(limit=1)


def _of(steps: list[Step], payloads: dict[int, object], group: str) -> list:
    return [payloads[n] for n, s in enumerate(steps) if s.group == group and n in payloads]


def export_rules(out: Path) -> list[Path]:
    """The recording rules, the live cost rules (the price table of FOXHUNT_PRICE_REGION) and the alerting
    rules (alert_rules.yaml's enabled rules with promql, as overridden by FOXHUNT_ALERT_RULES), each as a
    Prometheus rules file and as a PrometheusRule (prometheus-operator), by one renderer (lib/rule_files.py)."""

    import foxhunt_obs.cli.config as config
    from foxhunt_obs.lib.alerts import prometheus_rules as alerting
    from foxhunt_obs.lib.alerts.rules import load_rules
    from foxhunt_obs.lib.analysis.prices import load_price_table
    from foxhunt_obs.lib.ingest import cost_rules, recording_rules
    from foxhunt_obs.lib.ingest.metric_catalog import load_catalog
    from foxhunt_obs.lib.ingest.mig import model_slices
    from foxhunt_obs.lib.rule_files import rule_files, write_rule_files

    cluster, catalog = config.cluster(), load_catalog()
    recording = recording_rules.recording_rules(catalog, cluster.node_labels, cluster.exporter_containers)
    costs = cost_rules.cost_rules(
        load_price_table(config.price_region()), catalog, cluster.experiment_label, model_slices()
    )
    alerts = alerting.alerting_rules(load_rules(overrides=config.alerting().rules_file))
    files = {
        **rule_files(recording, "foxhunt-recording-rules", "foxhunt-recording-rules", recording_rules.SOURCE),
        **rule_files(costs, "foxhunt-cost-rules", "foxhunt-cost-rules", cost_rules.SOURCE, cost_rules.MODEL),
        **rule_files(alerts, "foxhunt-rules", alerting.MANIFEST, alerting.SOURCE),
    }
    return write_rule_files(out, files)
