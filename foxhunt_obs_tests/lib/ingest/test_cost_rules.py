"""Live cost rules (issue 16 §1, first part): generated from the price table, valid, and giving the batch
path's dollars (promtool test rules against hand-computed figures). The checked-in file is compared with
a fresh export by test_recording_rules (a price-table change that is not exported fails there)."""

import subprocess
from decimal import Decimal

import yaml

from foxhunt_obs.lib.analysis.prices import load_price_table
from foxhunt_obs_tests.paths import REPO

COST_RULES = REPO / "deploy" / "prometheus" / "foxhunt-cost-rules.yaml"

# data/prices.yaml, us-east-1 on demand: the figures below are these divided by 8 GPUs by hand
P4DE, P5 = Decimal("27.44705"), Decimal("55.04")


def test_the_prices_the_figures_assume():
    table = load_price_table("us-east-1")
    assert table.get("AmazonEC2", "p4de.24xlarge").usd == P4DE
    assert table.get("AmazonEC2", "p5.48xlarge").usd == P5


def test_promtool_checks_the_cost_rules():
    out = subprocess.run(["promtool", "check", "rules", str(COST_RULES)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    types = {
        p.key for p in load_price_table("us-east-1").prices if p.service == "AmazonEC2" and p.unit == "hour"
    }
    assert f"SUCCESS: {len(types) + 3} rules found" in out.stdout  # a price per type, then node, GPUs, GPU


def _gpu(metric: str, node: str, i: int, **extra: str) -> dict:
    labels = {"node": node, "gpu": str(i), "uuid": f"GPU-{node}-{i}", "model": "H100", **extra}
    return {
        "series": metric + "{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}",
        "values": "1x10",
    }


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
            "exp_samples": [
                {"labels": _name(expr) + _labels(lab), "value": float(v)} for lab, v in samples
            ],
        }

    tests = {
        "rule_files": [str(COST_RULES)],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": series,
                "promql_expr_test": [
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
            }
        ],
    }
    path = tmp_path / "cost-test.yaml"
    path.write_text(yaml.safe_dump(tests, sort_keys=False))
    out = subprocess.run(["promtool", "test", "rules", str(path)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


def _labels(labels: dict) -> str:
    return "{" + ", ".join(f'{k}="{v}"' for k, v in labels.items()) + "}"


def _name(expr: str) -> str:
    """The metric name promtool shows for a selector; none for an aggregation."""
    return "" if " " in expr else expr.split("{")[0]
