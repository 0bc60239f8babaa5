"""GPU ingest end to end: the `small` scenario in a real Prometheus, real Dagster runs, the lake
compared with the scenario's ground truth. Its third node runs NVIDIA's dcgm-exporter Helm chart (an
exporter pod whose container is `exporter`) and has GPU 0 in MIG mode: two slices held by two pods."""

import io
import os
import re
import subprocess
import sys
import threading
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import dagster as dg
import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

from foxhunt_obs.definitions import defs
from foxhunt_obs.lib.lake import Lake
from foxhunt_obs.lib.schemas import GPU_HOURLY, GPU_SAMPLES, NODE_SAMPLES
from foxhunt_obs.lib.tables.gpu_hour_parts import FOOTER_KEY
from foxhunt_obs.lib.tables.hourly_rollup import build_gpu_hourly_counted
from foxhunt_obs.sandbox.story import truth
from foxhunt_obs.sandbox.writers import bills, openmetrics

ROOT = Path(__file__).resolve().parents[2]
DAY = "2026-11-16"
STEP = timedelta(seconds=15)  # the small scenario's scrape interval
GPU_CANONICAL = [
    "util",
    "mem_used_bytes",
    "mem_free_bytes",
    "mem_total_bytes",
    "temp_celsius",
    "power_watts",
    "sm_clock_hz",
    "mem_clock_hz",
    "energy_joules",
    "ecc_sbe_total",
    "ecc_dbe_total",
    "xid_last",
    "nvlink_bandwidth_total",
    "gr_engine_active",
]
KEY = [
    "ts",
    "uuid",
    "gpu_instance",
    "vgpu",
]  # a GPU, a MIG slice of it, or a pod's copy (time-sliced), at a scrape


def _keyed(df: pd.DataFrame) -> pd.DataFrame:
    """gpu_instance as -1 on whole GPUs (the lake's nulls and the truth's <NA> then merge alike)."""
    return df.assign(gpu_instance=df["gpu_instance"].astype("Float64").fillna(-1).astype(int))


def run(job: str, first: str, last: str, instance=None, config=None) -> dg.ExecuteInProcessResult:
    return (
        defs()
        .resolve_job_def(job)
        .execute_in_process(
            instance=instance or dg.DagsterInstance.ephemeral(),
            tags={"dagster/asset_partition_range_start": first, "dagster/asset_partition_range_end": last},
            raise_on_error=False,
            run_config=config,
        )
    )


def hour(small, h: int) -> str:
    return (small.start + timedelta(hours=h)).strftime("%Y-%m-%d-%H:%M")


@pytest.fixture(scope="module")
def lake_env(tmp_path_factory, prometheus):
    lake_dir = tmp_path_factory.mktemp("lake")
    saved = {k: os.environ.get(k) for k in ("FOXHUNT_LAKE", "FOXHUNT_PROMETHEUS_URL")}
    os.environ.update(FOXHUNT_LAKE=str(lake_dir), FOXHUNT_PROMETHEUS_URL=prometheus.url)
    yield Lake(str(lake_dir))
    for k, v in saved.items():
        os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)


@pytest.fixture(scope="module")
def ingested(small, lake_env):
    """All six hours through gpu_ingest_job (one run), then the day's gpu_hourly."""
    result = run("gpu_ingest_job", hour(small, 0), hour(small, small.hours - 1))
    assert result.success, _failure(result)
    result = run("gpu_hourly_job", DAY, DAY)
    assert result.success, _failure(result)
    return lake_env


def _failure(result) -> str:
    return "\n".join(e.step_failure_data.error.message for e in result.all_events if e.is_step_failure)


def _lake_df(lake: Lake, table: str, order: str) -> pd.DataFrame:
    return lake.query(f"SELECT * FROM {table} ORDER BY {order}").to_pandas()


