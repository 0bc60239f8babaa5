"""The counters' increments without a sort (lib/tables/counter_increments.py), within each hour and from
the hour before through the hours' parts (lib/tables/gpu_hour_parts.py), against their definition: SQL's
lag() over each unit's samples in time order, seeded with the hour before the day, day by day (the query
gpu_hourly ran before). The samples are made to hit every path: a time-sliced GPU whose copies read
different counters, MIG slices, resets, NULLs, gaps before midnight of under and over an hour, rows out of
step order, a partition written before the vgpu and gpu_instance columns existed, one written before the
labels were dictionaries, and row groups with dictionaries of their own. Each test runs on two lakes of
the same samples: one written as the ingest writes (the parts in each file's footer, but for the two old
partitions) and one without parts (computed from the samples when read)."""

from __future__ import annotations

import os
from datetime import datetime, timedelta, timezone

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from foxhunt_obs.lib import lake as lake_module
from foxhunt_obs.lib.duck import scratch
from foxhunt_obs.lib.lake import Lake, LakeError
from foxhunt_obs.lib.names import UNATTRIBUTED
from foxhunt_obs.lib.schemas import GPU_HOURLY, GPU_SAMPLES
from foxhunt_obs.lib.tables.gpu_hour_parts import hours_to_read, read_parts, write_gpu_samples
from foxhunt_obs.lib.tables.hourly_rollup import build_gpu_hourly, per_hour

DAY0 = datetime(2026, 11, 16, tzinfo=timezone.utc)
DAYS = [DAY0 + timedelta(days=d) for d in range(3)]
STEP = 60

# the definition: the per-day window gpu_hourly used before (one query per day, the hour before as seed)
ORACLE = """
WITH s AS (
  SELECT *, energy_joules - lag(energy_joules) OVER w AS d_e, ecc_sbe_total - lag(ecc_sbe_total) OVER w AS d_s,
    ecc_dbe_total - lag(ecc_dbe_total) OVER w AS d_d
  FROM gpu_samples WHERE hour >= $seed AND hour < $end
  WINDOW w AS (PARTITION BY uuid, node, gpu, gpu_instance ORDER BY ts, pod = '', vgpu, pod)
)
SELECT epoch_ms(ts) // 3600000 AS hour_no, node, gpu, uuid, gpu_instance, coalesce(namespace, '') AS namespace,
  coalesce(pod, '') AS pod, CASE WHEN coalesce(pod, '') = '' THEN $u ELSE experiment END AS experiment,
  coalesce(sum(CASE WHEN d_e < 0 THEN energy_joules ELSE d_e END), 0) AS e,
  coalesce(sum(CASE WHEN d_s < 0 THEN ecc_sbe_total ELSE d_s END), 0) AS s,
  coalesce(sum(CASE WHEN d_d < 0 THEN ecc_dbe_total ELSE d_d END), 0) AS d
FROM s WHERE ts >= $start AND ts < $stop GROUP BY ALL
"""
# ours: the rows gpu_hourly's per-hour step gives (the parts with the increments from the hour before)
OURS = """
SELECT hour_no, node, gpu, uuid, gpu_instance, namespace, pod, experiment,
  energy_part_kwh * 3600000.0 AS e, ecc_sbe_delta AS s, ecc_dbe_delta AS d
FROM p
"""
KEYS = ["hour_no", "node", "gpu", "uuid", "gpu_instance", "namespace", "pod", "experiment"]


class Counter:
    """A counter that climbs, now and then resets to a small value, and now and then reads NULL."""

    def __init__(self, rng, rate: float, reset_p: float):
        self.rng, self.rate, self.reset_p, self.v = rng, rate, reset_p, float(rng.integers(0, 1000))

    def __call__(self) -> float | None:
        self.v = float(self.rng.integers(0, 3)) if self.rng.random() < self.reset_p else self.v + self.rate
        return None if self.rng.random() < 0.02 else self.v


