"""Where alert notifications go: Alertmanager's v2 API, Slack, a signed JSON webhook, and the ``alerts`` lake
table. The alert sensors hand every firing/resolved *transition* to each sink (lib/alerts/engine.py), and
``deliver_all`` tries every configured sink in order, saying which accepted.

Every sink is an ``AlertSink``: ``name``, ``target`` (its URL or channel, credentials cut out) and ``send``,
which returns once the sink took all the notifications or raises ``AlertSinkError`` (never holding a
secret). What each sink sends and why: docs/operating/alerts.md; the webhook's payload, headers, signature,
retries and idempotency are a contract for receivers: docs/contracts/webhook.md.
"""

from __future__ import annotations

import fcntl
import hashlib
import hmac
import json
import logging
import math
import os
import re
import tempfile
import time
import urllib.parse
from collections.abc import Callable, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta, timezone
from typing import Protocol

import pyarrow as pa
import requests
from slack_sdk import WebClient

from foxhunt_obs.lib.delivery.errors import failure_text, scrub_secrets
from foxhunt_obs.lib.delivery.slack_client import slack_error_text
from foxhunt_obs.lib.errors import InputError
from foxhunt_obs.lib.lake import Lake, LakeError
from foxhunt_obs.lib.redact import mask_path_tokens, remember
from foxhunt_obs.lib.schemas import ALERTS

log = logging.getLogger(__name__)

FIRING = "firing"
RESOLVED = "resolved"
TIMEOUT = (3.05, 10.0)  # seconds: connect, read (one HTTP request)
RETRIES = 2  # extra attempts after a connection error, a timeout or a 5xx
BACKOFF_S = 0.5  # before retry n: BACKOFF_S * 2**(n-1)
FIRING_TTL = timedelta(hours=24)  # a firing alert's endsAt in Alertmanager: now + this
WEBHOOK_VERSION = 1
USER_AGENT = "foxhunt-obs alert sink"
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


@dataclass(frozen=True)
class Notification:
    """One alert transition, as the sensors hand it over."""

    rule: str
    fingerprint: str
    status: str  # "firing" | "resolved"
    severity: str
    labels: dict[str, str]
    summary: str
    description: str
    value: float
    starts_at: datetime
    ends_at: datetime | None  # set when resolved
    generator_url: str  # a link into the Dagster UI
    # {"logs": url, "trace": url}: the pod's logs, the run's trace (lib/tracing.LinkTemplates); {} when unset
    links: dict[str, str] = field(default_factory=dict)


class AlertSinkError(InputError, RuntimeError):
    """A sink did not accept the notifications. The message names the sink and its target (URL without
    credentials or query, or the channel) and never holds a secret."""

    def __init__(self, sink: str, target: str, message: str, accepted: int = 0):
        self.sink = sink
        self.target = target
        self.accepted = accepted  # how many of the notifications, from the first, it did take
        super().__init__(f"{sink} {target}: {message}")


class AlertSink(Protocol):
    """What every sink is: the engine and ``deliver_all`` call each one the same way."""

    name: str  # "alertmanager", "slack", "webhook", "lake": what the cursor records as having taken one
    target: str  # its URL or channel, credentials cut out

    def send(
        self,
        notifications: Sequence[Notification],
        *,
        sent_to: Sequence[str] = (),
        deadline: float | None = None,
    ) -> None:
        """Deliver ``notifications``; return when the sink took all of them, else raise AlertSinkError
        (its ``accepted``: how many, from the first, it did take). ``sent_to``: the sinks that took them
        already (the lake records them in the table). ``deadline``: a ``time.monotonic()`` time after which
        a sink that sends one message per notification (Slack) sends no further one and says how many it
        sent, so none is sent twice. A sink ignores what it has no use for."""
        ...


# -- helpers -------------------------------------------------------------------------------------------------
def _utc(t: datetime) -> datetime:
    """Aware UTC (a naive datetime is taken as UTC, as everywhere in foxhunt_obs)."""
    return t.replace(tzinfo=timezone.utc) if t.tzinfo is None else t.astimezone(timezone.utc)


