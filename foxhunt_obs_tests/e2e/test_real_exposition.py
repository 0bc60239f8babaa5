"""Real exporters' pages, scraped by a real Prometheus as each deployment ships its scrape config.

The pages are public samples (foxhunt_obs_tests/fixtures/real/dcgm/, each with its source), served as
they are. Each scrape job carries the target labels Kubernetes service discovery gives that
deployment's ServiceMonitor (prometheus-operator attaches namespace, service, pod, container, endpoint;
static labels here are target labels exactly as relabelled SD labels are) and its honor_labels:

* NVIDIA GPU Operator: container nvidia-dcgm-exporter, honorLabels false (its ServiceMonitor default);
* NVIDIA's dcgm-exporter Helm chart: container `exporter`, honorLabels false (the chart's default);
* a ServiceMonitor with honorLabels true (as NVIDIA/aicr sets it), on a MIG page;
* the foxhunt exporter as exporter/deploy/servicemonitor.yaml scrapes it (honorLabels true, the target's pod
  labels dropped);
* a training pod reporting its own GPUs, as exporter/deploy/sidecar-job.yaml's PodMonitor scrapes it: our
  exporter in sidecar mode (endpoint gpu-metrics, container gpu-exporter, honorLabels true) and the
  trainers' library with its in-process poller (endpoint training-metrics, container trainer, honorLabels
  false), each pod given GPUs in kube-state-metrics' kube_pod_container_resource_limits.

Then the ingest (collect_gpu_samples) and the recording rules as the catalog generates them now must
agree on who holds what.
"""

from __future__ import annotations

import http.server
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from foxhunt_obs.lib.ingest.gpu_series import (
    Window,
    collect_gpu_samples,
    collect_node_samples,
    missing_core_columns,
)
from foxhunt_obs.lib.ingest.metric_catalog import load_catalog
from foxhunt_obs.lib.ingest.recording_rules import SOURCE, recording_rules
from foxhunt_obs.lib.rule_files import render
from foxhunt_obs.lib.sources.prometheus import PrometheusClient
from foxhunt_obs.sandbox.example_trainer import start_example_trainer
from foxhunt_obs.sandbox.servers.local_server import free_port, kill_group, wait_serving
from foxhunt_obs.sandbox.servers.prometheus import PrometheusServer, start_fake_exporter

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "real"
REAL = FIXTURES / "dcgm"
ROOT = Path(__file__).resolve().parents[2]
NODE_LABELS = ("node", "kubernetes_node", "Hostname", "hostname", "instance")

OPERATOR_POD = "nvidia-dcgm-exporter-7fq2x"
CHART_POD = "dcgm-exporter-x9k2p"
AICR_POD = "nvidia-dcgm-exporter-b4w9c"
# exporter/deploy/sidecar-job.yaml: one training pod with our exporter as its sidecar, another whose trainer
# polls its GPUs in process (the trainers' library, as the sandbox's example trainer runs it)
TRAINING_NS = "training"
SIDECAR_POD, TRAINER_POD = "training-ppo-policy-fold-0-abcde", "training-sac-fold-1-x7k2p"
# prometheus-operator (pkg/prometheus/promcfg.go generatePodMonitorConfig) names a PodMonitor endpoint's scrape
# config podMonitor/<namespace>/<name>/<index> and relabels its targets' job to <namespace>/<name>
PODMONITOR_JOB = "training/foxhunt-training"
PODMONITOR_JOB_LABEL = [{"target_label": "job", "replacement": PODMONITOR_JOB}]
SIDECAR_NODE = "sidecar-node"
TRAINER_NODE = "sandbox-trainer-node"  # the example trainer's fake GPUs' hostname
TRAINER_ARGS = ("--folds", "2", "--epochs", "2", "--batches", "2", "--step-seconds", "0.01", "--fake-gpus", "2",
                "--gpu-interval", "0.5")  # fmt: skip
