"""The live path: a real Prometheus scrapes foxhunt-gpu-exporter (fake NVML backend) on 127.0.0.1,
evaluates the catalog's recording rules, and gpu_samples ingests the exporter's series."""

import json
import time

import numpy as np
import pytest

from foxhunt_obs.lib.ingest.gpu_series import Window, collect_gpu_samples
from foxhunt_obs.lib.ingest.metric_catalog import load_catalog
from foxhunt_obs.lib.sources.prometheus import PrometheusClient
from foxhunt_obs.sandbox.servers.prometheus import (
    EXPORTER_JOB,
    RECORDING_RULES,
    PrometheusServer,
    free_port,
    start_fake_exporter,
)

GPUS, LOST, LOST_AT = 4, 2, 12.0
MEMORY = 85_899_345_920
SCENARIO = {
    "gpus": GPUS,
    "model": "NVIDIA H100 80GB HBM3",
    "driver": "550.90.07",
    "hostname": "ip-10-0-9-9",
    "memory_total_bytes": MEMORY,
    "load": {"base": 60, "amplitude": 10, "period_s": 60, "noise": 2},
    "faults": [{"kind": "gpu_lost", "gpu": LOST, "at": LOST_AT}],
}


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    work = tmp_path_factory.mktemp("live")
    (work / "scenario.json").write_text(json.dumps(SCENARIO))
    port = free_port()
    exporter = start_fake_exporter(
        port, work, interval=1, scenario=work / "scenario.json", hostname="ip-10-0-9-9"
    )
    started = time.time()
    server = PrometheusServer(
        work / "tsdb",
        workdir=work,
        scrape_jobs={EXPORTER_JOB: [f"127.0.0.1:{port}"]},
        scrape_interval="1s",
        rule_files=(RECORDING_RULES,),
    ).start()
    yield server, PrometheusClient(server.url), started
    server.stop()
    exporter.terminate()
    exporter.wait(10)


def _wait(client, query, ok, timeout=20.0):
    deadline = time.time() + timeout
    while True:
        rows = client.query(query, time.time())
        if ok(rows) or time.time() > deadline:
            return rows
        time.sleep(0.5)


def test_prometheus_scrapes_the_fake_gpus(live):
    _, client, _ = live
    rows = _wait(client, "foxhunt_gpu_up", lambda r: len(r) == GPUS)
    assert len(rows) == GPUS
    total = client.query("foxhunt_gpu_memory_total_bytes", time.time())
    assert sorted(int(r[0]["gpu"]) for r in total) == list(range(GPUS))
    for labels, value in total:
        assert value == MEMORY
        assert labels["hostname"] == "ip-10-0-9-9" and labels["model"] == "NVIDIA H100 80GB HBM3"
        assert labels["uuid"].startswith("GPU-") and labels["job"] == EXPORTER_JOB
    for labels, value in client.query("foxhunt_gpu_utilization_percent", time.time()):
        assert 40 <= value <= 80, labels  # base 60 ± amplitude 10 ± noise
    info = client.query("foxhunt_gpu_info", time.time())
    assert {r[0]["driver"] for r in info} == {"550.90.07"}


def test_recording_rules_give_canonical_series(live):
    _, client, _ = live
    rows = _wait(client, "foxhunt:gpu_mem_total:bytes", lambda r: len(r) >= GPUS - 1)
    assert rows and all(v == MEMORY for _, v in rows)
    assert all(
        r[0]["node"] == "ip-10-0-9-9" and set(r[0]) <= {"__name__", "node", "gpu", "uuid", "model"}
        for r in rows
    )


def test_gpu_samples_ingest_the_exporter_series(live):
    _, client, _ = live
    _wait(client, "count(foxhunt_gpu_utilization_percent)", lambda r: r and r[0][1] >= GPUS - 1)
    # the last 20 s, ending a second ago, until it holds rows: on a loaded machine (the whole suite on 2
    # cores) the instant count can see a sample the range query's 1 s steps do not yet
    deadline = time.time() + 30
    while True:
        end = float(int(time.time()) - 1)
        window = Window(end - 20, end, 1.0, "gpu_samples live")
        table = collect_gpu_samples(
            client, load_catalog(), window, node_labels=("node", "Hostname", "hostname")
        )
        if table.num_rows or time.time() > deadline:
            break
        time.sleep(1)
    df = table.to_pandas()
    assert len(df) > 0, f"no gpu_samples rows from the live exporter in 30 s (last window {window})"
    assert set(df["node"].astype(str)) == {"ip-10-0-9-9"}
    assert set(df["model"].astype(str)) == {"NVIDIA H100 80GB HBM3"}
    assert (df["mem_total_bytes"] == MEMORY).all()
    assert df["sm_clock_hz"].notna().all() and df["energy_joules"].notna().all()
    assert set(df["experiment"].astype(str)) == {"unattributed"}  # standalone mode: no pod labels
    # the same points as Prometheus's raw series, scaled from percent
    raw = client.query_range("foxhunt_gpu_utilization_percent", window.start, window.end, 1.0)
    by_uuid = {
        lab["uuid"]: dict(zip(raw.ts[a:b].tolist(), raw.values[a:b].tolist()))
        for lab, a, b in zip(raw.labels, raw.offsets[:-1], raw.offsets[1:])
    }
    for row in df.itertuples():
        expected = by_uuid[row.uuid].get(row.ts.timestamp())
        if expected is not None:
            assert np.isclose(row.util, expected / 100)


def test_a_lost_gpu_reports_up_0_alone(live):
    _, client, started = live
    time.sleep(max(0.0, started + LOST_AT + 3 - time.time()))
    rows = _wait(client, "foxhunt_gpu_up", lambda r: any(v == 0 for _, v in r))
    up = {int(labels["gpu"]): value for labels, value in rows}
    assert up == {g: (0.0 if g == LOST else 1.0) for g in range(GPUS)}
    # the others keep reporting; the lost one's readings are gone
    util = _wait(client, "foxhunt_gpu_utilization_percent", lambda r: len(r) == GPUS - 1)
    assert sorted(int(r[0]["gpu"]) for r in util) == [g for g in range(GPUS) if g != LOST]
