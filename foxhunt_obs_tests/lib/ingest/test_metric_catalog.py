import textwrap

import pytest

from foxhunt_obs.lib.ingest.metric_catalog import (
    CatalogError,
    ScrapeTargets,
    first_label,
    kube_label_name,
    load_catalog,
    node_of,
)
from foxhunt_obs_tests.paths import REAL

NODE_LABELS = ("node", "kubernetes_node", "Hostname", "hostname", "instance")


def test_catalog_maps_every_seed_metric_with_its_unit():
    names = load_catalog().source_names()
    assert names["DCGM_FI_DEV_GPU_UTIL"] == ("util", 0.01)  # % -> ratio
    assert names["DCGM_FI_DEV_FB_USED"] == ("mem_used_bytes", 1048576)  # MiB -> bytes
    assert names["DCGM_FI_DEV_FB_FREE"] == ("mem_free_bytes", 1048576)
    assert names["DCGM_FI_DEV_SM_CLOCK"] == ("sm_clock_hz", 1e6)  # MHz -> Hz
    assert names["DCGM_FI_DEV_MEM_CLOCK"] == ("mem_clock_hz", 1e6)
    assert names["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"] == ("energy_joules", 0.001)  # mJ -> J
    assert names["DCGM_FI_DEV_GPU_TEMP"] == ("temp_celsius", 1)
    assert names["DCGM_FI_DEV_POWER_USAGE"] == ("power_watts", 1)
    assert names["DCGM_FI_DEV_ECC_SBE_VOL_TOTAL"][0] == "ecc_sbe_total"
    assert names["DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"][0] == "ecc_dbe_total"
    assert names["DCGM_FI_DEV_XID_ERRORS"][0] == "xid_last"
    assert names["DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL"][0] == "nvlink_bandwidth_total"
    assert names["DCGM_FI_PROF_GR_ENGINE_ACTIVE"] == ("gr_engine_active", 1)
    assert names["foxhunt_gpu_utilization_percent"] == ("util", 0.01)
    assert names["foxhunt_gpu_memory_used_bytes"] == ("mem_used_bytes", 1)
    assert names["foxhunt_gpu_memory_total_bytes"] == ("mem_total_bytes", 1)
    assert names["foxhunt_gpu_temperature_celsius"] == ("temp_celsius", 1)
    assert names["foxhunt_gpu_power_draw_watts"] == ("power_watts", 1)


def test_catalog_columns_are_gpu_samples_columns():
    from foxhunt_obs.lib.schemas import GPU_SAMPLES

    catalog = load_catalog()
    for m in catalog.gpu_metrics:
        assert m.column in GPU_SAMPLES.schema.names
        assert all(c in GPU_SAMPLES.schema.names for c in m.otherwise_sum_of)
    assert catalog.gpu_metric("mem_total_bytes").otherwise_sum_of == ("mem_used_bytes", "mem_free_bytes")


def test_a_rename_with_a_unit_change_is_a_data_change(tmp_path):
    """A new field name in a new unit is one more source line in the YAML (the name here is made up)."""
    text = (load_catalog.__globals__["DEFAULT_PATH"]).read_text()
    anchor = "      - {name: DCGM_FI_DEV_GPU_UTIL, exporter: dcgm-exporter, unit: percent, scale: 0.01}"
    extra = "\n      - {name: DCGM_FI_DEV_EXAMPLE_UTIL_FRACTION, exporter: future, unit: ratio, scale: 1}"
    assert anchor in text
    path = tmp_path / "catalog.yaml"
    path.write_text(text.replace(anchor, anchor + extra, 1))
    names = load_catalog(path).source_names()
    assert names["DCGM_FI_DEV_EXAMPLE_UTIL_FRACTION"] == ("util", 1.0)
    assert names["DCGM_FI_DEV_GPU_UTIL"] == ("util", 0.01)


def test_dcgm_field_names_as_verified():
    """Names and units as DCGM's dcgm_fields.h gives them (the catalog's header cites each version)."""
    names = load_catalog().source_names()
    # DCGM 4.6.0: new primary names for the same field ids and units (203 is still integer percent)
    assert names["DCGM_FI_DEV_GPU_UTIL_RATIO"] == ("util", 0.01)
    assert names["DCGM_FI_DEV_GPU_TEMP_CELSIUS"] == ("temp_celsius", 1.0)
    assert names["DCGM_FI_DEV_BOARD_POWER_WATTS"] == ("power_watts", 1.0)
    assert names["DCGM_FI_PROF_GR_ENGINE_UTIL_RATIO"] == ("gr_engine_active", 1.0)
    # DCGM 4.6.1: new field ids in base units
    assert names["DCGM_FI_DEV_SM_CLOCK_HERTZ"] == ("sm_clock_hz", 1.0)
    assert names["DCGM_FI_DEV_GPU_ENERGY_JOULES_TOTAL"] == ("energy_joules", 1.0)
    assert names["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"] == ("energy_joules", 0.001)  # mJ
    assert names["DCGM_FI_DEV_FB_RESERVED"] == ("mem_reserved_bytes", 1048576.0)  # MiB
    # exists in neither DCGM 4.6.0, go-dcgm's 4.6.1 header nor any counters file
    assert "DCGM_FI_DEV_FB_CAPACITY_BYTES" not in names


