"""The lake: Hive-partitioned Parquet tables under a local folder or ``s3://bucket/prefix`` (docs/design.md#the-lake).

Why a plain resource-like object and not a Dagster IO manager: assets write one partition at a time with a
schema check, and read *across* partitions with SQL (DuckDB) instead of loading upstream objects into
memory; sensors and the webserver read the same way. Every read opens a fresh in-memory DuckDB connection
with views over the Parquet files, so there is no long-lived DuckDB file and no lock fights (DuckDB allows
one writer process). This module knows nothing about Dagster.

Layout: ``<root>/<table>/<partition col>=<value>/part-0.parquet``, one file per partition. A write is atomic
and idempotent: temp file + fsync + ``os.replace`` locally, a single object PUT on S3. The partition column
is not stored in the file; readers get it from the path, as a VARCHAR.

Why boto3's ``put_object`` for S3 writes and pyarrow for reads: pyarrow's output stream switches to a
multipart upload above ~10 MiB, and a multipart upload that fails half-way is left on the bucket (billed,
invisible to listings) unless aborted. One PUT of the body already in memory (up to 5 GiB, S3's limit for
one PUT) is atomic and leaves nothing behind when it fails.
"""

from __future__ import annotations

import base64
import glob
import mimetypes
import os
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cached_property

import duckdb
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from foxhunt_obs.lib.errors import InputError
from foxhunt_obs.lib.schemas import TABLES, TableSpec
from foxhunt_obs.lib.settings import default

FILE_NAME = "part-0.parquet"
STALE_TEMP_S = 3600  # a temp file this old is a killed writer's, not a running one's
PUT_MAX_BYTES = 5 * 1024**3  # S3's limit for one PutObject
S3_TIMEOUTS = {"connect_timeout": 5, "read_timeout": 60}  # seconds, per attempt (botocore's own retries: 3)
ROW_GROUP_SIZE = 256 * 1024
FOOTER_PREFIX = b"foxhunt."  # the keys of the tables a writer keeps in a partition's footer


class LakeError(InputError):
    """Any lake failure; the message names the lake root, the table and the partition."""


class SchemaMismatch(LakeError):
    """The table handed to ``write_partition`` does not fit the table's spec."""


@dataclass(frozen=True)
class WriteResult:
    path: str
    rows: int
    bytes: int


