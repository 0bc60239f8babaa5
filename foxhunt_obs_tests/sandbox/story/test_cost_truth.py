"""The cost policy's ground truth (truth.gpu_allocations, pod_dollars, run_dollars) by hand, on the cases
a real cluster has: a GPU handed from one pod to another mid-hour, a time-sliced GPU shared by two pods,
a StatefulSet pod name reused by two runs, the same pod name in another namespace, a Ray-style run on a
head and two workers. A GPU-hour of a 2-GPU p4de node costs C = $27.44705 / 2 (small), of an 8-GPU one
$27.44705 / 8 (default)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from foxhunt_obs.sandbox.story import truth
from foxhunt_obs.sandbox.story.scenario import load_scenario
from foxhunt_obs.sandbox.writers import bills

P4DE = 27.44705  # p4de.24xlarge on demand, us-east-1 (data/prices.yaml)
C = P4DE / 2  # a GPU-hour on small's 2-GPU nodes
C8 = P4DE / 8  # a GPU-hour on default's 8-GPU nodes
DAY = "2026-11-16"
exact = dict(rel=1e-12)


@pytest.fixture(scope="module")
def small():
    return load_scenario("small")


@pytest.fixture(scope="module")
def alloc(small):
    return truth.gpu_allocations(small)


@pytest.fixture(scope="module")
def gpus(small):
    return truth.gpu_samples(small)


@pytest.fixture(scope="module")
def pods(small, alloc):
    return truth.pod_dollars(small, alloc=alloc).set_index(["namespace", "pod"])


@pytest.fixture(scope="module")
def runs(small, alloc):
    return truth.run_dollars(small, DAY, alloc=alloc).set_index("run_name")


def _hour(alloc, node, gpu, h):
    rows = alloc[(alloc["node"] == node) & (alloc["gpu"] == gpu) & (alloc["kind"] == "gpu")]
    rows = rows[rows["hour"] == pd.Timestamp(f"{DAY}T{h:02d}:00Z")]
    return {(r.namespace, r.pod): r for r in rows.itertuples()}


def test_columns_and_invariants(small, alloc):
    assert list(alloc.columns) == truth.ALLOCATION_COLUMNS
    unit = ["hour", "node", "gpu", alloc["gpu_instance"].fillna(-1)]
    g = alloc[alloc["kind"] == "gpu"]
    by_unit = g.groupby(["hour", "node", "gpu", g["gpu_instance"].fillna(-1)])
    # a unit-hour's rows: one per holder plus '' for the unheld part, adding up to the seconds reported
    np.testing.assert_allclose(by_unit["held_seconds"].sum(), by_unit["seconds_with_data"].first())
    np.testing.assert_allclose(
        by_unit["allocated_usd"].sum() + by_unit["unallocated_usd"].sum(), by_unit["cost_usd"].first()
    )
    assert not alloc.duplicated([*unit[:3], "gpu_instance", "kind", "namespace", "pod"]).any()
    held, free = g[g["pod"] != ""], g[g["pod"] == ""]
    assert (held["unallocated_usd"] == 0).all() and (free["allocated_usd"] == 0).all()
    assert (free["idle_usd"] == 0).all() and (free["experiment"] == "").all()
    np.testing.assert_allclose(
        held["idle_usd"],
        held["allocated_usd"] * (1 - held["active_gpu_seconds"] / (held["held_seconds"] * held["gpu_share"])),
    )
    # the whole bill of the nodes is charged, to pods or unallocated, once
    ec2 = sum(float(i.cost) for i in bills.line_items(small) if i.service == bills.EC2)
    assert (alloc["allocated_usd"] + alloc["unallocated_usd"]).sum() == pytest.approx(ec2, **exact)
    # SM_ACTIVE only where it is reported: whole GPUs of the GPU Operator's nodes
    chart = alloc["node"] == "ip-10-0-1-13"
    assert alloc.loc[chart, "sm_active_gpu_seconds"].isna().all()
    assert alloc.loc[~chart, "sm_active_gpu_seconds"].notna().all()


def test_a_gpu_handed_over_at_20_past(alloc):
    """ip-10-0-1-11 GPU 0, hour 05: rl-train's trainer-0 until 05:20 (20 min), dqn-atari-learner-3 from
    05:20 (40 min): C/3 and 2C/3, nothing unallocated."""
    rows = _hour(alloc, "ip-10-0-1-11", 0, 5)
    assert set(rows) == {("rl-train", "trainer-0"), ("rl-atari", "dqn-atari-learner-3")}
    a, b = rows[("rl-train", "trainer-0")], rows[("rl-atari", "dqn-atari-learner-3")]
    assert (a.held_seconds, b.held_seconds, a.seconds_with_data) == (1200, 2400, 3600)
    assert a.allocated_usd == pytest.approx(C / 3, **exact) and b.allocated_usd == pytest.approx(
        2 * C / 3, **exact
    )
    assert a.cost_usd == b.cost_usd == pytest.approx(C, **exact)
    assert a.experiment == "ppo-humanoid" and b.experiment == "dqn-atari"


def test_a_time_sliced_gpu_splits_each_scrape(alloc, gpus):
    """ip-10-0-1-12 GPU 1, 2 replicas: the two trainer-0s (rl-train 00:30-02:30, rl-atari 01:00-02:45)
    share it 01:00-02:30, 7.5 s of each 15 s scrape each. Hour 01: C/2 each. Hour 02: rl-train 30 min / 2
    = 900 s (C/4), rl-atari 900 + 15 min = 1,800 s (C/2), nobody 02:45-03:00 (C/4 unallocated)."""
    h1 = _hour(alloc, "ip-10-0-1-12", 1, 1)
    assert set(h1) == {("rl-train", "trainer-0"), ("rl-atari", "trainer-0")}
    for r in h1.values():
        assert r.held_seconds == 1800 and r.allocated_usd == pytest.approx(C / 2, **exact)
    h2 = _hour(alloc, "ip-10-0-1-12", 1, 2)
    assert {k: v.held_seconds for k, v in h2.items()} == {
        ("rl-train", "trainer-0"): 900,
        ("rl-atari", "trainer-0"): 1800,
        ("", ""): 900,
    }
    assert h2[("rl-train", "trainer-0")].allocated_usd == pytest.approx(C / 4, **exact)
    assert h2[("rl-atari", "trainer-0")].allocated_usd == pytest.approx(C / 2, **exact)
    assert h2[("", "")].unallocated_usd == pytest.approx(C / 4, **exact)
    # active GPU-seconds: the device's util (every copy of the series carries it) x 15 s / 2 while shared
    g = gpus[(gpus["node"] == "ip-10-0-1-12") & (gpus["gpu"] == 1)]
    hour1 = g[g["ts"].between(pd.Timestamp(f"{DAY}T01:00Z"), pd.Timestamp(f"{DAY}T01:59:45Z"))]
    for (ns, _), rows in hour1.groupby(["namespace", "pod"]):
        assert len(rows) == 240 and (rows["vgpu"] == ("0" if ns == "rl-train" else "1")).all()
        assert h1[(ns, "trainer-0")].active_gpu_seconds == pytest.approx((rows["util"] * 7.5).sum(), **exact)
        assert h1[(ns, "trainer-0")].sm_active_gpu_seconds == pytest.approx(
            (rows["sm_active"] * 7.5).sum(), **exact
        )
    a, b = (r.reset_index(drop=True) for _, r in hour1.groupby("namespace"))
    assert (a["util_pct"] == b["util_pct"]).all() and (a["power_w"] == b["power_w"]).all()


def test_a_reused_pod_name_does_not_carry_spend_across_runs(pods, runs):
    """rl-train's trainer-0: 00:30-02:30 on ip-10-0-1-12's shared GPU 1 (run ppo-humanoid-f2: C/2 in hour
    00, C/2 in 01, C/4 in 02 = 5C/4), again 04:30-05:20 on ip-10-0-1-11 GPU 0 (run ppo-humanoid-f3: C/2
    in 04, C/3 in 05 = 5C/6). The pod, as (namespace, name), has both: 25C/12; each run only its own."""
    assert pods.loc[("rl-train", "trainer-0"), "allocated_usd"] == pytest.approx(25 * C / 12, **exact)
    assert runs.loc["ppo-humanoid-f2", "allocated_usd"] == pytest.approx(5 * C / 4, **exact)
    assert runs.loc["ppo-humanoid-f3", "allocated_usd"] == pytest.approx(5 * C / 6, **exact)
    assert runs.loc[["ppo-humanoid-f2", "ppo-humanoid-f3"], "idle_usd"].sum() == pytest.approx(
        pods.loc[("rl-train", "trainer-0"), "idle_usd"], **exact
    )
    assert runs.loc["ppo-humanoid-f2", "pod"] == runs.loc["ppo-humanoid-f3", "pod"] == "trainer-0"


def test_the_same_name_in_another_namespace(pods, runs):
    """rl-atari's trainer-0 (dqn-atari) lives at the same time as rl-train's, on the same GPU: C/2 in hour
    01 and C/2 in 02, all of it its run dqn-atari-f2's; rl-train's spend is not in it."""
    assert pods.loc[("rl-atari", "trainer-0"), "allocated_usd"] == pytest.approx(C, **exact)
    assert pods.loc[("rl-atari", "trainer-0"), "experiment"] == "dqn-atari"
    assert runs.loc["dqn-atari-f2", "allocated_usd"] == pytest.approx(C, **exact)
    assert runs.loc["dqn-atari-f2", "namespace"] == "rl-atari"


def test_a_run_on_a_head_and_two_workers(small, pods, runs):
    """ppo-humanoid-ray, 00:00-00:30: its head (replica 0 of ip-10-0-1-12's GPU 1, alone) and two
    workers (ip-10-0-1-11 GPUs 0 and 1), C/2 each: 3C/2; its MLflow tag pod lists all three."""
    names = ["ppo-humanoid-ray-head", "ppo-humanoid-ray-worker-0", "ppo-humanoid-ray-worker-1"]
    assert runs.loc["ppo-humanoid-ray", "pod"] == ",".join(names)
    assert [small.pods[i].name for i in small.training.run("ppo-humanoid-ray").pods] == names
    for name in names:
        assert pods.loc[("rl-train", name), "allocated_usd"] == pytest.approx(C / 2, **exact)
    assert runs.loc["ppo-humanoid-ray", "allocated_usd"] == pytest.approx(3 * C / 2, **exact)
    assert runs.loc["ppo-humanoid-ray", "idle_usd"] == pytest.approx(
        sum(pods.loc[("rl-train", n), "idle_usd"] for n in names), **exact
    )


def test_run_windows_cut_what_their_pods_held(small, pods, runs):
    """dqn-atari-f0 ends at 02:30 (FAILED), its pod dqn-atari-learner-0 at 02:45: of hour 02's 45 held
    minutes the run takes 30. ppo-humanoid-f0 is RUNNING: its window runs to the day's end, all of its
    pod's spend. Runs without pods cost nothing; a day before a run starts lists no run."""
    learner = pods.loc[("rl-atari", "dqn-atari-learner-0"), "allocated_usd"]
    assert runs.loc["dqn-atari-f0", "allocated_usd"] == pytest.approx(learner - C * 15 / 60, **exact)
    assert runs.loc["ppo-humanoid-f0", "allocated_usd"] == pytest.approx(
        pods.loc[("rl-train", "ppo-humanoid-trainer-0"), "allocated_usd"], **exact
    )
    assert runs.loc["ppo-humanoid-f0", "end"] == pd.Timestamp("2026-11-17T00:00Z")
    assert (runs.loc[["ppo-humanoid-sweep", "dqn-atari-debug"], "allocated_usd"] == 0).all()
    assert runs.loc["dqn-atari-debug", "deleted"]
    assert truth.run_dollars(small, "2026-11-15").empty
    # the day's pods are every pod's dollars: small is one day
    pd.testing.assert_frame_equal(truth.pod_dollars(small, DAY), pods.reset_index())


def test_reused_name_shares_a_boundary_hour_across_days():
    """default: rl-locomotion's trainer-0 holds ip-10-0-1-11 GPUs 6-7 for ppo-ant-f4 2026-11-20 14:00 to
    11-21 00:20 and again for ppo-ant-f5 from 00:40 to 10:00. In hour 11-21 00 the pod (as the pipeline
    sees it) held each GPU 40 minutes, 2/3 C8; each run's window covers 20 of them: 1/3 C8 per GPU. At the
    end of 11-20 f4 has 10 h x 2 GPUs = 20 C8 and f5 is not listed; at the end of 11-21 f4 20 2/3 C8, f5
    2/3 + 9 h x 2 = 18 2/3 C8 (and no more on 11-22). rl-atari's trainer-0 (dqn-atari-f4, 11-21
    01:00-10:00, GPUs 4-5): 18 C8. The Ray run (11-22 04:00-14:00, 3 GPUs): 30 C8."""
    sc = load_scenario("default")
    alloc = truth.gpu_allocations(sc)
    hour = alloc[(alloc["hour"] == pd.Timestamp("2026-11-21T00:00Z")) & (alloc["node"] == "ip-10-0-1-11")]
    mine = hour[(hour["pod"] == "trainer-0") & (hour["namespace"] == "rl-locomotion")]
    assert list(mine["gpu"]) == [6, 7] and (mine["held_seconds"] == 2400).all()
    np.testing.assert_allclose(mine["allocated_usd"], 2 / 3 * C8, rtol=1e-12)

    def day(d):
        return truth.run_dollars(sc, d, alloc=alloc).set_index("run_name")["allocated_usd"]

    d20, d21, d22 = day("2026-11-20"), day("2026-11-21"), day("2026-11-22")
    assert d20["ppo-ant-f4"] == pytest.approx(20 * C8, **exact) and "ppo-ant-f5" not in d20
    assert d21["ppo-ant-f4"] == pytest.approx((20 + 2 / 3) * C8, **exact) == d22["ppo-ant-f4"]
    assert d21["ppo-ant-f5"] == pytest.approx((2 / 3 + 18) * C8, **exact) == d22["ppo-ant-f5"]
    total = truth.pod_dollars(sc, alloc=alloc).set_index(["namespace", "pod"])["allocated_usd"]
    assert d22["ppo-ant-f4"] + d22["ppo-ant-f5"] == pytest.approx(
        total[("rl-locomotion", "trainer-0")], **exact
    )
    assert d21["dqn-atari-f4"] == pytest.approx(18 * C8, **exact) == total[("rl-atari", "trainer-0")]
    assert d22["ppo-humanoid-ray"] == pytest.approx(30 * C8, **exact)
    # the day's pod dollars: 11-21 has trainer-0's two pods' 20 + 9 h 20 min x 2 GPUs
    on21 = truth.pod_dollars(sc, "2026-11-21", alloc=alloc).set_index(["namespace", "pod"])["allocated_usd"]
    assert on21[("rl-locomotion", "trainer-0")] == pytest.approx((2 / 3 + 2 / 3 + 18) * C8, **exact)
    # default's time-sliced GPU: two evaluators share ip-10-0-1-12 GPU 5 75h..78h, C8/2 an hour each
    shared = alloc[(alloc["node"] == "ip-10-0-1-12") & (alloc["gpu"] == 5)]
    at76 = shared[shared["hour"] == pd.Timestamp("2026-11-19T04:00Z")]
    assert set(at76["pod"]) == {"ppo-ant-eval-0", "dqn-atari-eval-0"}
    np.testing.assert_allclose(at76["allocated_usd"], C8 / 2, rtol=1e-12)
