"""Backend-store mode against a REAL PostgreSQL holding MLflow's own tables, reached through the
documented bare `postgresql://` form of FOXHUNT_MLFLOW_BACKEND_STORE_URI (psycopg2 installed, psycopg 3
not). PostgreSQL: foxhunt_obs/sandbox/servers/postgres.py (Debian's `postgresql`, `make postgresql`)."""

from __future__ import annotations

import math

import pytest
from mlflow.entities import Metric, Param, RunStatus, RunTag
from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

from foxhunt_obs.lib.sources.mlflow import MlflowSource
from foxhunt_obs.sandbox.servers import postgres as pg

pytestmark = [
    pytest.mark.servers,
    pytest.mark.skipif(not pg.available(), reason="PostgreSQL is not installed (make postgresql)"),
]

T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z, ms


def test_a_bare_postgresql_uri_reads_mlflow_runs_from_postgres(tmp_path):
    server = pg.PostgresServer(database="mlflow", user="fox", password="pg-s3cret")
    server.start()
    try:
        assert server.dsn.startswith("postgresql://fox:pg-s3cret@")  # the documented form, no driver
        # MLflow creates its schema itself (its migrations), through the driver that is installed
        store = SqlAlchemyStore(
            server.dsn.replace("postgresql://", "postgresql+psycopg2://", 1), (tmp_path / "art").as_uri()
        )
        exp = store.create_experiment("fox-pg")
        run = store.create_run(exp, user_id="fox", start_time=T0, tags=[], run_name="pg-run")
        rid = run.info.run_id
        values = [0.5, math.nan, 0.25]
        store.log_batch(
            rid,
            metrics=[Metric("loss", v, T0 + 1000 * s, s) for s, v in enumerate(values)],
            params=[Param("lr", "0.1")],
            tags=[RunTag("team", "rl")],
        )
        store.update_run_info(rid, RunStatus.FINISHED, T0 + 5000, "pg-run")
        store.engine.dispose()

        for uri in (server.dsn, server.dsn.replace("postgresql://", "postgres://", 1)):
            src = MlflowSource("", backend_store_uri=uri)
            assert set(src.experiments().values()) >= {"fox-pg"}
            (got,) = [r for r in src.runs() if r.run_id == rid]
            assert (got.run_name, got.status, got.user, got.experiment_name) == (
                "pg-run",
                "FINISHED",
                "fox",
                "fox-pg",
            )
            assert got.params == {"lr": "0.1"} and got.tags["team"] == "rl"
            assert got.metric_keys == ("loss",) and got.latest_steps == {"loss": 2}
            hist = src.histories([got])
            assert hist.column("step").to_pylist() == [0, 1, 2]
            v = hist.column("value").to_pylist()
            assert v[0] == 0.5 and math.isnan(v[1]) and v[2] == 0.25
            assert src.sql.engine().dialect.driver == "psycopg2"
    finally:
        server.stop()
