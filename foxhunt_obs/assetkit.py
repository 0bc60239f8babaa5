"""The one Dagster-aware helper outside defs/: a table function's `Built` (lib/tables) as the asset's
materialization and check results, and its lake or source error as a failed step, once."""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Iterator

import dagster as dg
import numpy as np

from foxhunt_obs.lib import tracing
from foxhunt_obs.lib.errors import InputError
from foxhunt_obs.lib.redact import scrub
from foxhunt_obs.lib.schemas import TableSpec
from foxhunt_obs.lib.tables import Built, LakePath, Markdown


def failure(e: BaseException, prefix: str = "") -> dg.Failure:
    """A source's or the lake's error as a failed Dagster step: its text scrubbed of every configured secret
    (lib/redact.py); raise it `from None`, so no chained exception carries the raw text into the event log."""
    return dg.Failure(description=scrub(f"{prefix}{e}"))


def metadata_value(value: object) -> dg.MetadataValue:
    if isinstance(value, Markdown):
        return dg.MetadataValue.md(value)
    if isinstance(value, LakePath):
        return dg.MetadataValue.path(value)
    if isinstance(value, (dict, list)):
        return dg.MetadataValue.json(value)
    if isinstance(value, (bool, np.bool_)):  # numpy's bool is no bool
        return dg.MetadataValue.bool(bool(value))
    if isinstance(value, numbers.Integral):  # numpy's integers too
        return dg.MetadataValue.int(int(value))
    if isinstance(value, numbers.Real):
        value = float(value)
        return dg.MetadataValue.float(value if math.isfinite(value) else math.nan)
    return dg.MetadataValue.text(str(value))


def build(fn: Callable[..., Built], *args, **kwargs) -> Built:
    """`fn(*args)`, its expected errors raised as a Dagster Failure (scrubbed, without the chained cause).
    Traced (lib/tracing.py): one span per step, in the run's trace, its sources' requests under it."""
    run_id, attributes = _step_scope(fn)
    try:
        with tracing.run_step_span(f"materialize {attributes['dagster.asset']}", run_id, attributes) as span:
            built = fn(*args, **kwargs)
            if isinstance(built, Built):  # build() also wraps loaders (load_price_table)
                tracing.set_attributes(span, _summary_attributes(built))
            return built
    except InputError as e:  # the input's fault (lib/errors.py): its message, no traceback
        raise failure(e) from None
    finally:
        if run_id:  # a Dagster step: its process may exit next (at most FLUSH_S with a collector down)
            tracing.flush()


def load(fn: Callable[..., object], *args, **kwargs) -> object:
    """`fn(*args)` for a loader of a step's data file (the metric and Ray catalogs): its InputError raised as
    a Dagster Failure like build's, but no span of its own (the step's one span is its table function's).
    Call it inside the step, not as an argument of build, which Python evaluates before build can catch."""
    try:
        return fn(*args, **kwargs)
    except InputError as e:
        raise failure(e) from None


def _step_scope(fn: Callable) -> tuple[str | None, dict[str, object]]:
    """The run id and the span attributes of the step calling `build` (asset, partition, job); outside a
    Dagster step (tests, bench/), no run and the table function's name."""
    name = getattr(fn, "__name__", "table")
    if not tracing.enabled():
        return None, {"dagster.asset": name}
    try:
        ctx = dg.OpExecutionContext.get()
    except dg.DagsterInvariantViolationError:
        return None, {"dagster.asset": name}
    keys = sorted(k.to_user_string() for k in ctx.selected_asset_keys) or [name]
    partition = None
    if ctx.has_partition_key:
        partition = ctx.partition_key
    elif ctx.has_partition_key_range:
        first, last = ctx.partition_key_range.start, ctx.partition_key_range.end
        partition = first if first == last else f"{first}..{last}"
    return ctx.run_id, {
        "dagster.asset": ", ".join(keys),
        "dagster.partition": partition,
        "dagster.job": ctx.job_name,
        "dagster.step": ctx.op.name,
        "foxhunt.table_function": name,
    }


def _summary_attributes(built: Built) -> dict[str, object]:
    """The summary's numbers (rows written and the like) on the step's span."""
    return {
        f"foxhunt.summary.{k}": v.item() if isinstance(v, np.generic) else v
        for k, v in built.summary.items()
        if isinstance(v, (numbers.Real, np.generic)) and not isinstance(v, (np.str_, np.bytes_))
    }


def results(built: Built) -> Iterator[dg.MaterializeResult | dg.AssetCheckResult]:
    """The materialization with the summary as metadata, then each check."""
    yield dg.MaterializeResult(metadata={k: metadata_value(v) for k, v in built.summary.items()})
    for check in built.checks:
        yield dg.AssetCheckResult(
            check_name=check.name,
            passed=check.passed,
            severity=dg.AssetCheckSeverity(check.severity),
            metadata={k: metadata_value(v) for k, v in check.metadata.items()},
        )


def log(context, built: Built) -> None:
    """The table function's log lines (extra["log"]: (level, text)) into the run's log."""
    for level, text in built.extra.get("log", ()):
        getattr(context.log, level)(text)


# Definition metadata of a lake asset: the names of the lake tables it writes, its own table first.
LAKE_TABLES = "foxhunt/lake_tables"


def column_schema(spec: TableSpec) -> dg.TableSchema:
    """A lake table's columns as Dagster shows them (the asset's Columns tab): name, the Arrow type as
    text, and the column's note from its TableSpec."""
    return dg.TableSchema(
        columns=[dg.TableColumn(f.name, str(f.type), spec.columns.get(f.name)) for f in spec.schema]
    )


def writes(table: TableSpec, *also: TableSpec, does: str = "") -> dict[str, object]:
    """The description and definition metadata of an asset that writes lake table `table` (and the tables
    in `also`), for `@dg.asset(**writes(...))`: the description is each table's text from lib/schemas.py,
    then `does`, a sentence on what the asset itself does; the metadata holds its table's columns
    (`dagster/column_schema`, shown before any run) and the tables' names."""
    parts = [table.doc, *(f"Also writes {t.name}: {t.doc}" for t in also), does]
    return {
        "description": " ".join(p.strip() for p in parts if p.strip()),
        "metadata": {
            "dagster/column_schema": dg.MetadataValue.table_schema(column_schema(table)),
            LAKE_TABLES: dg.MetadataValue.json([t.name for t in (table, *also)]),
        },
    }
