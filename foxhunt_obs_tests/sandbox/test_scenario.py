"""Scenario loading and validation, ground-truth invariants, and the OpenMetrics text (no servers)."""

from __future__ import annotations

import copy
import re
from collections import defaultdict
from datetime import datetime, timedelta, timezone

import numpy as np
import pandas as pd
import pytest
import yaml

from foxhunt_obs.sandbox import bills, openmetrics, truth
from foxhunt_obs.sandbox.scenario import (
    INCIDENT_KINDS,
    SCENARIO_DIR,
    ScenarioError,
    load_scenario,
    parse_scenario,
)

UTC = timezone.utc


@pytest.fixture(scope="module")
def small():
    return load_scenario("small")


@pytest.fixture(scope="module")
def gpus(small):
    return truth.gpu_samples(small)


# ---- loading and validation ----


def test_small_loads(small):
    assert small.start == datetime(2026, 11, 16, tzinfo=UTC)
    assert small.end == datetime(2026, 11, 16, 6, tzinfo=UTC)
    assert small.step_s == 15 and small.steps == 6 * 240
    assert [n.name for n in small.nodes] == ["ip-10-0-1-11", "ip-10-0-1-12", "ip-10-0-1-13"]
    assert all(n.gpus == 2 and n.mem_mib == 81920 for n in small.nodes)
    assert [n.exporter for n in small.nodes] == ["gpu-operator", "gpu-operator", "helm-chart"]
    assert {i.kind for i in small.incidents} == set(INCIDENT_KINDS)  # every kind once
    # the third node: GPU 0 sliced into two 3g.40gb GPU instances, ids 1 and 2, held by two pods
    mig = small.nodes[2].mig
    assert [(m.gpu, m.instance, m.profile, m.mem_mib) for m in mig] == [
        (0, 1, "3g.40gb", 40960),
        (0, 2, "3g.40gb", 40960),
    ]
    assert all(m.share == 3 / 7 for m in mig)  # 3 of an A100's 7 compute slices
    holders = {p.name: (p.gpus, p.slices) for p in small.pods if p.node == "ip-10-0-1-13"}
    assert holders == {
        "ppo-humanoid-mig-0": ((), ((0, 1),)),
        "dqn-atari-mig-0": ((), ((0, 2),)),
        "dqn-atari-learner-2": ((1,), ()),
    }
    assert not [i for i in small.incidents if i.node == "ip-10-0-1-13"]
    assert len(small.fingerprint()) == 64


def test_load_by_path_and_fingerprint(tmp_path):
    text = (SCENARIO_DIR / "small.yaml").read_text()
    same = tmp_path / "copy.yaml"
    same.write_text(text)
    changed = tmp_path / "changed.yaml"
    changed.write_text(text.replace("seed: 20261116", "seed: 1"))
    assert load_scenario(str(same)).fingerprint() == load_scenario("small").fingerprint()
    assert load_scenario(changed).fingerprint() != load_scenario("small").fingerprint()


def test_default_keeps_incidents_in_last_day():
    sc = load_scenario("default")
    assert sc.start.weekday() == 0 and sc.hours == 168 and len(sc.nodes) == 3
    assert sum(n.gpus for n in sc.nodes) == 24 and len(sc.experiments) == 3 and 10 <= len(sc.pods) <= 15
    (mig,) = [n for n in sc.nodes if n.mig]
    assert mig.exporter == "helm-chart" and [m.profile for m in mig.mig] == ["3g.40gb", "3g.40gb"]
    assert {p.slices for p in sc.pods if p.slices} == {((0, 1),), ((0, 2),)}
    assert not [i for i in sc.incidents if i.node == mig.name]
    last_day = sc.end - timedelta(hours=24)
    assert {i.kind for i in sc.incidents} >= {"stall", "ecc_sbe", "node_lost"}
    assert all(i.start >= last_day for i in sc.incidents)


