"""Live cost rules: generated from the price table, valid, and giving the batch path's
dollars per node, GPU, holder and experiment (promtool test rules against hand-computed figures). The checked-in file is compared with
a fresh export by test_recording_rules (a price-table change that is not exported fails there)."""

import subprocess
from decimal import Decimal

import pytest
import yaml

from foxhunt_obs.lib.analysis.prices import load_price_table
from foxhunt_obs_tests.paths import REPO

COST_RULES = REPO / "deploy" / "prometheus" / "foxhunt-cost-rules.yaml"

# data/prices.yaml, us-east-1 on demand: the figures below are these divided by 8 GPUs by hand
P4DE, P5 = Decimal("27.44705"), Decimal("55.04")
LIVE_COST_RECORDS = [  # after one price per instance type, in evaluation order
    "foxhunt:node_cost:usd_per_hour",
    "foxhunt:node_gpus:count",
    "foxhunt:gpu_cost:usd_per_hour",
    "foxhunt:gpu_holder:share",
    "foxhunt:gpu_holder_cost:usd_per_hour",
    "foxhunt:gpu_unallocated_cost:usd_per_hour",
    "foxhunt:holder_cost:usd_per_hour",
    "foxhunt:holder_idle_cost:usd_per_hour",
    "foxhunt:experiment_cost:usd_per_hour",
    "foxhunt:experiment_idle_cost:usd_per_hour",
]


def test_the_prices_the_figures_assume():
    table = load_price_table("us-east-1")
    assert table.get("AmazonEC2", "p4de.24xlarge").usd == P4DE
    assert table.get("AmazonEC2", "p5.48xlarge").usd == P5


