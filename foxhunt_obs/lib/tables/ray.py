"""ray_samples: Ray's cluster state per Ray node and step, hour by hour, with its checks. Each hour is
collected, guarded against replacing good rows with fewer, and written."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

import pyarrow as pa

from foxhunt_obs.lib.duck import scratch
from foxhunt_obs.lib.ingest.metric_catalog import Catalog
from foxhunt_obs.lib.ingest.ray_series import (
    RayCatalog,
    collect_ray_samples,
    missing_core_columns,
    unscraped_ray_pods,
)
from foxhunt_obs.lib.lake import Lake
from foxhunt_obs.lib.schemas import RAY_SAMPLES
from foxhunt_obs.lib.settings import ClusterSettings
from foxhunt_obs.lib.sources.prometheus import PrometheusClient
from foxhunt_obs.lib.tables import Built, Check, LakePath, Markdown, md_table
from foxhunt_obs.lib.tables.gpu import guard_fewer_rows, hour_window


def ray_samples(
    lake: Lake,
    client: PrometheusClient,
    ray: RayCatalog,
    catalog: Catalog,
    settings: ClusterSettings,
    hours: Sequence[datetime],
    allow_fewer_rows: bool = False,
) -> Built:
    tables: dict[str, pa.Table] = {}
    missing: dict[str, dict] = {}
    unscraped: dict[str, list[str]] = {}
    log: list[tuple[str, str]] = []
    for hour in hours:
        key = RAY_SAMPLES.key(hour)
        window = hour_window(hour, settings.scrape_step_s, f"ray_samples partition {key}")
        table = collect_ray_samples(client, ray, catalog, window, experiment_label=settings.experiment_label)
        guard_fewer_rows(lake, RAY_SAMPLES, key, table, ["namespace", "pod"], allow_fewer_rows)
        lake.write_partition(RAY_SAMPLES, key, table)
        log.append(("info", f"ray_samples {key}: {table.num_rows} rows"))
        for column, gap in missing_core_columns(table, ray).items():
            log.append(
                (
                    "warning",
                    f"ray_samples {key}: {', '.join(gap['pods'])} up without {column}; "
                    f"looked for {', '.join(gap['looked_for'])}",
                )
            )
            entry = missing.setdefault(
                column, {"pods": set(), "looked_for": gap["looked_for"], "partitions": []}
            )
            entry["pods"].update(gap["pods"])
            entry["partitions"].append(key)
        if lost := unscraped_ray_pods(client, ray, catalog, window):
            unscraped[key] = lost
            log.append(("warning", f"ray_samples {key}: Ray pods without a Ray target: {', '.join(lost)}"))
        tables[key] = table
    return Built(tables, _summary(tables, lake.root), _checks(tables, missing, unscraped, ray), {"log": log})


def _summary(tables: dict[str, pa.Table], root: str) -> dict:
    with scratch(t=pa.concat_tables(tables.values())) as con:
        rows, t0, t1, pods, down = con.execute(
            "SELECT count(*), min(ts), max(ts), count(DISTINCT namespace || '/' || pod), "
            "count(*) FILTER (WHERE NOT alive) FROM t"
        ).fetchone()
        per_cluster = con.execute(
            # every experiment of the cluster in the partitions (a recreated head may change it), sorted
            """SELECT ray_cluster,
                      string_agg(DISTINCT experiment::VARCHAR, ', ' ORDER BY experiment::VARCHAR) AS experiments,
                      count(DISTINCT pod) AS nodes,
                      count(*) FILTER (WHERE NOT alive) AS steps_down, max(gpus_total) AS gpus_max,
                      max(actors_restarting) AS actors_restarting_max, max(tasks_pending) AS tasks_pending_max
               FROM t GROUP BY ray_cluster ORDER BY ray_cluster"""
        ).fetch_df()
    return {
        "dagster/row_count": int(rows),
        "partitions": ", ".join(tables),
        "time_range": f"{t0} .. {t1}" if rows else "empty",
        "ray_nodes": int(pods),
        "rows_not_alive": int(down),
        "clusters": md_table(per_cluster, floatfmt=None),
        "lake": LakePath(f"{root}/{RAY_SAMPLES.name}"),
    }


def _checks(
    tables: dict[str, pa.Table], missing: dict[str, dict], unscraped: dict[str, list[str]], ray: RayCatalog
) -> list[Check]:
    with scratch(t=pa.concat_tables(tables.values())) as con:
        dupes = con.execute(
            "SELECT count(*) FROM (SELECT namespace, pod, ts FROM t GROUP BY ALL HAVING count(*) > 1)"
        ).fetchone()[0]
    core = Markdown(
        "\n".join(
            f"- `{c}`: {', '.join(sorted(g['pods']))} in {', '.join(g['partitions'])}; "
            f"looked for {', '.join(f'`{n}`' for n in g['looked_for'])}"
            for c, g in missing.items()
        )
        or "none"
    )
    lost = Markdown("\n".join(f"- {k}: {', '.join(v)}" for k, v in unscraped.items()) or "none")
    return [
        Check("core_series_reported", not missing, {"missing": core}),
        Check(
            "ray_pods_scraped",
            not unscraped,
            {"unscraped": lost, "target_label": f"`{ray.target_cluster_label}` on `up`"},
        ),
        Check("unique_pod_ts", dupes == 0, {"duplicate_keys": int(dupes)}),
    ]
