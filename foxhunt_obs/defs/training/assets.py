"""MLflow runs and metric histories into the lake, and training health per run and day."""

import dagster as dg

from foxhunt_obs import assetkit
from foxhunt_obs.defs.partitions import DAILY, days_of
from foxhunt_obs.defs.resources import LakeResource, MlflowResource
from foxhunt_obs.lib import schemas
from foxhunt_obs.lib.analysis.training_health import load_thresholds
from foxhunt_obs.lib.tables import training as tables


@dg.asset(
    group_name="training",
    kinds={"mlflow", "parquet"},
    **assetkit.writes(
        schemas.TRAINING_RUNS,
        schemas.TRAINING_HISTORY,
        does="Reads only the histories that can have changed: new and RUNNING runs, and once more after a "
        "run ends.",
    ),
)
def training_runs(context: dg.AssetExecutionContext, lake: LakeResource, mlflow: MlflowResource):
    yield from assetkit.results(assetkit.build(tables.training_runs, lake.lake(), mlflow.source()))


@dg.asset(
    partitions_def=DAILY,
    backfill_policy=dg.BackfillPolicy.single_run(),
    deps=[training_runs],
    group_name="training",
    kinds={"duckdb", "parquet"},
    **assetkit.writes(schemas.TRAINING_METRICS, does="Cut from training_history by UTC day."),
)
def training_metrics(context: dg.AssetExecutionContext, lake: LakeResource):
    days = days_of(context.partition_time_window)
    yield from assetkit.results(assetkit.build(tables.training_metrics, lake.lake(), days))


@dg.asset(
    partitions_def=DAILY,
    backfill_policy=dg.BackfillPolicy.single_run(),
    deps=[training_metrics, training_runs],
    group_name="training",
    kinds={"pandas", "parquet"},
    **assetkit.writes(
        schemas.TRAINING_HEALTH,
        does="From training_runs and training_history; thresholds in data/training_health.yaml.",
    ),
)
def training_health(context: dg.AssetExecutionContext, lake: LakeResource):
    days = days_of(context.partition_time_window)
    yield from assetkit.results(assetkit.build(tables.training_health, lake.lake(), days, load_thresholds()))
