"""A real Prometheus backfilled with the `small` sandbox scenario, shared by the end-to-end tests."""

from datetime import timedelta

import pytest

from foxhunt_obs.sandbox.servers.mlflow_server import build_store
from foxhunt_obs.sandbox.servers.prometheus import PrometheusServer, build_tsdb, copy_tsdb
from foxhunt_obs.sandbox.story.scenario import load_scenario


@pytest.fixture(scope="session")
def small():
    return load_scenario("small")


@pytest.fixture(scope="session")
def small_tsdb(small, built_once):
    """The small scenario's TSDB, built once for the run (every xdist worker's servers run on copies)."""
    return built_once("sandbox-cache", lambda cache: build_tsdb(small, cache))


@pytest.fixture(scope="session")
def small_mlflow_store(small, built_once):
    """The small scenario's MLflow store, built once for the run (runs logged into a real server)."""
    return built_once("mlflow-cache", lambda cache: build_store(small, cache))


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


@pytest.fixture(scope="session")
def small_priced_lake(small, prometheus, tmp_path_factory):
    """(lake, the day's cost_allocation as a frame): the small scenario's one UTC day built from the real
    Prometheus by the functions the assets call, priced on the price table (empty bill tables: the
    estimate the live cost rules stand in for)."""
    import pyarrow as pa

    from foxhunt_obs.defs.resources import ClusterResource
    from foxhunt_obs.lib.analysis.prices import load_price_table
    from foxhunt_obs.lib.ingest.metric_catalog import load_catalog
    from foxhunt_obs.lib.lake import Lake
    from foxhunt_obs.lib.schemas import COSTS_DAILY, COSTS_HOURLY
    from foxhunt_obs.lib.sources.prometheus import PrometheusClient
    from foxhunt_obs.lib.tables import gpu
    from foxhunt_obs.lib.tables.cost_allocation import cost_allocation
    from foxhunt_obs.lib.tables.gpu_hourly import gpu_hourly

    client = PrometheusClient(prometheus.url)
    lake = Lake(str(tmp_path_factory.mktemp("priced-lake")))
    day = small.start.replace(hour=0, minute=0, second=0, microsecond=0)
    assert (small.end - timedelta(seconds=1)).date() == day.date(), "the scenario is one UTC day"
    hours = [small.start + timedelta(hours=h) for h in range(small.hours)]
    catalog, settings = load_catalog(), ClusterResource().settings()
    gpu.gpu_samples(lake, client, catalog, settings, hours)
    gpu.node_samples(lake, client, catalog, settings, hours)
    gpu_hourly(lake, [day])
    for spec in (COSTS_HOURLY, COSTS_DAILY):
        lake.write_partition(spec, spec.key(day), spec.schema.empty_table())
    built = cost_allocation(lake, [day], load_price_table("us-east-1"))
    return lake, pa.concat_tables(built.partitions.values()).to_pandas()
