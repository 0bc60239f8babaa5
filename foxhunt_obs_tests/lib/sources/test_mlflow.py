"""MlflowSource against a real `mlflow server` on 127.0.0.1 (and its SQLite store), and against a tiny
HTTP server that answers what a broken tracking server would, to count retries."""

from __future__ import annotations

import http.server
import math
import os
import sqlite3
import threading
import time
from datetime import datetime, timezone

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from mlflow import MlflowClient
from mlflow.entities import Metric, Param, RunTag

from foxhunt_obs.lib.sources.mlflow import (
    HISTORY_PAGE,
    MlflowAuth,
    MlflowRun,
    MlflowSource,
    MlflowSourceError,
)
from foxhunt_obs.sandbox.servers.local_server import free_port
from foxhunt_obs.sandbox.servers.mlflow_server import MlflowServer

T0 = 1_764_000_000_000  # ms, 2025-11-24
BIG = HISTORY_PAGE + 500  # one key longer than a get-history page (and than get-history-bulk's cut)


def _points(n: int, t0: int, f) -> list[tuple[int, int, float]]:
    return [(s, t0 + s * 1000, f(s)) for s in range(n)]


@pytest.fixture(scope="module")
def mlflow_store(tmp_path_factory):
    """A real tracking server with 2 (+1 deleted) experiments; yields (url, db path, truth).

    truth: run name -> {"id", "status", "deleted", "experiment", "params", "tags", "points": {key: [(step, ts, value)]}}
    """
    tmp = tmp_path_factory.mktemp("mlflow")
    server = MlflowServer(tmp / "store", workdir=tmp).start()
    try:
        c = MlflowClient(server.url)
        exp = {name: c.create_experiment(name) for name in ("fox-a", "fox-b", "fox-gone")}
        odd = [1.5, math.nan, math.inf, -math.inf, 0.0, -2.25, 1e-300, math.nan]
        spec = {
            # name: (experiment, final status or None for RUNNING, deleted, {key: points})
            "a-finished": (
                "fox-a",
                "FINISHED",
                False,
                {
                    "loss": _points(len(odd), T0, lambda s: odd[s])
                    # step 3 and 5 logged again, later, with other values
                    + [(3, T0 + 60_000, 0.125), (5, T0 + 61_000, math.nan)],
                    "reward": _points(40, T0, lambda s: s / 8),
                },
            ),
            "a-failed-big": ("fox-a", "FAILED", False, {"big": _points(BIG, T0, lambda s: (s % 97) / 7)}),
            "a-running": ("fox-a", None, False, {"loss": _points(5, T0 + 5_000, lambda s: 1 / (s + 1))}),
            "a-deleted": ("fox-a", "KILLED", True, {"loss": _points(3, T0, lambda s: -s)}),
            "b-finished": ("fox-b", "FINISHED", False, {"acc": _points(10, T0, lambda s: s / 10)}),
            "b-no-metrics": ("fox-b", "FINISHED", False, {}),
            "gone-run": ("fox-gone", "FINISHED", False, {"loss": _points(2, T0, lambda s: 2.0)}),
        }
        truth = {}
        for i, (name, (e, status, deleted, metrics)) in enumerate(spec.items()):
            params = {"lr": f"{i / 1000:g}", "algo": "ppo"}
            tags = {"pod": f"pod-{i}", "experiment": e}
            run = c.create_run(exp[e], start_time=T0 - 3_600_000 + i, run_name=name)
            rid = run.info.run_id
            c.log_batch(
                rid,
                params=[Param(k, v) for k, v in params.items()],
                tags=[RunTag(k, v) for k, v in tags.items()],
            )
            flat = [Metric(k, v, ts, s) for k, pts in metrics.items() for s, ts, v in pts]
            for j in range(0, len(flat), 1000):  # the REST batch limit
                c.log_batch(rid, metrics=flat[j : j + 1000])
            if status:
                c.set_terminated(rid, status, end_time=T0 + 7_200_000)
            if deleted:
                c.delete_run(rid)
            truth[name] = {
                "id": rid,
                "status": status or "RUNNING",
                "deleted": deleted,
                "experiment": e,
                "params": params,
                "tags": {**tags, "mlflow.runName": name},
                "points": metrics,
            }
        c.delete_experiment(exp["fox-gone"])  # MLflow marks its runs deleted with it
        truth["gone-run"]["deleted"] = True
        yield server.url, tmp / "store" / "mlflow.db", truth
    finally:
        server.stop()


