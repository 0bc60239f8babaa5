"""One evaluation of the rule catalog: read each source as of `now`, run every enabled rule, and return
what fired. Live, `now` is the tick's time; replaying a scenario, it walks through the past, so every
read is "as of now" (Prometheus instant queries at `now`, MLflow points logged up to `now`, CloudWatch
points of the minutes before `now`, lake partitions up to `now`'s day).

A source that cannot be read leaves its rules unevaluated: their alerts keep their state (no resolve on
missing data) and the error is returned for the sensor's log.
"""

from __future__ import annotations

import contextvars
import dataclasses
import inspect
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from functools import partial

import pandas as pd

from foxhunt_obs.lib import tracing
from foxhunt_obs.lib.alerts.evaluate import EVALUATORS, Finding, from_vector, mlflow_keys
from foxhunt_obs.lib.alerts.rules import Rule
from foxhunt_obs.lib.redact import scrub
from foxhunt_obs.lib.side_by_side import side_by_side

MLFLOW_LOOKBACK = timedelta(hours=24)  # enough points for the robust windows of the training rules
FSX_LOOKBACK = timedelta(minutes=30)  # the fsx rule's `for` (10 min) and CloudWatch's lateness
COST_LOOKBACK_DAYS = 21


@dataclass
class Sources:
    """Whatever is configured; None means the source is not there (its rules are skipped)."""

    prometheus: object | None = None  # lib.sources.prometheus.PrometheusClient
    mlflow: object | None = None  # lib.sources.mlflow.MlflowSource
    fsx: object | None = None  # lib.sources.fsx.FsxSource
    fsx_ids: list[str] | None = None
    lake: object | None = None  # lib.lake.Lake
    ec2: object | None = None  # lib.ingest.untracked.UntrackedSpend


@dataclass
class Evaluation:
    evaluated: set[str] = field(default_factory=set)  # rule ids evaluated this tick
    findings: list[Finding] = field(default_factory=list)
    errors: dict[str, str] = field(default_factory=dict)  # source -> what went wrong


def collect(
    rules: list[Rule], sources: Sources, now: datetime, deadline_s: float | None = None
) -> Evaluation:
    """Every source's rules, the sources read side by side. With `deadline_s`, a source that has not
    answered by then is "not evaluated" (its alerts keep their state) and the others' findings stand: a
    hanging MLflow must not hold back a GPU that overheats. The late source's thread is left to finish
    on its own client timeouts (a daemon thread, its result ignored), and the source is not read again
    while it runs."""
    enabled = [r for r in rules if r.enabled]
    readers: dict[str, Callable[[list[Rule], Evaluation], None]] = {
        "prometheus": lambda rs, ev: _prometheus(rs, sources, now, ev),
        "mlflow": lambda rs, ev: _frame_rules(rs, _frame("mlflow", _mlflow_frame, sources, now), now, ev),
        "cloudwatch": lambda rs, ev: _frame_rules(
            rs, _frame("cloudwatch", _fsx_frame, sources, now), now, ev
        ),
        "lake": lambda rs, ev: _lake_rules(rs, sources, now, ev),
        "ec2": lambda rs, ev: _frame_rules(
            rs, _frame("ec2", lambda s, t: s.ec2.frame(t), sources, now), now, ev
        ),
    }
    work = {}
    for source, read in readers.items():
        mine = [r for r in enabled if r.source == source]
        if mine and getattr(sources, "fsx" if source == "cloudwatch" else source) is not None:
            work[source] = (read, mine)
    out = Evaluation()
    if not work:
        return out
    # daemon threads: a hung read must not keep the process from exiting; a source whose read of an
    # earlier tick still runs is not read again (one stuck thread per source at most)
    results: dict[str, tuple[Evaluation, str]] = {}
    threads = {}
    for source, (read, mine) in work.items():
        if (earlier := _RUNNING.get(source)) is not None and earlier.is_alive():
            out.errors[source] = "its read of an earlier tick has not answered yet"
            continue
        # in a copy of the caller's context: the rules' spans hang under the tick's (lib/tracing.py)
        threads[source] = _RUNNING[source] = threading.Thread(
            target=contextvars.copy_context().run,
            args=(_read, read, mine, results, source),
            name=f"alert-source-{source}",
            daemon=True,
        )
        threads[source].start()
    end = None if deadline_s is None else time.monotonic() + deadline_s
    for source, thread in threads.items():
        thread.join(None if end is None else max(0.0, end - time.monotonic()))
        if source not in results:
            out.errors[source] = f"no answer within the tick's {deadline_s:g} s for reading sources"
            continue
        part, error = results[source]
        if error:
            out.errors[source] = error
        else:
            out.evaluated |= part.evaluated
            out.findings += part.findings
            out.errors.update(part.errors)  # a rule of the source that could not be evaluated
    return out


_RUNNING: dict[str, threading.Thread] = {}  # source -> the thread reading it, kept across ticks


