"""Recording rules from the catalog: checked in, valid, and doing what they say (promtool test rules)."""

import subprocess
import textwrap

import pytest
import yaml

from foxhunt_obs.cli import export_rules
from foxhunt_obs.lib.ingest.metric_catalog import load_catalog
from foxhunt_obs_tests.paths import REPO

ROOT = REPO
CHECKED_IN = ROOT / "deploy" / "prometheus"


def test_checked_in_rules_are_what_the_catalog_generates(tmp_path, monkeypatch):
    monkeypatch.delenv("FOXHUNT_NODE_LABELS", raising=False)
    for path in export_rules(tmp_path):
        assert (CHECKED_IN / path.name).read_text() == path.read_text(), (
            f"{path.name} is stale: run `foxhunt-obs rules export`"
        )


@pytest.mark.servers
def test_promtool_checks_the_rules():
    out = subprocess.run(
        ["promtool", "check", "rules", str(CHECKED_IN / "foxhunt-recording-rules.yaml")],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    # one record per catalog GPU metric, plus the shared helpers: promtool read every one of them
    doc = yaml.safe_load((CHECKED_IN / "foxhunt-recording-rules.yaml").read_text())
    rules = [r for g in doc["groups"] for r in g["rules"]]
    assert len(rules) >= len(load_catalog().gpu_metrics)
    assert f"SUCCESS: {len(rules)} rules found" in out.stdout


# Series as each deployment's scrape leaves them: the target's job/instance (and, under Kubernetes
# service discovery, its namespace/pod/container) on every series and on `up`.
OPERATOR = 'job="gpu-operator/nvidia-dcgm-exporter",instance="10.0.0.1:9400",namespace="gpu-operator",pod="nvidia-dcgm-exporter-x",container="nvidia-dcgm-exporter"'
CHART = 'job="dcgm-exporter",instance="10.0.0.3:9400",namespace="gpu-monitoring",pod="dcgm-exporter-7k2lq",container="exporter"'

UNIT_TEST = """
rule_files: [{rules}]
evaluation_interval: 15s
tests:
  - interval: 15s
    input_series:
      - series: 'up{{@OPERATOR@}}'
        values: '1 1'
      - series: 'up{{@CHART@}}'
        values: '1 1'
      # the GPU Operator's dcgm-exporter behind honor_labels: false: the GPU's pod arrives as exported_pod
      - series: 'DCGM_FI_DEV_GPU_UTIL{{gpu="0",UUID="GPU-a",Hostname="ip-1",modelName="A100",exported_pod="trainer-0",exported_namespace="rl",exported_container="learner",@OPERATOR@}}'
        values: '50 60'
      # ... and a GPU no pod holds: no exported_*, the plain labels are the target's
      - series: 'DCGM_FI_DEV_GPU_UTIL{{gpu="1",UUID="GPU-c",Hostname="ip-1",modelName="A100",@OPERATOR@}}'
        values: '0 0'
      # NVIDIA's Helm chart (container "exporter"), honor_labels: false, an unheld GPU
      - series: 'DCGM_FI_DEV_GPU_UTIL{{gpu="0",UUID="GPU-d",Hostname="ip-3",modelName="H100",@CHART@}}'
        values: '0 0'
      # the same GPU from our exporter too (a migration): dcgm-exporter, listed first, wins
      - series: 'foxhunt_gpu_utilization_percent{{gpu="0",uuid="GPU-a",hostname="ip-1",model="A100"}}'
        values: '10 10'
      # another GPU from our exporter only (honor_labels: true, target labels dropped), node from the scrape config
      - series: 'foxhunt_gpu_utilization_percent{{gpu="1",uuid="GPU-b",hostname="exporter-pod",node="ip-2",model="H100",pod="trainer-1",namespace="rl",container="main"}}'
        values: '80 90'
      # MIG on the chart's node: two slices of GPU-m, no GPU_UTIL: GR_ENGINE_ACTIVE is their activity
      - series: 'DCGM_FI_PROF_GR_ENGINE_ACTIVE{{gpu="1",UUID="GPU-m",Hostname="ip-3",modelName="H100",GPU_I_ID="1",GPU_I_PROFILE="3g.40gb",exported_pod="sweep-0",exported_namespace="rl",exported_container="worker",@CHART@}}'
        values: '0.4 0.5'
      - series: 'DCGM_FI_PROF_GR_ENGINE_ACTIVE{{gpu="1",UUID="GPU-m",Hostname="ip-3",modelName="H100",GPU_I_ID="2",GPU_I_PROFILE="3g.40gb",@CHART@}}'
        values: '0 0'
      - series: 'DCGM_FI_DEV_FB_USED{{gpu="0",UUID="GPU-a",Hostname="ip-1",modelName="A100"}}'
        values: '1000 1000'
      - series: 'DCGM_FI_DEV_FB_FREE{{gpu="0",UUID="GPU-a",Hostname="ip-1",modelName="A100"}}'
        values: '3000 3000'
      - series: 'DCGM_FI_DEV_FB_USED{{gpu="0",UUID="GPU-d",Hostname="ip-3",modelName="H100"}}'
        values: '0 0'
      - series: 'DCGM_FI_DEV_FB_FREE{{gpu="0",UUID="GPU-d",Hostname="ip-3",modelName="H100"}}'
        values: '81000 81000'
      - series: 'DCGM_FI_DEV_FB_RESERVED{{gpu="0",UUID="GPU-d",Hostname="ip-3",modelName="H100"}}'
        values: '559 559'
      - series: 'foxhunt_gpu_memory_total_bytes{{gpu="1",uuid="GPU-b",hostname="x",node="ip-2",model="H100"}}'
        values: '85899345920 85899345920'
      - series: 'foxhunt_gpu_ecc_errors_total{{error="corrected",scope="volatile",gpu="1",uuid="GPU-b",node="ip-2",model="H100"}}'
        values: '0 3'
      - series: 'foxhunt_gpu_ecc_errors_total{{error="corrected",scope="aggregate",gpu="1",uuid="GPU-b",node="ip-2",model="H100"}}'
        values: '100 103'
    promql_expr_test:
      - expr: foxhunt:gpu_util:ratio
        eval_time: 15s
        exp_samples:
          - labels: 'foxhunt:gpu_util:ratio{{node="ip-1",gpu="0",uuid="GPU-a",model="A100",namespace="rl",pod="trainer-0",container="learner"}}'
            value: 0.6
          - labels: 'foxhunt:gpu_util:ratio{{node="ip-1",gpu="1",uuid="GPU-c",model="A100"}}'
            value: 0
          - labels: 'foxhunt:gpu_util:ratio{{node="ip-3",gpu="0",uuid="GPU-d",model="H100"}}'
            value: 0
          - labels: 'foxhunt:gpu_util:ratio{{node="ip-2",gpu="1",uuid="GPU-b",model="H100",namespace="rl",pod="trainer-1",container="main"}}'
            value: 0.9
          - labels: 'foxhunt:gpu_util:ratio{{node="ip-3",gpu="1",uuid="GPU-m",gpu_instance="1",gpu_profile="3g.40gb",model="H100",namespace="rl",pod="sweep-0",container="worker"}}'
            value: 0.5
          - labels: 'foxhunt:gpu_util:ratio{{node="ip-3",gpu="1",uuid="GPU-m",gpu_instance="2",gpu_profile="3g.40gb",model="H100"}}'
            value: 0
      - expr: foxhunt:gpu_mem_total:bytes
        eval_time: 15s
        exp_samples:
          - labels: 'foxhunt:gpu_mem_total:bytes{{node="ip-1",gpu="0",uuid="GPU-a",model="A100"}}'
            value: 4194304000
          - labels: 'foxhunt:gpu_mem_total:bytes{{node="ip-3",gpu="0",uuid="GPU-d",model="H100"}}'
            value: 85520809984
          - labels: 'foxhunt:gpu_mem_total:bytes{{node="ip-2",gpu="1",uuid="GPU-b",model="H100"}}'
            value: 85899345920
      - expr: foxhunt:gpu_ecc_sbe:total
        eval_time: 15s
        exp_samples:
          - labels: 'foxhunt:gpu_ecc_sbe:total{{node="ip-2",gpu="1",uuid="GPU-b",model="H100"}}'
            value: 3
"""


@pytest.mark.servers
def test_rules_normalise_labels_units_and_dedupe(tmp_path):
    test = tmp_path / "test.yaml"
    text = textwrap.dedent(UNIT_TEST).format(rules=CHECKED_IN / "foxhunt-recording-rules.yaml")
    test.write_text(text.replace("@OPERATOR@", OPERATOR).replace("@CHART@", CHART))
    out = subprocess.run(["promtool", "test", "rules", str(test)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS" in out.stdout
