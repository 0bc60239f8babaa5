from datetime import datetime, timezone

import pyarrow as pa

from foxhunt_obs.lib.lake import Lake
from foxhunt_obs.lib.schemas import GPU_SAMPLES
from foxhunt_obs.lib.tables.gpu import gpu_checks


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
    results = {r.name: r for r in gpu_checks({"2026-11-16T01": bad}, Lake(str(tmp_path)))}
    assert not results["values_in_range"].passed
    assert results["values_in_range"].metadata["util_out_of_range"] == 1
    assert results["values_in_range"].metadata["temperature_out_of_range"] == 1
    assert not results["unique_uuid_ts"].passed
    assert results["unique_uuid_ts"].metadata["duplicate_keys"] == 2
    assert results["not_empty_after_gpus"].passed


def test_checks_pass_on_clean_rows(tmp_path):
    good = _rows([0.0, 1.0, float("nan")], [30, 85, 50], ["a", "b", "c"], [T0, T0, T0])
    assert all(r.passed for r in gpu_checks({"2026-11-16T01": good}, Lake(str(tmp_path))))