@pytest.mark.servers
def test_promtool_checks_the_cost_rules():
    out = subprocess.run(["promtool", "check", "rules", str(COST_RULES)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    table = load_price_table("us-east-1")
    types = {p.key for p in table.prices if p.service == "AmazonEC2" and p.unit == "hour"}
    records = [r["record"] for g in yaml.safe_load(COST_RULES.read_text())["groups"] for r in g["rules"]]
    assert records == ["foxhunt:instance_price:usd_per_hour"] * len(types) + LIVE_COST_RECORDS
    assert f"SUCCESS: {len(records)} rules found" in out.stdout


def _series(metric: str, labels: dict, values: str = "1x10") -> dict:
    """One promtool input series."""
    return {
        "series": metric + "{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}",
        "values": values,
    }


def _gpu(metric: str, node: str, i: int, **extra: str) -> dict:
    return _series(metric, {"node": node, "gpu": str(i), "uuid": f"GPU-{node}-{i}", "model": "H100", **extra})


def _promtool_test(tmp_path, series: list[dict], exprs: list[dict]) -> None:
    """`promtool test rules` of the checked-in cost rules: `series` in, each of `exprs` checked."""
    tests = {
        "rule_files": [str(COST_RULES)],
        "evaluation_interval": "1m",
        "tests": [{"interval": "1m", "input_series": series, "promql_expr_test": exprs}],
    }
    path = tmp_path / "cost-test.yaml"
    path.write_text(yaml.safe_dump(tests, sort_keys=False))
    out = subprocess.run(["promtool", "test", "rules", str(path)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


@pytest.mark.servers
def test_node_and_gpu_dollars_per_hour(tmp_path):
    node_labels = 'kube_node_labels{{node="{}",label_node_kubernetes_io_instance_type="{}"}}'
    series = [
        {"series": node_labels.format("ip-1", "p4de.24xlarge"), "values": "1x10"},
        {"series": node_labels.format("ip-2", "p5.48xlarge"), "values": "1x10"},
        {"series": node_labels.format("ip-3", "x9.notpriced"), "values": "1x10"},  # no price: no cost
        {"series": 'kube_node_labels{node="ip-4"}', "values": "1x10"},  # no instance type: no cost
    ]
    # ip-1: 8 GPUs reporting power; GPU 0 in MIG mode (two slices, one UUID) counts once
    series += [_gpu("foxhunt:gpu_power:watts", "ip-1", i) for i in range(8)]
    series += [_gpu("foxhunt:gpu_util:ratio", "ip-1", 0, gpu_instance=str(s)) for s in (1, 2)]
    # ip-2: 8 GPUs, util missing on half of them (a stock counters file): power still counts them
    series += [_gpu("foxhunt:gpu_power:watts", "ip-2", i) for i in range(8)]
    series += [_gpu("foxhunt:gpu_util:ratio", "ip-2", i) for i in range(4)]
    series += [_gpu("foxhunt:gpu_power:watts", "ip-3", i) for i in range(2)]

    def expect(expr: str, samples: list[tuple[dict, Decimal]]) -> dict:
        return {
            "expr": expr,
            "eval_time": "5m",
            "exp_samples": [{"labels": _name(expr) + _labels(lab), "value": float(v)} for lab, v in samples],
        }

    _promtool_test(
        tmp_path,
        series,
        [
            expect(
                "foxhunt:node_cost:usd_per_hour",
                [
                    ({"node": "ip-1", "instance_type": "p4de.24xlarge"}, P4DE),
                    ({"node": "ip-2", "instance_type": "p5.48xlarge"}, P5),
                ],
            ),
            expect(
                "foxhunt:node_gpus:count",
                [({"node": "ip-1"}, 8), ({"node": "ip-2"}, 8), ({"node": "ip-3"}, 2)],
            ),
            expect(
                'foxhunt:gpu_cost:usd_per_hour{uuid="GPU-ip-1-0"}',
                [
                    (
                        {"node": "ip-1", "uuid": "GPU-ip-1-0", "instance_type": "p4de.24xlarge"},
                        P4DE / 8,
                    )
                ],
            ),
            expect(
                # the GPUs carry the whole node (rounded to the micro-dollar: float sums)
                "round(sum by (node) (foxhunt:gpu_cost:usd_per_hour) * 1e6) / 1e6",
                [({"node": "ip-1"}, P4DE), ({"node": "ip-2"}, P5)],
            ),
            expect(
                'foxhunt:gpu_cost:usd_per_hour{uuid="GPU-ip-2-7"}',  # no util, same share
                [({"node": "ip-2", "uuid": "GPU-ip-2-7", "instance_type": "p5.48xlarge"}, P5 / 8)],
            ),
        ],
    )


def _labels(labels: dict) -> str:
    return "{" + ", ".join(f'{k}="{v}"' for k, v in labels.items()) + "}"


def _name(expr: str) -> str:
    """The metric name promtool shows for a selector; none for an aggregation."""
    return "" if " " in expr else expr.split("{")[0]


def _holder(metric: str, i: int, value: str = "1x10", **labels: str) -> dict:
    """A canonical record of GPU i on node ip-1 (an A100 p4de), with holder or slice labels."""
    base = {"node": "ip-1", "gpu": str(i), "uuid": f"GPU-{i}", "model": "NVIDIA A100-SXM4-80GB", **labels}
    return _series(metric, base, value)


@pytest.mark.servers
def test_holders_idle_dollars_and_experiments(tmp_path):
    """One p4de node, each GPU a case of the batch path's model (docs/cost-model.md), dollars by hand:
    GPU 0 held by trainer-0 (experiment ppo by its pod label) at 75 % util; GPU 1 time-sliced by two pods
    (a-0 of ppo; b-0 whose namespace `lab` says dqn) beside the device's own series; GPU 2 no pod at 0 %;
    GPU 3 in MIG mode, two 3g.40gb slices (3/7 each; m-1 without any experiment label and without util)
    and 1/7 unsliced; GPUs 4-7 no pod and no util. A GPU is 27.44705 / 8 = 3.43088125 $/h."""
    power, util = "foxhunt:gpu_power:watts", "foxhunt:gpu_util:ratio"
    series = [
        {
            "series": 'kube_node_labels{node="ip-1",label_node_kubernetes_io_instance_type="p4de.24xlarge"}',
            "values": "1x10",
        },
        {
            "series": 'kube_pod_labels{namespace="rl",pod="trainer-0",label_experiment="ppo"}',
            "values": "1x10",
        },
        {"series": 'kube_pod_labels{namespace="rl",pod="a-0",label_experiment="ppo"}', "values": "1x10"},
        {"series": 'kube_pod_labels{namespace="rl",pod="m-0",label_experiment="ppo"}', "values": "1x10"},
        {"series": 'kube_namespace_labels{namespace="lab",label_experiment="dqn"}', "values": "1x10"},
        _holder(power, 0, namespace="rl", pod="trainer-0"),
        _holder(util, 0, "0.75x10", namespace="rl", pod="trainer-0"),
        _holder(power, 1),  # the device's own series beside the pods' copies: stands for nothing
        _holder(util, 1, "0.5x10", namespace="rl", pod="a-0"),
        _holder(util, 1, "0.5x10", namespace="lab", pod="b-0"),
        _holder(power, 2),
        _holder(util, 2, "0x10"),
        _holder(power, 3),  # device values on a MIG GPU: the slices hold it
        _holder(util, 3, "1x10", gpu_instance="1", gpu_profile="3g.40gb", namespace="rl", pod="m-0"),
        _holder(power, 3, gpu_instance="2", gpu_profile="3g.40gb", namespace="rl", pod="m-1"),
    ] + [_holder(power, i) for i in range(4, 8)]
    gpu = P4DE / 8
    sliced = gpu * 3 / 7
    idle = {
        "ppo": gpu / 4 + gpu / 2 / 2,  # 25 % of GPU 0, 50 % of half of GPU 1, none of a busy slice
        "dqn": gpu / 2 / 2,
        "(cluster idle)": gpu * 5 + gpu / 7,  # GPUs 2, 4-7 whole and GPU 3's unsliced seventh
    }  # m-1 (unattributed) has no util: unknown, not idle
    cost = {
        "ppo": gpu + gpu / 2 + sliced,
        "dqn": gpu / 2,
        "unattributed": sliced,
        "(cluster idle)": gpu * 5 + gpu / 7,
    }
    assert sum(cost.values()) == P4DE

    def rounded(expr: str, by: str, values: dict) -> dict:
        return {
            "expr": f"round({expr} * 1e6) / 1e6",
            "eval_time": "5m",
            "exp_samples": [
                {"labels": _labels({by: k}), "value": float(round(v, 6))} for k, v in sorted(values.items())
            ],
        }

    _promtool_test(
        tmp_path,
        series,
        [
            rounded("foxhunt:experiment_cost:usd_per_hour", "experiment", cost),
            rounded("foxhunt:experiment_idle_cost:usd_per_hour", "experiment", idle),
            rounded(
                'sum by (pod) (foxhunt:gpu_holder:share{uuid="GPU-1"})',
                "pod",
                {"a-0": Decimal("0.5"), "b-0": Decimal("0.5")},
            ),
            rounded(
                'sum by (gpu_instance) (foxhunt:gpu_holder:share{uuid="GPU-3"})',
                "gpu_instance",
                {"1": Decimal(3) / 7, "2": Decimal(3) / 7},
            ),
            rounded(
                "sum by (uuid) (foxhunt:gpu_unallocated_cost:usd_per_hour)",
                "uuid",
                {"GPU-3": gpu / 7},
            ),
        ],
    )


@pytest.mark.servers
def test_a_pushed_effective_rate_prices_the_node_before_the_list_price(tmp_path):
    """spend_now pushes the bill's effective $/h (here a Savings Plan's 19.21 for p4de in the table's
    region, and one for another region, which must not count): the p4de node costs that, the p5 node
    (no effective rate) its list price."""
    node_labels = 'kube_node_labels{{node="{}",label_node_kubernetes_io_instance_type="{}"}}'
    effective = 'foxhunt_effective_price_usd_per_hour{{job="foxhunt_obs_spend",price_region="{}",instance_type="{}",bill_day="2026-11-20"}}'
    series = [
        {"series": node_labels.format("ip-1", "p4de.24xlarge"), "values": "1x10"},
        {"series": node_labels.format("ip-2", "p5.48xlarge"), "values": "1x10"},
        {"series": effective.format("us-east-1", "p4de.24xlarge"), "values": "19.21x10"},
        {"series": effective.format("us-west-2", "p5.48xlarge"), "values": "1x10"},
    ]
    _promtool_test(
        tmp_path,
        series,
        [
            {
                "expr": "foxhunt:node_cost:usd_per_hour",
                "eval_time": "5m",
                "exp_samples": [
                    {
                        "labels": 'foxhunt:node_cost:usd_per_hour{node="ip-1",instance_type="p4de.24xlarge"}',
                        "value": 19.21,
                    },
                    {
                        "labels": 'foxhunt:node_cost:usd_per_hour{node="ip-2",instance_type="p5.48xlarge"}',
                        "value": float(P5),
                    },
                ],
            }
        ],
    )
