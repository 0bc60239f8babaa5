"""gpu_series without a server: provider ids, which instance a node is at each step, and the GPUs that
report no core column."""

import numpy as np
import pyarrow as pa
import pytest

from foxhunt_obs.lib.ingest.gpu_series import (
    Window,
    collect_node_samples,
    instance_id_of,
    missing_core_columns,
    node_instance_ids,
)
from foxhunt_obs.lib.ingest.metric_catalog import load_catalog
from foxhunt_obs.lib.schemas import GPU_SAMPLES, NODE_SAMPLES
from foxhunt_obs.lib.sources.prometheus import RangeResult

T0 = 1_794_787_200  # 2026-11-16T00:00Z


@pytest.mark.parametrize(
    ("provider_id", "instance_id"),
    [
        ("aws:///us-east-1a/i-0123456789abcdef0", "i-0123456789abcdef0"),
        ("aws:///eu-west-1c/i-0abc/", "i-0abc"),  # a trailing slash
        ("gce://my-project/us-central1-a/gke-pool-1-abcd", "gke-pool-1-abcd"),
        (
            "azure:///subscriptions/s/resourceGroups/rg/providers/Microsoft.Compute/virtualMachines/vm-7",
            "vm-7",
        ),
        ("kind://docker/kind/kind-worker", "kind-worker"),
        ("i-0bare", "i-0bare"),
        ("", ""),
    ],
)
def test_instance_id_is_the_last_component_of_the_provider_id(provider_id, instance_id):
    assert instance_id_of(provider_id) == instance_id


class FakeProm:
    """Answers kube_node_info's timestamp() range query with fixed series; every other query is empty."""

    queries_at_once = 1  # the queries' order is asserted

    def __init__(self, series: list[tuple[dict[str, str], list[tuple[float, float]]]]):
        self.series = series
        self.queries: list[str] = []

    def query_range(self, query, start, end, step, what=""):
        self.queries.append(query)
        if "kube_node_info" not in query:
            return RangeResult.empty()
        lengths = [len(points) for _, points in self.series]
        points = [p for _, ps in self.series for p in ps]
        return RangeResult(
            [labels for labels, _ in self.series],
            np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64),
            np.array([t for t, _ in points], float),
            np.array([v for _, v in points], float),
        )

    def query(self, query, at, what=""):
        return []


def _info(node: str, provider_id: str) -> dict[str, str]:
    return {"node": node, "provider_id": provider_id}


def test_the_newest_series_names_the_instance():
    # i-old's last sample is at T0+15; i-new appears at T0+30 while i-old is still in the look-back.
    prom = FakeProm(
        [
            (_info("n1", "aws:///us-east-1a/i-old"), [(T0, T0), (T0 + 15, T0 + 15), (T0 + 30, T0 + 15)]),
            (_info("n1", "aws:///us-east-1a/i-new"), [(T0 + 30, T0 + 30), (T0 + 45, T0 + 45)]),
            (_info("", "aws:///us-east-1a/i-nonode"), [(T0, T0)]),
            (_info("n2", ""), [(T0, T0)]),
        ]
    )
    window = Window(T0, T0 + 60, 15, "node_samples test")
    ids = node_instance_ids(prom, load_catalog(), window)
    assert prom.queries == ['max by (node, provider_id) (timestamp(kube_node_info{provider_id!=""}))']
    assert ids.num_rows == 5 and set(ids["node"].to_pylist()) == {"n1"}

    # n1 reports at every step, n2 (no provider id) and n3 (no kube_node_info) at the first one
    ts = [T0 * 1000 + k * 15_000 for k in range(4)] + [T0 * 1000, T0 * 1000]
    counts = pa.table(
        {
            "ts": pa.array(ts, GPU_SAMPLES.schema.field("ts").type),
            "node": ["n1"] * 4 + ["n2", "n3"],
            "gpus_reporting": pa.array([8] * 6, pa.int64()),
        }
    )
    table = collect_node_samples(prom, load_catalog(), window, node_labels=("node",), gpu_counts=counts)
    assert table.schema == NODE_SAMPLES.schema
    got = list(zip(table["node"].to_pylist(), table["instance_id"].to_pylist()))
    assert got == [("n1", "i-old"), ("n2", ""), ("n3", ""), ("n1", "i-old"), ("n1", "i-new"), ("n1", "i-new")]


