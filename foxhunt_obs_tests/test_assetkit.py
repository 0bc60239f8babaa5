"""assetkit: a table function's Built as the asset's metadata and checks, its expected errors as one
scrubbed Failure; and a table function on an empty lake says what is missing."""

import ast
import math
from datetime import date

import dagster as dg
import numpy as np
import pytest

from foxhunt_obs import assetkit
from foxhunt_obs.lib.delivery.send import ReportDelivery
from foxhunt_obs.lib.errors import InputError
from foxhunt_obs.lib.lake import Lake
from foxhunt_obs.lib.tables import Built, Check, LakePath, Markdown, MissingInput
from foxhunt_obs.lib.tables.weekly import weekly_cost_report
from foxhunt_obs_tests.paths import REPO


def test_a_built_is_the_assets_metadata_then_its_checks():
    built = Built(
        {},
        {
            "rows": 3,
            "usd": 1.5,
            "nan": math.nan,
            "md": Markdown("| a |"),
            "path": LakePath("/l/r.html"),
            "t": "x",
        },
        [Check("sums_to_the_bill", False, {"mismatches": "2026-11-16: 1 vs 2"})],
    )
    materialized, check = list(assetkit.results(built))
    m = materialized.metadata
    assert isinstance(m["rows"], dg.IntMetadataValue) and m["rows"].value == 3
    assert isinstance(m["usd"], dg.FloatMetadataValue) and math.isnan(m["nan"].value)
    assert isinstance(m["md"], dg.MarkdownMetadataValue) and isinstance(m["path"], dg.PathMetadataValue)
    assert isinstance(m["t"], dg.TextMetadataValue)
    # numpy's numbers (pandas sums, DuckDB frames) are numbers, not text
    numpy = {
        k: assetkit.metadata_value(v)
        for k, v in {"i": np.int64(2), "f": np.float64(0.5), "b": np.bool_(True)}.items()
    }
    assert isinstance(numpy["i"], dg.IntMetadataValue) and isinstance(numpy["f"], dg.FloatMetadataValue)
    assert isinstance(numpy["b"], dg.BoolMetadataValue)
    assert check.check_name == "sums_to_the_bill" and not check.passed
    assert check.metadata["mismatches"].value == "2026-11-16: 1 vs 2"


def test_a_week_with_no_tables_fails_saying_what_to_run(tmp_path):
    lake = Lake(str(tmp_path / "lake"))
    with pytest.raises(MissingInput, match="week=2026-11-16: no utilization_per_dollar rows"):
        weekly_cost_report(lake, date(2026, 11, 16), "util", ReportDelivery())
    with pytest.raises(dg.Failure, match="materialize the week's cost_allocation and utilization_per_dollar"):
        assetkit.build(weekly_cost_report, lake, date(2026, 11, 16), "util", ReportDelivery())


def test_an_input_error_subclass_is_a_failed_step_without_touching_assetkit(monkeypatch):
    """Any InputError, even one declared after assetkit was imported, fails the step with its message
    scrubbed of a configured secret and no chained cause; any other exception stays a bug, traceback and all."""
    monkeypatch.setenv("FOXHUNT_PROMETHEUS_BEARER_TOKEN", "xoxb-not-a-real-token-42")

    class TomorrowsSourceError(InputError, RuntimeError):
        pass

    def table_function():
        raise TomorrowsSourceError("tomorrow's source refused xoxb-not-a-real-token-42: check its URL")

    with pytest.raises(dg.Failure) as failed:
        assetkit.build(table_function)
    assert failed.value.description == "tomorrow's source refused ***: check its URL"
    assert failed.value.__cause__ is None and failed.value.__suppress_context__

    def buggy_table_function():
        raise KeyError("a bug")

    with pytest.raises(KeyError, match="a bug"):
        assetkit.build(buggy_table_function)


# lib/ errors that are the code's own fault, or no error at all: a TableSpec Athena cannot declare, report
# frames our own SQL got wrong, a template in the packaged alert catalog with no Prometheus equivalent
NOT_AN_INPUTS_FAULT = {"DdlError", "_AwsError", "ReportDataError", "TemplateConversionError"}