def _iso(t: datetime) -> str:
    return _utc(t).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _ms(t: datetime) -> int:
    return (_utc(t) - _EPOCH) // timedelta(milliseconds=1)


def _check(notifications: Sequence[Notification]) -> None:
    for n in notifications:
        if n.status not in (FIRING, RESOLVED):
            raise ValueError(
                f"alert {n.rule} {n.fingerprint}: status must be firing or resolved, got {n.status!r}"
            )


def _ends(n: Notification, now: datetime) -> datetime:
    """A resolved notification's end, never before its start (a missing ends_at: now)."""
    return max(_utc(n.ends_at or now), _utc(n.starts_at))


def transition_time(n: Notification, now: datetime | None = None) -> datetime:
    """When the transition happened: the start of a firing alert, the end of a resolved one."""
    return _utc(n.starts_at) if n.status == FIRING else _ends(n, now or datetime.now(timezone.utc))


def display_url(url: str) -> str:
    """The URL as errors and logs show it: no user:password@, no query or fragment, token-like path
    segments masked (they may hold tokens)."""
    parts = urllib.parse.urlsplit(url)
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    try:
        port = parts.port
    except ValueError:
        port = None
    netloc = f"{host}:{port}" if port else host
    return urllib.parse.urlunsplit((parts.scheme, netloc, mask_path_tokens(parts.path), "", ""))


def _http_url(sink: str, url: str, what: str = "the URL") -> str:
    url = url.strip()
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise AlertSinkError(sink, display_url(url) or "(none)", f"{what} must be an http(s) URL")
    return url


def _url_secrets(url: str) -> tuple[str, ...]:
    """What of a URL must not be shown: the password of user:password@, the query (it may hold a token)."""
    parts = urllib.parse.urlsplit(url)
    return tuple(s for s in (parts.password and urllib.parse.unquote(parts.password), parts.query) if s)


def notification_dict(n: Notification, now: datetime | None = None) -> dict:
    """A notification as JSON-ready values (ISO 8601 UTC times; a non-finite value as null; a resolved
    one's ends_at never before its starts_at, ``now`` when missing)."""
    value = float(n.value) if n.value is not None else None
    return {
        "rule": n.rule,
        "fingerprint": n.fingerprint,
        "status": n.status,
        "severity": n.severity,
        "labels": {str(k): str(v) for k, v in sorted(n.labels.items())},
        "summary": n.summary,
        "description": n.description,
        "value": value if value is not None and math.isfinite(value) else None,
        "starts_at": _iso(n.starts_at),
        "ends_at": _iso(_ends(n, now or datetime.now(timezone.utc))) if n.status == RESOLVED else None,
        "generator_url": n.generator_url,
        **({"links": dict(sorted(n.links.items()))} if n.links else {}),
    }


def _post(
    sink: str,
    target: str,
    url: str,
    body: bytes,
    headers: dict[str, str],
    secrets: Sequence[str] = (),
    timeout=TIMEOUT,
    retries: int = RETRIES,
) -> requests.Response:
    """POST with bounded retries (connection errors, timeouts, 5xx); a 4xx or 3xx at once. Raises
    AlertSinkError with the server's own message (scrubbed of ``secrets``), cause chain cut."""
    headers = {"Content-Type": "application/json", "User-Agent": USER_AGENT, **headers}
    problem = ""
    for attempt in range(retries + 1):
        if attempt:
            time.sleep(BACKOFF_S * 2 ** (attempt - 1))
        try:
            r = requests.post(url, data=body, headers=headers, timeout=timeout, allow_redirects=False)
        except requests.RequestException as exc:
            problem = failure_text(exc, *secrets)
            continue
        text = scrub_secrets(r.text.strip(), *secrets)[:500]
        if r.status_code < 300:
            return r
        if r.status_code >= 500:
            problem = f"HTTP {r.status_code} {r.reason or ''}: {text}".rstrip(": ")
            continue
        if r.status_code >= 400:
            message = f"HTTP {r.status_code} {r.reason or ''}: {text}".rstrip(": ")
        else:
            message = f"HTTP {r.status_code} redirect (to {display_url(r.headers.get('Location', ''))})"
        raise AlertSinkError(sink, target, message) from None
    raise AlertSinkError(sink, target, f"{problem} (after {retries + 1} attempts)") from None