def test_unknown_scenario_names_the_bundled_ones():
    with pytest.raises(ScenarioError, match="bundled scenarios: default, small"):
        load_scenario("nope")


def _raw():
    return yaml.safe_load((SCENARIO_DIR / "small.yaml").read_text())


def _pod(raw, name):
    return next(p for p in raw["pods"] if p["name"] == name)


def _incident(raw, kind):
    return next(i for i in raw["incidents"] if i["kind"] == kind)


BAD = {
    "unknown node": (
        lambda r: _pod(r, "dqn-atari-learner-0").update(node="ip-10-0-9-99"),
        "unknown node 'ip-10-0-9-99'",
    ),
    "unknown experiment": (
        lambda r: _pod(r, "dqn-atari-learner-0").update(experiment="sac"),
        "unknown experiment 'sac'",
    ),
    "unknown pod": (lambda r: _incident(r, "stall").update(pod="ghost"), "unknown pod 'ghost'"),
    "pod gpu out of range": (
        lambda r: _pod(r, "dqn-atari-learner-0").update(gpus=[2]),
        "GPU index 2 out of range",
    ),
    "ecc gpu out of range": (lambda r: _incident(r, "ecc_sbe").update(gpu=5), "GPU index 5 out of range"),
    "overlap": (
        lambda r: _pod(r, "ppo-humanoid-trainer-1").update(start_h=4),
        "overlaps pod 'ppo-humanoid-trainer-0'",
    ),
    "off grid": (
        lambda r: _pod(r, "dqn-atari-learner-0").update(start_h=0.001),
        "not on the 15 s scrape grid",
    ),
    "off grid minutes": (
        lambda r: _incident(r, "stall").update(minutes=40.1),
        "minutes=40.1 is not on the 15 s",
    ),
    "outside": (lambda r: _pod(r, "dqn-atari-learner-1").update(end_h=7), "outside 0..6h"),
    "pod on lost node": (
        lambda r: _pod(r, "dqn-atari-learner-1").update(start_h=4.5),
        "while that node is lost",
    ),
    "stall outside pod": (lambda r: _incident(r, "stall").update(start_h=4.25), "within pod"),
    "unknown field": (lambda r: _pod(r, "dqn-atari-learner-0").update(gpu=[0]), "unknown field"),
    "unknown kind": (lambda r: r["incidents"].append({"kind": "meteor"}), "kind must be one of"),
    "duplicate pod": (lambda r: r["pods"].append(copy.deepcopy(r["pods"][0])), "defined twice"),
    # exporters and MIG
    "unknown exporter": (
        lambda r: _node(r, "ip-10-0-1-13").update(exporter="dcgm"),
        "nodes[2] ('ip-10-0-1-13'): exporter must be one of gpu-operator, helm-chart, got 'dcgm'",
    ),
    "mig profile": (
        lambda r: _node(r, "ip-10-0-1-13").update(mig={0: ["3g"]}),
        "mig: GPU 0: '3g' is not a MIG profile like 3g.40gb",
    ),
    "mig too many compute slices": (
        lambda r: _node(r, "ip-10-0-1-13").update(mig={0: ["4g.40gb", "4g.40gb"]}),
        "mig: GPU 0: the slices 4g.40gb, 4g.40gb take 8 compute slices, the GPU (NVIDIA A100-SXM4-80GB) has 7",
    ),
    "mig memory": (
        lambda r: _node(r, "ip-10-0-1-13").update(mig={0: ["3g.40gb", "3g.40gb", "1g.10gb"]}),
        "mig: GPU 0: the slices need 92160 MiB of memory, the GPU has 81920 MiB",
    ),
    "mig gpu out of range": (
        lambda r: _node(r, "ip-10-0-1-13").update(mig={2: ["3g.40gb"]}),
        "mig: GPU index 2 out of range (node ip-10-0-1-13 has 2 GPUs)",
    ),
    "mig unknown model": (
        lambda r: _node(r, "ip-10-0-1-13").update(model="Tesla V100-SXM2-32GB", mem_mib=32768),
        "the model's compute slices are unknown",
    ),
    "mig gpu held whole": (
        lambda r: _pod(r, "ppo-humanoid-mig-0").update(gpus=[0]),
        'GPU 0 of ip-10-0-1-13 is in MIG mode: a pod holds one of its slices ("0/1", "0/2")',
    ),
    "slice of a whole gpu": (
        lambda r: _pod(r, "dqn-atari-learner-2").update(gpus=["1/1"]),
        "GPU 1 of ip-10-0-1-13 is not in MIG mode: hold it whole (1)",
    ),
    "unknown gpu instance": (
        lambda r: _pod(r, "ppo-humanoid-mig-0").update(gpus=["0/3"]),
        "GPU 0 of ip-10-0-1-13 has no MIG GPU instance 3 (instances: 1, 2)",
    ),
    "bad gpus item": (
        lambda r: _pod(r, "ppo-humanoid-mig-0").update(gpus=["0-1"]),
        "'0-1' is neither a GPU index nor a MIG slice",
    ),
    "slice twice": (
        lambda r: _pod(r, "ppo-humanoid-mig-0").update(gpus=["0/1", "0 / 1"]),
        "gpus must not name a GPU or slice twice",
    ),
    "slice overlap": (
        lambda r: _pod(r, "dqn-atari-mig-0").update(gpus=["0/1"]),
        "overlaps pod 'ppo-humanoid-mig-0' on ip-10-0-1-13 GPU 0 MIG instance 1",
    ),
    "stall on a slice": (
        lambda r: _incident(r, "stall").update(pod="ppo-humanoid-mig-0", start_h=1),
        "pod 'ppo-humanoid-mig-0' holds MIG slices (0/1): a stall needs a pod holding whole GPUs",
    ),
    "ecc on a mig gpu": (
        lambda r: _incident(r, "ecc_sbe").update(node="ip-10-0-1-13", gpu=0),
        "GPU 0 of ip-10-0-1-13 is in MIG mode: ECC incidents need a whole GPU",
    ),
    "ecc on the helm chart": (
        lambda r: _incident(r, "ecc_sbe").update(node="ip-10-0-1-13", gpu=1),
        "ip-10-0-1-13's exporter (helm-chart) exports no ECC counters",
    ),
}


