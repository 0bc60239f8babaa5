"""The scenario's training: block (MLflow runs) and its ground truth, without a server."""

from __future__ import annotations

import copy
import re
from datetime import timedelta

import numpy as np
import pandas as pd
import pytest
import yaml

from foxhunt_obs.sandbox.story.scenario import SCENARIO_DIR, ScenarioError, load_scenario, parse_scenario
from foxhunt_obs.sandbox.writers import training

MIN5 = pd.Timedelta(minutes=5)


@pytest.fixture(scope="module")
def small():
    return load_scenario("small")


@pytest.fixture(scope="module")
def default():
    return load_scenario("default")


@pytest.fixture(scope="module")
def metrics(small):
    return training.training_metrics(small)


@pytest.fixture(scope="module")
def runs(small):
    return training.training_runs(small)


def _series(metrics, run, key):
    return metrics[(metrics["run_name"] == run) & (metrics["key"] == key)]


# ---- parsing and validation ----


def test_small_training_block(small):
    tr = small.training
    assert tr.steps_per_hour == 12 and tr.interval_s == 300 and 8 <= len(tr.runs) <= 12
    assert {r.status for r in tr.runs} == {"FINISHED", "FAILED", "KILLED", "RUNNING"}
    assert [r.name for r in tr.runs if r.deleted] == ["dqn-atari-debug"]
    assert sorted(i.kind for i in tr.incidents) == sorted(training_kinds())
    f0 = tr.run("ppo-humanoid-f0")  # inherits its pod's window
    pod = next(p for p in small.pods if p.name == f0.pod)
    assert (f0.start, f0.end, f0.namespace) == (pod.start, pod.end, "rl-train")
    (stall,) = [i for i in tr.incidents if i.kind == "stall"]
    assert tr.run(stall.run).status == "RUNNING" and small.end - stall.at >= timedelta(minutes=60)
    clean = {r.name for r in tr.runs} - {i.run for i in tr.incidents}
    assert {tr.run(n).status for n in clean if not tr.run(n).deleted} >= {"FINISHED", "RUNNING"}
    running_to_end = [n for n in clean if tr.run(n).status == "RUNNING" and tr.run(n).end == small.end]
    assert running_to_end == ["ppo-humanoid-f1"]


def test_runs_on_reused_names_and_several_pods(small):
    """A run's pods are found in its experiment's namespace, and by its window where a name comes back;
    a Ray run's tag lists its head and workers, its window is theirs."""
    tr = small.training
    by_run = {r.name: [small.pods[i] for i in r.pods] for r in tr.runs}
    f2, f3, atari = by_run["ppo-humanoid-f2"], by_run["ppo-humanoid-f3"], by_run["dqn-atari-f2"]
    assert [(p.name, p.namespace, p.start_s) for p in f2 + f3 + atari] == [
        ("trainer-0", "rl-train", 1800),
        ("trainer-0", "rl-train", 16200),
        ("trainer-0", "rl-atari", 3600),
    ]
    ray = tr.run("ppo-humanoid-ray")
    assert ray.pod == "ppo-humanoid-ray-head,ppo-humanoid-ray-worker-0,ppo-humanoid-ray-worker-1"
    assert (ray.start_s, ray.end_s) == (0, 1800) and len({p.node for p in by_run[ray.name]}) == 2
    assert training.run_tags(ray)["pod"] == ray.pod and training.run_tags(ray)["namespace"] == "rl-train"
    assert all(training.run_tags(r)["namespace"] == r.namespace for r in tr.runs)
    assert tr.run("dqn-atari-f2").end_s == 9900  # inherited from rl-atari's trainer-0 (02:45)


def training_kinds():
    return ["nan_loss", "entropy_collapse", "success_drop", "stall"]


def test_default_training_block(default):
    tr = default.training
    assert 12 <= len(tr.runs) <= 18 and {r.algo for r in tr.runs} == {"PPO", "DQN"}
    for r in tr.runs:
        for pod in (default.pods[i] for i in r.pods):
            assert pod.experiment == r.experiment and pod.start <= r.start < r.end <= pod.end
        assert r.pod == (",".join(default.pods[i].name for i in r.pods) or None)
        assert r.algo == ("PPO" if r.experiment.startswith("ppo") else "DQN")
    assert sorted(i.kind for i in tr.incidents) == sorted(training_kinds())
    last_day = default.end - timedelta(hours=24)
    assert all(i.at >= last_day for i in tr.incidents)
    assert {r.status for r in tr.runs} == {"FINISHED", "FAILED", "KILLED", "RUNNING"}
    assert any(r.deleted for r in tr.runs)