# -- Alertmanager --------------------------------------------------------------------------------------------
_LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")


def label_name(name: str) -> str:
    """A valid Prometheus label name (Alertmanager 0.25 refuses others with a 400): other characters
    become ``_``, a leading digit gets a ``_`` before it."""
    name = str(name)
    if _LABEL_NAME.match(name):
        return name
    name = re.sub(r"[^a-zA-Z0-9_]", "_", name) or "_"
    return f"_{name}" if name[0].isdigit() else name


class AlertmanagerSink:
    """``POST {url}/api/v2/alerts`` (a path prefix in ``url`` is kept; ``user:password@`` is sent as HTTP
    basic auth and never shown)."""

    name = "alertmanager"

    def __init__(self, url: str, firing_ttl: timedelta = FIRING_TTL, timeout=TIMEOUT, retries: int = RETRIES):
        self.url = _http_url(self.name, url).rstrip("/")
        self.target = display_url(self.url)
        self.firing_ttl = firing_ttl
        self.timeout = timeout
        self.retries = retries
        self._secrets = _url_secrets(self.url)  # user:password@ is sent as HTTP basic auth

    def __repr__(self) -> str:
        return f"AlertmanagerSink({self.target!r})"

    def alert(self, n: Notification, now: datetime | None = None) -> dict:
        """One postable alert of the v2 API."""
        now = now or datetime.now(timezone.utc)
        labels = {label_name(k): str(v) for k, v in n.labels.items()}
        labels.update(alertname=n.rule, severity=n.severity, foxhunt_fingerprint=n.fingerprint)
        value = float(n.value) if n.value is not None else math.nan
        alert = {
            "labels": labels,
            "annotations": {"summary": n.summary, "description": n.description, "value": f"{value:g}"},
            "startsAt": _iso(n.starts_at),
        }
        if n.status == RESOLVED:
            alert["endsAt"] = _iso(_ends(n, now))
        else:
            alert["endsAt"] = _iso(max(now, _utc(n.starts_at)) + self.firing_ttl)
        if re.match(r"https?://", n.generator_url or ""):
            alert["generatorURL"] = n.generator_url
        for kind, url in sorted(n.links.items()):  # logs_url, trace_url: annotations Alertmanager passes on
            alert["annotations"][f"{kind}_url"] = url
        return alert

    def send(
        self,
        notifications: Sequence[Notification],
        *,
        sent_to: Sequence[str] = (),
        deadline: float | None = None,
    ) -> None:
        _check(notifications)
        if not notifications:
            return
        now = datetime.now(timezone.utc)
        body = json.dumps([self.alert(n, now) for n in notifications]).encode()
        _post(
            self.name,
            self.target,
            f"{self.url}/api/v2/alerts",
            body,
            {},
            self._secrets,
            self.timeout,
            self.retries,
        )
        log.info("alerts: %d notification(s) to alertmanager %s", len(notifications), self.target)


