"""assetkit: a table function's Built as the asset's metadata and checks, its expected errors as one
scrubbed Failure; and a table function on an empty lake says what is missing."""

import math
from datetime import date

import dagster as dg
import numpy as np
import pytest

from foxhunt_obs import assetkit
from foxhunt_obs.lib.delivery.send import ReportDelivery
from foxhunt_obs.lib.lake import Lake
from foxhunt_obs.lib.tables import Built, Check, LakePath, Markdown, MissingInput
from foxhunt_obs.lib.tables.weekly import weekly_cost_report


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
