"""Fair shares: a GPU-hour split over every pod that held it, time-sliced GPUs split per step,
SM activity beside utilization, and a run's cost from its own pods in its own window. On lakes built by
hand, with every expected dollar computed here from the price table.

One p4de.24xlarge node-hour (2 GPUs reporting, priced from the price table: no bill yet), 1-minute steps:
* GPU 0: pod rl/a holds it until 00:20 (util 0.5, SM 0.4, 100 W), then rl/b (util 1.0, SM 0.8, 300 W);
* GPU 1, time-sliced: rl/c and rl/d share it until 00:30 (each pod's copy of the series, vgpu 0 and 1),
  rl/c alone until 00:45, then no pod; util 0.6 throughout (no SM activity reported).
"""

from datetime import date, datetime, timedelta, timezone

import numpy as np
import pyarrow as pa
import pytest

from foxhunt_obs.lib.analysis.prices import load_price_table
from foxhunt_obs.lib.ingest.gpu_series import time_slices
from foxhunt_obs.lib.lake import Lake
from foxhunt_obs.lib.schemas import (
    COST_ALLOCATION,
    COSTS_DAILY,
    COSTS_HOURLY,
    GPU_SAMPLES,
    NODE_SAMPLES,
    TRAINING_METRICS,
    TRAINING_RUNS,
)
from foxhunt_obs.lib.tables.cost_allocation import cost_allocation
from foxhunt_obs.lib.tables.cost_model import build_outcome_per_dollar
from foxhunt_obs.lib.tables.gpu_hourly import gpu_hourly
from foxhunt_obs.lib.tables.per_dollar import utilization_per_dollar
from foxhunt_obs_tests.lib.lake_rows import node_hour

DAY = datetime(2026, 11, 16, tzinfo=timezone.utc)
NODE, STEP = "ip-10-0-1-11", 60.0
PRICE = 27.44705  # p4de.24xlarge, us-east-1 (foxhunt_obs/data/prices.yaml)
C = PRICE / 2  # one GPU-hour: the node's hour over its 2 GPUs


def _samples() -> pa.Table:
    rows, energy = [], 0.0
    for i in range(60):
        ts = DAY + timedelta(minutes=i)
        base = dict(ts=ts, node=NODE, model="NVIDIA A100-SXM4-80GB", container="main", step_seconds=STEP,
                    gpu_profile="", gpu_share=1.0, util_basis="DCGM_FI_DEV_GPU_UTIL", namespace="rl")  # fmt: skip
        pod, util, sm, watts = ("a", 0.5, 0.4, 100.0) if i < 20 else ("b", 1.0, 0.8, 300.0)
        energy += watts * STEP
        rows.append(base | dict(gpu=0, uuid="GPU-0", pod=pod, experiment=pod, util=util, sm_active=sm,
                                power_watts=watts, energy_joules=energy, step_share=1.0))  # fmt: skip
        one = base | dict(gpu=1, uuid="GPU-1", util=0.6, power_watts=200.0, energy_joules=200.0 * STEP * i)
        if i < 30:
            rows += [
                one | dict(pod=p, experiment=p, vgpu=v, step_share=0.5) for p, v in (("c", "0"), ("d", "1"))
            ]
        elif i < 45:
            rows.append(one | dict(pod="c", experiment="c", vgpu="0", step_share=1.0))
        else:
            rows.append(one | dict(pod="", namespace="", experiment="unattributed", step_share=1.0))
    return pa.Table.from_pylist(rows, schema=GPU_SAMPLES.schema)


@pytest.fixture
def built(tmp_path):
    """The hand-built hour through the functions the assets call (lib/tables/gpu_hourly.py, cost_allocation.py, per_dollar.py)."""
    lake = Lake(str(tmp_path / "lake"))
    lake.write_partition(GPU_SAMPLES, "2026-11-16T00", _samples())
    lake.write_partition(NODE_SAMPLES, "2026-11-16T00", node_hour(DAY, NODE, 2, STEP))
    for spec in (COSTS_HOURLY, COSTS_DAILY):
        lake.write_partition(spec, "2026-11-16", spec.schema.empty_table())
    hourly = gpu_hourly(lake, [DAY]).frame()
    allocation = cost_allocation(lake, [DAY], load_price_table("us-east-1"))
    (check,) = allocation.checks  # no bill in this lake, not even an estimate: nothing to sum to
    assert (
        check.name == "sums_to_the_bill"
        and not check.passed
        and "vs bill (estimate) None" in check.metadata["mismatches"]
    )
    upd = utilization_per_dollar(lake, [DAY]).frame().set_index("experiment")
    return hourly, allocation.frame(), upd