def _by_name(runs: list[MlflowRun]) -> dict[str, MlflowRun]:
    return {r.run_name: r for r in runs}


def _expected_table(truth: dict, names) -> pa.Table:
    rows = []
    for name in names:
        for key, pts in truth[name]["points"].items():
            rows += [(truth[name]["id"], key, s, ts, v) for s, ts, v in pts]
    rows.sort(key=lambda r: (r[0], r[1], r[2], r[3]))
    cols = list(zip(*rows))
    return pa.table(
        {
            "run_id": pa.array(cols[0], pa.string()),
            "key": pa.array(cols[1], pa.string()),
            "step": pa.array(cols[2], pa.int64()),
            "ts": pa.array(cols[3], pa.int64()).cast(pa.timestamp("ms", tz="UTC")),
            "value": pa.array(cols[4], pa.float64()),
        }
    )


def _assert_tables_equal(got: pa.Table, want: pa.Table) -> None:
    assert got.schema == want.schema
    assert got.num_rows == want.num_rows
    for name in ("run_id", "key", "step", "ts"):
        assert got.column(name).to_pylist() == want.column(name).to_pylist(), name
    # NaN == NaN here; +-inf must come back as inf, not as MLflow's stored +-DBL_MAX
    np.testing.assert_array_equal(got.column("value").to_numpy(), want.column("value").to_numpy())


# ---- runs ----------------------------------------------------------------------------------------


@pytest.mark.servers
def test_runs_finds_every_run_deleted_ones_flagged(mlflow_store):
    url, _, truth = mlflow_store
    src = MlflowSource(url)
    exps = src.experiments()
    assert {"Default", "fox-a", "fox-b", "fox-gone"} <= set(exps.values())
    runs = _by_name(src.runs())
    assert set(runs) == set(truth)
    for name, t in truth.items():
        r = runs[name]
        assert (r.run_id, r.status, r.deleted, r.experiment_name) == (
            t["id"],
            t["status"],
            t["deleted"],
            t["experiment"],
        )
        assert exps[r.experiment_id] == t["experiment"]
        assert r.params == t["params"]
        assert {k: r.tags[k] for k in t["tags"]} == t["tags"]
        assert r.metric_keys == tuple(sorted(t["points"]))
        # MLflow's latest metric of a key is its point of highest (step, ts): a step logged again
        # later, out of order, is not it
        last = max((max(pts, key=lambda p: p[:2])[1] for pts in t["points"].values()), default=None)
        assert r.last_metric_time == (datetime.fromtimestamp(last / 1000, timezone.utc) if last else None)
        assert r.start_time is not None and r.start_time.tzinfo is not None
        assert (r.end_time is None) == (t["status"] == "RUNNING")
    assert runs["a-deleted"].deleted and not runs["a-finished"].deleted


@pytest.mark.servers
def test_experiment_filter_and_paging(mlflow_store):
    url, _, truth = mlflow_store
    only_b = MlflowSource(url, experiments=["fox-b"]).runs()
    assert {r.run_name for r in only_b} == {"b-finished", "b-no-metrics"}
    # a deleted experiment's runs are there when the filter names it
    assert {r.run_name for r in MlflowSource(url, experiments=["fox-gone"]).runs()} == {"gone-run"}
    full = sorted(MlflowSource(url).runs(), key=lambda r: r.run_id)
    paged = sorted(MlflowSource(url, page_size=2).runs(), key=lambda r: r.run_id)
    assert paged == full and len(paged) == len(truth)
    with pytest.raises(MlflowSourceError, match="experiments not found: no-such-exp"):
        MlflowSource(url, experiments=["fox-a", "no-such-exp"]).runs()


# ---- histories -----------------------------------------------------------------------------------


