"""Every lake table is described once, in lib/schemas.py: its text (TableSpec.doc) and a note for each of
its columns (TableSpec.columns), which the asset descriptions, `dagster/column_schema`, the Athena DDL's
comments and the tables reference page are made from."""

import re

import pyarrow as pa
import pytest

from foxhunt_obs.lib.schemas import TABLES, TableSpec

# A column named for its unit says that unit in its note (the name alone is no description).
UNIT_WORDS = {
    "_bytes": ("bytes",),
    "_usd": ("USD", "$"),
    "_kwh": ("kWh",),
    "_celsius": ("Celsius",),
    "_watts": ("watts",),
    "_hz": ("hertz",),
    "_joules": ("joules",),
}


@pytest.mark.parametrize("spec", TABLES.values(), ids=list(TABLES))
def test_every_column_has_a_note_and_every_note_a_column(spec: TableSpec):
    names = spec.schema.names
    assert list(spec.columns) == names, (
        f"{spec.name}: columns without a note {sorted(set(names) - set(spec.columns))}, "
        f"notes naming no column {sorted(set(spec.columns) - set(names))}"
    )
    assert spec.doc.strip() and "\n" not in spec.doc, spec.name
    for column, note in spec.columns.items():
        assert note.strip() and "\n" not in note, f"{spec.name}.{column}: {note!r}"
        assert note.strip().lower() != column.replace("_", " "), f"{spec.name}.{column}: the name again"
        for suffix, words in UNIT_WORDS.items():
            if column.endswith(suffix):
                assert any(w in note for w in words), f"{spec.name}.{column}: say its unit ({words[0]})"


def test_notes_are_no_parquet_field_metadata():
    # written beside the spec, never into the files: the schema (and so each file's bytes) is unchanged
    for spec in TABLES.values():
        assert spec.schema.metadata is None and all(f.metadata is None for f in spec.schema), spec.name


def test_define_keeps_order_types_and_notes_and_the_spec_stays_hashable():
    spec = TableSpec.define(
        "t", "day", "A table.", [("b", pa.int64(), "second letter"), ("a", pa.string(), "first letter")]
    )
    assert spec.schema == pa.schema([("b", pa.int64()), ("a", pa.string())])
    assert dict(spec.columns) == {"b": "second letter", "a": "first letter"}
    with pytest.raises(TypeError):
        spec.columns["c"] = "no"  # read-only
    assert len({spec, TABLES["gpu_samples"]}) == 2  # hashable: the notes take no part in the hash


def test_the_lakes_table_names_are_plain():
    assert all(re.fullmatch(r"[a-z_]+", name) for name in TABLES)