def test_a_hand_off_at_20_past_charges_20_and_40_minutes(built):
    hourly, allocation, _ = built
    gpu0 = hourly[hourly["uuid"] == "GPU-0"].set_index("pod")
    assert list(gpu0.index) == ["a", "b"] and set(gpu0["pods_seen"]) == {2}
    assert gpu0["held_seconds"].tolist() == [1200.0, 2400.0]
    assert gpu0["device_seconds"].tolist() == [3600.0, 3600.0]
    assert gpu0["active_gpu_seconds"].tolist() == pytest.approx([0.5 * 1200, 1.0 * 2400])
    assert gpu0["sm_active_gpu_seconds"].tolist() == pytest.approx([0.4 * 1200, 0.8 * 2400])
    # the counter rose 100 W x 60 s a minute, then 300 W x 60 s (the first sample has no increment):
    # split by the power each pod drew over its seconds, 1:6
    rise = (20 * 100 + 40 * 300 - 100) * STEP / 3.6e6
    assert gpu0["energy_kwh"].tolist() == pytest.approx([rise / 7, rise * 6 / 7])
    rows = allocation[allocation["uuid"] == "GPU-0"].set_index("pod")
    assert rows["allocated_usd"].tolist() == pytest.approx([C / 3, C * 2 / 3])
    assert rows["idle_usd"].tolist() == pytest.approx([C / 3 * 0.5, 0.0])
    assert rows["sm_idle_usd"].tolist() == pytest.approx([C / 3 * 0.6, C * 2 / 3 * 0.2])
    assert rows["unallocated_usd"].tolist() == [0.0, 0.0]


def test_a_time_sliced_gpu_is_split_evenly_per_step_and_the_unheld_rest_is_cluster_idle(built):
    hourly, allocation, _ = built
    gpu1 = hourly[hourly["uuid"] == "GPU-1"].set_index("pod")
    assert list(gpu1.index) == ["c", "d", ""]  # holders first, then the part no pod held
    # c: 30 shared minutes at half a step + 15 alone; d: 30 shared at half; 15 minutes nobody
    assert gpu1["seconds_with_data"].tolist() == [1800.0, 900.0, 900.0]
    assert gpu1["held_seconds"].tolist() == [1800.0, 900.0, 0.0]
    assert gpu1["active_gpu_seconds"].tolist() == pytest.approx([0.6 * 1800, 0.6 * 900, 0.6 * 900])
    assert gpu1["sm_active_gpu_seconds"].isna().all() and (gpu1["sm_activity_seconds"] == 0).all()
    # the GPU's energy counted once, whatever the copies of its series
    assert gpu1["energy_kwh"].sum() == pytest.approx(200 * STEP * 59 / 3.6e6)
    rows = allocation[allocation["uuid"] == "GPU-1"].set_index("pod")
    assert rows["allocated_usd"].tolist() == pytest.approx([C / 2, C / 4, 0.0])
    assert rows.loc["", "unallocated_usd"] == pytest.approx(C / 4) and rows.loc["", "experiment"] == ""
    assert rows.loc["c", "idle_usd"] == pytest.approx(C / 2 * 0.4)
    # no SM activity reported: not idle on that basis, unknown
    assert rows.loc["c", "sm_idle_usd"] == 0 and rows.loc["c", "sm_unknown_activity_usd"] == pytest.approx(
        C / 2
    )
    total = allocation["allocated_usd"].sum() + allocation["unallocated_usd"].sum()
    assert total == pytest.approx(PRICE)  # the node-hour, counted once


def test_utilization_per_dollar_on_both_bases(built):
    _, _, upd = built
    # util basis: a 0.5 x 20 min on $C/3
    assert upd.loc["a", "active_gpu_hours_per_usd"] == pytest.approx((0.5 * 1200 / 3600) / (C / 3))
    # SM basis: 0.4 x 20 min over the same dollars (SM reported on all of them)
    assert upd.loc["a", "sm_active_gpu_hours"] == pytest.approx(0.4 * 1200 / 3600)
    assert upd.loc["a", "sm_active_gpu_hours_per_usd"] == pytest.approx((0.4 * 1200 / 3600) / (C / 3))
    # c never reported SM activity: its SM figure is unknown (NaN), not 0
    assert np.isnan(upd.loc["c", "sm_active_gpu_hours_per_usd"])
    assert upd.loc["c", "sm_unknown_activity_usd"] == pytest.approx(C / 2)


