"""The batch side's figures into Prometheus through a Pushgateway: what the live cost rules
cannot see, for the cost dashboard beside the live $/h.

* ``foxhunt_untracked_instance_cost_usd_per_hour{region, instance_id, instance_type, name, experiment}``:
  running EC2 instances that no cluster node corresponds to, priced from the price table.
* ``foxhunt_lake_cost_usd{day, experiment}`` and ``foxhunt_lake_idle_cost_usd{day, experiment}``: the
  lake's cost_allocation dollars per complete day, to reconcile with the integral of the live $/h.
* ``foxhunt_effective_price_usd_per_hour{price_region, instance_type, bill_day}``: the $/h the newest
  landed bill shows per instance type (analysis/effective_rates.py), which the live cost rules prefer to
  the price table's on-demand price.

One push replaces the whole group (HTTP PUT, ``job`` as the only grouping key), so an instance that
stopped, or a day that left the pushed window, disappears from the gateway at the next push. Prometheus
scrapes the gateway with ``honor_labels: true`` so the series keep ``job="<job>"`` (deploy/grafana/README.md).

Plain Python: every value is an argument (no environment, no Dagster). A gateway that is down or refuses
the push raises ``PushgatewayError`` naming the gateway (credentials masked) and the job.
"""

from __future__ import annotations

import base64
import datetime as dt
import functools
import http.client
import math
import socket
import threading
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence

from prometheus_client import CollectorRegistry, Gauge
from prometheus_client.exposition import push_to_gateway

from foxhunt_obs.lib.delivery.errors import scrub_secrets
from foxhunt_obs.lib.errors import InputError
from foxhunt_obs.lib.names import EFFECTIVE_PRICE_METRIC
from foxhunt_obs.lib.redact import redact_url, scrub, split_userinfo

UNTRACKED = "foxhunt_untracked_instance_cost_usd_per_hour"
LAKE_COST = "foxhunt_lake_cost_usd"
LAKE_IDLE = "foxhunt_lake_idle_cost_usd"
UNTRACKED_LABELS = ("region", "instance_id", "instance_type", "name", "experiment")
LAKE_LABELS = ("day", "experiment")
EFFECTIVE_LABELS = ("price_region", "instance_type", "bill_day")
DEFAULT_JOB = "foxhunt_obs_spend"


class PushgatewayError(InputError, RuntimeError):
    """A push that did not land: the gateway is unreachable, too slow, or refused the figures."""


