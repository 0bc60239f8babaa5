import textwrap

import pytest

from foxhunt_obs.lib.analysis.catalog import (
    CatalogError,
    first_label,
    holder_labels,
    kube_label_name,
    load_catalog,
    node_of,
)

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
    """dcgm-exporter 4.9-style: a new name in a new unit is one more source line in the YAML."""
    text = (load_catalog.__globals__["DEFAULT_PATH"]).read_text()
    extra = (
        "      - {name: DCGM_FI_DEV_GPU_UTIL_RATIO, exporter: dcgm-exporter>=4.9, unit: ratio, scale: 1}\n"
    )
    anchor = "      - {name: DCGM_FI_DEV_GPU_UTIL, exporter: dcgm-exporter, unit: percent, scale: 0.01}\n"
    path = tmp_path / "catalog.yaml"
    path.write_text(text.replace(anchor, anchor + extra))
    names = load_catalog(path).source_names()
    assert names["DCGM_FI_DEV_GPU_UTIL_RATIO"] == ("util", 1.0)
    assert names["DCGM_FI_DEV_GPU_UTIL"] == ("util", 0.01)


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


def test_an_exporter_pod_holds_no_gpu():
    """honor_labels off: an unheld GPU's series keeps the dcgm-exporter pod's own labels only."""
    catalog = load_catalog()
    lab = catalog.labels
    exporter = {
        "pod": "nvidia-dcgm-exporter-x",
        "namespace": "gpu-operator",
        "container": "nvidia-dcgm-exporter",
    }
    idle = holder_labels({**exporter, "gpu": "1"}, catalog)
    assert idle == {"gpu": "1"}
    assert [first_label(idle, lab[k]) for k in ("namespace", "pod", "container")] == ["", "", ""]
    held = holder_labels(
        {
            **exporter,
            "exported_pod": "trainer-0",
            "exported_namespace": "rl",
            "exported_container": "learner",
        },
        catalog,
    )
    assert [first_label(held, lab[k]) for k in ("namespace", "pod", "container")] == [
        "rl",
        "trainer-0",
        "learner",
    ]
    # honor_labels on (our ServiceMonitor): the plain labels are the holder's and stay
    own = {"pod": "trainer-1", "namespace": "rl", "container": "main"}
    assert holder_labels(own, catalog) is own


def test_exporter_containers_must_be_container_names(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text(
        textwrap.dedent("""
        labels: {}
        gpu_query: x
        exporter_containers: ["dcgm|.*"]
        gpu_metrics: {}
        node_metrics: {}
        kube: {}
    """)
    )
    with pytest.raises(CatalogError, match=r"bad.yaml.*'dcgm\|\.\*' is not a container name"):
        load_catalog(path)


def test_kube_label_name():
    assert kube_label_name("experiment") == "label_experiment"
    assert kube_label_name("app.kubernetes.io/part-of") == "label_app_kubernetes_io_part_of"
