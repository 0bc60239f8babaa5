"""The exported alerting rules: checked in, valid, and firing exactly when they should.

`promtool test rules` loads the recording rules and foxhunt-rules.yaml together and feeds raw exporter
series (dcgm-exporter, kube-state-metrics) through the whole chain. Every exported rule has a case that
fires (not before its `for`) and a clean case that does not. Expected annotations are rendered by the
catalog's own `Rule.render`, so the Python path and the Prometheus templates must agree word for word.
"""

from __future__ import annotations

import subprocess

import pytest
import yaml

from foxhunt_obs.cli import export_rules
from foxhunt_obs.lib.alerts import load_rules
from foxhunt_obs.lib.alerts.prometheus_rules import (
    TemplateConversionError,
    alert_name,
    alerting_rules,
    exported,
    to_prometheus_template,
)
from foxhunt_obs_tests.paths import REPO

ROOT = REPO
CHECKED_IN = ROOT / "deploy" / "prometheus"
ALERTS = CHECKED_IN / "foxhunt-rules.yaml"
RECORDING = CHECKED_IN / "foxhunt-recording-rules.yaml"
RULES = {r.id: r for r in load_rules(overrides="")}  # the catalog as shipped, whatever the env says


@pytest.fixture(autouse=True)
def _shipped_catalog(monkeypatch):
    monkeypatch.delenv("FOXHUNT_ALERT_RULES", raising=False)
    monkeypatch.delenv("FOXHUNT_NODE_LABELS", raising=False)


def test_checked_in_alert_rules_are_what_the_catalog_generates(tmp_path):
    written = {p.name: p for p in export_rules(tmp_path)}
    for name in ("foxhunt-rules.yaml", "foxhunt-rules.prometheusrule.yaml"):
        assert (CHECKED_IN / name).read_text() == written[name].read_text(), (
            f"{name} is stale: run `foxhunt-obs rules export`"
        )
    manifest = yaml.safe_load(written["foxhunt-rules.prometheusrule.yaml"].read_text())
    assert manifest["kind"] == "PrometheusRule"
    assert manifest["spec"] == yaml.safe_load(written["foxhunt-rules.yaml"].read_text())


def test_every_enabled_promql_rule_is_exported_once():
    (group,) = alerting_rules(list(RULES.values()))["groups"]
    names = [r["alert"] for r in group["rules"]]
    assert names == [alert_name(r.id) for r in exported(list(RULES.values()))]
    assert len(set(names)) == len(names)
    for r in group["rules"]:
        rule = RULES[r["labels"]["foxhunt_rule"]]
        assert r["expr"] == rule.expr() and "$" not in r["expr"].replace('"$1"', "")
        assert r["labels"]["severity"] == rule.severity
    assert alert_name("gpu_training_stall") == "gpu_training_stall"  # = the Alertmanager sink's alertname


def test_export_follows_overrides(tmp_path, monkeypatch):
    """`foxhunt-obs rules export` applies the FOXHUNT_ALERT_RULES file, as the alert sensor does."""
    overrides = tmp_path / "o.yaml"
    overrides.write_text(
        "rules:\n  gpu_overheat: {thresholds: {temp_max_celsius: 90.5}, for: 2m, severity: critical}\n"
        "  idle_spend: {enabled: false}\n"
    )
    monkeypatch.setenv("FOXHUNT_ALERT_RULES", str(overrides))
    export_rules(tmp_path / "out")
    exported_file = yaml.safe_load((tmp_path / "out" / "foxhunt-rules.yaml").read_text())
    rules = {r["alert"]: r for r in exported_file["groups"][0]["rules"]}
    assert "idle_spend" not in rules
    hot = rules["gpu_overheat"]
    assert hot["expr"] == "max by (node, gpu, uuid, model) (foxhunt:gpu_temp:celsius) > 90.5"
    assert (hot["for"], hot["labels"]["severity"]) == ("2m", "critical")
    assert "above 90.5 °C" in hot["annotations"]["description"]


