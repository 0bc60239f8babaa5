"""Prometheus client: a bulk `query_range` fast path of our own, and instant queries (prometheus-api-client
cannot bound a whole request, so bench/sensors.py keeps it only as the comparison).

Every request has a total deadline (FOXHUNT_PROMETHEUS_TIMEOUT): requests' timeout bounds each socket
read, so a server that drips a few bytes a second would never time out; the body is read with
`read1` (what has arrived, one system call) and the clock checked between reads.

The fast path exists because building millions of small Python objects is what costs: `json.loads`
of a matrix makes a list per point and a str per value. Matrix values are regular
(`[<ts>,"<value>"]`), so each series' value block is cut out of the raw body and parsed in bulk by
Arrow's CSV reader; only the small label objects go through `json`.
"""

from __future__ import annotations

import io
import json
import re
import socket
import threading
import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass
from datetime import datetime, timezone

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import requests
import urllib3

from foxhunt_obs.lib import tracing
from foxhunt_obs.lib.errors import InputError
from foxhunt_obs.lib.redact import redact_url, remember, scrub, split_userinfo

# Requests one client sends side by side (the ingest's queries of an hour, the alert tick's rules): Prometheus
# evaluates each query on one core, so one after another a run waits on every query in turn. Well under
# Prometheus's own --query.max-concurrency (default 20: `prometheus --help`, 2.42), which it shares with
# dashboards and other runs. FOXHUNT_PROMETHEUS_QUERIES_AT_ONCE.
QUERIES_AT_ONCE = 4
_RETRY_STATUS = {502, 503, 504}  # a proxy's bad gateway / gateway timeout, an overloaded Prometheus
_READ_S = 10.0  # the longest one socket read may wait (within the total deadline)
_ERROR_EXCERPT = 4096  # bytes of an error answer read: Prometheus's errors are short, a proxy's page cut
_DEADLINE = threading.local()  # .at: the monotonic deadline of this thread's request in flight