def _hour_rows(rng, hour: datetime, counters: dict) -> list[dict]:
    rows = []
    for k in range(3600 // STEP):
        ts = hour + timedelta(seconds=k * STEP)
        minute = int((ts - DAY0).total_seconds() // 60)
        base = dict(ts=ts, model="A100", step_seconds=float(STEP), util=0.5, power_watts=300.0)

        def add(unit, pod, base=base, **kw):
            if rng.random() < 0.03:
                return  # a missed scrape
            node, gpu, uuid, inst = unit
            c = counters.setdefault((unit, kw.pop("copy", 0)), [Counter(rng, 300.0 * STEP, 0.01),
                                                                Counter(rng, 1.0, 0.02), Counter(rng, 0.0, 0.0)])  # fmt: skip
            e, s, d = (x() for x in c)
            rows.append(base | dict(node=node, gpu=gpu, uuid=uuid, gpu_instance=inst, namespace="rl" if pod else "",
                                    pod=pod, experiment=pod.split("-")[0] if pod else "", energy_joules=e,
                                    ecc_sbe_total=s, ecc_dbe_total=d, **kw))  # fmt: skip

        # a whole GPU changing hands every 40 minutes, unheld every third stretch
        add(("n1", 0, "GPU-a", None), ["ppo-1", "", "sac-2"][minute // 40 % 3])
        # a GPU gone from 22:30 to 00:20 into day 2 (over an hour before midnight: not seeded) and from
        # 23:30 to 00:10 into day 3 (under an hour: seeded); its energy counter reads 1 kJ per minute
        gone = [(DAY0 + timedelta(hours=22.5), DAY0 + timedelta(hours=24, minutes=20)),
                (DAY0 + timedelta(hours=47.5), DAY0 + timedelta(hours=48, minutes=10))]  # fmt: skip
        if not any(a <= ts < b for a, b in gone):
            rows.append(base | dict(node="n1", gpu=2, uuid="GPU-gap", namespace="rl", pod="ppo-3", experiment="ppo",
                                    energy_joules=1000.0 * minute, ecc_sbe_total=0.0, ecc_dbe_total=0.0))  # fmt: skip
        # a time-sliced GPU: two pods' copies and the GPU's own row at 0 share; the copies' counters
        # differ (another exporter's timing), so which copy comes first matters
        for vgpu, pod in (("1", "sac-ts"), ("0", "ppo-ts")):
            add(("n1", 1, "GPU-b", None), pod, vgpu=vgpu, step_share=0.5, copy=vgpu)
        add(("n1", 1, "GPU-b", None), "", vgpu="", step_share=0.0, copy="own")
        # a GPU whose exporter gave no uuid, node or index: NULL keys are a unit too
        add((None, None, None, None), "ppo-null")
        # MIG: two slices, each its own unit
        for inst in (1, 2):
            add(
                ("n2", 0, "GPU-m", inst), "dqn-mig" if inst == 1 else "", gpu_profile="3g.40gb", gpu_share=0.5
            )
    return rows


def _write(lake: Lake, rng, with_parts: bool) -> None:
    counters: dict = {}
    for h in range(-2, 24 * len(DAYS) + 1):
        hour = DAY0 + timedelta(hours=h)
        table = pa.Table.from_pylist(_hour_rows(rng, hour, counters), schema=GPU_SAMPLES.schema)
        key = GPU_SAMPLES.key(hour)
        if h % 7 == 3:  # out of step order
            table = table.take(rng.permutation(table.num_rows))
        old = None
        if h == 30:  # written before vgpu and gpu_instance existed (time-slicing and MIG rows dropped)
            gone = np.array([u in ("GPU-b", "GPU-m") for u in table.column("uuid").to_pylist()])
            old = table.filter(pa.array(~gone)).drop_columns(["vgpu", "gpu_instance"])
        if h == 40:  # written before the labels were dictionaries: plain strings
            old = table.cast(pa.schema([pa.field(f.name, pa.string()) if pa.types.is_dictionary(f.type) else f
                                        for f in table.schema]))  # fmt: skip
        if old is not None:
            path = f"{lake.root}/{GPU_SAMPLES.name}/hour={key}/part-0.parquet"
            os.makedirs(path.rpartition("/")[0])
            pq.write_table(old, path)
            continue
        if with_parts:
            write_gpu_samples(lake, hour, table)
        else:
            lake.write_partition(GPU_SAMPLES, key, table)


OLD_HOURS = [DAY0 + timedelta(hours=30), DAY0 + timedelta(hours=40)]  # written without parts in both


@pytest.fixture(scope="module", params=["with_parts", "without_parts"])
def lake(request, tmp_path_factory):
    lake = Lake(str(tmp_path_factory.mktemp("inc") / "lake"))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(lake_module, "ROW_GROUP_SIZE", 97)  # many row groups, each with its own dictionaries
        _write(lake, np.random.default_rng(11), request.param == "with_parts")
    lake.with_parts = request.param == "with_parts"
    return lake


def _frame(table: pa.Table):
    return table.to_pandas().sort_values(KEYS).reset_index(drop=True)


def _oracle(lake: Lake, days) -> pa.Table:
    con = lake.connect([GPU_SAMPLES])
    parts = [
        con.execute(
            ORACLE,
            {"seed": GPU_SAMPLES.key(d - timedelta(hours=1)), "end": GPU_SAMPLES.key(d + timedelta(days=1)),
             "start": d, "stop": d + timedelta(days=1), "u": UNATTRIBUTED},
        ).to_arrow_table()
        for d in days
    ]  # fmt: skip
    return pa.concat_tables(parts)


def _ours(lake: Lake, days) -> pa.Table:
    hours = hours_to_read(days)
    parts, computed = read_parts(lake, hours)
    # the parts came from the footers, but for the partitions written without them
    assert computed == ([h for h in hours if h in OLD_HOURS] if lake.with_parts else hours)
    with scratch(p=per_hour(pa.concat_tables(parts), days)) as con:
        return con.execute(OURS).to_arrow_table()


def test_increments_equal_the_lag_window_day_by_day(lake):
    want = _frame(_oracle(lake, DAYS))
    got = _frame(_ours(lake, DAYS))
    assert len(got) == len(want) > 24 * 3 * 5
    for c in KEYS:
        assert (got[c].fillna(-1).astype(str) == want[c].fillna(-1).astype(str)).all(), c
    for c in ("e", "s", "d"):
        np.testing.assert_allclose(got[c], want[c], rtol=1e-12, err_msg=c)
    # the first hour of day 2: GPU-gap's samples from 00:20, its last before at 22:29 (not seeded):
    # 39 minutes; of day 3: from 00:10, seeded by 23:29: 90 minutes
    for day, minutes in ((DAYS[1], 39), (DAYS[2], 90)):
        first = want[(want.uuid == "GPU-gap") & (want.hour_no == int(day.timestamp()) // 3600)]
        assert first.e.tolist() == [1000.0 * minutes]
    # the counters did reset (a fall between a unit's consecutive samples) in the days asked for
    resets = lake.query(
        """SELECT count(*) FROM (SELECT ts, energy_joules < lag(energy_joules) OVER (PARTITION BY uuid, gpu_instance, vgpu
           ORDER BY ts) AS fell FROM gpu_samples) WHERE fell AND ts >= $a""", {"a": DAY0}, [GPU_SAMPLES],
    ).column(0)[0].as_py()  # fmt: skip
    assert resets > 20


def test_days_apart_in_one_run_equal_the_lag_window(lake):
    """Days 1 and 3 without day 2: day 3 is seeded by the hour before it, never by day 1's last hour."""
    days = [DAYS[0], DAYS[2]]
    want, got = _frame(_oracle(lake, days)), _frame(_ours(lake, days))
    assert len(got) == len(want) > 24 * 2 * 5
    for c in ("e", "s", "d"):
        np.testing.assert_allclose(got[c], want[c], rtol=1e-12, err_msg=c)
    assert (want.uuid.isna() & (want.pod == "ppo-null")).sum() >= 48  # the NULL-keyed unit, every hour


def test_a_day_does_not_depend_on_the_others_in_the_run(lake):
    together = _frame(_ours(lake, DAYS))
    alone = _frame(pa.concat_tables([_ours(lake, [d]) for d in DAYS]))
    assert together.equals(alone)


def test_gpu_hourly_days_together_equal_days_alone(lake):
    """One query for several days gives each day the rows a run of that day alone gives (sums of floats
    aside: their order may differ, to the last bits)."""
    together = build_gpu_hourly(lake, DAYS)
    for d in DAYS:
        a, b = together[GPU_HOURLY.key(d)], build_gpu_hourly(lake, [d])[GPU_HOURLY.key(d)]
        assert a.num_rows == b.num_rows > 100
        for c in a.column_names:
            if pa.types.is_floating(a.schema.field(c).type):
                np.testing.assert_allclose(
                    a[c].to_numpy(), b[c].to_numpy(), rtol=1e-12, atol=1e-12, err_msg=c
                )
            else:
                assert a[c].equals(b[c]), c


def test_the_time_sliced_gpu_takes_the_sorted_path_and_its_first_copy_the_increment(lake):
    """ppo-ts (vgpu 0) sorts before sac-ts (vgpu 1): with the copies' counters apart, each hour's ECC
    increments are not split evenly, and they equal the window's."""
    want = _frame(_oracle(lake, DAYS[:1]))
    rows = want[want.uuid == "GPU-b"]
    assert set(rows.pod) == {"ppo-ts", "sac-ts", ""}
    got = _frame(_ours(lake, DAYS[:1]))
    np.testing.assert_allclose(got[got.uuid == "GPU-b"].e, rows.e, rtol=1e-12)
    per_pod = rows.groupby("pod").e.sum()
    assert per_pod["ppo-ts"] > 0 and per_pod["sac-ts"] > 0 and per_pod["ppo-ts"] != per_pod["sac-ts"]


def test_an_s3_lake_gives_the_same_rows(lake, moto_s3):
    """The same files on S3 (a moto server): the increments read through the lake's S3 filesystem and
    the aggregation through its registered dataset give the local lake's rows."""
    url, s3 = moto_s3
    s3.create_bucket(Bucket="lake")
    remote = Lake("s3://lake/foxhunt", endpoint_url=url)
    day = DAYS[1]
    for hour in [day - timedelta(hours=1) + timedelta(hours=h) for h in range(25)]:
        relative = (
            f"{GPU_SAMPLES.name}/hour={GPU_SAMPLES.key(hour)}/part-0.parquet"  # the bytes, old file too
        )
        with open(f"{lake.root}/{relative}", "rb") as f:
            s3.put_object(Bucket="lake", Key=f"foxhunt/{relative}", Body=f.read())
    got, want = build_gpu_hourly(remote, [day]), build_gpu_hourly(lake, [day])
    (key,) = want
    assert got[key].num_rows == want[key].num_rows > 100
    for c in want[key].column_names:
        if pa.types.is_floating(want[key].schema.field(c).type):
            np.testing.assert_allclose(got[key][c].to_numpy(), want[key][c].to_numpy(), rtol=1e-12, err_msg=c)
        else:
            assert got[key][c].equals(want[key][c]), c


def _one_gpu_lake(root, energy: list[float | None], hour: datetime = DAY0, ts_offset_s: float = 0.0) -> Lake:
    lake = Lake(str(root))
    rows = [
        dict(ts=hour + timedelta(seconds=ts_offset_s + STEP * i), node="n1", gpu=0, uuid="GPU-x", model="A100",
             namespace="rl", pod="ppo-1", experiment="ppo", util=0.5, power_watts=300.0, step_seconds=float(STEP),
             energy_joules=e, ecc_sbe_total=0.0, ecc_dbe_total=0.0)
        for i, e in enumerate(energy)
    ]  # fmt: skip
    lake.write_partition(
        GPU_SAMPLES, GPU_SAMPLES.key(hour), pa.Table.from_pylist(rows, schema=GPU_SAMPLES.schema)
    )
    return lake


def test_nan_and_inf_counters_are_no_increment(tmp_path):
    """A NaN or an Inf reading (Prometheus can return both) adds nothing, on either side of it: the hour's
    energy is the finite steps' (the window SQL made it NaN, or 5e301 kWh from an Inf)."""
    lake = _one_gpu_lake(tmp_path / "lake", [0.0, 3.6e6, float("nan"), 7.2e6, float("inf"), 1.08e7, 1.44e7])
    (row,) = build_gpu_hourly(lake, [DAY0])[GPU_HOURLY.key(DAY0)].to_pylist()
    assert row["energy_kwh"] == pytest.approx(2.0)  # 0 -> 1 kWh, then 3 -> 4 kWh; the rest touches NaN/Inf


def test_a_sample_outside_its_partition_hour_stops_the_run_naming_it(tmp_path):
    """A row of 00:00's partition stamped 01:00 would make a day's increments depend on the days a run
    reads: the run stops, naming the partition."""
    lake = _one_gpu_lake(tmp_path / "lake", [0.0, 1.0, 2.0], ts_offset_s=3600 - STEP)
    with pytest.raises(LakeError, match=r"partition hour=2026-11-16T00: 2 samples outside the hour"):
        build_gpu_hourly(lake, [DAY0])
