"""Running EC2 instances that no cluster node corresponds to, priced: the spend no Prometheus series shows.
A forgotten benchmark box or a node that left the cluster without being terminated bills
by the hour while every GPU dashboard looks fine; the bill says so a day or two later.

An instance belongs to the cluster when its id is a node's spec.providerID as kube-state-metrics exports it
(``kube_node_info{provider_id="aws:///us-east-1a/i-0410cf13f3a172fda"}``), seen in the last
``NODE_LOOKBACK``: a node that just left still counts for that long. Without any kube_node_info series
nothing can be told apart, and that is an error, not "every instance is untracked".

The price is the price table's on-demand $/h for the instance's region and type (spot and Capacity Blocks
pay less: the bill reconciles); a type or region the table lacks is NaN, shown as unpriced, never $0.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from datetime import datetime

import pandas as pd

from foxhunt_obs.lib.analysis.prices import PriceError, PriceTable, load_price_table
from foxhunt_obs.lib.errors import InputError
from foxhunt_obs.lib.sources.ec2 import Ec2Instance, Ec2Inventory, instance_id_of

NODE_LOOKBACK = "15m"
CLUSTER_NODES = f"group by (provider_id) (last_over_time(kube_node_info[{NODE_LOOKBACK}]))"
# tags EKS managed node groups, Karpenter and the cluster autoscaler put on a node's instance
CLUSTER_TAG_PREFIXES = (
    "kubernetes.io/cluster/",
    "eks:cluster-name",
    "karpenter.sh/nodepool",
    "aws:eks:cluster-name",
)
# what identifies and describes an instance (an untracked_spend alert's labels)
LABELS = ("region", "instance_id", "instance_type", "name", "experiment", "lifecycle", "cluster")
COLUMNS = (
    "region",
    "instance_id",
    "instance_type",
    "name",
    "experiment",
    "lifecycle",
    "launch_time",
    "cluster_tagged",  # it carries a Kubernetes cluster's tag (a node still joining, or one that failed to)
    "cluster",  # that cluster's name (eks:cluster-name, kubernetes.io/cluster/<name>): another cluster's node
    "usd_per_hour",  # on-demand list price; NaN: the price table has no row for it
    "price_as_of",
)


class UntrackedError(InputError, RuntimeError):
    """The cluster's nodes could not be told: no kube_node_info series."""


def cluster_instance_ids(prometheus, at: datetime) -> set[str]:
    """EC2 instance ids of the cluster's nodes (kube_node_info provider ids) seen in the last
    NODE_LOOKBACK before ``at``. Raises UntrackedError when Prometheus holds no kube_node_info at all."""
    rows = prometheus.query(CLUSTER_NODES, at.timestamp(), what="the cluster's nodes (kube_node_info)")
    if not rows:
        raise UntrackedError(
            f"Prometheus at {prometheus.url}: {CLUSTER_NODES} at {at:%Y-%m-%dT%H:%M:%SZ} is empty: no "
            "kube_node_info series, so no instance can be told to be a cluster node (is kube-state-metrics "
            "scraped?). Disable untracked_spend in FOXHUNT_ALERT_RULES where there is no cluster"
        )
    ids = {i for labels, _ in rows if (i := instance_id_of(labels.get("provider_id", "")))}
    if not ids:  # nodes, but none on EC2 as far as their provider ids say: every instance would be a stray
        seen = sorted({labels.get("provider_id", "") for labels, _ in rows})[:3]
        raise UntrackedError(
            f"Prometheus at {prometheus.url}: {CLUSTER_NODES} at {at:%Y-%m-%dT%H:%M:%SZ}: {len(rows)} nodes, "
            f"none with an EC2 provider id (aws:///<zone>/i-...; seen: {seen}): their instances cannot be "
            "told apart from strays"
        )
    return ids


def cluster_tagged(instance: Ec2Instance) -> bool:
    return any(k.startswith(CLUSTER_TAG_PREFIXES) for k in instance.tags)


def cluster_name(instance: Ec2Instance) -> str:
    """The Kubernetes cluster an instance's tags name ('' none): a select on `cluster` can leave out the
    nodes of another cluster in the same account."""
    tags = instance.tags
    for key in ("eks:cluster-name", "aws:eks:cluster-name"):
        if tags.get(key):
            return tags[key]
    prefix = "kubernetes.io/cluster/"
    return next((k[len(prefix) :] for k in sorted(tags) if k.startswith(prefix)), "")


class UntrackedSpend:
    """What the ``untracked_spend`` rule and the ``spend_now`` asset read: ``frame(now)``, one row per
    running instance outside the cluster (COLUMNS). ``experiment_tag``: the cost-allocation tag key that
    names an instance's experiment (FOXHUNT_COST_TAGS' third key)."""

    def __init__(
        self,
        inventory: Ec2Inventory,
        prometheus,
        experiment_tag: str = "Experiment",
        price_table: Callable[[str], PriceTable] = load_price_table,
    ):
        self.inventory = inventory
        self.prometheus = prometheus
        self.experiment_tag = experiment_tag
        self._price_table = price_table
        self._tables: dict[str, PriceTable | None] = {}

    def price(self, instance: Ec2Instance) -> tuple[float, str]:
        """(on-demand $/h, its as_of) from the instance region's price table; (NaN, '') when it has none."""
        if instance.region not in self._tables:
            try:
                self._tables[instance.region] = self._price_table(instance.region)
            except PriceError:
                self._tables[instance.region] = None
        table = self._tables[instance.region]
        row = table.find("AmazonEC2", instance.instance_type) if table is not None else None
        if row is None or row.unit != "hour":
            return math.nan, ""
        return float(row.usd), row.as_of.isoformat()

    def frame(self, now: datetime) -> pd.DataFrame:
        # the cluster's nodes first: without them the inventory is not worth reading
        ids = cluster_instance_ids(self.prometheus, now)
        rows = []
        for i in self.inventory.running():
            if i.instance_id in ids:
                continue
            usd, as_of = self.price(i)
            rows.append(
                (
                    i.region,
                    i.instance_id,
                    i.instance_type,
                    i.name,
                    i.tags.get(self.experiment_tag, ""),
                    i.lifecycle,
                    pd.Timestamp(i.launch_time) if i.launch_time else pd.NaT,
                    cluster_tagged(i),
                    cluster_name(i),
                    usd,
                    as_of,
                )
            )
        return pd.DataFrame(rows, columns=list(COLUMNS))
