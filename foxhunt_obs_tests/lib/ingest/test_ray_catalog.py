"""The Ray catalog (data/ray_metrics.yaml) against a real Ray 2.6.1 /metrics page, the sandbox's writer and
the Ray alert rules: every family the page has maps, every spelling the page carries is read."""

import re
import textwrap

import pytest
from prometheus_client.parser import text_string_to_metric_families

from foxhunt_obs.lib.alerts.rules import load_rules
from foxhunt_obs.lib.ingest.ray_series import RayCatalogError, load_ray_catalog
from foxhunt_obs.lib.schemas import RAY_SAMPLES
from foxhunt_obs.sandbox.writers.openmetrics import RAY_METRICS
from foxhunt_obs_tests.paths import REAL

PAGE = REAL / "ray" / "ray-2.6.1-worker.prom"
_MATCHER = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)(=~|!~|!=|=)"([^"]*)"')


def samples() -> list[tuple[str, dict[str, str], float]]:
    return [
        (s.name, s.labels, s.value)
        for f in text_string_to_metric_families(PAGE.read_text())
        for s in f.samples
    ]


def matches(selector: str, name: str, labels: dict[str, str]) -> bool:
    """A PromQL selector (name plus =, !=, =~, !~ matchers) against one sample."""
    metric, _, rest = selector.partition("{")
    if metric != name:
        return False
    for key, op, want in _MATCHER.findall(rest):
        have = labels.get(key, "")
        ok = {
            "=": have == want,
            "!=": have != want,
            "=~": re.fullmatch(want, have) is not None,
            "!~": re.fullmatch(want, have) is None,
        }[op]
        if not ok:
            return False
    return True


def test_every_family_of_the_real_page_is_read_by_a_column():
    ray = load_ray_catalog()
    families = {name for name, _, _ in samples()}
    assert families == {
        "ray_resources",
        "ray_object_store_memory",
        "ray_object_store_used_memory",
        "ray_object_store_available_memory",
        "ray_actors",
        "ray_tasks",
    }
    assert families <= ray.metric_names()


def test_each_spelling_on_the_page_selects_its_samples():
    """What each source picks from the real page: the object store both ways (2.6.1 exports both spellings,
    with the same capacity), tasks by state, nothing of the executor's actor sub-states."""
    ray = load_ray_catalog()
    page = samples()

    def picked(column: str, source: int = 0) -> list[tuple[str, dict, float]]:
        names = next(c for c in ray.columns if c.name == column).sources[source].names
        return [s for s in page if any(matches(n, s[0], s[1]) for n in names)]

    capacity = [sum(v for *_, v in picked("object_store_capacity_bytes", i)) for i in (0, 1)]
    assert capacity == [2470442188.0, 2470442188.0]
    shm = picked("object_store_used_bytes")
    assert [(s[1]["Location"], s[2]) for s in shm] == [("MMAP_SHM", 0.0)]  # not SPILLED, DISK, HEAP
    assert {s[1]["State"] for s in picked("tasks_running")} == {"RUNNING", "RUNNING_IN_RAY_WAIT"}
    assert [s[1]["Name"] for s in picked("tasks_pending")] == ["ServeController.listen_for_change"]
    assert picked("actors_alive") == []  # Source="executor" here: the GCS's counts come from the head
    assert picked("gpus_total") == []  # a CPU-only node: no GPU resource at all (null, never 0)


def test_the_sandbox_writes_only_families_the_catalog_reads():
    assert set(RAY_METRICS) <= load_ray_catalog().metric_names()


def test_the_ray_rules_read_catalog_names():
    """Every Ray series a Ray rule reads is a catalog spelling (or the autoscaler's failed-node count, which
    only an autoscaler writes: reporter_agent.py)."""
    names = load_ray_catalog().metric_names() | {"ray_cluster_failed_nodes"}
    rules = [r for r in load_rules() if r.id.startswith("ray_")]
    assert {r.id for r in rules} == {"ray_worker_lost", "ray_scheduling_stall", "ray_object_store_full"}
    for r in rules:
        used = set(re.findall(r"\b(ray_[a-z_]+)\{", r.expr())) - {"ray_io_cluster"}
        assert used and used <= names, (r.id, used - names)


def test_the_lost_worker_rule_reads_the_ingests_ray_targets():
    """The alert and the ingest's alive flag count the same `up` series: Ray's metrics port only (Ray's
    guide's head PodMonitor also scrapes as-metrics and dash-metrics), or a target without `endpoint`."""
    ray = load_ray_catalog()
    assert ray.up() == 'up{ray_io_cluster!="",endpoint=~"metrics|"}'
    (rule,) = [r for r in load_rules() if r.id == "ray_worker_lost"]
    assert ray.up() in rule.expr()
    assert rule.expr().count("up{") == 1


def test_columns_are_ray_samples_columns_and_core_ones_are_object_store():
    ray = load_ray_catalog()
    assert {c.name for c in ray.columns} <= set(RAY_SAMPLES.schema.names)
    assert {c.name for c in ray.columns if c.core} == {
        "object_store_used_bytes",
        "object_store_capacity_bytes",
    }
    assert ray.target_cluster_label == "ray_io_cluster" and ray.head == "head"


def test_a_malformed_catalog_names_the_file_and_the_entry(tmp_path):
    bad = tmp_path / "ray.yaml"
    bad.write_text(
        textwrap.dedent(
            """
            target: {cluster_label: ray_io_cluster}
            kube: {cluster_label: ray.io/cluster, node_type_label: ray.io/node-type, head: head}
            columns:
              gpus_total: {unit: GPUs, sources: [{names: ['ray_resources{Name=GPU}']}]}
            """
        )
    )
    with pytest.raises(RayCatalogError, match=r"ray\.yaml.*gpus_total.*not a metric selector"):
        load_ray_catalog(bad)
    bad.write_text(bad.read_text().replace("gpus_total", "gpu_count").replace("Name=GPU", 'Name="GPU"'))
    with pytest.raises(RayCatalogError, match="gpu_count: not a ray_samples column"):
        load_ray_catalog(bad)
    bad.write_text(bad.read_text().replace("gpu_count", "gpus_total"))
    with pytest.raises(RayCatalogError, match="KeyError.*metrics_endpoint"):
        load_ray_catalog(bad)
    bad.write_text(
        bad.read_text().replace(
            "{cluster_label: ray_io_cluster}",
            '{cluster_label: ray_io_cluster, metrics_endpoint: "metrics|.*"}',
        )
    )
    with pytest.raises(RayCatalogError, match=r"metrics_endpoint 'metrics\|\.\*' is not a port name"):
        load_ray_catalog(bad)
