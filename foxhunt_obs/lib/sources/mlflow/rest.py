"""Metric histories over the tracking server's REST API (REST mode), by the fastest exact path there is.

The server's time per point is what counts (ORM rows, protobuf, JSON: tens of µs a point, far more than
parsing here). `get-history-bulk-interval` answers one key of up to 100 runs per call in step windows and
costs the server about half of what `get-history` (one run and key at a time) does; it samples a run's
window above 2,500 rows, so a window that comes back full is read again, exactly, with `get-history`.
Both run on a thread pool to keep several server workers busy. The ajax `get-history-bulk` endpoint is
never used: it cuts every answer at 25,000 points without saying so.
"""

from __future__ import annotations

import base64
import contextvars
import json
import threading
import time
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait

import numpy as np
import pyarrow as pa
import requests

from foxhunt_obs.lib import tracing
from foxhunt_obs.lib.sources.mlflow.model import (
    HISTORY_SCHEMA,
    MlflowAuth,
    MlflowRun,
    call_error,
    call_span,
    history_table,
    next_token,
)

# Databricks rejects get-history pages above 25,000; the OSS server takes any size (1e10 tried) but
# pages by OFFSET, so bigger pages would only save round trips on keys longer than this.
HISTORY_PAGE = 25_000
BULK_MAX_RESULTS = 2_500  # the server's MAX_RESULTS_PER_RUN for get-history-bulk-interval
BULK_MAX_RUNS = 100  # and its MAX_RUNS_GET_METRIC_HISTORY_BULK
_INT32 = (-(2**31), 2**31 - 1)
_EMPTY = (np.empty(0, np.int64), np.empty(0, np.int64), np.empty(0, np.float64))
_RETRY_STATUS = {429, 500, 502, 503, 504}