def test_gpu_samples_equal_the_ground_truth(small, ingested):
    expected = _keyed(truth.gpu_samples(small))
    got = _keyed(_lake_df(ingested, "gpu_samples", "ts, node, gpu, gpu_instance"))
    assert len(got) == len(expected)  # exact row count: every scrape, none of the lost node's
    assert ingested.partitions(GPU_SAMPLES) == [f"{DAY}T{h:02d}" for h in range(small.hours)]
    m = expected.merge(got, on=KEY, suffixes=("_t", ""), how="outer", indicator=True)
    assert (m["_merge"] == "both").all()
    for col in ("node", "gpu", "model", "namespace", "pod", "container", "experiment", "gpu_profile"):
        assert (m[col] == m[f"{col}_t"]).all(), col
    assert (m["util_basis"] == m["util_basis_t"]).all()  # GR_ENGINE_ACTIVE on slices, GPU_UTIL elsewhere
    np.testing.assert_array_equal(m["gpu_share"], m["gpu_share_t"])
    for col in (*GPU_CANONICAL, "sm_active", "tensor_active"):
        np.testing.assert_allclose(m[col], m[f"{col}_t"], rtol=1e-9, atol=1e-9, err_msg=col)
    assert (got["step_seconds"] == small.step_s).all()
    # the time-sliced GPU: each of the k pods on it at a scrape stands for 1/k of the step
    np.testing.assert_allclose(m["step_share"], 1 / _holders_at_step(m, "_t"), rtol=1e-12)
    assert (m["step_share"] == 0.5).sum() > 0 and set(m.loc[m["step_share"] == 0.5, "vgpu"]) == {"0", "1"}
    # util means per experiment within 0.005
    mean_t = expected.groupby("experiment")["util"].mean()
    mean = got.groupby("experiment")["util"].mean()
    assert set(mean.index) == set(mean_t.index) and "unattributed" in mean.index
    assert (abs(mean - mean_t) < 0.005).all()


def _holders_at_step(df: pd.DataFrame, suffix: str = "") -> pd.Series:
    """k: the rows (pods' copies) of the row's GPU or slice at its scrape, by the truth's pods."""
    k = df.groupby(["ts", "uuid", "gpu_instance"])[f"pod{suffix}"].transform("size")
    return k.astype(float)


def test_idle_gpus_have_no_pod_and_are_unattributed(ingested):
    idle = ingested.query("SELECT DISTINCT experiment, namespace, container FROM gpu_samples WHERE pod = ''")
    assert idle.to_pylist() == [{"experiment": "unattributed", "namespace": "", "container": ""}]


def test_no_exporter_pod_holds_a_gpu(small, ingested):
    """Neither the GPU Operator's exporter pods nor the Helm chart's (container `exporter`) are holders:
    their pods are the scrape targets' own (`up`), whatever the container is called."""
    exporters = {openmetrics.dcgm_exporter_pod(n.name, n.exporter) for n in small.nodes}
    assert {n.exporter for n in small.nodes} == {"gpu-operator", "helm-chart"}
    rows = ingested.query("SELECT DISTINCT node, namespace, pod, container FROM gpu_samples").to_pylist()
    assert not exporters & {r["pod"] for r in rows}
    assert not {"exporter", "nvidia-dcgm-exporter"} & {r["container"] for r in rows}
    assert not {e.namespace for e in openmetrics.EXPORTERS.values()} & {r["namespace"] for r in rows}
    # the Helm chart's node: its unheld GPUs and slices are no pod's, the held ones their pods'
    chart = next(n for n in small.nodes if n.exporter == "helm-chart")
    want = {(p.namespace, p.name) for p in small.pods if p.node == chart.name} | {("", "")}
    assert {(r["namespace"], r["pod"]) for r in rows if r["node"] == chart.name} == want


