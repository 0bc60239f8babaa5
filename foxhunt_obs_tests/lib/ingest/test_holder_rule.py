"""Who holds a GPU when the pod reporting it is its holder: our exporter's sidecar mode and the trainers'
in-process poller, beside the exporters whose own pod holds nothing. The ingest's rule
(ScrapeTargets.holder) and the recording rules generated now (promtool test rules) must agree.

Labels as a PodMonitor leaves them (prometheus-operator pkg/prometheus/promcfg.go, generatePodMonitorConfig:
namespace, container and pod from the pod's meta labels, job "<namespace>/<podmonitor>"); GPU limits in
kube-state-metrics' format (kubernetes/kube-state-metrics v2.20.0 internal/store/pod_test.go:
kube_pod_container_resource_limits{container, namespace, node, pod, resource="nvidia_com_gpu", uid,
unit="integer"})."""

import subprocess
import textwrap
from datetime import datetime, timezone

import pytest

from foxhunt_obs.lib.ingest.gpu_series import Window, gpu_containers
from foxhunt_obs.lib.ingest.metric_catalog import ScrapeTargets, load_catalog
from foxhunt_obs.lib.ingest.recording_rules import SOURCE, recording_rules
from foxhunt_obs.lib.rule_files import render
from foxhunt_obs.lib.sources.prometheus import PrometheusClient
from foxhunt_obs.sandbox.servers.prometheus import PrometheusServer, backfill_openmetrics

NODE_LABELS = ("node", "kubernetes_node", "Hostname", "hostname", "instance")
JOB = "training/foxhunt-training"  # the PodMonitor of exporter/deploy/sidecar-job.yaml
SIDECAR = {"job": JOB, "instance": "10.0.2.7:9095", "namespace": "training", "pod": "ppo-0-abcde",
           "container": "gpu-exporter", "endpoint": "gpu-metrics"}  # fmt: skip
TRAINER = {"job": JOB, "instance": "10.0.2.8:9094", "namespace": "training", "pod": "sac-1-x7k2p",
           "container": "trainer", "endpoint": "training-metrics"}  # fmt: skip
DCGM = {"job": "gpu-operator/nvidia-dcgm-exporter", "instance": "10.0.2.9:9400", "namespace": "gpu-operator",
        "pod": "nvidia-dcgm-exporter-x", "container": "nvidia-dcgm-exporter"}  # fmt: skip


def _key(target: dict) -> tuple[str, str, str, str]:
    return target["job"], target["instance"], target["namespace"], target["pod"]


# a dcgm-exporter container inside a training pod whose trainer container was given GPUs (honorLabels false)
MIXED = {"job": "training/dcgm-sidecar", "instance": "10.0.2.11:9400", "namespace": "training",
         "pod": "td3-2-q8w4z", "container": "dcgm-exporter"}  # fmt: skip
TARGETS = ScrapeTargets(
    frozenset({_key(SIDECAR), _key(TRAINER), _key(DCGM), _key(MIXED)}),
    gpu_containers=frozenset(
        {
            ("training", "ppo-0-abcde", "trainer"),
            ("training", "sac-1-x7k2p", "trainer"),
            ("training", "td3-2-q8w4z", "trainer"),
        }
    ),  # fmt: skip
)
GPU = {"gpu": "0", "uuid": "GPU-1"}


def test_sidecar_mode_under_honor_labels_true_names_the_training_container():
    """The exposition's pod/namespace/container (the trainer's) win; the pod is the target's own."""
    series = {**SIDECAR, **GPU, "container": "trainer"}
    assert TARGETS.holder(series, load_catalog()) == ("training", "ppo-0-abcde", "trainer")


def test_sidecar_mode_under_honor_labels_false_keeps_the_exported_holder():
    series = {**SIDECAR, **GPU, "exported_pod": "ppo-0-abcde", "exported_namespace": "training",
              "exported_container": "trainer"}  # fmt: skip
    assert TARGETS.holder(series, load_catalog()) == ("training", "ppo-0-abcde", "trainer")