@pytest.mark.servers
def test_histories_equal_what_was_logged(mlflow_store):
    url, _, truth = mlflow_store
    src = MlflowSource(url, workers=4)
    runs = src.runs()
    got = src.histories(runs)
    _assert_tables_equal(got, _expected_table(truth, truth))
    ids = {n: t["id"] for n, t in truth.items()}
    big = got.filter(pc.equal(got.column("run_id"), ids["a-failed-big"]))
    assert big.num_rows == BIG  # paged past HISTORY_PAGE
    loss = got.filter(
        pc.and_(pc.equal(got.column("run_id"), ids["a-finished"]), pc.equal(got.column("key"), "loss"))
    )
    v = loss.column("value").to_numpy()
    assert np.isnan(v).sum() == 3 and np.isposinf(v).sum() == 1 and np.isneginf(v).sum() == 1
    assert loss.column("step").to_pylist() == [0, 1, 2, 3, 3, 4, 5, 5, 6, 7]
    assert got.column("ts").type == pa.timestamp("ms", tz="UTC")
    # a deleted run's history stays readable; a run without metrics adds nothing
    assert src.histories([r for r in runs if r.run_name in ("a-deleted", "b-no-metrics")]).num_rows == 3
    assert src.histories([]).num_rows == 0


@pytest.mark.servers
def test_backend_store_mode_gives_the_same(mlflow_store):
    url, db, truth = mlflow_store
    rest, sql = MlflowSource(url), MlflowSource(url, backend_store_uri=f"sqlite:///{db}")
    assert sql.experiments() == rest.experiments()
    rest_runs = sorted(rest.runs(), key=lambda r: r.run_id)
    sql_runs = sorted(sql.runs(), key=lambda r: r.run_id)
    assert sql_runs == rest_runs
    _assert_tables_equal(sql.histories(sql_runs), rest.histories(rest_runs))
    only_b = MlflowSource("", experiments=["fox-b"], backend_store_uri=f"sqlite:///{db}").runs()
    assert {r.run_name for r in only_b} == {"b-finished", "b-no-metrics"}
    # opened read-only: this process cannot write MLflow's store
    con = sql.sql.engine().raw_connection()
    try:
        with pytest.raises(sqlite3.OperationalError, match="readonly"):
            con.cursor().execute("DELETE FROM metrics")
    finally:
        con.close()


def test_backend_store_errors_name_the_store(tmp_path):
    with pytest.raises(MlflowSourceError, match="no sqlite file"):
        MlflowSource("", backend_store_uri=f"sqlite:///{tmp_path}/none.db").runs()
    sqlite3.connect(tmp_path / "empty.db").close()
    with pytest.raises(MlflowSourceError, match=r"empty\.db: experiments: no such table: experiments"):
        MlflowSource("", backend_store_uri=f"sqlite:///{tmp_path}/empty.db").runs()
    pw = MlflowSource("", backend_store_uri="postgresql://fox:s3cret@127.0.0.1:1/mlflow")
    assert "s3cret" not in pw.where()


@pytest.mark.parametrize(
    "uri",
    [
        "postgresql://fox:pg-s3cret@127.0.0.1:1/mlflow",  # the documented form, nothing listening
        "postgres://fox:pg-s3cret@127.0.0.1:1/mlflow",  # libpq's spelling
        "postgresql://fox:pg-s3cret@127.0.0.1:notaport/mlflow",
        "postgresql//fox:pg-s3cret@127.0.0.1/mlflow",  # no colon after the scheme
        "postgresql://fox:xy@pg-s3cret@127.0.0.1:1/mlflow",  # an unescaped @ in the password
        "mysql://fox:pg-s3cret@127.0.0.1:1/mlflow",  # a driver that is not installed, or nothing listening
        "nosuchdb://fox:pg-s3cret@127.0.0.1:1/mlflow",
    ],
)
def test_a_bad_backend_store_uri_names_the_setting_never_the_password(uri):
    with pytest.raises(MlflowSourceError) as e:
        MlflowSource("", backend_store_uri=uri).runs()
    text = str(e.value)
    assert "FOXHUNT_MLFLOW_BACKEND_STORE_URI=" in text
    assert "s3cret" not in text
    assert "No module named 'psycopg'" not in text  # a bare postgresql:// goes through psycopg2
    assert e.value.__cause__ is None and e.value.__suppress_context__


# ---- errors --------------------------------------------------------------------------------------


def _fake_run(run_id: str = "0" * 32, keys=("loss",)) -> MlflowRun:
    return MlflowRun(run_id, "1", "x", "r", "RUNNING", False, None, None, "u", {}, {}, tuple(keys), None)


class _Canned(http.server.BaseHTTPRequestHandler):
    status, body, seen = 503, b"upstream overloaded", []

    def do_GET(self):  # http.server's name
        type(self).seen.append((self.path, self.headers.get("Authorization")))
        self.send_response(self.status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)

    do_POST = do_GET  # MlflowClient searches by POST

    def log_message(self, *a):
        pass


