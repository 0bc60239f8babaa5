"""One sensor tick: evaluate the catalog, move the alert state, notify the transitions, and keep only
what the sinks accepted as notified. Plain Python: the Dagster sensor and the scenario replay both
call `tick`."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from urllib.parse import quote

from foxhunt_obs.lib.alerts import state as alert_state
from foxhunt_obs.lib.alerts.catalog import Rule
from foxhunt_obs.lib.alerts.collect import Sources, collect
from foxhunt_obs.lib.delivery.alert_sinks import Notification, deliver_all


@dataclass
class TickReport:
    evaluated: set[str] = field(default_factory=set)
    findings: int = 0
    sent: list[Notification] = field(default_factory=list)  # accepted by every sink
    failed: dict[str, str] = field(default_factory=dict)  # sink -> error: to be sent again next tick
    source_errors: dict[str, str] = field(default_factory=dict)
    note: str = ""  # a cursor that could not be read
    refreshed: int = 0  # firing alerts re-posted to Alertmanager


def notification(rule: Rule, t: alert_state.Transition, dagster_url: str) -> Notification:
    values = {**t.labels, **t.extra}
    return Notification(
        rule=rule.id,
        fingerprint=t.fingerprint,
        status=t.kind,
        severity=rule.severity,
        labels={**rule.labels, **t.labels},
        summary=rule.render(rule.summary, values, t.value),
        description=rule.render(rule.description, values, t.value),
        value=t.value,
        starts_at=t.starts_at,
        ends_at=t.ends_at,
        generator_url=f"{dagster_url.rstrip('/')}/locations/foxhunt_obs/sensors/alert_sensor?rule={quote(rule.id)}",
    )


def tick(
    rules: list[Rule],
    sources: Sources,
    sinks: list,
    cursor: str | None,
    now: datetime,
    dagster_url: str = "http://127.0.0.1:3000",
) -> tuple[str, TickReport]:
    """Returns the new cursor and what happened. Transitions a sink refused stay un-notified in the
    cursor and are sent again next tick; a transition is acknowledged only when every sink took it."""
    state = alert_state.loads(cursor)
    report = TickReport(note=state.note or "")
    evaluation = collect(rules, sources, now)
    report.evaluated, report.findings, report.source_errors = (
        evaluation.evaluated,
        len(evaluation.findings),
        evaluation.errors,
    )
    by_id = {r.id: r for r in rules}
    state, transitions = alert_state.step(state, evaluation.evaluated, evaluation.findings, now, rules=rules)
    if transitions:
        notes = [notification(by_id[t.rule], t, dagster_url) for t in transitions]
        results = deliver_all(sinks, notes)
        report.failed = {name: err for name, err in results.items() if err}
        if not report.failed:
            state = alert_state.acknowledge(state, transitions)
            report.sent = notes
    report.refreshed = _refresh_alertmanager(sinks, state, by_id, report.sent, dagster_url)
    return alert_state.dumps(state), report


def _refresh_alertmanager(sinks: list, state, by_id: dict, just_sent: list, dagster_url: str) -> int:
    """Alertmanager expires a firing alert at its endsAt: like Prometheus, re-post every alert still
    firing (already notified) each tick. Alertmanager merges them by labels and notifies nobody again;
    a failed refresh is retried next tick and never holds back the cursor."""
    sinks = [s for s in sinks if getattr(s, "name", "") == "alertmanager"]
    sent = {n.fingerprint for n in just_sent}
    alive = [
        a
        for a in alert_state.firing(state)
        if a.notified == "firing" and a.fingerprint not in sent and a.rule in by_id
    ]
    if not sinks or not alive:
        return 0
    notes = [
        notification(
            by_id[a.rule],
            alert_state.Transition(
                "firing", a.fingerprint, a.rule, a.labels, a.value, a.since, None, a.extra
            ),
            dagster_url,
        )
        for a in alive
    ]
    for sink in sinks:
        try:
            sink.send(notes)
        except Exception:  # noqa: BLE001 - a refresh is best effort: the next tick tries again
            return 0
    return len(notes)


def replay(
    rules: list[Rule],
    sources: Sources,
    sinks: list,
    start: datetime,
    end: datetime,
    every_s: float = 300,
    dagster_url: str = "http://127.0.0.1:3000",
    cursor: str | None = None,
) -> tuple[list[tuple[datetime, Notification]], str | None]:
    """Ticks from start to end (exclusive) as if the sensor had run every `every_s` seconds back then:
    the sandbox's history through the same code the sensor runs. Returns every notification sent (with
    its tick) and the cursor, to go on from there."""
    sent, now = [], start
    while now < end:
        cursor, report = tick(rules, sources, sinks, cursor, now, dagster_url)
        if report.source_errors:
            raise RuntimeError(f"alert replay at {now:%Y-%m-%dT%H:%M}Z: {report.source_errors}")
        sent += [(now, n) for n in report.sent]
        now += timedelta(seconds=every_s)
    return sent, cursor
