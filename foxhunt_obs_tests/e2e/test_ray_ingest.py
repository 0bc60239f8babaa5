"""Ray end to end: the `small` scenario's KubeRay cluster (a head and two workers, worker-1's raylet gone
00:10-00:20) written as Ray's own series into a real Prometheus (a TSDB of the Ray families, `up` and
kube_pod_labels only), read back by the function the ray_samples asset runs and by the alert sensor's code
replayed over the hour; both compared with the scenario's truth."""

from datetime import datetime, timedelta, timezone

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from foxhunt_obs.defs.resources import ClusterResource
from foxhunt_obs.lib.alerts.collect import Sources
from foxhunt_obs.lib.alerts.engine import replay
from foxhunt_obs.lib.alerts.rules import load_rules
from foxhunt_obs.lib.delivery.alert_sinks import LakeAlertSink
from foxhunt_obs.lib.ingest.gpu_series import Window
from foxhunt_obs.lib.ingest.metric_catalog import load_catalog
from foxhunt_obs.lib.ingest.ray_series import DEFAULT_PATH, collect_ray_samples, load_ray_catalog
from foxhunt_obs.lib.lake import Lake
from foxhunt_obs.lib.schemas import RAY_SAMPLES
from foxhunt_obs.lib.sources.prometheus import PrometheusClient
from foxhunt_obs.lib.tables import ray as ray_tables
from foxhunt_obs.lib.tables.gpu import FewerRows
from foxhunt_obs.sandbox.servers.prometheus import (
    PrometheusServer,
    backfill_openmetrics,
    build_tsdb,
    copy_tsdb,
)
from foxhunt_obs.sandbox.story import expected_alerts, truth
from foxhunt_obs.sandbox.writers.openmetrics import RAY_METRICS

pytestmark = pytest.mark.timeout(300)

FAMILIES = {"up", "kube_pod_labels", *RAY_METRICS}


@pytest.fixture(scope="module")
def ray_prometheus(small, tmp_path_factory):
    tsdb = build_tsdb(small, tmp_path_factory.mktemp("ray-cache"), FAMILIES)
    work = tmp_path_factory.mktemp("ray-prometheus")
    copy_tsdb(tsdb, work / "tsdb")
    server = PrometheusServer(work / "tsdb", workdir=work)
    server.start()
    yield server
    server.stop()


def ingest(small, prometheus, lake, hours=(0,), ray=None, **kw):
    return ray_tables.ray_samples(
        lake,
        PrometheusClient(prometheus.url),
        ray or load_ray_catalog(),
        load_catalog(),
        ClusterResource().settings(),
        [small.start + timedelta(hours=h) for h in hours],
        **kw,
    )


@pytest.fixture(scope="module")
def built(small, ray_prometheus, tmp_path_factory):
    lake = Lake(str(tmp_path_factory.mktemp("ray-lake")))
    return lake, ingest(small, ray_prometheus, lake, hours=(0, 1))


def test_ray_samples_match_the_truth_row_for_row(small, built):
    lake, b = built
    got = lake.read_partition(RAY_SAMPLES, "2026-11-16T00").to_pandas()
    want = truth.ray_samples(small)
    assert len(got) == len(want) == 3 * 120  # three Ray nodes, 00:00-00:30 at 15 s
    for col in ("ray_cluster", "namespace", "pod", "node_type", "experiment"):
        got[col] = got[col].astype(str)
    got["ts"] = got["ts"].astype("datetime64[ns, UTC]")
    pd.testing.assert_frame_equal(got[list(want.columns)], want, check_dtype=False)
    # the story in the rows: worker-1 down for 40 scrapes, its actor restarting on the head meanwhile
    down = got[~got["alive"]]
    assert set(down["pod"]) == {"ppo-humanoid-ray-worker-1"} and len(down) == 40
    assert down[truth.RAY_COLUMNS].isna().all().all()
    head = got[got["node_type"] == "head"].set_index("ts")
    assert head["actors_restarting"].sum() == 40 and head["actors_alive"].min() == 2
    assert head["tasks_failed"].iloc[-1] == 1 and (got["experiment"] == "ppo-humanoid").all()
    assert lake.read_partition(RAY_SAMPLES, "2026-11-16T01").num_rows == 0  # the Ray run ended at 00:30
    assert {c.name: c.passed for c in b.checks} == {
        "core_series_reported": True,
        "ray_pods_scraped": True,
        "unique_pod_ts": True,
    }
    assert b.summary["ray_nodes"] == 3 and b.summary["rows_not_alive"] == 40


