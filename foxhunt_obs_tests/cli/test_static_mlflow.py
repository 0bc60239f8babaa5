"""The demo replay's MLflow source (cli/demo.py StaticMlflow) against a real `mlflow server` holding the
`small` scenario's runs: the training rules evaluated through it find, tick after tick, exactly what they
find reading the server every tick, and it asked the server once per distinct read."""

from datetime import timedelta

import pytest

from foxhunt_obs.cli.demo import StaticMlflow
from foxhunt_obs.lib.alerts.collect import Sources, collect
from foxhunt_obs.lib.alerts.rules import load_rules
from foxhunt_obs.lib.sources.mlflow import MlflowSource
from foxhunt_obs.sandbox.servers.mlflow_server import MlflowServer, build_store, copy_store
from foxhunt_obs.sandbox.story.scenario import load_scenario

pytestmark = [pytest.mark.servers, pytest.mark.timeout(600)]


class Counting:
    """The real source, counting the reads that reach the server."""

    def __init__(self, source):
        self.source, self.reads = source, 0

    def runs(self):
        self.reads += 1
        return self.source.runs()

    def histories(self, runs):
        self.reads += 1
        return self.source.histories(runs)


def test_the_training_rules_find_the_same_every_tick_asking_once(tmp_path):
    small = load_scenario("small")
    store = build_store(small, tmp_path / "cache")
    copy_store(store, tmp_path / "mlflow")
    with MlflowServer(tmp_path / "mlflow", workdir=tmp_path) as mlflow:
        plain, counted = MlflowSource(mlflow.url), Counting(MlflowSource(mlflow.url))
        static = StaticMlflow(counted)
        rules = [r for r in load_rules(overrides="") if r.enabled and r.source == "mlflow"]
        assert rules
        ticks, found = 0, 0
        now = small.start + timedelta(minutes=30)
        while now <= small.end:
            want = collect(rules, Sources(mlflow=plain), now)
            got = collect(rules, Sources(mlflow=static), now)
            assert not want.errors and not got.errors, (want.errors, got.errors)
            assert got.evaluated == want.evaluated
            assert [repr(f) for f in got.findings] == [repr(f) for f in want.findings], now
            ticks, found = ticks + 1, found + len(want.findings)
            now += timedelta(minutes=10)
    assert ticks == 34 and found > 0  # the scenario's NaN loss, entropy collapse, silent run... fire
    # runs() once, histories() once per distinct set of running runs: far fewer reads than ticks (the
    # plain source read both at every tick)
    assert 2 <= counted.reads < ticks // 2
