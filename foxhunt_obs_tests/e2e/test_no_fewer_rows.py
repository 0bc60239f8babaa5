"""A green run never replaces good rows with fewer: a Prometheus that no longer has the hour
(retention passed, the wrong server) answers with nothing, and the partition the lake has must stay,
unless the run says allow_fewer_rows."""

from __future__ import annotations

from pathlib import Path

import dagster as dg

from foxhunt_obs.definitions import defs
from foxhunt_obs.lib.lake import Lake
from foxhunt_obs.lib.schemas import GPU_SAMPLES, NODE_SAMPLES
from foxhunt_obs.sandbox.servers.prometheus import PrometheusServer


def _run(partition: str, run_config: dict | None = None) -> dg.ExecuteInProcessResult:
    tags = {"dagster/asset_partition_range_start": partition, "dagster/asset_partition_range_end": partition}
    return (
        defs()
        .resolve_job_def("gpu_ingest_job")
        .execute_in_process(
            instance=dg.DagsterInstance.ephemeral(), tags=tags, run_config=run_config, raise_on_error=False
        )
    )


def test_an_empty_answer_does_not_replace_a_full_partition(small, prometheus, tmp_path, monkeypatch):
    lake = Lake(str(tmp_path / "lake"))
    monkeypatch.setenv("FOXHUNT_LAKE", lake.root)
    monkeypatch.setenv("FOXHUNT_PROMETHEUS_URL", prometheus.url)
    partition = small.start.strftime("%Y-%m-%d-%H:00")
    key = small.start.strftime("%Y-%m-%dT%H")
    assert _run(partition).success
    files = {s: Path(lake.root, s.name, f"hour={key}", "part-0.parquet") for s in (GPU_SAMPLES, NODE_SAMPLES)}
    before = {s: f.read_bytes() for s, f in files.items()}
    assert lake.read_partition(GPU_SAMPLES, key).num_rows > 0

    with PrometheusServer(tmp_path / "empty-tsdb", workdir=tmp_path / "empty") as empty:  # the wrong server
        monkeypatch.setenv("FOXHUNT_PROMETHEUS_URL", empty.url)
        refused = _run(partition)
        assert not refused.success
        message = "\n".join(
            e.step_failure_data.error.message for e in refused.all_events if e.is_step_failure
        )
        assert f"gpu_samples partition {key}: the source answered 0 rows where the lake has" in message
        assert "allow_fewer_rows" in message
        assert {s: f.read_bytes() for s, f in files.items()} == before  # untouched

        config = {"ops": {a: {"config": {"allow_fewer_rows": True}} for a in ("gpu_samples", "node_samples")}}
        assert _run(partition, config).success  # said on purpose: replaced
        assert lake.read_partition(GPU_SAMPLES, key).num_rows == 0