def test_every_error_class_in_lib_is_an_input_error():
    """Each `class ...Error` (and MissingInput, FewerRows, LiveCostMissing) declared in foxhunt_obs/lib
    derives from InputError, so assetkit needs no list of them; the bugs of NOT_AN_INPUTS_FAULT do not (a
    bug keeps its traceback)."""
    import importlib

    checked, bugs = [], []
    for path in sorted((REPO / "foxhunt_obs" / "lib").rglob("*.py")):
        module = None
        for node in ast.parse(path.read_text()).body:
            if not isinstance(node, ast.ClassDef):
                continue
            bases = {ast.unparse(b) for b in node.bases}
            if not any(b.endswith(("Error", "Exception")) or b == "InputError" for b in bases):
                continue
            dotted = ".".join(path.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__")
            module = module or importlib.import_module(dotted)
            cls = getattr(module, node.name)
            if node.name in NOT_AN_INPUTS_FAULT:
                assert not issubclass(cls, InputError), f"{dotted}.{node.name} is a bug, no InputError"
                bugs.append(node.name)
                continue
            assert issubclass(cls, InputError), f"{dotted}.{node.name} is no InputError (lib/errors.py)"
            checked.append(node.name)
    assert {"MissingInput", "FewerRows", "LakeError", "PrometheusError", "MlflowSourceError"} <= set(checked)
    assert sorted(bugs) == sorted(NOT_AN_INPUTS_FAULT)


@pytest.mark.parametrize("asset, catalog", [("gpu_samples", "metric"), ("ray_samples", "metric"),
                                            ("ray_samples", "ray")])  # fmt: skip
def test_a_broken_catalog_fails_the_ingest_step_with_its_message(asset, catalog, tmp_path, monkeypatch):
    """A catalog edited wrong in a deployment (data/metric_catalog.yaml, data/ray_metrics.yaml: a selector
    Prometheus cannot parse) fails the step with the CatalogError's message, no traceback, before any query
    (nothing listens at the Prometheus URL)."""
    from foxhunt_obs.defs.gpu.assets import gpu_samples
    from foxhunt_obs.defs.ray.assets import ray_samples
    from foxhunt_obs.defs.resources import ClusterResource, LakeResource, PrometheusResource
    from foxhunt_obs.lib.ingest import metric_catalog, ray_series

    module, line, name, typo = {
        "metric": (metric_catalog, "{name: DCGM_FI_DEV_GPU_UTIL,", "DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV GPU_UTIL"),
        "ray": (ray_series, "{names: [ray_object_store_used_memory], since", "ray_object_store_used_memory",
                "ray_object store_used_memory"),
    }[catalog]  # fmt: skip
    text = module.DEFAULT_PATH.read_text()
    assert text.count(line) == 1
    broken = tmp_path / module.DEFAULT_PATH.name
    broken.write_text(text.replace(line, line.replace(name, typo)))
    monkeypatch.setattr(module, "DEFAULT_PATH", broken)

    result = dg.materialize(
        [{"gpu_samples": gpu_samples, "ray_samples": ray_samples}[asset]],
        partition_key="2026-11-02-00:00",
        resources={
            "lake": LakeResource.from_env(root=str(tmp_path / "lake")),
            "prometheus": PrometheusResource.from_env(url="http://127.0.0.1:9"),  # discard port: never asked
            "cluster": ClusterResource.from_env(),
        },
        raise_on_error=False,
    )
    assert not result.success
    (failed,) = result.get_step_failure_events()
    error = failed.step_failure_data.error
    assert error.cls_name == "Failure" and error.cause is None and error.context is None
    description = failed.step_failure_data.user_failure_data.description
    assert description.startswith(f"{'Ray' if catalog == 'ray' else 'metric'} catalog {broken}: malformed")
    assert typo in description
    assert not (tmp_path / "lake").exists()
