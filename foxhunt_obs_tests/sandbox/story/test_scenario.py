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

from foxhunt_obs.sandbox.story import truth
from foxhunt_obs.sandbox.story.scenario import (
    INCIDENT_KINDS,
    SCENARIO_DIR,
    ScenarioError,
    load_scenario,
    parse_scenario,
)
from foxhunt_obs.sandbox.writers import bills, openmetrics

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
    # ip-10-0-1-12's GPU 1 is time-sliced into 2 replicas; each pod on it holds one (vgpu)
    n2 = small.node("ip-10-0-1-12")
    assert (n2.time_sliced, n2.replicas) == ((1,), 2) and not small.nodes[0].time_sliced
    shared = {(p.name, p.namespace, p.start_s): p.vgpu for p in small.pods if p.vgpu}
    assert shared == {
        ("dqn-atari-learner-1", "rl-atari", 5 * 3600): ((1, 0),),
        ("ppo-humanoid-ray-head", "rl-train", 0): ((1, 0),),
        ("trainer-0", "rl-train", 1800): ((1, 0),),
        ("trainer-0", "rl-atari", 3600): ((1, 1),),
    }
    # a pod is (namespace, name, start): trainer-0 three times, twice in rl-train
    assert [p.key for p in small.pods_named("trainer-0")] == [
        ("rl-train", "trainer-0", 1800),
        ("rl-atari", "trainer-0", 3600),
        ("rl-train", "trainer-0", 4 * 3600 + 1800),
    ]
    assert all(p.index == i for i, p in enumerate(small.pods))
    with pytest.raises(KeyError, match="names 2 pods"):
        small.pod("trainer-0", "rl-train")
    assert small.pod("trainer-0", "rl-atari").start_s == 3600


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
    assert sum(n.gpus for n in sc.nodes) == 24 and len(sc.experiments) == 3 and 20 <= len(sc.pods) <= 30
    (shared,) = [n for n in sc.nodes if n.time_sliced]
    assert shared.exporter == "gpu-operator" and (shared.time_sliced, shared.replicas) == ((5,), 2)
    assert len(sc.pods_named("trainer-0", "rl-locomotion")) == 2 and len(sc.pods_named("trainer-0")) == 3
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
    # time-slicing, and pods known by (namespace, name, start)
    "time-sliced on the helm chart": (
        lambda r: _node(r, "ip-10-0-1-13").update(time_sliced={"gpus": [1], "replicas": 2}),
        "time_sliced: ip-10-0-1-13's exporter is helm-chart: time-sliced GPUs are written as the GPU Operator's",
    ),
    "time-sliced mig gpu": (
        lambda r: _node(r, "ip-10-0-1-12").update(
            time_sliced={"gpus": [1], "replicas": 2}, mig={1: ["3g.40gb"]}
        ),
        "GPU 1 of ip-10-0-1-12 is in MIG mode: it cannot also be time-sliced",
    ),
    "time-sliced one replica": (
        lambda r: _node(r, "ip-10-0-1-12").update(time_sliced={"gpus": [1], "replicas": 1}),
        "replicas must be a whole number >= 2, got 1",
    ),
    "time-sliced gpu out of range": (
        lambda r: _node(r, "ip-10-0-1-12").update(time_sliced={"gpus": [2], "replicas": 2}),
        "time_sliced: GPU index 2 out of range",
    ),
    "time-sliced unknown field": (
        lambda r: _node(r, "ip-10-0-1-12").update(time_sliced={"gpus": [1], "replicas": 2, "mode": "mps"}),
        "time_sliced: unknown field(s) mode",
    ),
    "a third pod on two replicas": (
        lambda r: _pod(r, "ppo-humanoid-ray-head").update(end_h=1.5),
        "pod 'trainer-0': would be pod 3 on ip-10-0-1-12 GPU 1 at 1h, which is time-sliced into 2 replicas "
        "(held by 'ppo-humanoid-ray-head' (rl-train, 0h..1.5h), 'trainer-0' (rl-train, 0.5h..2.5h))",
    ),
    "two pods on an unshared gpu": (
        lambda r: _pod(r, "dqn-atari-learner-3").update(start_h=5),
        "pod 'dqn-atari-learner-3': overlaps pod 'trainer-0' on ip-10-0-1-11 GPU 0 (a GPU two pods share "
        "needs the node's time_sliced)",
    ),
    "a reused name alive twice": (
        lambda r: _pods(r, "trainer-0")[2].update(start_h=2),
        "pod 'trainer-0': defined twice in namespace rl-train at the same time (0.5h..2.5h and 2h..5:20)",
    ),
    "a reused name with other labels": (
        lambda r: (
            r["experiments"].append({"name": "sac-walker", "namespace": "rl-train"})
            or _pods(r, "trainer-0")[2].update(experiment="sac-walker")
        ),
        "comes back in namespace rl-train with experiment 'sac-walker', was 'ppo-humanoid'",
    ),
    "an ambiguous pod name": (
        lambda r: r["incidents"].append(
            {"kind": "oom_loop", "pod": "trainer-0", "start_h": 1, "minutes": 10, "count": 1}
        ),
        "pod 'trainer-0' names 3 pods ('trainer-0' (rl-train, 0.5h..2.5h), 'trainer-0' (rl-atari, 1h..2.75h), "
        "'trainer-0' (rl-train, 4.5h..5:20)): give a namespace and a time inside one of them",
    ),
    "a pod in no such namespace": (
        lambda r: r["incidents"].append(
            {
                "kind": "oom_loop",
                "pod": "trainer-0",
                "namespace": "rl-eval",
                "start_h": 1,
                "minutes": 10,
                "count": 1,
            }
        ),
        "no pod 'trainer-0' in namespace rl-eval (only in rl-atari, rl-train)",
    ),
    "a stall on a time-sliced gpu": (
        lambda r: r["incidents"].append(
            {"kind": "stall", "pod": "trainer-0", "namespace": "rl-atari", "start_h": 2, "minutes": 30}
        ),
        "pod 'trainer-0' holds time-sliced GPU(s) (1) of ip-10-0-1-12: a stall needs a pod holding unshared GPUs",
    ),
}


