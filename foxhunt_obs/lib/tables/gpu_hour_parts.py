"""gpu_samples' hours summed per GPU-hour and holder: the parts gpu_hourly is made of, kept in each
partition file's footer by the ingest.

A part row is what gpu_hourly sums for one unit-hour (uuid, node, gpu, gpu_instance) and holder: counts,
seconds, means, maxima, the p95 of util, and the counters' increments within the hour (see
counter_increments.py), with the unit-hour's first and last counter readings. gpu_hourly reads a day's 25
footers instead of the day's samples and adds each unit-hour's increment from the hour before: its first
reading minus the unit's last one before it, by the rule that holds within an hour (a fall is a reset;
NULL, NaN or ±Inf is no increment), and looking back no further than the hour before the day, so a day's
rows never depend on the run's other days. A time-sliced GPU's first copy (pods first, then by vgpu and
pod) takes that increment, as within the hour.

The parts are written in the same file as the samples they sum (write_gpu_samples), so they are replaced
with them and never disagree with them. A partition without them (written before they existed, or by
another writer) has them computed from its samples when gpu_hourly reads it, in batches of partitions;
so has one whose parts are not of its hour (a file copied under another hour's key: its samples are then
refused, naming it). FOOTER_KEY carries a fingerprint of the code that sums the parts: parts written by
other code are not read, but computed again from their samples.
"""

from __future__ import annotations

import hashlib
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext
from datetime import datetime, timedelta
from functools import cache
from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from foxhunt_obs.lib.duck import scratch
from foxhunt_obs.lib.lake import Lake, LakeError, WriteResult
from foxhunt_obs.lib.names import UNATTRIBUTED
from foxhunt_obs.lib.schemas import GPU_SAMPLES
from foxhunt_obs.lib.tables import counter_increments
from foxhunt_obs.lib.tables.counter_increments import COUNTERS, INCREMENTS, in_hour_increments


def _fingerprint() -> str:
    """What a part row depends on: the code that sums it (this module and counter_increments, SQL and
    all) and the label of what no pod held. Any change gives a new FOOTER_KEY."""
    digest = hashlib.sha256(UNATTRIBUTED.encode())
    for module in (__file__, counter_increments.__file__):
        digest.update(Path(module).read_bytes())
    return digest.hexdigest()[:16]


FOOTER_KEY = f"foxhunt.gpu_hour_parts.{_fingerprint()}"
HOUR_MS = 3_600_000
READ_AHEAD = 3  # partitions read while one is worked on
BATCH_ROWS = 500_000  # samples worked on at once (~100 MB with every column the parts read)

COLUMNS = [
    "ts", "uuid", "node", "gpu", "gpu_instance", "model", "gpu_profile", "gpu_share", "util_basis", "namespace",
    "pod", "experiment", "run_id", "vgpu", "step_seconds", "step_share", "temp_celsius", "power_watts",
    "mem_used_bytes", "util", "sm_active", "tensor_active", *COUNTERS,
]  # fmt: skip

