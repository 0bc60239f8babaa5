"""The hours' parts in gpu_samples' footers (lib/tables/gpu_hour_parts.py): gpu_hourly reads them where the
ingest wrote them, and never a part that disagrees with its partition's rows. (Their sums against the
samples' definition: test_counter_increments.py, on lakes with and without them.)"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import numpy as np
import pyarrow as pa
import pytest

from foxhunt_obs.lib.lake import Lake, LakeError, SchemaMismatch
from foxhunt_obs.lib.schemas import GPU_HOURLY, GPU_SAMPLES
from foxhunt_obs.lib.tables import gpu_hour_parts
from foxhunt_obs.lib.tables.gpu_hour_parts import FOOTER_KEY, write_gpu_samples
from foxhunt_obs.lib.tables.hourly_rollup import build_gpu_hourly_counted

DAY = datetime(2026, 11, 16, tzinfo=timezone.utc)
HOURS = [DAY + timedelta(hours=h) for h in range(3)]


def _hour(hour: datetime, util: float, kj_per_step: float = 1.0, steps: int = 60) -> pa.Table:
    rows = [
        dict(ts=hour + timedelta(minutes=i), node="n1", gpu=0, uuid="GPU-x", model="A100", namespace="rl",
             pod="ppo-1", experiment="ppo", util=util, power_watts=300.0, step_seconds=60.0,
             energy_joules=1000.0 * kj_per_step * (i + 60 * hour.hour), ecc_sbe_total=0.0, ecc_dbe_total=0.0)
        for i in range(steps)
    ]  # fmt: skip
    return pa.Table.from_pylist(rows, schema=GPU_SAMPLES.schema)


def _rows(lake: Lake) -> tuple[list[dict], list[datetime]]:
    out, computed = build_gpu_hourly_counted(lake, [DAY])
    return out[GPU_HOURLY.key(DAY)].to_pylist(), computed


def test_gpu_hourly_reads_the_ingests_parts_and_a_rewrite_replaces_them(tmp_path):
    lake = Lake(str(tmp_path / "lake"))
    for h in HOURS:
        write_gpu_samples(lake, h, _hour(h, 0.5))
    rows, computed = _rows(lake)
    assert computed == [] and [r["util_mean"] for r in rows] == [0.5] * 3
    # the energy counter climbs 1 kJ a step: 59 steps within the hour, and the step from the hour before
    assert [r["energy_kwh"] * 3600 for r in rows] == pytest.approx([59.0, 60.0, 60.0])

    write_gpu_samples(lake, HOURS[1], _hour(HOURS[1], 0.9, kj_per_step=2.0))  # with its own parts
    rows, computed = _rows(lake)
    assert computed == [] and [r["util_mean"] for r in rows] == pytest.approx([0.5, 0.9, 0.5])
    # 01:00 reads 120 kJ (61 after 00:59's 59 kJ), then climbs 2 kJ a step to 238 kJ; 02:00's first
    # reading (120 kJ) is below 01:59's: a reset, counted as 120 kJ, as the samples would count it
    assert [r["energy_kwh"] * 3600 for r in rows] == pytest.approx([59.0, 61.0 + 118.0, 120.0 + 59.0])

    lake.write_partition(GPU_SAMPLES, GPU_SAMPLES.key(HOURS[2]), _hour(HOURS[2], 0.1))  # another writer: none
    rows, computed = _rows(lake)
    assert computed == [HOURS[2]] and [r["util_mean"] for r in rows] == pytest.approx([0.5, 0.9, 0.1])


def test_parts_of_another_version_are_computed_again_from_the_samples(tmp_path, monkeypatch):
    lake = Lake(str(tmp_path / "lake"))
    for h in HOURS:
        write_gpu_samples(lake, h, _hour(h, 0.5))
    want, _ = _rows(lake)
    parts = lake.read_footer(GPU_SAMPLES, GPU_SAMPLES.key(HOURS[0]), FOOTER_KEY)[1]
    # a writer whose parts lack a column: its footer is not read as today's parts
    stale = parts.drop_columns(["util_p95"])
    lake.write_partition(
        GPU_SAMPLES, GPU_SAMPLES.key(HOURS[0]), _hour(HOURS[0], 0.5), footer={FOOTER_KEY: stale}
    )
    got, computed = _rows(lake)
    assert computed == [HOURS[0]] and got == want


def test_parts_under_an_older_key_are_not_read(tmp_path):
    lake = Lake(str(tmp_path / "lake"))
    for h in HOURS:
        write_gpu_samples(lake, h, _hour(h, 0.5))
    want, _ = _rows(lake)
    parts = lake.read_footer(GPU_SAMPLES, GPU_SAMPLES.key(HOURS[0]), FOOTER_KEY)[1]
    assert FOOTER_KEY.startswith("foxhunt.gpu_hour_parts.") and FOOTER_KEY != "foxhunt.gpu_hour_parts.v1"
    key = GPU_SAMPLES.key(HOURS[0])
    lake.write_partition(GPU_SAMPLES, key, _hour(HOURS[0], 0.5), footer={"foxhunt.gpu_hour_parts.v1": parts})
    got, computed = _rows(lake)
    assert computed == [HOURS[0]] and got == want


def test_a_file_copied_under_another_hours_key_is_refused_not_counted_twice(tmp_path):
    """Its footer holds the parts of the hour it was written for: not read as this hour's; its samples
    are then summed, and refused, naming the partition."""
    lake = Lake(str(tmp_path / "lake"))
    for h in HOURS:
        write_gpu_samples(lake, h, _hour(h, 0.5))
    src = tmp_path / "lake" / GPU_SAMPLES.name / f"hour={GPU_SAMPLES.key(HOURS[1])}" / "part-0.parquet"
    dst = tmp_path / "lake" / GPU_SAMPLES.name / "hour=2026-11-16T05" / "part-0.parquet"
    dst.parent.mkdir()
    dst.write_bytes(src.read_bytes())
    with pytest.raises(LakeError, match=r"partition hour=2026-11-16T05: 60 samples outside the hour"):
        build_gpu_hourly_counted(lake, [DAY])


def test_the_parts_are_of_the_rows_as_written(tmp_path):
    """The ingest's table in other types than the file's (gpu as int64) gives the parts of the conformed
    rows, which gpu_hourly reads; a table the lake refuses is refused naming the partition."""
    lake = Lake(str(tmp_path / "lake"))
    for h in HOURS:
        t = _hour(h, 0.5)
        write_gpu_samples(
            lake,
            h,
            t.set_column(t.schema.get_field_index("gpu"), "gpu", pa.array([0] * t.num_rows, pa.int64())),
        )
    _, computed = _rows(lake)
    assert computed == []
    with pytest.raises(SchemaMismatch, match=r"partition hour=2026-11-16T00: missing columns \['vgpu'\]"):
        write_gpu_samples(lake, HOURS[0], _hour(HOURS[0], 0.5).drop_columns(["vgpu"]))


def test_a_sample_outside_the_hour_is_refused_naming_the_partition_and_nothing_is_written(tmp_path):
    lake = Lake(str(tmp_path / "lake"))
    late = _hour(HOURS[0], 0.5, steps=61)  # 01:00 in 00:00's partition
    with pytest.raises(LakeError, match=r"partition hour=2026-11-16T00: 1 samples outside the hour"):
        write_gpu_samples(lake, HOURS[0], late)
    assert lake.partitions(GPU_SAMPLES) == []


def test_parts_computed_in_batches_equal_those_written_hour_by_hour(tmp_path, monkeypatch):
    """Old partitions' parts are computed several partitions at a time: each hour's are those the ingest
    writes for it alone."""
    lake = Lake(str(tmp_path / "lake"))
    for i, h in enumerate(HOURS):
        lake.write_partition(GPU_SAMPLES, GPU_SAMPLES.key(h), _hour(h, 0.2 * (i + 1), kj_per_step=i + 1))
    monkeypatch.setattr(gpu_hour_parts, "BATCH_ROWS", 100)  # two batches: 00-01, 02
    computed = dict(gpu_hour_parts._computed_parts(lake, HOURS))
    for h in HOURS:
        write_gpu_samples(lake, h, lake.read_partition(GPU_SAMPLES, GPU_SAMPLES.key(h)))
        assert computed[h].equals(lake.read_footer(GPU_SAMPLES, GPU_SAMPLES.key(h), FOOTER_KEY)[1])


def _handoffs(hour: datetime, gpus: int, rng: np.random.Generator, energy: np.ndarray) -> pa.Table:
    """An hour of `gpus` GPUs at 60 s: each GPU changes hands every 20 to 60 minutes, with unheld minutes
    between; power and the energy counter vary, so its unit-hours' energy parts are inexact floats."""
    minute = np.tile(np.arange(60), gpus)
    g = np.repeat(np.arange(gpus), 60)
    shift = g + hour.hour
    holder = (minute * (1 + shift % 3)) // 60
    pod = np.where((minute + shift) % 7 == 0, "", [f"p{a}-{hour.hour}-{b}" for a, b in zip(g, holder)])
    energy_joules = (energy[:, None] + np.cumsum(rng.uniform(1e3, 1e5, (gpus, 60)), axis=1)).ravel()
    energy[:] = energy_joules.reshape(gpus, 60)[:, -1]
    columns = {
        "ts": pa.array([hour + timedelta(minutes=int(m)) for m in minute], pa.timestamp("us", "UTC")),
        "node": [f"n{x // 8}" for x in g], "gpu": g % 8, "uuid": [f"GPU-{x}" for x in g], "model": ["A100"] * len(g),
        "namespace": ["rl"] * len(g), "pod": pod, "experiment": [f"e{x % 5}" for x in shift + holder],
        "util": rng.uniform(0, 100, len(g)), "power_watts": rng.uniform(50, 400, len(g)),
        "step_seconds": np.full(len(g), 60.0), "energy_joules": energy_joules,
    }  # fmt: skip
    n = len(g)
    return pa.table(
        [pa.array(columns[f.name]).cast(f.type) if f.name in columns else pa.nulls(n, f.type) for f in GPU_SAMPLES.schema],
        schema=GPU_SAMPLES.schema,
    )  # fmt: skip