def test_time_slices_split_a_step_over_the_pods_present():
    # one GPU (device 0), steps 0..2: step 0 two pods (copies) + the device row (per-process mode),
    # step 1 one pod, step 2 only the device row; device 1 step 0: one unheld row
    device = np.array([0, 0, 0, 0, 0, 1])
    step = np.array([0, 0, 0, 1, 2, 0])
    held = np.array([True, True, False, True, False, False])
    util = pa.array([0.2, 0.9, 0.7, 0.5, 0.1, None], pa.float64())
    share, u = time_slices(device, step, held, util)
    assert share.to_pylist() == [0.5, 0.5, 0.0, 1.0, 1.0, 1.0]
    # beside the device row, each pod's activity is the device's (per-process util moves no dollars)
    assert u.to_pylist() == [0.7, 0.7, 0.7, 0.5, 0.1, None]


# -- runs ---------------------------------------------------------------------------------------------------
DAY1, DAY2 = date(2026, 11, 16), date(2026, 11, 17)


def _alloc(
    day: date,
    hour: int,
    ns: str,
    pod: str,
    held_s: float = 3600.0,
    run_id: str = "",
    wall_s: float | None = None,
) -> dict:
    usd = C * held_s / 3600
    return dict(
        day=day, hour=datetime(day.year, day.month, day.day, hour, tzinfo=timezone.utc), node=NODE, gpu=0,
        uuid=f"GPU-{pod}", pod=pod, namespace=ns, experiment=ns, kind="gpu", service="AmazonEC2",
        resource_id="i-0abc", gpu_seconds=3600.0, held_seconds=held_s, active_gpu_seconds=held_s / 2,
        energy_kwh=0.1, allocated_usd=usd, unallocated_usd=C - usd, idle_usd=usd / 2, cost_source="estimate",
        gpu_share=1.0, unknown_activity_usd=0.0, run_id=run_id, sm_idle_usd=usd / 4,
        held_wall_seconds=held_s if wall_s is None else wall_s,
    )  # fmt: skip


def _run(run_id: str, pod: str, ns: str, start: datetime, end: datetime | None) -> dict:
    return dict(
        run_id=run_id, run_name=run_id, experiment="rl", status="FINISHED" if end else "RUNNING",
        deleted=False, start_time=start, end_time=end, pod=pod, namespace=ns,
    )  # fmt: skip


def _at(day: date, hour: int, minute: int = 0) -> datetime:
    return datetime(day.year, day.month, day.day, hour, minute, tzinfo=timezone.utc)


@pytest.fixture
def outcomes(tmp_path):
    lake = Lake(str(tmp_path / "lake"))
    by_day = {
        DAY1: [
            _alloc(DAY1, 10, "rl", "trainer-0"), _alloc(DAY1, 11, "rl", "trainer-0"),
            _alloc(DAY1, 10, "other", "trainer-0"),  # the same name in another namespace
            _alloc(DAY1, 10, "rl", "z-head"), _alloc(DAY1, 10, "rl", "z-worker-0"),
            _alloc(DAY1, 10, "rl", "z-worker-1"),
            # trainer-1 held 10:00-10:10 by run p and 10:20-11:00 by run q: one row of 50 minutes
            _alloc(DAY1, 10, "rl", "trainer-1", held_s=3000.0),
            _alloc(DAY1, 3, "rl", "labeled-0", run_id="run-l"),  # outside run-l's window: the label decides
            # time-sliced with another pod all hour: half the GPU's seconds, the whole hour on the clock
            _alloc(DAY1, 12, "rl", "shared-0", held_s=1800.0, wall_s=3600.0),
            *(_alloc(DAY1, h, "rl", "stuck-0") for h in (14, 15, 16, 17)),
            _alloc(DAY1, 8, "rl", "dup-0"), _alloc(DAY1, 8, "other", "dup-0"),
            _alloc(DAY1, 8, "rl", "solo-0"),
        ],
        DAY2: [_alloc(DAY2, 10, "rl", "trainer-0"), _alloc(DAY2, 11, "rl", "trainer-0")],
    }  # fmt: skip
    for day, rows in by_day.items():
        lake.write_partition(
            COST_ALLOCATION, day.isoformat(), pa.Table.from_pylist(rows, schema=COST_ALLOCATION.schema)
        )
    runs = [
        _run("run-x", "trainer-0", "rl", _at(DAY1, 10), _at(DAY1, 12)),
        _run("run-y", "trainer-0", "rl", _at(DAY2, 10), _at(DAY2, 11, 30)),  # the StatefulSet's pod again
        _run("run-z", "z-head, z-worker-0,z-worker-1", "rl", _at(DAY1, 9), None),
        _run("run-p", "trainer-1", "rl", _at(DAY1, 9), _at(DAY1, 10, 10)),
        _run("run-q", "trainer-1", "rl", _at(DAY1, 10, 20), _at(DAY1, 12)),
        _run("run-l", "labeled-0", "rl", _at(DAY1, 20), _at(DAY1, 21)),
        _run("run-ghost", "ghost-0", "rl", _at(DAY1, 10), _at(DAY1, 11)),
        _run("run-outside", "", "", _at(DAY1, 10), _at(DAY1, 11)),
        _run("run-s1", "shared-0", "rl", _at(DAY1, 12), _at(DAY1, 12, 30)),
        _run("run-s2", "shared-0", "rl", _at(DAY1, 12, 30), _at(DAY1, 13)),
        _run("run-zombie", "stuck-0", "rl", _at(DAY1, 14), None),  # killed, MLflow still says RUNNING
        _run("run-next", "stuck-0", "rl", _at(DAY1, 16), _at(DAY1, 18)),
        _run("run-nons", "dup-0", "", _at(DAY1, 8), _at(DAY1, 9)),  # no namespace tag, two dup-0s
        _run("run-nons-solo", "solo-0", "", _at(DAY1, 8), _at(DAY1, 9)),
        _run("run-nostart", "solo-0", "rl", None, None),
    ]
    lake.write_partition(TRAINING_RUNS, "current", pa.Table.from_pylist(runs, schema=TRAINING_RUNS.schema))
    lake.write_partition(TRAINING_METRICS, "current", TRAINING_METRICS.schema.empty_table())

    def on(day: date):
        con = lake.connect([COST_ALLOCATION, TRAINING_RUNS, TRAINING_METRICS])
        table = build_outcome_per_dollar(con, day).to_pandas().set_index("run_id")
        con.close()
        return table

    return on