def _pods(raw, name):
    return [p for p in raw["pods"] if p["name"] == name]


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
    # 7 units per scrape: 2 + 2 whole GPUs, then ip-10-0-1-13's two MIG slices of GPU 0 and whole GPU 1;
    # plus a second row per scrape while two pods share ip-10-0-1-12's time-sliced GPU 1 (01:00-02:30)
    assert len(gpus) == 7 * small.steps - 2 * 480 + 90 * 4
    assert gpus["ts"].dtype == "datetime64[ns, UTC]"
    assert gpus["ts"].min() == pd.Timestamp(small.start) and gpus["ts"].max() == pd.Timestamp(
        small.end
    ) - pd.Timedelta(15, "s")
    assert (gpus["ts"].astype("int64") // 10**9 % 15 == 0).all()
    assert not gpus.duplicated(["ts", "node", "gpu", "gpu_instance", "vgpu"]).any()
    assert not gpus.duplicated(["ts", "node", "gpu", "gpu_instance", "namespace", "pod"]).any()
    twice = gpus.duplicated(["ts", "node", "gpu", "gpu_instance"], keep=False)
    shared = gpus[twice]
    assert set(shared["node"]) == {"ip-10-0-1-12"} and set(shared["gpu"]) == {1}
    assert shared["ts"].min() == pd.Timestamp("2026-11-16T01:00Z") and len(shared) == 2 * 360
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
    # a time-sliced GPU's pods keep half their memory level each (vgpu '' on every unshared GPU)
    unshared = w["vgpu"] == ""
    assert set(w.loc[~unshared, "node"]) == {"ip-10-0-1-12"} and set(w.loc[~unshared, "gpu"]) == {1}
    assert (
        w.loc[~idle & unshared, "fb_used_mib"].min() > 55_000
        and w.loc[~idle & ~unshared, "fb_used_mib"].min() > 57_000 // 2 - 256
        and sl.loc[~idle, "fb_used_mib"].min() > 0.7 * 40960 - 129
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
    # SM_ACTIVE and PIPE_TENSOR_ACTIVE: the GPU Operator's nodes' (whole) GPUs only, once per holder
    operator = (gpus["node"] != "ip-10-0-1-13").sum()
    assert per_family["DCGM_FI_PROF_SM_ACTIVE"] == per_family["DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"] == operator
    # no ECC counters in the Helm chart's list (ip-10-0-1-13)
    assert per_family["DCGM_FI_DEV_ECC_SBE_VOL_TOTAL"] == (gpus["node"] != "ip-10-0-1-13").sum()
    assert per_family["node_cpu_seconds_total"] == 3 * 4 * 3 * small.steps - 4 * 3 * 480
    # plus the Ray cluster's three targets while their pods live (00:00-00:30), 0 while worker-1 is lost
    assert per_family["up"] == 6 * small.steps + 3 * 120
    # Ray's series while each raylet answers: 120 + 120 + 80 scrapes (worker-1 lost 00:10-00:20)
    alive = 120 + 120 + 80
    assert per_family["ray_resources"] == 4 * alive  # GPU and object_store_memory, USED and AVAILABLE
    assert per_family["ray_object_store_memory"] == alive
    assert per_family["ray_tasks"] == alive + 2 * 120  # RUNNING everywhere, pending and failed on the head
    assert per_family["ray_actors"] == 3 * 120  # the GCS's ALIVE, RESTARTING, DEAD on the head
    assert per_family["kube_node_labels"] == 3 * small.steps
    assert per_family["kube_node_info"] == 3 * small.steps - 480  # none while ip-10-0-1-12 is lost
    assert per_family["kube_pod_labels"] == sum((p.end_s - p.start_s) // 15 for p in small.pods)


def test_openmetrics_labels_follow_the_pod(small, tmp_path):
    (f, *_) = openmetrics.write_blocks(small, tmp_path, metrics={"DCGM_FI_DEV_GPU_UTIL"})
    text = f.read_text()
    assert set(re.findall(r"^# TYPE (\S+)", text, re.M)) == {"DCGM_FI_DEV_GPU_UTIL"}
    series = set(re.findall(r"^DCGM_FI_DEV_GPU_UTIL\{(.*)\} ", text, re.M))
    gpu0 = [s for s in series if 'Hostname="ip-10-0-1-11"' in s and 'gpu="0"' in s]
    # held by the Ray run's worker-0 00:00-00:30, then by ppo-humanoid-trainer-0: never idle before 02:00
    assert len(gpu0) == 2 and all("exported_pod=" in s for s in gpu0)
    assert any('exported_pod="ppo-humanoid-ray-worker-0"' in s for s in gpu0)
    held = next(s for s in gpu0 if 'exported_pod="ppo-humanoid-trainer-0"' in s)
    assert "vgpu" not in held  # not a time-sliced GPU
    idle = [
        s for s in series if 'Hostname="ip-10-0-1-12"' in s and 'gpu="0"' in s and "exported_pod" not in s
    ]
    assert len(idle) == 1  # ip-10-0-1-12's GPU 0 is idle 00:00-00:15: the series without exported_*
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


def test_sm_and_tensor_activity(gpus):
    """DCGM_FI_PROF_SM_ACTIVE = 0.8 and PIPE_TENSOR_ACTIVE = 0.5 x GPU_UTIL's ratio (4 decimals) on the
    GPU Operator's nodes' GPUs; NaN on the Helm chart's node (no such field in its list), slices too."""
    operator = gpus["node"] != "ip-10-0-1-13"
    w = gpus[operator]
    assert (w["sm_active"] == (w["util_pct"] * 0.8 / 100).round(4)).all()
    assert (w["tensor_active"] == (w["util_pct"] * 0.5 / 100).round(4)).all()
    assert w["sm_active"].between(0, 0.8).all() and w["sm_active"].max() > 0.7
    assert gpus.loc[~operator, ["sm_active", "tensor_active"]].isna().all().all()


def test_openmetrics_time_sliced_gpu(small, gpus, tmp_path):
    """ip-10-0-1-12 GPU 1, time-sliced, as dcgm-exporter --kubernetes-virtual-gpus writes it: one copy of
    each device metric per pod holding it, with the device's value, that pod's labels (exported_*) and
    vgpu = its replica; the device-level series without pod labels while no pod holds it (02:45-03:00)."""
    wanted = {"DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_POWER_USAGE"}
    files = openmetrics.write_blocks(small, tmp_path, metrics=wanted)
    uuid = truth.gpu_uuid(small, "ip-10-0-1-12", 1)
    samples = defaultdict(dict)  # (family, exported namespace, pod, vgpu) -> ts -> value
    for f in files:
        for line in f.read_text().splitlines():
            m = SAMPLE.match(line)
            if not m or f'UUID="{uuid}"' not in m.group(2):
                continue
            labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2)))
            key = (m.group(1), labels.get("exported_namespace", ""), labels.get("exported_pod", ""))
            samples[key + (labels.get("vgpu"),)][int(m.group(4))] = float(m.group(3))
    util = {k[1:]: v for k, v in samples.items() if k[0] == "DCGM_FI_DEV_GPU_UTIL"}
    assert set(util) == {
        ("rl-train", "ppo-humanoid-ray-head", "0"),
        ("rl-train", "trainer-0", "0"),
        ("rl-atari", "trainer-0", "1"),
        ("rl-atari", "dqn-atari-learner-1", "0"),
        ("", "", None),  # the device-level series: no pod, no vgpu
    }
    t0 = int(small.start.timestamp())
    assert sorted(util[("", "", None)]) == list(range(t0 + 9900, t0 + 10800, 15))  # 02:45-03:00
    a, b = util[("rl-train", "trainer-0", "0")], util[("rl-atari", "trainer-0", "1")]
    both = sorted(set(a) & set(b))
    assert (both[0] - t0, both[-1] - t0 + 15) == (3600, 9000)  # shared 01:00-02:30
    assert all(a[t] == b[t] for t in both)  # every copy carries the device's value
    g = gpus[(gpus["uuid"] == uuid) & (gpus["namespace"] == "rl-atari") & (gpus["pod"] == "trainer-0")]
    assert dict(zip(g["ts"].astype("int64") // 10**9, g["util_pct"].astype(float))) == b
    assert (g["vgpu"] == "1").all()
    power = {k[1:] for k in samples if k[0] == "DCGM_FI_DEV_POWER_USAGE"}
    assert power == set(util)  # every device metric, not only GPU_UTIL


def test_openmetrics_reused_pod_name(small, tmp_path):
    """kube_pod_labels: one series per pod, a reused name's under a new uid; rl-train's trainer-0 twice."""
    files = openmetrics.write_blocks(small, tmp_path, metrics={"kube_pod_labels"})
    series = {s for f in files for s in re.findall(r"^kube_pod_labels\{(.*)\} ", f.read_text(), re.M)}
    mine = [dict(re.findall(r'(\w+)="([^"]*)"', s)) for s in series if 'pod="trainer-0"' in s]
    assert sorted((s["namespace"], s["uid"]) for s in mine) == sorted(
        (p.namespace, truth.pod_uid(small, p)) for p in small.pods_named("trainer-0")
    )
    assert len({s["uid"] for s in mine}) == 3


def test_oom_loop_restarts_the_container(small):
    from foxhunt_obs.sandbox.story.truth import pod_restarts

    (inc,) = [i for i in small.incidents if i.kind == "oom_loop"]
    restarts = pod_restarts(small, inc.pod)
    at = lambda h, m: (h * 3600 + m * 60) // small.step_s  # noqa: E731
    assert restarts[at(5, 9)] == 0 and restarts[at(5, 20)] == inc.count == 3 and restarts[-1] == 3
    assert list(np.unique(np.diff(restarts))) == [0, 1]  # one restart at a time
    assert not pod_restarts(small, "ppo-humanoid-trainer-0").any()
