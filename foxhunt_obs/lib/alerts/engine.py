"""One sensor tick: evaluate the catalog, move the alert state, send each transition to every sink
until that sink took it, and re-post what still fires to Alertmanager. Plain Python: the Dagster sensor
and the scenario replay both call `tick`."""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from functools import partial
from urllib.parse import quote

from foxhunt_obs.lib import tracing
from foxhunt_obs.lib.alerts import state as alert_state
from foxhunt_obs.lib.alerts.collect import Sources, collect
from foxhunt_obs.lib.alerts.rules import Rule
from foxhunt_obs.lib.delivery.alert_sinks import AlertSink, AlertSinkError, LakeAlertSink, Notification
from foxhunt_obs.lib.settings import default

log = logging.getLogger(__name__)


@dataclass
class TickReport:
    evaluated: set[str] = field(default_factory=set)
    findings: int = 0
    sent: list[Notification] = field(default_factory=list)  # now taken by every sink
    failed: dict[str, str] = field(default_factory=dict)  # sink -> error: it gets them again next tick
    source_errors: dict[str, str] = field(default_factory=dict)
    note: str = ""  # a cursor that could not be read
    refreshed: int = 0  # firing alerts re-posted to Alertmanager
    dropped: list[str] = field(default_factory=list)  # transitions a sink refused for PENDING_MAX


LOCATION = "foxhunt_obs"  # workspace.yaml's and deploy/dagster/values.yaml's code location name
SENSOR = "alert_sensor"


def alert_page(dagster_url: str, location: str = LOCATION) -> str:
    """The alert sensor's page in the Dagster UI: an alert's link back to what raised it. The code location's
    name is the deployment's (the Helm chart's workspace names it), so the sensor passes its own; escaped as
    the UI escapes it (encodeURIComponent: `/` too)."""
    return f"{dagster_url.rstrip('/')}/locations/{quote(location, safe='')}/sensors/{SENSOR}"


def notification(
    rule: Rule, t: alert_state.Transition, page: str, links: tracing.LinkTemplates | None = None
) -> Notification:
    """`page`: alert_page's URL, which the notification links to with the rule's id."""
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
        generator_url=f"{page}?rule={quote(rule.id)}",
        links=(links or tracing.LinkTemplates()).pod_logs(t.labels, t.starts_at, t.ends_at),
    )


def transition_key(n: Notification) -> str:
    return f"{n.status}|{n.fingerprint}|{n.starts_at.isoformat()}"


PENDING_MAX = timedelta(days=3)  # a transition some sink has refused this long is dropped, loudly


def _load(cursor: str | None) -> tuple[str | None, dict[str, list[str]], dict[str, str]]:
    """The engine's cursor: the alert state plus, per transition not yet taken by every sink, the sinks
    that took it and since when it is pending. A bare state cursor (the first version) reads as one with
    nothing pending."""
    if cursor:
        try:
            doc = json.loads(cursor)
        except ValueError:
            return cursor, {}, {}
        if isinstance(doc, dict) and "state" in doc:
            took = {k: list(v) for k, v in (doc.get("took") or {}).items()}
            return doc["state"], took, dict(doc.get("pending_since") or {})
    return cursor, {}, {}


