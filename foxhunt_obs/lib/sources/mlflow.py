"""MLflow client: runs through MlflowClient, metric histories by the fastest exact path there is.

Over REST the server's time per point is what counts (ORM rows, protobuf, JSON: tens of µs a point,
far more than parsing here). `get-history-bulk-interval` answers one key of up to 100 runs per call
in step windows and costs the server about half of what `get-history` (one run and key at a time)
does; it samples a run's window above 2,500 rows, so a window that comes back full is read again,
exactly, with `get-history`. Both run on a thread pool to keep several server workers busy. The ajax
`get-history-bulk` endpoint is never used: it cuts every answer at 25,000 points without saying so.

Backend-store mode reads MLflow's own SQL tables (a read replica, or the sqlite file), read-only, with
one query per chunk of runs: no server in the way, by far the fastest path.

What the server sends, as measured on MLflow 3.17: NaN as the JSON string "NaN"; ±Inf as
±1.7976931348623157e308, because the SQL store saves ±Inf as ±DBL_MAX; both are mapped back here
(NaN kept, ±DBL_MAX → ±inf). An unknown run_id gets `200 {}` from get-history, so an empty answer for
a key the run listed is checked with `runs/get`, which says 404 RESOURCE_DOES_NOT_EXIST.
"""

from __future__ import annotations

import base64
import contextvars
import json
import math
import os
import sqlite3
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from urllib.parse import quote

import numpy as np
import pyarrow as pa
import requests

from foxhunt_obs.lib import tracing
from foxhunt_obs.lib.errors import InputError
from foxhunt_obs.lib.redact import redact_url, remember, scrub

# Databricks rejects get-history pages above 25,000; the OSS server takes any size (1e10 tried) but
# pages by OFFSET, so bigger pages would only save round trips on keys longer than this.
HISTORY_PAGE = 25_000
BULK_MAX_RESULTS = 2_500  # the server's MAX_RESULTS_PER_RUN for get-history-bulk-interval
BULK_MAX_RUNS = 100  # and its MAX_RUNS_GET_METRIC_HISTORY_BULK
_INT32 = (-(2**31), 2**31 - 1)
_EMPTY = (np.empty(0, np.int64), np.empty(0, np.int64), np.empty(0, np.float64))
_DBL_MAX = 1.7976931348623157e308  # how MLflow's SQL store saves ±Inf
_RETRY_STATUS = {429, 500, 502, 503, 504}
_SQL_CHUNK = 500  # ids per `IN (...)`: below every database's bound-parameter limit
_METRICS_CHUNK = 16  # runs per metrics query: bounds the row tuples alive at once

HISTORY_SCHEMA = pa.schema(
    [
        ("run_id", pa.string()),
        ("key", pa.string()),
        ("step", pa.int64()),
        ("ts", pa.timestamp("ms", tz="UTC")),
        ("value", pa.float64()),
    ]
)
_SORT = [("run_id", "ascending"), ("key", "ascending"), ("step", "ascending"), ("ts", "ascending")]


class MlflowSourceError(InputError, RuntimeError):
    """A failed call; the message names the tracking URI (never credentials), the call, the HTTP status
    and MLflow's own error text."""


@dataclass(frozen=True)
class MlflowRun:
    run_id: str
    experiment_id: str
    experiment_name: str
    run_name: str
    status: str  # RUNNING / SCHEDULED / FINISHED / FAILED / KILLED
    deleted: bool  # lifecycle_stage == "deleted" (deleting an experiment marks its runs deleted too)
    start_time: datetime | None  # UTC
    end_time: datetime | None
    user: str
    params: dict[str, str]
    tags: dict[str, str]
    metric_keys: tuple[str, ...]  # keys of the run's latest metrics
    last_metric_time: datetime | None  # max timestamp among the run's latest metrics (UTC)
    latest_steps: dict[str, int] = field(default_factory=dict)  # key -> step of its latest metric (max step)


