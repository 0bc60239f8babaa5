"""`foxhunt-gpu-exporter`: parse flags, build the backend and pod-label source, serve until SIGTERM."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import sys
import threading

from .app import Exporter
from .podresources import (
    GPU_RESOURCE,
    KUBELET_SOCKET,
    PodResourcesWatcher,
    PodSource,
    StaticPod,
    kubelet_lister,
)
from .poller import ErrorCounts

log = logging.getLogger("foxhunt_gpu_exporter")
PASSWORD_ENV = "FOXHUNT_EXPORTER_BASIC_AUTH_PASSWORD"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="foxhunt-gpu-exporter", description="Per-node NVML GPU exporter for Prometheus.")
    p.add_argument("--listen-address", default=":9094", help="HOST:PORT to serve on (default :9094)")
    p.add_argument("--interval", type=float, default=5.0, help="seconds between polls of the GPUs (default 5)")
    p.add_argument("--stuck-after", type=float, default=None,
                   help="seconds a poll may run before the watchdog exits the process (default 3 x interval)")  # fmt: skip
    p.add_argument("--fake", nargs="?", const="", default=None, metavar="SCENARIO.json",
                   help="use the fake backend, with a JSON scenario or the default one (8 x A100-SXM4-80GB)")  # fmt: skip
    p.add_argument("--hostname", default=None,
                   help="hostname label (default: the fake scenario's, else $NODE_NAME, else the host name)")  # fmt: skip
    p.add_argument("--mode", choices=("standalone", "daemonset", "sidecar"), default="standalone",
                   help="pod labels: none, from the kubelet PodResources API, or from Downward API env vars")  # fmt: skip
    p.add_argument("--podresources-socket", default=KUBELET_SOCKET, help=f"kubelet socket (default {KUBELET_SOCKET})")
    p.add_argument("--podresources-interval", type=float, default=15.0, help="seconds between PodResources lists")
    p.add_argument("--resource-name", default=GPU_RESOURCE, help=f"device-plugin resource (default {GPU_RESOURCE})")
    p.add_argument("--tls-cert", default=None, help="PEM certificate: serve HTTPS (with --tls-key)")
    p.add_argument("--tls-key", default=None, help="PEM private key for --tls-cert")
    p.add_argument("--basic-auth-user", default=None, help=f"require basic auth; the password is read from ${PASSWORD_ENV}")
    p.add_argument("--log-level", default="INFO", choices=("DEBUG", "INFO", "WARNING", "ERROR"))
    args = p.parse_args(argv)
    if bool(args.tls_cert) != bool(args.tls_key):
        p.error("--tls-cert and --tls-key go together")
    if args.basic_auth_user and not os.environ.get(PASSWORD_ENV):
        p.error(f"--basic-auth-user needs the password in ${PASSWORD_ENV}")
    if args.interval <= 0:
        p.error("--interval must be positive")
    return args


def make_pods(args: argparse.Namespace, errors: ErrorCounts) -> PodSource | None:
    if args.mode == "sidecar":
        return StaticPod.from_env()
    if args.mode == "daemonset":
        try:
            lister = kubelet_lister(args.podresources_socket)
        except ImportError as e:
            log.warning("daemonset mode needs the k8s extra (pip install 'foxhunt-gpu-exporter[k8s]'): %s; "
                        "serving without pod labels", e)  # fmt: skip
            return None
        return PodResourcesWatcher(lister, resource=args.resource_name, interval=args.podresources_interval,
                                   errors=errors)  # fmt: skip
    return None


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.fake is not None:
        from .fake_backend import FakeBackend

        try:
            backend = FakeBackend(args.fake or None)
        except ValueError as e:
            log.error("%s", e)
            return 2
        log.info("fake backend: %d x %s%s", backend.gpus, backend.model, f" from {args.fake}" if args.fake else "")
    else:
        from .nvml_backend import NvmlBackend

        backend = NvmlBackend()
    hostname = args.hostname or backend.hostname() or os.environ.get("NODE_NAME") or socket.gethostname()
    errors = ErrorCounts()
    pods = make_pods(args, errors)
    exporter = Exporter(
        backend, interval=args.interval, hostname=hostname, stuck_after=args.stuck_after, pods=pods, errors=errors
    )
    auth = (args.basic_auth_user, os.environ[PASSWORD_ENV]) if args.basic_auth_user else None
    try:
        exporter.start()
        exporter.serve(args.listen_address, tls_cert=args.tls_cert, tls_key=args.tls_key, basic_auth=auth)
    except (OSError, ValueError) as e:
        log.error("cannot serve on %s: %s", args.listen_address, e)
        return 1
    done = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: done.set())
    done.wait()
    log.info("stopping")
    exporter.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