def tick(
    rules: list[Rule],
    sources: Sources,
    sinks: list[AlertSink],
    cursor: str | None,
    now: datetime,
    dagster_url: str = default("FOXHUNT_DAGSTER_URL"),
    budget_s: float | None = None,
    source_budget_s: float | None = None,
    sink_budget_s: float | None = None,
    links: tracing.LinkTemplates | None = None,
    location: str = LOCATION,
) -> tuple[str, TickReport]:
    """Returns the new cursor and what happened. Each sink gets each transition until it accepts it,
    and then never again; a transition leaves the cursor once every sink took it (a sink that is down
    gets it on a later tick, the others are not sent it twice).

    Deadlines, so the tick returns (and its cursor is saved) before the caller's own: the sources are
    read side by side for at most `source_budget_s` (a late one is not evaluated); a sink not yet tried
    `budget_s` after the tick started is left for the next tick; one sink's delivery is given up after
    `sink_budget_s` (it gets the transitions again next tick). Each notification links to the alert
    sensor's page at `dagster_url`, under the code location named `location`.

    Traced (lib/tracing.py): the tick is a span, each rule evaluated a child of it."""
    with tracing.span("alert tick", {"foxhunt.alert.at": now.isoformat()}) as span:
        page = alert_page(dagster_url, location)
        cursor, report = _tick(
            rules, sources, sinks, cursor, now, page, budget_s, source_budget_s, sink_budget_s, links
        )
        if span.is_recording():
            tracing.set_attributes(
                span,
                {
                    "foxhunt.alert.rules_evaluated": len(report.evaluated),
                    "foxhunt.alert.findings": report.findings,
                    "foxhunt.alert.notified": len(report.sent),
                },
            )
            for source, error in report.source_errors.items():  # a source not read: its rules unevaluated
                span.add_event(
                    "source not evaluated", {tracing.SOURCE: source, "message": tracing.clean(error)}
                )
            for sink, error in report.failed.items():
                span.add_event("sink refused", {"foxhunt.alert.sink": sink, "message": tracing.clean(error)})
        return cursor, report


def _tick(rules, sources, sinks, cursor, now, page, budget_s, source_budget_s, sink_budget_s, links):
    started = time.monotonic()
    state_cursor, took, pending_since = _load(cursor)
    state = alert_state.loads(state_cursor)
    report = TickReport(note=state.note or "")
    evaluation = collect(rules, sources, now, deadline_s=source_budget_s)
    report.evaluated, report.findings, report.source_errors = (
        evaluation.evaluated,
        len(evaluation.findings),
        evaluation.errors,
    )
    by_id = {r.id: r for r in rules}
    state, transitions = alert_state.step(state, evaluation.evaluated, evaluation.findings, now, rules=rules)
    notes = [notification(by_id[t.rule], t, page, links) for t in transitions]
    keys = [transition_key(n) for n in notes]
    took = {k: took.get(k, []) for k in keys}  # transitions gone from the state are forgotten
    names = [sink.name for sink in sinks]

    def out_of_time() -> bool:
        return budget_s is not None and time.monotonic() - started > budget_s

    report.failed, posted_now = deliver(sinks, notes, keys, took, out_of_time, budget_s, sink_budget_s)
    since, dropped, report.dropped = drop_stale(
        sinks, notes, keys, took, pending_since, now, out_of_time, sink_budget_s
    )
    done = [t for t, k in zip(transitions, keys) if set(names) <= set(took[k])]
    state = alert_state.acknowledge(state, done)
    report.sent = [n for n, k in zip(notes, keys) if set(names) <= set(took[k]) and k not in dropped]
    pending = {k: v for k, v in took.items() if not set(names) <= set(v)}
    if not out_of_time():
        report.refreshed = _refresh_alertmanager(
            sinks, state, by_id, took, posted_now, page, sink_budget_s, links
        )
    cursor_doc = {"state": alert_state.dumps(state), "took": pending, "pending_since": since}
    return json.dumps(cursor_doc, separators=(",", ":")), report


