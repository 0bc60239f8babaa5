"""The counters' increments (energy, ECC) in gpu_samples, summed per GPU-hour and holder, without a sort.

A sample's increment is its counter minus the previous sample's of the same unit (uuid, node, gpu,
gpu_instance): where the counter fell, it was reset, and the new value is the increase since (as
Prometheus's increase() counts). A sample of day D looks back no further than the hour before D (the
partition D-1h), so a day's rows never depend on which other days a run computes. A time-sliced GPU has
one copy of its series per pod at a step: ordered pods first, then by vgpu and pod, the first copy takes
the increment and the others what their counters moved since it (nothing: the copies read the same
counters). NULL, NaN or ±Inf on either side is no increment.

Why not SQL's lag(): a window sorts every row it carries, and that sort was two thirds of gpu_hourly's
time (DuckDB 1.5, 64 GPUs: 4.7 s of CPU per week, bench/report.py). Here the hour partitions are read in
time order with only the columns the increments need, in batches of consecutive partitions; each unit's
last sample is carried to the next batch, and within a batch a sample's predecessor is found on a steps x
units grid (no sort: the ingest writes each partition step by step). Only a batch with several copies of
a unit at one step (time-slicing), or out of step order, is sorted, on integer codes.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from foxhunt_obs.lib.lake import Lake, LakeError
from foxhunt_obs.lib.schemas import GPU_SAMPLES

COUNTERS = ("energy_joules", "ecc_sbe_total", "ecc_dbe_total")
INCREMENTS = tuple(f"inc_{c}" for c in COUNTERS)  # the columns with_increments adds
_KEYS = ["ts", "uuid", "node", "gpu", "gpu_instance", "namespace", "pod", "experiment", "vgpu", *COUNTERS]
HOUR_MS = 3_600_000
READ_AHEAD = 3  # partitions read while one is worked on
BATCH_ROWS = 500_000  # samples worked on at once (~100 MB with every column gpu_hourly reads)
_EPOCH = datetime(1970, 1, 1).date()


def hours_to_read(days: Iterable[datetime]) -> list[datetime]:
    """Each day's hours and the hour before it (its seed), once each, in time order."""
    hours = set()
    for day in days:
        hours.update(day - timedelta(hours=1) + timedelta(hours=h) for h in range(25))
    return sorted(hours)


class _Codes:
    """A column of a batch as codes 0..len-1 and the values they stand for (None for NULL)."""

    def __init__(self, column: pa.ChunkedArray):
        if pa.types.is_integer(column.type):  # small ints (GPU index, MIG instance): offsets, no sort
            valid = pc.min_max(column)
            null = (valid["min"].as_py() if valid["min"].is_valid else 0) - 1  # below every value
            filled = pc.fill_null(column, null).to_numpy().astype(np.int64)
            self.codes = filled - null
            high = int(self.codes.max()) + 1 if len(filled) else 0
            self.values = [None, *range(null + 1, null + high)]
            return
        if not pa.types.is_dictionary(column.type):
            column = pc.dictionary_encode(column)
        if column.num_chunks > 1:  # row groups may each have a dictionary of their own
            column = pa.table({"c": column}).unify_dictionaries().column("c")
        chunks = column.chunks or [pa.array([], column.type)]
        dictionary = chunks[0].dictionary.to_pylist()
        self.values = [*dictionary, None]
        null = len(dictionary)
        self.codes = np.concatenate(
            [
                (pc.fill_null(c.indices, null) if c.null_count else c.indices).to_numpy().astype(np.int64)
                for c in chunks
            ]
        )

    def __len__(self) -> int:
        return len(self.values)


def _compact(key: np.ndarray, size: int) -> tuple[np.ndarray, int]:
    """key (values below size) renumbered 0..m-1 over the values present, and m. A lookup table where it
    is small (no sort), else np.unique."""
    if size <= max(4 * len(key), 1 << 20):
        seen = np.zeros(size, bool)
        seen[key] = True
        renumber = np.cumsum(seen) - 1
        return renumber[key], int(seen.sum())
    uniq, inverse = np.unique(key, return_inverse=True)
    return inverse.astype(np.int64), len(uniq)


def _combine(*codes: _Codes) -> tuple[np.ndarray, np.ndarray]:
    """The distinct combinations of the columns' codes present: (a row of each, each row's combination)."""
    key, size = _compact(codes[0].codes, len(codes[0]))
    for c in codes[1:]:
        key, size = _compact(key * len(c) + c.codes, size * len(c))
    rep = np.zeros(size, np.int64)
    rep[key] = np.arange(len(key))  # any row of a combination stands for it: their values are the same
    return rep, key