def test_gpu_hourly_is_the_same_to_the_last_bit_on_every_run_and_from_the_samples(tmp_path, monkeypatch):
    """A re-run gives identical rows: a unit-hour's energy is split over its holders by window sums that
    DuckDB's threads would add in a varying order (energy_kwh differed in its last bits from run to run on
    16 GPUs' day before the queries ran on one thread)."""
    lake = Lake(str(tmp_path / "lake"))
    rng, energy = np.random.default_rng(7), np.zeros(16)
    for h in range(24):
        write_gpu_samples(
            lake, DAY + timedelta(hours=h), _handoffs(DAY + timedelta(hours=h), 16, rng, energy)
        )
    first, computed = build_gpu_hourly_counted(lake, [DAY])
    assert computed == [] and first[GPU_HOURLY.key(DAY)].num_rows > 1000
    for _ in range(3):
        assert build_gpu_hourly_counted(lake, [DAY])[0][GPU_HOURLY.key(DAY)].equals(
            first[GPU_HOURLY.key(DAY)]
        )
    monkeypatch.setattr(gpu_hour_parts, "FOOTER_KEY", "foxhunt.test.no_parts")  # every hour from its samples
    from_samples, computed = build_gpu_hourly_counted(lake, [DAY])
    assert len(computed) == 24 and from_samples[GPU_HOURLY.key(DAY)].equals(first[GPU_HOURLY.key(DAY)])
