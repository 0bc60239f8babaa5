"""`foxhunt-obs`: the sandbox, job runs over partition ranges, summaries, and the demo.

One module per command family: sandbox.py (the local stack), jobs.py (Dagster runs, rules export),
summaries.py (plain-text tables from the lake), lake.py (the Athena DDL), demo.py (all of it end to end, then the alert replay).
Settings are read here and nowhere else outside the resources: config.py builds them from the environment.
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
import sys
from datetime import datetime, timezone
from pathlib import Path

from foxhunt_obs.cli.demo import run_demo
from foxhunt_obs.cli.jobs import export_rules, run_job
from foxhunt_obs.cli.lake import lake_ddl
from foxhunt_obs.cli.sandbox import DEFAULT_PORT, MLFLOW_PORT, MOTO_PORT, STATE_DIR, sandbox
from foxhunt_obs.cli.summaries import summary

__all__ = ["export_rules", "main", "run_job"]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="foxhunt-obs", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)

    sb = sub.add_parser("sandbox", help="the local stack: a real Prometheus backfilled with a scenario")
    sb.add_argument("action", choices=["up", "down", "status", "env"])
    sb.add_argument("--scenario", default="default", help="scenario name or YAML path (default: default)")
    sb.add_argument("--port", type=int, default=DEFAULT_PORT)
    sb.add_argument("--mlflow-port", type=int, default=MLFLOW_PORT)
    sb.add_argument("--moto-port", type=int, default=MOTO_PORT)
    sb.add_argument("--state-dir", type=Path, default=STATE_DIR)

    run = sub.add_parser("run", help="run a job over a partition range through Dagster (runs show in the UI)")
    run.add_argument("job")
    run.add_argument("--range", required=True, metavar="FIRST...LAST", help="partition keys, inclusive")

    sm = sub.add_parser("summary", help="GPU-hours and mean utilization per experiment and node")
    sm.add_argument("--start", required=True, help="UTC hour, e.g. 2026-11-22T00")
    sm.add_argument("--end", required=True, help="UTC hour, exclusive")

    rules = sub.add_parser("rules", help="Prometheus rules generated from the metric catalog")
    rules.add_argument("action", choices=["export"])
    rules.add_argument("--out", type=Path, default=Path("deploy/prometheus"))

    lk = sub.add_parser("lake", help="the lake on S3 as Glue/Athena tables: CREATE EXTERNAL TABLE statements")
    lk.add_argument("action", choices=["ddl"])
    lk.add_argument("--location", help="lake root, s3://bucket/prefix (default: FOXHUNT_LAKE)")
    lk.add_argument("--database", default="foxhunt", help="Glue database (default: foxhunt)")
    lk.add_argument("--out", type=Path, help="file to write (default: standard output)")

    demo = sub.add_parser(
        "demo", help="sandbox up, ingest its last 24 hours through Dagster, print a summary"
    )
    demo.add_argument("--scenario", default="default")
    demo.add_argument("--port", type=int, default=DEFAULT_PORT)
    demo.add_argument("--mlflow-port", type=int, default=MLFLOW_PORT)
    demo.add_argument("--moto-port", type=int, default=MOTO_PORT)
    demo.add_argument("--state-dir", type=Path, default=STATE_DIR)
    demo.add_argument("--keep", action="store_true", help="leave the sandbox running afterwards")

    args = p.parse_args(argv)
    _progress_to_stderr()
    if args.cmd in ("sandbox", "demo") and importlib.util.find_spec("foxhunt_obs.sandbox") is None:
        # the code location's image leaves the sandbox out (deploy/dagster/Dockerfile.dockerignore)
        print(f"foxhunt-obs {args.cmd}: the sandbox is not installed here (a production image carries the "
              "code location only); run it from a clone of the repository", file=sys.stderr)
        return 2
    if args.cmd == "sandbox":
        return sandbox(args)
    if args.cmd == "run":
        first, _, last = args.range.partition("...")
        return 0 if run_job(args.job, first, last or first) else 1
    if args.cmd == "rules":
        for path in export_rules(args.out):
            print(f"wrote {path}")
        return 0
    if args.cmd == "lake":
        return lake_ddl(args.location, args.database, args.out)
    if args.cmd == "summary":
        print(summary(_hour(args.start), _hour(args.end)))
        return 0
    return run_demo(args)


def _hour(s: str) -> datetime:
    return datetime.strptime(s, "%Y-%m-%dT%H").replace(tzinfo=timezone.utc)


def _progress_to_stderr() -> None:
    """The progress lines of the sandbox (the history build: series written, blocks, days of rules
    evaluated) and of the CLI (the demo's runs: partitions done, the alert replay's ticks) on stderr, so
    a long step never looks like a silent terminal; nothing else's logging is touched."""
    for name in ("foxhunt_obs.sandbox", "foxhunt_obs.cli"):
        progress = logging.getLogger(name)
        if not progress.handlers:
            handler = logging.StreamHandler(sys.stderr)
            handler.setFormatter(logging.Formatter("%(message)s"))
            progress.addHandler(handler)
            progress.setLevel(logging.INFO)
