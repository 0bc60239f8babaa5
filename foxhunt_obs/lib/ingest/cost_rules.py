"""Live cost as Prometheus recording rules, generated from the price table, the MIG profiles and the metric
catalog: what each node, GPU and holder costs per hour right now, on the batch path's model.

The batch path (tables/sql/cost_allocation.sql, before the bill lands) prices a node-hour as the price
table's on-demand $/h for its instance type, splits it evenly over the GPUs reporting on the node, and
charges a GPU's cost to its holders: a MIG slice its share of the GPU (data/mig_profiles.yaml), the pods
of a time-sliced GPU evenly, what no pod holds (and what no slice covers) to (cluster idle). These rules
state the same per evaluation:

  foxhunt:instance_price:usd_per_hour{instance_type}        one constant series per EC2 hourly price
  foxhunt:node_cost:usd_per_hour{node, instance_type}       a node (kube_node_labels' instance type) x its
                                                            type's rate: the bill's effective $/h where
                                                            spend_now pushed it, else the list price
  foxhunt:node_gpus:count{node}                             GPUs reporting on the node (by UUID)
  foxhunt:gpu_cost:usd_per_hour{node, uuid, instance_type}  the node's cost / its GPUs, per GPU
  foxhunt:gpu_holder:share{node, uuid, gpu_instance, namespace, pod}   a holder's part of its GPU
  foxhunt:holder_cost:usd_per_hour{..., experiment}         the GPU's cost x that share, experiment named
  foxhunt:holder_idle_cost:usd_per_hour{...}                x (1 - util) where util is known; all of it
                                                            where no pod holds the GPU
  foxhunt:experiment_cost:usd_per_hour{experiment}, foxhunt:experiment_idle_cost:usd_per_hour{experiment}
                                                            the sums; (cluster idle) includes the cost of
                                                            GPU parts no holder covers (a MIG GPU's unsliced
                                                            part, a slice of a model the profiles lack)

A node whose instance type has no price has no cost series (the batch path flags it the same way). A
holder without utilization has no idle series: unknown activity is not idle (docs/cost-model.md).
"""

from __future__ import annotations

from foxhunt_obs.lib.analysis.prices import PriceTable
from foxhunt_obs.lib.ingest.metric_catalog import Catalog, kube_label_name
from foxhunt_obs.lib.names import CLUSTER_IDLE, EFFECTIVE_PRICE_METRIC, UNATTRIBUTED

# The model, stated at the top of the generated file (the rules read in this order).
MODEL = """The cost model of the batch path (foxhunt_obs/lib/tables/sql/cost_allocation.sql, before the bill
lands), per minute: a node costs its instance type's rate: the effective $/h the newest landed bill shows
(foxhunt_effective_price_usd_per_hour, pushed by spend_now: Savings Plans, RIs, spot), else the on-demand
$/h of the price table (no price, no series); each GPU reporting on it (by UUID) costs an equal part; a GPU's cost goes to its holders: a MIG
slice its profile's compute slices over the model's (mig_profiles.yaml), the pods of a time-sliced GPU
evenly, the GPU itself when no pod holds it. What no holder covers (a MIG GPU's unsliced part) and what no
pod holds is (cluster idle). Idle $ = a holder's $ x (1 - util) where util is known; all of (cluster
idle). A holder's experiment is its pod's label, else its namespace's, else unattributed."""

GROUP = "foxhunt-cost"
# what the generated files say they come from
SOURCE = "foxhunt_obs/data/prices.yaml, mig_profiles.yaml and metric_catalog.yaml"
INTERVAL = "1m"  # dollars per hour move when nodes come and go: a minute is plenty
# canonical records every GPU reports one of (util may be missing on a stock counters file; power not)
GPU_PRESENCE = ("foxhunt:gpu_util:ratio", "foxhunt:gpu_power:watts", "foxhunt:gpu_mem_used:bytes")


HOLDER = "node, uuid, gpu_instance, namespace, pod"
NO_SLICE = 'gpu_instance=""'
SLICE = 'gpu_instance!=""'


def _presence(*matchers: str) -> str:
    """A selector of the canonical records every GPU (slice, pod copy) reports, with extra matchers."""
    names = "|".join(GPU_PRESENCE)
    return "{" + ", ".join([f'__name__=~"{names}"', *matchers]) + "}"


def _quoted(regex: str) -> str:
    """A regular expression as a PromQL string literal (backslashes doubled)."""
    return '"' + regex.replace("\\", "\\\\") + '"'


def _even(selector: str) -> str:
    """Each holder series of `selector` an even share of its GPU (slice): 1/k of the k present."""
    rows = f"group by ({HOLDER}) ({selector})"
    return f"({rows}\n  / on (node, uuid, gpu_instance) group_left ()\n  count by (node, uuid, gpu_instance) ({rows}))"