def test_a_missing_core_series_is_named_with_every_spelling(small, ray_prometheus, tmp_path):
    """A Ray build whose object store series the catalog does not know: the check fails naming the pods
    and what it looked for, and the column stays null (never a number made up)."""
    path = tmp_path / "ray.yaml"
    text = DEFAULT_PATH.read_text().replace('Location="MMAP_SHM"', 'Location="NOWHERE"')
    path.write_text(
        text.replace("names: [ray_object_store_used_memory]", "names: [ray_object_store_bytes_in_use]")
    )
    b = ingest(small, ray_prometheus, Lake(str(tmp_path / "lake")), ray=load_ray_catalog(path))
    check = next(c for c in b.checks if c.name == "core_series_reported")
    assert not check.passed
    text = str(check.metadata["missing"])
    for pod in ("ppo-humanoid-ray-head", "ppo-humanoid-ray-worker-0", "ppo-humanoid-ray-worker-1"):
        assert f"rl-train/{pod}" in text
    assert 'ray_object_store_memory{Location="NOWHERE"}' in text and "ray_object_store_bytes_in_use" in text
    assert b.frame()["object_store_used_bytes"].isna().all()


def test_ray_pods_without_a_ray_target_fail_the_scrape_check(small, ray_prometheus, tmp_path):
    """Targets without the cluster label (a PodMonitor lacking podTargetLabels): no rows, and the check
    names the KubeRay pods kube-state-metrics saw, not an empty cluster."""
    path = tmp_path / "ray.yaml"
    path.write_text(
        DEFAULT_PATH.read_text().replace("cluster_label: ray_io_cluster", "cluster_label: ray_cluster")
    )
    b = ingest(small, ray_prometheus, Lake(str(tmp_path / "lake")), ray=load_ray_catalog(path))
    assert b.rows == 0
    check = next(c for c in b.checks if c.name == "ray_pods_scraped")
    assert not check.passed
    assert str(check.metadata["unscraped"]) == (
        "- 2026-11-16T00: rl-train/ppo-humanoid-ray-head, rl-train/ppo-humanoid-ray-worker-0, "
        "rl-train/ppo-humanoid-ray-worker-1"
    )


def test_fewer_rows_never_replace_good_ones(small, ray_prometheus, tmp_path):
    """Hour 01 has no Ray node in Prometheus; a lake that holds rows for it keeps them."""
    lake = Lake(str(tmp_path / "lake"))
    rows = truth.ray_samples(small).head(3)
    table = pa.Table.from_pandas(
        rows.assign(ts=rows["ts"] + pd.Timedelta(hours=1)), schema=RAY_SAMPLES.schema, preserve_index=False
    )
    lake.write_partition(RAY_SAMPLES, "2026-11-16T01", table)
    with pytest.raises(FewerRows, match="ray_samples partition 2026-11-16T01: the source answered 0 rows"):
        ingest(small, ray_prometheus, lake, hours=(1,))
    assert lake.read_partition(RAY_SAMPLES, "2026-11-16T01").num_rows == 3
    ingest(small, ray_prometheus, lake, hours=(1,), allow_fewer_rows=True)
    assert lake.read_partition(RAY_SAMPLES, "2026-11-16T01").num_rows == 0