def test_templates_convert_to_prometheus():
    stall = RULES["gpu_training_stall"]
    assert to_prometheus_template(stall, "{pod} at {value:.0%}, max {util_max:.0%}") == (
        "{{ $labels.pod }} at {{ $value | humanizePercentage }}, max 0%"
    )
    assert to_prometheus_template(stall, "{value:.0f} {value:.2f} {value} {{x}}") == (
        '{{ $value | printf "%.0f" }} {{ $value | printf "%.2f" }} {{ $value }} {x}'
    )
    with pytest.raises(TemplateConversionError, match="gpu_training_stall"):
        to_prometheus_template(stall, "{value!r}")


@pytest.mark.servers
def test_promtool_checks_the_alert_rules():
    out = subprocess.run(["promtool", "check", "rules", str(ALERTS)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"SUCCESS: {len(exported(list(RULES.values())))} rules found" in out.stdout


# ---- promtool test rules: raw exporter series through recording and alerting rules ----------------


def dcgm(metric: str, gpu: int, node: str, pod: str | None = None, model: str = "A100") -> str:
    """A dcgm-exporter series as scraped with honor_labels off: the GPU's pod arrives as exported_*,
    the plain pod/namespace/container name the exporter pod. An idle GPU has no pod labels."""
    labels = {"gpu": str(gpu), "UUID": f"GPU-{node}-{gpu}", "Hostname": node, "modelName": model}
    labels["instance"] = f"10.0.0.{node[-1]}:9400"
    if pod is not None:
        labels |= {"exported_pod": pod, "exported_namespace": "rl", "exported_container": "main"}
        labels |= {"pod": "dcgm-exporter-x", "namespace": "gpu-operator", "container": "exporter"}
    return metric + "{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}"


def util(gpu: int, node: str, pod: str | None, values: str) -> dict:
    return {"series": dcgm("DCGM_FI_DEV_GPU_UTIL", gpu, node, pod), "values": values}


def gpu_labels(gpu: int, node: str, model: str = "A100") -> dict:
    return {"node": node, "gpu": str(gpu), "uuid": f"GPU-{node}-{gpu}", "model": model}


def fires(rule_id: str, at: str, labels: dict, value: float, **extra) -> dict:
    """An alert_rule_test expecting exactly this alert of the rule at `at`."""
    rule = RULES[rule_id]
    exp = {
        "exp_labels": {"severity": rule.severity, "foxhunt_rule": rule.id, **rule.labels, **labels},
        "exp_annotations": {
            "summary": rule.render(rule.summary, labels, value, **extra),
            "description": rule.render(rule.description, labels, value, **extra),
        },
    }
    return {"eval_time": at, "alertname": alert_name(rule_id), "exp_alerts": [exp]}


def quiet(rule_id: str, at: str) -> dict:
    return {"eval_time": at, "alertname": alert_name(rule_id), "exp_alerts": []}


KSM_RESTARTS = (
    'kube_pod_container_status_restarts_total{namespace="rl",pod="trainer-0",container="main",'
    'job="kube-state-metrics"}'
)

# rule id -> promtool test groups (interval 1m). Each has a firing case (checked just before and after
# its `for`) and clean series that must not fire: the exact alert set is compared at every eval_time.
CASES: dict[str, list[dict]] = {
    "gpu_training_stall": [
        {
            "input_series": [
                util(0, "ip-1", "trainer-0", "0x40"),  # both GPUs idle for 40 minutes: stalled
                util(1, "ip-1", "trainer-0", "0x40"),
                util(2, "ip-1", "trainer-1", "0x20 55x20"),  # idle 20 minutes only, then trains
                util(3, "ip-1", "trainer-2", "0x40"),  # one GPU idle, the other busy: mean > 0
                util(4, "ip-1", "trainer-2", "90x40"),
                util(5, "ip-1", None, "0x40"),  # an idle GPU without a pod is no training stall
            ],
            "alert_rule_test": [
                quiet("gpu_training_stall", "29m"),
                fires("gpu_training_stall", "31m", {"namespace": "rl", "pod": "trainer-0"}, 0.0, gpus=2),
                fires("gpu_training_stall", "40m", {"namespace": "rl", "pod": "trainer-0"}, 0.0, gpus=2),
            ],
        },
    ],
    "gpu_oom_restarts": [
        {
            "input_series": [
                util(0, "ip-1", "trainer-0", "90x30"),  # two GPUs: the value must stay the restart count
                util(1, "ip-1", "trainer-0", "90x30"),
                util(2, "ip-1", "trainer-1", "90x30"),
                # trainer-0 restarts once at 6m; trainer-1 restarted long ago; web-0 holds no GPU
                {"series": KSM_RESTARTS, "values": "0x5 1x25"},
                {"series": KSM_RESTARTS.replace("trainer-0", "trainer-1"), "values": "3x30"},
                {"series": KSM_RESTARTS.replace("trainer-0", "web-0"), "values": "0x5 1x25"},
            ],
            "alert_rule_test": [
                quiet("gpu_oom_restarts", "5m"),
                fires(
                    "gpu_oom_restarts",
                    "7m",
                    {"namespace": "rl", "pod": "trainer-0", "container": "main", "job": "kube-state-metrics"},
                    1.0,
                ),
                quiet("gpu_oom_restarts", "23m"),  # the restart left the 15-minute window
            ],
        },
    ],
    "ecc_errors": [
        {
            "input_series": [
                # GPU 0 exports both counters: 2 single-bit errors at 11m
                {"series": dcgm("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", 0, "ip-1"), "values": "0x10 2x20"},
                {"series": dcgm("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", 0, "ip-1"), "values": "0x30"},
                # GPU 1 exports the double-bit counter only: it must still alert
                {"series": dcgm("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", 1, "ip-1"), "values": "0x10 1x20"},
                # GPU 2: an old, constant count is no new error
                {"series": dcgm("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", 2, "ip-1"), "values": "5x30"},
                {"series": dcgm("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", 2, "ip-1"), "values": "0x30"},
                # GPU 3, a stock counters file: no ECC counters, a row remapped for an uncorrectable error
                {"series": dcgm("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", 3, "ip-1"), "values": "0x10 1x20"},
                {"series": dcgm("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", 3, "ip-1"), "values": "0x30"},
                # GPU 4, stock too: old remaps only
                {"series": dcgm("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", 4, "ip-1"), "values": "2x30"},
            ],
            "alert_rule_test": [
                quiet("ecc_errors", "10m"),
                {
                    **fires("ecc_errors", "12m", gpu_labels(0, "ip-1"), 2.0),
                    "exp_alerts": [
                        fires("ecc_errors", "12m", gpu_labels(0, "ip-1"), 2.0)["exp_alerts"][0],
                        fires("ecc_errors", "12m", gpu_labels(1, "ip-1"), 1.0)["exp_alerts"][0],
                        fires("ecc_errors", "12m", gpu_labels(3, "ip-1"), 1.0)["exp_alerts"][0],
                    ],
                },
                quiet("ecc_errors", "25m"),
            ],
        },
    ],
    "gpu_row_remap_failure": [
        {
            "input_series": [
                {"series": dcgm("DCGM_FI_DEV_ROW_REMAP_FAILURE", 0, "ip-1"), "values": "0x5 1x10"},
                {"series": dcgm("DCGM_FI_DEV_ROW_REMAP_FAILURE", 1, "ip-1"), "values": "0x15"},
            ],
            "alert_rule_test": [
                quiet("gpu_row_remap_failure", "5m"),
                # one evaluation later than the failure: the recording rule's group may run after this one
                fires("gpu_row_remap_failure", "8m", gpu_labels(0, "ip-1"), 1.0),
            ],
        },
    ],
    "xid_errors": [
        {
            "input_series": [
                {"series": dcgm("DCGM_FI_DEV_XID_ERRORS", 0, "ip-1"), "values": "0x5 79x10"},
                {"series": dcgm("DCGM_FI_DEV_XID_ERRORS", 1, "ip-1"), "values": "0x15"},
            ],
            "alert_rule_test": [
                quiet("xid_errors", "4m"),
                fires("xid_errors", "7m", gpu_labels(0, "ip-1"), 79.0),
            ],
        },
    ],
    "gpu_overheat": [
        {
            "input_series": [
                {"series": dcgm("DCGM_FI_DEV_GPU_TEMP", 0, "ip-1"), "values": "70x5 91x15"},
                {"series": dcgm("DCGM_FI_DEV_GPU_TEMP", 1, "ip-1"), "values": "70x5 95x3 70x11"},  # 4 min hot
                {"series": dcgm("DCGM_FI_DEV_GPU_TEMP", 2, "ip-1"), "values": "85x20"},  # at, not above
                # a MIG GPU: each slice repeats the GPU's temperature (one held, one not): ONE alert
                *(
                    {
                        "series": dcgm("DCGM_FI_DEV_GPU_TEMP", 0, "ip-2", pod=pod)[:-1]
                        + f',GPU_I_ID="{gi}",GPU_I_PROFILE="3g.40gb"}}',
                        "values": "70x5 91x15",
                    }
                    for gi, pod in ((1, "trainer-0"), (2, None))
                ),
            ],
            "alert_rule_test": [
                quiet("gpu_overheat", "10m"),
                {
                    **fires("gpu_overheat", "12m", gpu_labels(0, "ip-1"), 91.0),
                    "exp_alerts": [
                        fires("gpu_overheat", "12m", gpu_labels(0, "ip-1"), 91.0)["exp_alerts"][0],
                        fires("gpu_overheat", "12m", gpu_labels(0, "ip-2"), 91.0)["exp_alerts"][0],
                    ],
                },
                {
                    **fires("gpu_overheat", "20m", gpu_labels(0, "ip-1"), 91.0),
                    "exp_alerts": [
                        fires("gpu_overheat", "20m", gpu_labels(0, "ip-1"), 91.0)["exp_alerts"][0],
                        fires("gpu_overheat", "20m", gpu_labels(0, "ip-2"), 91.0)["exp_alerts"][0],
                    ],
                },
            ],
        },
    ],
    "power_over_limit": [
        {
            "input_series": [
                {"series": dcgm("DCGM_FI_DEV_POWER_USAGE", 0, "ip-1"), "values": "300x5 450x15"},
                {"series": dcgm("DCGM_FI_DEV_POWER_USAGE", 1, "ip-1"), "values": "300x5 450x3 300x11"},
                {"series": dcgm("DCGM_FI_DEV_POWER_USAGE", 2, "ip-1"), "values": "400x20"},
            ],
            "alert_rule_test": [
                quiet("power_over_limit", "10m"),
                fires("power_over_limit", "12m", gpu_labels(0, "ip-1"), 450.0),
                fires("power_over_limit", "20m", gpu_labels(0, "ip-1"), 450.0),
            ],
        },
    ],
    "gpu_underutilized": [
        {
            "input_series": [
                util(0, "ip-1", "trainer-0", "40x70"),  # 40 % for 70 minutes
                util(1, "ip-1", "trainer-0", "40x70"),
                util(2, "ip-1", "trainer-1", "95x70"),  # busy
                util(3, "ip-1", "trainer-2", "0x70"),  # stalled: the stall rule's, not this one's
                util(4, "ip-1", "trainer-3", "60x70"),  # 60 % and 100 %: mean 80 %
                util(5, "ip-1", "trainer-3", "100x70"),
                util(
                    6, "ip-1", "trainer-4", "95x30 40x10 95x30"
                ),  # a 10-minute dip: the hour's mean stays > 70 %
            ],
            "alert_rule_test": [
                quiet(
                    "gpu_underutilized", "14m"
                ),  # the hour's mean is low from the start: 15 minutes to fire
                fires("gpu_underutilized", "16m", {"namespace": "rl", "pod": "trainer-0"}, 0.4),
                fires("gpu_underutilized", "61m", {"namespace": "rl", "pod": "trainer-0"}, 0.4),
            ],
        },
    ],
    "gpu_node_missing": [
        {  # ip-2 goes away at 6m
            "input_series": [
                util(0, "ip-1", "trainer-0", "50x30"),
                util(0, "ip-2", "trainer-1", "50x5 stale"),
            ],
            "alert_rule_test": [
                quiet("gpu_node_missing", "5m"),
                quiet("gpu_node_missing", "15m"),
                fires("gpu_node_missing", "17m", {}, 1.0),
            ],
        },
        {  # no GPU metrics at all
            "input_series": [{"series": 'up{job="node-exporter"}', "values": "1x30"}],
            "alert_rule_test": [quiet("gpu_node_missing", "9m"), fires("gpu_node_missing", "11m", {}, 0.0)],
        },
        {  # both nodes report all along: clean
            "input_series": [util(0, "ip-1", "trainer-0", "50x30"), util(0, "ip-2", None, "0x30")],
            "alert_rule_test": [quiet("gpu_node_missing", "12m"), quiet("gpu_node_missing", "30m")],
        },
    ],
    "idle_spend": [
        {
            "input_series": [
                util(0, "ip-3", None, "0x70"),  # ip-3: GPUs up, no pod on any
                util(1, "ip-3", None, "0x70"),
                util(0, "ip-1", "trainer-0", "90x70"),  # ip-1: training
                util(0, "ip-2", None, "0x70"),  # ip-2: one GPU idle, one training: not idle spend
                util(1, "ip-2", "trainer-1", "90x70"),
            ],
            "alert_rule_test": [
                quiet("idle_spend", "59m"),
                fires("idle_spend", "61m", {"node": "ip-3"}, 2.0),
            ],
        },
    ],
}


# ---- Ray: its own series (labels as a Ray 2.6.1 page, fixtures/real/ray/), scraped with the RayCluster as
# ray_io_cluster and the target pod's namespace/pod (the Ray docs' KubeRay monitors) ------------------------


def ray(metric: str, pod: str, cluster: str = "rc", **labels: str) -> str:
    target = {"namespace": "rl", "pod": pod, "ray_io_cluster": cluster, "NodeAddress": f"10.1.0.{len(pod)}"}
    return metric + "{" + ",".join(f'{k}="{v}"' for k, v in {**labels, **target}.items()) + "}"


def gcs_actors(state: str, values: str, cluster: str = "rc", **labels: str) -> dict:
    series = ray(
        "ray_actors", f"{cluster}-head", cluster, Source="gcs", State=state, Name="RolloutWorker", **labels
    )
    return {"series": series, "values": values}


# Ray's guide's head PodMonitor (ray-project/ray doc/source/cluster/kubernetes/k8s-ecosystem/
# prometheus-grafana.md): job <namespace>/<name>, `endpoint` the port's name, three ports scraped
GUIDE_HEAD = {"job": "prometheus-system/ray-head-monitor"}


RAY_CASES: dict[str, list[dict]] = {
    "ray_worker_lost": [
        {  # rc: an actor restarts 6m..11m; rd: a worker's scrape fails 5m..9m; re: all well
            "input_series": [
                gcs_actors("RESTARTING", "0x5 1x5 0x19"),
                gcs_actors("ALIVE", "3x5 2x5 3x19"),
                {"series": ray("up", "rd-worker-1", "rd"), "values": "1x4 0x4 1x21"},
                {"series": ray("up", "rd-head", "rd"), "values": "1x30"},
                gcs_actors("RESTARTING", "0x30", "re"),
                {"series": ray("up", "re-worker-0", "re"), "values": "1x30"},
                # rc's head also scraped by the guide's monitor: its restarting actor still counts once
                gcs_actors("RESTARTING", "0x5 1x5 0x19", **GUIDE_HEAD),
                # rf: no autoscaler, so the guide's as-metrics target is down for good; Ray's own port is up
                {"series": ray("up", "rf-head", "rf", endpoint="metrics", **GUIDE_HEAD), "values": "1x30"},
                {"series": ray("up", "rf-head", "rf", endpoint="as-metrics", **GUIDE_HEAD), "values": "0x30"},
                {
                    "series": ray("up", "rf-head", "rf", endpoint="dash-metrics", **GUIDE_HEAD),
                    "values": "1x30",
                },
                {"series": ray("up", "rf-worker-0", "rf", endpoint="metrics"), "values": "1x30"},
            ],
            "alert_rule_test": [
                quiet("ray_worker_lost", "6m"),  # down for 1 minute only: not yet
                fires("ray_worker_lost", "7m", {"namespace": "rl", "ray_io_cluster": "rd"}, 1.0),
                {
                    "eval_time": "8m",
                    "alertname": "ray_worker_lost",
                    "exp_alerts": [
                        fires("ray_worker_lost", "8m", labels, 1.0)["exp_alerts"][0]
                        for labels in (
                            {"namespace": "rl", "ray_io_cluster": "rc"},
                            {"namespace": "rl", "ray_io_cluster": "rd"},
                        )
                    ],
                },
                quiet("ray_worker_lost", "12m"),  # both back
            ],
        },
    ],
    "ray_scheduling_stall": [
        {  # rc: a task waits 2m..30m with a GPU free on a worker; rd: waits while every GPU is in use
            "input_series": [
                {
                    "series": ray("ray_tasks", "rc-head", State="PENDING_NODE_ASSIGNMENT", Source="owner"),
                    "values": "0x1 1x29",
                },
                {
                    "series": ray("ray_resources", "rc-worker-0", Name="GPU", State="AVAILABLE"),
                    "values": "1x30",
                },
                {"series": ray("ray_resources", "rc-worker-0", Name="GPU", State="USED"), "values": "7x30"},
                {
                    "series": ray(
                        "ray_tasks", "rd-head", "rd", State="PENDING_NODE_ASSIGNMENT", Source="owner"
                    ),
                    "values": "2x30",
                },
                {
                    "series": ray("ray_resources", "rd-worker-0", "rd", Name="GPU", State="AVAILABLE"),
                    "values": "0x30",
                },
                # rg: half a GPU free on a worker scraped by two jobs; counted twice it would reach 1
                {
                    "series": ray(
                        "ray_tasks", "rg-head", "rg", State="PENDING_NODE_ASSIGNMENT", Source="owner"
                    ),
                    "values": "1x30",
                },
                *(
                    {
                        "series": ray(
                            "ray_resources", "rg-worker-0", "rg", Name="GPU", State="AVAILABLE", job=job
                        ),
                        "values": "0.5x30",
                    }
                    for job in ("worker", "prometheus-system/ray-workers-monitor")
                ),
            ],
            "alert_rule_test": [
                quiet("ray_scheduling_stall", "11m"),
                fires("ray_scheduling_stall", "13m", {"namespace": "rl", "ray_io_cluster": "rc"}, 1.0),
            ],
        },
    ],
    "ray_object_store_full": [
        {  # w0 95 % full from 2m (current names); w1 the older spelling, 92 %; w2 half full
            "input_series": [
                {
                    "series": ray("ray_object_store_memory", "w0", Location="MMAP_SHM", ObjectState="SEALED"),
                    "values": "10x1 95x29",
                },
                {
                    "series": ray("ray_object_store_memory", "w0", Location="SPILLED", ObjectState=""),
                    "values": "500x30",
                },  # spilled bytes are not in the store
                {
                    "series": ray("ray_resources", "w0", Name="object_store_memory", State="AVAILABLE"),
                    "values": "90x1 5x29",
                },
                {
                    "series": ray("ray_resources", "w0", Name="object_store_memory", State="USED"),
                    "values": "10x1 95x29",
                },
                {"series": ray("ray_object_store_used_memory", "w1"), "values": "92x30"},
                {"series": ray("ray_object_store_available_memory", "w1"), "values": "8x30"},
                {
                    "series": ray("ray_object_store_memory", "w2", Location="MMAP_SHM", ObjectState="SEALED"),
                    "values": "50x30",
                },
                {
                    "series": ray("ray_resources", "w2", Name="object_store_memory", State="AVAILABLE"),
                    "values": "50x30",
                },
                {
                    "series": ray("ray_resources", "w2", Name="object_store_memory", State="USED"),
                    "values": "50x30",
                },
            ],
            "alert_rule_test": [
                quiet("ray_object_store_full", "9m"),
                {
                    "eval_time": "13m",
                    "alertname": "ray_object_store_full",
                    "exp_alerts": [
                        fires("ray_object_store_full", "13m", labels, value)["exp_alerts"][0]
                        for labels, value in (
                            ({"namespace": "rl", "ray_io_cluster": "rc", "pod": "w0"}, 0.95),
                            ({"namespace": "rl", "ray_io_cluster": "rc", "pod": "w1"}, 0.92),
                        )
                    ],
                },
            ],
        },
    ],
}
CASES |= RAY_CASES


def test_every_exported_rule_has_a_firing_and_a_clean_case():
    exported_ids = {r.id for r in exported(list(RULES.values()))}
    assert set(CASES) == exported_ids, "add promtool cases for new rules"
    for rule_id, groups in CASES.items():
        tests = [t for g in groups for t in g["alert_rule_test"]]
        assert all(t["alertname"] == alert_name(rule_id) for t in tests)
        assert any(t["exp_alerts"] for t in tests), f"{rule_id}: no firing case"
        assert any(not t["exp_alerts"] for t in tests), f"{rule_id}: no clean case"
        if RULES[rule_id].for_seconds:  # quiet while the condition holds for less than `for`
            first = min(_s(t["eval_time"]) for t in tests if t["exp_alerts"])
            assert any(not t["exp_alerts"] and _s(t["eval_time"]) < first for t in tests), rule_id


def _s(duration: str) -> float:
    from foxhunt_obs.lib.alerts import parse_duration

    return parse_duration(duration)


@pytest.mark.servers
def test_promtool_unit_tests_every_alert_through_the_recording_rules(tmp_path):
    """One promtool process per rule, run side by side (each evaluates all rules at every step)."""
    runs = {}
    for rule_id, groups in CASES.items():
        suite = {
            "rule_files": [str(RECORDING), str(ALERTS)],
            "evaluation_interval": "1m",  # every input sample is 1m apart; 15s would only cost time
            "tests": [{"name": rule_id, "interval": "1m", **group} for group in groups],
        }
        path = tmp_path / f"{rule_id}_test.yaml"
        path.write_text(yaml.safe_dump(suite, sort_keys=False, allow_unicode=True, width=100_000))
        runs[rule_id] = subprocess.Popen(
            ["promtool", "test", "rules", str(path)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
    failed = {}
    for rule_id, proc in runs.items():
        out, _ = proc.communicate(timeout=120)
        if proc.returncode != 0 or "SUCCESS" not in out:
            failed[rule_id] = out
    assert not failed, "\n\n".join(f"== {rule_id}\n{out}" for rule_id, out in failed.items())