def deliver(
    sinks: list[AlertSink],
    notes: list[Notification],
    keys: list[str],
    took: dict[str, list[str]],
    out_of_time,
    budget_s: float | None = None,
    sink_budget_s: float | None = None,
    owner: str = "alerts",
) -> tuple[dict[str, str], set[tuple[str, str]]]:
    """Send each sink the notifications it has not taken yet (``took``: key -> sinks that took it, updated
    in place). Returns sink -> error (it gets the rest next tick) and the (sink, fingerprint) pairs taken
    now. A sink not started before ``out_of_time()`` waits for the next tick; one sink's delivery is given
    up after ``sink_budget_s``, and what it took once it ended is recorded on a later tick (``owner``:
    whose cursor holds those keys, one per sensor)."""
    failed: dict[str, str] = {}
    posted_now: set[tuple[str, str]] = set()
    for sink in sinks:
        todo = [n for n, k in zip(notes, keys) if sink.name not in took[k]]
        if not todo:
            continue
        if out_of_time():
            failed[sink.name] = f"not tried: the tick ran past its {budget_s:g} s budget"
            continue
        if (late := _BUSY.get((owner, sink.name))) is not None:
            if late.worker.is_alive():
                # its delivery of an earlier tick was given up but still runs: sending again would duplicate
                failed[sink.name] = "still delivering an earlier tick's notifications"
                continue
            del _BUSY[(owner, sink.name)]
            error, accepted = late.result[0] if late.result else ("lost", 0)
            for k in late.keys[: len(late.keys) if error is None else accepted]:  # what it took after all
                if k in took and sink.name not in took[k]:
                    took[k].append(sink.name)
            todo = [n for n, k in zip(notes, keys) if sink.name not in took[k]]
            if not todo:
                continue
        # every sink is told who took these already (the lake records it) and when to stop (a sink
        # posting one message per notification stops between two, saying how many it posted)
        sent_to = sorted({name for n in todo for name in took[transition_key(n)]} - {sink.name})
        stop = None if sink_budget_s is None else time.monotonic() + sink_budget_s * 0.8
        error, accepted = _send(
            partial(sink.send, todo, sent_to=sent_to, deadline=stop),
            sink_budget_s,
            (owner, sink.name, [transition_key(n) for n in todo]),
        )
        # a sink that posts one message per notification (Slack) may take some before it fails: those
        # are recorded as taken, so the next tick does not post them again
        for n in todo[: len(todo) if error is None else accepted]:
            took[transition_key(n)].append(sink.name)
            posted_now.add((sink.name, n.fingerprint))
        if error:
            failed[sink.name] = error
    return failed, posted_now


def drop_stale(
    sinks: list[AlertSink],
    notes: list[Notification],
    keys: list[str],
    took: dict[str, list[str]],
    pending_since: dict[str, str],
    now: datetime,
    out_of_time,
    sink_budget_s: float | None = None,
) -> tuple[dict[str, str], set[str], list[str]]:
    """A transition some sink has refused for PENDING_MAX is dropped: the cursor stays bounded, and the
    caller's log and the alerts table say so. Marks dropped ones as taken by every sink (``took``, in
    place); returns since-when each still pending one is pending, the dropped keys and what to log."""
    names = [sink.name for sink in sinks]
    since = {k: pending_since.get(k, now.isoformat()) for k in keys if not set(names) <= set(took[k])}
    dropped, messages = set(), []
    for n, k in zip(notes, keys):
        if k in since and now - datetime.fromisoformat(since[k]) > PENDING_MAX:
            refused = ", ".join(sorted(set(names) - set(took[k])))
            messages.append(f"{n.status} {n.rule} ({n.summary}): refused by {refused} since {since[k]}")
            for sink in sinks:  # a row of its own in the alerts table: where it went, and that it was dropped
                if sink.name == LakeAlertSink.name and sink.name in took[k] and not out_of_time():
                    _send(
                        lambda sink=sink, n=n, k=k: sink.send([n], sent_to=[*took[k], "dropped"]),
                        sink_budget_s,
                    )
            took[k] = list(names)
            dropped.add(k)
            since.pop(k)
    return since, dropped, messages


@dataclass
class _Late:
    """A delivery given up at its deadline that may still end: its thread, its result once it has one,
    and the keys of the transitions it carries."""

    worker: threading.Thread
    result: list
    keys: list[str]


_BUSY: dict[tuple[str, str], _Late] = {}  # (owner, sink) -> its given-up delivery


