from datetime import datetime, timezone

import pyarrow as pa

from foxhunt_obs.lib.lake import Lake
from foxhunt_obs.lib.schemas import GPU_SAMPLES
from foxhunt_obs.lib.tables.gpu import RunTally, gpu_checks


def _rows(util, temp, uuids, ts):
    n = len(util)
    cols = {f.name: pa.nulls(n, f.type) for f in GPU_SAMPLES.schema}
    cols["util"] = pa.array(util, pa.float64())
    cols["temp_celsius"] = pa.array(temp, pa.float64())
    cols["uuid"] = pa.array(uuids).dictionary_encode().cast(GPU_SAMPLES.schema.field("uuid").type)
    cols["ts"] = pa.array(ts, GPU_SAMPLES.schema.field("ts").type)
    return pa.table(cols, schema=GPU_SAMPLES.schema)


T0 = datetime(2026, 11, 16, 1, tzinfo=timezone.utc)


def test_checks_flag_out_of_range_values_and_duplicates(tmp_path):
    bad = _rows([0.5, 1.5, float("nan"), 0.2], [40, 40, 140, 40], ["a", "a", "b", "b"], [T0, T0, T0, T0])
    results = {r.name: r for r in gpu_checks(RunTally.of({"2026-11-16T01": bad}), Lake(str(tmp_path)))}
    assert not results["values_in_range"].passed
    assert results["values_in_range"].metadata["util_out_of_range"] == 1
    assert results["values_in_range"].metadata["temperature_out_of_range"] == 1
    assert not results["unique_uuid_ts"].passed
    assert results["unique_uuid_ts"].metadata["duplicate_keys"] == 2
    assert results["not_empty_after_gpus"].passed


def test_checks_pass_on_clean_rows(tmp_path):
    good = _rows([0.0, 1.0, float("nan")], [30, 85, 50], ["a", "b", "c"], [T0, T0, T0])
    assert all(r.passed for r in gpu_checks(RunTally.of({"2026-11-16T01": good}), Lake(str(tmp_path))))


def test_the_run_tally_summed_hour_by_hour_equals_the_whole_runs_figures(tmp_path):
    """gpu_samples adds each hour to a RunTally as it is written: its checks and summary are the figures
    one query over the whole run gives (NaN and NULL readings, a NULL experiment, an empty hour)."""
    import duckdb
    import numpy as np

    from foxhunt_obs.lib.tables.gpu import _gpu_summary

    rng = np.random.default_rng(3)
    tables = {}
    for h in range(4):
        n = 0 if h == 2 else 50
        util = rng.uniform(-0.1, 1.1, n)
        util[3::15] = np.nan  # rows of e0 only
        t = _rows(
            util, rng.uniform(-30, 140, n), [f"u{i % 9}" for i in range(n)], [T0.replace(hour=1 + h)] * n
        )
        step = {"step_seconds": 15.0, "step_share": 0.5, "gpu_share": 1.0}
        for name, v in step.items():
            t = t.set_column(t.schema.get_field_index(name), name, pa.array(np.full(n, v)))
        exp = pa.array([None if i % 5 == 0 else f"e{i % 3}" for i in range(n)], pa.string())
        node = pa.array([f"n{i % 4}" for i in range(n)], pa.string())
        for name, col in (("experiment", exp), ("node", node)):
            typ = GPU_SAMPLES.schema.field(name).type
            t = t.set_column(t.schema.get_field_index(name), name, col.dictionary_encode().cast(typ))
        tables[f"2026-11-16T{1 + h:02d}"] = t
    tally = RunTally.of(tables)
    checks = {c.name: c.metadata for c in gpu_checks(tally, Lake(str(tmp_path)))}
    summary = _gpu_summary(tally, "lake")

    con = duckdb.connect()
    con.register("t", pa.concat_tables(tables.values()))
    rows, gpus, nodes, bad_util, bad_temp, nan_util = con.execute(
        """SELECT count(*), count(DISTINCT uuid), count(DISTINCT node),
             count(*) FILTER (WHERE NOT isnan(util) AND (util < 0 OR util > 1)),
             count(*) FILTER (WHERE NOT isnan(temp_celsius) AND (temp_celsius < -20 OR temp_celsius > 130)),
             count(*) FILTER (WHERE isnan(util)) FROM t"""
    ).fetchone()
    dupes = con.execute(
        "SELECT count(*) FROM (SELECT uuid, gpu_instance, vgpu, ts FROM t GROUP BY ALL HAVING count(*) > 1)"
    ).fetchone()[0]
    assert (
        (summary["dagster/row_count"], summary["gpus"], summary["nodes"])
        == (rows, gpus, nodes)
        == (150, 9, 4)
    )
    assert checks["values_in_range"] == {
        "util_out_of_range": bad_util, "temperature_out_of_range": bad_temp, "util_nan": nan_util
    }  # fmt: skip
    assert bad_util > 0 and bad_temp > 0 and nan_util > 0
    assert checks["unique_uuid_ts"] == {"duplicate_keys": dupes} and dupes > 0
    assert checks["not_empty_after_gpus"]["empty_hours_after_gpus"] == "2026-11-16T03"
    per_exp = con.execute(
        """SELECT experiment, count(DISTINCT uuid), avg(util),
             sum(util * step_seconds * step_share * gpu_share) / 3600 FROM t GROUP BY 1 ORDER BY 1"""
    ).fetchall()
    assert len(per_exp) == 4  # e0, e1, e2 and NULL
    table = summary["experiments"].splitlines()[2:]
    cells = [[c.strip() for c in line.split("|")[1:5]] for line in table]
    assert [c[0] for c in cells] == ["e0", "e1", "e2", ""]  # NULL last, as ORDER BY has it
    assert [int(c[1]) for c in cells] == [g for _, g, _, _ in per_exp]
    assert cells[0][2:] == ["nan", "nan"]  # a NaN reading makes e0's mean NaN, as avg() does
    for c, (_, _, mean, active) in zip(cells[1:], per_exp[1:]):
        assert float(c[2]) == round(mean, 3) and float(c[3]) == round(active, 2)
