"""Prometheus client: a bulk `query_range` fast path of our own, prometheus-api-client for the rest.

The fast path exists because building millions of small Python objects is what costs: `json.loads`
of a matrix makes a list per point and a str per value. Matrix values are regular
(`[<ts>,"<value>"]`), so each series' value block is cut out of the raw body and parsed in bulk by
Arrow's CSV reader; only the small label objects go through `json`.
"""

from __future__ import annotations

import io
import json
import re
import time
from dataclasses import dataclass
from datetime import datetime, timezone

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import requests

_RETRY_STATUS = {503}
_HINTS = {
    400: "the window has too many points per series: lower FOXHUNT_PROMETHEUS_MAX_POINTS",
    422: "too many samples or a timeout: lower FOXHUNT_PROMETHEUS_MAX_POINTS or raise Prometheus's "
    "--query.max-samples / --query.timeout",
    503: "Prometheus is overloaded or starting: retried, then gave up",
}


class PrometheusError(RuntimeError):
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
    """Parses a query_range answer incrementally: each series is cut out of the bytes as soon as it is
    complete and its [<ts>,"<value>"] pairs rewritten as CSV lines, so parsing overlaps the download.
    Arrow's multi-threaded CSV reader then reads all points at once (NaN, +Inf and -Inf included)."""

    _METRIC, _VALUES = b'{"metric":', b',"values":[['
    _TAIL_BYTES = 1 << 16  # what finish() checks the document's end in (warnings/infos included)
    # After the last series (or an empty result) the document closes: the result array, the data object,
    # optional top-level "warnings"/"infos" (Prometheus >= 2.x / 3.x), the response object. An answer cut
    # between two series is well-formed up to there but does not end like this.
    _END = re.compile(
        rb'(\]\]\}|"result":\[)\s*\]\s*\}(\s*,\s*"(warnings|infos)"\s*:\s*\[.*?\])*\s*\}\s*$', re.S
    )

    def __init__(self) -> None:
        self._head = b""
        self._rest = b""
        self._tail = b""
        self.labels: list[dict[str, str]] = []
        self._csv: list[bytes] = []
        self._counts: list[int] = []

    def feed(self, chunk: bytes) -> None:
        if len(self._head) < 400:
            self._head += chunk[: 400 - len(self._head)]
        self._tail = (self._tail + chunk)[-self._TAIL_BYTES :]
        buf = self._rest + chunk if self._rest else chunk
        pos = 0
        while True:
            m = buf.find(self._METRIC, pos)
            if m < 0:  # keep a tail that may hold the start of the next marker
                pos = max(pos, len(buf) - len(self._METRIC))
                break
            v = buf.find(self._VALUES, m)
            e = buf.find(b"]]", v) if v >= 0 else -1
            if e < 0:  # this series is not complete yet
                pos = m
                break
            self.labels.append(json.loads(buf[m + len(self._METRIC) : v]))
            block = buf[v + len(self._VALUES) : e]
            self._counts.append(block.count(b"],[") + 1)
            self._csv.append(block.replace(b"],[", b"\n").replace(b'"', b""))
            pos = e
        self._rest = buf[pos:]

    def finish(self) -> RangeResult:
        if b'"status":"success"' not in self._head:
            raise ValueError(f"not a successful Prometheus response: {self._head[:300]!r}")
        if b'"resultType":"matrix"' not in self._head:
            raise ValueError(f"not a matrix result: {self._head[:300]!r}")
        if self._METRIC in self._rest:
            raise ValueError(f"truncated or malformed series: {self._rest[:200]!r}")
        if not self._END.search(self._tail):
            raise ValueError(
                f"truncated answer: the document does not close after {len(self.labels)} series "
                f"(ends {self._tail[-120:]!r})"
            )
        if not self.labels:
            return RangeResult.empty()
        expected = sum(self._counts)
        table = pacsv.read_csv(
            io.BytesIO(b"\n".join(self._csv)), read_options=_CSV_READ, convert_options=_CSV_CONVERT
        )
        if table.num_rows != expected:
            raise ValueError(f"malformed matrix values: expected {expected} points, got {table.num_rows}")
        offsets = np.concatenate([[0], np.cumsum(self._counts)]).astype(np.int64)
        return RangeResult(self.labels, offsets, _numpy(table.column("t")), _numpy(table.column("v")))


def parse_matrix(body: bytes) -> RangeResult:
    """Parse a whole successful query_range answer."""
    parser = MatrixParser()
    parser.feed(body)
    return parser.finish()


