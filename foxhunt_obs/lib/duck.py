"""Scratch DuckDB: an in-memory database over Arrow tables, for the queries a module runs on rows it holds
(the lake's own reads go through Lake.connect)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import duckdb
import pyarrow as pa


@contextmanager
def scratch(**tables: pa.Table) -> Iterator[duckdb.DuckDBPyConnection]:
    """An in-memory DuckDB with each of `tables` registered as a view of its name, closed on the way out
    (on an error too): the one way lib/ queries rows it holds."""
    con = duckdb.connect(":memory:")
    try:
        con.execute("SET TimeZone = 'UTC'")  # as Lake.connect: timestamps print the same on every host
        for name, table in tables.items():
            con.register(name, table)
        yield con
    finally:
        con.close()
