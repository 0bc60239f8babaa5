"""A real Prometheus backfilled with the `small` sandbox scenario, shared by the end-to-end tests."""

import pytest

from foxhunt_obs.sandbox.servers.mlflow_server import build_store
from foxhunt_obs.sandbox.servers.prometheus import PrometheusServer, build_tsdb, copy_tsdb
from foxhunt_obs.sandbox.story.scenario import load_scenario


@pytest.fixture(scope="session")
def small():
    return load_scenario("small")


@pytest.fixture(scope="session")
def small_tsdb(small, tmp_path_factory):
    return build_tsdb(small, tmp_path_factory.mktemp("sandbox-cache"))


@pytest.fixture(scope="session")
def small_mlflow_store(small, tmp_path_factory):
    """The small scenario's MLflow store, built once (runs logged into a real server)."""
    return build_store(small, tmp_path_factory.mktemp("mlflow-cache"))


@pytest.fixture(scope="session")
def prometheus(small_tsdb, tmp_path_factory):
    work = tmp_path_factory.mktemp("prometheus")
    copy_tsdb(small_tsdb, work / "tsdb")
    server = PrometheusServer(work / "tsdb", workdir=work)
    server.start()
    yield server
    server.stop()


@pytest.fixture
def own_prometheus(small_tsdb, tmp_path):
    """A Prometheus of the test's own, for tests that stop it."""
    copy_tsdb(small_tsdb, tmp_path / "tsdb")
    server = PrometheusServer(tmp_path / "tsdb", workdir=tmp_path)
    server.start()
    yield server
    server.stop()