class _Units:
    """Codes for the units across a run's partitions, and each unit's last sample so far."""

    def __init__(self):
        self.code: dict[tuple, int] = {}
        self.last = np.full((0, len(COUNTERS)), np.nan)
        self.last_hour = np.zeros(0, np.int64)  # the partition hour (hours since the epoch) it came from

    def units(self, keys: list[tuple]) -> np.ndarray:
        out = np.array([self.code.setdefault(k, len(self.code)) for k in keys], np.int64)
        grow = len(self.code) - len(self.last)
        if grow > 0:
            self.last = np.vstack([self.last, np.full((grow, len(COUNTERS)), np.nan)])
            self.last_hour = np.concatenate([self.last_hour, np.full(grow, np.iinfo(np.int64).min)])
        return out


def _predecessors(ts: np.ndarray, unit: np.ndarray, n_units: int, tie: Callable[[], list[np.ndarray]]):
    """Each row's previous row of its unit in this batch (-1: none), and each unit's last row
    (-1: absent). Rows in step order, one per unit and step, use the grid; others are sorted."""
    n = len(ts)
    on_grid = bool(np.all(ts[1:] >= ts[:-1]))
    if on_grid:
        step_no = np.zeros(n, np.int64)
        np.cumsum(ts[1:] != ts[:-1], out=step_no[1:])
        steps = int(step_no[-1]) + 1
        # units reporting at steps of their own (not the ingest's grid) would make a grid of mostly holes
        on_grid = steps * n_units <= 4 * n + (1 << 20)
    if on_grid:
        cell = step_no * n_units + unit
        grid = np.full(steps * n_units, -1, np.int64)
        grid[cell] = np.arange(n)
        on_grid = bool(np.all(grid[cell] == np.arange(n)))  # else two rows share a cell: copies
    if on_grid:
        grid = grid.reshape(steps, n_units)
        # per step and unit, the step of the unit's latest row so far
        seen = np.where(grid >= 0, np.arange(steps)[:, None], -1)
        np.maximum.accumulate(seen, axis=0, out=seen)
        before = np.full(n, -1, np.int64)
        later = step_no > 0
        prev_step = seen[step_no[later] - 1, unit[later]]
        rows = np.flatnonzero(later)[prev_step >= 0]
        before[rows] = grid[prev_step[prev_step >= 0], unit[rows]]
        last = np.where(seen[-1] >= 0, grid[np.maximum(seen[-1], 0), np.arange(n_units)], -1)
        return before, last
    # several copies of a unit at one step (time-slicing), or rows out of step order: sort them
    order = np.lexsort((*tie()[::-1], ts, unit))
    sorted_unit = unit[order]
    first = np.ones(n, bool)
    first[1:] = sorted_unit[1:] != sorted_unit[:-1]
    before = np.full(n, -1, np.int64)
    before[order[~first]] = order[np.flatnonzero(~first) - 1]
    is_last = np.ones(n, bool)
    is_last[:-1] = first[1:]
    last = np.full(n_units, -1, np.int64)
    last[sorted_unit[is_last]] = order[is_last]
    return before, last


def _tie_keys(pod: _Codes, vgpu: _Codes) -> list[np.ndarray]:
    """The order of a time-sliced GPU's copies at one step: pods before '' (no pod), then by vgpu, then
    by pod, NULLs last (the old window's ORDER BY pod = '', vgpu, pod)."""

    def rank(c: _Codes) -> np.ndarray:
        order = sorted(range(len(c)), key=lambda i: (c.values[i] is None, c.values[i] or ""))
        r = np.empty(len(order), np.int64)
        r[order] = np.arange(len(order))
        return r[c.codes]

    blank = np.array([0 if v else (1 if v == "" else 2) for v in pod.values])[pod.codes]
    return [blank, rank(vgpu), rank(pod)]


def with_increments(lake: Lake, days: list[datetime], columns: Iterable[str]) -> Iterator[pa.Table]:
    """The days' samples (`columns`, in GPU_SAMPLES' types; NULL where a partition predates a column) with
    INCREMENTS added, in batches of whole hour partitions, in time order."""
    wanted = np.array(sorted({(d.date() - _EPOCH).days for d in days}))
    read = list(dict.fromkeys([*_KEYS, *columns]))
    state, batch = _Units(), []

    def done() -> pa.Table | None:
        try:
            return _one_batch(batch, state, wanted, read)
        except Exception as e:
            keys = f"{GPU_SAMPLES.key(batch[0][0])}..{GPU_SAMPLES.key(batch[-1][0])}"
            raise LakeError(
                f"lake {lake.root}, table {GPU_SAMPLES.name}, partitions hour={keys}: {e!r}"
            ) from e

    hours = hours_to_read(days)
    for hour, table in zip(hours, _read_ahead(lambda h: _read(lake, h, read), hours)):
        if table is not None and table.num_rows:
            batch.append((hour, table))
            # partitions in batches (a day of 64 GPUs): the work per call, not per row, was most of it
            if sum(t.num_rows for _, t in batch) >= BATCH_ROWS:
                if (out := done()) is not None:
                    yield out
                batch.clear()
    if batch and (out := done()) is not None:
        yield out