_PARTS = """
-- One batch of whole hour partitions. Partitions written before the MIG, time-slicing and SM columns
-- existed read them as NULL: a whole GPU, one row per step. Hours as integers (hours since the epoch;
-- ts is after 1970, so // is the floor): date_trunc('hour', ts) on a TIMESTAMPTZ goes through ICU's
-- calendar for every sample, some 15x slower.
WITH s AS (
  SELECT epoch_ms(ts) // 3600000 AS hour_no, uuid, node, gpu, gpu_instance, model,
    coalesce(gpu_profile, '') AS gpu_profile, coalesce(gpu_share, 1.0) AS gpu_share,
    coalesce(util_basis, '') AS util_basis, coalesce(namespace, '') AS namespace, coalesce(pod, '') AS pod,
    experiment, coalesce(run_id, '') AS run_id,
    step_seconds * coalesce(step_share, 1.0) AS secs,
    CASE WHEN coalesce(step_share, 1.0) > 0 THEN step_seconds ELSE 0 END AS wall,
    temp_celsius, power_watts, mem_used_bytes,
    CASE WHEN isnan(util) THEN NULL ELSE util END AS u,
    CASE WHEN isnan(sm_active) THEN NULL ELSE sm_active END AS sm,
    CASE WHEN isnan(tensor_active) THEN NULL ELSE tensor_active END AS tensor,
    inc_energy_joules, inc_ecc_sbe_total, inc_ecc_dbe_total, is_first, is_last,
    energy_joules, ecc_sbe_total, ecc_dbe_total
  FROM batch
)
SELECT hour_no, node, gpu, uuid, gpu_instance, namespace, pod,
  CASE WHEN pod = '' THEN $unattributed ELSE experiment END AS experiment,
  max(run_id) AS run_id, max(model) AS model,
  max(gpu_profile) AS gpu_profile, max(gpu_share) AS gpu_share,
  coalesce(max(util_basis) FILTER (WHERE u IS NOT NULL), '') AS util_basis,
  count(*) AS samples,
  sum(secs) AS seconds_with_data,
  coalesce(sum(secs) FILTER (WHERE u IS NOT NULL), 0) AS activity_seconds,
  avg(u) AS util_mean,
  quantile_cont(u, 0.95) AS util_p95,
  -- GPU-seconds: a slice's activity counts for its share of the GPU; NULL where no util was reported
  sum(u * secs) * max(gpu_share) AS active_gpu_seconds,
  coalesce(sum(secs) FILTER (WHERE sm IS NOT NULL), 0) AS sm_activity_seconds,
  sum(sm * secs) * max(gpu_share) AS sm_active_gpu_seconds,
  sum(tensor * secs) * max(gpu_share) AS tensor_active_gpu_seconds,
  CASE WHEN pod = '' THEN 0 ELSE sum(secs) END AS held_seconds,
  -- wall-clock seconds the pod was on the GPU (a time-sliced step counts whole): runs' windows compare to it
  CASE WHEN pod = '' THEN 0 ELSE sum(wall) END AS held_wall_seconds,
  sum(power_watts * secs) AS watt_seconds,
  bool_and(power_watts IS NOT NULL OR secs = 0) AS power_complete,
  max(temp_celsius) AS temp_max_celsius,
  avg(power_watts) AS power_mean_watts,
  max(mem_used_bytes) AS mem_used_max_bytes,
  -- within the hour; the unit-hour's first reading and its last, for the increment from the hour before
  sum(inc_energy_joules) AS inc_energy_joules,
  sum(inc_ecc_sbe_total) AS inc_ecc_sbe_total,
  sum(inc_ecc_dbe_total) AS inc_ecc_dbe_total,
  bool_or(is_first) AS takes_first,
  max(energy_joules) FILTER (WHERE is_first) AS first_energy_joules,
  max(ecc_sbe_total) FILTER (WHERE is_first) AS first_ecc_sbe_total,
  max(ecc_dbe_total) FILTER (WHERE is_first) AS first_ecc_dbe_total,
  bool_or(is_last) AS holds_last,
  max(energy_joules) FILTER (WHERE is_last) AS last_energy_joules,
  max(ecc_sbe_total) FILTER (WHERE is_last) AS last_ecc_sbe_total,
  max(ecc_dbe_total) FILTER (WHERE is_last) AS last_ecc_dbe_total
FROM s
GROUP BY hour_no, node, gpu, uuid, gpu_instance, namespace, pod, 8
ORDER BY hour_no, node, gpu, uuid, gpu_instance, namespace, pod, experiment
"""


def hour_parts(con: duckdb.DuckDBPyConnection, samples: pa.Table, part_hour: np.ndarray) -> pa.Table:
    """The part rows of whole hour partitions' samples (COLUMNS; part_hour: each row's partition, in hours
    since the epoch), in time order."""
    return _sum_parts(con, _with_increments(samples, part_hour))


def _with_increments(samples: pa.Table, part_hour: np.ndarray) -> pa.Table:
    inc, first, last = in_hour_increments(samples, part_hour)
    for j, name in enumerate(INCREMENTS):
        samples = samples.append_column(name, pa.array(inc[:, j]))
    return samples.append_column("is_first", pa.array(first)).append_column("is_last", pa.array(last))