def test_the_in_process_poller_holds_its_gpus():
    """No pod label in the trainer's exposition: under either honor_labels its series carry the target's
    labels, exactly what `up` carries."""
    assert TARGETS.holder({**TRAINER, **GPU}, load_catalog()) == ("training", "sac-1-x7k2p", "trainer")


def test_an_exporter_pod_given_no_gpu_still_holds_nothing():
    catalog = load_catalog()
    assert TARGETS.holder({**DCGM, **GPU}, catalog) == ("", "", "")
    held = {**DCGM, **GPU, "exported_pod": "sac-1-x7k2p", "exported_namespace": "training",
            "exported_container": "trainer"}  # fmt: skip
    assert TARGETS.holder(held, catalog) == ("training", "sac-1-x7k2p", "trainer")


def test_an_exporter_container_beside_a_container_given_gpus_holds_nothing():
    """The limit is the trainer container's, not the pod's: the exporter container's unheld GPU (its series
    name the target's container) stays unheld, while the GPU it reports for the trainer is the trainer's."""
    catalog = load_catalog()
    assert TARGETS.holder({**MIXED, **GPU}, catalog) == ("", "", "")
    held = {**MIXED, **GPU, "exported_pod": "td3-2-q8w4z", "exported_namespace": "training",
            "exported_container": "trainer"}  # fmt: skip
    assert TARGETS.holder(held, catalog) == ("training", "td3-2-q8w4z", "trainer")


def test_without_kube_state_metrics_limits_the_training_pod_holds_nothing():
    """Today's rule, unchanged where no GPU limit is known (kube-state-metrics not scraped)."""
    bare = ScrapeTargets(TARGETS.pods)
    assert bare.holder({**TRAINER, **GPU}, load_catalog()) == ("", "", "")
    assert bare.holder({**SIDECAR, **GPU, "container": "trainer"}, load_catalog()) == ("", "", "")


def _labels(d: dict) -> str:
    return ",".join(f'{k}="{v}"' for k, v in d.items())