class AnonymousProm(FakeProm):
    """DCGM_FI_DEV_GPU_UTIL as two series stripped of every identifying label (a relabelling that
    dropped gpu, UUID, Hostname and instance): merged they would look like one GPU."""

    def query_range(self, query, start, end, step, what=""):
        self.queries.append(query)
        if "DCGM_FI_DEV_GPU_UTIL)" not in query and "DCGM_FI_DEV_GPU_UTIL[" not in query:
            return RangeResult.empty()
        return RangeResult(
            [{"job": "dcgm"}, {"job": "dcgm"}],
            np.array([0, 1, 2], np.int64),
            np.array([T0, T0], float),
            np.array([50.0, 90.0]),
        )


def test_series_without_identifying_labels_are_refused_with_the_query():
    from foxhunt_obs.lib.ingest.gpu_series import IngestError, collect_gpu_samples

    window = Window(T0, T0 + 60, 15, "gpu_samples partition 2026-11-16T00")
    with pytest.raises(IngestError, match=r"gpu_samples partition 2026-11-16T00: 2 of 2 series of "
                       r"last_over_time\(DCGM_FI_DEV_GPU_UTIL\[14999ms\]\) carry no node"):  # fmt: skip
        collect_gpu_samples(AnonymousProm([]), load_catalog(), window, node_labels=("node", "instance"))


def _missing_by_sql(table: pa.Table, catalog) -> dict[str, int]:
    """The previous implementation's query (DuckDB, a connection per call): the oracle."""
    from foxhunt_obs.lib.duck import scratch

    out = {}
    with scratch(t=table) as con:
        for m in (m for m in catalog.gpu_metrics if m.core):
            lacking = con.execute(
                f"""SELECT count(*) FROM (SELECT node, gpu, uuid, gpu_instance FROM t GROUP BY ALL
                    HAVING count(*) FILTER (WHERE {m.column} IS NOT NULL AND NOT isnan({m.column})) = 0)"""
            ).fetchone()[0]
            if lacking:
                out[m.column] = lacking
    return out


@pytest.mark.parametrize("seed", range(6))
def test_missing_core_columns_counts_the_gpus_with_no_value_as_the_sql_did(seed):
    """GPUs (and MIG slices: gpu_instance, NULL for a whole GPU) whose core columns are all NULL, all NaN,
    a mix of both, or have one real value among them; dictionary labels, as the lake holds them."""
    catalog = load_catalog()
    core = [m.column for m in catalog.gpu_metrics if m.core]
    rng = np.random.default_rng(seed)
    n = 400
    columns = {
        "node": pa.array(rng.choice(["a", "b"], n)).dictionary_encode(),
        "gpu": pa.array(rng.integers(0, 3, n), pa.int32()),
        "uuid": pa.array([f"GPU-{g}" for g in rng.integers(0, 4, n)]).dictionary_encode(),
        "gpu_instance": pa.array([None if x < 0 else int(x) for x in rng.integers(-1, 2, n)], pa.int32()),
    }
    for c in core:
        kind = rng.integers(0, 4, n)  # 0 value, 1 NULL, 2 NaN, 3 NULL: values are rare
        values = np.where(kind == 2, np.nan, rng.random(n))
        values = np.where(rng.random(n) < 0.9, np.where(kind == 0, np.nan, values), values)
        columns[c] = pa.array(values, mask=(kind % 2 == 1))
    table = pa.table(columns)
    got = missing_core_columns(table, catalog)
    expected = _missing_by_sql(table, catalog)
    assert {c: v["gpus"] for c, v in got.items()} == expected
    assert expected  # the case exercises some lacking GPUs
    groups = len(
        {r for r in zip(*(table.column(k).to_pylist() for k in ("node", "gpu", "uuid", "gpu_instance")))}
    )
    assert all(v["of"] == groups for v in got.values())
    assert missing_core_columns(table.slice(0, 0), catalog) == {}
    # two chunks, each label column with a dictionary of its own (as a concatenation of hours has)
    halves = pa.concat_tables([table.slice(0, n // 2), _recode(table.slice(n // 2))])
    assert halves.column("uuid").num_chunks == 2
    assert {c: v["gpus"] for c, v in missing_core_columns(halves, catalog).items()} == expected


def _recode(table: pa.Table) -> pa.Table:
    """The same values with freshly built dictionaries (another order of the values)."""
    for name in ("node", "uuid"):
        values = table.column(name).cast(pa.string())
        order = pa.array(sorted(set(values.to_pylist()), reverse=True))
        indices = pa.compute.index_in(values, value_set=order)
        table = table.set_column(
            table.schema.get_field_index(name), name, pa.DictionaryArray.from_arrays(indices, order)
        )
    return table