@pytest.fixture
def canned():
    """A server that answers every GET with (status, body); records (path, Authorization) per request."""
    handler = type("Handler", (_Canned,), {"seen": []})
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()

    def set_answer(status: int, body: bytes) -> tuple[str, list]:
        handler.status, handler.body = status, body
        return f"http://127.0.0.1:{srv.server_address[1]}", handler.seen

    yield set_answer
    srv.shutdown()
    srv.server_close()


def test_dead_port_fails_fast_naming_uri_and_call(monkeypatch):
    for var in (
        "MLFLOW_HTTP_REQUEST_MAX_RETRIES",
        "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR",
        "MLFLOW_HTTP_REQUEST_TIMEOUT",
    ):
        monkeypatch.delenv(var, raising=False)
    url = f"http://127.0.0.1:{free_port()}"
    src = MlflowSource(url, retries=2, timeout_s=2)
    t0 = time.monotonic()
    with pytest.raises(MlflowSourceError, match=rf"MLflow at {url}: search_experiments page 1: .*") as e:
        src.runs()
    assert time.monotonic() - t0 < 15
    assert "Connection refused" in str(e.value) or "Max retries" in str(e.value)
    t0 = time.monotonic()
    with pytest.raises(
        MlflowSourceError,
        match=rf"MLflow at {url}: get-history run=0{{32}} key=loss: no answer after 2 tries",
    ):
        src.histories([_fake_run()])
    assert time.monotonic() - t0 < 5
    # the bounds lent to MlflowClient are gone again
    assert "MLFLOW_HTTP_REQUEST_MAX_RETRIES" not in os.environ


@pytest.mark.servers
def test_5xx_is_retried_then_a_clear_error(canned):
    url, seen = canned(503, b'{"error_code": "TEMPORARILY_UNAVAILABLE", "message": "database is locked"}')
    t0 = time.monotonic()
    with pytest.raises(MlflowSourceError) as e:
        MlflowSource(url, retries=3).histories([_fake_run()])
    took = time.monotonic() - t0
    assert len(seen) == 3 and 1.4 < took < 5  # backoff 0.5 s + 1 s
    msg = str(e.value)
    assert msg.startswith(f"MLflow at {url}: get-history run={'0' * 32} key=loss: HTTP 503")
    assert "TEMPORARILY_UNAVAILABLE: database is locked (after 3 tries)" in msg


@pytest.mark.servers
def test_5xx_through_mlflow_client_is_bounded_too(canned, monkeypatch):
    for var in ("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR"):
        monkeypatch.delenv(var, raising=False)
    url, seen = canned(503, b'{"error_code": "TEMPORARILY_UNAVAILABLE", "message": "database is locked"}')
    t0 = time.monotonic()
    with pytest.raises(MlflowSourceError, match=rf"MLflow at {url}: search_experiments page 1: .*503"):
        MlflowSource(url, retries=3).runs()
    assert len(seen) == 3 and time.monotonic() - t0 < 10  # MLflow's defaults: 8 tries, minutes


@pytest.mark.servers
def test_4xx_fails_at_once(canned):
    url, seen = canned(
        404, b'{"error_code": "RESOURCE_DOES_NOT_EXIST", "message": "Run with id=x not found"}'
    )
    with pytest.raises(MlflowSourceError, match="HTTP 404 RESOURCE_DOES_NOT_EXIST: Run with id=x not found"):
        MlflowSource(url, retries=5).histories([_fake_run()])
    assert len(seen) == 1


@pytest.mark.servers
def test_unknown_run_on_the_real_server(mlflow_store):
    # get-history answers 200 {} for a run that does not exist; runs/get says what is wrong
    url, _, _ = mlflow_store
    t0 = time.monotonic()
    with pytest.raises(MlflowSourceError) as e:
        MlflowSource(url).histories([_fake_run("f" * 32)])
    assert time.monotonic() - t0 < 2
    assert (
        f"get-history run={'f' * 32} key=loss: HTTP 404 RESOURCE_DOES_NOT_EXIST: Run with id={'f' * 32} not found"
        in str(e.value)
    )


