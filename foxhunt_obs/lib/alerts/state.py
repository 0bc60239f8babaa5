"""The alert state machine a sensor keeps in its cursor (docs/design.md#alerts): notify on transitions only, and
advance the cursor only after a sink accepted them — nothing lost, nothing sent twice.

State, per alert fingerprint (`Rule.fingerprint` of the finding's labels):
  rule, labels, value, extra  the latest finding's
  status     pending  — the condition holds, not yet for the rule's `for`
             firing   — it has held for `for` (now − since ≥ for_seconds)
             resolved — it stopped holding (kept, apart from the active alerts, until a sink accepted
                        the resolve; a new finding of the same fingerprint is a new alert)
  since      when the condition started: the earliest `at` of the findings of this alert
  notified   the last status a sink accepted: None or "firing"
  ends_at    for a resolved alert, the tick that saw it gone

Transitions are derived from status vs notified, not remembered as events: a firing alert not yet
notified, and every resolved alert still in the state, is a transition on every `step` until
`acknowledge` records what a sink accepted. So the sensor's loop is

    state = loads(context.cursor)
    state, transitions = step(state, evaluated, findings, now, rules=rules)
    accepted = [t for t in transitions if sink.send(t)]
    context.update_cursor(dumps(acknowledge(state, accepted)))

A crash or a failing sink before the cursor is written re-sends the same transitions next tick (at least
once; Alertmanager deduplicates by labels); a restart from a written cursor sends nothing twice.

Missing data is not a resolve: the alerts of a rule that was not evaluated this tick (its source down)
keep their state, pending ones included. The alerts of a rule no longer in the catalog (or disabled)
resolve. A pending alert that stops holding before `for` just goes away: a condition flapping faster
than `for` never fires.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import date, datetime, timezone
from typing import Any

from foxhunt_obs.lib.alerts.evaluate import Finding, utc
from foxhunt_obs.lib.alerts.rules import Rule

log = logging.getLogger(__name__)

VERSION = 1
PENDING, FIRING, RESOLVED = "pending", "firing", "resolved"


@dataclass(frozen=True)
class Alert:
    fingerprint: str
    rule: str
    labels: dict[str, str]
    status: str  # pending | firing | resolved
    since: datetime
    value: float
    notified: str | None = None  # None | "firing"
    ends_at: datetime | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    __hash__ = None  # dict fields


@dataclass(frozen=True)
class AlertState:
    active: dict[str, Alert] = field(default_factory=dict)  # fingerprint → pending or firing alert
    resolved: tuple[Alert, ...] = ()  # resolved alerts whose resolve no sink has accepted yet
    note: str | None = None  # why loads() started from nothing (unreadable cursor, unknown version)

    __hash__ = None


@dataclass(frozen=True)
class Transition:
    """A notification to send: `kind` firing (ends_at None) or resolved (ends_at: when it was seen gone)."""

    kind: str
    fingerprint: str
    rule: str
    labels: dict[str, str]
    value: float
    starts_at: datetime
    ends_at: datetime | None
    extra: dict[str, Any] = field(default_factory=dict)

    __hash__ = None


def step(
    state: AlertState,
    rules_evaluated: Iterable[str],
    findings: Iterable[Finding],
    now: datetime,
    *,
    rules: Mapping[str, Rule] | Iterable[Rule],
) -> tuple[AlertState, list[Transition]]:
    """One tick: fold this tick's findings into the state and return it with the transitions to send.

    rules_evaluated: the ids of the rules evaluated this tick (a rule with a finding counts as evaluated);
    rules: the catalog (a mapping by id or a list): for_seconds and fingerprints come from it, and
    alerts of rules missing from it or disabled resolve. The input state is not changed."""
    now = utc(now)
    by_id = _by_id(rules)
    found: dict[str, tuple[Rule, Finding, datetime]] = {}
    for f in findings:
        rule = by_id.get(f.rule)
        if rule is None:
            continue  # a rule no longer in the catalog, or disabled
        at = min(utc(f.at), now) if f.at is not None else now
        fp = rule.fingerprint(f.labels)
        if fp in found:  # the same alert twice in one tick: the earliest start, the latest value
            at = min(at, found[fp][2])
        found[fp] = (rule, f, at)
    evaluated = set(rules_evaluated) | {f.rule for _, f, _ in found.values()}

    active: dict[str, Alert] = {}
    resolved = list(state.resolved)
    for fp, a in state.active.items():
        if fp in found:
            continue
        gone = a.rule not in by_id or a.rule in evaluated
        if not gone:
            active[fp] = a  # source not read this tick: no resolve on missing data
        elif a.status == FIRING:
            resolved.append(replace(a, status=RESOLVED, ends_at=now))
        # a pending alert that stopped holding just goes
    for fp, (rule, f, at) in found.items():
        old = state.active.get(fp)
        since = min(old.since, at) if old is not None else at
        held = (now - since).total_seconds() >= rule.for_seconds
        status = FIRING if held or (old is not None and old.status == FIRING) else PENDING
        active[fp] = Alert(
            fingerprint=fp,
            rule=rule.id,
            labels=dict(f.labels),
            status=status,
            since=since,
            value=float(f.value),
            notified=old.notified if old is not None else None,
            extra=_plain(dict(f.extra)),
        )
    new = AlertState(active=dict(sorted(active.items())), resolved=tuple(resolved))
    return new, transitions(new)


def transitions(state: AlertState) -> list[Transition]:
    """What a sink has yet to accept: every resolved alert, then every firing alert not yet notified."""
    out = [_transition(a, RESOLVED) for a in sorted(state.resolved, key=lambda a: (a.ends_at, a.fingerprint))]
    firing = [a for a in state.active.values() if a.status == FIRING and a.notified != FIRING]
    out += [_transition(a, FIRING) for a in sorted(firing, key=lambda a: (a.since, a.fingerprint))]
    return out


def acknowledge(state: AlertState, accepted: Iterable[Transition]) -> AlertState:
    """The state after a sink accepted `accepted`: firing alerts are marked notified, resolved ones
    leave. A transition that no longer matches the state (another alert of the same fingerprint, a
    different since) is ignored."""
    active = dict(state.active)
    resolved = list(state.resolved)
    for t in accepted:
        if t.kind == FIRING:
            a = active.get(t.fingerprint)
            if a is not None and a.status == FIRING and a.since == t.starts_at:
                active[t.fingerprint] = replace(a, notified=FIRING)
        elif t.kind == RESOLVED:
            resolved = [
                a for a in resolved if not (a.fingerprint == t.fingerprint and a.since == t.starts_at)
            ]
        else:
            raise ValueError(f"unknown transition kind {t.kind!r}")
    return AlertState(active=active, resolved=tuple(resolved))


def firing(state: AlertState) -> list[Alert]:
    """The alerts firing now (for sinks that want the whole picture, e.g. Alertmanager re-posts)."""
    return [a for a in state.active.values() if a.status == FIRING]


# -- the cursor --------------------------------------------------------------------------------------


def dumps(state: AlertState) -> str:
    """The state as a compact JSON cursor with a version field (strict JSON: no NaN literals)."""
    doc = {"v": VERSION, "active": [_enc(a) for a in state.active.values()]}
    if state.resolved:
        doc["resolved"] = [_enc(a) for a in state.resolved]
    return json.dumps(doc, separators=(",", ":"), sort_keys=True, allow_nan=False, ensure_ascii=False)


def loads(cursor: str | None) -> AlertState:
    """The state of a cursor; no cursor is an empty state. A cursor of another version, or one that
    cannot be read, starts fresh: the returned state's `note` says why (and it is logged as a warning).
    Starting fresh forgets what was notified: alerts still holding fire again, past `for` again."""
    if cursor is None or not str(cursor).strip():
        return AlertState()
    try:
        doc = json.loads(cursor)
    except ValueError as e:
        return _fresh(f"alert state cursor is not JSON ({e}): starting with no alert state")
    if not isinstance(doc, dict) or "v" not in doc:
        return _fresh("alert state cursor has no version field: starting with no alert state")
    if doc["v"] != VERSION:
        return _fresh(
            f"alert state cursor version {doc['v']!r} is not {VERSION} (this code's): starting with no alert state"
        )
    try:
        active = [_dec(x) for x in doc.get("active") or []]
        resolved = [_dec(x) for x in doc.get("resolved") or []]
    except (KeyError, TypeError, ValueError) as e:
        return _fresh(
            f"alert state cursor version {VERSION} is malformed ({e!r}): starting with no alert state"
        )
    return AlertState(active={a.fingerprint: a for a in active}, resolved=tuple(resolved))


# -- helpers -----------------------------------------------------------------------------------------


def _by_id(rules: Mapping[str, Rule] | Iterable[Rule]) -> dict[str, Rule]:
    items = rules.values() if isinstance(rules, Mapping) else rules
    return {r.id: r for r in items if r.enabled}


def _transition(a: Alert, kind: str) -> Transition:
    return Transition(
        kind=kind,
        fingerprint=a.fingerprint,
        rule=a.rule,
        labels=dict(a.labels),
        value=a.value,
        starts_at=a.since,
        ends_at=a.ends_at if kind == RESOLVED else None,
        extra=dict(a.extra),
    )


def _fresh(note: str) -> AlertState:
    log.warning(note)
    return AlertState(note=note)


def _plain(x: Any) -> Any:
    """extra as JSON-able values: numpy scalars → Python, times → ISO strings, ±Inf/NaN → their names."""
    if isinstance(x, Mapping):
        return {str(k): _plain(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_plain(v) for v in x]
    if x is None or isinstance(x, bool | str):
        return x
    if isinstance(x, datetime):
        return utc(x).isoformat()
    if isinstance(x, date):
        return x.isoformat()
    if hasattr(x, "item"):  # numpy scalar
        x = x.item()
    if isinstance(x, int):
        return x
    if isinstance(x, float):
        return x if math.isfinite(x) else _num(x)
    return str(x)


def _num(x: float) -> float | str:
    if math.isnan(x):
        return "NaN"
    if math.isinf(x):
        return "+Inf" if x > 0 else "-Inf"
    return x


def _t(s: str | None) -> datetime | None:
    if s is None:
        return None
    t = datetime.fromisoformat(s)
    return t if t.tzinfo is not None else t.replace(tzinfo=timezone.utc)


def _enc(a: Alert) -> dict[str, Any]:
    d: dict[str, Any] = {
        "fp": a.fingerprint,
        "rule": a.rule,
        "labels": a.labels,
        "status": a.status,
        "since": a.since.isoformat(),
        "value": _num(a.value),
    }
    if a.notified is not None:
        d["notified"] = a.notified
    if a.ends_at is not None:
        d["ends_at"] = a.ends_at.isoformat()
    if a.extra:
        d["extra"] = a.extra
    return d


def _dec(d: Mapping[str, Any]) -> Alert:
    status = d["status"]
    if status not in (PENDING, FIRING, RESOLVED):
        raise ValueError(f"unknown status {status!r}")
    labels = d.get("labels") or {}
    if not isinstance(labels, dict):
        raise TypeError("labels must be a mapping")
    return Alert(
        fingerprint=str(d["fp"]),
        rule=str(d["rule"]),
        labels={str(k): str(v) for k, v in labels.items()},
        status=status,
        since=_t(d["since"]),
        value=float(d["value"]),  # float("NaN"), float("+Inf") read the names back
        notified=d.get("notified"),
        ends_at=_t(d.get("ends_at")),
        extra=dict(d.get("extra") or {}),
    )