def _read(read, rules: list[Rule], results: dict, source: str) -> None:
    part = Evaluation()
    try:
        read(rules, part)
    except Exception as e:  # noqa: BLE001 - a source down must not stop the others
        results[source] = (part, scrub(f"{type(e).__name__}: {e}"))
        return
    results[source] = (part, "")


# Values a summary names that are no label of the rule's result; the exported Prometheus rules compute
# the same with a template query (lib/alerts/prometheus_rules.DERIVED).
GPUS_PER_POD = 'count by (namespace, pod) (foxhunt:gpu_util:ratio{pod!=""})'


def _rule_span(rule: Rule):
    """One span per rule evaluated, a child of the tick's (its source's requests under it)."""
    return tracing.span(
        f"alert rule {rule.id}",
        {"foxhunt.alert.rule": rule.id, tracing.SOURCE: rule.source, "foxhunt.alert.severity": rule.severity},
    )


def _frame(source: str, read, sources: Sources, now: datetime) -> pd.DataFrame:
    """A source's frame, read once for all its rules, in a span of its own."""
    with tracing.span(f"alert source {source}", {tracing.SOURCE: source}) as span:
        frame = read(sources, now)
        tracing.set_attributes(span, {tracing.ROWS: len(frame)})
        return frame


def _prometheus(rules: list[Rule], sources: Sources, now: datetime, out: Evaluation) -> None:
    """Every Prometheus rule's query at `now`, the client's queries_at_once side by side (Prometheus
    evaluates each query on one core: one after another, a 1,024-GPU tick waits on every rule in turn,
    bench/sensors.py); the findings in the catalog's order, as one after another. A rule whose query
    fails fails the source."""
    client, at = sources.prometheus, now.timestamp()
    gpus_lock, gpus = threading.Lock(), []  # GPUS_PER_POD's answer, asked once, by the first rule needing it

    def gpus_per_pod() -> dict[tuple[str, str], float]:
        with gpus_lock:
            if not gpus:
                gpus.append(
                    {
                        (m.get("namespace", ""), m.get("pod", "")): int(v)
                        for m, v in client.query(GPUS_PER_POD, at, what="GPUs per pod")
                    }
                )
            return gpus[0]

    def evaluate(rule: Rule) -> list[Finding]:
        with _rule_span(rule) as span:
            samples = client.query(rule.expr(), at, what=f"alert rule {rule.id}")
            vector = [{"metric": labels, "value": [at, str(value)]} for labels, value in samples]
            findings = from_vector(rule, vector, now)
            if findings and "{gpus" in rule.summary + rule.description:
                per_pod = gpus_per_pod()
                for f in findings:
                    f.extra.setdefault(
                        "gpus", per_pod.get((f.labels.get("namespace", ""), f.labels.get("pod", "")), 0)
                    )
            tracing.set_attributes(span, {"foxhunt.alert.findings": len(findings)})
        return findings

    if len(rules) <= 1:
        results = [evaluate(rule) for rule in rules]
    else:
        results = side_by_side(
            [partial(evaluate, rule) for rule in rules], client.queries_at_once, "alert-prometheus"
        )
    for rule, findings in zip(rules, results):
        out.findings += findings
        out.evaluated.add(rule.id)


def _frame_rules(rules: list[Rule], frame: pd.DataFrame, now: datetime, out: Evaluation) -> None:
    for rule in rules:
        with _rule_span(rule) as span:
            findings = _call(rule, frame, now)
            tracing.set_attributes(span, {"foxhunt.alert.findings": len(findings)})
        out.findings += findings
        out.evaluated.add(rule.id)


def _call(rule: Rule, frame: pd.DataFrame, now: datetime) -> list[Finding]:
    fn = EVALUATORS[rule.id]
    takes_now = len(inspect.signature(fn).parameters) >= 3
    found = fn(rule, frame, now) if takes_now else fn(rule, frame)
    return [f for f in found if rule.selects(f.labels)]


def _mlflow_frame(sources: Sources, now: datetime) -> pd.DataFrame:
    """The recent points of the training rules' keys (evaluate.mlflow_keys) for runs running as of `now`
    (started, and not yet ended: a RUNNING run has no end time)."""
    runs = [
        r
        for r in sources.mlflow.runs()
        if not r.deleted
        and r.start_time is not None
        and r.start_time <= now
        and (r.end_time > now if r.end_time is not None else r.status == "RUNNING")
    ]
    keys = set(mlflow_keys())
    wanted = [dataclasses.replace(r, metric_keys=tuple(k for k in r.metric_keys if k in keys)) for r in runs]
    points = sources.mlflow.histories([r for r in wanted if r.metric_keys]).to_pandas()
    if points.empty:
        return pd.DataFrame(columns=["run_id", "run_name", "experiment", "key", "step", "ts", "value"])
    since = now - MLFLOW_LOOKBACK
    points = points[(points.ts <= pd.Timestamp(now)) & (points.ts > pd.Timestamp(since))]
    names = {r.run_id: (r.run_name, r.tags.get("experiment") or r.experiment_name) for r in runs}
    points["run_name"] = points.run_id.map(lambda i: names[i][0])
    points["experiment"] = points.run_id.map(lambda i: names[i][1])
    return points.sort_values(["run_id", "key", "ts", "step"]).reset_index(drop=True)


