"""The Prometheus ingest's queries side by side: an hour's queries FOXHUNT_PROMETHEUS_QUERIES_AT_ONCE
at a time, and gpu_samples downloading the next hour while it writes this one, on the `small` scenario in a
real Prometheus. The rows must be those of one query after another, and a failure keep its place: the hours
before it written, the failing hour named, nothing after it."""

import gc
import threading
import time
import weakref
from datetime import timedelta

import pytest

from foxhunt_obs.defs.resources import ClusterResource
from foxhunt_obs.lib.ingest.gpu_series import collect_gpu_samples, collect_node_samples, gather_gpu_samples
from foxhunt_obs.lib.ingest.metric_catalog import load_catalog
from foxhunt_obs.lib.lake import Lake
from foxhunt_obs.lib.schemas import GPU_SAMPLES
from foxhunt_obs.lib.sources.prometheus import PrometheusClient, PrometheusError, iso
from foxhunt_obs.lib.tables import gpu
from foxhunt_obs.lib.tables.gpu import hour_window


def _hours(small, n: int):
    return [small.start + timedelta(hours=h) for h in range(n)]


@pytest.mark.parametrize("at_once", [2, 4, 16])
def test_an_hour_side_by_side_equals_one_query_after_another(small, prometheus, at_once):
    catalog, settings = load_catalog(), ClusterResource().settings()
    serial = PrometheusClient(prometheus.url, queries_at_once=1)
    side = PrometheusClient(prometheus.url, queries_at_once=at_once)
    # every hour of the scenario: its MIG slices, hand-offs and time-sliced GPU fall in some of them
    for hour in _hours(small, small.hours):
        window = hour_window(hour, settings.scrape_step_s, "test")
        kw = dict(
            node_labels=settings.node_labels,
            experiment_label=settings.experiment_label,
            exporter_containers=settings.exporter_containers,
            run_id_label="run_id",  # the optional queries too
        )
        expected = collect_gpu_samples(serial, catalog, window, **kw)
        got = collect_gpu_samples(side, catalog, window, **kw)
        assert expected.num_rows > 0
        assert got.equals(expected), hour
        nodes = collect_node_samples(side, catalog, window, node_labels=settings.node_labels)
        assert nodes.num_rows > 0
        assert nodes.equals(collect_node_samples(serial, catalog, window, node_labels=settings.node_labels))


class _Recording(PrometheusClient):
    """Records when each range query of a window starts (and ends); fails the windows starting at `fail_at`."""

    def __init__(self, url: str, fail_at: float | None = None, **kw):
        super().__init__(url, **kw)
        self.fail_at, self.lock, self.calls = fail_at, threading.Lock(), []

    def query_range(self, query, start, end, step, what=""):
        with self.lock:
            self.calls.append([start, time.monotonic(), None])  # recorded as it starts
            call = self.calls[-1]
        if start == self.fail_at:
            raise PrometheusError(f"stand-in failure for the window at {iso(start)} ({what})")
        out = super().query_range(query, start, end, step, what)
        call[2] = time.monotonic()
        return out


class _SlowLake(Lake):
    """Records each partition's write, taking WRITE_S for it: time for the next hour's download to overlap."""

    WRITE_S = 0.4

    def __init__(self, root: str):
        super().__init__(root)
        self.writes: list[tuple[str, float, float]] = []

    def write_partition(self, spec, value, table, footer=None):
        t0 = time.monotonic()
        time.sleep(self.WRITE_S)
        out = super().write_partition(spec, value, table, footer)
        self.writes.append((value, t0, time.monotonic()))
        return out


def test_the_next_hour_downloads_while_this_one_is_written(small, prometheus, tmp_path):
    catalog, settings = load_catalog(), ClusterResource().settings()
    hours = _hours(small, 3)
    client, lake = _Recording(prometheus.url), _SlowLake(str(tmp_path))
    built = gpu.gpu_samples(lake, client, catalog, settings, hours)
    assert built.written == [GPU_SAMPLES.key(h) for h in hours]
    for written, hour in zip(lake.writes[:-1], hours[1:]):
        _, write_start, write_end = written
        started = [t0 for start, t0, _ in client.calls if start == hour.timestamp()]
        assert started and min(started) < write_end  # the next hour's queries began before this write ended
    # and the rows are those of hour after hour, one query at a time
    serial_lake = Lake(str(tmp_path / "serial"))
    for hour in hours:
        serial = PrometheusClient(prometheus.url, queries_at_once=1)
        gpu.gpu_samples(serial_lake, serial, catalog, settings, [hour])
        key = GPU_SAMPLES.key(hour)
        assert lake.read_partition(GPU_SAMPLES, key).equals(serial_lake.read_partition(GPU_SAMPLES, key))


def test_a_run_holds_no_hour_it_has_written(small, prometheus, tmp_path, monkeypatch):
    """A run of many hours must not grow with them (24 hours of 1,024 GPUs are ~1.5 GB of tables): once
    written and tallied, an hour's rows are let go, and the run's result keeps their row counts only."""
    built_tables: list[weakref.ref] = []  # each hour's rows as gpu_samples built them (weakly)

    def gather(*args, **kwargs):
        build = gather_gpu_samples(*args, **kwargs)

        def watched():
            table = build()
            built_tables.append(weakref.ref(table))
            return table

        return watched

    monkeypatch.setattr(gpu, "gather_gpu_samples", gather)  # the real function, its tables watched
    catalog, settings = load_catalog(), ClusterResource().settings()
    hours, lake = _hours(small, 4), Lake(str(tmp_path))
    built = gpu.gpu_samples(lake, PrometheusClient(prometheus.url), catalog, settings, hours)
    gc.collect()
    assert len(built_tables) == 4 and [ref() for ref in built_tables] == [None] * 4
    counts = {
        GPU_SAMPLES.key(h): lake.read_partition(GPU_SAMPLES, GPU_SAMPLES.key(h)).num_rows for h in hours
    }
    assert built.partitions == {} and built.counts == counts
    assert built.rows == sum(counts.values()) > 0 and built.summary["dagster/row_count"] == built.rows


def test_a_failing_hour_fails_after_the_hours_before_it_are_written(small, prometheus, tmp_path):
    catalog, settings = load_catalog(), ClusterResource().settings()
    hours = _hours(small, 4)
    client = _Recording(prometheus.url, fail_at=hours[2].timestamp())
    lake = Lake(str(tmp_path))
    with pytest.raises(PrometheusError, match=f"gpu_samples partition {GPU_SAMPLES.key(hours[2])}"):
        gpu.gpu_samples(lake, client, catalog, settings, hours)
    assert lake.partitions(GPU_SAMPLES) == [GPU_SAMPLES.key(h) for h in hours[:2]]
    time.sleep(0.5)  # a fetch begun after the failure would have sent its queries by now
    assert not [c for c in client.calls if c[0] == hours[3].timestamp()]  # no hour after it was asked for
