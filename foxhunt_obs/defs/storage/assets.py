"""FSx for Lustre CloudWatch metrics into the lake."""

import dagster as dg

from foxhunt_obs import assetkit
from foxhunt_obs.defs.partitions import HOURLY, hours_of
from foxhunt_obs.defs.resources import AwsResource, FsxResource, LakeResource
from foxhunt_obs.lib import schemas
from foxhunt_obs.lib.sources.fsx import FsxSource
from foxhunt_obs.lib.tables import storage as tables


@dg.asset(
    partitions_def=HOURLY,
    backfill_policy=dg.BackfillPolicy.multi_run(max_partitions_per_run=24),
    group_name="storage",
    kinds={"aws", "parquet"},
    **assetkit.writes(
        schemas.FSX_METRICS,
        does="Lists the Lustre file systems (those of FOXHUNT_FSX_IDS, else every one in the region; an "
        "unknown id fails the run) and reads each hour's datapoints of the metrics in data/fsx_metrics.yaml "
        "with CloudWatch GetMetricData; no file system found writes empty hours and warns.",
    ),
)
def fsx_metrics(context: dg.AssetExecutionContext, lake: LakeResource, aws: AwsResource, fsx: FsxResource):
    source = FsxSource(aws.client("fsx"), aws.client("cloudwatch"))
    hours = hours_of(context.partition_time_window)
    built = assetkit.build(tables.fsx_metrics, lake.lake(), source, hours, fsx.ids())
    assetkit.log(context, built)
    yield from assetkit.results(built)
