"""MIG slices and unknown activity through gpu_hourly and cost_allocation, on a lake built by hand.

One p4de.24xlarge node-hour (2 GPUs reporting, priced from the price table: no bill yet):
* GPU 0 in MIG mode with two 3g.40gb slices held by two pods (3/7 of the GPU each; 1/7 unsliced);
* GPU 1 whole, held by a pod, whose exporter sends no util at all (activity unknown, not idle).
"""

from datetime import date, datetime, timedelta, timezone

import pyarrow as pa
import pytest

from foxhunt_obs.lib.analysis.prices import load_price_table
from foxhunt_obs.lib.ingest.mig import MigError, slice_share
from foxhunt_obs.lib.lake import Lake
from foxhunt_obs.lib.schemas import COSTS_DAILY, COSTS_HOURLY, GPU_HOURLY, GPU_SAMPLES, NODE_SAMPLES
from foxhunt_obs.lib.tables.cost_model import build_cost_allocation, register_prices
from foxhunt_obs.lib.tables.hourly_rollup import build_gpu_hourly
from foxhunt_obs_tests.lib.lake_rows import node_hour

DAY = datetime(2026, 11, 16, tzinfo=timezone.utc)
NODE, STEP = "ip-10-0-1-11", 60.0
PRICE = 27.44705  # p4de.24xlarge, us-east-1 (foxhunt_obs/data/prices.yaml)


@pytest.mark.parametrize(
    "profile, model, share",
    [
        ("3g.40gb", "NVIDIA H100 80GB HBM3", 3 / 7),
        ("1g.10gb+me", "NVIDIA A100-SXM4-80GB", 1 / 7),
        ("7g.79gb", "NVIDIA A100 80GB PCIe", 1.0),  # as NVIDIA/dcgm-exporter issue #713 shows one reported
        ("1g.6gb", "NVIDIA A30", 1 / 4),
        ("2g.20gb", "NVIDIA A800-SXM4-80GB", 2 / 7),
    ],
)
def test_a_slice_is_its_compute_slices_over_the_gpus(profile, model, share):
    assert slice_share(profile, model) == pytest.approx(share)


def test_unknown_models_and_profiles_fail_loudly():
    with pytest.raises(MigError, match=r"'NVIDIA L4'.*compute slices are unknown.*mig_profiles.yaml"):
        slice_share("1g.6gb", "NVIDIA L4")
    with pytest.raises(MigError, match="not a '<n>g.<memory>' profile"):
        slice_share("MIG-abc", "NVIDIA H100")
    with pytest.raises(MigError, match="9 compute slices"):
        slice_share("9g.90gb", "NVIDIA H100")


def _samples() -> pa.Table:
    rows = []
    for i in range(60):
        ts = DAY + timedelta(minutes=i)
        base = dict(ts=ts, node=NODE, model="NVIDIA A100-SXM4-80GB", container="main", step_seconds=STEP)
        for gi, pod, util in ((1, "ppo-0", 0.5), (2, "dqn-0", 0.25)):
            rows.append(
                base
                | dict(gpu=0, uuid="GPU-mig", gpu_instance=gi, gpu_profile="3g.40gb", gpu_share=3 / 7,
                       namespace="rl", pod=pod, experiment=pod[:3], gr_engine_active=util, util=util,
                       util_basis="DCGM_FI_PROF_GR_ENGINE_ACTIVE", power_watts=300.0,
                       energy_joules=1000.0 * i)  # the GPU's counter, repeated on each slice: 1 kJ a minute
            )  # fmt: skip
        rows.append(
            base
            | dict(gpu=1, uuid="GPU-whole", gpu_profile="", gpu_share=1.0, namespace="rl", pod="sac-0",
                   experiment="sac", util=None, util_basis="", power_watts=200.0, energy_joules=500.0 * i)
        )  # fmt: skip
    return pa.Table.from_pylist(rows, schema=GPU_SAMPLES.schema)


@pytest.fixture
def allocated(tmp_path):
    lake = Lake(str(tmp_path / "lake"))
    lake.write_partition(GPU_SAMPLES, "2026-11-16T00", _samples())
    lake.write_partition(NODE_SAMPLES, "2026-11-16T00", node_hour(DAY, NODE, 2, STEP))
    hourly = build_gpu_hourly(lake, [DAY])["2026-11-16"]
    lake.write_partition(GPU_HOURLY, "2026-11-16", hourly)
    for spec in (COSTS_HOURLY, COSTS_DAILY):
        lake.write_partition(spec, "2026-11-16", spec.schema.empty_table())
    con = lake.connect([GPU_HOURLY, NODE_SAMPLES, COSTS_HOURLY, COSTS_DAILY])
    register_prices(con, load_price_table("us-east-1"))
    allocation = build_cost_allocation(con, date(2026, 11, 16))
    con.close()
    return hourly.to_pandas(), allocation.to_pandas()


def test_gpu_hourly_has_a_row_per_slice_and_splits_the_gpus_energy(allocated):
    hourly, _ = allocated
    mig = hourly[hourly["uuid"] == "GPU-mig"].set_index("gpu_instance")
    assert list(mig.index) == [1, 2] and list(mig["pod"]) == ["ppo-0", "dqn-0"]
    assert mig["gpu_share"].tolist() == pytest.approx([3 / 7, 3 / 7])
    # 59 kJ over the hour on the GPU, not once per slice: half each (their shares of the slices present)
    assert mig["energy_kwh"].sum() == pytest.approx(59_000 / 3.6e6)
    assert mig["energy_kwh"].tolist() == pytest.approx([59_000 / 3.6e6 / 2] * 2)
    # active GPU-seconds weighed by the share: 0.5 × 3600 s × 3/7
    assert mig.loc[1, "active_gpu_seconds"] == pytest.approx(0.5 * 3600 * 3 / 7)
    assert set(mig["util_basis"]) == {"DCGM_FI_PROF_GR_ENGINE_ACTIVE"}