# GPU-s: sidecar (honor true), GPU-t: in-process (honor false), GPU-d: dcgm-exporter's unheld GPU,
# GPU-u: a trainer whose pod kube-state-metrics lists with cpu only and a GPU limit of 0 (not given GPUs),
# GPU-m0/m1: a dcgm-exporter container in a pod whose trainer container was given a GPU (m1, the trainer's)
UNIT_TEST = """
rule_files: [{rules}]
evaluation_interval: 15s
tests:
  - interval: 15s
    input_series:
      - series: 'up{{{sidecar}}}'
        values: '1 1'
      - series: 'up{{{trainer}}}'
        values: '1 1'
      - series: 'up{{{dcgm}}}'
        values: '1 1'
      - series: 'up{{{other}}}'
        values: '1 1'
      - series: 'up{{{mixed}}}'
        values: '1 1'
      - series: 'DCGM_FI_DEV_GPU_UTIL{{gpu="0",UUID="GPU-m0",Hostname="n5",modelName="H100",{mixed}}}'
        values: '0 0'
      - series: 'DCGM_FI_DEV_GPU_UTIL{{gpu="1",UUID="GPU-m1",Hostname="n5",modelName="H100",exported_pod="td3-2-q8w4z",exported_namespace="training",exported_container="trainer",{mixed}}}'
        values: '50 50'
      - series: 'foxhunt_gpu_utilization_percent{{{sidecar_gpu}}}'
        values: '40 50'
      - series: 'foxhunt_gpu_utilization_percent{{{trainer_gpu}}}'
        values: '60 80'
      - series: 'DCGM_FI_DEV_GPU_UTIL{{gpu="1",UUID="GPU-d",Hostname="n3",modelName="H100",{dcgm}}}'
        values: '0 0'
      - series: 'foxhunt_gpu_utilization_percent{{gpu="0",uuid="GPU-u",hostname="n4",model="H100",{other}}}'
        values: '20 20'
      - series: 'kube_pod_container_resource_limits{{{ksm},container="trainer",namespace="training",node="n1",pod="ppo-0-abcde",resource="nvidia_com_gpu",uid="u1",unit="integer"}}'
        values: '8 8'
      - series: 'kube_pod_container_resource_limits{{{ksm},container="trainer",namespace="training",node="n2",pod="sac-1-x7k2p",resource="nvidia_com_mig_1g_10gb",uid="u2",unit="integer"}}'
        values: '1 1'
      - series: 'kube_pod_container_resource_limits{{{ksm},container="nvidia-dcgm-exporter",namespace="gpu-operator",node="n3",pod="nvidia-dcgm-exporter-x",resource="cpu",uid="u3",unit="core"}}'
        values: '0.2 0.2'
      - series: 'kube_pod_container_resource_limits{{{ksm},container="trainer",namespace="training",node="n4",pod="cpu-only-q9",resource="nvidia_com_gpu",uid="u4",unit="integer"}}'
        values: '0 0'
      - series: 'kube_pod_container_resource_limits{{{ksm},container="trainer",namespace="training",node="n5",pod="td3-2-q8w4z",resource="nvidia_com_gpu",uid="u5",unit="integer"}}'
        values: '1 1'
    promql_expr_test:
      - expr: foxhunt:gpu_util:ratio
        eval_time: 15s
        exp_samples:
          - labels: 'foxhunt:gpu_util:ratio{{node="n1",gpu="0",uuid="GPU-s",model="H100",namespace="training",pod="ppo-0-abcde",container="trainer"}}'
            value: 0.5
          - labels: 'foxhunt:gpu_util:ratio{{node="n2",gpu="0",uuid="GPU-t",model="H100",namespace="training",pod="sac-1-x7k2p",container="trainer"}}'
            value: 0.8
          - labels: 'foxhunt:gpu_util:ratio{{node="n3",gpu="1",uuid="GPU-d",model="H100"}}'
            value: 0
          - labels: 'foxhunt:gpu_util:ratio{{node="n4",gpu="0",uuid="GPU-u",model="H100"}}'
            value: 0.2
          - labels: 'foxhunt:gpu_util:ratio{{node="n5",gpu="0",uuid="GPU-m0",model="H100"}}'
            value: 0
          - labels: 'foxhunt:gpu_util:ratio{{node="n5",gpu="1",uuid="GPU-m1",model="H100",namespace="training",pod="td3-2-q8w4z",container="trainer"}}'
            value: 0.5
"""