@pytest.mark.servers
def test_auth_headers_and_no_credentials_in_messages(canned):
    url, seen = canned(403, b'{"error_code": "PERMISSION_DENIED", "message": "no"}')
    token = MlflowAuth(token="tok-123456")
    with pytest.raises(MlflowSourceError) as e:
        MlflowSource(url, auth=token).histories([_fake_run()])
    assert seen[-1][1] == "Bearer tok-123456" and "tok-123456" not in str(e.value)
    both = MlflowAuth(username="fox", password="pw-secret", token="tok-123456")
    with pytest.raises(MlflowSourceError) as e:  # basic wins over bearer, as in MLflow
        MlflowSource(url.replace("://", "://fox:pw-secret@"), auth=both).histories([_fake_run()])
    assert seen[-1][1] == "Basic Zm94OnB3LXNlY3JldA=="
    assert "pw-secret" not in str(e.value) and "MLflow at http://***@127.0.0.1:" in str(e.value)


class _Slow(http.server.BaseHTTPRequestHandler):
    """Accepts the request, then answers too late: a server that times out."""

    calls = 0

    def do_GET(self):  # http.server's name
        type(self).calls += 1
        time.sleep(2.0)
        self.send_response(200)
        self.end_headers()

    def log_message(self, *a):
        pass


@pytest.mark.servers
def test_a_server_that_times_out_is_retried_a_bounded_number_of_times():
    handler = type("Handler", (_Slow,), {"calls": 0})
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{srv.server_address[1]}"
        t0 = time.monotonic()
        with pytest.raises(
            MlflowSourceError, match=rf"MLflow at {url}: get-history run=0{{32}} key=loss: .*2 tries"
        ):
            MlflowSource(url, retries=2, timeout_s=0.3).histories([_fake_run()])
        assert handler.calls == 2 and time.monotonic() - t0 < 3
    finally:
        srv.shutdown()
        srv.server_close()


@pytest.mark.servers
def test_a_window_the_server_would_sample_is_read_again_exactly(mlflow_store):
    """3,000 points at step 0 (log_metric without a step): get-history-bulk-interval returns a sample of
    2,500, so that (run, key) must be re-read with get-history — every point, nothing sampled."""
    url, _, _ = mlflow_store
    c = MlflowClient(url)
    exp = c.create_experiment("fox-same-step")
    run = c.create_run(exp, run_name="same-step")
    rid = run.info.run_id
    for i in range(0, 3000, 1000):
        c.log_batch(rid, metrics=[Metric("x", float(i + j), T0 + i + j, 0) for j in range(1000)])
    src = MlflowSource(url, experiments=["fox-same-step"])
    (r,) = src.runs()
    assert r.latest_steps == {"x": 0}
    table = src.histories([r])
    assert table.num_rows == 3000
    assert sorted(table.column("value").to_pylist()) == [float(i) for i in range(3000)]


@pytest.mark.servers
@pytest.mark.timeout(60)
def test_a_repeated_page_token_stops_every_page_loop(canned):
    """A server (or proxy) that hands out the same next_page_token again would page forever:
    experiments, runs and histories stop on the repeat, naming the call."""
    looping = b'{"experiments": [{"experiment_id": "1", "name": "e"}], "runs": [], "metrics": [], "next_page_token": "AAA"}'
    url, seen = canned(200, looping)
    src = MlflowSource(url, retries=1)
    with pytest.raises(MlflowSourceError, match=r"search_experiments page 2: next_page_token 'AAA' repeated"):
        src.runs()
    assert len(seen) == 2
    with pytest.raises(
        MlflowSourceError, match=r"get-history run=0{32} key=loss page 2: next_page_token 'AAA' repeated"
    ):
        src.histories([_fake_run()])


@pytest.mark.servers
def test_mlflow_client_calls_use_the_given_auth_and_leave_no_variable_behind(canned, monkeypatch):
    """search_experiments goes through MlflowClient, which reads auth only from MLFLOW_TRACKING_*: the
    source's MlflowAuth is set there for the call, then removed (a variable the user set is kept)."""
    for var in ("MLFLOW_TRACKING_TOKEN", "MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD"):
        monkeypatch.delenv(var, raising=False)
    url, seen = canned(403, b'{"error_code": "PERMISSION_DENIED", "message": "no"}')
    with pytest.raises(MlflowSourceError, match="search_experiments") as e:
        MlflowSource(url, auth=MlflowAuth(token="tok-from-resource-42"), retries=1).runs()
    assert seen and {auth for _, auth in seen} == {"Bearer tok-from-resource-42"}
    assert "tok-from-resource-42" not in str(e.value)
    assert "MLFLOW_TRACKING_TOKEN" not in os.environ