# Each training pod's GPU limit, in kube-state-metrics' format (label set and unit as in
# kubernetes/kube-state-metrics v2.20.0 internal/store/pod_test.go, kube_pod_container_resource_limits):
# lines written for this test's pods, appended to the real KSM page. The exporter pods have cpu limits only.
KSM_LIMITS = f"""
# TYPE kube_pod_container_resource_limits gauge
kube_pod_container_resource_limits{{container="trainer",namespace="{TRAINING_NS}",node="{SIDECAR_NODE}",pod="{SIDECAR_POD}",resource="nvidia_com_gpu",uid="uid-s",unit="integer"}} 2
kube_pod_container_resource_limits{{container="trainer",namespace="{TRAINING_NS}",node="{SIDECAR_NODE}",pod="{SIDECAR_POD}",resource="memory",uid="uid-s",unit="byte"}} 2.74877906944e+11
kube_pod_container_resource_limits{{container="trainer",namespace="{TRAINING_NS}",node="{TRAINER_NODE}",pod="{TRAINER_POD}",resource="nvidia_com_gpu",uid="uid-t",unit="integer"}} 2
kube_pod_container_resource_limits{{container="nvidia-dcgm-exporter",namespace="gpu-operator",node="gpu-node-1",pod="nvidia-dcgm-exporter-7fq2x",resource="cpu",uid="uid-o",unit="core"}} 0.2
"""
PAGES = {
    "/operator": "dcgm-exporter-4x-gpu-operator-h100-pods.prom",
    "/chart": "dcgm-exporter-4x-vgpu-xid-errcode.prom",
    "/mig": "dcgm-exporter-mig-h100-pods-issue512.prom",
    "/mig-no-util": "dcgm-exporter-mig-a800-hostname-pre337.prom",
    "/ksm": "../kube_state_metrics.prom",
    "/node-exporter": "../node_exporter.prom",
}


def _target(job, port, path, honor, labels, relabel=None):
    cfg = {
        "job_name": job,
        "metrics_path": path,
        "honor_labels": honor,
        "scrape_interval": "1s",
        "static_configs": [{"targets": [f"127.0.0.1:{port}"], "labels": labels}],
    }
    if relabel:
        cfg["relabel_configs"] = relabel
    return cfg


