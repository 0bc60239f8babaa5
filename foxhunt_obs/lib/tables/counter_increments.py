"""The counters' increments (energy, ECC) in gpu_samples within each unit-hour, without a sort.

A sample's increment is its counter minus the previous sample's of the same unit (uuid, node, gpu,
gpu_instance): where the counter fell, it was reset, and the new value is the increase since (as
Prometheus's increase() counts). A time-sliced GPU has one copy of its series per pod at a step: ordered
pods first, then by vgpu and pod, the first copy takes the increment and the others what their counters
moved since it (nothing: the copies read the same counters). NULL, NaN or ±Inf on either side is no
increment. Here a unit-hour's first sample gets none: its increment from the hours before comes from the
parts of those hours (gpu_hour_parts.py), by the same rule.

Why not SQL's lag(): a window sorts every row it carries, and that sort was two thirds of gpu_hourly's
time (DuckDB 1.5, 64 GPUs: 4.7 s of CPU per week, bench/report.py). Here a sample's predecessor is found
on a steps x units grid (no sort: the ingest writes each partition step by step, and partitions come in
time order). Only rows with several copies of a unit at one step (time-slicing), or out of step order,
are sorted, on integer codes.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

COUNTERS = ("energy_joules", "ecc_sbe_total", "ecc_dbe_total")
INCREMENTS = tuple(f"inc_{c}" for c in COUNTERS)  # in_hour_increments' columns, in gpu_hour_parts


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


def _combine(*codes: _Codes) -> tuple[np.ndarray, int]:
    """Each row's combination of the columns' codes, numbered 0..m-1 over those present, and m."""
    key, size = _compact(codes[0].codes, len(codes[0]))
    for c in codes[1:]:
        key, size = _compact(key * len(c) + c.codes, size * len(c))
    return key, size


def _predecessors(
    ts: np.ndarray, unit: np.ndarray, n_units: int, tie: Callable[[], list[np.ndarray]]
) -> np.ndarray:
    """Each row's previous row of its unit in this batch (-1: none). Rows in step order, one per unit
    and step, use the grid; others are sorted."""
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
        return before
    # several copies of a unit at one step (time-slicing), or rows out of step order: sort them
    order = np.lexsort((*tie()[::-1], ts, unit))
    sorted_unit = unit[order]
    first = np.ones(n, bool)
    first[1:] = sorted_unit[1:] != sorted_unit[:-1]
    before = np.full(n, -1, np.int64)
    before[order[~first]] = order[np.flatnonzero(~first) - 1]
    return before


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


def in_hour_increments(table: pa.Table, part_hour: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For samples of whole hour partitions (part_hour: each row's, in hours since the epoch): each row's
    increments within its unit-hour (rows x COUNTERS; 0 for a unit-hour's first row, whose increment from
    the hours before is added from the parts, lib/tables/gpu_hour_parts.py), and which rows are their
    unit-hour's first and last."""
    n = table.num_rows
    if n == 0:
        return np.zeros((0, len(COUNTERS))), np.zeros(0, bool), np.zeros(0, bool)

    def codes(name: str) -> _Codes:
        return _Codes(table.column(name))

    ts = pc.cast(table.column("ts"), pa.int64()).to_numpy()
    vals = np.column_stack([table.column(c).to_numpy().astype(np.float64) for c in COUNTERS])
    unit, n_units = _combine(codes("uuid"), codes("node"), codes("gpu"), codes("gpu_instance"))
    before = _predecessors(ts, unit, n_units, lambda: _tie_keys(codes("pod"), codes("vgpu")))
    same = before >= 0
    same[same] = part_hour[before[same]] == part_hour[same]
    first = ~same
    last = np.ones(n, bool)
    last[before[same]] = False
    inc = np.zeros((n, len(COUNTERS)))
    rows = np.flatnonzero(same)
    now, prev = vals[rows], vals[before[rows]]
    step = now - prev
    step = np.where(step < 0, now, step)  # it fell: a reset, and the new value is the increase since
    # NULL, NaN or ±Inf on either side: no increment (the window SQL made the hour's sum NaN, or the
    # gpu_hourly row's energy 5e301 from an Inf: a number the cost allocation then used)
    inc[rows] = np.where(np.isfinite(now) & np.isfinite(prev), step, 0.0)
    return inc, first, last
