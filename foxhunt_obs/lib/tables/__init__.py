"""One plain function per lake table: it reads the lake (and its sources), writes the table's partitions
and returns what the asset shows — a `Built`. No Dagster here: `foxhunt_obs/assetkit.py` turns a `Built`
into the asset's materialization and check results, and `bench/` calls the same functions."""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd
import pyarrow as pa

from foxhunt_obs.lib.errors import InputError


class Markdown(str):
    """Metadata shown as Markdown (a table, or a word such as 'none')."""


class LakePath(str):
    """Metadata shown as a path (a file the run wrote to the lake)."""


class MissingInput(InputError, ValueError):
    """A table's inputs are not there yet (an upstream partition was never materialized): the message says
    which and what to run."""


@dataclass(frozen=True)
class Check:
    name: str
    passed: bool
    metadata: dict[str, object] = field(default_factory=dict)
    severity: str = "ERROR"  # or "WARN"


@dataclass
class Built:
    """What one run of a table's function wrote and found: its partitions (already in the lake), the
    figures its asset shows (int, float, str, Markdown), and its checks. A function whose run would hold
    too much to keep every table (gpu_samples: 24 hours of 1,024 GPUs are ~1.5 GB) keeps none, and gives
    each partition's row count in `counts` instead."""

    partitions: dict[str, pa.Table]
    summary: dict[str, object]
    checks: list[Check] = field(default_factory=list)
    extra: dict[str, object] = field(default_factory=dict)  # facts for callers, not shown (the bench's)
    counts: dict[str, int] | None = None  # partition -> rows, where `partitions` is not kept

    @property
    def written(self) -> list[str]:
        """The partitions the run wrote, in order."""
        return list(self.partitions if self.counts is None else self.counts)

    @property
    def rows(self) -> int:
        return row_count(self.partitions) if self.counts is None else sum(self.counts.values())

    def frame(self) -> pd.DataFrame:
        if self.counts is not None:
            raise ValueError("this run's tables were not kept: read its partitions from the lake")
        return frame(self.partitions)


def frame(tables: dict[str, pa.Table]) -> pd.DataFrame:
    """The partitions a run wrote, as one frame."""
    return pa.concat_tables(tables.values()).to_pandas()


def row_count(tables: dict[str, pa.Table]) -> int:
    return sum(t.num_rows for t in tables.values())


def md_table(df: pd.DataFrame, empty: str = "none", floatfmt: str | None = ".2f") -> Markdown:
    """A frame as a Markdown table (floats to 2 decimals), or `empty` for no rows."""
    if not len(df):
        return Markdown(empty)
    return Markdown(
        df.to_markdown(index=False, floatfmt=floatfmt) if floatfmt else df.to_markdown(index=False)
    )