# -- Slack ---------------------------------------------------------------------------------------------------
def _mrkdwn(text: str) -> str:
    """Slack's three control characters escaped (the text can hold no link or mention then)."""
    return str(text).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _duration(seconds: float) -> str:
    minutes = max(int(seconds // 60), 0)
    days, rest = divmod(minutes, 24 * 60)
    hours, mins = divmod(rest, 60)
    parts = (
        [f"{days} d"] * bool(days)
        + [f"{hours} h"] * bool(hours)
        + [f"{mins} min"] * bool(mins or not (days or hours))
    )
    return " ".join(parts)


def slack_alert_text(n: Notification, now: datetime | None = None) -> str:
    """The message for one notification, in Slack mrkdwn."""
    now = now or datetime.now(timezone.utc)
    start = _utc(n.starts_at)
    if n.status == FIRING:
        head = f"🔥 *{_mrkdwn(n.severity.upper())}* `{_mrkdwn(n.rule)}` — {_mrkdwn(n.summary)}"
        when = f"firing since {start:%Y-%m-%d %H:%M} UTC"
    else:
        end = _ends(n, now)
        head = f"✅ *RESOLVED* `{_mrkdwn(n.rule)}` — {_mrkdwn(n.summary)}"
        when = f"fired {start:%Y-%m-%d %H:%M}–{end:%H:%M} UTC ({_duration((end - start).total_seconds())})"
    lines = [head]
    if n.status == FIRING and n.description:
        lines.append(_mrkdwn(n.description))
    labels = " ".join(f"`{_mrkdwn(k)}={_mrkdwn(v)}`" for k, v in sorted(n.labels.items()))
    value = float(n.value) if n.value is not None else math.nan
    lines.append(" · ".join(x for x in (labels, f"value {value:g}", when) if x))
    if re.match(r"https?://", n.generator_url or ""):
        safe = (
            n.generator_url.replace("&", "&amp;").replace("<", "%3C").replace(">", "%3E").replace("|", "%7C")
        )
        lines.append(f"<{safe}|Open in Dagster>")
    for kind, url in sorted(n.links.items()):
        if re.match(r"https?://", url):
            lines.append(f"<{_slack_url(url)}|{_LINK_TEXT.get(kind, kind)}>")
    return "\n".join(lines)


_LINK_TEXT = {"logs": "Pod logs", "trace": "Run trace"}


def _slack_url(url: str) -> str:
    """A URL inside Slack's <url|text>: its &, <, > and | escaped as Slack's mrkdwn wants."""
    return url.replace("&", "&amp;").replace("<", "%3C").replace(">", "%3E").replace("|", "%7C")


class SlackAlertSink:
    """One ``chat.postMessage`` per notification into ``channel`` (``#name`` or id), through ``client``
    (its token and base URL; see slack_client.slack_web_client)."""

    name = "slack"

    def __init__(self, channel: str, client: WebClient):
        self.channel = channel.strip()
        self.target = self.channel
        self.api_url = client.base_url
        if not client.token:
            raise AlertSinkError(self.name, self.channel, "SLACK_BOT_TOKEN is empty")
        self._client = client

    def __repr__(self) -> str:
        return f"SlackAlertSink({self.channel!r}, api_url={self.api_url!r})"

    def send(
        self,
        notifications: Sequence[Notification],
        *,
        sent_to: Sequence[str] = (),
        deadline: float | None = None,
    ) -> None:
        """One message per notification; past `deadline` (time.monotonic()) it stops before the next
        message and says how many it posted (AlertSinkError.accepted), so none is posted twice."""
        _check(notifications)
        if not notifications:
            return
        client = self._client
        now = datetime.now(timezone.utc)
        posted = 0
        for n in notifications:
            if deadline is not None and time.monotonic() > deadline:
                raise AlertSinkError(
                    self.name,
                    self.channel,
                    f"out of time for this tick after {posted} of {len(notifications)}",
                    accepted=posted,
                )
            try:
                client.chat_postMessage(
                    channel=self.channel,
                    text=slack_alert_text(n, now),
                    unfurl_links=False,
                    unfurl_media=False,
                )
            except Exception as exc:  # Slack's error, a connection error, a timeout, a bad answer
                message = (
                    f"chat.postMessage (via {self.api_url}) failed: {slack_error_text(exc, client.token)}"
                )
                raise AlertSinkError(
                    self.name, self.channel, message + self._progress(posted, notifications), accepted=posted
                ) from None
            posted += 1
        log.info("alerts: %d notification(s) to slack %s", posted, self.channel)

    @staticmethod
    def _progress(posted: int, notifications: Sequence[Notification]) -> str:
        return f" (posted {posted} of {len(notifications)} before it)" if posted else ""


# -- generic webhook -----------------------------------------------------------------------------------------
def sign(secret: str, body: bytes) -> str:
    """``sha256=<hex HMAC-SHA256 of body keyed with secret>``: the X-Foxhunt-Signature header."""
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


class WebhookSink:
    """``POST`` of the signed JSON body of docs/contracts/webhook.md."""

    name = "webhook"

    def __init__(self, url: str, secret: str, timeout=TIMEOUT, retries: int = RETRIES):
        self.url = _http_url(self.name, url)
        self.target = display_url(self.url)
        if not secret:
            raise AlertSinkError(
                self.name, self.target, "FOXHUNT_ALERT_WEBHOOK_SECRET is empty: set the signing secret"
            )
        remember(secret)
        self._secret = secret
        self.timeout = timeout
        self.retries = retries

    def __repr__(self) -> str:
        return f"WebhookSink({self.target!r})"

    def body(self, notifications: Sequence[Notification], timestamp: int) -> bytes:
        now = datetime.fromtimestamp(timestamp, timezone.utc)
        payload = {
            "version": WEBHOOK_VERSION,
            "timestamp": timestamp,
            "notifications": [notification_dict(n, now) for n in notifications],
        }
        return json.dumps(payload, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()

    def send(
        self,
        notifications: Sequence[Notification],
        *,
        sent_to: Sequence[str] = (),
        deadline: float | None = None,
    ) -> None:
        _check(notifications)
        if not notifications:
            return
        timestamp = int(time.time())  # once: a retry sends the same bytes, the same signature
        body = self.body(notifications, timestamp)
        headers = {"X-Foxhunt-Timestamp": str(timestamp), "X-Foxhunt-Signature": sign(self._secret, body)}
        secrets = (self._secret, *_url_secrets(self.url))
        _post(self.name, self.target, self.url, body, headers, secrets, self.timeout, self.retries)
        log.info("alerts: %d notification(s) to webhook %s", len(notifications), self.target)


# -- the alerts table ----------------------------------------------------------------------------------------
@contextmanager
def _lake_lock(lake: Lake):
    """One writer of the alerts table per lake root on this machine (threads and processes)."""
    key = hashlib.sha1(lake.root.encode()).hexdigest()[:16]
    path = os.path.join(tempfile.gettempdir(), f"foxhunt-alerts-{key}.lock")
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _merge_sent_to(a: str, b: str) -> str:
    names = [x for x in (a or "").split(",") + (b or "").split(",") if x]
    return ",".join(dict.fromkeys(names))


class LakeAlertSink:
    """Appends every transition to the ``alerts`` table (docs/operating/alerts.md, "The alerts table")."""

    name = "lake"

    def __init__(self, lake: Lake):
        self.lake = lake
        self.target = lake.root if not lake.is_s3 else display_url(lake.root)

    def __repr__(self) -> str:
        return f"LakeAlertSink({self.lake!r})"

    def rows(
        self, notifications: Sequence[Notification], sent_to: Sequence[str] = (), now=None
    ) -> list[dict]:
        now = now or datetime.now(timezone.utc)
        out = []
        for n in notifications:
            ts = transition_time(n, now)
            out.append(
                {
                    "day": ts.date(),
                    "ts": ts,
                    "rule": n.rule,
                    "fingerprint": n.fingerprint,
                    "severity": n.severity,
                    "status": n.status,
                    "labels": json.dumps({str(k): str(v) for k, v in n.labels.items()}, sort_keys=True),
                    "summary": n.summary,
                    "value": float(n.value) if n.value is not None else None,
                    "starts_at": _utc(n.starts_at),
                    "ends_at": _ends(n, now) if n.status == RESOLVED else None,
                    "sent_to": ",".join(dict.fromkeys(s for s in sent_to if s)),
                }
            )
        return out

    def send(
        self,
        notifications: Sequence[Notification],
        *,
        sent_to: Sequence[str] = (),
        deadline: float | None = None,
    ) -> None:
        """``sent_to``: the sinks that accepted these notifications (the engine and deliver_all pass them),
        recorded in each row."""
        _check(notifications)
        by_day: dict[date, list[dict]] = {}
        for row in self.rows(notifications, sent_to):
            by_day.setdefault(row["day"], []).append(row)
        written = 0
        try:
            with _lake_lock(self.lake):
                for day, rows in sorted(by_day.items()):
                    written += self._append(day, rows)
        except LakeError as exc:
            raise AlertSinkError(self.name, self.target, str(exc)) from None
        log.info("alerts: %d transition(s) to the lake's alerts table (%d new)", len(notifications), written)

    def _append(self, day: date, rows: list[dict]) -> int:
        """Add ``rows`` to the day's partition (read, merge, de-duplicate, write); returns rows added."""
        value = day.isoformat()
        old = self.lake.read_partition(ALERTS, value)
        merged: dict[tuple, dict] = {}
        for row in old.to_pylist() if old is not None else []:
            merged.setdefault((row["fingerprint"], row["status"], _ms(row["starts_at"])), row)
        added = changed = 0
        for row in rows:
            key = (row["fingerprint"], row["status"], _ms(row["starts_at"]))
            if key not in merged:
                merged[key] = dict(row)
                added += 1
                continue
            widened = _merge_sent_to(merged[key]["sent_to"], row["sent_to"])
            if widened != merged[key]["sent_to"]:
                merged[key]["sent_to"] = widened
                changed += 1
        if old is not None and not added and not changed and len(merged) == old.num_rows:
            return 0  # nothing new: leave the file alone
        ordered = sorted(merged.values(), key=lambda r: (_ms(r["ts"]), r["fingerprint"], r["status"]))
        self.lake.write_partition(ALERTS, value, pa.Table.from_pylist(ordered, schema=ALERTS.schema))
        return added


# -- configuration and the one entry point -------------------------------------------------------------------
def configured_sinks(
    lake: Lake,
    *,
    alertmanager_url: str = "",
    slack_channel: str = "",
    webhook_url: str = "",
    webhook_secret: str = "",
    slack_client: Callable[[], WebClient] | None = None,
) -> list[AlertSink]:
    """The configured sinks, in delivery order: Alertmanager, Slack, webhook, then the lake (always); an
    empty URL or channel is a sink not configured. ``slack_client`` makes the Slack client (Dagster passes
    its ``slack`` resource's ``get_client``), called only when a channel is set. Raises AlertSinkError for a
    half-configured sink (Slack channel without token, webhook without secret, a URL that is not http(s))
    before anything is sent."""
    sinks: list[AlertSink] = []
    if alertmanager_url.strip():
        url = _http_url("alertmanager", alertmanager_url.strip(), "FOXHUNT_ALERTMANAGER_URL")
        sinks.append(AlertmanagerSink(url))
    channel = slack_channel.strip()
    if channel:
        client = slack_client() if slack_client is not None else None
        if client is None:
            raise AlertSinkError("slack", channel, "no Slack client: SLACK_BOT_TOKEN is empty")
        sinks.append(SlackAlertSink(channel, client))
    if webhook_url.strip():
        url = _http_url("webhook", webhook_url.strip(), "FOXHUNT_ALERT_WEBHOOK_URL")
        sinks.append(WebhookSink(url, webhook_secret))
    sinks.append(LakeAlertSink(lake))
    return sinks


def deliver_all(sinks: Sequence[AlertSink], notifications: Sequence[Notification]) -> dict[str, str | None]:
    """Send to every sink in order, whatever the others did; returns sink name -> None (accepted) or the
    error text. Each sink is told which sinks before it accepted (``sent_to``: the lake records them)."""
    results: dict[str, str | None] = {}
    accepted: list[str] = []
    for sink in sinks:
        try:
            sink.send(notifications, sent_to=tuple(accepted))
        except AlertSinkError as exc:
            results[sink.name] = str(exc)
        except Exception as exc:  # a bug in one sink must not keep the others from their notifications
            results[sink.name] = f"{sink.name} {sink.target}: {type(exc).__name__}: {exc}"
        else:
            results[sink.name] = None
            accepted.append(sink.name)
        if results[sink.name] is not None:
            log.warning("alerts: %s", results[sink.name])
    return results


__all__ = [
    "FIRING",
    "RESOLVED",
    "AlertSink",
    "AlertSinkError",
    "AlertmanagerSink",
    "LakeAlertSink",
    "Notification",
    "SlackAlertSink",
    "WebhookSink",
    "configured_sinks",
    "deliver_all",
    "notification_dict",
    "sign",
    "slack_alert_text",
    "transition_time",
]