def test_mig_slices_have_their_own_holders(small, ingested):
    """GPU 0 of the MIG node: one row per slice per scrape (no whole-GPU row), each slice's holder the
    truth's at every scrape, its share 3/7 (3g.40gb: 3 of an A100's 7 compute slices), its util from
    GR_ENGINE_ACTIVE; the node's whole GPU 1 keeps GPU_UTIL although it reports GR_ENGINE_ACTIVE too."""
    node = next(n for n in small.nodes if n.mig)
    assert [(s.gpu, s.instance, s.profile) for s in node.mig] == [(0, 1, "3g.40gb"), (0, 2, "3g.40gb")]
    got = ingested.query(
        "SELECT gpu, gpu_instance, gpu_profile, gpu_share, util_basis, ts, pod, experiment, util, "
        "gr_engine_active FROM gpu_samples WHERE node = ? ORDER BY gpu, gpu_instance, ts",
        [node.name],
    ).to_pandas()
    assert not (got["gpu"] == 0).to_numpy()[got["gpu_instance"].isna().to_numpy()].any()
    expected = truth.gpu_samples(small)
    expected = expected[expected["node"] == node.name]
    for (gpu, gi), rows in got.groupby(["gpu", got["gpu_instance"].fillna(-1).astype(int)]):
        want = expected[(expected["gpu"] == gpu) & (expected["gpu_instance"].fillna(-1) == gi)]
        assert list(rows["pod"]) == list(want["pod"]) and list(rows["ts"]) == list(want["ts"]), (gpu, gi)
        if gi >= 0:
            pods = {p.name for p in small.pods if (gpu, gi) in p.slices}
            assert set(rows["pod"]) == pods | {""} and len(pods) == 1
            assert set(rows["gpu_profile"]) == {"3g.40gb"} and (rows["gpu_share"] == 3 / 7).all()
            assert set(rows["util_basis"]) == {"DCGM_FI_PROF_GR_ENGINE_ACTIVE"}
            assert (rows["util"] == rows["gr_engine_active"]).all()
        else:
            assert set(rows["util_basis"]) == {"DCGM_FI_DEV_GPU_UTIL"} and (rows["gpu_share"] == 1).all()
            assert (rows["util"] != rows["gr_engine_active"]).any()  # GR is 0.95 x util there
    # two pods on one GPU at the same time, each on its own slice
    both = got[(got["gpu"] == 0) & (got["pod"] != "")].groupby("ts")["pod"].nunique()
    assert both.max() == 2


def test_the_helm_chart_node_has_no_ecc_columns_and_every_core_column(small, ingested):
    """The chart's counters list has no ECC fields: NULL there, not 0; util, memory and power are
    reported by every GPU and slice (the core-columns check passes on the scenario, see below)."""
    chart = next(n for n in small.nodes if n.exporter == "helm-chart")
    (r,) = ingested.query(
        "SELECT count(*) AS n, count(ecc_sbe_total) AS sbe, count(ecc_dbe_total) AS dbe, count(util) AS u, "
        "count(mem_used_bytes) AS mem, count(power_watts) AS w FROM gpu_samples WHERE node = ?",
        [chart.name],
    ).to_pylist()
    assert r["n"] > 0 and r["sbe"] == r["dbe"] == 0 and r["u"] == r["mem"] == r["w"] == r["n"]


def test_stall_has_zero_active_seconds(small, ingested):
    (stall,) = truth.stalls(small)
    rows = ingested.query(
        "SELECT count(*) AS n, sum(util * step_seconds) AS active, min(pod) AS pod, max(pod) AS pod2 "
        "FROM gpu_samples WHERE ts >= ? AND ts < ? AND list_contains(?, uuid)",
        [stall.start, stall.end, list(stall.uuids)],
    ).to_pylist()[0]
    assert rows["n"] == stall.count * len(stall.uuids)
    assert rows["active"] == 0
    assert rows["pod"] == rows["pod2"] == stall.pod  # the pod still holds the GPUs


def test_ecc_deltas_equal_the_injected_counts(small, ingested):
    bursts = truth.ecc_bursts(small)
    assert {b.kind for b in bursts} == {"ecc_sbe", "ecc_dbe"}
    for b in bursts:
        col = "ecc_sbe_delta" if b.kind == "ecc_sbe" else "ecc_dbe_delta"
        got = ingested.query(f"SELECT sum({col}) AS d FROM gpu_hourly WHERE uuid = ?", [b.uuids[0]])
        assert got.to_pylist()[0]["d"] == b.count, b
        others = ingested.query(f"SELECT sum({col}) AS d FROM gpu_hourly WHERE uuid <> ?", [b.uuids[0]])
        assert others.to_pylist()[0]["d"] == sum(
            x.count for x in bursts if x.kind == b.kind and x.uuids != b.uuids
        )


def test_lost_node_has_no_rows_for_its_outage(small, ingested):
    (lost,) = truth.lost_windows(small)
    for table in ("gpu_samples", "node_samples"):
        n = ingested.query(
            f"SELECT count(*) AS n FROM {table} WHERE node = ? AND ts >= ? AND ts < ?",
            [lost.node, lost.start, lost.end],
        ).to_pylist()[0]["n"]
        assert n == 0, table
        around = ingested.query(
            f"SELECT count(*) AS n FROM {table} WHERE node = ? AND (ts = ? OR ts = ?)",
            [lost.node, lost.start - timedelta(seconds=small.step_s), lost.end],
        ).to_pylist()[0]["n"]
        assert around > 0, f"{table}: the node reports right before and after its outage"


