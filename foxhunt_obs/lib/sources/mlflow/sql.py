"""Backend-store mode: runs and metric histories read from MLflow's own SQL tables (a read replica, or
the sqlite file), read-only, one query per chunk of runs: no server in the way, by far the fastest path."""

from __future__ import annotations

import importlib.util
import os
import re
import sqlite3
from collections.abc import Iterator, Sequence
from urllib.parse import quote, urlsplit

import numpy as np
import pyarrow as pa

from foxhunt_obs.lib import tracing
from foxhunt_obs.lib.redact import MASK, configured_secrets, redact_url, scrub
from foxhunt_obs.lib.sources.mlflow.model import (
    HISTORY_SCHEMA,
    MlflowRun,
    MlflowSourceError,
    flat,
    history_table,
    utc,
)

BACKEND_STORE_SETTING = "FOXHUNT_MLFLOW_BACKEND_STORE_URI"  # where the URI comes from, as errors name it
SQL_CHUNK = 500  # ids per `IN (...)`: below every database's bound-parameter limit
METRICS_CHUNK = 16  # runs per metrics query: bounds the row tuples alive at once
_METRIC_ROW = np.dtype(
    [
        ("run_uuid", object),
        ("key", object),
        ("step", np.int64),
        ("ts", np.int64),
        ("value", np.float64),
        ("is_nan", bool),
    ]
)


class SqlPath:
    """experiments(), runs() and histories() of the store at `backend_store_uri` (shown as `where`)."""

    def __init__(self, backend_store_uri: str, where: str):
        self.backend_store_uri = backend_store_uri
        self.where = where
        self._engine = None

    def engine(self):
        """The store's SQLAlchemy engine, opened on first use: a sqlite file read-only at the file level.
        A URI SQLAlchemy cannot read (malformed, an unknown or uninstalled driver) fails naming the store."""
        if self._engine is None:
            import sqlalchemy as sa

            try:
                url = sa.engine.make_url(self.backend_store_uri)
                self._engine = self._create(sa, with_driver(url))
            except (sa.exc.ArgumentError, ValueError, ImportError) as e:
                text = str(e).splitlines()[0] if str(e) else type(e).__name__
                raise MlflowSourceError(
                    f"MLflow store {self.where}: {self._scrub(text)} (expected "
                    "postgresql://user:password@host:5432/database or sqlite:////path/to/mlflow.db)"
                ) from None
        return self._engine

    def _create(self, sa, url):
        from sqlalchemy.pool import NullPool

        if url.get_backend_name() == "sqlite":
            path = url.database
            if not path or path == ":memory:" or not os.path.exists(path):
                raise MlflowSourceError(f"MLflow store {self.where}: no sqlite file at {path!r}")
            # read-only at the file level: this process can never write MLflow's store
            return sa.create_engine(
                "sqlite://",
                creator=lambda: sqlite3.connect(
                    f"file:{quote(os.path.abspath(path))}?mode=ro", uri=True, check_same_thread=False
                ),
                poolclass=NullPool,
            )
        # every statement here is a SELECT this module builds; point it at a read replica or a read-only
        # role all the same. NullPool: nothing stays open between two reads.
        return sa.create_engine(url, poolclass=NullPool)

    def _scrub(self, text: str) -> str:
        """An error's text without the store's password, configured or not."""
        try:
            password = urlsplit(self.backend_store_uri).password
        except ValueError:
            password = None
        # an unescaped `@` in the password splits it: a driver may echo the part after it as the host
        parts = [p for p in (password or "").split("@") if len(p) >= 4]
        return scrub(text, [*configured_secrets(), *([password] if password else []), *parts])

    def _sql(self, call: str, query, raw: bool = False) -> list[tuple]:
        """Rows of a Core query. raw: through the DBAPI cursor, skipping SQLAlchemy's Row objects
        (a third of the time of a million-row read)."""
        import sqlalchemy as sa

        engine = self.engine()
        attributes = {tracing.SOURCE: "mlflow", tracing.QUERY: call, "db.system.name": engine.dialect.name}
        try:
            with tracing.span(f"SELECT {call}", attributes, kind=tracing.CLIENT) as span:
                rows = _sql_rows(engine, query, raw)
                tracing.set_attributes(span, {tracing.ROWS: len(rows)})
                return rows
        except (sa.exc.SQLAlchemyError, engine.dialect.loaded_dbapi.Error) as e:
            text = str(getattr(e, "orig", None) or e).splitlines()[0]
            raise MlflowSourceError(f"MLflow store {self.where}: {call}: {self._scrub(text)}") from None

    def _sql_in(
        self,
        call: str,
        table: str,
        columns: Sequence[str],
        by: str,
        ids: Sequence,
        raw: bool = False,
        chunk: int = SQL_CHUNK,
    ) -> Iterator[list[tuple]]:
        """SELECT columns FROM table WHERE by IN ids, one list of rows per chunk of ids. SQLAlchemy Core
        quotes the names (`key` is reserved in MySQL) and binds the values."""
        import sqlalchemy as sa

        t = sa.table(table, *(sa.column(c) for c in {*columns, by}))
        for i in range(0, len(ids), chunk):
            part = list(ids[i : i + chunk])
            yield self._sql(call, sa.select(*(t.c[c] for c in columns)).where(t.c[by].in_(part)), raw)

    def experiments(self) -> dict[str, str]:
        import sqlalchemy as sa

        t = sa.table("experiments", sa.column("experiment_id"), sa.column("name"))
        return {str(i): n for i, n in self._sql("experiments", sa.select(t.c.experiment_id, t.c.name))}

    def runs(self, exps: dict[str, str]) -> list[MlflowRun]:
        cols = [
            "run_uuid",
            "experiment_id",
            "name",
            "status",
            "lifecycle_stage",
            "start_time",
            "end_time",
            "user_id",
        ]
        runs = list(flat(self._sql_in("runs", "runs", cols, "experiment_id", [int(i) for i in exps])))
        run_ids = [r[0] for r in runs]
        params: dict[str, dict[str, str]] = {}
        tags: dict[str, dict[str, str]] = {}
        latest: dict[str, list[tuple[str, int, int]]] = {}
        for rid, k, v in flat(
            self._sql_in("params", "params", ["run_uuid", "key", "value"], "run_uuid", run_ids)
        ):
            params.setdefault(rid, {})[k] = v
        for rid, k, v in flat(
            self._sql_in("tags", "tags", ["run_uuid", "key", "value"], "run_uuid", run_ids)
        ):
            tags.setdefault(rid, {})[k] = v if v is not None else ""
        for rid, k, t, step in flat(
            self._sql_in(
                "latest_metrics",
                "latest_metrics",
                ["run_uuid", "key", "timestamp", "step"],
                "run_uuid",
                run_ids,
            )
        ):
            latest.setdefault(rid, []).append((k, t, step))
        out = []
        for rid, exp_id, name, status, stage, start, end, user in runs:
            lm = latest.get(rid, [])
            out.append(
                MlflowRun(
                    run_id=rid,
                    experiment_id=str(exp_id),
                    experiment_name=exps.get(str(exp_id), ""),
                    run_name=name or "",
                    status=status or "",
                    deleted=stage == "deleted",
                    start_time=utc(start),
                    end_time=utc(end),
                    user=user or "",
                    params=params.get(rid, {}),
                    tags=tags.get(rid, {}),
                    metric_keys=tuple(sorted({k for k, _, _ in lm})),
                    last_metric_time=utc(max((t for _, t, _ in lm if t is not None), default=None)),
                    latest_steps={k: int(step) for k, _, step in lm if step is not None},
                )
            )
        return out

    def histories(self, runs: list[MlflowRun]) -> pa.Table:
        ids = sorted({r.run_id for r in runs})
        cols = ["run_uuid", "key", "step", "timestamp", "value", "is_nan"]
        # a few runs per query, each chunk's row tuples turned into one structured array at once (a
        # C-level pass, twice as fast as zip(*rows)) and dropped: memory stays near the arrays' size
        parts = [
            np.array(rows, dtype=_METRIC_ROW)
            for rows in self._sql_in(
                "metrics", "metrics", cols, "run_uuid", ids, raw=True, chunk=METRICS_CHUNK
            )
        ]
        a = np.concatenate(parts) if parts else np.empty(0, _METRIC_ROW)
        if not len(a):
            return HISTORY_SCHEMA.empty_table()
        v = a["value"].copy()
        v[a["is_nan"]] = np.nan  # MLflow stores NaN as 0 with is_nan set
        return history_table(_strings(a["run_uuid"]), _strings(a["key"]), a["step"], a["ts"], v)