def _start_sidecar_exporter(port: int, workdir: Path) -> subprocess.Popen:
    """Our exporter in sidecar mode (fake backend, 2 GPUs), the pod's identity in the environment as the
    Downward API gives it in exporter/deploy/sidecar-job.yaml; serving when this returns."""
    scenario = workdir / "sidecar-scenario.json"
    scenario.write_text(json.dumps({"gpus": 2, "model": "NVIDIA H100 80GB HBM3", "hostname": SIDECAR_NODE}))
    env = {**os.environ, "POD_NAME": SIDECAR_POD, "POD_NAMESPACE": TRAINING_NS, "CONTAINER_NAME": "trainer"}
    log = workdir / "sidecar.log"
    cmd = [sys.executable, "-m", "foxhunt_gpu_exporter", "--fake", str(scenario), "--mode", "sidecar",
           "--listen-address", f"127.0.0.1:{port}", "--interval", "0.5"]  # fmt: skip
    with log.open("ab") as out:
        process = subprocess.Popen(
            cmd,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    return wait_serving(process, port, 20, "sidecar exporter", log)


class _ScrapingPrometheus(PrometheusServer):
    def __init__(self, workdir: Path, scrape_configs: list[dict], rule_files: tuple[Path, ...]):
        super().__init__(workdir / "tsdb", workdir=workdir, rule_files=rule_files)
        self.scrape_configs = scrape_configs

    def _config(self) -> str:
        return json.dumps(
            {
                "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                "rule_files": [str(p) for p in self.rule_files],
                "scrape_configs": self.scrape_configs,
            }
        )


@pytest.fixture(scope="module")
def scraped(tmp_path_factory):
    work = tmp_path_factory.mktemp("real-pages")
    bodies = {path: (REAL / name).read_bytes() for path, name in PAGES.items()}
    bodies["/ksm"] += KSM_LIMITS.encode()

    class Pages(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = bodies.get(self.path)
            self.send_response(200 if body else 404)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.end_headers()
            self.wfile.write(body or b"")

        def log_message(self, *args):  # quiet
            pass

    pages = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Pages)
    threading.Thread(target=pages.serve_forever, daemon=True).start()
    port = pages.server_address[1]
    exporter_port = free_port()
    exporter = start_fake_exporter(exporter_port, work, interval=0.5, hostname="foxhunt-node")
    sidecar_port, trainer_port = free_port(), free_port()
    sidecar = _start_sidecar_exporter(sidecar_port, work)
    trainer = start_example_trainer(trainer_port, work, *TRAINER_ARGS)
    scrape = [
        _target(
            "nvidia-dcgm-exporter",
            port,
            "/operator",
            False,
            {
                "namespace": "gpu-operator",
                "pod": OPERATOR_POD,
                "container": "nvidia-dcgm-exporter",
                "service": "nvidia-dcgm-exporter",
                "endpoint": "gpu-metrics",
            },
        ),
        _target(
            "dcgm-exporter",
            port,
            "/chart",
            False,
            {
                "namespace": "gpu-monitoring",
                "pod": CHART_POD,
                "container": "exporter",
                "service": "dcgm-exporter",
                "endpoint": "metrics",
            },
        ),
        _target(
            "dcgm-exporter-honor",
            port,
            "/mig",
            True,
            {
                "namespace": "gpu-operator",
                "pod": AICR_POD,
                "container": "nvidia-dcgm-exporter",
                "service": "nvidia-dcgm-exporter",
                "endpoint": "gpu-metrics",
            },
        ),
        _target(
            "dcgm-exporter-a800",
            port,
            "/mig-no-util",
            False,
            {"namespace": "monitoring", "pod": "dcgm-exporter-a800", "container": "exporter"},
        ),
        # kube-prometheus-stack: kube-state-metrics with honorLabels true; node_exporter on the node's
        # IP (hostNetwork), no node label: the KSM page's node 127.0.0.1 has internal_ip 1.2.3.4
        _target(
            "kube-state-metrics",
            port,
            "/ksm",
            True,
            {"namespace": "monitoring", "pod": "kube-state-metrics-6f8d9", "container": "kube-state-metrics"},
        ),
        _target(
            "node-exporter",
            port,
            "/node-exporter",
            False,
            {
                "instance": "1.2.3.4:9100",
                "namespace": "monitoring",
                "pod": "node-exporter-q7x2m",
                "container": "node-exporter",
            },
        ),
        # exporter/deploy/servicemonitor.yaml: honorLabels true and the target's pod/namespace/container dropped
        _target(
            "foxhunt-gpu-exporter",
            exporter_port,
            "/metrics",
            True,
            {"namespace": "monitoring", "pod": "foxhunt-gpu-exporter-abcde", "container": "exporter"},
            relabel=[{"regex": "pod|namespace|container", "action": "labeldrop"}],
        ),
        # exporter/deploy/sidecar-job.yaml's PodMonitor: the sidecar's endpoint (honorLabels true, node from
        # the pod's node) and the trainer's (honorLabels false, the PodMonitor's default)
        _target(
            f"podMonitor/{PODMONITOR_JOB}/1",
            sidecar_port,
            "/metrics",
            True,
            {
                "namespace": TRAINING_NS,
                "pod": SIDECAR_POD,
                "container": "gpu-exporter",
                "endpoint": "gpu-metrics",
                "node": SIDECAR_NODE,
            },
            relabel=PODMONITOR_JOB_LABEL,
        ),
        _target(
            f"podMonitor/{PODMONITOR_JOB}/0",
            trainer_port,
            "/metrics",
            False,
            {
                "namespace": TRAINING_NS,
                "pod": TRAINER_POD,
                "container": "trainer",
                "endpoint": "training-metrics",
            },
            relabel=PODMONITOR_JOB_LABEL,
        ),
    ]
    # the recording rules as `foxhunt-obs rules export` writes them from the catalog now
    rules_file = work / "foxhunt-recording-rules.yaml"
    rules_file.write_text(render(recording_rules(load_catalog(), NODE_LABELS), SOURCE))
    server = _ScrapingPrometheus(work, scrape, (rules_file,))
    server.start()
    client = PrometheusClient(server.url, timeout_s=10)
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # every target scraped, the rules evaluated a few times
            up = client.query("count(up == 1)", time.time())
            rules = client.query("count(foxhunt:gpu_util:ratio)", time.time())
            training = client.query(
                f'count(foxhunt:gpu_util:ratio{{node=~"{SIDECAR_NODE}|{TRAINER_NODE}"}})', time.time()
            )
            if (
                up
                and up[0][1] == len(scrape)
                and rules
                and rules[0][1] >= 17
                and training
                and training[0][1] == 4
            ):
                break
            time.sleep(0.5)
        # the 4 s window below must start after every target's first scrape: under load a window
        # starting earlier saw node_exporter before kube-state-metrics (no instance id for a step)
        time.sleep(6)
        end = float(int(time.time()))
        table = collect_gpu_samples(
            client, load_catalog(), Window(end - 4, end, 1.0, "real pages"), node_labels=NODE_LABELS
        )
        rules = client.query("foxhunt:gpu_util:ratio", end)
        nodes = collect_node_samples(
            client, load_catalog(), Window(end - 4, end, 1.0, "real pages"), node_labels=NODE_LABELS
        )
        yield table.to_pandas(), rules, nodes.to_pandas()
    finally:
        server.stop()
        for process in (exporter, sidecar, trainer):
            kill_group(process.pid, 10, process)
        pages.shutdown()


def _holders(df, uuid):
    rows = df[df["uuid"] == uuid]
    return sorted(
        {
            (r.gpu_instance if r.gpu_instance == r.gpu_instance else None, r.namespace, r.pod)
            for r in rows.itertuples()
        },
        key=str,
    )


def test_gpu_operator_page_unheld_gpus_are_not_the_exporter_pods(scraped):
    df, _, _ = scraped
    node = df[df["node"] == "gpu-node-1"]
    assert node["uuid"].nunique() == 8
    held = node[node["pod"] != ""]
    assert set(held["gpu"]) == {0}
    assert set(held["pod"]) == {"vllm-agg-0-vllmdecodeworker-s65j5"}
    assert set(held["namespace"]) == {"dynamo-workload"} and set(held["container"]) == {"main"}
    assert OPERATOR_POD not in set(df["pod"])
    # percent -> ratio, on ingest
    assert node["util"].between(0, 1).all()


def test_helm_chart_exporter_container_named_exporter_holds_nothing(scraped):
    df, _, _ = scraped
    vgpu = df[df["uuid"] == "GPU-f809e614-a528-4083-acbf-334600000000"]
    assert len(vgpu) and set(vgpu["pod"]) == {""} and set(vgpu["namespace"]) == {""}
    assert CHART_POD not in set(df["pod"])
    # err_code / err_msg on the XID series: still one row per GPU and step
    assert not vgpu.duplicated(["ts"]).any()
    assert set(vgpu["xid_last"]) == {0.0}


def test_mig_slices_are_rows_of_their_own_with_their_own_holders(scraped):
    df, _, _ = scraped
    mig = df[df["uuid"] == "GPU-58e8f5ea-13cc-013a-d88f-2bcf5ae8bc77"]
    by_slice = {int(i): set(g["pod"]) for i, g in mig.groupby("gpu_instance")}
    assert by_slice == {
        7: {"text-embedding-predictor-00008-deployment-57946f6c67-vdtjl"},
        8: {""},  # honor_labels true: the target's own pod filled in, recognised as no holder
        9: {"tts-predictor-00011-deployment-5554f75554-8j8pl"},
    }
    assert set(mig["gpu_profile"]) == {"1g.10gb"}
    assert mig["gpu_share"].round(12).eq(round(1 / 7, 12)).all()  # 1g on an H100: 1 of 7 compute slices
    # no GPU_UTIL on slices: util is GR_ENGINE_ACTIVE, and the row says so
    assert set(mig["util_basis"]) == {"DCGM_FI_PROF_GR_ENGINE_ACTIVE"}
    assert mig["util"].eq(0).all()
    assert not mig.duplicated(["ts", "gpu_instance"]).any()


def test_mig_without_any_activity_field_is_named_not_idle(scraped):
    """The A800 page's MIG GPU has neither GPU_UTIL nor GR_ENGINE_ACTIVE: util stays unknown and
    the core-columns guard names what it looked for."""
    df, _, _ = scraped
    a800 = df[df["uuid"] == "GPU-1f027ee8-6e1e-2b8c-0108-3d370e5f0418"]
    assert sorted(set(a800["gpu_instance"].astype(int))) == [3, 5, 6]
    assert a800["util"].isna().all() and set(a800["util_basis"]) == {""}
    assert a800["mem_used_bytes"].eq(10 * 2**20).all()  # FB per slice, MiB -> bytes
    assert a800["gpu_share"].round(12).eq(round(2 / 7, 12)).all()
    import pyarrow as pa

    missing = missing_core_columns(pa.Table.from_pandas(df, preserve_index=False), load_catalog())
    assert "util" in missing
    assert {"DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_PROF_GR_ENGINE_ACTIVE"} <= set(missing["util"]["looked_for"])
    assert missing["util"]["gpus"] >= 3


def test_foxhunt_exporter_as_its_servicemonitor_scrapes_it(scraped):
    df, _, _ = scraped
    ours = df[df["node"] == "foxhunt-node"]
    assert len(ours) and set(ours["pod"]) == {""}
    assert set(ours["util_basis"]) == {"foxhunt_gpu_utilization_percent"}
    assert ours["mem_total_bytes"].gt(0).all()


def _live_holders(rules, node: str) -> set[tuple[str, str, str]]:
    return {
        (x.get("namespace", ""), x.get("pod", ""), x.get("container", ""))
        for x, _ in rules
        if x.get("node") == node
    }


def test_sidecar_mode_gpus_are_held_by_the_training_pod(scraped):
    """honorLabels true: the sidecar's series name the training pod, which is also its scrape target's pod
    (on `up`); kube-state-metrics says that pod was given GPUs, so it holds them, in the trainer container."""
    df, rules, _ = scraped
    ours = df[df["node"] == SIDECAR_NODE]
    assert ours["uuid"].nunique() == 2
    assert set(zip(ours["namespace"], ours["pod"], ours["container"])) == {
        (TRAINING_NS, SIDECAR_POD, "trainer")
    }
    assert _live_holders(rules, SIDECAR_NODE) == {(TRAINING_NS, SIDECAR_POD, "trainer")}


def test_in_process_poller_gpus_are_held_by_the_training_pod(scraped):
    """The trainers' library exposes no pod label: every label of its GPU series is the target's, as on
    `up`; the pod's GPU limit makes it their holder."""
    df, rules, _ = scraped
    ours = df[df["node"] == TRAINER_NODE]
    assert ours["uuid"].nunique() == 2
    assert set(zip(ours["namespace"], ours["pod"], ours["container"])) == {
        (TRAINING_NS, TRAINER_POD, "trainer")
    }
    assert ours["util"].notna().all()
    assert _live_holders(rules, TRAINER_NODE) == {(TRAINING_NS, TRAINER_POD, "trainer")}


def test_recording_rules_agree_with_the_ingest_on_holders(scraped):
    df, rules, _ = scraped
    live = {
        (x.get("uuid", ""), x.get("gpu_instance", ""), x.get("pod", ""))
        for x, _ in rules
        if x.get("uuid") in set(df["uuid"])
    }
    ingest = {
        (r.uuid, "" if r.gpu_instance != r.gpu_instance else str(int(r.gpu_instance)), r.pod)
        for r in df[df["util"].notna()].drop_duplicates(["uuid", "gpu_instance"]).itertuples()
    }
    assert live == ingest
    assert not any(p in (OPERATOR_POD, CHART_POD, AICR_POD) for _, _, p in live)


def test_node_exporter_scraped_by_ip_lands_on_the_kube_node(scraped):
    """kube_node_info{internal_ip} names the node of a node_exporter scraped by IP, and its
    provider_id the instance (both lines verbatim from kube-state-metrics' tests)."""
    _, _, nodes = scraped
    assert set(nodes["node"]) == {"127.0.0.1"}
    assert set(nodes["instance_id"]) == {"i-uniqueid"}  # two series of the node: the newest, then the id
    # node_exporter 1.3.1's MemTotal and MemAvailable (fixtures/real/node_exporter.prom)
    assert nodes["mem_total_bytes"].eq(1.01888e9).all()
    assert nodes["mem_used_bytes"].eq(1.01888e9 - 7.11532544e8).all()


def test_a_missing_activity_source_fails_the_check_in_a_real_dagster_run(tmp_path, monkeypatch):
    """The A800 MIG page (no GPU_UTIL, no GR_ENGINE_ACTIVE on its slices), as an hour of history in a
    real Prometheus, through a real gpu_ingest_job run: the run succeeds, core_columns_reported fails and
    names the metric names it looked for, and the GPU-hours carry unknown activity, not idle."""
    import subprocess

    import dagster as dg
    from prometheus_client.parser import text_string_to_metric_families

    from foxhunt_obs.definitions import defs
    from foxhunt_obs.lib.lake import Lake
    from foxhunt_obs.lib.schemas import GPU_HOURLY
    from foxhunt_obs.sandbox.servers.prometheus import PROMTOOL

    page = (REAL / "dcgm-exporter-mig-a800-hostname-pre337.prom").read_text()
    t0 = 1794787200  # 2026-11-16T00:00:00Z
    lines = []
    for family in text_string_to_metric_families(page):
        lines.append(f"# TYPE {family.name} gauge")
        for s in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in s.labels.items())
            lines += [f"{s.name}{{{labels}}} {s.value} {t0 + 15 * k}" for k in range(240)]
    history = tmp_path / "a800.om"
    history.write_text("\n".join(lines) + "\n# EOF\n")
    subprocess.run([PROMTOOL, "tsdb", "create-blocks-from", "openmetrics", "--quiet", str(history), str(tmp_path / "tsdb")], check=True)  # fmt: skip
    with PrometheusServer(tmp_path / "tsdb", workdir=tmp_path / "prom") as prom:
        monkeypatch.setenv("FOXHUNT_PROMETHEUS_URL", prom.url)
        monkeypatch.setenv("FOXHUNT_LAKE", str(tmp_path / "lake"))
        tags = {
            "dagster/asset_partition_range_start": "2026-11-16-00:00",
            "dagster/asset_partition_range_end": "2026-11-16-00:00",
        }
        result = (
            defs()
            .resolve_job_def("gpu_ingest_job")
            .execute_in_process(instance=dg.DagsterInstance.ephemeral(), tags=tags, raise_on_error=False)
        )
        assert result.success
        checks = {e.check_name: e for e in result.get_asset_check_evaluations()}
        core = checks["core_columns_reported"]
        assert not core.passed
        text = core.metadata["missing"].value
        assert "`util`: 3 of 5 GPUs" in text and "`DCGM_FI_PROF_GR_ENGINE_ACTIVE`" in text
        hourly = (
            defs()
            .resolve_job_def("gpu_hourly_job")
            .execute_in_process(
                instance=dg.DagsterInstance.ephemeral(), partition_key="2026-11-16", raise_on_error=False
            )
        )
        assert hourly.success
    rows = Lake(str(tmp_path / "lake")).read_partition(GPU_HOURLY, "2026-11-16").to_pandas()
    slices = rows[rows["gpu_instance"].notna()]
    assert (
        len(slices) == 3
        and slices["active_gpu_seconds"].isna().all()
        and (slices["activity_seconds"] == 0).all()
    )
    whole = rows[rows["gpu_instance"].isna()]
    assert len(whole) == 2 and whole["active_gpu_seconds"].notna().all()  # GPUs 1 and 2 report GPU_UTIL