def _holder_share(mig_gpus: list[tuple[str, int]]) -> str:
    """A holder's share of its GPU. Whole GPUs: the pods present share it evenly (time slicing), and the
    device's own series (no pod) stands for the GPU only where no pod holds it. MIG slices: the profile's
    compute slices over the model's (the first model pattern that matches wins), one holder per slice."""
    sliced = "on (node, uuid) " + _presence(SLICE)
    held = _even(_presence(NO_SLICE, 'pod!=""'))
    free = (
        "("
        + _even(_presence(NO_SLICE, 'pod=""'))
        + "\n  unless on (node, uuid) "
        + _presence('pod!=""')
        + ")"
    )
    profiles = []
    for g in range(1, 9):  # "3g.40gb", a compute instance's "2c.3g.40gb": 3 compute slices
        selector = _presence(SLICE, "gpu_profile=~" + _quoted(r"([0-9]+c\.)?" + str(g) + r"g\..*"))
        profiles.append(f"group by ({HOLDER}) ({selector}) * {g}")
    models = []
    for pattern, n in mig_gpus:  # the profiles file's patterns are searched in the model name
        selector = _presence(SLICE, "model=~" + _quoted(".*(?:" + pattern + ").*"))
        models.append(f"group by (node, uuid) ({selector}) * {n}")
    profile = "\n  or ".join(profiles)
    model = "\n  or on (node, uuid) ".join(models)
    mig = f"({profile})\n/ on (node, uuid) group_left ()\n({model})"
    return f"({held} unless {sliced})\nor ({free} unless {sliced})\nor {mig}\n"


def _experiment(kube: dict, experiment_label: str) -> str:
    """holder cost with an `experiment` label, as the ingest names it: the pod's label, else its
    namespace's, else unattributed; what no pod holds is (cluster idle)."""
    key = kube_label_name(experiment_label)
    cost = "foxhunt:gpu_holder_cost:usd_per_hour"

    def labelled(metric: str, by: str) -> str:
        return f'max by ({by}, experiment) (label_replace({metric}{{{key}!=""}}, "experiment", "$1", "{key}", "(.+)"))'

    pods, namespaces = (
        labelled(kube["pod_labels"], "namespace, pod"),
        labelled(kube["namespace_labels"], "namespace"),
    )
    return (
        f'{cost}{{pod!=""}} * on (namespace, pod) group_left (experiment) {pods}\n'
        f'or on ({HOLDER}) {cost}{{pod!=""}} * on (namespace) group_left (experiment) {namespaces}\n'
        f'or on ({HOLDER}) label_replace({cost}{{pod!=""}}, "experiment", "{UNATTRIBUTED}", "", "")\n'
        f'or label_replace({cost}{{pod=""}}, "experiment", "{CLUSTER_IDLE}", "", "")\n'
    )


def cost_rules(
    prices: PriceTable, catalog: Catalog, experiment_label: str, mig_gpus: list[tuple[str, int]]
) -> dict:
    """The rules file as a dict, in evaluation order (a rule reads only those before it)."""
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
            # the bill's effective rate where spend_now pushed one for the table's region, else the list
            "expr": f"{nodes}\n* on (instance_type) group_left ()\n"
            f'(max by (instance_type) ({EFFECTIVE_PRICE_METRIC}{{price_region="{prices.region}"}})\n'
            " or max by (instance_type) (foxhunt:instance_price:usd_per_hour))\n",
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
    unheld = (
        f'label_replace(foxhunt:gpu_unallocated_cost:usd_per_hour, "experiment", "{CLUSTER_IDLE}", "", "")'
    )
    rules += [
        {"record": "foxhunt:gpu_holder:share", "expr": _holder_share(mig_gpus)},
        {
            "record": "foxhunt:gpu_holder_cost:usd_per_hour",
            "expr": "foxhunt:gpu_holder:share\n* on (node, uuid) group_left (instance_type)\nfoxhunt:gpu_cost:usd_per_hour\n",
        },
        {
            # what no holder covers: a MIG GPU's unsliced part, a slice of a model the profiles lack
            "record": "foxhunt:gpu_unallocated_cost:usd_per_hour",
            "expr": "(foxhunt:gpu_cost:usd_per_hour\n- on (node, uuid) group_left ()\n"
            "sum by (node, uuid) (foxhunt:gpu_holder_cost:usd_per_hour)) > 1e-9\n",
        },
        {"record": "foxhunt:holder_cost:usd_per_hour", "expr": _experiment(kube, experiment_label)},
        {
            # idle $ = cost x (1 - util) where util is known; what no pod holds is idle whole
            "record": "foxhunt:holder_idle_cost:usd_per_hour",
            "expr": 'foxhunt:holder_cost:usd_per_hour{pod!=""}\n'
            f"* on ({HOLDER}) group_left ()\n"
            f"(1 - max by ({HOLDER}) (foxhunt:gpu_util:ratio))\n"
            'or foxhunt:holder_cost:usd_per_hour{pod=""}\n',
        },
        {
            "record": "foxhunt:experiment_cost:usd_per_hour",
            "expr": f"sum by (experiment) (foxhunt:holder_cost:usd_per_hour or {unheld})\n",
        },
        {
            "record": "foxhunt:experiment_idle_cost:usd_per_hour",
            "expr": f"sum by (experiment) (foxhunt:holder_idle_cost:usd_per_hour or {unheld})\n",
        },
    ]
    return {"groups": [{"name": GROUP, "interval": INTERVAL, "rules": rules}]}