_CSV_READ = pacsv.ReadOptions(column_names=["t", "v"], block_size=1 << 22)
_CSV_CONVERT = pacsv.ConvertOptions(
    column_types={"t": pa.float64(), "v": pa.float64()}, null_values=[], strings_can_be_null=False
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
    ):
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s
        self.max_points = max_points
        self.retries = retries
        self._session = requests.Session()
        # identity by default: on a LAN, gzip costs Prometheus more CPU than it saves in transfer.
        self._session.headers["Accept-Encoding"] = "gzip" if gzip else "identity"
        self._headers = {"Authorization": f"Bearer {bearer_token}"} if bearer_token else {}
        self._api = None

    @classmethod
    def from_settings(cls, s) -> PrometheusClient:
        return cls(
            s.prometheus_url,
            timeout_s=s.prometheus_timeout_s,
            gzip=s.prometheus_gzip,
            max_points=s.prometheus_max_points,
            bearer_token=s.prometheus_bearer_token,
        )

    # -- prometheus-api-client: connection check and instant queries ------------------------------
    @property
    def api(self):
        if self._api is None:
            from prometheus_api_client import PrometheusConnect

            self._api = PrometheusConnect(url=self.url, headers=self._headers or None, disable_ssl=False)
        return self._api

    def check(self) -> None:
        if not self.api.check_prometheus_connection():
            raise PrometheusError(f"Prometheus at {self.url}: not reachable (GET /-/healthy failed)")

    def query(self, query: str, at: float, what: str = "") -> list[tuple[dict[str, str], float]]:
        """Instant query at time `at`: [(labels, value)]."""
        try:
            result = self.api.custom_query(query, params={"time": at})
        except Exception as e:  # the client raises its own and requests' exceptions
            why = f"cannot connect: {e}" if isinstance(e, requests.ConnectionError) else str(e)
            raise PrometheusError(
                f"Prometheus at {self.url}: query {query} at {iso(at)}{_for(what)}: {why}"
            ) from e
        return [(r["metric"], float(r["value"][1])) for r in result]

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
        return self._post_range(query, start, end, step, what).content

    def _post_range(self, query: str, start: float, end: float, step: float, what: str, stream: bool = False):
        params = {"query": query, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step:g}"}
        delay = 0.5
        for attempt in range(1, self.retries + 1):
            try:
                # POST: long PromQL does not fit in a URL; Prometheus accepts form-encoded parameters.
                r = self._session.post(
                    f"{self.url}/api/v1/query_range",
                    data=params,
                    headers=self._headers,
                    timeout=self.timeout_s,
                    stream=stream,
                )
            except (requests.ConnectionError, requests.Timeout) as e:
                if attempt == self.retries:
                    raise self._error(
                        query, start, end, step, what, f"cannot connect after {attempt} tries: {e}"
                    ) from e
            else:
                if r.status_code == 200:
                    return r
                if r.status_code not in _RETRY_STATUS or attempt == self.retries:
                    raise self._error(query, start, end, step, what, _describe(r))
                r.close()
            time.sleep(delay)
            delay *= 2
        raise AssertionError("unreachable")

    def _range_chunk(self, query: str, start: float, end: float, step: float, what: str) -> RangeResult:
        r = self._post_range(query, start, end, step, what, stream=True)
        parser = MatrixParser()
        try:
            with r:
                for chunk in r.iter_content(1 << 20):
                    parser.feed(chunk)
            return parser.finish()
        except requests.RequestException as e:
            raise self._error(query, start, end, step, what, f"connection lost mid-answer: {e}") from e
        except ValueError as e:
            raise self._error(query, start, end, step, what, f"unreadable answer: {e}") from e

    def _error(
        self, query: str, start: float, end: float, step: float, what: str, text: str
    ) -> PrometheusError:
        where = f"query_range {query} {iso(start)}..{iso(end + step)} step {step:g}s{_for(what)}"
        return PrometheusError(f"Prometheus at {self.url}: {where}: {text}")


def _for(what: str) -> str:
    return f" (for {what})" if what else ""


def _describe(r: requests.Response) -> str:
    try:
        body = r.json()
        text = f"{body.get('errorType', '')}: {body.get('error', '')}".strip(": ")
    except ValueError:
        text = r.text[:300]
    hint = _HINTS.get(r.status_code)
    if r.status_code == 422 and "is closing" in text:  # a stopping Prometheus closes its blocks first
        hint = "Prometheus is shutting down"
    return f"HTTP {r.status_code} {text}" + (f" ({hint})" if hint else "")
