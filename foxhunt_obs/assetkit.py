"""The one Dagster-aware helper outside defs/: a table function's `Built` (lib/tables) as the asset's
materialization and check results, and its lake or source error as a failed step, once."""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Iterator

import dagster as dg
import numpy as np

from foxhunt_obs.defs.failures import failure
from foxhunt_obs.lib.analysis.prices import PriceError
from foxhunt_obs.lib.delivery.pushgateway import PushgatewayError
from foxhunt_obs.lib.ingest.gpu_series import IngestError
from foxhunt_obs.lib.ingest.live_spend import LiveCostMissing
from foxhunt_obs.lib.ingest.mig import MigError
from foxhunt_obs.lib.ingest.untracked import UntrackedError
from foxhunt_obs.lib.lake import LakeError
from foxhunt_obs.lib.sources.budgets import BudgetsError
from foxhunt_obs.lib.sources.cost_explorer import CostExplorerError
from foxhunt_obs.lib.sources.cur import CurError
from foxhunt_obs.lib.sources.ec2 import Ec2Error
from foxhunt_obs.lib.sources.fsx import FsxSourceError
from foxhunt_obs.lib.sources.mlflow import MlflowSourceError
from foxhunt_obs.lib.sources.prometheus import PrometheusError
from foxhunt_obs.lib.tables import Built, LakePath, Markdown, MissingInput
from foxhunt_obs.lib.tables.gpu import FewerRows

# what a table function may raise that is the input's fault, not a bug: shown as the step's failure
EXPECTED_ERRORS = (
    LiveCostMissing,
    UntrackedError,
    Ec2Error,
    PushgatewayError,
    LakeError,
    PriceError,
    MissingInput,
    PrometheusError,
    MigError,
    IngestError,
    FewerRows,
    FsxSourceError,
    MlflowSourceError,
    CurError,
    CostExplorerError,
    BudgetsError,
)


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
    """`fn(*args)`, its expected errors raised as a Dagster Failure (scrubbed, without the chained cause)."""
    try:
        return fn(*args, **kwargs)
    except EXPECTED_ERRORS as e:
        raise failure(e) from None


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