@dataclass(frozen=True)
class MlflowAuth:
    """Auth and TLS of foxhunt_obs's own REST calls: the values MLflow's client takes from its
    MLFLOW_TRACKING_* variables (basic auth over the bearer token, as MLflow does)."""

    username: str = ""
    password: str = field(default="", repr=False)
    token: str = field(default="", repr=False)
    insecure_tls: bool = False
    server_cert_path: str = ""
    client_cert_path: str = ""

    def __post_init__(self) -> None:
        remember(self.password, self.token)


class MlflowSource:
    """Runs and metric histories of an MLflow tracking server, or of its SQL store directly.

    `retries` counts tries of one request (as in the Prometheus client): 3 means at most 2 retries,
    with backoff 0.5 s, 1 s, ...; only connection errors, timeouts, 429 and 5xx are retried.
    """

    def __init__(
        self,
        tracking_uri: str,
        *,
        experiments: Sequence[str] | None = None,
        backend_store_uri: str | None = None,
        workers: int = 8,
        timeout_s: float = 60.0,
        retries: int = 3,
        page_size: int = 1000,
        auth: MlflowAuth | None = None,
    ):
        if isinstance(experiments, str):  # a bare name would be read as a list of letters
            experiments = [experiments]
        self.tracking_uri = (tracking_uri or "").rstrip("/")
        self.experiment_names = list(experiments) if experiments is not None else None
        self.backend_store_uri = backend_store_uri
        self.workers = max(1, workers)
        self.timeout_s = timeout_s
        self.retries = max(1, retries)
        self.page_size = page_size
        self._uri = redact_url(self.tracking_uri)
        self._engine = None
        auth = auth or MlflowAuth()
        self._http = _http_settings(auth)
        self._auth_env = _auth_env(auth)

    # -- experiments and runs --------------------------------------------------------------------
    def experiments(self) -> dict[str, str]:
        """id -> name of every experiment (active and deleted), only the named ones when a filter is set."""
        if self.backend_store_uri:
            found = self._sql_experiments()
        else:
            found = self._rest_experiments()
        return self._filter_experiments(found)

    def runs(self) -> list[MlflowRun]:
        """Every run of those experiments, deleted ones included (flagged `deleted`)."""
        exps = self.experiments()
        if not exps:
            return []
        if self.backend_store_uri:
            return self._sql_runs(exps)
        return self._rest_runs(exps)

    def histories(self, runs: Iterable[MlflowRun]) -> pa.Table:
        """Every point of every metric key of each run, sorted by run_id, key, step, ts."""
        runs = list(runs)
        if not runs:
            return HISTORY_SCHEMA.empty_table()
        if self.backend_store_uri:
            return self._sql_histories(runs)
        return self._rest_histories(runs)

    def _filter_experiments(self, found: dict[str, str]) -> dict[str, str]:
        if self.experiment_names is None:
            return found
        wanted = set(self.experiment_names)
        missing = sorted(wanted - set(found.values()))
        if missing:  # a typo must not read as "no runs"
            raise MlflowSourceError(
                f"MLflow at {self._where()}: experiments not found: {', '.join(missing)} "
                f"(known: {', '.join(sorted(found.values())) or 'none'})"
            )
        return {i: n for i, n in found.items() if n in wanted}

    # -- REST: MlflowClient for experiments and runs -----------------------------------------------
    def _client(self):
        from mlflow import MlflowClient

        return MlflowClient(tracking_uri=self.tracking_uri)

    def _rest_experiments(self) -> dict[str, str]:
        from mlflow.entities import ViewType

        client, found, token, page, seen = self._client(), {}, None, 1, set()
        while True:
            with self._mlflow_call(f"search_experiments page {page}"):
                batch = client.search_experiments(
                    view_type=ViewType.ALL, max_results=self.page_size, page_token=token
                )
            found.update({e.experiment_id: e.name for e in batch})
            token = self._next_token(batch.token, seen, f"search_experiments page {page}")
            page += 1
            if not token:
                return found

    def _rest_runs(self, exps: dict[str, str]) -> list[MlflowRun]:
        from mlflow.entities import ViewType

        client, out, token, page, seen = self._client(), {}, None, 1, set()
        while True:
            with self._mlflow_call(f"search_runs page {page}"):
                batch = client.search_runs(
                    list(exps),
                    run_view_type=ViewType.ALL,
                    max_results=self.page_size,
                    page_token=token,
                )
            for r in batch:
                latest = r.data.to_proto().metrics  # the public way to the latest metrics' timestamps
                info = r.info
                # by run_id: offset paging can repeat a run when another starts between two pages
                out[info.run_id] = MlflowRun(
                    run_id=info.run_id,
                    experiment_id=str(info.experiment_id),
                    experiment_name=exps.get(str(info.experiment_id), ""),
                    run_name=info.run_name or "",
                    status=str(info.status),
                    deleted=info.lifecycle_stage == "deleted",
                    start_time=_dt(info.start_time),
                    end_time=_dt(info.end_time),
                    user=info.user_id or "",
                    params=dict(r.data.params),
                    tags=dict(r.data.tags),
                    metric_keys=tuple(sorted({m.key for m in latest})),
                    last_metric_time=_dt(max((m.timestamp for m in latest), default=None)),
                    latest_steps={m.key: int(m.step) for m in latest},
                )
            token = self._next_token(batch.token, seen, f"search_runs page {page}")
            page += 1
            if not token:
                return list(out.values())

    def _next_token(self, token: str | None, seen: set[str], call: str) -> str | None:
        """The next page's token; one the server already gave would page forever: an error."""
        if token and token in seen:
            raise self._error(call, f"next_page_token {token[:40]!r} repeated: the server pages in a loop")
        if token:
            seen.add(token)
        return token

    @contextmanager
    def _mlflow_call(self, call: str) -> Iterator[None]:
        """Run an MlflowClient call with its HTTP retries bounded by ours, its errors wrapped in ours.

        MlflowClient reads its retry settings from the environment on every request; left at their
        defaults (7 retries, backoff factor 2, 120 s timeout) a dead server takes minutes to fail. Its
        auth and TLS come from variables too: the source's MlflowAuth is set there for the call, so
        listing runs and reading histories authenticate alike. Variables the user set are left alone.
        """
        from mlflow.exceptions import MlflowException

        bounds = {
            "MLFLOW_HTTP_REQUEST_MAX_RETRIES": str(self.retries - 1),
            "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",  # an int for MLflow: sleeps 0 s, 2 s, 4 s, ...
            "MLFLOW_HTTP_REQUEST_TIMEOUT": str(max(1, math.ceil(self.timeout_s))),
            **self._auth_env,  # MlflowClient takes its auth and TLS from these too, nowhere else
        }
        # The variables are ours while any call needs them (counted), not held under a lock during the
        # call: a call that hangs must not block another thread's (the alert tick gives up on a late one).
        with _ENV_LOCK:
            mine = [k for k in bounds if k not in os.environ or k in _ENV_OURS]
            for k in mine:
                os.environ.setdefault(k, bounds[k])
                _ENV_OURS[k] = _ENV_OURS.get(k, 0) + 1
        try:
            with self._span(f"MlflowClient {call.split(' page ')[0]}", call, None, self.tracking_uri):
                yield
        except MlflowException as e:
            raise self._error(call, _mlflow_text(e)) from None
        except requests.RequestException as e:
            raise self._error(call, f"{type(e).__name__}: {e}") from None
        finally:
            with _ENV_LOCK:
                for k in mine:
                    _ENV_OURS[k] -= 1
                    if not _ENV_OURS[k]:
                        del _ENV_OURS[k]
                        os.environ.pop(k, None)

    # -- REST: histories ---------------------------------------------------------------------------
    def _rest_histories(self, runs: list[MlflowRun]) -> pa.Table:
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

        bulk = _bulk_requests(runs)
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
        return _history_table(run_id, key, step, ts, value)

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
            raise self._error(call, f"unreadable point: {e}") from None

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
            token = self._next_token(body.get("next_page_token"), seen, call)
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
            raise self._error(f"get-history run={run_id} key={key}", f"unreadable point: {e}") from None

    def _span(self, name: str, call: str, method: str | None, url: str):
        """The span of one call (lib/tracing.py): the HTTP conventions' attributes and the call's text."""
        attributes = {**tracing.http_attributes(method, url), tracing.SOURCE: "mlflow", tracing.QUERY: call}
        return tracing.span(name, attributes, kind=tracing.CLIENT)

    def _get(self, s: requests.Session, path: str, params: dict, call: str) -> dict:
        with self._span(f"GET {path}", call, "GET", self.tracking_uri + path) as span:
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
                    raise self._error(
                        call, f"no answer after {attempt} tries: {type(e).__name__}: {e}"
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
                        raise self._error(call, f"unreadable answer: {e}: {r.text[:200]!r}") from None
                if r.status_code not in _RETRY_STATUS:
                    raise self._error(call, _describe(r))
                if attempt == self.retries:
                    raise self._error(call, f"{_describe(r)} (after {attempt} tries)")
                delay = max(delay, _retry_after(r))
            time.sleep(delay)
            delay *= 2
        raise AssertionError("unreachable")

    # -- backend-store mode ------------------------------------------------------------------------
    def _engine_or_open(self):
        if self._engine is None:
            import sqlalchemy as sa
            from sqlalchemy.pool import NullPool

            url = sa.engine.make_url(self.backend_store_uri)
            if url.get_backend_name() == "sqlite":
                path = url.database
                if not path or path == ":memory:" or not os.path.exists(path):
                    raise MlflowSourceError(f"MLflow store {self._where()}: no sqlite file at {path!r}")
                # read-only at the file level: this process can never write MLflow's store
                self._engine = sa.create_engine(
                    "sqlite://",
                    creator=lambda: sqlite3.connect(
                        f"file:{quote(os.path.abspath(path))}?mode=ro", uri=True, check_same_thread=False
                    ),
                    poolclass=NullPool,
                )
            else:
                # every statement here is a SELECT this module builds; point it at a read replica or
                # a read-only role all the same. NullPool: nothing stays open between two reads.
                self._engine = sa.create_engine(url, poolclass=NullPool)
        return self._engine

    def _sql(self, call: str, query, raw: bool = False) -> list[tuple]:
        """Rows of a Core query. raw: through the DBAPI cursor, skipping SQLAlchemy's Row objects
        (a third of the time of a million-row read)."""
        import sqlalchemy as sa

        engine = self._engine_or_open()
        attributes = {tracing.SOURCE: "mlflow", tracing.QUERY: call, "db.system.name": engine.dialect.name}
        try:
            with tracing.span(f"SELECT {call}", attributes, kind=tracing.CLIENT) as span:
                rows = self._sql_rows(engine, query, raw)
                tracing.set_attributes(span, {tracing.ROWS: len(rows)})
                return rows
        except (sa.exc.SQLAlchemyError, engine.dialect.loaded_dbapi.Error) as e:
            text = str(getattr(e, "orig", None) or e).splitlines()[0]
            raise MlflowSourceError(f"MLflow store {self._where()}: {call}: {scrub(text)}") from None

    @staticmethod
    def _sql_rows(engine, query, raw: bool) -> list[tuple]:
        if not raw:
            with engine.connect() as con:
                return con.execute(query).all()
        c = query.compile(dialect=engine.dialect, compile_kwargs={"render_postcompile": True})
        params = [c.params[n] for n in c.positiontup] if c.positional else c.params
        con = engine.raw_connection()
        try:
            cur = con.cursor()
            cur.execute(c.string, params)
            return cur.fetchall()
        finally:
            con.close()

    def _sql_in(
        self,
        call: str,
        table: str,
        columns: Sequence[str],
        by: str,
        ids: Sequence,
        raw: bool = False,
        chunk: int = _SQL_CHUNK,
    ) -> Iterator[list[tuple]]:
        """SELECT columns FROM table WHERE by IN ids, one list of rows per chunk of ids. SQLAlchemy Core
        quotes the names (`key` is reserved in MySQL) and binds the values."""
        import sqlalchemy as sa

        t = sa.table(table, *(sa.column(c) for c in {*columns, by}))
        for i in range(0, len(ids), chunk):
            part = list(ids[i : i + chunk])
            yield self._sql(call, sa.select(*(t.c[c] for c in columns)).where(t.c[by].in_(part)), raw)

    def _sql_experiments(self) -> dict[str, str]:
        import sqlalchemy as sa

        t = sa.table("experiments", sa.column("experiment_id"), sa.column("name"))
        return {str(i): n for i, n in self._sql("experiments", sa.select(t.c.experiment_id, t.c.name))}

    def _sql_runs(self, exps: dict[str, str]) -> list[MlflowRun]:
        cols = [
            "run_uuid",
            "experiment_id",
            "name",
            "status",
            "lifecycle_stage",
            "start_time",
            "end_time",
            "user_id",
        ]
        runs = list(_flat(self._sql_in("runs", "runs", cols, "experiment_id", [int(i) for i in exps])))
        run_ids = [r[0] for r in runs]
        params: dict[str, dict[str, str]] = {}
        tags: dict[str, dict[str, str]] = {}
        latest: dict[str, list[tuple[str, int, int]]] = {}
        for rid, k, v in _flat(
            self._sql_in("params", "params", ["run_uuid", "key", "value"], "run_uuid", run_ids)
        ):
            params.setdefault(rid, {})[k] = v
        for rid, k, v in _flat(
            self._sql_in("tags", "tags", ["run_uuid", "key", "value"], "run_uuid", run_ids)
        ):
            tags.setdefault(rid, {})[k] = v if v is not None else ""
        for rid, k, t, step in _flat(
            self._sql_in(
                "latest_metrics",
                "latest_metrics",
                ["run_uuid", "key", "timestamp", "step"],
                "run_uuid",
                run_ids,
            )
        ):
            latest.setdefault(rid, []).append((k, t, step))
        out = []
        for rid, exp_id, name, status, stage, start, end, user in runs:
            lm = latest.get(rid, [])
            out.append(
                MlflowRun(
                    run_id=rid,
                    experiment_id=str(exp_id),
                    experiment_name=exps.get(str(exp_id), ""),
                    run_name=name or "",
                    status=status or "",
                    deleted=stage == "deleted",
                    start_time=_dt(start),
                    end_time=_dt(end),
                    user=user or "",
                    params=params.get(rid, {}),
                    tags=tags.get(rid, {}),
                    metric_keys=tuple(sorted({k for k, _, _ in lm})),
                    last_metric_time=_dt(max((t for _, t, _ in lm if t is not None), default=None)),
                    latest_steps={k: int(step) for k, _, step in lm if step is not None},
                )
            )
        return out

    def _sql_histories(self, runs: list[MlflowRun]) -> pa.Table:
        ids = sorted({r.run_id for r in runs})
        cols = ["run_uuid", "key", "step", "timestamp", "value", "is_nan"]
        # a few runs per query, each chunk's row tuples turned into one structured array at once (a
        # C-level pass, twice as fast as zip(*rows)) and dropped: memory stays near the arrays' size
        parts = [
            np.array(rows, dtype=_METRIC_ROW)
            for rows in self._sql_in(
                "metrics", "metrics", cols, "run_uuid", ids, raw=True, chunk=_METRICS_CHUNK
            )
        ]
        a = np.concatenate(parts) if parts else np.empty(0, _METRIC_ROW)
        if not len(a):
            return HISTORY_SCHEMA.empty_table()
        v = a["value"].copy()
        v[a["is_nan"]] = np.nan  # MLflow stores NaN as 0 with is_nan set
        return _history_table(_strings(a["run_uuid"]), _strings(a["key"]), a["step"], a["ts"], v)

    # -- errors ------------------------------------------------------------------------------------
    def _where(self) -> str:
        if self.backend_store_uri:
            return redact_url(self.backend_store_uri)
        return self._uri

    def _error(self, call: str, text: str) -> MlflowSourceError:
        return MlflowSourceError(f"MLflow at {self._uri}: {call}: {scrub(text)}")


_ENV_LOCK = threading.RLock()
_ENV_OURS: dict[str, int] = {}  # MLflow variables we set -> calls in flight that need them
_METRIC_ROW = np.dtype(
    [
        ("run_uuid", object),
        ("key", object),
        ("step", np.int64),
        ("ts", np.int64),
        ("value", np.float64),
        ("is_nan", bool),
    ]
)


def _strings(col: np.ndarray) -> pa.Array:
    """A column of few distinct strings: each distinct one converted once, then repeated by index."""
    import pandas as pd

    codes, uniques = pd.factorize(col)  # hashing in C: a tenth of a dict.setdefault loop
    return pa.array(uniques, pa.string()).take(pa.array(codes))


def _history_table(
    run_id: pa.Array, key: pa.Array, step: np.ndarray, ts: np.ndarray, value: np.ndarray
) -> pa.Table:
    value = np.where(value >= _DBL_MAX, np.inf, np.where(value <= -_DBL_MAX, -np.inf, value))
    table = pa.Table.from_arrays(
        [
            run_id,
            key,
            pa.array(step, pa.int64()),
            pa.array(ts, pa.int64()).cast(pa.timestamp("ms", tz="UTC")),
            pa.array(value, pa.float64()),
        ],
        schema=HISTORY_SCHEMA,
    )
    # value last: the same step logged twice at the same ms sorts the same way on every path
    return table.sort_by([*_SORT, ("value", "ascending")]).combine_chunks()


def _flat(chunks: Iterable[list[tuple]]) -> Iterator[tuple]:
    for rows in chunks:
        yield from rows


def _dt(ms) -> datetime | None:
    if ms is None or ms == 0:  # MLflow leaves end_time unset (None, or 0 in protobuf) while running
        return None
    return datetime.fromtimestamp(int(ms) / 1000, tz=timezone.utc)


def _http_settings(auth: MlflowAuth) -> dict:
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


def _auth_env(auth: MlflowAuth) -> dict[str, str]:
    """The auth given to the source as the variables MlflowClient reads (only those with a value)."""
    values = {
        "MLFLOW_TRACKING_USERNAME": auth.username,
        "MLFLOW_TRACKING_PASSWORD": auth.password,
        "MLFLOW_TRACKING_TOKEN": auth.token,
        "MLFLOW_TRACKING_INSECURE_TLS": "true" if auth.insecure_tls else "",
        "MLFLOW_TRACKING_SERVER_CERT_PATH": auth.server_cert_path,
        "MLFLOW_TRACKING_CLIENT_CERT_PATH": auth.client_cert_path,
    }
    return {k: v for k, v in values.items() if v}


def _mlflow_text(e) -> str:
    code = getattr(e, "error_code", "")
    msg = getattr(e, "message", None) or str(e)
    return f"{code}: {msg}" if code and code not in msg else msg


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


def _bulk_requests(runs: list[MlflowRun]) -> list[tuple[str, tuple[tuple[int, int], list[str]]]]:
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