def _read(lake: Lake, hour: datetime, columns: list[str]) -> pa.Table | None:
    """The partition's columns in today's types (labels written as plain strings before they were
    dictionaries), every row in the partition's hour: a row elsewhere would make a day's increments depend
    on which days a run reads, so it stops the run, naming the partition."""
    key = GPU_SAMPLES.key(hour)
    # decoded on one thread: this runs beside the DuckDB aggregation (hourly_rollup)
    table = lake.read_partition(GPU_SAMPLES, key, columns, use_threads=False)
    if table is None:
        return None
    table = table.cast(pa.schema([GPU_SAMPLES.schema.field(name) for name in table.column_names]))
    ts = pc.cast(table.column("ts"), pa.int64())
    start = int(hour.timestamp()) * 1000
    outside = pc.sum(pc.invert(pc.and_(pc.greater_equal(ts, start), pc.less(ts, start + HOUR_MS)))).as_py()
    if table.column("ts").null_count or outside:
        what = "a NULL ts" if table.column("ts").null_count else f"{outside} samples outside the hour"
        raise LakeError(f"lake {lake.root}, table {GPU_SAMPLES.name}, partition hour={key}: {what}")
    return table


def _read_ahead(read: Callable, items: list, depth: int = READ_AHEAD):
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


def _one_batch(
    batch: list[tuple[datetime, pa.Table]], state: _Units, wanted: np.ndarray, columns: list[str]
) -> pa.Table | None:
    """Consecutive partitions' rows of the wanted days with their INCREMENTS; their units' last samples
    carried in state."""
    table = pa.concat_tables([t for _, t in batch], promote_options="permissive")
    n = table.num_rows
    for name in columns:  # a column no partition of the batch has yet: NULL, as the lake's views read it
        if name not in table.column_names:
            table = table.append_column(
                GPU_SAMPLES.schema.field(name), pa.nulls(n, GPU_SAMPLES.schema.field(name).type)
            )
    # the partition (hours since the epoch) of each row: a predecessor counts from the hour before its day
    part_hour = np.repeat([int(h.timestamp()) // 3600 for h, _ in batch], [t.num_rows for _, t in batch])

    def codes(name: str) -> _Codes:
        return _Codes(table.column(name))

    uuid, node, gpu, inst = codes("uuid"), codes("node"), codes("gpu"), codes("gpu_instance")
    ts = pc.cast(table.column("ts"), pa.int64()).to_numpy()
    vals = np.column_stack([table.column(c).to_numpy().astype(np.float64) for c in COUNTERS])
    # units: codes in this batch (local), and across the batches of the run (glob)
    rep, local = _combine(uuid, node, gpu, inst)
    glob = state.units(
        [(uuid.values[uuid.codes[r]], node.values[node.codes[r]], gpu.values[gpu.codes[r]],
          inst.values[inst.codes[r]]) for r in rep]
    )  # fmt: skip

    def tie() -> list[np.ndarray]:
        return _tie_keys(codes("pod"), codes("vgpu"))

    before, last = _predecessors(ts, local, len(rep), tie)
    # a predecessor counts from the hour before the row's day on: a day's rows never depend on the run
    day_no = ts // (24 * HOUR_MS)
    first_hour = day_no * 24 - 1
    prev = np.full((n, len(COUNTERS)), np.nan)
    has = before >= 0
    has[has] = part_hour[before[has]] >= first_hour[has]
    prev[has] = vals[before[has]]
    # a unit's first row here: its last sample in an earlier batch
    g = glob[local]
    carried = (before < 0) & (state.last_hour[g] >= first_hour)
    prev[carried] = state.last[g[carried]]
    inc = vals - prev
    inc = np.where(inc < 0, vals, inc)  # it fell: a reset, and the new value is the increase since
    # NULL, NaN or ±Inf on either side: no increment (the window SQL made the hour's sum NaN, or the
    # gpu_hourly row's energy 5e301 from an Inf: a number the cost allocation then used)
    inc = np.where(np.isfinite(vals) & np.isfinite(prev), inc, 0.0)
    present = last >= 0
    state.last[glob[present]] = vals[last[present]]
    state.last_hour[glob[present]] = part_hour[last[present]]

    for j, name in enumerate(INCREMENTS):
        table = table.append_column(name, pa.array(inc[:, j]))
    keep = np.isin(day_no, wanted)  # the seed hours' rows only carried their samples
    if keep.all():
        return table
    return table.filter(pa.array(keep)) if keep.any() else None
