"""MLflow end to end: the `small` scenario's training runs in a real mlflow server, real Dagster runs,
the lake compared with the scenario's ground truth."""

import os
from pathlib import Path

import dagster as dg
import numpy as np
import pandas as pd
import pytest
from mlflow.tracking import MlflowClient

from foxhunt_obs.definitions import defs
from foxhunt_obs.lib.lake import Lake
from foxhunt_obs.lib.schemas import TRAINING_METRICS, TRAINING_RUNS
from foxhunt_obs.sandbox.servers.mlflow_server import MlflowServer, copy_store
from foxhunt_obs.sandbox.writers import training

DAY = "2026-11-16"


def run_job(instance=None) -> dg.ExecuteInProcessResult:
    return (
        defs()
        .resolve_job_def("training_job")
        .execute_in_process(
            instance=instance or dg.DagsterInstance.ephemeral(), partition_key=DAY, raise_on_error=False
        )
    )


def failure(result) -> str:
    return "\n".join(e.step_failure_data.error.message for e in result.all_events if e.is_step_failure)


def materialization(result, key: str) -> dict:
    (m,) = [e for e in result.get_asset_materialization_events() if e.asset_key.to_user_string() == key]
    return {k: v.value for k, v in m.materialization.metadata.items()}


@pytest.fixture(scope="module")
def store(small_mlflow_store):
    return small_mlflow_store


@pytest.fixture(scope="module")
def server(store, tmp_path_factory):
    work = tmp_path_factory.mktemp("mlflow")
    copy_store(store, work / "store")
    with MlflowServer(work / "store", workdir=work) as srv:
        yield srv


@pytest.fixture(scope="module")
def ingested(server, tmp_path_factory):
    lake = Lake(str(tmp_path_factory.mktemp("lake")))
    saved = {k: os.environ.get(k) for k in ("FOXHUNT_LAKE", "MLFLOW_TRACKING_URI")}
    os.environ.update(FOXHUNT_LAKE=lake.root, MLFLOW_TRACKING_URI=server.url)
    first = run_job()
    assert first.success, failure(first)
    yield lake, first
    for k, v in saved.items():
        os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)


def test_runs_equal_the_ground_truth(small, ingested):
    lake, _ = ingested
    expected = training.training_runs(small).set_index("run_name")
    got = lake.read_partition(TRAINING_RUNS, "current").to_pandas().set_index("run_name")
    assert sorted(got.index) == sorted(expected.index)  # deleted runs included
    for name, row in expected.iterrows():
        g = got.loc[name]
        assert g["status"] == row["status"] and bool(g["deleted"]) == bool(row["deleted"]), name
        assert g["experiment"] == row["experiment"] and g["pod"] == (row["pod"] or "")
        assert pd.Timestamp(g["start_time"]) == row["start"]
        if row["status"] != "RUNNING":
            assert pd.Timestamp(g["end_time"]) == row["end"]


def test_metrics_equal_the_ground_truth_nan_and_inf_kept(small, ingested):
    lake, _ = ingested
    expected = training.training_metrics(small)
    got = lake.query(
        "SELECT r.run_name, m.key, m.step, m.ts, m.value FROM training_metrics m "
        "JOIN (SELECT run_id, run_name FROM training_runs) r USING (run_id) ORDER BY 1, 2, 3",
        tables=[TRAINING_METRICS, TRAINING_RUNS],
    ).to_pandas()
    assert len(got) == len(expected)  # every point, all of the day
    m = expected.merge(got, on=["run_name", "key", "step"], suffixes=("_t", ""))
    assert len(m) == len(expected)
    assert (m["ts"] == m["ts_t"]).all()
    a, b = m["value"].to_numpy(), m["value_t"].to_numpy()
    assert np.array_equal(np.isnan(a), np.isnan(b)) and np.array_equal(np.isinf(a), np.isinf(b))
    ok = np.isfinite(b)
    np.testing.assert_allclose(a[ok], b[ok], rtol=1e-12)
    assert (np.isposinf(a)).sum() == (np.isposinf(b)).sum() > 0  # ±Inf restored from MLflow's ±1.797e308


def test_health_flags_exactly_the_injected_incidents(small, ingested):
    lake, _ = ingested
    health = lake.query("SELECT * FROM training_health").to_pandas().set_index("run_name")
    truth = training.training_health(small).set_index("run_name")
    for name, t in truth.iterrows():
        h = health.loc[name]
        assert bool(h["loss_nonfinite"] > 0) == bool(t["nan_count"] + t["inf_count"] > 0), name
        assert h["loss_nonfinite"] == t["nan_count"] + t["inf_count"], name
        assert bool(h["entropy_collapse"]) == pd.notna(t["entropy_collapse_at"]), name
        assert bool(h["success_drop"]) == pd.notna(t["success_drop_at"]), name
        assert bool(h["stalled"]) == pd.notna(t["stalled_at"]), name
        assert bool(h["accuracy_out_of_band"]) == pd.notna(t["accuracy_out_of_band_from"]), name
        if h["bottleneck"]:
            assert h["bottleneck"] == t["bottleneck"], name


def test_a_second_run_adds_nothing(ingested):
    lake, first = ingested
    before = lake.query("SELECT * FROM training_metrics ORDER BY run_id, key, step, ts").to_pandas()
    second = run_job()
    assert second.success, failure(second)
    meta = materialization(second, "training_runs")
    assert meta["new_points"] == 0
    running = (
        lake.query("SELECT count(*) AS n FROM training_runs WHERE status = 'RUNNING'").column("n")[0].as_py()
    )
    assert meta["histories_read"] == running  # only runs that can still change are read again
    after = lake.query("SELECT * FROM training_metrics ORDER BY run_id, key, step, ts").to_pandas()
    assert after.equals(before)  # pandas: NaN equals NaN (Arrow's equals says NaN != NaN)


def test_a_run_that_finishes_between_two_runs_is_updated(server, ingested):
    lake, _ = ingested
    snap = lake.read_partition(TRAINING_RUNS, "current").to_pandas()
    clean = snap[(snap["status"] == "RUNNING")].iloc[0]
    MlflowClient(server.url).set_terminated(clean["run_id"], "FINISHED")
    result = run_job()
    assert result.success, failure(result)
    after = lake.read_partition(TRAINING_RUNS, "current").to_pandas().set_index("run_id").loc[clean["run_id"]]
    assert after["status"] == "FINISHED" and after["history_status"] == "FINISHED"
    assert pd.notna(after["end_time"])
    # read once more after it ended, then never again
    again = run_job()
    assert (
        materialization(again, "training_runs")["histories_read"]
        == materialization(result, "training_runs")["histories_read"] - 1
    )


def test_mlflow_down_fails_clearly_and_leaves_the_lake_alone(store, tmp_path, monkeypatch):
    copy_store(store, tmp_path / "store")
    srv = MlflowServer(tmp_path / "store", workdir=tmp_path).start()
    lake = Lake(str(tmp_path / "lake"))
    monkeypatch.setenv("FOXHUNT_LAKE", lake.root)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", srv.url)
    assert run_job().success
    files = sorted(p for p in Path(lake.root).rglob("*.parquet"))
    before = {p: p.read_bytes() for p in files}
    srv.stop()
    result = run_job()
    assert not result.success
    message = failure(result)
    assert srv.url in message and "training_runs" in message
    assert {p: p.read_bytes() for p in sorted(Path(lake.root).rglob("*.parquet"))} == before
