"""expected_alerts.check by hand: what counts as an incident found, and what does not."""

from datetime import timedelta

import pytest

from foxhunt_obs.lib.delivery.alert_sinks import Notification
from foxhunt_obs.sandbox.story.expected_alerts import Expected, check, expected, ident
from foxhunt_obs.sandbox.story.scenario import load_scenario


@pytest.fixture(scope="module")
def small():
    return load_scenario("small")


def note(rule: str, status: str, labels: dict) -> Notification:
    return Notification(
        rule=rule,
        fingerprint=f"{rule}-{sorted(labels.items())}",
        status=status,
        severity="warning",
        labels=labels,
        summary=rule,
        description="",
        value=1.0,
        starts_at=None,
        ends_at=None,
        generator_url="",
    )


def test_the_small_scenario_expects_one_alert_per_incident(small):
    want = expected(small)
    assert len(want) == 12
    ray = [(e.rule, e.ident, e.start.minute, e.end.minute) for e in want if e.rule.startswith("ray_")]
    assert ray == [("ray_worker_lost", "ppo-humanoid-ray", 10, 20)]  # worker-1's raylet gone 00:10-00:20
    stall = [e for e in want if e.rule == "gpu_training_stall"]
    assert [(e.ident, e.start.hour, e.end.hour, e.end.minute) for e in stall] == [
        ("ppo-humanoid-trainer-0", 2, 2, 40)
    ]
    # the run stalled at 04:30 stays RUNNING: its alert must still fire at the end
    assert [e.end for e in want if e.rule == "training_run_silent" and e.start.hour == 4] == [None]


def test_check_finds_misses_and_strays(small):
    t0 = small.start
    e = Expected("gpu_node_missing", "", t0 + timedelta(hours=3), t0 + timedelta(hours=5), "node_lost")
    fired, resolved = note("gpu_node_missing", "firing", {}), note("gpu_node_missing", "resolved", {})
    end = t0 + timedelta(hours=6)

    def at(h, m=0):
        return t0 + timedelta(hours=h, minutes=m)

    assert check([e], [(at(3, 10), fired), (at(5), resolved)], t0, end).ok
    late = check([e], [(at(5, 40), fired), (at(5, 50), resolved)], t0, end)
    assert [why for _, why in late.missed] == ["fired at 2026-11-16 05:40, outside its window"]
    early = check([e], [(at(3, 10), fired), (at(4), resolved)], t0, end)
    assert [why for _, why in early.missed] == ["resolved at 2026-11-16 04:00, before it ended"]
    assert [why for _, why in check([e], [(at(3, 10), fired)], t0, end).missed] == ["never resolved"]
    assert [why for _, why in check([e], [], t0, end).missed] == ["never fired"]
    twice = check([e], [(at(3, 10), fired), (at(5), resolved), (at(5, 30), fired)], t0, end)
    assert [why for _, why in twice.missed] == ["1 notification(s) more than its incidents explain"]
    other = note("gpu_underutilized", "firing", {"pod": "p"})
    mixed = check([e], [(at(1), other), (at(3, 10), fired), (at(5), resolved)], t0, end)
    assert mixed.ok and [n.rule for _, n in mixed.other] == ["gpu_underutilized"]
    # an incident outside the replayed span is not judged
    assert check([e], [], t0 + timedelta(hours=4), end).ok


def test_ident():
    assert ident("ecc_errors", {"node": "n1", "gpu": "3", "pod": "p"}) == "n1/3"
    assert ident("nan_loss", {"run_name": "r", "pod": "p"}) == "r"
    assert ident("cost_spike", {"project": "foxhunt-rl"}) == "foxhunt-rl"
    assert ident("budget_burn", {"budget_name": "foxhunt-monthly"}) == "foxhunt-monthly"
    assert ident("gpu_node_missing", {}) == ""
    assert ident("ray_worker_lost", {"namespace": "rl", "ray_io_cluster": "rc"}) == "rc"
    assert ident("ray_object_store_full", {"ray_io_cluster": "rc", "pod": "rc-worker-0"}) == "rc-worker-0"