def test_the_lost_worker_fires_once_and_resolves(small, ray_prometheus, tmp_path):
    """The Ray rules through the sensor's code every 5 minutes over the hour: ray_worker_lost fires at the
    first tick past its 2 minutes and resolves at the first tick after the worker is back; the scheduling
    stall (no GPU available while the restarting actor waits) and the object store (35 % at most) stay quiet;
    expected_alerts (what make demo checks) finds the incident."""
    rules = [r for r in load_rules() if r.id.startswith("ray_")]
    sources = Sources(prometheus=PrometheusClient(ray_prometheus.url))
    lake = Lake(str(tmp_path / "lake"))
    sent, _ = replay(rules, sources, [LakeAlertSink(lake)], small.start, small.start + timedelta(hours=1))
    got = [(t - small.start, n.rule, n.status, n.labels.get("ray_io_cluster"), n.value) for t, n in sent]
    assert got == [
        (timedelta(minutes=15), "ray_worker_lost", "firing", "ppo-humanoid-ray", 1.0),
        (timedelta(minutes=20), "ray_worker_lost", "resolved", "ppo-humanoid-ray", 1.0),
    ]
    firing = sent[0][1]
    assert firing.summary == (
        "Ray cluster ppo-humanoid-ray (rl-train) lost a worker: 1 actors restarting or Ray nodes down"
    )
    want = [e for e in expected_alerts.expected(small) if e.rule.startswith("ray_")]
    verdict = expected_alerts.check(want, sent, small.start, sent[-1][0])
    assert verdict.ok and len(verdict.found) == 1 and not verdict.other


def test_the_truth_is_exact_integers():
    """What Prometheus returns equals the truth exactly only if every written value is an integer."""
    from foxhunt_obs.sandbox.story.scenario import load_scenario

    df = truth.ray_samples(load_scenario("small"))
    values = df[truth.RAY_COLUMNS].to_numpy(dtype=float)
    finite = values[np.isfinite(values)]
    assert finite.size and (finite == np.rint(finite)).all()


def test_the_asset_runs_in_dagster(small, ray_prometheus, tmp_path, monkeypatch):
    """ray_ingest_job over the first two hours in one Dagster run: the asset's checks pass and the lake holds
    the truth's row count."""
    import dagster as dg

    from foxhunt_obs.definitions import defs

    monkeypatch.setenv("FOXHUNT_LAKE", str(tmp_path / "lake"))
    monkeypatch.setenv("FOXHUNT_PROMETHEUS_URL", ray_prometheus.url)
    first, last = (f"2026-11-16-{h:02d}:00" for h in (0, 1))
    result = (
        defs()
        .resolve_job_def("ray_ingest_job")
        .execute_in_process(
            instance=dg.DagsterInstance.ephemeral(),
            tags={"dagster/asset_partition_range_start": first, "dagster/asset_partition_range_end": last},
            raise_on_error=False,
        )
    )
    assert result.success
    checks = {e.check_name: e.passed for e in result.get_asset_check_evaluations()}
    assert checks == {"core_series_reported": True, "ray_pods_scraped": True, "unique_pod_ts": True}
    assert Lake(str(tmp_path / "lake")).read_partition(RAY_SAMPLES, "2026-11-16T00").num_rows == 360


# ---- scrape setups the sandbox does not have: a real Prometheus backfilled with a few KubeRay pods ----------
# The same Ray cluster in namespace `once` (deploy/kubernetes/ray-podmonitor.yaml only: job = node type,
# `node` relabelled) and in `twice` (also Ray's guide's monitors, ray-project/ray doc/source/cluster/kubernetes/
# k8s-ecosystem/prometheus-grafana.md: job <namespace>/<podmonitor> as prometheus-operator names it, no `node`,
# and the head's as-metrics port down for want of an autoscaler); in `recreated` a RayCluster whose head pod is
# replaced at 10 minutes by one with another experiment.
T0 = datetime(2026, 11, 20, 12, 0, tzinfo=timezone.utc).timestamp()
GUIDE = {"head": "prometheus-system/ray-head-monitor", "worker": "prometheus-system/ray-workers-monitor"}