def store_where(uri: str) -> str:
    """How errors name the store: the setting and its URI, without user and password even where the URI
    is malformed (`postgresql//u:p@host/db`: all before the last `@` but the scheme is masked)."""
    where = redact_url(uri)
    if "@" in where:
        head, tail = where.rsplit("@", 1)
        scheme = re.match(r"[A-Za-z][A-Za-z0-9+.-]*:/*", head)
        where = f"{scheme.group(0) if scheme else ''}{MASK}@{tail}"
    return f"{BACKEND_STORE_SETTING}={where}"


def with_driver(url):
    """`url` with a PostgreSQL driver that is installed: SQLAlchemy 2 reads a bare postgresql:// as psycopg
    (3), while the psycopg2 that dagster-postgres needs is what is installed; postgres:// (Heroku's and
    libpq's spelling) is no SQLAlchemy name at all. Either becomes postgresql+psycopg2 when psycopg is
    absent and psycopg2 present, else postgresql (psycopg). A driver named explicitly is kept."""
    if url.drivername not in ("postgresql", "postgres"):
        return url
    if importlib.util.find_spec("psycopg") is None and importlib.util.find_spec("psycopg2") is not None:
        return url.set(drivername="postgresql+psycopg2")
    return url.set(drivername="postgresql")


def _sql_rows(engine, query, raw: bool) -> list[tuple]:
    if not raw:
        with engine.connect() as con:
            return con.execute(query).all()
    c = query.compile(dialect=engine.dialect, compile_kwargs={"render_postcompile": True})
    params = [c.params[n] for n in c.positiontup] if c.positional else c.params
    con = engine.raw_connection()
    try:
        cur = con.cursor()
        cur.execute(c.string, params)
        return cur.fetchall()
    finally:
        con.close()


def _strings(col: np.ndarray) -> pa.Array:
    """A column of few distinct strings: each distinct one converted once, then repeated by index."""
    import pandas as pd

    codes, uniques = pd.factorize(col)  # hashing in C: a tenth of a dict.setdefault loop
    return pa.array(uniques, pa.string()).take(pa.array(codes))
