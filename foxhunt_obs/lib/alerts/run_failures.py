"""Failed Dagster runs as alerts, delivered like the rule catalog's: each sink gets each failure until it
takes it, and never twice. Plain Python; the `run_failure_alert` sensor (defs/alerts/sensors.py) finds the
failed runs and keeps this module's cursor.

Why a polling sensor and not Dagster's run-failure sensor: a run-status sensor's cursor moves past a run
even when the sensor raises, so a notice a sink refused was lost; and it only sees runs launched from its
own code location, not `dagster job execute` runs. Here the cursor moves only when every sink took a
notice (or it was dropped after PENDING_MAX, loudly).

With FOXHUNT_TRACE_URL_TEMPLATE set, each notice links to the failed run's trace (its trace id is the run
id, lib/tracing.py): Slack's "Run trace", the webhook's `links.trace`, Alertmanager's `trace_url`.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone

from foxhunt_obs.lib.alerts.engine import TickReport, deliver, drop_stale, transition_key
from foxhunt_obs.lib.delivery.alert_sinks import Notification, notification_dict
from foxhunt_obs.lib.redact import scrub
from foxhunt_obs.lib.settings import default
from foxhunt_obs.lib.tracing import LinkTemplates

RULE = "dagster_run_failed"
FIRST_LOOKBACK = timedelta(hours=1)  # a sensor without a cursor reports the failures of the last hour
OVERLAP = timedelta(seconds=30)  # re-read this much before the watermark: a run committed late is seen
SEEN_MAX = 500  # run ids remembered, so the overlap never reports one twice
DESCRIPTION_MAX = 2000


@dataclass
class FailedRun:
    run_id: str
    job_name: str
    failed_at: datetime  # the run record's update time (aware UTC)
    message: str  # the run's failure, and its first failed step's error when there is one
    started_at: datetime | None = None  # the run's start (aware UTC); None: never started (the trace link
    # then opens at the failure)


@dataclass
class Cursor:
    after: datetime  # runs updated after this (less OVERLAP) are looked at
    seen: list[str] = field(default_factory=list)  # newest last
    pending: dict[str, dict] = field(default_factory=dict)  # key -> {"note", "took", "since"}

    @classmethod
    def load(cls, text: str | None, now: datetime) -> Cursor:
        if not text:
            return cls(after=now - FIRST_LOOKBACK)
        try:
            doc = json.loads(text)
            return cls(
                after=datetime.fromisoformat(doc["after"]),
                seen=list(doc.get("seen") or []),
                pending=dict(doc.get("pending") or {}),
            )
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"run_failure_alert: unreadable cursor ({exc}); reset the sensor") from None

    def dumps(self) -> str:
        doc = {"after": self.after.isoformat(), "seen": self.seen[-SEEN_MAX:], "pending": self.pending}
        return json.dumps(doc, separators=(",", ":"))


def notification(run: FailedRun, dagster_url: str, links: LinkTemplates | None = None) -> Notification:
    """The notice of one failed run; with a trace template, a link to the run's trace over its lifetime."""
    trace = (links or LinkTemplates()).run_trace(run.run_id, run.started_at or run.failed_at, run.failed_at)
    return Notification(
        rule=RULE,
        fingerprint=run.run_id,
        status="firing",
        severity="warning",
        labels={"job": run.job_name, "run_id": run.run_id},
        summary=f"Dagster run of {run.job_name} failed",
        # the failure's text as Dagster has it, scrubbed once more: a source error is, another may not be
        description=scrub(run.message or "run failed")[:DESCRIPTION_MAX],
        value=1.0,
        # to the millisecond, as notification_dict keeps it in the cursor: the same key after a reload
        starts_at=run.failed_at.replace(microsecond=run.failed_at.microsecond // 1000 * 1000),
        ends_at=None,
        generator_url=f"{dagster_url.rstrip('/')}/runs/{run.run_id}",
        links=trace,
    )


def _from_dict(d: dict) -> Notification:
    return Notification(
        rule=d["rule"],
        fingerprint=d["fingerprint"],
        status=d["status"],
        severity=d["severity"],
        labels=dict(d["labels"]),
        summary=d["summary"],
        description=d["description"],
        value=1.0 if d["value"] is None else float(d["value"]),
        starts_at=datetime.fromisoformat(d["starts_at"]),
        ends_at=None,
        generator_url=d["generator_url"],
        links=dict(d.get("links") or {}),  # kept in the cursor: a notice sent again keeps its link
    )


def tick(
    cursor: Cursor,
    failed: list[FailedRun],
    sinks: list,
    now: datetime,
    dagster_url: str = default("FOXHUNT_DAGSTER_URL"),
    budget_s: float | None = None,
    sink_budget_s: float | None = None,
    links: LinkTemplates | None = None,
) -> tuple[Cursor, TickReport]:
    """Adds the failed runs not seen before to the pending notices, sends each sink those it has not
    taken, and returns the new cursor (the watermark moved to the newest failure) and what happened.
    links: the trace URL template (AlertingResource.links()); none, no link."""
    started = time.monotonic()
    seen = list(cursor.seen)
    pending = dict(cursor.pending)
    for run in sorted(failed, key=lambda r: r.failed_at):
        if run.run_id in seen:
            continue
        seen.append(run.run_id)
        note = notification(run, dagster_url, links)
        pending[transition_key(note)] = {
            "note": notification_dict(note, now),
            "took": [],
            "since": now.isoformat(),
        }
    notes = [_from_dict(p["note"]) for p in pending.values()]
    keys = list(pending)
    took = {k: list(p["took"]) for k, p in pending.items()}

    def out_of_time() -> bool:
        return budget_s is not None and time.monotonic() - started > budget_s

    report = TickReport(evaluated={RULE}, findings=len(notes))
    report.failed, _ = deliver(
        sinks, notes, keys, took, out_of_time, budget_s, sink_budget_s, owner="run_failures"
    )
    since = {k: p["since"] for k, p in pending.items()}
    since, dropped, report.dropped = drop_stale(
        sinks, notes, keys, took, since, now, out_of_time, sink_budget_s
    )
    names = {sink.name for sink in sinks}
    report.sent = [n for n, k in zip(notes, keys) if names <= set(took[k]) and k not in dropped]
    left = {k: {**pending[k], "took": took[k]} for k in keys if k in since}
    newest = max((r.failed_at for r in failed), default=cursor.after)
    after = max(cursor.after, newest.astimezone(timezone.utc))
    return Cursor(after=after, seen=seen[-SEEN_MAX:], pending=left), report
