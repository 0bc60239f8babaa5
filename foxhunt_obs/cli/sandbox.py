"""`foxhunt-obs sandbox up|down|status|env`: the local stack of real servers (docs/design.md#running-it)."""

from __future__ import annotations

import json
import logging
import shlex
import sys
from concurrent.futures import ThreadPoolExecutor, wait
from pathlib import Path

log = logging.getLogger(__name__)  # progress lines: the CLI shows them on stderr

STATE_DIR = Path(".foxhunt/sandbox")
DEFAULT_PORT = 19090
MLFLOW_PORT = 15000
MOTO_PORT = 15005


def sandbox(args) -> int:
    from foxhunt_obs.sandbox.servers import mlflow_server, moto_server
    from foxhunt_obs.sandbox.servers import prometheus as sandbox

    if args.action == "up":
        info = up(args, trainer=True)
        print(f"sandbox up, scenario {info['scenario']} {info['start']} .. {info['end']}:")
        print(f"  Prometheus {info['url']} (backfilled history; live fake exporter {info['exporter_url']})")
        print(f"  example trainer {info['trainer_url']}/metrics (the training cockpit's series, live)")
        print(f"  MLflow {info['mlflow_url']}")
        print(f"  AWS (moto: FSx, CloudWatch, S3 with CUR 2.0, Cost Explorer, Budgets) {info['aws_url']}")
        print('  eval "$(foxhunt-obs sandbox env)" points a shell at all three')
    elif args.action == "down":
        sandbox.down(args.state_dir)
        print("sandbox down")
    elif args.action == "status":
        info = sandbox.status(args.state_dir)
        ml = mlflow_server.mlflow_status(args.state_dir)
        aws = moto_server.moto_status(args.state_dir)
        print(
            json.dumps({"prometheus": info, "mlflow": ml, "aws": aws}, indent=2, default=str)
            if info
            else "sandbox not running"
        )
        return 0 if info and ml and aws else 1
    else:  # env: for eval "$(foxhunt-obs sandbox env)"
        info, ml = sandbox.status(args.state_dir), mlflow_server.mlflow_status(args.state_dir)
        aws = moto_server.moto_status(args.state_dir)
        if not info or not ml or not aws:
            print("sandbox not running", file=sys.stderr)
            return 1
        env = {"FOXHUNT_PROMETHEUS_URL": info["url"], "MLFLOW_TRACKING_URI": ml["url"]}
        env.update(moto_server.sandbox_env(aws))
        print("export " + " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items()))
    return 0


def up(args, trainer: bool = False, records_from=None) -> dict:
    """Prometheus (with the live exporter, and the example trainer if asked) first: its up() clears the
    run dir the others' files go in. Then MLflow and moto side by side (each mostly waits on its own
    server process: together ~5 s sooner on a warm demo). `sandbox down` stops the trainer with the rest.
    ``records_from``: a first history build records the rules from there on only (the demo's:
    prometheus.build_tsdb)."""
    from foxhunt_obs.sandbox.servers import prometheus as sandbox
    from foxhunt_obs.sandbox.servers.mlflow_server import up_mlflow
    from foxhunt_obs.sandbox.servers.moto_server import sandbox_env, up_moto

    info = sandbox.up(args.scenario, args.state_dir, args.port, trainer=trainer, records_from=records_from)
    try:
        # each ~10-15 s the first time: say so, as the history build does
        log.info("MLflow: starting its server (the scenario's runs are logged once, then cached)")
        log.info("AWS (moto): starting it and seeding FSx, CloudWatch, CUR 2.0 in S3, Cost Explorer, Budgets")
        with ThreadPoolExecutor(2, thread_name_prefix="sandbox-up") as pool:
            mlflow = pool.submit(up_mlflow, args.scenario, args.state_dir, args.mlflow_port)
            moto = pool.submit(up_moto, args.scenario, args.state_dir, args.moto_port)
            wait([mlflow, moto])  # both ended, started or failed, before a failure stops what did start
        errors = [e for e in (mlflow.exception(), moto.exception()) if e is not None]
        if len(errors) == 2:  # both failed: the second said too
            errors[0].add_note(f"and AWS (moto) failed too: {type(errors[1]).__name__}: {errors[1]}")
        info["mlflow_url"] = mlflow.result()["url"]
        aws = moto.result()
        info["aws_url"], info["aws_env"] = aws["endpoint_url"], sandbox_env(aws)
    except BaseException:
        sandbox.down(args.state_dir)
        raise
    return info