def test_a_runs_dollars_are_its_own_pods_in_its_own_window(outcomes):
    day1, day2 = outcomes(DAY1), outcomes(DAY2)
    # trainer-0 in rl, 10:00-12:00 on day 1: not day 2's reuse, not the other namespace's trainer-0
    assert day1.loc["run-x", "usd"] == pytest.approx(2 * C)
    assert day2.loc["run-y", "usd"] == pytest.approx(C + C / 2)  # 11:00-11:30 of the 11 o'clock hour
    assert "run-x" not in day2.index  # ended on day 1
    # a head and two workers: the run is charged whole
    assert day1.loc["run-z", "usd"] == pytest.approx(3 * C) and day1.loc[
        "run-z", "gpu_hours"
    ] == pytest.approx(3)
    # the boundary hour two runs share: 10 and 40 minutes of the pod's 50
    assert day1.loc["run-p", "usd"] == pytest.approx(C * 600 / 3600)
    assert day1.loc["run-q", "usd"] == pytest.approx(C * 2400 / 3600)
    assert day1.loc["run-p", "idle_usd"] == pytest.approx(C * 600 / 3600 / 2)
    assert day1.loc["run-p", "sm_idle_usd"] == pytest.approx(C * 600 / 3600 / 4)
    # a pod labelled with the run id is the run's, whatever the window
    assert (
        day1.loc["run-l", "usd"] == pytest.approx(C)
        and day1.loc["run-l", "charged_by"] == "its pods (run id label)"
    )
    assert day1.loc["run-x", "charged_by"] == "its pods in its window"


def test_runs_on_no_gpu_the_lake_knows_are_listed_as_such_never_as_zero(outcomes):
    day1 = outcomes(DAY1)
    assert np.isnan(day1.loc["run-ghost", "usd"])
    assert day1.loc["run-ghost", "charged_by"] == "no GPU the lake knows held its pods in its window"
    assert np.isnan(day1.loc["run-outside", "usd"])
    assert day1.loc["run-outside", "charged_by"] == "no pod tag: ran outside the cluster?"


def test_runs_sharing_a_time_sliced_hour_never_take_more_than_it(outcomes):
    """shared-0 held its time-sliced GPU all of hour 12 (half its seconds, C/2): two runs of 30 minutes
    each take a half of that, not each the whole (the window is wall-clock, the held seconds are not)."""
    day1 = outcomes(DAY1)
    assert day1.loc["run-s1", "usd"] == pytest.approx(C / 4) and day1.loc["run-s2", "usd"] == pytest.approx(
        C / 4
    )