class RestPath:
    """histories() of the tracking server at `tracking_uri` (shown as `where`).

    `retries` counts tries of one request: 3 means at most 2 retries, with backoff 0.5 s, 1 s, ...;
    only connection errors, timeouts, 429 and 5xx are retried."""

    def __init__(
        self, tracking_uri: str, where: str, *, workers: int, timeout_s: float, retries: int, auth: MlflowAuth
    ):
        self.tracking_uri = tracking_uri
        self.where = where
        self.workers = workers
        self.timeout_s = timeout_s
        self.retries = retries
        self._http = http_settings(auth)

    def histories(self, runs: list[MlflowRun]) -> pa.Table:
        """Bulk first: get-history-bulk-interval answers one key of up to 100 runs per call, in step
        windows (2-4x fewer server seconds per point than get-history). MLflow samples a window that
        holds more than max_results rows of a run (keeping exactly max_results), so a run whose window
        comes back full is read again, exactly, with get-history; so is any key whose steps the
        windows cannot cover (its latest step is past int32)."""
        tasks = [(r.run_id, k) for r in runs for k in r.metric_keys]
        local, sessions = threading.local(), []

        def session() -> requests.Session:
            s = getattr(local, "session", None)
            if s is None:
                s = local.session = self._new_session()
                sessions.append(s)
            return s

        bulk = bulk_requests(runs)
        try:
            got: dict[tuple[str, str], list] = {}
            full: set[tuple[str, str]] = set()
            for (key, _window), answers in zip(bulk, self._pool(lambda t: self._bulk(session(), *t), bulk)):
                for run_id, cols in answers.items():
                    got.setdefault((run_id, key), []).append(cols)
                    if len(cols[0]) >= BULK_MAX_RESULTS:
                        full.add((run_id, key))
            covered = {(rid, key) for key, batch in bulk for rid in batch[1]}
            exact = [t for t in tasks if t not in covered or t in full]
            reread = dict(zip(exact, self._pool(lambda t: self._history(session(), *t), exact)))
        finally:
            for s in sessions:
                s.close()
        parts = []
        for t in tasks:
            if t in reread:
                parts.append(reread[t])
            else:
                windows = got.get(t, [])
                parts.append(
                    tuple(np.concatenate([w[i] for w in windows]) if windows else _EMPTY[i] for i in range(3))
                )
        if not parts:
            return HISTORY_SCHEMA.empty_table()
        # run_id and key once per task, repeated per point by index: no Python string per point
        counts = np.array([len(p[0]) for p in parts], np.int64)
        owner = pa.array(np.repeat(np.arange(len(tasks)), counts))
        run_id = pa.array([t[0] for t in tasks], pa.string()).take(owner)
        key = pa.array([t[1] for t in tasks], pa.string()).take(owner)
        step, ts, value = (np.concatenate([p[i] for p in parts]) for i in range(3))
        return history_table(run_id, key, step, ts, value)

    def _pool(self, fn, items: list) -> list:
        """fn over items on `workers` threads, in order; the first error cancels what has not started."""
        if not items:
            return []
        with ThreadPoolExecutor(self.workers, thread_name_prefix="mlflow-history") as ex:
            # each task in a copy of the caller's context: its request spans stay in the caller's trace
            futures = [ex.submit(contextvars.copy_context().run, fn, item) for item in items]
            done, pending = wait(futures, return_when=FIRST_EXCEPTION)
            for f in pending:
                f.cancel()
            for f in done:
                if f.exception() is not None:
                    raise f.exception()
            return [f.result() for f in futures]

    def _bulk(self, s: requests.Session, key: str, window: tuple[tuple[int, int], list[str]]) -> dict:
        """run_id -> (steps, timestamps, values) of one key in one step window."""
        (lo, hi), run_ids = window
        params = {
            "run_ids": run_ids,
            "metric_key": key,
            "start_step": lo,
            "end_step": hi,
            "max_results": BULK_MAX_RESULTS,
        }
        call = f"get-history-bulk-interval key={key} steps {lo}..{hi} ({len(run_ids)} runs)"
        body = self._get(s, "/ajax-api/2.0/mlflow/metrics/get-history-bulk-interval", params, call)
        rows: dict[str, tuple[list, list, list]] = {rid: ([], [], []) for rid in run_ids}
        for m in body.get("metrics", []):
            r = rows.setdefault(m["run_id"], ([], [], []))
            r[0].append(m.get("step", 0))
            r[1].append(m.get("timestamp", 0))
            r[2].append(m.get("value", 0.0))
        try:
            return {
                rid: (np.array(a, np.int64), np.array(b, np.int64), np.array(c, np.float64))
                for rid, (a, b, c) in rows.items()
            }
        except (TypeError, ValueError, OverflowError) as e:
            raise call_error(self.where, call, f"unreadable point: {e}") from None

    def _new_session(self) -> requests.Session:
        s = requests.Session()
        s.headers.update(self._http["headers"])
        s.verify = self._http["verify"]
        if self._http["cert"]:
            s.cert = self._http["cert"]
        return s

    def _history(
        self, s: requests.Session, run_id: str, key: str
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """All points of one key of one run, following next_page_token."""
        steps: list[int] = []
        stamps: list[int] = []
        values: list = []
        token, page, seen = None, 1, set()
        while True:
            call = f"get-history run={run_id} key={key}" + (f" page {page}" if page > 1 else "")
            params = {"run_id": run_id, "metric_key": key, "max_results": HISTORY_PAGE}
            if token:
                params["page_token"] = token
            body = self._get(s, "/api/2.0/mlflow/metrics/get-history", params, call)
            metrics = body.get("metrics", [])
            # proto3 JSON may omit a field at its default (0): .get keeps that meaning
            steps += [m.get("step", 0) for m in metrics]
            stamps += [m.get("timestamp", 0) for m in metrics]
            values += [m.get("value", 0.0) for m in metrics]
            token = next_token(body.get("next_page_token"), seen, call, self.where)
            page += 1
            if not token:
                break
        if not steps:
            # get-history answers 200 {} for a run that does not exist: ask runs/get, which says 404
            self._get(
                s, "/api/2.0/mlflow/runs/get", {"run_id": run_id}, f"get-history run={run_id} key={key}"
            )
        try:  # numpy reads the "NaN" / "Infinity" strings of protobuf's JSON as floats
            return (
                np.array(steps, dtype=np.int64),
                np.array(stamps, dtype=np.int64),
                np.array(values, dtype=np.float64),
            )
        except (TypeError, ValueError, OverflowError) as e:
            raise call_error(
                self.where, f"get-history run={run_id} key={key}", f"unreadable point: {e}"
            ) from None

    def _get(self, s: requests.Session, path: str, params: dict, call: str) -> dict:
        with call_span(f"GET {path}", call, "GET", self.tracking_uri + path) as span:
            body = self._get_traced(s, path, params, call, span)
            if span.is_recording():
                rows = sum(len(v) for v in body.values() if isinstance(v, list))
                span.set_attribute(tracing.ROWS, rows)
            return body

    def _get_traced(self, s: requests.Session, path: str, params: dict, call: str, span) -> dict:
        delay = 0.5
        for attempt in range(1, self.retries + 1):
            try:
                r = s.get(self.tracking_uri + path, params=params, timeout=self.timeout_s)
            except (requests.ConnectionError, requests.Timeout) as e:
                if attempt == self.retries:
                    raise call_error(
                        self.where, call, f"no answer after {attempt} tries: {type(e).__name__}: {e}"
                    ) from None
            else:
                if span.is_recording():
                    span.set_attributes(
                        {
                            tracing.HTTP_STATUS: r.status_code,
                            tracing.HTTP_RESEND_COUNT: attempt - 1,
                            tracing.RESPONSE_BYTES: len(r.content),
                        }
                    )
                if r.status_code == 200:
                    try:
                        return json.loads(r.content)
                    except ValueError as e:
                        raise call_error(
                            self.where, call, f"unreadable answer: {e}: {r.text[:200]!r}"
                        ) from None
                if r.status_code not in _RETRY_STATUS:
                    raise call_error(self.where, call, _describe(r))
                if attempt == self.retries:
                    raise call_error(self.where, call, f"{_describe(r)} (after {attempt} tries)")
                delay = max(delay, _retry_after(r))
            time.sleep(delay)
            delay *= 2
        raise AssertionError("unreachable")


def http_settings(auth: MlflowAuth) -> dict:
    """Headers and TLS options for our own REST calls."""
    headers = {"Accept-Encoding": "identity"}  # loopback/LAN: gzip would cost the server more CPU
    if auth.username and auth.password:  # MLflow's precedence: basic over bearer
        basic = base64.standard_b64encode(f"{auth.username}:{auth.password}".encode()).decode()
        headers["Authorization"] = "Basic " + basic
    elif auth.token:
        headers["Authorization"] = f"Bearer {auth.token}"
    return {
        "headers": headers,
        "verify": False if auth.insecure_tls else (auth.server_cert_path or True),
        "cert": auth.client_cert_path or None,
    }


def _describe(r: requests.Response) -> str:
    """HTTP status plus MLflow's error_code and message, or the start of whatever body came back."""
    try:
        body = r.json()
        text = f"{body.get('error_code', '')}: {body.get('message', '')}".strip(": ")
    except (ValueError, AttributeError):
        text = r.text[:300].strip()
    return f"HTTP {r.status_code} {text}".rstrip()


def _retry_after(r: requests.Response) -> float:
    try:
        return min(30.0, float(r.headers.get("Retry-After", 0)))
    except ValueError:
        return 0.0


def bulk_requests(runs: list[MlflowRun]) -> list[tuple[str, tuple[tuple[int, int], list[str]]]]:
    """(key, ((start_step, end_step), run_ids)) for every step window of every key, ≤ 100 runs each.

    Windows hold BULK_MAX_RESULTS - 1 steps, so a run with one point per step never fills one; the
    first starts at int32's minimum so negative steps are not lost. Keys of runs without a known latest
    step, or past int32, are left out: get-history reads them."""
    by_key: dict[str, list[tuple[str, int]]] = {}
    for r in runs:
        for k in r.metric_keys:
            last = r.latest_steps.get(k)
            if last is not None and last <= _INT32[1]:
                by_key.setdefault(k, []).append((r.run_id, last))
    out = []
    width = BULK_MAX_RESULTS - 1
    for key, members in sorted(by_key.items()):
        members.sort(key=lambda m: m[1])
        for i in range(0, len(members), BULK_MAX_RUNS):
            batch = members[i : i + BULK_MAX_RUNS]
            ids, top = [m[0] for m in batch], max(0, batch[-1][1])
            lo = 0
            while lo <= top:
                hi = min(lo + width - 1, _INT32[1])
                out.append((key, ((_INT32[0] if lo == 0 else lo, hi), ids)))
                lo = hi + 1
    return out
