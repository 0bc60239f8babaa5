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

from foxhunt_obs.sandbox import openmetrics, truth
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
    assert [n.name for n in small.nodes] == ["ip-10-0-1-11", "ip-10-0-1-12"]
    assert all(n.gpus == 2 and n.mem_mib == 81920 for n in small.nodes)
    assert {i.kind for i in small.incidents} == set(INCIDENT_KINDS)  # every kind once
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
    assert sc.start.weekday() == 0 and sc.hours == 168 and len(sc.nodes) == 2
    assert sum(n.gpus for n in sc.nodes) == 16 and len(sc.experiments) == 3 and 10 <= len(sc.pods) <= 15
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
}


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
    assert len(gpus) == 4 * small.steps - 2 * 480
    assert gpus["ts"].dtype == "datetime64[ns, UTC]"
    assert gpus["ts"].min() == pd.Timestamp(small.start) and gpus["ts"].max() == pd.Timestamp(
        small.end
    ) - pd.Timedelta(15, "s")
    assert (gpus["ts"].astype("int64") // 10**9 % 15 == 0).all()
    assert not gpus.duplicated(["ts", "node", "gpu"]).any()
    in_outage = (gpus["node"] == "ip-10-0-1-12") & gpus["ts"].between(
        lost[0].start, lost[0].end, inclusive="left"
    )
    assert not in_outage.any()
    nodes = truth.node_samples(small)
    assert len(nodes) == 2 * small.steps - 480 and nodes["cpu_busy"].between(0, 1).all()


def test_gpu_values_are_consistent(small, gpus):
    assert gpus["util_pct"].between(0, 100).all() and (gpus["util"] == gpus["util_pct"] / 100).all()
    assert (gpus["fb_free_mib"] == 81920 - gpus["fb_used_mib"]).all()
    assert (gpus["power_w"] < 400).all() and (gpus["power_w"] == gpus["power_w"].round(3)).all()
    idle = gpus["pod"] == ""
    assert (gpus.loc[idle, "experiment"] == "unattributed").all() and (
        gpus.loc[idle, "container"] == ""
    ).all()
    assert gpus.loc[idle, "util_pct"].max() <= 2 and gpus.loc[idle, "fb_used_mib"].max() <= 500
    assert gpus.loc[~idle, "fb_used_mib"].min() > 55_000
    assert set(gpus["uuid"]) == {truth.gpu_uuid(small, n.name, g) for n in small.nodes for g in range(2)}
    for _, g in gpus.groupby("uuid"):  # energy counts every scrape's power, lost ones included
        steps = g["ts"].diff().dt.total_seconds().iloc[1:].to_numpy() // 15
        dense = steps == 1
        np.testing.assert_array_equal(
            np.diff(g["energy_mj"].to_numpy())[dense], (g["power_w"].to_numpy()[1:] * 15000).round()[dense]
        )
    assert (gpus["xid"] == 0).all()


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
        for uuid, g in gpus.groupby("uuid"):
            v = g[col].to_numpy()
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
    assert per_family["DCGM_FI_DEV_GPU_UTIL"] == len(gpus)
    assert per_family["node_cpu_seconds_total"] == 2 * 4 * 3 * small.steps - 4 * 3 * 480
    assert per_family["up"] == 4 * small.steps
    assert per_family["kube_node_labels"] == 2 * small.steps
    assert per_family["kube_node_info"] == 2 * small.steps - 480  # none while ip-10-0-1-12 is lost
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


def test_oom_loop_restarts_the_container(small):
    from foxhunt_obs.sandbox.truth import pod_restarts

    (inc,) = [i for i in small.incidents if i.kind == "oom_loop"]
    restarts = pod_restarts(small, inc.pod)
    at = lambda h, m: (h * 3600 + m * 60) // small.step_s  # noqa: E731
    assert restarts[at(5, 9)] == 0 and restarts[at(5, 20)] == inc.count == 3 and restarts[-1] == 3
    assert list(np.unique(np.diff(restarts))) == [0, 1]  # one restart at a time
    assert not pod_restarts(small, "ppo-humanoid-trainer-0").any()