def test_node_samples(small, ingested):
    expected = truth.node_samples(small)
    got = _lake_df(ingested, "node_samples", "ts, node")
    assert len(got) == len(expected)
    m = expected.merge(got, on=["ts", "node"], suffixes=("_t", ""))
    assert len(m) == len(expected)
    assert (m["instance_type"] == m["instance_type_t"]).all()
    assert (m["instance_id"] == m["instance_id_t"]).all()  # the EC2 instance at every step
    # ip-10-0-1-12's instance is replaced by its outage: the old id up to the loss, a new one after it
    (lost,) = truth.lost_windows(small)
    old, new = [i for i in bills.instances(small) if i.node == lost.node]
    ids = m[m["node"] == lost.node].groupby("instance_id")["ts"].agg(["min", "max", "size"])
    assert ids.to_dict("index") == {
        old.instance_id: {
            "min": small.start,
            "max": lost.start - STEP,
            "size": (lost.start - small.start) // STEP,
        },
        new.instance_id: {"min": lost.end, "max": small.end - STEP, "size": (small.end - lost.end) // STEP},
    }
    np.testing.assert_array_equal(m["mem_used_bytes"], m["mem_used_bytes_t"])
    np.testing.assert_array_equal(m["mem_total_bytes"], m["mem_total_bytes_t"])
    # cpu_busy is 1 - rate(idle[4 steps]): the mean of the 4 steps ending at t, where all 5 samples exist.
    grid = pd.date_range(small.start, small.end, freq=f"{small.step_s}s", inclusive="left")
    busy = expected.pivot(index="ts", columns="node", values="cpu_busy").reindex(grid)
    want = busy.rolling(4).mean().where(busy.notna().rolling(5).sum() == 5).stack().rename("want")
    m = m.join(want, on=["ts", "node"])
    full = m["want"].notna()
    assert full.mean() > 0.9
    np.testing.assert_allclose(m.loc[full, "cpu_busy"], m.loc[full, "want"], atol=1e-6)
    gpus = {n.name: n.gpus for n in small.nodes}
    assert (m["gpus_reporting"] == m["node"].map(gpus)).all() and m["gpu_node_up"].all()


def test_gpu_hourly_rolls_up_the_samples(small, ingested):
    """One row per GPU-hour (or slice-hour) and holder: each pod's scrapes (a time-sliced one's at 1/k of
    the step), its util and active GPU-seconds; the part no pod held is the pod '' row."""
    hourly = _keyed(_lake_df(ingested, "gpu_hourly", "hour, node, gpu, gpu_instance"))
    expected = _keyed(truth.gpu_samples(small))
    expected["hour"] = expected["ts"].dt.floor("h")
    expected["secs"] = small.step_s / _holders_at_step(expected)
    expected["active"] = expected["util"] * expected["secs"] * expected["gpu_share"]
    unit = ["hour", "uuid", "gpu_instance"]
    g = (
        expected.groupby([*unit, "namespace", "pod"])
        .agg(util_mean=("util", "mean"), n=("util", "size"), secs=("secs", "sum"), active=("active", "sum"))
        .reset_index()
    )
    m = g.merge(hourly, on=[*unit, "namespace", "pod"], suffixes=("_t", ""))
    assert len(m) == len(g) == len(hourly)
    assert (m["samples"] == m["n"]).all()
    np.testing.assert_allclose(m["util_mean"], m["util_mean_t"], atol=1e-9)
    np.testing.assert_allclose(m["seconds_with_data"], m["secs"], rtol=1e-12)
    np.testing.assert_allclose(m["held_seconds"], np.where(m["pod"] == "", 0.0, m["secs"]), rtol=1e-12)
    # GPU-seconds: a slice's activity counts for its share of the GPU, a time-sliced pod's for its 1/k
    np.testing.assert_allclose(m["active_gpu_seconds"], m["active"], rtol=1e-9)
    # a unit-hour's rows add up to the unit's seconds; the hand-off hour has two holders
    np.testing.assert_allclose(m.groupby(unit)["seconds_with_data"].transform("sum"), m["device_seconds"])
    assert (m.groupby(unit)["pod"].transform(lambda p: (p != "").sum()) == m["pods_seen"]).all()
    assert m["pods_seen"].max() >= 2
    assert ingested.partitions(GPU_HOURLY) == [DAY]
    # a MIG GPU's energy counter is on each of its slices: split over them, it is counted once
    (node,) = [n for n in small.nodes if n.mig]
    mig = m[(m["node"] == node.name) & (m["gpu"] == 0)]
    per_hour = mig.groupby("hour")["energy_kwh"].sum()
    device = expected[(expected["node"] == node.name) & (expected["gpu_instance"] == 1)]  # either slice
    last = device.groupby("hour")["energy_mj"].last()  # mJ; the first hour from its first sample
    delta = last.diff().fillna(last.iloc[0] - device["energy_mj"].iloc[0])
    np.testing.assert_allclose(per_hour.to_numpy(), delta.to_numpy() / 3.6e9, rtol=1e-9)


def test_the_ingest_keeps_each_hours_parts_and_gpu_hourly_reads_them(small, ingested, tmp_path):
    """Every hour the ingest wrote has its parts in its footer; gpu_hourly used them (its asset says so), and
    the same samples without them (an older lake) give the same rows."""
    keys = ingested.partitions(GPU_SAMPLES)
    assert len(keys) == small.hours
    for key in keys:
        exists, parts = ingested.read_footer(GPU_SAMPLES, key, FOOTER_KEY)
        assert exists and parts is not None and parts.num_rows > 0, key
    result = run("gpu_hourly_job", DAY, DAY)
    assert result.success, _failure(result)
    (mat,) = [
        m for m in result.get_asset_materialization_events() if m.asset_key == dg.AssetKey("gpu_hourly")
    ]
    assert mat.materialization.metadata["hours_summed_from_samples"].value == 0
    day = datetime.fromisoformat(DAY).replace(tzinfo=timezone.utc)
    with_parts, summed = build_gpu_hourly_counted(ingested, [day])
    assert summed == []
    old = Lake(str(tmp_path / "old"))
    for key in keys:  # the rows alone, as a writer before the parts wrote them
        old.write_partition(GPU_SAMPLES, key, ingested.read_partition(GPU_SAMPLES, key))
    without, summed = build_gpu_hourly_counted(old, [day])
    assert len(summed) == small.hours
    a, b = with_parts[DAY], without[DAY]
    assert a.num_rows == b.num_rows > 0
    for c in a.column_names:  # to the last bit: the same sums in the same order either way
        assert a[c].equals(b[c]), c


def test_rematerializing_gives_identical_rows(small, ingested):
    key = f"{DAY}T02"
    before = ingested.read_partition(GPU_SAMPLES, key)
    parts_before = ingested.read_footer(GPU_SAMPLES, key, FOOTER_KEY)
    nodes_before = ingested.read_partition(NODE_SAMPLES, key)
    result = run("gpu_ingest_job", hour(small, 2), hour(small, 2))
    assert result.success, _failure(result)
    assert ingested.read_partition(GPU_SAMPLES, key).equals(before)
    assert ingested.read_footer(GPU_SAMPLES, key, FOOTER_KEY) == parts_before  # the parts too
    assert ingested.read_partition(NODE_SAMPLES, key).equals(nodes_before)


def test_prometheus_stopped_mid_run_fails_clearly_and_keeps_written_partitions(
    small, own_prometheus, tmp_path, monkeypatch
):
    lake = Lake(str(tmp_path / "lake"))
    monkeypatch.setenv("FOXHUNT_LAKE", lake.root)
    monkeypatch.setenv("FOXHUNT_PROMETHEUS_URL", own_prometheus.url)
    first, last = hour(small, 0), hour(small, small.hours - 1)  # six hours: time for the kill to land
    assert run("gpu_ingest_job", first, last).success
    keys = lake.partitions(GPU_SAMPLES)
    files = {k: Path(lake.root, "gpu_samples", f"hour={k}", "part-0.parquet") for k in keys}
    before = {k: f.read_bytes() for k, f in files.items()}
    mtime0 = files[keys[0]].stat().st_mtime_ns

    def stop_after_first_partition():  # Prometheus dies once the new run has rewritten its first hour
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and files[keys[0]].stat().st_mtime_ns == mtime0:
            time.sleep(0.001)
        own_prometheus.stop()

    killer = threading.Thread(target=stop_after_first_partition)
    killer.start()
    result = run("gpu_ingest_job", first, last)
    killer.join()
    assert not result.success
    message = _failure(result)
    assert own_prometheus.url in message
    # the kill lands in any of an hour's queries: a range query names its window and step, an instant
    # query (scrape targets, limits, pod labels) its time; both in the run's day
    assert re.search(r": (query_range .+ 2026-11-16T\S+ step 15s|query .+ at 2026-11-16T\S+)", message), (
        message
    )
    assert "gpu_samples partition 2026-11-16T0" in message
    # stopped between two queries, mid-answer, or in its first milliseconds of shutting down (it then
    # answers 422 "block is closing" before it stops listening)
    assert any(s in message for s in ("cannot connect", "connection lost mid-answer", "shutting down"))
    # every partition still readable, and exactly the rows it held: the hour the run wrote before the kill
    # (and any it had downloaded whole by then) rewritten with the same rows, none left half-written.
    # Rows, not bytes: once in several loaded runs of the full suite, a rewritten hour's data pages were
    # identical but its footer (the gpu_hourly parts) differed from the first run's
    for k in keys:
        assert pq.read_table(files[k]).equals(pq.read_table(io.BytesIO(before[k]))), k
    assert not list(Path(lake.root).rglob("*.tmp-*"))


def test_dagster_cli_materializes_a_partition_with_only_the_documented_variables(small, prometheus, tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FOXHUNT_", "DAGSTER_"))}
    env.update(
        FOXHUNT_LAKE=str(tmp_path / "lake"),
        FOXHUNT_PROMETHEUS_URL=prometheus.url,
        FOXHUNT_SCRAPE_STEP="15",
        FOXHUNT_EXPERIMENT_LABEL="experiment",
        DAGSTER_HOME=str(tmp_path),
    )
    out = subprocess.run(
        [
            Path(sys.executable).parent / "dagster",
            "asset",
            "materialize",
            "-m",
            "foxhunt_obs.definitions",
            "--select",
            "gpu_samples",
            "--partition",
            hour(small, 1),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    table = Lake(str(tmp_path / "lake")).read_partition(GPU_SAMPLES, f"{DAY}T01")
    expected = truth.gpu_samples(small)
    in_hour = expected[
        (expected["ts"] >= pd.Timestamp(f"{DAY}T01:00Z")) & (expected["ts"] < pd.Timestamp(f"{DAY}T02:00Z"))
    ]
    assert table.num_rows == len(in_hour)


def test_checks_pass_on_the_scenario_and_flag_an_empty_hour_after_gpus(small, ingested):
    ok = run("gpu_ingest_job", hour(small, 1), hour(small, 1))
    assert {e.check_name: e.passed for e in ok.get_asset_check_evaluations()} == {
        "values_in_range": True,
        "unique_uuid_ts": True,
        "core_columns_reported": True,
        "not_empty_after_gpus": True,
    }
    # The hour after the scenario ends: Prometheus has nothing, the hour before had GPUs. An error on the
    # check (the hour reads downstream as a cluster without GPUs), not a failed run: the data is a fact.
    last = hour(small, small.hours)
    after = run("gpu_ingest_job", last, last)
    assert after.success
    checks = {e.check_name: e for e in after.get_asset_check_evaluations()}
    assert not checks["not_empty_after_gpus"].passed
    assert checks["not_empty_after_gpus"].severity == dg.AssetCheckSeverity.ERROR
    assert (
        checks["not_empty_after_gpus"].metadata["empty_hours_after_gpus"].value == f"{DAY}T{small.hours:02d}"
    )
    assert ingested.read_partition(GPU_SAMPLES, f"{DAY}T{small.hours:02d}").num_rows == 0
    # a run that says GPUs went away on purpose: a warning
    allowed = {
        "ops": {name: {"config": {"allow_fewer_rows": True}} for name in ("gpu_samples", "node_samples")}
    }
    ingested.delete_partition(GPU_SAMPLES, f"{DAY}T{small.hours:02d}")
    checks = {
        e.check_name: e
        for e in run("gpu_ingest_job", last, last, config=allowed).get_asset_check_evaluations()
    }
    assert not checks["not_empty_after_gpus"].passed
    assert checks["not_empty_after_gpus"].severity == dg.AssetCheckSeverity.WARN
    ingested.delete_partition(GPU_SAMPLES, f"{DAY}T{small.hours:02d}")
    ingested.delete_partition(NODE_SAMPLES, f"{DAY}T{small.hours:02d}")