def _sum_parts(con: duckdb.DuckDBPyConnection, batch: pa.Table) -> pa.Table:
    # one thread, rows in order: the same sums in the same order on every run, so a re-run writes the
    # same bytes (numpy works on the next batch meanwhile, on the other core)
    con.execute("SET threads = 1")
    con.register("batch", batch)
    try:
        return con.execute(_PARTS, {"unattributed": UNATTRIBUTED}).to_arrow_table()
    finally:
        con.unregister("batch")


@cache
def parts_schema() -> pa.Schema:
    with scratch() as con:
        return hour_parts(con, GPU_SAMPLES.schema.empty_table().select(COLUMNS), np.zeros(0, np.int64)).schema


def outside_the_hour(table: pa.Table, hour: datetime) -> str:
    """Why some of a partition's rows are not of its hour ('' when all are): a row elsewhere would make a
    day's increments depend on which days a run reads."""
    if table.column("ts").null_count:
        return "a NULL ts"
    ts = pc.cast(table.column("ts"), pa.int64())
    start = int(hour.timestamp()) * 1000
    outside = pc.sum(pc.invert(pc.and_(pc.greater_equal(ts, start), pc.less(ts, start + HOUR_MS)))).as_py()
    return f"{outside} samples outside the hour" if outside else ""