def test_no_util_is_unknown_activity_not_idle(allocated):
    hourly, allocation = allocated
    whole = hourly[hourly["uuid"] == "GPU-whole"].iloc[0]
    assert (
        whole["activity_seconds"] == 0 and whole["active_gpu_seconds"] != whole["active_gpu_seconds"]
    )  # NaN
    row = allocation[allocation["uuid"] == "GPU-whole"].iloc[0]
    assert row["allocated_usd"] == pytest.approx(PRICE / 2)
    assert row["idle_usd"] == 0
    assert row["unknown_activity_usd"] == pytest.approx(PRICE / 2)


def test_a_mig_gpus_cost_is_split_by_share_and_the_unsliced_rest_is_cluster_idle(allocated):
    _, allocation = allocated
    mig = allocation[allocation["uuid"] == "GPU-mig"]
    slices = mig[mig["kind"] == "gpu"].set_index("gpu_instance")
    gpu_cost = PRICE / 2  # the node's hour over its 2 GPUs (not its 3 rows)
    assert slices["allocated_usd"].tolist() == pytest.approx([gpu_cost * 3 / 7] * 2)
    assert slices["experiment"].tolist() == ["ppo", "dqn"]
    # idle: the slice's allocated $ × (1 − its activity): ppo-0 at 0.5, dqn-0 at 0.25
    assert slices["idle_usd"].tolist() == pytest.approx([gpu_cost * 3 / 7 * 0.5, gpu_cost * 3 / 7 * 0.75])
    assert slices["gpu_seconds"].tolist() == pytest.approx([3600 * 3 / 7] * 2)  # GPU-seconds
    rest = mig[mig["kind"] == "mig_unsliced"].iloc[0]
    assert rest["unallocated_usd"] == pytest.approx(gpu_cost / 7) and rest["allocated_usd"] == 0
    assert rest["gpu_profile"] == "unsliced"
    total = allocation["allocated_usd"].sum() + allocation["unallocated_usd"].sum()
    assert total == pytest.approx(PRICE)  # the node-hour, counted once


def test_unknown_activity_is_out_of_the_per_dollar_figures(tmp_path, allocated):
    """sac's GPU reported no util: its dollars are unknown activity, so its utilization per dollar and mean
    util are NULL (nothing known), not 0 (which would read as 100 % idle)."""
    from foxhunt_obs.lib.schemas import COST_ALLOCATION
    from foxhunt_obs.lib.tables.cost_model import build_utilization_per_dollar

    _, allocation = allocated
    lake = Lake(str(tmp_path / "upd"))
    lake.write_partition(
        COST_ALLOCATION, "2026-11-16", pa.Table.from_pandas(allocation, preserve_index=False)
    )
    con = lake.connect([COST_ALLOCATION])
    upd = build_utilization_per_dollar(con, date(2026, 11, 16)).to_pandas().set_index("experiment")
    con.close()
    assert upd.loc["sac", "unknown_activity_usd"] == pytest.approx(PRICE / 2)
    assert upd.loc["sac", "active_gpu_hours_per_usd"] != upd.loc["sac", "active_gpu_hours_per_usd"]  # NaN
    assert upd.loc["sac", "mean_util"] != upd.loc["sac", "mean_util"]
    assert upd.loc["ppo", "active_gpu_hours_per_usd"] == pytest.approx((0.5 * 3 / 7) / (PRICE / 2 * 3 / 7))


def test_gpus_without_uuids_still_split_their_node(tmp_path):
    """An exporter that cannot read a GPU's identity sends uuid="": the node's cost is still split over
    its GPUs (by gpu index), not charged whole to each."""
    rows = [r for r in _samples().to_pylist() if r["uuid"] == "GPU-whole"]
    rows += [{**r, "gpu": 2} for r in rows]
    for r in rows:
        r["uuid"], r["util"], r["util_basis"] = "", 0.5, "DCGM_FI_DEV_GPU_UTIL"
    lake = Lake(str(tmp_path / "lake"))
    lake.write_partition(GPU_SAMPLES, "2026-11-16T00", pa.Table.from_pylist(rows, schema=GPU_SAMPLES.schema))
    lake.write_partition(NODE_SAMPLES, "2026-11-16T00", node_hour(DAY, NODE, 2, STEP))
    lake.write_partition(GPU_HOURLY, "2026-11-16", build_gpu_hourly(lake, [DAY])["2026-11-16"])
    for spec in (COSTS_HOURLY, COSTS_DAILY):
        lake.write_partition(spec, "2026-11-16", spec.schema.empty_table())
    con = lake.connect([GPU_HOURLY, NODE_SAMPLES, COSTS_HOURLY, COSTS_DAILY])
    register_prices(con, load_price_table("us-east-1"))
    allocation = build_cost_allocation(con, date(2026, 11, 16)).to_pandas()
    con.close()
    gpus = allocation[allocation["kind"] == "gpu"]
    assert len(gpus) == 2 and gpus["allocated_usd"].tolist() == pytest.approx([PRICE / 2] * 2)