def _shutdown(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass  # already closed: the wait it would end has ended


class _Watchdog:
    """Mixin for urllib3's connections: the wait for the status line and headers ends at the request's
    deadline, not only after one silent socket read (a proxy dripping header bytes never times out)."""

    def getresponse(self, *args, **kwargs):
        at = getattr(_DEADLINE, "at", None)
        timer = None
        if at is not None and self.sock is not None:
            timer = threading.Timer(max(0.0, at - time.monotonic()), _shutdown, (self.sock,))
            timer.daemon = True
            timer.start()
        try:
            return super().getresponse(*args, **kwargs)
        finally:
            if timer is not None:
                timer.cancel()


class _HTTPConnection(_Watchdog, urllib3.connection.HTTPConnection):
    pass


class _HTTPSConnection(_Watchdog, urllib3.connection.HTTPSConnection):
    pass


class _HTTPPool(urllib3.HTTPConnectionPool):
    ConnectionCls = _HTTPConnection


class _HTTPSPool(urllib3.HTTPSConnectionPool):
    ConnectionCls = _HTTPSConnection


class _Adapter(requests.adapters.HTTPAdapter):
    def init_poolmanager(self, *args, **kwargs):
        super().init_poolmanager(*args, **kwargs)
        self.poolmanager.pool_classes_by_scheme = {"http": _HTTPPool, "https": _HTTPSPool}


_HINTS = {
    400: "the window has too many points per series: lower FOXHUNT_PROMETHEUS_MAX_POINTS",
    422: "too many samples or a timeout: lower FOXHUNT_PROMETHEUS_MAX_POINTS or raise Prometheus's "
    "--query.max-samples / --query.timeout",
    502: "a proxy in front of Prometheus got no answer: retried, then gave up",
    503: "Prometheus is overloaded or starting: retried, then gave up",
    504: "a proxy in front of Prometheus timed out: retried, then gave up",
}


class PrometheusError(InputError, RuntimeError):
    """A failed request; the message names the URL, query, window, step and Prometheus's own error."""


@dataclass(frozen=True)
class RangeResult:
    """A matrix, column-wise: points of series i are ts[offsets[i]:offsets[i+1]]."""

    labels: list[dict[str, str]]
    offsets: np.ndarray  # int64, len(labels) + 1
    ts: np.ndarray  # float64 seconds since the epoch
    values: np.ndarray  # float64; NaN and +-Inf kept

    @property
    def n_points(self) -> int:
        return int(self.ts.size)

    def series_of_point(self) -> np.ndarray:
        return np.repeat(np.arange(len(self.labels)), np.diff(self.offsets))

    @staticmethod
    def empty() -> RangeResult:
        return RangeResult([], np.zeros(1, np.int64), np.empty(0), np.empty(0))

    @staticmethod
    def concat(parts: list[RangeResult]) -> RangeResult:
        """Join chunks of one query: points of the same label set are merged into one series."""
        parts = [p for p in parts if p.labels]
        if not parts:
            return RangeResult.empty()
        if len(parts) == 1:
            return parts[0]
        keys: dict[tuple, int] = {}
        labels: list[dict[str, str]] = []
        sid, ts, vals = [], [], []
        for p in parts:
            ids = np.empty(len(p.labels), np.int64)
            for i, lab in enumerate(p.labels):
                key = tuple(sorted(lab.items()))
                if key not in keys:
                    keys[key] = len(labels)
                    labels.append(lab)
                ids[i] = keys[key]
            sid.append(ids[p.series_of_point()])
            ts.append(p.ts)
            vals.append(p.values)
        sid_all, ts_all, v_all = np.concatenate(sid), np.concatenate(ts), np.concatenate(vals)
        order = np.lexsort((ts_all, sid_all))  # chunks are in time order: a stable sort by series
        counts = np.bincount(sid_all, minlength=len(labels))
        offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        return RangeResult(labels, offsets, ts_all[order], v_all[order])


class MatrixParser:
    """Parses a query_range answer incrementally: each series is cut out of the bytes as soon as the next
    one begins (the last one at the end), so parsing overlaps the download. The value blocks are then
    joined and their punctuation turned into CSV lines in one pass (`[<ts>,"<value>"],` -> `\\n<ts>,<value>,`),
    which Arrow's CSV reader reads all at once (NaN, +Inf and -Inf included).

    A series' end is found from the next series' start, `{"metric":`: a marker that cannot occur inside a
    JSON string (its quote would be escaped) nor among values, and that the search skips to quickly,
    where searching each block for its closing `]]` meets a `]` every ~20 bytes."""

    _METRIC, _VALUES = b'{"metric":', b',"values":[['
    _BETWEEN = b"]]},"  # the end of a series' values and object, before the next series' _METRIC
    _TAIL_BYTES = 1 << 16  # what finish() checks the document's end in (warnings/infos included)
    # After the last series (or an empty result) the document closes: the result array, the data object,
    # optional top-level "warnings"/"infos" (Prometheus >= 2.x / 3.x), the response object. An answer cut
    # between two series is well-formed up to there but does not end like this.
    _END = re.compile(
        rb'(\]\]\}|"result":\[)\s*\]\s*\}(\s*,\s*"(warnings|infos)"\s*:\s*\[.*?\])*\s*\}\s*$', re.S
    )

    def __init__(self, label_cache: dict[bytes, dict[str, str]] | None = None) -> None:
        self._head = b""
        self._rest = b""
        self._tail = b""
        # A series' label object is the same bytes in every window asked for: parsed once per client
        # (`label_cache`), the dicts shared between answers and read-only to their users.
        self._label_cache = {} if label_cache is None else label_cache
        self.labels: list[dict[str, str]] = []
        self._blocks: list[bytes] = []  # each series' `[<ts>,"<value>"],...,[<ts>,"<value>"]`

    def feed(self, chunk: bytes) -> None:
        if len(self._head) < 400:
            self._head += chunk[: 400 - len(self._head)]
        # the last bytes seen (a big chunk is its own tail: no copy)
        self._tail = chunk if len(chunk) >= self._TAIL_BYTES else (self._tail + chunk)[-self._TAIL_BYTES :]
        buf = self._rest + chunk if self._rest else chunk
        m = buf.find(self._METRIC)
        if m < 0:  # keep a tail that may hold the start of the first marker
            self._rest = buf[max(0, len(buf) - len(self._METRIC)) :]
            return
        while True:
            v = buf.find(self._VALUES, m)
            following = buf.find(self._METRIC, v) if v >= 0 else -1
            if following < 0:  # the last series so far: it ends where the next begins, or in finish()
                break
            if buf[following - len(self._BETWEEN) : following] != self._BETWEEN:
                raise ValueError(f"malformed series: {buf[m : m + 200]!r}")
            self._add(buf, m, v, following - len(self._BETWEEN) + 1)
            m = following
        self._rest = buf[m:]

    def _add(self, buf: bytes, m: int, v: int, end: int) -> None:
        """The series whose object starts at m, values at v, its last point's `]` just before `end`."""
        raw = buf[m + len(self._METRIC) : v]
        labels = self._label_cache.get(raw)
        if labels is None:
            labels = json.loads(raw)
            if len(self._label_cache) < _LABEL_CACHE_SIZE:
                self._label_cache[raw] = labels
        self.labels.append(labels)
        self._blocks.append(buf[v + len(self._VALUES) - 1 : end])

    def finish(self) -> RangeResult:
        if b'"status":"success"' not in self._head:
            raise ValueError(f"not a successful Prometheus response: {self._head[:300]!r}")
        if b'"resultType":"matrix"' not in self._head:
            raise ValueError(f"not a matrix result: {self._head[:300]!r}")
        # the end is in the last bytes, unless warnings follow the data (then the regex reads them all)
        if not (self._END.search(self._tail[-256:]) or self._END.search(self._tail)):
            raise ValueError(
                f"truncated answer: the document does not close after {len(self.labels)} series "
                f"(ends {self._tail[-120:]!r})"
            )
        if self._rest.startswith(self._METRIC):  # the last series: its values end at the first `]]`
            v = self._rest.find(self._VALUES)
            e = self._rest.find(b"]]", v) if v >= 0 else -1
            if e < 0 or not self._END.match(self._rest, e):  # nothing but the document's end after it
                raise ValueError(f"truncated or malformed series: {self._rest[:200]!r}")
            self._add(self._rest, 0, v, e + 1)
        if not self.labels:
            return RangeResult.empty()
        # `,` after every point, then `[` -> newline and `]`, `"` dropped: the rows `<ts>,<value>,` of
        # three fields, the third empty (a first empty line is skipped)
        joined = b",".join(self._blocks) + b","
        starts = np.cumsum([0] + [len(b) + 1 for b in self._blocks])
        opens = np.flatnonzero(np.frombuffer(joined, np.uint8) == ord("["))  # a point each
        offsets = np.searchsorted(opens, starts).astype(np.int64)
        csv = joined.translate(_CSV_LINES, b']"')
        # threads pay for themselves on a big answer only (an hour of one metric is ~1 MB)
        read = _CSV_READ_THREADS if len(csv) > _CSV_THREADS_FROM else _CSV_READ
        table = pacsv.read_csv(
            io.BytesIO(csv), read_options=read, parse_options=_CSV_PARSE, convert_options=_CSV_CONVERT
        )
        if table.num_rows != opens.size:
            raise ValueError(f"malformed matrix values: expected {opens.size} points, got {table.num_rows}")
        return RangeResult(self.labels, offsets, _numpy(table.column("t")), _numpy(table.column("v")))


def parse_matrix(body: bytes) -> RangeResult:
    """Parse a whole successful query_range answer."""
    parser = MatrixParser()
    parser.feed(body)
    return parser.finish()


# label sets a client keeps parsed: a DCGM series' is ~2.5 KB in memory, so at most ~50 MB; enough for
# every series of 1,000 GPUs' metrics, beyond which the rest are parsed each time
_LABEL_CACHE_SIZE = 20_000
_CSV_LINES = bytes.maketrans(b"[", b"\n")
_CSV_READ = pacsv.ReadOptions(column_names=["t", "v", "_"], block_size=1 << 22, use_threads=False)
_CSV_READ_THREADS = pacsv.ReadOptions(column_names=["t", "v", "_"], block_size=1 << 22)
_CSV_THREADS_FROM = 1 << 22
_CSV_PARSE = pacsv.ParseOptions(quote_char=False, double_quote=False, ignore_empty_lines=True)
_CSV_CONVERT = pacsv.ConvertOptions(
    column_types={"t": pa.float64(), "v": pa.float64()},
    include_columns=["t", "v"],
    null_values=[],
    strings_can_be_null=False,
)


def _numpy(col: pa.ChunkedArray) -> np.ndarray:
    return col.combine_chunks().to_numpy(zero_copy_only=False)


def split_windows(start: float, end: float, step: float, max_points: int) -> list[tuple[float, float]]:
    """Query windows covering the half-open range [start, end) on the grid start + k*step.

    Prometheus includes both ends of a range, so each window ends one step before the next begins,
    and no window has more than max_points points per series.
    """
    if step <= 0 or max_points < 1:
        raise ValueError(f"step {step} and max_points {max_points} must be positive")
    step_ms = round(step * 1000)
    start_ms, end_ms = round(start * 1000), round(end * 1000)
    n = max(0, -(-(end_ms - start_ms) // step_ms))  # points with ts < end
    windows = []
    for first in range(0, n, max_points):
        last = min(first + max_points, n) - 1
        windows.append(((start_ms + first * step_ms) / 1000, (start_ms + last * step_ms) / 1000))
    return windows


def iso(t: float) -> str:
    return datetime.fromtimestamp(t, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


class PrometheusClient:
    def __init__(
        self,
        url: str,
        *,
        timeout_s: float = 120,
        gzip: bool = False,
        max_points: int = 11_000,
        bearer_token: str = "",
        retries: int = 3,
        queries_at_once: int = QUERIES_AT_ONCE,
    ):
        # the credentials of http://user:pass@host go as basic auth; messages show the URL without them
        base, auth = split_userinfo(url.rstrip("/"))
        self.url = redact_url(url.rstrip("/"))
        self._base = base
        self.timeout_s = timeout_s
        self.max_points = max_points
        self.retries = retries
        self.queries_at_once = queries_at_once  # a bound for callers: requests themselves are one each
        self._label_cache: dict[bytes, dict[str, str]] = {}  # MatrixParser's, across this client's answers
        self._session = requests.Session()
        for scheme in ("http://", "https://"):
            # a connection for each query in flight (requests keeps 10 per host by default)
            self._session.mount(scheme, _Adapter(pool_maxsize=max(10, queries_at_once)))
        self._session.auth = auth
        # requests reads the proxies, CA bundle and ~/.netrc from the environment for every request (~0.2 ms
        # each, ~5 % of an ingest hour's CPU: bench/prometheus_ingest.py); read once here, by requests.
        # (A redirect to another host would then keep these: Prometheus's API does not redirect.)
        env = self._session.merge_environment_settings(base, {}, None, None, None)
        self._session.proxies, self._session.verify = env["proxies"], env["verify"]
        if auth is None:
            self._session.auth = requests.utils.get_netrc_auth(base)
        self._session.trust_env = False
        # identity by default: on a LAN, gzip costs Prometheus more CPU than it saves in transfer.
        self._session.headers["Accept-Encoding"] = "gzip" if gzip else "identity"
        remember(bearer_token)
        self._headers = {"Authorization": f"Bearer {bearer_token}"} if bearer_token else {}

    # -- requests with a total deadline ------------------------------------------------------------
    def _span(self, path: str, query: str, window: Callable[[], dict[str, object]]):
        """The span of one request (lib/tracing.py): the HTTP client conventions' attributes, the query
        and its window (`window()`: built only when spans are recorded, as the ISO times and the URL's
        parts cost a tenth of a millisecond a request); `_send` adds the status and bytes, the caller the
        rows it parsed."""
        if not tracing.enabled():
            return nullcontext(tracing.NO_SPAN)
        return tracing.span(
            f"POST {path}",
            {
                **tracing.http_attributes("POST", f"{self.url}{path}"),
                tracing.SOURCE: "prometheus",
                tracing.QUERY: query,
                **{f"foxhunt.{k}": v for k, v in window().items()},
            },
            kind=tracing.CLIENT,
        )

    def _send(self, path: str, params: dict, on_chunk, describe, span=tracing.NO_SPAN) -> None:
        """POST `params` to `path` and hand the body to `on_chunk` as it arrives, all of it (every retry
        included) within timeout_s; 502/503/504 and connection errors are retried while time is left.
        `describe(text)` builds the error. `span`: the request's span, given its status and bytes."""
        if span.is_recording():
            received, feed = [0], on_chunk

            def on_chunk(chunk: bytes) -> None:
                received[0] += len(chunk)
                feed(chunk)

        delay = 0.5
        deadline = time.monotonic() + self.timeout_s
        for attempt in range(1, self.retries + 1):
            left = deadline - time.monotonic()
            read_s = max(0.05, min(_READ_S, left))
            try:
                _DEADLINE.at = deadline
                try:
                    # POST: long PromQL does not fit in a URL; Prometheus accepts form-encoded parameters.
                    r = self._session.post(
                        f"{self._base}{path}",
                        data=params,
                        headers=self._headers,
                        timeout=(max(0.05, min(3.05, left)), read_s),
                        stream=True,
                    )
                finally:
                    _DEADLINE.at = None
            except (requests.ConnectionError, requests.Timeout) as e:
                if time.monotonic() >= deadline:  # the watchdog cut a wait for the headers
                    raise describe(self._late()) from None
                if attempt == self.retries or time.monotonic() + delay >= deadline:
                    raise describe(f"cannot connect after {attempt} tries: {scrub(str(e))}") from None
            else:
                with r:
                    if span.is_recording():
                        span.set_attributes(
                            {tracing.HTTP_STATUS: r.status_code, tracing.HTTP_RESEND_COUNT: attempt - 1}
                        )
                    if r.status_code == 200:
                        try:
                            self._read(r, deadline, on_chunk, describe)
                        finally:
                            if span.is_recording():
                                span.set_attribute(tracing.RESPONSE_BYTES, received[0])
                        return
                    last = attempt == self.retries or time.monotonic() + delay >= deadline
                    if r.status_code not in _RETRY_STATUS or last:
                        body, complete = self._excerpt(r, deadline)
                        text = http_error_text(r, body)
                        if not complete:  # a proxy's error page dripping: the status says enough
                            text += f"; the error answer was still arriving: {self._late()}"
                        raise describe(text)
            time.sleep(delay)
            delay *= 2
        raise AssertionError("unreachable")

    def _late(self) -> str:
        return (
            f"no complete answer within {self.timeout_s:g} s (FOXHUNT_PROMETHEUS_TIMEOUT, the whole "
            "request): Prometheus or a proxy is stalling"
        )

    def _read(self, r: requests.Response, deadline: float, on_chunk, describe) -> None:
        try:
            while True:
                if time.monotonic() > deadline:
                    raise describe(self._late())
                chunk = r.raw.read1(1 << 20, decode_content=True)
                if not chunk:
                    return
                try:
                    on_chunk(chunk)
                except ValueError as e:  # a series' labels that are no JSON
                    raise describe(f"unreadable answer: {e}") from None
        except (requests.RequestException, urllib3.exceptions.HTTPError, OSError) as e:
            raise describe(f"connection lost mid-answer: {scrub(str(e))}") from None

    def _excerpt(self, r: requests.Response, deadline: float) -> tuple[bytes, bool]:
        """The first _ERROR_EXCERPT bytes of an error answer, read by the request's deadline as `_read`
        reads an answer (the rest is never read); and whether it ended within them and in time."""
        body = bytearray()
        try:
            while len(body) < _ERROR_EXCERPT:
                if time.monotonic() > deadline:
                    return bytes(body), False
                chunk = r.raw.read1(_ERROR_EXCERPT - len(body), decode_content=True)
                if not chunk:
                    return bytes(body), True
                body += chunk
        except (requests.RequestException, urllib3.exceptions.HTTPError, OSError):
            return bytes(body), time.monotonic() <= deadline  # cut off: what came is the excerpt
        return bytes(body), True

    def check(self) -> None:
        """Prometheus answers a trivial query (its /-/healthy may sit behind another path)."""
        self.query("vector(1)", time.time(), "connection check")

    def query(self, query: str, at: float, what: str = "") -> list[tuple[dict[str, str], float]]:
        """Instant query at time `at`: [(labels, value)]."""

        def describe(text: str) -> PrometheusError:
            return PrometheusError(
                f"Prometheus at {self.url}: query {query} at {iso(at)}{_for(what)}: {text}"
            )

        body = bytearray()
        with self._span("/api/v1/query", query, lambda: {"time": iso(at), "purpose": what or None}) as span:
            self._send("/api/v1/query", {"query": query, "time": f"{at:.3f}"}, body.extend, describe, span)
            try:
                doc = json.loads(body)
                if doc.get("status") != "success":
                    raise ValueError(f"status {doc.get('status')!r}: {doc.get('error', '')}")
                data = doc["data"]
                if data["resultType"] == "scalar":
                    samples = [({}, float(data["result"][1]))]
                elif data["resultType"] != "vector":
                    raise ValueError(f"not a vector result: {data['resultType']!r}")
                else:
                    samples = [(r["metric"], float(r["value"][1])) for r in data["result"]]
            except (ValueError, KeyError, TypeError, IndexError) as e:
                raise describe(f"unreadable answer: {e} ({bytes(body[:200])!r})") from None
            tracing.set_attributes(span, {tracing.ROWS: len(samples)})
            return samples

    # -- fast path ---------------------------------------------------------------------------------
    def query_range(self, query: str, start: float, end: float, step: float, what: str = "") -> RangeResult:
        """All points of [start, end) at `step`, chunked to max_points per series."""
        parts = [
            self._range_chunk(query, s, e, step, what)
            for s, e in split_windows(start, end, step, self.max_points)
        ]
        return RangeResult.concat(parts)

    def fetch_range_body(self, query: str, start: float, end: float, step: float, what: str = "") -> bytes:
        """The raw answer of one query_range request (no chunking)."""
        body = bytearray()
        with self._range_span(query, start, end, step, what) as span:
            self._send_range(query, start, end, step, what, body.extend, span)
        return bytes(body)

    def _range_span(self, query: str, start: float, end: float, step: float, what: str):
        return self._span(
            "/api/v1/query_range",
            query,
            lambda: {"start": iso(start), "end": iso(end), "step_s": step, "purpose": what or None},
        )

    def _send_range(
        self, query: str, start: float, end: float, step: float, what: str, on_chunk, span
    ) -> None:
        params = {"query": query, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step:g}"}
        self._send(
            "/api/v1/query_range",
            params,
            on_chunk,
            lambda text: self._error(query, start, end, step, what, text),
            span,
        )

    def _range_chunk(self, query: str, start: float, end: float, step: float, what: str) -> RangeResult:
        parser = MatrixParser(self._label_cache)
        with self._range_span(query, start, end, step, what) as span:
            self._send_range(query, start, end, step, what, parser.feed, span)
            try:
                result = parser.finish()
            except ValueError as e:
                raise self._error(query, start, end, step, what, f"unreadable answer: {e}") from None
            tracing.set_attributes(
                span, {tracing.ROWS: result.n_points, "foxhunt.series": len(result.labels)}
            )
            return result

    def _error(
        self, query: str, start: float, end: float, step: float, what: str, text: str
    ) -> PrometheusError:
        where = f"query_range {query} {iso(start)}..{iso(end + step)} step {step:g}s{_for(what)}"
        return PrometheusError(f"Prometheus at {self.url}: {where}: {text}")


def _for(what: str) -> str:
    return f" (for {what})" if what else ""


def http_error_text(r: requests.Response, body: bytes | None = None) -> str:
    """An HTTP error answer of Prometheus as text: the status, its errorType and error (or the start of the
    body), and a hint at what the status usually means (_HINTS; a 422 of a closing block: shutting down).
    `body`: the excerpt of the body that was read (PrometheusClient._excerpt); None: the response's own."""
    raw = r.content if body is None else body
    try:
        doc = json.loads(raw)
        text = f"{doc.get('errorType', '')}: {doc.get('error', '')}".strip(": ")
    except (ValueError, AttributeError):  # not JSON, cut short, or JSON that is no object
        text = raw[:300].decode("utf-8", "replace")
    hint = _HINTS.get(r.status_code)
    if r.status_code == 422 and "is closing" in text:  # a stopping Prometheus closes its blocks first
        hint = "Prometheus is shutting down"
    return f"HTTP {r.status_code} {text}" + (f" ({hint})" if hint else "")
