"""The scenario's `ray:` block: what it parses to, and every inconsistent cluster refused by name."""

import copy

import pytest
import yaml

from foxhunt_obs.sandbox.story.scenario import SCENARIO_DIR, ScenarioError, load_scenario, parse_scenario

RAW = yaml.safe_load((SCENARIO_DIR / "small.yaml").read_text())


def parse_with(ray) -> object:
    raw = copy.deepcopy(RAW)
    raw["ray"] = ray
    return parse_scenario(yaml.safe_dump(raw), origin="test.yaml")


def test_small_has_one_kuberay_cluster_with_a_lost_worker():
    small = load_scenario("small")
    (c,) = small.ray
    assert (c.name, c.namespace, c.experiment) == ("ppo-humanoid-ray", "rl-train", "ppo-humanoid")
    assert [small.pods[i].name for i in c.pods] == [
        "ppo-humanoid-ray-head",
        "ppo-humanoid-ray-worker-0",
        "ppo-humanoid-ray-worker-1",
    ]
    (inc,) = c.incidents
    assert (inc.kind, small.pods[inc.pod_index].name, inc.start_s, inc.end_s) == (
        "worker_lost",
        "ppo-humanoid-ray-worker-1",
        600,
        1200,
    )


def test_the_default_scenario_loses_its_ray_worker_on_the_last_day():
    default = load_scenario("default")
    (c,) = default.ray
    (inc,) = c.incidents
    assert default.pods[inc.pod_index].name == "ppo-humanoid-ray-worker-1"
    assert (inc.start_s // 3600, (inc.end_s - inc.start_s) // 60) == (152, 20)


HEAD, W0, W1 = "ppo-humanoid-ray-head", "ppo-humanoid-ray-worker-0", "ppo-humanoid-ray-worker-1"


@pytest.mark.parametrize(
    "ray, message",
    [
        ([{"name": "c", "head": HEAD, "workers": [W0, "nobody"]}], "unknown pod 'nobody'"),
        # dqn-atari-learner-0 runs another experiment (and namespace) than the head
        (
            [{"name": "c", "head": HEAD, "workers": ["dqn-atari-learner-0"]}],
            "no pod 'dqn-atari-learner-0' in namespace rl-train",
        ),
        # ppo-humanoid-trainer-0 (00:30-04:30) outlives the head (00:00-00:30)
        (
            [{"name": "c", "head": HEAD, "workers": ["ppo-humanoid-trainer-0"]}],
            "must live within the head's lifetime",
        ),
        ([{"name": "c", "head": HEAD, "workers": [W0, W0]}], "a pod is named twice"),
        (
            [{"name": "c", "head": HEAD, "workers": [W0]}, {"name": "d", "head": W1, "workers": [W0]}],
            "is also in 'c'",
        ),
        (
            [
                {
                    "name": "c",
                    "head": HEAD,
                    "workers": [W0],
                    "incidents": [{"kind": "worker_lost", "pod": W1, "start_h": 0, "minutes": 5}],
                }
            ],
            "'ppo-humanoid-ray-worker-1' is none of the cluster's workers",
        ),
        (
            [
                {
                    "name": "c",
                    "head": HEAD,
                    "workers": [W0],
                    "incidents": [{"kind": "head_lost", "pod": W0, "start_h": 0, "minutes": 5}],
                }
            ],
            "kind must be one of worker_lost",
        ),
        (
            [
                {
                    "name": "c",
                    "head": HEAD,
                    "workers": [W0],
                    "incidents": [{"kind": "worker_lost", "pod": W0, "start_h": "0:25", "minutes": 10}],
                }
            ],
            "the outage must lie within worker",
        ),
    ],
)
def test_inconsistent_ray_clusters_are_refused(ray, message):
    with pytest.raises(ScenarioError, match="test.yaml") as e:
        parse_with(ray)
    assert message in str(e.value)
