"""Live cost as Prometheus recording rules, generated from the price table and the metric catalog (issue 16
§1, first part): what a node and each of its GPUs cost per hour right now, on the batch path's model.

The batch path (tables/sql/cost_allocation.sql, before the bill lands) prices a node-hour as the price
table's on-demand $/h for its instance type, and splits it evenly over the GPUs reporting on the node.
These rules state the same per evaluation:

  foxhunt:instance_price:usd_per_hour{instance_type}       one constant series per EC2 hourly price
  foxhunt:node_cost:usd_per_hour{node, instance_type}      a node (kube_node_labels' instance type) x price
  foxhunt:node_gpus:count{node}                            GPUs reporting on the node (by UUID)
  foxhunt:gpu_cost:usd_per_hour{node, uuid, instance_type} the node's cost / its GPUs, per GPU

A node whose instance type has no price has no cost series (the batch path flags it the same way); the
holder split (MIG slices, time-sliced pods, idle $ by experiment) is the next part of issue 16.
"""

from __future__ import annotations

from foxhunt_obs.lib.analysis.prices import PriceTable
from foxhunt_obs.lib.ingest.metric_catalog import Catalog

GROUP = "foxhunt-cost"
INTERVAL = "1m"  # dollars per hour move when nodes come and go: a minute is plenty
# canonical records every GPU reports one of (util may be missing on a stock counters file; power not)
GPU_PRESENCE = ("foxhunt:gpu_util:ratio", "foxhunt:gpu_power:watts", "foxhunt:gpu_mem_used:bytes")


def cost_rules(prices: PriceTable, catalog: Catalog) -> dict:
    """The rules file as a dict: prices first (the other rules read them), then node, GPUs, GPU."""
    # the price the batch path charges for each instance type (PriceTable.get), one series per type
    types = sorted({p.key for p in prices.prices if p.service == "AmazonEC2" and p.unit == "hour"})
    hourly = [prices.get("AmazonEC2", t) for t in types]
    rules = [
        {
            "record": "foxhunt:instance_price:usd_per_hour",
            "expr": f"vector({p.usd})",
            "labels": {
                "instance_type": p.key,
                "price_as_of": p.as_of.isoformat(),
                "price_region": prices.region,
            },
        }
        for p in hourly
    ]
    kube = catalog.kube
    label = kube["instance_type_label"]
    nodes = (
        f'max by (node, instance_type) (label_replace({kube["node_labels"]}{{{label}!=""}}, '
        f'"instance_type", "$1", "{label}", "(.+)"))'
    )
    presence = "|".join(GPU_PRESENCE)
    rules += [
        {
            "record": "foxhunt:node_cost:usd_per_hour",
            "expr": f"{nodes}\n* on (instance_type) group_left ()\n"
            "max by (instance_type) (foxhunt:instance_price:usd_per_hour)\n",
        },
        {
            "record": "foxhunt:node_gpus:count",
            "expr": f'count by (node) (group by (node, uuid) ({{__name__=~"{presence}"}}))',
        },
        {
            "record": "foxhunt:gpu_cost:usd_per_hour",
            "expr": f'group by (node, uuid) ({{__name__=~"{presence}"}})\n'
            "* on (node) group_left (instance_type)\n"
            # group_left keeps the node's instance_type (a one-to-one on (node) would keep node alone)
            "(foxhunt:node_cost:usd_per_hour / on (node) group_left () foxhunt:node_gpus:count)\n",
        },
    ]
    return {"groups": [{"name": GROUP, "interval": INTERVAL, "rules": rules}]}
