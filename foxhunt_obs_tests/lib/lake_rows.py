"""Rows for lakes built by hand in the cost tests: a node's hour of node_samples."""

from datetime import datetime, timedelta

import pyarrow as pa

from foxhunt_obs.lib.schemas import NODE_SAMPLES


def node_hour(
    start: datetime, node: str, gpus: int, step_s: float, instance_type: str = "p4de.24xlarge"
) -> pa.Table:
    """One hour of node_samples for one node, a row every step_s, on instance i-0abc."""
    rows = [
        dict(ts=start + timedelta(seconds=i * step_s), node=node, instance_type=instance_type, instance_id="i-0abc",
             gpus_reporting=gpus, gpu_node_up=True, step_seconds=step_s)
        for i in range(int(3600 // step_s))
    ]  # fmt: skip
    return pa.Table.from_pylist(rows, schema=NODE_SAMPLES.schema)