def test_scenario_without_training_block():
    raw = _raw()
    del raw["training"]
    sc = parse_scenario(yaml.safe_dump(raw))
    assert sc.training is None
    with pytest.raises(ScenarioError, match="no training: block"):
        training.training_runs(sc)


def _raw():
    return yaml.safe_load((SCENARIO_DIR / "small.yaml").read_text())


def _run(raw, name):
    return next(r for r in raw["training"]["runs"] if r["name"] == name)


def _inc(raw, kind):
    return next(i for i in raw["training"]["incidents"] if i["kind"] == kind)


BAD = {
    "unknown experiment": (
        lambda r: _run(r, "ppo-humanoid-sweep").update(experiment="sac-walker"),
        "unknown experiment 'sac-walker'",
    ),
    "unknown pod": (lambda r: _run(r, "dqn-atari-f1").update(pod="ghost"), "unknown pod 'ghost'"),
    "pod of another experiment": (
        lambda r: _run(r, "dqn-atari-f1").update(pod="ppo-humanoid-trainer-1"),
        "runs experiment 'ppo-humanoid', not 'dqn-atari'",
    ),
    "unknown run": (lambda r: _inc(r, "success_drop").update(run="nope"), "unknown run 'nope'"),
    "start off the logging grid": (
        lambda r: _run(r, "ppo-humanoid-sweep").update(start_h="0:01"),
        "start_h=0:01 is not on the 300 s logging grid",
    ),
    "at_h off the logging grid": (
        lambda r: _inc(r, "success_drop").update(at_h="3:02:30"),
        "at_h=3:02:30 is not on the 300 s logging grid",
    ),
    "off the scrape grid": (
        lambda r: _inc(r, "success_drop").update(at_h=3.001),
        "not on the 15 s scrape grid",
    ),
    "inherited start off the grid": (
        lambda r: r["training"].update(steps_per_hour=2),
        "start_h inherited from pod 'dqn-atari-learner-0' (0.25h) is not on the 1800 s logging grid",
    ),
    "outside the scenario": (
        lambda r: _run(r, "ppo-humanoid-sweep").update(end_h=7),
        "window 0h..7h is empty or outside 0..6h",
    ),
    "outside its pod": (
        lambda r: _run(r, "dqn-atari-f0").update(end_h=3),
        "window 0.25h..3h must lie within the lifetime of pod 'dqn-atari-learner-0' (0.25h..2.75h)",
    ),
    "stall on a non-RUNNING run": (
        lambda r: _inc(r, "stall").update(run="dqn-atari-f1", at_h=5.5),
        "a stall needs a RUNNING run; 'dqn-atari-f1' is FINISHED",
    ),
    "RUNNING run ending early": (
        lambda r: r["training"]["incidents"].remove(_inc(r, "stall")),
        "a RUNNING run logs until the scenario ends (6h) but this one's window ends at 4.5h",
    ),
    "incident outside the run": (
        lambda r: _inc(r, "success_drop").update(at_h=5),
        "at_h=5 must fall strictly inside run 'ppo-humanoid-sweep' (0h..4h)",
    ),
    "nan steps too few": (lambda r: _inc(r, "nan_loss").update(steps=1), "steps must be a whole number >= 2"),
    "nan steps past the end": (
        lambda r: _inc(r, "nan_loss").update(steps=4),
        "4 bad steps from at_h=2:15 run past the run's end",
    ),
    "incident in a GPU-stall pause": (
        lambda r: r["training"]["incidents"].append(
            {"kind": "success_drop", "run": "ppo-humanoid-f0", "at_h": "2:20"}
        ),
        "falls into the GPU stall of pod 'ppo-humanoid-trainer-0' (2h..2:40)",
    ),
    "incident after the stall": (
        lambda r: (
            _inc(r, "stall").update(at_h=1)
            or r["training"]["incidents"].append(
                {"kind": "entropy_collapse", "run": "ppo-humanoid-f0", "at_h": 3}
            )
        ),
        "its entropy_collapse at 3h falls after its stall at 1h",
    ),
    "two incidents of a kind": (
        lambda r: r["training"]["incidents"].append(
            {"kind": "success_drop", "run": "ppo-humanoid-sweep", "at_h": 3.5}
        ),
        "has two success_drop incidents",
    ),
    "duplicate run": (
        lambda r: r["training"]["runs"].append(copy.deepcopy(_run(r, "dqn-atari-f1"))),
        "training run 'dqn-atari-f1'",
    ),
    "unknown kind": (
        lambda r: r["training"]["incidents"].append({"kind": "meteor", "run": "dqn-atari-f1"}),
        "kind must be one of nan_loss, entropy_collapse, success_drop, stall",
    ),
    "unknown field": (lambda r: _run(r, "dqn-atari-f1").update(gpu=0), "unknown field(s) gpu"),
    "bad algo": (lambda r: _run(r, "dqn-atari-f1").update(algo="SAC"), "algo must be one of PPO, DQN"),
    "bad status": (lambda r: _run(r, "dqn-atari-f1").update(status="DONE"), "status must be one of"),
    "bad deleted": (lambda r: _run(r, "dqn-atari-f1").update(deleted="yes"), "deleted must be true or false"),
    "steps_per_hour not dividing": (
        lambda r: r["training"].update(steps_per_hour=7),
        "7 must be a positive whole number dividing 3600",
    ),
    "steps_per_hour off the scrape grid": (
        lambda r: r["training"].update(steps_per_hour=360),
        "360 logs every 10 s, not a multiple of the 15 s scrape interval",
    ),
    "pod-less run without start": (
        lambda r: _run(r, "ppo-humanoid-sweep").pop("start_h"),
        "a run without a pod needs start_h",
    ),
    "pod-less finished run without end": (
        lambda r: _run(r, "dqn-atari-debug").pop("end_h"),
        "a run without a pod needs end_h",
    ),
    "no runs": (lambda r: r["training"].update(runs=[]), "expected a non-empty list of runs"),
    # pods by namespace and time; several pods
    "a reused name without a window": (
        lambda r: [_run(r, "ppo-humanoid-f2").pop(k) for k in ("start_h", "end_h")],
        "pod 'trainer-0' names 2 pods ('trainer-0' (rl-train, 0.5h..2.5h), 'trainer-0' (rl-train, "
        "4.5h..5:20)): give a time inside one of them",
    ),
    "a reused name, a window in neither": (
        lambda r: _run(r, "ppo-humanoid-f2").update(start_h=3, end_h=4),
        "pod 'trainer-0' names 2 pods",
    ),
    "pod and pods": (
        lambda r: _run(r, "ppo-humanoid-ray").update(pod="ppo-humanoid-ray-head"),
        "give pod (one) or pods (several), not both",
    ),
    "pods not a list": (
        lambda r: _run(r, "ppo-humanoid-ray").update(pods="ppo-humanoid-ray-head"),
        "pods must be a non-empty list of pod names",
    ),
    "a pod twice": (
        lambda r: _run(r, "ppo-humanoid-ray").update(pods=["ppo-humanoid-ray-head"] * 2),
        "pods must not name a pod twice",
    ),
    "a window past one of its pods": (
        lambda r: _run(r, "ppo-humanoid-ray").update(end_h=1),
        "window 0h..1h must lie within the lifetime of pod 'ppo-humanoid-ray-head' (0h..0.5h)",
    ),
    "a pod of another namespace's experiment": (
        lambda r: _run(r, "ppo-humanoid-ray").update(pods=["ppo-humanoid-ray-head", "dqn-atari-learner-3"]),
        "pod 'dqn-atari-learner-3' runs experiment 'dqn-atari', not 'ppo-humanoid'",
    ),
}