@pytest.mark.servers
def test_generated_recording_rules_agree(tmp_path):
    """The rules as `foxhunt-obs rules export` would write them now, evaluated by promtool."""
    rules = tmp_path / "rules.yaml"
    rules.write_text(render(recording_rules(load_catalog(), NODE_LABELS), SOURCE))
    other = {**TRAINER, "instance": "10.0.2.10:9094", "pod": "cpu-only-q9"}
    ksm = {"job": "kube-state-metrics", "instance": "10.0.0.5:8080", "endpoint": "http"}
    text = textwrap.dedent(UNIT_TEST).format(
        rules=rules,
        sidecar=_labels(SIDECAR),
        trainer=_labels(TRAINER),
        dcgm=_labels(DCGM),
        other=_labels(other),
        mixed=_labels(MIXED),
        ksm=_labels(ksm),
        # honorLabels true: the exposition's container (trainer) wins over the target's (gpu-exporter)
        sidecar_gpu=_labels(
            {
                **SIDECAR,
                "gpu": "0",
                "uuid": "GPU-s",
                "hostname": "n1",
                "model": "H100",
                "container": "trainer",
            }
        ),  # fmt: skip
        trainer_gpu=_labels({**TRAINER, "gpu": "0", "uuid": "GPU-t", "hostname": "n2", "model": "H100"}),
    )
    test = tmp_path / "test.yaml"
    test.write_text(text)
    out = subprocess.run(["promtool", "test", "rules", str(test)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS" in out.stdout


# kube-state-metrics unreachable from 1m: Prometheus stale-marks its series at the failed scrape (a plain
# selector loses the limit at once); the in-process poller's GPU keeps reporting.
OUTAGE_TEST = """
rule_files: [{rules}]
evaluation_interval: 1m
tests:
  - interval: 1m
    input_series:
      - series: 'up{{{trainer}}}'
        values: '1x20'
      - series: 'foxhunt_gpu_utilization_percent{{{trainer_gpu}}}'
        values: '50x20'
      - series: 'kube_pod_container_resource_limits{{{ksm},container="trainer",namespace="training",node="n2",pod="sac-1-x7k2p",resource="nvidia_com_gpu",uid="u2",unit="integer"}}'
        values: '1 stale'
    promql_expr_test:
      - expr: foxhunt:gpu_util:ratio
        eval_time: 10m
        exp_samples:
          - labels: 'foxhunt:gpu_util:ratio{{node="n2",gpu="0",uuid="GPU-t",model="H100",namespace="training",pod="sac-1-x7k2p",container="trainer"}}'
            value: 0.5
      - expr: foxhunt:gpu_util:ratio
        eval_time: 16m
        exp_samples:
          - labels: 'foxhunt:gpu_util:ratio{{node="n2",gpu="0",uuid="GPU-t",model="H100"}}'
            value: 0.5
"""


@pytest.mark.servers
def test_the_rules_keep_the_holder_through_a_kube_state_metrics_outage(tmp_path):
    """The limit counts for kube.gpu_limits_lookback_s (15 minutes) after it was last seen, as in the ingest
    (test below): 10 minutes into the outage the trainer still holds its GPU, after 16 no longer."""
    rules = tmp_path / "rules.yaml"
    rules.write_text(render(recording_rules(load_catalog(), NODE_LABELS), SOURCE))
    text = textwrap.dedent(OUTAGE_TEST).format(
        rules=rules,
        trainer=_labels(TRAINER),
        trainer_gpu=_labels({**TRAINER, "gpu": "0", "uuid": "GPU-t", "hostname": "n2", "model": "H100"}),
        ksm=_labels({"job": "kube-state-metrics", "instance": "10.0.0.5:8080"}),
    )
    test = tmp_path / "test.yaml"
    test.write_text(text)
    out = subprocess.run(["promtool", "test", "rules", str(test)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr


@pytest.mark.servers
def test_the_ingest_counts_a_limit_seen_within_the_same_look_back(tmp_path):
    """A real Prometheus holding kube-state-metrics' limits: a container whose limit was last seen 10
    minutes before the hour counts as given GPUs for the hour, one last seen 20 minutes before does not;
    keyed per container (the pod's exporter container has a cpu limit only), a limit of 0 never counts."""
    start = datetime(2026, 11, 20, 12, 0, tzinfo=timezone.utc).timestamp()
    ksm = 'kube_pod_container_resource_limits{{container="{c}",namespace="training",pod="{p}",resource="{r}",unit="{u}"}}'
    series = [  # (labels, value, last seen: minutes before the window)
        (ksm.format(c="trainer", p="recent-0", r="nvidia_com_gpu", u="integer"), 8, 10),
        (ksm.format(c="dcgm-exporter", p="recent-0", r="cpu", u="core"), 1, 10),
        (ksm.format(c="trainer", p="old-1", r="nvidia_com_gpu", u="integer"), 8, 20),
        (ksm.format(c="trainer", p="zero-2", r="nvidia_com_gpu", u="integer"), 0, 10),
    ]
    body = ["# TYPE kube_pod_container_resource_limits gauge"]
    for labels, value, ends in series:  # one sample a minute for half an hour, ending `ends` minutes early
        body += [f"{labels} {value} {int(start - m * 60)}" for m in range(ends + 30, ends - 1, -1)]
    (tmp_path / "om.txt").write_text("\n".join(sorted(body, key=lambda x: (x[0] != "#", x))) + "\n# EOF\n")
    backfill_openmetrics(tmp_path / "om.txt", tmp_path / "tsdb")
    with PrometheusServer(tmp_path / "tsdb", workdir=tmp_path) as server:
        window = Window(start, start + 3600, 60, "gpu_samples test")
        got = gpu_containers(PrometheusClient(server.url), load_catalog(), window)
    assert got == {("training", "recent-0", "trainer")}