def _send(fn, timeout_s: float | None = None, late: tuple | None = None) -> tuple[str | None, int]:
    """(error or None, how many notifications from the first the sink took before its error). With
    `timeout_s`, the delivery runs in a thread of its own and is given up after that long, whatever the
    sink's socket timeouts do (a webhook dripping one byte every 2 s never trips a read timeout). `late`:
    (owner, sink, keys) to remember a given-up delivery by, so a later tick learns what it took."""
    result: list[tuple[str | None, int]] = []

    def run() -> None:
        try:
            fn()
        except AlertSinkError as exc:
            log.warning("alerts: %s", exc)
            result.append((str(exc), exc.accepted))
        except Exception as exc:  # noqa: BLE001 - one sink's failure must not stop the others
            result.append((f"{type(exc).__name__}: {exc}", 0))
        else:
            result.append((None, 0))

    if timeout_s is None:
        run()
        return result[0]
    worker = threading.Thread(target=run, name="alert-sink", daemon=True)
    worker.start()
    worker.join(timeout_s)
    if not result:  # still sending: given up; a later tick records what it took once it is done
        if late:
            owner, sink, keys = late
            _BUSY[(owner, sink)] = _Late(worker, result, keys)
        return f"no answer within the tick's {timeout_s:g} s for one sink: left for a later tick", 0
    return result[0]


def _refresh_alertmanager(
    sinks: list[AlertSink],
    state,
    by_id: dict,
    took: dict,
    posted_now: set,
    page: str,
    timeout_s: float | None,
    links: tracing.LinkTemplates | None = None,
) -> int:
    """Alertmanager expires a firing alert at its endsAt: like Prometheus, re-post every alert still
    firing that Alertmanager has taken, each tick, whatever the other sinks did (a webhook that refuses
    for good must not let Alertmanager expire a live alert). Alertmanager merges them by labels and
    notifies nobody again; a failed refresh is retried next tick and never holds back the cursor."""
    sinks = [s for s in sinks if s.name == "alertmanager"]
    taken = {k.split("|")[1] for k, v in took.items() if k.startswith("firing|") and "alertmanager" in v}
    alive = [
        a
        for a in alert_state.firing(state)
        if a.rule in by_id
        and ("alertmanager", a.fingerprint) not in posted_now
        and (a.notified == "firing" or a.fingerprint in taken)
    ]
    if not sinks or not alive:
        return 0
    notes = [
        notification(
            by_id[a.rule],
            alert_state.Transition(
                "firing", a.fingerprint, a.rule, a.labels, a.value, a.since, None, a.extra
            ),
            page,
            links,
        )
        for a in alive
    ]
    for sink in sinks:  # best effort: a failed refresh is tried again next tick
        error, _ = _send(lambda sink=sink: sink.send(notes), timeout_s)
        if error:
            return 0
    return len(notes)


def replay(
    rules: list[Rule],
    sources: Sources,
    sinks: list[AlertSink],
    start: datetime,
    end: datetime,
    every_s: float = 300,
    dagster_url: str = default("FOXHUNT_DAGSTER_URL"),
    cursor: str | None = None,
    before_tick: Callable[[datetime], object] | None = None,
) -> tuple[list[tuple[datetime, Notification]], str | None]:
    """Ticks from start to end (exclusive) as if the sensor had run every `every_s` seconds back then:
    the sandbox's history through the same code the sensor runs. `before_tick(now)` sets up what has no
    history of its own (the sandbox's running EC2 instances) before each tick. Returns every notification
    sent (with its tick) and the cursor, to go on from there."""
    sent, now = [], start
    while now < end:
        if before_tick is not None:
            before_tick(now)
        cursor, report = tick(rules, sources, sinks, cursor, now, dagster_url)
        if report.source_errors:
            raise RuntimeError(f"alert replay at {now:%Y-%m-%dT%H:%M}Z: {report.source_errors}")
        sent += [(now, n) for n in report.sent]
        now += timedelta(seconds=every_s)
    return sent, cursor