class Lake:
    """A lake at ``root``. On S3, ``region`` and ``endpoint_url`` (a moto server, a VPC endpoint) are the
    bucket's: no region means AWS_REGION's registry default, no endpoint AWS's own."""

    def __init__(self, root: str, region: str | None = None, endpoint_url: str | None = None):
        self.region, self.endpoint_url = region or default("AWS_REGION"), endpoint_url or None
        root = str(root)
        self.is_s3 = root.startswith("s3://")
        self.root = "s3://" + root[5:].strip("/") if self.is_s3 else os.path.abspath(root)
        if self.is_s3 and not root[5:].strip("/"):
            raise LakeError(f"lake root {root!r}: missing bucket")

    def __repr__(self) -> str:
        return f"Lake({self.root!r})"

    # -- paths and filesystem -------------------------------------------------------------------------
    @cached_property
    def fs(self) -> pafs.FileSystem:
        """pyarrow filesystem for reads and listings, built on first use."""
        if not self.is_s3:
            return pafs.LocalFileSystem()
        endpoint, region = self.endpoint_url, self.region
        kwargs: dict = {"region": region}
        if endpoint:
            scheme, _, host = endpoint.rpartition("://")
            kwargs["endpoint_override"] = host.rstrip("/")
            kwargs["scheme"] = scheme or "https"
        return pafs.S3FileSystem(**kwargs)

    @cached_property
    def _s3(self):
        """boto3 S3 client for writes (see the module docstring), with timeouts and standard retries."""
        import boto3
        from botocore.config import Config

        endpoint, region = self.endpoint_url, self.region
        config = Config(**S3_TIMEOUTS, retries={"max_attempts": 3, "mode": "standard"})
        return boto3.client("s3", endpoint_url=endpoint, region_name=region, config=config)

    def _put(self, path: str, body: bytes, content_type: str = "application/octet-stream") -> None:
        """One PutObject of ``body`` at ``bucket/key``: the object appears whole or not at all."""
        if len(body) > PUT_MAX_BYTES:
            raise LakeError(f"lake {self.root}: {path} is {len(body)} bytes, over S3's 5 GiB for one PUT")
        bucket, _, key = path.partition("/")
        self._s3.put_object(Bucket=bucket, Key=key, Body=body, ContentType=content_type)

    def _base(self) -> str:
        """The root as a path for ``self.fs`` (``bucket/prefix`` on S3)."""
        return self.root[5:] if self.is_s3 else self.root

    def _table_dir(self, spec: TableSpec) -> str:
        return f"{self._base()}/{spec.name}"

    def _part_dir(self, spec: TableSpec, value: str) -> str:
        if not isinstance(value, str) or not value or "/" in value or "\\" in value or value in (".", ".."):
            raise self._error(LakeError, spec, value, "invalid partition value")
        return f"{self._table_dir(spec)}/{spec.partition}={value}"

    def _url(self, path: str) -> str:
        return "s3://" + path if self.is_s3 else path

    def _error(self, cls: type[LakeError], spec: TableSpec, value: object, msg: str) -> LakeError:
        return cls(f"lake {self.root}, table {spec.name}, partition {spec.partition}={value!s}: {msg}")

    # -- writes ---------------------------------------------------------------------------------------
    def conform(self, spec: TableSpec, value: str, table: pa.Table) -> pa.Table:
        """Check ``table`` against the spec; return it in spec column order and types (as written)."""
        names = list(table.column_names)
        if spec.partition in names and spec.partition not in spec.schema.names:
            # Tolerate the partition column (e.g. read back from a view) when it matches the path.
            if table.column(spec.partition).cast(pa.string()).to_pylist() != [value] * table.num_rows:
                raise self._error(SchemaMismatch, spec, value, f"column {spec.partition!r} != {value!r}")
            names.remove(spec.partition)
        missing = [n for n in spec.schema.names if n not in names]
        extra = [n for n in names if n not in spec.schema.names]
        dupes = sorted({n for n in names if names.count(n) > 1})
        problems = [
            f"{what} columns {cols}"
            for what, cols in (("missing", missing), ("extra", extra), ("duplicated", dupes))
            if cols
        ]
        if problems:
            raise self._error(SchemaMismatch, spec, value, ", ".join(problems))
        arrays = []
        for field in spec.schema:
            col = table.column(field.name)
            if col.type != field.type:
                try:
                    col = col.cast(field.type, safe=True)
                except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as e:
                    msg = f"column {field.name!r} is {col.type}, cannot cast safely to {field.type}: {e}"
                    raise self._error(SchemaMismatch, spec, value, msg) from e
            arrays.append(col)
        return pa.Table.from_arrays(arrays, schema=spec.schema)

    @staticmethod
    def _write_parquet(table: pa.Table, where, footer: dict[str, pa.Table]) -> None:
        # Timestamps are sorted and unique: delta encoding, not a dictionary the writer tries and drops.
        # Measured floats rarely repeat either: without the dictionary it tried on them, an hour of
        # gpu_samples is written 22 % faster, 8 % smaller, and read 6 % faster.
        stamps = [f.name for f in table.schema if pa.types.is_timestamp(f.type)]
        plain = {f.name for f in table.schema if pa.types.is_floating(f.type)}
        with pq.ParquetWriter(
            where,
            table.schema,
            compression="zstd",
            write_statistics=True,
            use_dictionary=[n for n in table.column_names if n not in stamps and n not in plain],
            column_encoding=dict.fromkeys(stamps, "DELTA_BINARY_PACKED"),
        ) as writer:
            writer.write_table(table, row_group_size=ROW_GROUP_SIZE)
            # in the footer's key-value metadata only (not in the Arrow schema it also stores, twice)
            writer.add_key_value_metadata({k: _table_bytes(t) for k, t in footer.items()})

    def write_partition(
        self, spec: TableSpec, value: str, table: pa.Table, footer: dict[str, pa.Table] | None = None
    ) -> WriteResult:
        """Replace one partition with ``table`` (zero rows allowed), atomically. ``footer``: small tables
        derived from its rows, kept in the file's footer under their keys (FOOTER_PREFIX...; read_footer):
        written with the rows, they are replaced with them and never disagree with them."""
        part_dir = self._part_dir(spec, value)
        data = self.conform(spec, value, table)
        if bad := [k for k in footer or {} if not k.startswith(FOOTER_PREFIX.decode())]:
            raise ValueError(f"footer keys start with {FOOTER_PREFIX.decode()!r}: {bad}")
        final = f"{part_dir}/{FILE_NAME}"
        try:
            if self.is_s3:
                buf = pa.BufferOutputStream()
                self._write_parquet(data, buf, footer or {})
                body = buf.getvalue().to_pybytes()
                self._put(final, body)
                size = len(body)
            else:
                os.makedirs(part_dir, exist_ok=True)
                tmp = f"{final}.tmp-{uuid.uuid4().hex}"  # never matches the readers' *.parquet glob
                try:
                    with open(tmp, "wb") as f:
                        self._write_parquet(data, f, footer or {})
                        f.flush()
                        os.fsync(f.fileno())
                    size = os.path.getsize(tmp)
                    os.replace(tmp, final)
                finally:
                    if os.path.exists(tmp):
                        os.remove(tmp)
                _fsync_dir(part_dir)
                self._remove_stale_temps(spec)
        except LakeError:
            raise
        except Exception as e:
            raise self._error(LakeError, spec, value, f"write failed: {e!r}") from e
        return WriteResult(path=self._url(final), rows=data.num_rows, bytes=size)

    def _remove_stale_temps(self, spec: TableSpec) -> None:
        """Temp files a killed writer left in this table (a SIGKILL skips the `finally` above). Only ones
        older than STALE_TEMP_S: a concurrent writer's temp file is younger than that."""
        cutoff = time.time() - STALE_TEMP_S
        for tmp in glob.glob(os.path.join(glob.escape(self._table_dir(spec)), "*", "*.tmp-*")):
            try:
                if os.path.getmtime(tmp) < cutoff:
                    os.remove(tmp)
            except OSError:
                pass  # gone already (another writer cleaned up)

    def delete_partition(self, spec: TableSpec, value: str) -> None:
        """Remove a partition (no-op when absent)."""
        part_dir = self._part_dir(spec, value)
        try:
            if self.fs.get_file_info(part_dir).type != pafs.FileType.NotFound:
                self.fs.delete_dir(part_dir)
        except Exception as e:
            raise self._error(LakeError, spec, value, f"delete failed: {e!r}") from e

    # -- reads ----------------------------------------------------------------------------------------
    def read_partition(
        self, spec: TableSpec, value: str, columns: list[str] | None = None, use_threads: bool = True
    ) -> pa.Table | None:
        """The stored table (without the partition column), or None when never written. use_threads=False
        decodes on the calling thread only (less CPU in all, for a caller running beside other work)."""
        path = f"{self._part_dir(spec, value)}/{FILE_NAME}"
        try:
            if self.fs.get_file_info(path).type == pafs.FileType.NotFound:
                return None
            with self.fs.open_input_file(path) as f:
                file = pq.ParquetFile(f)
                if columns is not None:  # partitions written before a column existed lack it
                    names = set(file.schema_arrow.names)
                    columns = [c for c in columns if c in names]
                table = file.read(columns=columns, use_threads=use_threads)
            # pyarrow shows the footer's key-value metadata as the schema's: not the rows' (read_footer)
            meta = {k: v for k, v in (table.schema.metadata or {}).items() if not k.startswith(FOOTER_PREFIX)}
            return table.replace_schema_metadata(meta or None)
        except Exception as e:
            raise self._error(LakeError, spec, value, f"read failed: {e!r}") from e

    def read_footer(self, spec: TableSpec, value: str, key: str) -> tuple[bool, pa.Table | None]:
        """(whether the partition exists, the table its writer kept in its footer under key or None):
        the file's footer only, not its rows."""
        path = f"{self._part_dir(spec, value)}/{FILE_NAME}"
        try:
            if self.fs.get_file_info(path).type == pafs.FileType.NotFound:
                return False, None
            with self.fs.open_input_file(path) as f:
                data = (pq.read_metadata(f).metadata or {}).get(key.encode())
            return True, None if data is None else _bytes_table(data)
        except Exception as e:
            raise self._error(LakeError, spec, value, f"reading the footer's {key} failed: {e!r}") from e

    def partitions(self, spec: TableSpec) -> list[str]:
        """Sorted partition values that have a file."""
        selector = pafs.FileSelector(self._table_dir(spec), recursive=True, allow_not_found=True)
        prefix = f"{spec.partition}="
        try:
            infos = self.fs.get_file_info(selector)
        except Exception as e:
            raise self._error(LakeError, spec, "*", f"listing failed: {e!r}") from e
        values = set()
        for info in infos:
            parent, _, name = info.path.rpartition("/")
            folder = parent.rpartition("/")[2]
            if info.type == pafs.FileType.File and name == FILE_NAME and folder.startswith(prefix):
                values.add(folder[len(prefix) :])
        return sorted(values)

    # -- plain files (reports, charts) ----------------------------------------------------------------
    def _file_path(self, relative: str, what: str) -> str:
        """``<base>/<relative>`` for ``self.fs``; refuses absolute paths, empty parts, "." and ".."."""
        parts = relative.split("/") if isinstance(relative, str) else []
        if not parts or "\\" in relative or any(p in ("", ".", "..") for p in parts):
            raise LakeError(f"lake {self.root}: invalid {what} {relative!r} (want a/b/c under the root)")
        return f"{self._base()}/{relative}"

    def write_files(self, prefix: str, files: dict[str, bytes]) -> list[str]:
        """Write each ``name -> bytes`` under ``<root>/<prefix>/``, atomically per file (temp + fsync +
        rename locally, one PUT on S3); a file of the same name is replaced, other files are left alone.
        Returns the full paths (s3:// URIs on S3), in the order given."""
        folder = self._file_path(prefix, "file prefix")
        targets = {name: self._file_path(f"{prefix}/{name}", "file name") for name in files}
        for name in files:
            if "/" in name:
                raise LakeError(f"lake {self.root}: invalid file name {name!r} under {prefix!r} (no folders)")
        written = []
        for name, body in files.items():
            final = targets[name]
            try:
                if self.is_s3:
                    self._put(final, body, mimetypes.guess_type(name)[0] or "application/octet-stream")
                else:
                    os.makedirs(folder, exist_ok=True)
                    tmp = f"{final}.tmp-{uuid.uuid4().hex}"
                    try:
                        with open(tmp, "wb") as f:
                            f.write(body)
                            f.flush()
                            os.fsync(f.fileno())
                        os.replace(tmp, final)
                    finally:
                        if os.path.exists(tmp):
                            os.remove(tmp)
            except Exception as e:
                raise LakeError(f"lake {self.root}, file {prefix}/{name}: write failed: {e!r}") from e
            written.append(self._url(final))
        if written and not self.is_s3:
            _fsync_dir(folder)
        return written

    def read_file(self, path: str) -> bytes | None:
        """The bytes of ``<root>/<path>``, or None when there is no such file."""
        full = self._file_path(path, "file path")
        try:
            if self.fs.get_file_info(full).type != pafs.FileType.File:
                return None
            with self.fs.open_input_stream(full) as f:
                return f.read()
        except Exception as e:
            raise LakeError(f"lake {self.root}, file {path}: read failed: {e!r}") from e

    def connect(self, tables: Iterable[TableSpec] | None = None) -> duckdb.DuckDBPyConnection:
        """A fresh in-memory DuckDB connection with one view per table (default: every known table)."""
        con = duckdb.connect(":memory:")
        try:
            # The lake's timestamps are all UTC (docs/design.md#the-lake). DuckDB defaults to the machine's zone for TIMESTAMPTZ
            # arithmetic (date_trunc('day', ts)) and for the tz label of the Arrow results.
            con.execute("SET TimeZone = 'UTC'")
            for spec in TABLES.values() if tables is None else tables:
                self._add_view(con, spec)
        except BaseException:
            con.close()
            raise
        return con

    def _add_view(self, con: duckdb.DuckDBPyConnection, spec: TableSpec) -> None:
        # A table may also hold its partition key as a column (costs_daily.day): then the files carry it
        # and the view shows it as the partition string, as it does for every other table.
        in_files = spec.partition in spec.schema.names
        full_schema = spec.schema if in_files else spec.schema.append(pa.field(spec.partition, pa.string()))
        if not self.partitions(spec):
            source = f"_lake_{spec.name}"
            con.register(source, full_schema.empty_table())
        elif self.is_s3:
            source = f"_lake_{spec.name}"
            partitioning = ds.partitioning(pa.schema([(spec.partition, pa.string())]), flavor="hive")
            dataset = ds.dataset(
                self._table_dir(spec),
                filesystem=self.fs,
                format="parquet",
                partitioning=None if in_files else partitioning,
                schema=full_schema,
            )
            con.register(source, dataset)
        else:
            glob = _sql_str(f"{self._table_dir(spec)}/*/*.parquet")
            # Columns grow: partitions written before a column existed read it as NULL, as on S3.
            empty = f"_lake_{spec.name}_columns"
            con.register(empty, full_schema.empty_table())
            source = (
                f"(SELECT * FROM {empty} UNION ALL BY NAME SELECT * FROM read_parquet({glob}, "
                f"hive_partitioning=true, union_by_name=true, hive_types={{{_sql_str(spec.partition)}: 'VARCHAR'}}))"
            )
        select = f'* REPLACE (CAST("{spec.partition}" AS VARCHAR) AS "{spec.partition}")' if in_files else "*"
        con.execute(f'CREATE VIEW "{spec.name}" AS SELECT {select} FROM {source}')

    def query(
        self, sql: str, params: list | None = None, tables: Iterable[TableSpec] | None = None
    ) -> pa.Table:
        """Run one SQL statement over the lake's views and return the result as an Arrow table."""
        con = self.connect(tables)
        try:
            return con.execute(sql, params or []).to_arrow_table()
        finally:
            con.close()