@pytest.mark.parametrize("case", list(BAD))
def test_validation_errors(case):
    mutate, message = BAD[case]
    raw = _raw()
    mutate(raw)
    with pytest.raises(ScenarioError, match=re.escape(message)):
        parse_scenario(yaml.safe_dump(raw), origin="test.yaml")


def test_validation_names_the_file_and_item():
    raw = _raw()
    _run(raw, "dqn-atari-f1").update(pod="ghost")
    with pytest.raises(ScenarioError, match=r"scenario test\.yaml: training\.runs\[3\] \('dqn-atari-f1'\)"):
        parse_scenario(yaml.safe_dump(raw), origin="test.yaml")


# ---- ground truth ----


def test_row_counts_and_grid(small, metrics):
    tr = small.training
    steps = {r.name: len(training.log_offsets(small, r)) for r in tr.runs}
    assert steps == {
        "ppo-humanoid-f0": 48 - 8,  # 00:30-04:30, minus the 02:00-02:40 pause
        "dqn-atari-f0": 27,
        "ppo-humanoid-f1": 15,
        "dqn-atari-f1": 12,
        "ppo-humanoid-sweep": 48,
        "dqn-atari-debug": 9,
        "ppo-humanoid-ray": 6,  # 00:00-00:30
        "ppo-humanoid-f2": 24,  # 00:30-02:30
        "ppo-humanoid-f3": 10,  # 04:30-05:20
        "dqn-atari-f2": 21,  # 01:00-02:45
    }
    assert len(metrics) == len(training.KEYS) * sum(steps.values()) == 1696
    assert list(metrics.columns) == ["run_name", "key", "step", "ts", "value"]
    assert metrics["ts"].dtype == "datetime64[ms, UTC]" and metrics["step"].dtype == "int64"
    assert not metrics.duplicated(["run_name", "key", "step"]).any()
    ts_s = metrics["ts"].astype("int64") // 1000
    assert (ts_s % small.step_s == 0).all() and (ts_s % tr.interval_s == 0).all()
    for (name, key), g in metrics.groupby(["run_name", "key"]):
        run = tr.run(name)
        assert g["step"].tolist() == list(range(steps[name])), (name, key)
        assert g["ts"].is_monotonic_increasing and g["ts"].iloc[0] == pd.Timestamp(run.start)
        assert g["ts"].iloc[-1] < pd.Timestamp(run.end)