def test_every_stock_counter_the_catalog_reads_is_in_a_stock_counters_file():
    """The dcgm-exporter names the catalog lists without a DCGM >= 4.6 mark are enabled (uncommented) in
    at least one of the counters files dcgm-exporter ships (fixtures/real/dcgm/counters/) — except the
    ECC volatile totals and SM activity, which every stock file comments out (the README says how to
    enable them)."""
    counters = REAL / "dcgm" / "counters"
    enabled, commented = set(), set()
    for f in counters.glob("*.csv"):
        for line in f.read_text().splitlines():
            field = line.strip().split(",")[0].strip()
            if field.startswith("# DCGM_FI_") or field.startswith("#DCGM_FI_"):
                commented.add(field.lstrip("# "))
            elif field.startswith("DCGM_FI_"):
                enabled.add(field)
    catalog = load_catalog()
    stock = {
        s.name
        for m in catalog.gpu_metrics
        for s in m.sources
        if s.exporter.startswith("dcgm-exporter") and ">=" not in s.exporter
    }
    opt_in = {"DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "DCGM_FI_PROF_SM_ACTIVE"}
    assert stock - opt_in <= enabled, sorted(stock - opt_in - enabled)
    assert opt_in <= commented and not opt_in & enabled


def test_bad_catalogs_are_refused_with_the_path(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text(
        textwrap.dedent("""
        labels: {}
        gpu_query: x
        gpu_metrics:
          util: {unit: ratio, sources: [{name: "not a name", exporter: x, unit: x, scale: 1}]}
        node_metrics: {}
        kube: {}
    """)
    )
    with pytest.raises(CatalogError, match="bad.yaml"):
        load_catalog(path)


@pytest.mark.parametrize(
    ("labels", "node"),
    [
        ({"Hostname": "ip-1", "instance": "10.0.0.1:9400"}, "ip-1"),  # dcgm-exporter before 4.8
        ({"hostname": "ip-1", "instance": "10.0.0.1:9400"}, "ip-1"),  # dcgm-exporter 4.8+
        ({"node": "ip-9", "Hostname": "dcgm-exporter-abcde"}, "ip-9"),  # scrape config adds the node
        ({"kubernetes_node": "ip-8", "Hostname": "dcgm-exporter-abcde"}, "ip-8"),
        ({"instance": "ip-7:9100"}, "ip-7"),  # node_exporter: the port goes
        ({"instance": "[::1]:9100"}, "::1"),
        ({"instance": "ip-7"}, "ip-7"),
        ({}, ""),
    ],
)
def test_node_resolution(labels, node):
    assert node_of(labels, NODE_LABELS) == node


def test_pod_labels_prefer_exported_ones():
    lab = load_catalog().labels
    series = {"pod": "dcgm-exporter-x", "exported_pod": "trainer-0", "namespace": "gpu-operator"}
    assert first_label(series, lab["pod"]) == "trainer-0"
    assert first_label(series, lab["namespace"]) == "gpu-operator"
    assert (
        first_label({"UUID": "GPU-1"}, lab["uuid"]) == first_label({"uuid": "GPU-1"}, lab["uuid"]) == "GPU-1"
    )
    assert first_label({}, lab["pod"]) == ""


EXPORTER_TARGET = {
    "job": "gpu-operator/nvidia-dcgm-exporter",
    "instance": "10.0.1.23:9400",
    "pod": "nvidia-dcgm-exporter-x",
    "namespace": "gpu-operator",
    "container": "nvidia-dcgm-exporter",
}
TARGETS = ScrapeTargets(
    frozenset(
        {("gpu-operator/nvidia-dcgm-exporter", "10.0.1.23:9400", "gpu-operator", "nvidia-dcgm-exporter-x")}
    )
)


def test_the_scrape_targets_own_pod_holds_no_gpu_under_honor_labels_false():
    """honor_labels off (the GPU Operator's and the official chart's ServiceMonitors): the plain pod is
    the target's; an unheld GPU has no exported_pod and so keeps only the target's."""
    catalog = load_catalog()
    assert TARGETS.holder({**EXPORTER_TARGET, "gpu": "1"}, catalog) == ("", "", "")
    held = {
        **EXPORTER_TARGET,
        "exported_pod": "trainer-0",
        "exported_namespace": "rl",
        "exported_container": "learner",
    }
    assert TARGETS.holder(held, catalog) == ("rl", "trainer-0", "learner")


def test_whatever_the_exporter_container_is_called():
    """NVIDIA's Helm chart names its container `exporter`: no name list decides, the target does."""
    catalog = load_catalog()
    chart = {**EXPORTER_TARGET, "container": "exporter"}
    assert TARGETS.holder(chart, catalog) == ("", "", "")


def test_honor_labels_true_keeps_the_exposed_holder():
    """honor_labels on: the exporter's own pod label wins over the target's; a series without one
    (an unheld GPU) carries the target's pod, which is then no holder."""
    catalog = load_catalog()
    own = {**EXPORTER_TARGET, "pod": "trainer-1", "namespace": "rl", "container": "main"}
    assert TARGETS.holder(own, catalog) == ("rl", "trainer-1", "main")
    # the same pod name as a target of ANOTHER job (a trainer's own :9094 endpoint) still holds its GPU
    other = ScrapeTargets(frozenset({("training", "10.0.1.50:9094", "rl", "trainer-1")}))
    assert other.holder(own, catalog) == ("rl", "trainer-1", "main")


def test_no_target_pod_no_change_unless_the_container_is_named():
    """Static configs: `up` has no pod; FOXHUNT_EXPORTER_CONTAINERS names the exporter containers."""
    catalog = load_catalog()
    static = {
        "job": "dcgm",
        "instance": "gpu-1:9400",
        "pod": "dcgm-exporter-abc",
        "namespace": "monitoring",
        "container": "dcgm-exporter",
    }
    assert ScrapeTargets().holder(static, catalog) == ("monitoring", "dcgm-exporter-abc", "dcgm-exporter")
    named = ScrapeTargets(containers=frozenset({"dcgm-exporter"}))
    assert named.holder(static, catalog) == ("", "", "")
    held = {
        **static,
        "exported_pod": "trainer-0",
        "exported_namespace": "rl",
        "exported_container": "learner",
    }
    assert named.holder(held, catalog) == ("rl", "trainer-0", "learner")


def test_catalog_references_must_be_gpu_metrics(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text(
        textwrap.dedent("""
        labels: {}
        gpu_query: x
        gpu_metrics:
          util: {record: "foxhunt:u", unit: ratio, otherwise: nope, sources: [{name: X, exporter: e, unit: u, scale: 1}]}
        node_metrics: {}
        kube: {}
    """)
    )
    with pytest.raises(CatalogError, match=r"bad.yaml.*util: refers to 'nope'"):
        load_catalog(path)


def test_kube_label_name():
    assert kube_label_name("experiment") == "label_experiment"
    assert kube_label_name("app.kubernetes.io/part-of") == "label_app_kubernetes_io_part_of"


@pytest.mark.parametrize(
    "label, expected",
    [  # kubernetes/kube-state-metrics v2.20.0 internal/store/utils_test.go and README
        ("camelCase", "label_camel_case"),
        ("snake_camelCase", "label_snake_camel_case"),
        ("$app4", "label__app4"),
        ("0_app3", "label_0_app3"),
        ("node-role.kubernetes.io/master", "label_node_role_kubernetes_io_master"),
        ("experimentName", "label_experiment_name"),
    ],
)
def test_kube_label_name_as_kube_state_metrics_spells_it(label, expected):
    assert kube_label_name(label) == expected


def test_both_spellings_of_dcgm_exporters_node_label_name_the_node():
    """`Hostname` (every release up to 4.5.3-4.8.2) and `hostname` (dcgm-exporter main after NVIDIA/dcgm-exporter#655,
    its own server test's rendering): FOXHUNT_NODE_LABELS' default tries both."""
    from prometheus_client.parser import text_string_to_metric_families

    real = REAL / "dcgm"
    for page, node in (
        ("dcgm-exporter-main-hostname-lowercase-render-test.prom", "testhost"),
        ("dcgm-exporter-4x-gpu-operator-h100-pods.prom", "gpu-node-1"),
    ):
        samples = [s for f in text_string_to_metric_families((real / page).read_text()) for s in f.samples]
        assert samples and {node_of(s.labels, NODE_LABELS) for s in samples} == {node}, page