def _node(raw, name):
    return next(n for n in raw["nodes"] if isinstance(n, dict) and n["name"] == name)


@pytest.mark.parametrize("case", list(BAD))
def test_validation_errors(case):
    mutate, message = BAD[case]
    raw = _raw()
    mutate(raw)
    with pytest.raises(ScenarioError, match=re.escape(message)):
        parse_scenario(yaml.safe_dump(raw), origin="test.yaml")


# ---- ground truth ----


def test_gpu_rows_cover_the_grid_minus_lost_scrapes(small, gpus):
    lost = truth.lost_windows(small)
    assert [(w.node, w.start.hour, w.end.hour, w.count) for w in lost] == [("ip-10-0-1-12", 3, 5, 480)]
    # 7 units per scrape: 2 + 2 whole GPUs, then ip-10-0-1-13's two MIG slices of GPU 0 and whole GPU 1
    assert len(gpus) == 7 * small.steps - 2 * 480
    assert gpus["ts"].dtype == "datetime64[ns, UTC]"
    assert gpus["ts"].min() == pd.Timestamp(small.start) and gpus["ts"].max() == pd.Timestamp(
        small.end
    ) - pd.Timedelta(15, "s")
    assert (gpus["ts"].astype("int64") // 10**9 % 15 == 0).all()
    assert not gpus.duplicated(["ts", "node", "gpu", "gpu_instance"]).any()
    in_outage = (gpus["node"] == "ip-10-0-1-12") & gpus["ts"].between(
        lost[0].start, lost[0].end, inclusive="left"
    )
    assert not in_outage.any()
    nodes = truth.node_samples(small)
    assert len(nodes) == 3 * small.steps - 480 and nodes["cpu_busy"].between(0, 1).all()


def test_gpu_values_are_consistent(small, gpus):
    whole = gpus["gpu_instance"].isna()
    w, sl = gpus[whole], gpus[~whole]
    assert w["util_pct"].between(0, 100).all() and (w["util"] == w["util_pct"] / 100).all()
    assert (w["util_basis"] == "DCGM_FI_DEV_GPU_UTIL").all() and (w["gpu_share"] == 1).all()
    assert (w["gr_active"] == (w["util_pct"] * 0.95 / 100).round(4)).all()
    # a slice reports no GPU_UTIL: its util is GR_ENGINE_ACTIVE
    assert sl["util_pct"].isna().all() and (sl["util"] == sl["gr_active"]).all()
    assert sl["util"].between(0, 1).all() and (sl["util_basis"] == "DCGM_FI_PROF_GR_ENGINE_ACTIVE").all()
    assert (gpus["fb_free_mib"] + gpus["fb_used_mib"] == gpus["mem_total_bytes"] / 2**20).all()
    assert set(w["mem_total_bytes"]) == {81920 * 2**20} and set(sl["mem_total_bytes"]) == {40960 * 2**20}
    assert (gpus["power_w"] < 400).all() and (gpus["power_w"] == gpus["power_w"].round(3)).all()
    idle = gpus["pod"] == ""
    assert (gpus.loc[idle, "experiment"] == "unattributed").all() and (
        gpus.loc[idle, "container"] == ""
    ).all()
    assert gpus.loc[idle, "util_pct"].max() <= 2 and gpus.loc[idle, "fb_used_mib"].max() <= 500
    assert (sl.loc[idle, "gr_active"] == 0).all()
    assert (
        w.loc[~idle, "fb_used_mib"].min() > 55_000 and sl.loc[~idle, "fb_used_mib"].min() > 0.7 * 40960 - 129
    )
    assert set(gpus["uuid"]) == {truth.gpu_uuid(small, n.name, g) for n in small.nodes for g in range(2)}
    for _, g in gpus.groupby(["uuid", gpus["gpu_instance"].fillna(-1)]):  # energy: every scrape's power
        steps = g["ts"].diff().dt.total_seconds().iloc[1:].to_numpy() // 15
        dense = steps == 1
        np.testing.assert_array_equal(
            np.diff(g["energy_mj"].to_numpy())[dense], (g["power_w"].to_numpy()[1:] * 15000).round()[dense]
        )
    assert (gpus["xid"] == 0).all()
    # the device values of a MIG GPU repeat on each of its slices; memory and holder are each slice's
    a, b = (sl[sl["gpu_instance"] == k].reset_index(drop=True) for k in (1, 2))
    for col in truth.DEVICE_COLUMNS:
        assert (a[col] == b[col]).all(), col
    assert (a["pod"] != b["pod"]).any() and (a["fb_used_mib"] != b["fb_used_mib"]).any()
    # the Helm chart's counters have no ECC fields, a slice no ECC and no NVLink
    chart = gpus["node"] == "ip-10-0-1-13"
    assert gpus.loc[chart, ["ecc_sbe", "ecc_dbe"]].isna().all().all()
    assert gpus.loc[~chart, ["ecc_sbe", "ecc_dbe"]].notna().all().all()
    assert sl["nvlink_total"].isna().all() and w["nvlink_total"].notna().all()


def test_slice_allocations_are_their_share_of_the_gpu(small):
    """truth.gpu_allocations by hand: a p4de hour ($27.44705) over the node's 2 GPUs, × 3/7 per 3g.40gb
    slice for the share of the hour a pod held it; 1/7 of the MIG GPU is no slice's (mig_unsliced)."""
    alloc = truth.gpu_allocations(small)
    gpu_hour = 27.44705 / 2
    mig = alloc[(alloc["node"] == "ip-10-0-1-13") & (alloc["gpu"] == 0)]
    by_pod = mig[mig["kind"] == "gpu"].groupby("pod")["allocated_usd"].sum()
    # ppo-humanoid-mig-0 holds slice 1 00:30-05:30 (4 hours and 2 halves), dqn-atari-mig-0 slice 2 01:00-04:00
    assert by_pod["ppo-humanoid-mig-0"] == pytest.approx(5 * gpu_hour * 3 / 7, rel=1e-12)
    assert by_pod["dqn-atari-mig-0"] == pytest.approx(3 * gpu_hour * 3 / 7, rel=1e-12)
    unsliced = mig[mig["kind"] == "mig_unsliced"]
    assert len(unsliced) == 6 and (unsliced["allocated_usd"] == 0).all()
    assert unsliced["unallocated_usd"].to_numpy() == pytest.approx([gpu_hour / 7] * 6, rel=1e-12)
    # every unit-hour's cost adds up to the EC2 bill of the node-hours that reported
    ec2 = sum(float(i.cost) for i in bills.line_items(small) if i.service == bills.EC2)
    assert (alloc["allocated_usd"] + alloc["unallocated_usd"]).sum() == pytest.approx(ec2, rel=1e-12)


def test_stall_rows(small, gpus):
    (stall,) = truth.stalls(small)
    assert (stall.pod, stall.start.hour, stall.end.minute, stall.gpus) == (
        "ppo-humanoid-trainer-0",
        2,
        40,
        (0, 1),
    )
    rows = gpus[gpus["uuid"].isin(stall.uuids) & gpus["ts"].between(stall.start, stall.end, inclusive="left")]
    assert len(rows) == 2 * stall.count == 2 * 160
    assert (rows["util_pct"] == 0).all() and (rows["pod"] == stall.pod).all()
    assert (rows["experiment"] == "ppo-humanoid").all() and (rows["fb_used_mib"] > 55_000).all()


def test_ecc_counters_rise_by_the_burst_counts(small, gpus):
    bursts = truth.ecc_bursts(small)
    assert [(b.kind, b.node, b.gpus, b.count) for b in bursts] == [
        ("ecc_sbe", "ip-10-0-1-11", (0,), 5),
        ("ecc_dbe", "ip-10-0-1-12", (0,), 1),
    ]
    for b in bursts:
        col = b.kind
        for (uuid, node), g in gpus.groupby(["uuid", "node"]):
            v = g[col].to_numpy()
            if node == "ip-10-0-1-13":  # the Helm chart's counters list has no ECC fields
                assert np.isnan(v).all()
                continue
            rise = np.diff(v, prepend=0)
            inside = g["ts"].between(b.start, b.end, inclusive="left").to_numpy()
            if uuid == b.uuids[0]:
                assert v[-1] == b.count and rise[inside].sum() == b.count and rise[~inside].sum() == 0
            elif not any(o.kind == col and uuid in o.uuids for o in bursts):
                assert v.max() == 0


def test_truth_is_deterministic(small, gpus):
    pd.testing.assert_frame_equal(truth.gpu_samples(small), gpus)
    assert truth.pod_labels(small)[0] == ("rl-train", "ppo-humanoid-trainer-0", "ppo-humanoid")


def test_default_scenario_sizes():
    sc = load_scenario("default")
    assert sc.steps == 168 * 240
    lost = truth.lost_windows(sc)
    (stall,) = truth.stalls(sc)
    assert stall.count == 160 and len(stall.gpus) == 4
    node = next(n for n in sc.nodes if n.name == lost[0].node)
    idx = truth.observed(sc, node.name)
    assert (~idx).sum() == lost[0].count == 480


# ---- OpenMetrics text ----

SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)\{(.*)\} (\S+) (\d+)$")


