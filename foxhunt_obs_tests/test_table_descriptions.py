"""Each lake table is described once (lib/schemas.py), and the code location shows that description: every
asset that writes a lake table says so in its metadata, its description starts from the table's text, and
its `dagster/column_schema` is the table's columns with their notes, before any run."""

import dagster as dg
import pytest

from foxhunt_obs.assetkit import LAKE_TABLES
from foxhunt_obs.definitions import defs
from foxhunt_obs.defs.alerts.sensors import WRITTEN_BY_SENSORS
from foxhunt_obs.lib.schemas import TABLES


@pytest.fixture(scope="module")
def lake_assets() -> dict[str, tuple[list[str], dict]]:
    """asset key -> (the lake tables it writes, its definition metadata), for every asset that writes one."""
    graph = defs().resolve_asset_graph()
    out = {}
    for key in graph.get_all_asset_keys():
        node = graph.get(key)
        if LAKE_TABLES in node.metadata:
            out[key.to_user_string()] = (list(node.metadata[LAKE_TABLES].value), node)
    return out


def test_every_lake_table_is_written_by_one_asset_named_after_it(lake_assets):
    writers: dict[str, list[str]] = {}
    for asset, (tables, _) in lake_assets.items():
        assert tables[0] == asset, f"{asset}: its own table first"
        for t in tables:
            assert t in TABLES, f"{asset} writes {t!r}, which lib/schemas.py does not know"
            writers.setdefault(t, []).append(asset)
    assert {t: w for t, w in writers.items() if len(w) > 1} == {}
    assert set(writers) == set(TABLES) - set(WRITTEN_BY_SENSORS)
    assert writers["training_history"] == ["training_runs"]  # its histories, cached per run


def test_each_lake_asset_shows_its_tables_description_and_columns(lake_assets):
    for asset, (tables, node) in lake_assets.items():
        for t in tables:
            assert TABLES[t].doc in node.description, f"{asset}: {t}'s text from lib/schemas.py"
        value = node.metadata["dagster/column_schema"]
        assert isinstance(value, dg.TableSchemaMetadataValue), asset
        spec = TABLES[asset]
        got = [(c.name, c.type, c.description) for c in value.schema.columns]
        want = [(f.name, str(f.type), spec.columns[f.name]) for f in spec.schema]
        assert got == want, asset
    # the types Dagster shows are Arrow's own names
    _, node = lake_assets["gpu_samples"]
    columns = {c.name: c.type for c in node.metadata["dagster/column_schema"].schema.columns}
    assert columns["ts"] == "timestamp[ms, tz=UTC]" and columns["util"] == "double"
    assert columns["node"].startswith("dictionary<values=string")


def test_an_asset_adds_what_it_does_after_the_tables_text(lake_assets):
    _, node = lake_assets["training_runs"]
    runs, history = TABLES["training_runs"].doc, TABLES["training_history"].doc
    assert node.description.startswith(f"{runs} Also writes training_history: {history} ")
    assert "histories that can have changed" in node.description


def test_each_kind_of_partition_is_described_once_and_the_key_matches_it():
    """schemas.PARTITIONS is the one description of the folder values: what it says a time partition's
    value looks like is what TableSpec.key writes, and the Athena DDL's partition comment is made from it."""
    import re
    from datetime import datetime, timezone

    from foxhunt_obs.lib import athena
    from foxhunt_obs.lib.schemas import PARTITIONS

    t = datetime(2026, 11, 22, 13, tzinfo=timezone.utc)
    for name, spec in TABLES.items():
        kind = PARTITIONS[spec.partition]
        assert athena.PARTITION_NOTES[spec.partition].startswith(f"the partition: {kind.describe()}"), name
        if kind.strftime:
            pattern = re.sub("[YMDH]", r"\\d", kind.value)
            assert re.fullmatch(pattern, spec.key(t)), (name, kind.value, spec.key(t))
        else:
            with pytest.raises(ValueError, match="no time key"):
                spec.key(t)
    assert {s.partition for s in TABLES.values()} == set(PARTITIONS)