def _fsx_frame(sources: Sources, now: datetime) -> pd.DataFrame:
    fsx = sources.fsx
    end = now.replace(second=0, microsecond=0)
    file_systems = fsx.file_systems(sources.fsx_ids or None)
    table = fsx.metrics(file_systems, end - FSX_LOOKBACK, end, partition=f"alerts as of {now:%Y-%m-%dT%H:%M}")
    frame = table.to_pandas()
    for col in ("file_system_id", "file_system_name", "metric", "statistic"):
        frame[col] = frame[col].astype(str)
    return frame


SPEND_NOW_MAX_AGE = timedelta(hours=2)  # an older live figure is no run rate to warn on


def fresh_spend_now(lake, now: datetime, con=None) -> pd.DataFrame:
    """spend_now's newest refresh at or before `now`, if no older than SPEND_NOW_MAX_AGE (rows marked
    source 'spend_now' for budget_burn; none when the asset has not run). `con`: a connection of
    lake.connect with the spend_now view, else one of its own."""
    from foxhunt_obs.lib.schemas import SPEND_NOW

    if not lake.partitions(SPEND_NOW):
        return pd.DataFrame()
    sql = """SELECT as_of, experiment, source AS spend_source, usd_per_hour, month_usd, run_rate_usd
             FROM spend_now WHERE as_of = (SELECT max(as_of) FROM spend_now WHERE as_of <= $now AND as_of > $since)"""
    params = {"now": now, "since": now - SPEND_NOW_MAX_AGE}
    rows = (
        lake.query(sql, params, tables=[SPEND_NOW])
        if con is None
        else con.execute(sql, params).to_arrow_table()
    )
    return rows.to_pandas().assign(source="spend_now")


def _lake_rules(rules: list[Rule], sources: Sources, now: datetime, out: Evaluation) -> None:
    from foxhunt_obs.lib.schemas import BUDGETS, COSTS_DAILY, SPEND_NOW

    lake = sources.lake
    day = now.astimezone(timezone.utc).date()
    first = (day - timedelta(days=COST_LOOKBACK_DAYS)).isoformat()

    def rows(sql: str, params: dict) -> pd.DataFrame:
        return con.execute(sql, params).to_arrow_table().to_pandas()

    frames = {
        "budget_burn": lambda: pd.concat(
            [
                rows(
                    """SELECT * FROM budgets WHERE source = 'budgets' AND day = (
                         SELECT max(day) FROM budgets WHERE day <= $day)""",
                    {"day": day.isoformat()},
                ),
                fresh_spend_now(lake, now, con),
            ],
            ignore_index=True,
        ),
        # the days before today are complete: CUR where it landed, else Cost Explorer
        "cost_spike": lambda: rows(
            """WITH d AS (
                 SELECT day, project, source, sum(cost_usd) AS cost_usd FROM costs_daily
                 WHERE day >= $first AND day < $day AND source IN ('cur', 'ce') GROUP BY ALL
               ),
               best AS (SELECT day, min(source) FILTER (WHERE source = 'cur') AS cur FROM d GROUP BY day)
               SELECT CAST(d.day AS DATE) AS day, d.project, d.cost_usd FROM d JOIN best USING (day)
               WHERE d.source = coalesce(best.cur, 'ce') ORDER BY d.day, d.project""",
            {"first": first, "day": day.isoformat()},
        ),
    }
    needs = {"budget_burn": [BUDGETS, SPEND_NOW], "cost_spike": [COSTS_DAILY]}
    tables = [t for r in rules for t in needs.get(r.id, [])]
    if not tables:
        return
    # one connection for the tick's lake rules (a new one costs ~10 ms, as much as their queries), over the
    # tables the enabled rules read only: a table none of them reads cannot stop them
    con = lake.connect(tables)
    try:
        for rule in rules:
            if rule.id not in frames:
                continue
            with _rule_span(rule) as span:
                frame = frames[rule.id]()
                live = "source" in frame and bool((frame["source"] == "spend_now").any())
                if rule.id == "budget_burn" and rule.budgets and not live:
                    # live budgets without a live figure: said every tick, and their alerts keep their state
                    out.errors[f"lake ({rule.id})"] = (
                        f"live budgets {sorted(rule.budgets)} not evaluated: spend_now has no refresh in the "
                        f"{SPEND_NOW_MAX_AGE} before {now:%Y-%m-%dT%H:%M}Z (turn spend_now_schedule on)"
                    )
                    tracing.set_attributes(
                        span, {"foxhunt.alert.not_evaluated": out.errors[f"lake ({rule.id})"]}
                    )
                    continue
                findings = _call(rule, frame, now)
                tracing.set_attributes(span, {"foxhunt.alert.findings": len(findings)})
            out.findings += findings
            out.evaluated.add(rule.id)
    finally:
        con.close()