def test_openmetrics_files(small, gpus, tmp_path):
    files = openmetrics.write_blocks(small, tmp_path)
    assert [f.name for f in files] == [f"small-20261116T{h:02d}00.om" for h in (0, 2, 4)]
    per_family = defaultdict(int)
    for f in files:
        lines = f.read_text().splitlines()
        assert lines[0] == "# TYPE DCGM_FI_DEV_GPU_UTIL gauge" and lines[-1] == "# EOF"
        assert f.read_bytes().endswith(b"# EOF\n")
        declared, last_ts, family = [], {}, None
        for line in lines[:-1]:
            if line.startswith("# TYPE "):
                family = line.split()[2]
                assert family not in declared  # families are contiguous
                declared.append(family)
                continue
            name, labels, value, ts = SAMPLE.match(line).groups()
            assert name == family
            float(value)
            assert int(ts) > last_ts.get((name, labels), 0)  # each series' timestamps increase
            last_ts[(name, labels)] = int(ts)
            per_family[name] += 1
        assert set(declared) <= set(openmetrics.ALL_METRICS)
    whole = gpus["gpu_instance"].isna()
    assert per_family["DCGM_FI_DEV_GPU_UTIL"] == whole.sum()  # no GPU_UTIL on MIG slices
    assert per_family["DCGM_FI_PROF_GR_ENGINE_ACTIVE"] == len(gpus) == per_family["DCGM_FI_DEV_FB_USED"]
    assert per_family["DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL"] == whole.sum()
    # no ECC counters in the Helm chart's list (ip-10-0-1-13)
    assert per_family["DCGM_FI_DEV_ECC_SBE_VOL_TOTAL"] == (gpus["node"] != "ip-10-0-1-13").sum()
    assert per_family["node_cpu_seconds_total"] == 3 * 4 * 3 * small.steps - 4 * 3 * 480
    assert per_family["up"] == 6 * small.steps
    assert per_family["kube_node_labels"] == 3 * small.steps
    assert per_family["kube_node_info"] == 3 * small.steps - 480  # none while ip-10-0-1-12 is lost
    assert per_family["kube_pod_labels"] == sum((p.end_s - p.start_s) // 15 for p in small.pods)


def test_openmetrics_labels_follow_the_pod(small, tmp_path):
    (f, *_) = openmetrics.write_blocks(small, tmp_path, metrics={"DCGM_FI_DEV_GPU_UTIL"})
    text = f.read_text()
    assert set(re.findall(r"^# TYPE (\S+)", text, re.M)) == {"DCGM_FI_DEV_GPU_UTIL"}
    series = set(re.findall(r"^DCGM_FI_DEV_GPU_UTIL\{(.*)\} ", text, re.M))
    gpu0 = [s for s in series if 'Hostname="ip-10-0-1-11"' in s and 'gpu="0"' in s]
    assert len(gpu0) == 2  # idle 00:00-00:30 without exported_* labels, then held by ppo-humanoid-trainer-0
    held = next(s for s in gpu0 if "exported_pod=" in s)
    assert 'exported_pod="ppo-humanoid-trainer-0"' in held
    assert 'exported_namespace="rl-train"' in held and 'exported_container="trainer"' in held
    # scraped with honor_labels off: every series carries the dcgm-exporter pod's own labels
    exporter = f'pod="{openmetrics.dcgm_exporter_pod("ip-10-0-1-11")}"'
    assert all(exporter in s and 'container="nvidia-dcgm-exporter"' in s for s in gpu0)
    assert 'UUID="GPU-' in held and 'device="nvidia0"' in held and 'modelName="NVIDIA A100-SXM4-80GB"' in held
    assert 'job="dcgm-exporter"' in held and 'instance="ip-10-0-1-11:9400"' in held
    with pytest.raises(ValueError, match="unknown metric"):
        openmetrics.write_blocks(small, tmp_path, metrics={"gpu_util"})


def _series_of(text: str, family: str) -> list[dict[str, str]]:
    return [
        dict(re.findall(r'(\w+)="([^"]*)"', labels))
        for labels in sorted(set(re.findall(rf"^{family}\{{(.*)\}} ", text, re.M)))
    ]


def test_openmetrics_mig_slices_and_the_helm_chart(small, tmp_path):
    """ip-10-0-1-13 as NVIDIA's dcgm-exporter Helm chart writes and its ServiceMonitor scrapes it: every
    series and `up` carry the exporter pod's labels (container `exporter`), the holder is exported_*;
    GPU 0's slices carry the parent's gpu/UUID plus GPU_I_PROFILE/GPU_I_ID and have no GPU_UTIL."""
    wanted = {"DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_PROF_GR_ENGINE_ACTIVE", "up"}
    (f, *_) = openmetrics.write_blocks(small, tmp_path, metrics=wanted)
    text = f.read_text()
    pod = openmetrics.dcgm_exporter_pod("ip-10-0-1-13", "helm-chart")
    assert re.fullmatch(r"dcgm-exporter-[0-9a-f]{5}", pod)
    target = {
        "job": "dcgm-exporter",
        "instance": "ip-10-0-1-13:9400",
        "namespace": "gpu-monitoring",
        "pod": pod,
        "container": "exporter",
        "service": "dcgm-exporter",
        "endpoint": "metrics",
    }
    assert target in _series_of(text, "up")
    gr = [s for s in _series_of(text, "DCGM_FI_PROF_GR_ENGINE_ACTIVE") if s["Hostname"] == "ip-10-0-1-13"]
    assert all({k: s[k] for k in target} == target for s in gr)
    assert not any("DCGM_FI_DRIVER_VERSION" in s for s in gr)  # not in the chart's counters list
    uuid0 = truth.gpu_uuid(small, "ip-10-0-1-13", 0)
    slices = sorted(
        (s["GPU_I_ID"], s["GPU_I_PROFILE"], s.get("exported_pod", "")) for s in gr if s["UUID"] == uuid0
    )
    # 00:00-02:00: slice 1 idle, then ppo-humanoid-mig-0's; slice 2 idle, then dqn-atari-mig-0's
    assert slices == [
        ("1", "3g.40gb", ""),
        ("1", "3g.40gb", "ppo-humanoid-mig-0"),
        ("2", "3g.40gb", ""),
        ("2", "3g.40gb", "dqn-atari-mig-0"),
    ]
    assert all(s["gpu"] == "0" and s["device"] == "nvidia0" for s in gr if s["UUID"] == uuid0)
    util = [s for s in _series_of(text, "DCGM_FI_DEV_GPU_UTIL") if s["Hostname"] == "ip-10-0-1-13"]
    assert {s["gpu"] for s in util} == {"1"} and not any("GPU_I_ID" in s for s in util)
    # the GPU Operator's nodes as before, now with GR_ENGINE_ACTIVE on their whole GPUs too
    operator = [
        s for s in _series_of(text, "DCGM_FI_PROF_GR_ENGINE_ACTIVE") if s["Hostname"] != "ip-10-0-1-13"
    ]
    assert {s["Hostname"] for s in operator} == {"ip-10-0-1-11", "ip-10-0-1-12"}
    assert all(s["container"] == "nvidia-dcgm-exporter" and "DCGM_FI_DRIVER_VERSION" in s for s in operator)


def test_oom_loop_restarts_the_container(small):
    from foxhunt_obs.sandbox.truth import pod_restarts

    (inc,) = [i for i in small.incidents if i.kind == "oom_loop"]
    restarts = pod_restarts(small, inc.pod)
    at = lambda h, m: (h * 3600 + m * 60) // small.step_s  # noqa: E731
    assert restarts[at(5, 9)] == 0 and restarts[at(5, 20)] == inc.count == 3 and restarts[-1] == 3
    assert list(np.unique(np.diff(restarts))) == [0, 1]  # one restart at a time
    assert not pod_restarts(small, "ppo-humanoid-trainer-0").any()