def write_gpu_samples(
    lake: Lake, hour: datetime, table: pa.Table, con: duckdb.DuckDBPyConnection | None = None
) -> WriteResult:
    """The ingest's write of an hour partition of gpu_samples (GPU_SAMPLES' columns), with its parts.
    `con`: a scratch connection to sum them in (a new one costs ~10 ms, as much as an hour's sums)."""
    key = GPU_SAMPLES.key(hour)
    table = lake.conform(GPU_SAMPLES, key, table)  # the parts of the rows as the file will hold them
    if why := outside_the_hour(table, hour):
        raise LakeError(f"lake {lake.root}, table {GPU_SAMPLES.name}, partition hour={key}: {why}")
    part_hour = np.full(table.num_rows, int(hour.timestamp()) // 3600)
    with nullcontext(con) if con is not None else scratch() as sums:
        parts = _named(lake, [hour], lambda: hour_parts(sums, table.select(COLUMNS), part_hour))
    return lake.write_partition(GPU_SAMPLES, key, table, footer={FOOTER_KEY: parts})


def read_parts(lake: Lake, hours: Sequence[datetime]) -> tuple[list[pa.Table], list[datetime]]:
    """The parts of each of `hours` that has a partition (in time order), and the hours whose parts were
    computed from their samples (no parts in the footer, parts of other code, or of another hour)."""
    found: dict[datetime, pa.Table] = {}
    missing = []
    for hour, (exists, parts) in zip(
        hours, read_ahead(lambda h: lake.read_footer(GPU_SAMPLES, GPU_SAMPLES.key(h), FOOTER_KEY), hours)
    ):
        if parts is not None and _of_hour(parts, hour):
            found[hour] = parts
        elif exists:  # summed from the samples, which are checked to be of the hour
            missing.append(hour)
    found.update(_computed_parts(lake, missing))
    return [found[h] for h in hours if h in found], missing


def _of_hour(parts: pa.Table, hour: datetime) -> bool:
    """Whether footer parts are today's parts of this hour: a file copied under another hour's key keeps
    the parts of its own (and its rows, which the samples' check then refuses)."""
    if not parts.schema.equals(parts_schema()):
        return False
    return bool(pc.all(pc.equal(parts.column("hour_no"), int(hour.timestamp()) // 3600)).as_py())


def _computed_parts(lake: Lake, hours: list[datetime]) -> Iterator[tuple[datetime, pa.Table]]:
    """(hour, parts) from the partitions' samples (hours in time order), in batches of partitions (the work
    per call, not per row, was most of it); numpy adds the increments to a batch while DuckDB sums the one
    before."""
    with scratch() as con, ThreadPoolExecutor(1) as pool:
        # `con` is the worker's until the last batch is summed; DuckDB releases the GIL meanwhile
        pending: deque = deque()
        for hours_in, batch in _batches(lake, hours):
            pending.append((hours_in, pool.submit(_sum_parts, con, batch)))
            if len(pending) > 1:  # memory: a batch summed, one waiting, one being built
                yield from _split(lake, *pending.popleft())
        while pending:
            yield from _split(lake, *pending.popleft())


def _split(lake: Lake, hours: list[datetime], future) -> Iterator[tuple[datetime, pa.Table]]:
    parts = _named(lake, hours, future.result)
    hour_no = parts.column("hour_no")
    for hour in hours:
        yield hour, parts.filter(pc.equal(hour_no, int(hour.timestamp()) // 3600))


def _named(lake: Lake, hours: list[datetime], work: Callable):
    """work(), its error naming the partitions."""
    try:
        return work()
    except LakeError:
        raise
    except Exception as e:
        keys = f"{GPU_SAMPLES.key(hours[0])}..{GPU_SAMPLES.key(hours[-1])}"
        raise LakeError(f"lake {lake.root}, table {GPU_SAMPLES.name}, partitions hour={keys}: {e!r}") from e


def _batches(lake: Lake, hours: list[datetime]) -> Iterator[tuple[list[datetime], pa.Table]]:
    """The partitions' samples with their increments (each within its hour), about BATCH_ROWS at a time."""
    batch: list[tuple[datetime, pa.Table]] = []

    def done() -> tuple[list[datetime], pa.Table]:
        hours_in = [h for h, _ in batch]
        samples = pa.concat_tables([t for _, t in batch])
        part_hour = np.repeat([int(h.timestamp()) // 3600 for h in hours_in], [t.num_rows for _, t in batch])
        return hours_in, _named(lake, hours_in, lambda: _with_increments(samples, part_hour))

    for hour, table in zip(hours, read_ahead(lambda h: _read(lake, h), hours)):
        batch.append((hour, table))
        if sum(t.num_rows for _, t in batch) >= BATCH_ROWS:
            yield done()
            batch = []
    if batch:
        yield done()


def _read(lake: Lake, hour: datetime) -> pa.Table:
    """The partition's COLUMNS in today's types (labels written as plain strings before they were
    dictionaries; a column written before it existed as NULL), every row in the partition's hour."""
    key = GPU_SAMPLES.key(hour)
    # decoded on one thread: this runs beside the DuckDB aggregation
    table = lake.read_partition(GPU_SAMPLES, key, COLUMNS, use_threads=False)
    if table is None:
        raise LakeError(f"lake {lake.root}, table {GPU_SAMPLES.name}, partition hour={key}: gone while read")
    if why := outside_the_hour(table, hour):
        raise LakeError(f"lake {lake.root}, table {GPU_SAMPLES.name}, partition hour={key}: {why}")
    fields = [GPU_SAMPLES.schema.field(name) for name in COLUMNS]
    return pa.table(
        [table.column(f.name).cast(f.type) if f.name in table.column_names else pa.nulls(table.num_rows, f.type)
         for f in fields],
        schema=pa.schema(fields),
    )  # fmt: skip


def hours_to_read(days: Iterable[datetime]) -> list[datetime]:
    """Each day's hours and the hour before it (its seed), once each, in time order."""
    hours = set()
    for day in days:
        hours.update(day - timedelta(hours=1) + timedelta(hours=h) for h in range(25))
    return sorted(hours)


def read_ahead(read: Callable, items: list, depth: int = READ_AHEAD):
    """read(item) for each item in order, the next `depth` read meanwhile (an S3 GET waits on the network;
    a local read decodes with the GIL released), never more than depth + 1 partitions in memory."""
    with ThreadPoolExecutor(depth) as pool:
        pending: deque = deque()
        for item in items:
            pending.append(pool.submit(read, item))
            if len(pending) > depth:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()