def push_spend(
    url: str,
    *,
    untracked: Sequence[Mapping],
    lake_daily: Sequence[Mapping],
    rates: Sequence[Mapping] = (),
    job: str = DEFAULT_JOB,
    timeout_s: float = 10.0,
) -> int:
    """Push the untracked instances' $/h and the lake's daily $ to the Pushgateway at ``url`` as the group
    ``job`` (replacing what the group held); returns the number of samples pushed.

    ``untracked`` rows: region, instance_id, instance_type, name, experiment, usd_per_hour.
    ``rates`` rows: price_region, instance_type, bill_day, usd_per_hour (the bill's effective rates).
    ``lake_daily`` rows: day (``YYYY-MM-DD``, a date, or a datetime at 00:00 such as a pandas Timestamp),
    experiment, cost_usd, idle_usd. An idle_usd of None or NaN (activity unknown) pushes no idle sample for
    that row: unknown is not idle (docs/cost-model.md). A label of None or NaN is pushed empty (no label).
    ``url`` may carry ``user:password@`` (sent as basic auth, never shown). The push is one HTTP request
    that ends within ``timeout_s`` as a whole (connecting, sending, the answer and an error's body)."""
    if not url:
        raise ValueError("push_spend: no Pushgateway URL")
    registry = CollectorRegistry()
    untracked_gauge = Gauge(
        UNTRACKED,
        "Running EC2 instances no cluster node corresponds to, priced from the price table ($/h).",
        UNTRACKED_LABELS,
        registry=registry,
    )
    lake_cost = Gauge(
        LAKE_COST,
        "The lake's cost_allocation dollars of a complete day (UTC) on node-hours (what the live rules price), per experiment.",
        LAKE_LABELS,
        registry=registry,
    )
    lake_idle = Gauge(
        LAKE_IDLE,
        "The lake's idle dollars (allocated x (1 - active fraction)) of a complete day (UTC), per experiment.",
        LAKE_LABELS,
        registry=registry,
    )
    effective = Gauge(
        EFFECTIVE_PRICE_METRIC,
        "The $/h the newest landed bill shows per instance type (amortized cost / usage), for the live cost rules.",
        EFFECTIVE_LABELS,
        registry=registry,
    )
    for i, row in enumerate(rates):
        where = f"rates[{i}]"
        effective.labels(*_labels(row, EFFECTIVE_LABELS, where)).set(_number(row, "usd_per_hour", where))
    for i, row in enumerate(untracked):
        labels = _labels(row, UNTRACKED_LABELS, f"untracked[{i}]")
        untracked_gauge.labels(*labels).set(_number(row, "usd_per_hour", f"untracked[{i}]"))
    for i, row in enumerate(lake_daily):
        where = f"lake_daily[{i}]"
        labels = (_day(row, where), *_labels(row, ("experiment",), where))
        lake_cost.labels(*labels).set(_number(row, "cost_usd", where))
        if not _missing(_field(row, "idle_usd", where)):
            lake_idle.labels(*labels).set(_number(row, "idle_usd", where))

    plain, credentials = split_userinfo(url)
    shown = redact_url(url)
    # "user:password" first: basic auth sends it base64-encoded whole. Shorter than 4 would mask plain words.
    pair = [":".join(credentials)] if credentials else []
    secrets = [s for s in (*pair, *(credentials or ())) if len(s) >= 4]
    late = (
        f"did not take the push of job {job!r} within its timeout {timeout_s:g} s (the whole request): "
        "the gateway or a proxy is stalling"
    )
    why = ""
    with _Watchdog(timeout_s) as watchdog:
        try:
            push_to_gateway(
                plain, job=job, registry=registry, timeout=timeout_s, handler=watchdog.handler(credentials)
            )
        except urllib.error.HTTPError as e:  # the gateway answered: 400 inconsistent metrics, 401, 5xx
            detail = _body(e)  # by the deadline too
            why = f"refused the push of job {job!r}: HTTP {e.code} {e.reason}" + (
                f": {detail}" if detail else ""
            )
            if watchdog.expired:
                why += f" (its answer cut at the timeout, {timeout_s:g} s)"
        except (OSError, ValueError, http.client.HTTPException) as e:  # refused, unresolvable, timed out
            reason = getattr(e, "reason", None) or e
            why = (
                late
                if watchdog.expired
                else (
                    f"unreachable pushing job {job!r} (timeout {timeout_s:g} s): {type(reason).__name__}: {reason}"
                )
            )
        else:
            if watchdog.expired:  # headers cut at the deadline can read as a complete answer
                why = late
    if why:
        raise PushgatewayError(_masked(f"Pushgateway {shown} {why}", secrets)) from None
    return sum(len(m.samples) for m in registry.collect())


def _shutdown(sock: socket.socket) -> None:
    try:
        socket.socket.shutdown(sock, socket.SHUT_RDWR)  # the plain socket's, under TLS too
    except OSError:
        pass  # already closed: the wait it would end has ended