def _table_bytes(table: pa.Table) -> bytes:
    """A table as footer metadata: Arrow IPC, compressed; base64, as other readers of the footer (Athena,
    Spark) may expect text."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema, options=pa.ipc.IpcWriteOptions(compression="zstd")) as w:
        w.write_table(table)
    return base64.b64encode(sink.getvalue().to_pybytes())


def _bytes_table(data: bytes) -> pa.Table:
    return pa.ipc.open_stream(base64.b64decode(data)).read_all()


def _sql_str(s: str) -> str:
    return "'" + s.replace("'", "''") + "'"


def _fsync_dir(path: str) -> None:
    """Make the rename durable (POSIX); best effort elsewhere."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


__all__ = ["Lake", "LakeError", "SchemaMismatch", "WriteResult"]


def shrink_reason(old: pa.Table | None, new: pa.Table, keys: list[str], min_fraction: float = 0.5) -> str:
    """Why writing `new` over `old` would lose good rows ('' when it would not): a non-empty partition
    replaced by an empty one, or by one with fewer than `min_fraction` of its entities (distinct `keys`,
    e.g. GPUs). A source that no longer has the window (retention passed, the wrong server) answers
    with less, and a green run must not turn that into the lake's truth."""
    if old is None or not old.num_rows:
        return ""
    if not new.num_rows:
        return f"the source answered 0 rows where the lake has {old.num_rows}"

    def entities(t: pa.Table) -> int:
        cols = [c for c in keys if c in t.column_names]
        return len(t.select(cols).group_by(cols).aggregate([])) if cols else t.num_rows

    before, after = entities(old), entities(new)
    if after < before * min_fraction:
        return f"the source answered {after} of the {before} {'/'.join(keys)} the lake has"
    return ""