def _pod_series(ns: str, cluster: str, pod: str, kind: str, ip: str) -> list[tuple[str, dict, float]]:
    """One Ray pod's page (Ray 2.6.1's labels, as fixtures/real/ray/): family, labels, value."""
    common = {"NodeAddress": ip, "SessionName": "session_2026-11-20_12-00-00_000000_1", "Version": "2.6.1"}
    raylet = {"Component": "raylet", **common, "WorkerId": ""}
    gpus = (0, 0) if kind == "head" else (6, 2)
    out = [
        ("ray_resources", {**raylet, "Name": "GPU", "State": "USED"}, gpus[0]),
        ("ray_resources", {**raylet, "Name": "GPU", "State": "AVAILABLE"}, gpus[1]),
        ("ray_resources", {**raylet, "Name": "object_store_memory", "State": "AVAILABLE"}, 1000),
        ("ray_resources", {**raylet, "Name": "object_store_memory", "State": "USED"}, 0),
        ("ray_object_store_memory", {**raylet, "Location": "MMAP_SHM", "ObjectState": "SEALED"}, 300),
    ]
    for worker_id, running in (("a" * 56, 1), ("b" * 56, 2)):  # two core workers: 3 tasks running
        core = {"Component": "core_worker", **common, "WorkerId": worker_id, "Source": "executor"}
        out.append(("ray_tasks", {**core, "Name": "f", "State": "RUNNING"}, running))
    if kind == "head":
        out.append(
            ("ray_actors", {"Component": "gcs_server", **common, "Source": "gcs", "State": "ALIVE"}, 2)
        )
    return out


def _scrapes(ns: str, pod: str, kind: str, ip: str, twice: bool) -> list[tuple[dict, dict]]:
    """(target labels, the up series' extra labels) of every scrape of the pod's metrics port, plus the
    guide's head monitor's other ports."""
    target = {"instance": f"{ip}:8080", "namespace": ns, "pod": pod, "container": f"ray-{kind}"}
    ours = {"job": kind, **target, "endpoint": "metrics", "node": "n1"}
    out = [(ours, {})]
    if twice:
        guide = {"job": GUIDE[kind], **target, "endpoint": "metrics"}
        out.append((guide, {}))
        if kind == "head":
            for port, number, up in (("as-metrics", 44217, 0), ("dash-metrics", 44227, 1)):
                other = {**guide, "instance": f"{ip}:{number}", "endpoint": port}
                out.append((other, {"__up__": up}))
    return out


def _kuberay_history() -> str:
    lines: dict[str, list[str]] = {}

    def add(family: str, labels: dict, value: float, minutes: tuple[int, int]):
        text = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
        for t in range(int(T0) + minutes[0] * 60, int(T0) + minutes[1] * 60 + 1, 30):
            lines.setdefault(family, []).append(f"{family}{{{text}}} {value} {t}")

    def pod(ns, cluster, name, kind, ip, experiment, minutes=(0, 20), twice=False):
        ray_labels = {"label_ray_io_cluster": cluster, "label_ray_io_node_type": kind}
        ksm = {"namespace": ns, "pod": name, "job": "kube-state-metrics", **ray_labels}
        add(
            "kube_pod_labels", {**ksm, **({"label_experiment": experiment} if experiment else {})}, 1, minutes
        )
        for target, extra in _scrapes(ns, name, kind, ip, twice):
            add("up", {**target, "ray_io_cluster": cluster}, extra.get("__up__", 1), minutes)
            if extra:
                continue  # the autoscaler's and dashboard's ports: no Ray node series
            for family, labels, value in _pod_series(ns, cluster, name, kind, ip):
                add(family, {**labels, **target, "ray_io_cluster": cluster}, value, minutes)

    for ns, twice in (("once", False), ("twice", True)):
        pod(ns, "rc", "rc-head", "head", "10.1.0.1", "ppo", twice=twice)
        pod(ns, "rc", "rc-worker-0", "worker", "10.1.0.2", "", twice=twice)
    pod("recreated", "rr", "rr-head-a", "head", "10.1.1.1", "exp-a", minutes=(0, 10))
    pod("recreated", "rr", "rr-head-b", "head", "10.1.1.2", "exp-b", minutes=(10, 20))
    pod("recreated", "rr", "rr-worker-0", "worker", "10.1.1.3", "")
    body = [f"# TYPE {family} gauge\n" + "\n".join(rows) for family, rows in lines.items()]
    return "\n".join(body) + "\n# EOF\n"