class _Watchdog:
    """The whole push's deadline: urllib's timeout bounds each socket operation only, so a gateway dripping
    its headers or an error page a byte at a time would hold the push for minutes. At the deadline the
    sockets of the push's connections are shut down, which ends any wait on them."""

    def __init__(self, timeout_s: float) -> None:
        self._lock = threading.Lock()
        self._socks: list[socket.socket] = []
        self.expired = False
        self._timer = threading.Timer(timeout_s, self._expire)
        self._timer.daemon = True

    def __enter__(self) -> _Watchdog:
        self._timer.start()
        return self

    def __exit__(self, *exc) -> None:
        self._timer.cancel()

    def _expire(self) -> None:
        with self._lock:
            self.expired = True
            socks = list(self._socks)
        for sock in socks:
            _shutdown(sock)

    def connect(self, *args, **kwargs) -> socket.socket:
        """socket.create_connection, the socket watched (shut at once if the deadline has passed)."""
        sock = socket.create_connection(*args, **kwargs)
        with self._lock:
            self._socks.append(sock)
            expired = self.expired
        if expired:
            _shutdown(sock)
        return sock

    def handler(self, credentials: tuple[str, str] | None) -> Callable:
        """A prometheus_client push handler over watched connections (basic auth with ``credentials``)."""

        def handler(url, method, timeout, headers, data):
            def handle() -> None:
                request = urllib.request.Request(url, data=data, method=method)
                for k, v in headers:
                    request.add_header(k, v)
                if credentials is not None:
                    token = base64.b64encode(":".join(credentials).encode()).decode()
                    request.add_header("Authorization", f"Basic {token}")
                opener = urllib.request.build_opener(_HTTPHandler(self), _HTTPSHandler(self))
                with opener.open(request, timeout=timeout):  # 4xx/5xx: urllib's HTTPError
                    pass

            return handle

        return handler


class _HTTPConnection(http.client.HTTPConnection):
    def __init__(self, *args, watchdog: _Watchdog, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._create_connection = watchdog.connect


class _HTTPSConnection(http.client.HTTPSConnection):
    def __init__(self, *args, watchdog: _Watchdog, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._create_connection = watchdog.connect


class _HTTPHandler(urllib.request.HTTPHandler):
    def __init__(self, watchdog: _Watchdog) -> None:
        super().__init__()
        self._watchdog = watchdog

    def http_open(self, req):
        return self.do_open(functools.partial(_HTTPConnection, watchdog=self._watchdog), req)


class _HTTPSHandler(urllib.request.HTTPSHandler):
    def __init__(self, watchdog: _Watchdog) -> None:
        super().__init__()
        self._watchdog = watchdog

    def https_open(self, req):
        connection = functools.partial(_HTTPSConnection, watchdog=self._watchdog)
        return self.do_open(connection, req, context=self._context)


def _masked(text: str, secrets: list[str]) -> str:
    """URL userinfo and token parameters masked, and the credentials, also base64-encoded (an echoed
    Authorization header)."""
    return scrub_secrets(scrub(text, secrets), *secrets)


def _body(e: urllib.error.HTTPError) -> str:
    try:
        return e.read(2000).decode(errors="replace").strip()
    except Exception:  # noqa: BLE001 - the status line says enough
        return ""


def _field(row: Mapping, key: str, where: str):
    try:
        return row[key]
    except KeyError:
        raise ValueError(f"push_spend: {where} has no {key!r} (keys: {sorted(row)})") from None


def _missing(value) -> bool:
    """None, or a float NaN (pandas' missing value)."""
    return value is None or (isinstance(value, float) and math.isnan(value))


def _labels(row: Mapping, keys: tuple[str, ...], where: str) -> list[str]:
    return ["" if _missing(v := _field(row, k, where)) else str(v) for k in keys]


def _number(row: Mapping, key: str, where: str) -> float:
    value = _field(row, key, where)
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"push_spend: {where}[{key!r}] is not a number: {value!r}") from None
    if math.isinf(number):
        raise ValueError(f"push_spend: {where}[{key!r}] is infinite")
    return number


def _day(row: Mapping, where: str) -> str:
    value = _field(row, "day", where)
    if isinstance(value, dt.datetime):  # pandas Timestamp too: a day's midnight names the day
        if value.time() != dt.time(0) or value.utcoffset() not in (None, dt.timedelta(0)):
            raise ValueError(f"push_spend: {where}['day'] is a time, not a UTC day: {value!r}")
        return value.date().isoformat()
    if isinstance(value, dt.date):
        return value.isoformat()
    try:
        return dt.date.fromisoformat(str(value)).isoformat()
    except ValueError:
        raise ValueError(f"push_spend: {where}['day'] is not YYYY-MM-DD: {value!r}") from None
