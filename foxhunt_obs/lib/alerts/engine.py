"""One sensor tick: evaluate the catalog, move the alert state, send each transition to every sink
until that sink took it, and re-post what still fires to Alertmanager. Plain Python: the Dagster sensor
and the scenario replay both call `tick`."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from urllib.parse import quote

from foxhunt_obs.lib.alerts import state as alert_state
from foxhunt_obs.lib.alerts.catalog import Rule
from foxhunt_obs.lib.alerts.collect import Sources, collect
from foxhunt_obs.lib.delivery.alert_sinks import LakeAlertSink, Notification, deliver_all


@dataclass
class TickReport:
    evaluated: set[str] = field(default_factory=set)
    findings: int = 0
    sent: list[Notification] = field(default_factory=list)  # now taken by every sink
    failed: dict[str, str] = field(default_factory=dict)  # sink -> error: it gets them again next tick
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


def _key(n: Notification) -> str:
    return f"{n.status}|{n.fingerprint}|{n.starts_at.isoformat()}"


def _load(cursor: str | None) -> tuple[str | None, dict[str, list[str]]]:
    """The engine's cursor: the alert state plus, per transition not yet taken by every sink, the sinks
    that took it. A bare state cursor (the first version) reads as one with nothing pending."""
    if cursor:
        try:
            doc = json.loads(cursor)
        except ValueError:
            return cursor, {}
        if isinstance(doc, dict) and "state" in doc:
            return doc["state"], {k: list(v) for k, v in (doc.get("took") or {}).items()}
    return cursor, {}


def tick(
    rules: list[Rule],
    sources: Sources,
    sinks: list,
    cursor: str | None,
    now: datetime,
    dagster_url: str = "http://127.0.0.1:3000",
    budget_s: float | None = None,
) -> tuple[str, TickReport]:
    """Returns the new cursor and what happened. Each sink gets each transition until it accepts it,
    and then never again; a transition leaves the cursor once every sink took it (a sink that is down
    gets it on a later tick, the others are not sent it twice). With `budget_s`, a sink not yet tried
    when the tick has run that long is left for the next tick: the cursor must be returned (and saved)
    before the caller's own deadline, or sinks that took a transition would be sent it again."""
    started = time.monotonic()
    state_cursor, took = _load(cursor)
    state = alert_state.loads(state_cursor)
    report = TickReport(note=state.note or "")
    evaluation = collect(rules, sources, now)
    report.evaluated, report.findings, report.source_errors = (
        evaluation.evaluated,
        len(evaluation.findings),
        evaluation.errors,
    )
    by_id = {r.id: r for r in rules}
    state, transitions = alert_state.step(state, evaluation.evaluated, evaluation.findings, now, rules=rules)
    notes = [notification(by_id[t.rule], t, dagster_url) for t in transitions]
    keys = [_key(n) for n in notes]
    took = {k: took.get(k, []) for k in keys}  # transitions gone from the state are forgotten
    names = [sink.name for sink in sinks]

    def out_of_time() -> bool:
        return budget_s is not None and time.monotonic() - started > budget_s

    for sink in sinks:
        todo = [n for n, k in zip(notes, keys) if sink.name not in took[k]]
        if not todo:
            continue
        if out_of_time():
            report.failed[sink.name] = f"not tried: the tick ran past its {budget_s:g} s budget"
            continue
        if isinstance(sink, LakeAlertSink):  # the table records where each transition went
            sent_to = sorted({name for n in todo for name in took[_key(n)]} - {sink.name})
            error = _send(lambda sink=sink, todo=todo, sent_to=sent_to: sink.send(todo, sent_to=sent_to))
        else:
            error = deliver_all([sink], todo)[sink.name]
        if error:
            report.failed[sink.name] = error
            continue
        for n in todo:
            took[_key(n)].append(sink.name)
    done = [t for t, k in zip(transitions, keys) if set(names) <= set(took[k])]
    state = alert_state.acknowledge(state, done)
    report.sent = [n for n, k in zip(notes, keys) if set(names) <= set(took[k])]
    if not out_of_time():
        report.refreshed = _refresh_alertmanager(sinks, state, by_id, report.sent, dagster_url)
    pending = {k: v for k, v in took.items() if not set(names) <= set(v)}
    return json.dumps({"state": alert_state.dumps(state), "took": pending}, separators=(",", ":")), report


def _send(fn) -> str | None:
    try:
        fn()
    except Exception as exc:  # noqa: BLE001 - one sink's failure must not stop the others
        return f"{type(exc).__name__}: {exc}"
    return None


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