@pytest.fixture(scope="module")
def kuberay_prometheus(tmp_path_factory):
    work = tmp_path_factory.mktemp("kuberay")
    (work / "history.om").write_text(_kuberay_history())
    backfill_openmetrics(work / "history.om", work / "tsdb")
    with PrometheusServer(work / "tsdb", workdir=work) as server:
        yield server


@pytest.fixture(scope="module")
def kuberay_samples(kuberay_prometheus):
    window = Window(T0, T0 + 20 * 60, 60, "ray_samples test")
    client = PrometheusClient(kuberay_prometheus.url)
    return collect_ray_samples(client, load_ray_catalog(), load_catalog(), window).to_pandas()


def test_a_pod_scraped_by_two_jobs_is_counted_once(kuberay_samples):
    """The guide's monitors beside ours: every row as with our PodMonitor alone (GPUs, object store, tasks
    summed over the two core workers, the GCS's actors), all alive although the as-metrics port is down."""
    df = kuberay_samples
    once, twice = (
        df[df["namespace"] == ns].drop(columns="namespace").reset_index(drop=True) for ns in ("once", "twice")
    )
    assert len(once) == 2 * 20  # two pods, 20 one-minute steps
    pd.testing.assert_frame_equal(once, twice)
    assert once["alive"].all() and (once["tasks_running"] == 3).all()
    worker = once[once["pod"] == "rc-worker-0"]
    assert (worker["gpus_total"] == 8).all() and (worker["gpus_available"] == 2).all()
    assert (once["object_store_used_bytes"] == 300).all() and (
        once["object_store_capacity_bytes"] == 1000
    ).all()
    assert (once[once["pod"] == "rc-head"]["actors_alive"] == 2).all()
    assert (once["experiment"] == "ppo").all()


def test_a_recreated_head_names_the_experiment_from_its_own_step(kuberay_samples):
    """A worker takes the old head's experiment until the new head appears, the new one's from then on;
    each head pod keeps its own."""
    df = kuberay_samples
    worker = df[df["pod"] == "rr-worker-0"].set_index("ts")["experiment"]
    minute = (worker.index - pd.Timestamp(T0, unit="s", tz="UTC")) // pd.Timedelta(minutes=1)
    assert list(worker[minute < 10].unique()) == ["exp-a"] and len(worker[minute < 10]) == 10
    assert list(worker[minute >= 10].unique()) == ["exp-b"] and len(worker[minute >= 10]) == 10
    heads = df[df["pod"].str.startswith("rr-head")]
    assert (heads["node_type"] == "head").all()
    assert dict(heads.groupby("pod", observed=True)["experiment"].unique().map(list)) == {
        "rr-head-a": ["exp-a"],
        "rr-head-b": ["exp-b"],
    }


def test_the_summary_lists_every_experiment_of_a_cluster_sorted(kuberay_prometheus, tmp_path):
    """The asset's per-cluster summary, on every run the same: both experiments of the recreated cluster."""
    hour = datetime.fromtimestamp(T0, timezone.utc)
    client = PrometheusClient(kuberay_prometheus.url)
    settings = ClusterResource().settings()
    b = ray_tables.ray_samples(
        Lake(str(tmp_path / "lake")), client, load_ray_catalog(), load_catalog(), settings, [hour]
    )
    table = [[c.strip() for c in line.split("|")[1:-1]] for line in str(b.summary["clusters"]).splitlines()]
    assert table[0][:2] == ["ray_cluster", "experiments"]
    assert [row[:2] for row in table[2:]] == [["rc", "ppo"], ["rr", "exp-a, exp-b"]]