def test_default_rows_fit_the_budget(default):
    df = training.training_metrics(default)
    steps = sum(len(training.log_offsets(default, r)) for r in default.training.runs)
    assert len(df) == 8 * steps <= 60_000


def test_non_finite_values_only_where_injected(small, metrics):
    (nan,) = [w for w in training.incidents(small) if w.kind == "nan_loss"]
    bad = ~np.isfinite(metrics["value"])
    assert set(metrics.loc[bad, "run_name"]) == {nan.run_name} and set(metrics.loc[bad, "key"]) == {
        "actor/loss"
    }
    loss = _series(metrics, nan.run_name, "actor/loss").set_index("step")["value"]
    assert nan.details["steps"] == [24, 25, 26] and loss.index[~np.isfinite(loss)].tolist() == [24, 25, 26]
    assert np.isnan(loss[24]) and np.isnan(loss[25]) and loss[26] == np.inf
    assert _series(metrics, nan.run_name, "actor/loss").set_index("step")["ts"][24] == pd.Timestamp(nan.start)
    assert nan.end == nan.start + timedelta(minutes=15) and (nan.details["nan"], nan.details["inf"]) == (2, 1)


def test_stall_and_pause(small, metrics):
    (stall,) = [w for w in training.incidents(small) if w.kind == "stall"]
    mine = metrics[metrics["run_name"] == stall.run_name]
    assert mine["ts"].max() == pd.Timestamp(stall.start) - MIN5 == pd.Timestamp(stall.details["last_logged"])
    assert stall.details["silent_at_end"] == timedelta(minutes=95)
    (pause,) = training.pauses(small)
    assert (pause.run_name, pause.start.hour, pause.end.minute, pause.details["missed"]) == (
        "ppo-humanoid-f0",
        2,
        40,
        8,
    )
    assert not mine["ts"].between(pause.start, pause.end, inclusive="left").any()
    sr = _series(metrics, "ppo-humanoid-f0", "success_rate").set_index("step")["ts"]
    assert sr[17] == pd.Timestamp(pause.start) - MIN5 and sr[18] == pd.Timestamp(pause.end)


def test_entropy_collapse_and_accuracy_band(small, metrics):
    (ec,) = [w for w in training.incidents(small) if w.kind == "entropy_collapse"]
    e = _series(metrics, ec.run_name, "actor/entropy")
    after = e["ts"] >= pd.Timestamp(ec.start)
    assert (e.loc[after, "value"] < 0.02).all() and (e.loc[~after, "value"] > 0.4).all()
    healthy_entropy = metrics[(metrics["key"] == "actor/entropy") & (metrics["run_name"] != ec.run_name)]
    assert (healthy_entropy["value"] > 0.4).all()
    acc = metrics[metrics["key"] == "accuracy"]
    out = ~acc["value"].between(*training.ACCURACY_BAND)
    (exc,) = training.accuracy_excursions(small)
    expected = (acc["run_name"] == exc.run_name) & (acc["ts"] >= pd.Timestamp(exc.start))
    assert out.any() and (out == expected).all()


