"""End to end on a real `mlflow server`: log the `small` scenario's training runs into a store, serve a
copy of it, read it back with MlflowClient and compare with the truth value for value.

Two server starts for the module (~10 s each): build_store's, and the one the checks query; up_mlflow
adds a third."""

from __future__ import annotations

import json
import math
import os
import shutil
import time
import urllib.request

import numpy as np
import pytest
from mlflow import MlflowClient
from mlflow.entities import ViewType

from foxhunt_obs.sandbox.servers import local_server, mlflow_server
from foxhunt_obs.sandbox.servers.local_server import SandboxError
from foxhunt_obs.sandbox.servers.mlflow_server import MlflowServer, build_store, copy_store
from foxhunt_obs.sandbox.story.scenario import load_scenario
from foxhunt_obs.sandbox.writers import training
from foxhunt_obs.sandbox.writers.cache import COMPLETE

pytestmark = pytest.mark.servers


@pytest.fixture(scope="module")
def small():
    return load_scenario("small")


@pytest.fixture(scope="module")
def cache(tmp_path_factory, small):
    root = tmp_path_factory.mktemp("cache")
    return root, build_store(small, root)


@pytest.fixture(scope="module")
def server(cache, tmp_path_factory):
    run = tmp_path_factory.mktemp("run")
    srv = MlflowServer(copy_store(cache[1], run / "mlflow"), workdir=run)
    with srv:
        yield srv


@pytest.fixture(scope="module")
def client(server):
    return MlflowClient(server.url)


@pytest.fixture(scope="module")
def found(client, small):
    exps = {e.name: e.experiment_id for e in client.search_experiments()}
    ids = [exps[e.name] for e in small.experiments]
    return {r.info.run_name: r for r in client.search_runs(ids, run_view_type=ViewType.ALL, max_results=1000)}


def test_cache_is_complete_and_reused(cache, small):
    root, store = cache
    assert store == root / f"small-{small.fingerprint()[:12]}-mlflow" / "mlflow"
    assert (store.parent / COMPLETE).exists() and (store / "mlflow.db").is_file()
    assert [p.name for p in root.iterdir()] == [store.parent.name]  # no temp dir left behind
    ids = json.loads((store / "run_ids.json").read_text())
    assert sorted(ids) == sorted(r.name for r in small.training.runs)
    t = time.monotonic()
    assert build_store(small, root) == store and time.monotonic() - t < 0.5


def test_runs_status_lifecycle_tags_params(found, cache, small):
    truth = training.training_runs(small).set_index("run_name")
    assert sorted(found) == sorted(truth.index)
    ids = json.loads((cache[1] / "run_ids.json").read_text())
    for name, run in found.items():
        want = truth.loc[name]
        assert run.info.run_id == ids[name]
        assert run.info.status == want["status"], name
        assert run.info.lifecycle_stage == ("deleted" if want["deleted"] else "active"), name
        assert run.info.start_time == want["start"].value // 10**6
        if want["status"] == "RUNNING":
            assert run.info.end_time is None
        else:
            assert run.info.end_time == want["end"].value // 10**6
        assert run.data.params == want["params"]
        assert {k: v for k, v in run.data.tags.items() if k in want["tags"]} == want["tags"], name
    assert found["ppo-humanoid-sweep"].data.tags.get("pod") is None  # no pod, no pod tag


def test_deleted_run_hidden_by_default(client, found, small):
    exp_ids = sorted({r.info.experiment_id for r in found.values()})
    active = {r.info.run_name for r in client.search_runs(exp_ids)}
    assert active == {r.name for r in small.training.runs if not r.deleted}


def test_metric_histories_equal_the_truth(client, found, small):
    """Every (run, key) history, value for value. NaN comes back NaN; MLflow's SQL store keeps +Inf as
    1.7976931348623157e308 (sys.float_info.max) and returns that, which is what training.as_stored gives."""
    metrics = training.training_metrics(small)
    compared = 0
    for (name, key), want in metrics.groupby(["run_name", "key"]):
        got = sorted(client.get_metric_history(found[name].info.run_id, key), key=lambda m: m.step)
        assert [m.step for m in got] == want["step"].tolist(), (name, key)
        assert [m.timestamp for m in got] == (want["ts"].astype("int64")).tolist(), (name, key)
        np.testing.assert_array_equal(np.array([m.value for m in got]), training.as_stored(want["value"]))
        compared += len(got)
    assert compared == len(metrics) == 1696
    loss = client.get_metric_history(found["dqn-atari-f0"].info.run_id, "actor/loss")
    bad = {m.step: m.value for m in loss if not math.isfinite(m.value) or m.value > 1e300}
    assert math.isnan(bad[24]) and math.isnan(bad[25]) and bad[26] == 1.7976931348623157e308 and len(bad) == 3


def test_start_failure_shows_the_log(tmp_path, monkeypatch):
    monkeypatch.setattr(
        MlflowServer,
        "command",
        lambda self: [
            mlflow_server.sys.executable,
            "-c",
            "import sys; print('boom from mlflow'); sys.exit(3)",
        ],
    )
    with pytest.raises(SandboxError, match=r"exited with 3(.|\n)*boom from mlflow"):
        MlflowServer(tmp_path / "store", workdir=tmp_path).start(timeout=20)


def test_up_status_down(cache, tmp_path, small):
    state = tmp_path / "state"
    shutil.copytree(cache[0], state / "cache")  # up_mlflow reuses the module's build
    info = mlflow_server.up_mlflow("small", state, port=local_server.free_port())
    try:
        assert json.loads((state / "mlflow.json").read_text()) == info
        assert info["store"] == str(state / "run" / "mlflow") and info["scenario"] == "small"
        assert mlflow_server.mlflow_status(state) == info
        run = MlflowClient(info["url"]).get_run(info["run_ids"]["dqn-atari-f0"])
        assert run.info.status == "FAILED"
    finally:
        mlflow_server.down_mlflow(state)
    assert mlflow_server.mlflow_status(state) is None and not (state / "run" / "mlflow").exists()
    with pytest.raises(ProcessLookupError):
        os.killpg(info["pid"], 0)
    mlflow_server.down_mlflow(state)  # nothing running: no error


def test_stop_takes_the_process_group_down(server):
    """Runs last: stops the module's server (the fixture's own stop is then a no-op)."""
    pgid, url = server.pid, server.url
    assert os.getpgid(pgid) == pgid  # its own session and group
    pids = local_server.group_pids(pgid)
    assert len(pids) >= 2  # `mlflow server` and its uvicorn worker
    assert 100e6 < server.rss_bytes() < 2e9
    server.stop()
    with pytest.raises(ProcessLookupError):
        os.killpg(pgid, 0)
    assert local_server.group_pids(pgid) == []
    with pytest.raises(OSError):
        urllib.request.urlopen(f"{url}/health", timeout=2)