def test_a_run_left_running_ends_where_the_next_run_on_its_pod_starts(outcomes):
    day1 = outcomes(DAY1)
    assert day1.loc["run-zombie", "usd"] == pytest.approx(2 * C)  # 14:00-16:00, not its successor's hours
    assert day1.loc["run-next", "usd"] == pytest.approx(2 * C)
    assert (
        day1.loc["run-zombie", "charged_by"]
        == "its pods in its window (RUNNING: until the next run on its pods)"
    )


def test_a_run_without_a_namespace_is_charged_only_an_unambiguous_pod(outcomes):
    day1 = outcomes(DAY1)
    assert np.isnan(day1.loc["run-nons", "usd"]) and day1.loc["run-nons", "charged_by"].startswith(
        "ambiguous"
    )
    assert day1.loc["run-nons-solo", "usd"] == pytest.approx(C)
    # a run with no start time has no window: listed, never priced
    assert (
        np.isnan(day1.loc["run-nostart", "usd"])
        and day1.loc["run-nostart", "charged_by"] == "no start time: no window"
    )


def test_a_one_step_pod_an_unheld_hour_and_a_slice_handed_off(tmp_path):
    """GPU 0: a pod for one step (00:30), nobody the rest of the hour and all of the next; GPU 1 in MIG
    mode: slice 1 (3g.40gb, 3/7) held by m1 until 00:15, then m2; no other slice."""
    rows = []
    for i in range(120):
        ts = DAY + timedelta(minutes=i)
        base = dict(ts=ts, node=NODE, model="NVIDIA A100-SXM4-80GB", step_seconds=STEP, step_share=1.0,
                    util=0.5, power_watts=100.0)  # fmt: skip
        blip = i == 30
        rows.append(base | dict(gpu=0, uuid="GPU-0", gpu_share=1.0, util_basis="DCGM_FI_DEV_GPU_UTIL",
                                namespace="rl" if blip else "", pod="blip" if blip else "",
                                experiment="blip" if blip else "unattributed"))  # fmt: skip
        if i < 60:
            pod = "m1" if i < 15 else "m2"
            rows.append(base | dict(gpu=1, uuid="GPU-1", gpu_instance=1, gpu_profile="3g.40gb", gpu_share=3 / 7,
                                    namespace="rl", pod=pod, experiment=pod, gr_engine_active=0.5,
                                    util_basis="DCGM_FI_PROF_GR_ENGINE_ACTIVE"))  # fmt: skip
    lake = Lake(str(tmp_path / "lake"))
    samples = pa.Table.from_pylist(rows, schema=GPU_SAMPLES.schema)
    for h in (0, 1):
        start = DAY + timedelta(hours=h)
        hour = samples.filter(pa.compute.equal(pa.compute.hour(samples["ts"]), h))
        lake.write_partition(GPU_SAMPLES, GPU_SAMPLES.key(start), hour)
        lake.write_partition(NODE_SAMPLES, NODE_SAMPLES.key(start), node_hour(start, NODE, 2, STEP))
    for spec in (COSTS_HOURLY, COSTS_DAILY):
        lake.write_partition(spec, "2026-11-16", spec.schema.empty_table())
    gpu_hourly(lake, [DAY])
    alloc = cost_allocation(lake, [DAY], load_price_table("us-east-1")).frame()
    alloc["h"] = alloc["hour"].dt.hour
    gpu0 = alloc[alloc.uuid == "GPU-0"].set_index(["h", "pod"])
    assert gpu0.loc[(0, "blip"), "allocated_usd"] == pytest.approx(C * 60 / 3600)
    assert gpu0.loc[(0, ""), "unallocated_usd"] == pytest.approx(C * 3540 / 3600)
    # hour 1: GPU 0 the only one reporting on the node, so it carries the node's hour, nobody's
    assert list(gpu0.loc[1].index) == [""] and gpu0.loc[(1, ""), "unallocated_usd"] == pytest.approx(PRICE)
    mig = alloc[(alloc.uuid == "GPU-1") & (alloc.kind == "gpu")].set_index("pod")
    assert mig["allocated_usd"].to_dict() == pytest.approx(
        {"m1": C * 3 / 7 * 15 / 60, "m2": C * 3 / 7 * 45 / 60}
    )
    (rest,) = alloc[alloc.kind == "mig_unsliced"].itertuples()
    assert rest.unallocated_usd == pytest.approx(C * 4 / 7)
    # each hour's node cost, counted once
    per_hour = alloc.groupby("h")[["allocated_usd", "unallocated_usd"]].sum().sum(axis=1)
    assert per_hour.to_dict() == pytest.approx({0: PRICE, 1: PRICE})