def test_success_drop(small, metrics):
    (sd,) = [w for w in training.incidents(small) if w.kind == "success_drop"]
    s = _series(metrics, sd.run_name, "success_rate")
    after = s["ts"] >= pd.Timestamp(sd.start)
    before = s.loc[~after, "value"].iloc[-6:].mean()
    assert 0.65 < before < 0.9 and s.loc[after, "value"].max() < 0.45 and before - sd.details["after"] > 0.3
    sr = metrics[metrics["key"] == "success_rate"]
    assert sr["value"].between(0, 1).all()
    for name, g in sr.groupby("run_name"):  # no other sharp drop: healthy noise is ±0.015
        if name != sd.run_name:
            assert g["value"].diff().min() > -0.1, name


def test_shapes_and_bottlenecks(small, metrics):
    wide = metrics.pivot(index=["run_name", "step"], columns="key", values="value")
    overhead = wide["timing/total"] - wide["timing/generate"] - wide["timing/update"]
    assert overhead.between(0.3 - 1e-9, 0.8 + 1e-9).all()
    assert wide["train/rewards"].between(0, 1).all()
    runs = training.training_runs(small).set_index("run_name")
    health = training.training_health(small).set_index("run_name")
    for name, g in wide.groupby(level="run_name"):
        rollout = (g["timing/generate"] > g["timing/update"]).all()
        update = (g["timing/update"] > g["timing/generate"]).all()
        assert health.loc[name, "bottleneck"] == ("rollout" if rollout else "update") and (rollout or update)
        assert health.loc[name, "bottleneck"] == training.BOTTLENECK[runs.loc[name, "algo"]]
        loss = g["actor/loss"].dropna()
        loss = loss[np.isfinite(loss)]
        assert (loss > 0).all() and loss.iloc[:3].mean() > 2 * loss.iloc[-3:].mean()  # falls, then flat
        r = g["train/rewards"]
        assert r.iloc[-3:].mean() > r.iloc[:3].mean() + 0.2
    assert health.loc["dqn-atari-f0", ["nan_count", "inf_count"]].tolist() == [2, 1]
    assert health["nan_count"].sum() == 2 and health.loc["ppo-humanoid-f0", "paused_steps"] == 8


def test_runs_table(small, runs):
    assert list(runs.columns) == [
        "run_name",
        "experiment",
        "algo",
        "fold",
        "pod",
        "namespace",
        "status",
        "deleted",
        "start",
        "end",
        "params",
        "tags",
    ]
    r = runs.set_index("run_name")
    assert r.loc["dqn-atari-debug", "deleted"] and r["deleted"].sum() == 1
    assert (
        r.loc[r["status"] == "RUNNING", "end"].isna().all()
        and r.loc[r["status"] != "RUNNING", "end"].notna().all()
    )
    assert r.loc["dqn-atari-f0", "end"] == pd.Timestamp("2026-11-16T02:30Z")
    tags = r.loc["ppo-humanoid-f0", "tags"]
    assert tags == {
        "algo": "PPO",
        "experiment": "ppo-humanoid",
        "fold": "0",
        "mlflow.runName": "ppo-humanoid-f0",
        "namespace": "rl-train",
        "pod": "ppo-humanoid-trainer-0",
    }
    assert "pod" not in r.loc["ppo-humanoid-sweep", "tags"] and r.loc["ppo-humanoid-sweep", "pod"] is None
    assert {"lr", "batch_size", "gamma", "clip_range"} <= r.loc["ppo-humanoid-f0", "params"].keys()
    assert {"lr", "batch_size", "gamma", "eps_end"} <= r.loc["dqn-atari-f0", "params"].keys()
    assert all(isinstance(v, str) for p in r["params"] for v in p.values())


def test_truth_is_deterministic_and_local(small, metrics):
    pd.testing.assert_frame_equal(training.training_metrics(small), metrics)
    # moving one run's incident changes no other run's numbers
    raw = _raw()
    _inc(raw, "success_drop").update(at_h=2)
    other = training.training_metrics(parse_scenario(yaml.safe_dump(raw)))
    keep = metrics["run_name"] != "ppo-humanoid-sweep"
    pd.testing.assert_frame_equal(
        other[other["run_name"] != "ppo-humanoid-sweep"].reset_index(drop=True),
        metrics[keep].reset_index(drop=True),
    )


def test_as_stored_maps_infinities_like_mlflow():
    got = training.as_stored([1.0, np.nan, np.inf, -np.inf])
    assert got[0] == 1.0 and np.isnan(got[1]) and got[2] == 1.7976931348623157e308 == -got[3]
