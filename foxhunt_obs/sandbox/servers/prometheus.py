"""A real Prometheus holding a scenario's history (docs/design.md#the-sandbox).

``build_tsdb`` backfills the scenario into TSDB blocks with promtool, once per scenario fingerprint;
``PrometheusServer`` runs /usr/bin/prometheus on such a TSDB on 127.0.0.1; ``up``/``down``/``status``
keep one detached server per state directory for the demo and the CLI.

Prometheus writes into its storage directory (lock, WAL, compacted blocks), so servers run on a copy of
the cached TSDB (``copy_tsdb``) and the cache stays pristine.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from datetime import datetime, timezone
from pathlib import Path

import yaml

from foxhunt_obs.sandbox.servers.local_server import (
    LocalServer,
    SandboxError,
    alive,
    free_port,
    http_ok,
    kill_group,
    read_state,
    wait_serving,
)
from foxhunt_obs.sandbox.story.scenario import Scenario, load_scenario
from foxhunt_obs.sandbox.writers.cache import COMPLETE, build_once
from foxhunt_obs.sandbox.writers.openmetrics import write_blocks

PROMETHEUS = "/usr/bin/prometheus"
PROMTOOL = "/usr/bin/promtool"
# The rule backfill evaluates a piece of the window per promtool run, two at a time: the recording rules
# 2 hours (a block: a progress line every few seconds, and the demo's build evaluates only the pieces it
# reads), the cheaper cost rules a day (fewer promtool starts over their 7 levels).
RULE_CHUNK_S = 7200
COST_RULE_CHUNK_S = 86400
log = logging.getLogger(__name__)  # the history build says what it does and how far it is
PROGRESS_EVERY_S = 5.0  # a progress line at most this often


RECORDING_RULES = (
    Path(__file__).resolve().parents[3] / "deploy" / "prometheus" / "foxhunt-recording-rules.yaml"
)
COST_RULES = RECORDING_RULES.parent / "foxhunt-cost-rules.yaml"  # `foxhunt-obs rules export`
# How the rules are backfilled (levels, look-back); part of the cache key, bump it when that changes.
BACKFILL_METHOD = "levels-lookback-2"


def _rules_digest() -> str:
    digest = hashlib.sha256(BACKFILL_METHOD.encode())
    for rules in (RECORDING_RULES, COST_RULES):  # a TSDB holds both files' records
        digest.update(rules.read_bytes())
    return digest.hexdigest()[:8]


def tsdb_path(
    scenario: Scenario,
    cache_root: Path,
    metrics: set[str] | None = None,
    records_from: datetime | None = None,
) -> Path:
    only = "-" + "-".join(sorted(metrics)) if metrics else f"-r{_rules_digest()}"
    if records_from is not None and not metrics:
        only += (
            f"-from{datetime.fromtimestamp(records_start(scenario, records_from), timezone.utc):%Y%m%dT%H%M}"
        )
    if len(only) > 80:  # many metric names: a digest of them (a file name has at most 255 bytes)
        only = f"-{len(metrics)}m{hashlib.sha256(only.encode()).hexdigest()[:12]}"
    return Path(cache_root) / f"{scenario.name}-{scenario.fingerprint()[:12]}{only}" / "tsdb"


def build_tsdb(
    scenario: Scenario,
    cache_root: Path,
    metrics: set[str] | None = None,
    records_from: datetime | None = None,
) -> Path:
    """The scenario's TSDB under ``<cache_root>/<name>-<fingerprint[:12]>/tsdb``, built on first use.

    ``metrics`` limits the metric names written (a benchmark writes only the ones it reads).
    ``records_from``: every series, but the recording rules only from the rule piece (RULE_CHUNK_S)
    holding that time and no cost rules: what the demo reads (its jobs read the raw series, its alert
    replay the records over its last 42 hours; nothing it runs reads the cost records), a fraction of a
    first build's time. The records there are the whole build's (the same pieces:
    test_prometheus_records_from). A whole build already cached is used instead.
    """
    if records_from is not None and not metrics:
        whole = tsdb_path(scenario, cache_root)
        if (whole.parent / COMPLETE).exists():
            return whole

    def build(tmp: Path) -> None:
        log.info("building %s's Prometheus history (once; cached under %s)", scenario.name, cache_root)
        files = write_blocks(scenario, tmp / "openmetrics", metrics)
        log.info("  series written: %d files of 2 hours", len(files))
        done = [0]

        def backfill(f: Path) -> None:
            backfill_openmetrics(f, tmp / "tsdb")
            f.unlink()  # the text is ~30x the size of the block made from it
            done[0] += 1
            if done[0] % 12 == 0 or done[0] == len(files):
                log.info("  TSDB blocks: %d of %d", done[0], len(files))

        # promtool uses about one core; two at a time keeps a small machine responsive
        with ThreadPoolExecutor(max_workers=2) as pool:
            list(pool.map(backfill, files))
        shutil.rmtree(tmp / "openmetrics")
        if not metrics and records_from is not None:
            first = records_start(scenario, records_from)
            log.info(
                "  recording rules from %s on only, no cost rules: what the demo reads "
                "(`foxhunt-obs sandbox up` builds the whole history)",
                f"{datetime.fromtimestamp(first, timezone.utc):%Y-%m-%d %H:%M} UTC",
            )
            backfill_recording_rules(scenario, tmp / "tsdb", tmp, first)
        elif not metrics:
            backfill_recording_rules(scenario, tmp / "tsdb", tmp)
            backfill_cost_rules(scenario, tmp / "tsdb", tmp)

    final = tsdb_path(scenario, cache_root, metrics, records_from).parent
    return build_once(final, build, f"{scenario.name} {scenario.fingerprint()}") / "tsdb"


def backfill_openmetrics(text: Path, tsdb: Path) -> Path:
    """An OpenMetrics text file (ending in `# EOF`) added to the TSDB at ``tsdb`` as blocks by promtool."""
    r = subprocess.run(
        [PROMTOOL, "tsdb", "create-blocks-from", "openmetrics", "--quiet", str(text), str(tsdb)],
        capture_output=True,
        text=True,
    )
    if r.returncode:
        raise SandboxError(
            f"promtool failed on {Path(text).name} (exit {r.returncode}): {r.stderr.strip()[-2000:]}"
        )
    return Path(tsdb)


def records_start(scenario: Scenario, at: datetime) -> int:
    """The start (Unix seconds) of the rule backfill's piece holding ``at``: pieces are RULE_CHUNK_S from
    the scenario's start, so a backfill from there evaluates the very pieces a whole one does."""
    start, end, _ = _window(scenario)
    offset = min(max(int(at.timestamp()) - start, 0), max(end - start - 1, 0))
    return start + offset // RULE_CHUNK_S * RULE_CHUNK_S


def backfill_recording_rules(scenario: Scenario, tsdb: Path, work: Path, first: int | None = None) -> None:
    """The canonical recording rules (foxhunt:gpu_*) evaluated over the scenario's history and added to
    the TSDB as blocks: Prometheus evaluates rules only from when it starts, but dashboards and the alert
    rules read these names in the past too (a replay of the scenario through the alert sensor).

    promtool's rule backfill evaluates every rule against the stored series only: a rule cannot see
    another rule's output (Prometheus docs, "Backfilling for Recording Rules: Limitations"), while a live
    Prometheus evaluates a group's rules in order, each seeing the ones before it at the same timestamp.
    So the rules are backfilled with those references inlined (``inline_records``): the same values,
    e.g. foxhunt:gpu_util:ratio from GR_ENGINE_ACTIVE on a MIG slice, which reports no GPU_UTIL.
    The evaluating server looks back less than a scrape step (``backfill_rules``). ``first``: from
    there on only (``records_start``)."""
    start, end, step = _window(scenario)
    start = start if first is None else first
    backfill_rules(tsdb, work, [inline_records(RECORDING_RULES)], start, end, step, what="recording rules")


def backfill_cost_rules(scenario: Scenario, tsdb: Path, work: Path) -> None:
    """The live cost rules (foxhunt:*cost*:usd_per_hour, COST_RULES) over the scenario's history, after
    the canonical records they read are in the TSDB (``backfill_recording_rules``): the sandbox's
    Prometheus then answers the live $/h over the past as a cluster running them would have recorded it.

    Not inlined (their references carry matchers, and inlining the canonical records they read would
    nest those huge expressions once more): the group is backfilled in levels (``rule_levels``), each
    against a server over the TSDB that already holds the levels before it, so every rule reads the
    records it references as Prometheus evaluating the group in order would."""
    levels = rule_levels(yaml.safe_load(COST_RULES.read_text()))
    backfill_rules(tsdb, work, levels, *_window(scenario), what="cost rules", piece_s=COST_RULE_CHUNK_S)


def _window(scenario: Scenario) -> tuple[int, int, int]:
    """The scenario's (start, end, step) in seconds: where and how often its rules are evaluated."""
    return int(scenario.start.timestamp()), int(scenario.end.timestamp()), scenario.step_s


def rule_levels(doc: dict) -> list[dict]:
    """A rules file split into levels: level 0 reads no record of its group, level n reads records of
    levels below n only (a record defined by several rules, one price per instance type, is at the
    level of its highest). Each level is a rules file of the same groups (name, interval), so promtool
    evaluates every level at the same timestamps (it offsets a group's evaluations by a hash of the
    group's name and file: the levels are written to one path in turn)."""
    levels: list[dict] = []
    for group in doc["groups"]:
        level_of: dict[str, int] = {}
        for rule in group["rules"]:
            refs = [
                level_of[r]
                for r in level_of
                if re.search(rf"(?<![\w:]){re.escape(r)}(?![\w:])", rule["expr"])
            ]
            n = 1 + max(refs, default=-1)
            level_of[rule["record"]] = max(level_of.get(rule["record"], 0), n)
            while len(levels) <= n:
                levels.append({"groups": []})
            mine = levels[n]["groups"]
            if not mine or mine[-1]["name"] != group["name"]:
                mine.append({k: v for k, v in group.items() if k != "rules"} | {"rules": []})
            mine[-1]["rules"].append(rule)
    return levels


def lookback_delta(step_s: int) -> str:
    """The look-back of the servers that evaluate rules for the backfill: just under a scrape step.

    Backfilled history has no staleness markers (PrometheusServer), so with the default 5 minutes a
    series that ends (a pod gone, a node lost, a GPU handed over) would go on answering for 5 minutes
    in the recorded rules: the old holder of a GPU would share it with the new one, a lost node would
    cost 5 more minutes, and each level of rules reading recorded rules would add 5 more. A live
    Prometheus ends such a series at its next scrape (a staleness marker); the backfill's evaluations
    (on the scrape grid, offset by less than a step) see each series' sample of that scrape only."""
    return f"{max(step_s * 1000 - 1, 1)}ms"


def backfill_rules(
    tsdb: Path,
    work: Path,
    levels: list[dict],
    start: int,
    end: int,
    step_s: int,
    what: str = "rules",
    piece_s: int | None = None,
) -> None:
    """Each level of rules (rules files as dicts) evaluated by promtool every ``step_s`` over [start, end]
    (Unix seconds) against a server on the TSDB holding the levels before it, its blocks moved into the
    TSDB.

    The window is cut into pieces of ``piece_s`` (default RULE_CHUNK_S), two promtool runs at a time:
    Prometheus evaluates each query on one core, so one run left a core idle; a progress line every
    PROGRESS_EVERY_S at most. The pieces are exactly the single run's: promtool aligns every evaluation to the group's own offset
    (rules.Group.EvalTimestamp) and its blocks to 2 hours, and a piece ends a second before the next one
    starts (promtool's --end is inclusive), so no evaluation is made twice or missed."""
    # promtool offsets a group's evaluations by a hash of its name and file: the file is given by a
    # relative name, the same in every build, so every build records the same timestamps and values
    # promtool runs in `work` (cwd): the output directory must not be relative to where we are
    work = Path(work).resolve()
    out, rules_file = work / "rule-blocks", work / "rules-backfill.yaml"
    piece_s = piece_s or RULE_CHUNK_S
    starts = list(range(start, end, piece_s)) or [start]
    pieces = [(t, starts[i + 1] - 1 if i + 1 < len(starts) else end) for i, t in enumerate(starts)]
    unit = "days" if piece_s == 86400 else f"pieces of {piece_s} s"
    for n, doc in enumerate(levels, 1):
        rules_file.write_text(yaml.safe_dump(doc, sort_keys=False, width=1 << 20))
        records = sorted({x["record"] for g in doc["groups"] for x in g["rules"]})
        label = what + (f", level {n} of {len(levels)}" if len(levels) > 1 else "")
        lookback = f"--query.lookback-delta={lookback_delta(step_s)}"
        with PrometheusServer(tsdb, workdir=work, extra_args=(lookback,)) as server:
            argv = [PROMTOOL, "tsdb", "create-blocks-from", "rules", "--quiet", f"--url={server.url}",
                    f"--eval-interval={step_s}s"]  # fmt: skip
            with ThreadPoolExecutor(max_workers=2) as pool:
                runs = {
                    pool.submit(
                        subprocess.run,
                        [*argv, f"--start={first}", f"--end={last}", f"--output-dir={out / str(first)}",
                         rules_file.name],
                        capture_output=True, text=True, cwd=work,
                    ): (first, last)
                    for first, last in pieces
                }  # fmt: skip
                said = time.monotonic()
                for done, run in enumerate(as_completed(runs), 1):
                    r, (first, last) = run.result(), runs[run]
                    if r.returncode:
                        raise SandboxError(
                            f"promtool create-blocks-from rules failed on {', '.join(records)} from {first} "
                            f"to {last} (exit {r.returncode}): {r.stderr[-2000:]}"
                        )
                    if done == len(pieces) or time.monotonic() - said >= PROGRESS_EVERY_S:
                        log.info("  %s: %d of %d %s evaluated", label, done, len(pieces), unit)
                        said = time.monotonic()
        for piece in sorted(out.iterdir()):
            for block in piece.iterdir():
                block.rename(tsdb / block.name)
        shutil.rmtree(out)
        for leftover in ("wal", "chunks_head", "queries.active", "lock"):  # the temporary server's state
            path = tsdb / leftover
            shutil.rmtree(path) if path.is_dir() else path.unlink(missing_ok=True)
    rules_file.unlink(missing_ok=True)


def inline_records(rules_file: Path) -> dict:
    """The rules file with every reference to an earlier rule's record replaced by that rule's expression
    (itself inlined): what a live Prometheus computes, evaluating a group's rules in order. Only bare
    references (no matchers, no range) are inlined; the generated rules have no others."""
    doc = yaml.safe_load(Path(rules_file).read_text())
    exprs: dict[str, str] = {}
    for group in doc["groups"]:
        for rule in group["rules"]:
            expr = rule["expr"].strip()
            for record, body in exprs.items():
                ref = re.compile(rf"(?<![\w:]){re.escape(record)}(?![\w:])(\s*[{{\[])?")
                if any(m.group(1) for m in ref.finditer(expr)):
                    raise SandboxError(
                        f"{rules_file}: {rule['record']} reads {record} with matchers or a range"
                    )
                expr = ref.sub(lambda _, body=body: f"({body})", expr)
            exprs[rule["record"]] = expr
            rule["expr"] = expr + "\n"
    return doc


def copy_tsdb(src: Path, dst: Path) -> Path:
    """Copy a TSDB for a server to write into; ``dst`` must not exist. A block's files are hard links where
    the file system allows (a cached history is ~16,000 files: copying them took 1.5-6 s of every demo's
    start): Prometheus replaces a block's files rather than writing into them (meta.json and tombstones
    through a temporary file it renames, compaction into new blocks), so the cache keeps its bytes
    (test_prometheus_backfill: a series deleted and its blocks rewritten leave the cache as it was).
    Everything else (the head's WAL, which is appended to) is copied."""
    src = Path(src)

    def link_or_copy(a: str, b: str) -> None:
        block = src / Path(a).relative_to(src).parts[0]
        if (block / "meta.json").is_file():
            try:
                os.link(a, b)
                return
            except OSError:  # another file system, or no hard links there
                pass
        shutil.copy2(a, b)

    shutil.copytree(src, dst, copy_function=link_or_copy)
    return Path(dst)


class PrometheusServer(LocalServer):
    """/usr/bin/prometheus on ``tsdb_dir``, listening on 127.0.0.1 only, with no scrape jobs.

    ``scrape_jobs`` (job name -> targets) are scraped every ``scrape_interval``; ``rule_files`` are
    loaded (the catalog's recording rules). ``sample_labels`` (job name -> labels) sets labels on every
    sample a job scrapes (``sample_relabels``). ``extra_args`` go to prometheus as they are (tests use
    ``--query.max-samples`` to provoke errors). Backfilled history has no staleness markers, so a series
    that ends (pod gone, node lost) keeps answering plain selectors for the 5-minute look-back; the
    ingest asks for ``last_over_time(x[step])`` and so does not depend on staleness.
    """

    label = "Prometheus"
    log_name = "prometheus.log"
    poll_s = 0.1

    def __init__(
        self,
        tsdb_dir: Path,
        port: int = 0,
        workdir: Path | None = None,
        extra_args: tuple[str, ...] = (),
        scrape_jobs: dict[str, list[str]] | None = None,
        scrape_interval: str = "15s",
        rule_files: tuple[Path, ...] = (),
        sample_labels: dict[str, dict[str, str]] | None = None,
    ):
        super().__init__(port, workdir)
        self.extra_args = tuple(extra_args)
        self.scrape_jobs = scrape_jobs or {}
        self.sample_labels = sample_labels or {}
        self.scrape_interval = scrape_interval
        self.rule_files = tuple(Path(p).resolve() for p in rule_files)
        self.tsdb_dir = Path(tsdb_dir).resolve()

    def _config(self) -> str:
        return _config_text(self.scrape_interval, self.scrape_jobs, self.rule_files, self.sample_labels)

    def prepare(self) -> None:
        (self.workdir / "prometheus.yml").write_text(self._config())

    def command(self) -> list[str]:
        return [
            PROMETHEUS,
            f"--config.file={self.workdir / 'prometheus.yml'}",
            f"--storage.tsdb.path={self.tsdb_dir}",
            f"--web.listen-address=127.0.0.1:{self.port}",
            # the default 15d would delete backfilled blocks older than that on startup
            "--storage.tsdb.retention.time=100y",
            "--web.enable-lifecycle",
            *self.extra_args,
        ]

    def ready(self, timeout: float) -> bool:
        return http_ok(f"{self.url}/-/ready", timeout)


def _config_text(
    scrape_interval: str, scrape_jobs: dict[str, list[str]], rule_files, sample_labels: dict | None = None
) -> str:
    jobs = []
    for job, targets in scrape_jobs.items():
        # honor_labels: the exporter's pod labels name the pod holding the GPU (as in our ServiceMonitor)
        jobs.append({"job_name": job, "honor_labels": True, "static_configs": [{"targets": list(targets)}]})
        if (sample_labels or {}).get(job):
            jobs[-1]["metric_relabel_configs"] = sample_relabels(sample_labels[job])
    config = {
        "global": {"scrape_interval": scrape_interval, "evaluation_interval": scrape_interval},
        "rule_files": [str(p) for p in rule_files],
        "scrape_configs": jobs,
    }
    return json.dumps(config, indent=2) + "\n"  # JSON is YAML


def sample_relabels(labels: dict[str, str]) -> list[dict]:
    """metric_relabel_configs that set ``labels`` on every scraped sample, and not on ``up``: Prometheus
    applies metric relabelling to scraped samples only, never to the series it generates itself such as
    ``up`` (prometheus.io docs, configuration, <metric_relabel_configs>; the test checks it).

    The sandbox's stand-in for the pod labels a PodMonitor gives a trainer's series: a static target has no
    pod, and the trainer reports its own GPUs, so its ``up`` must not name the pod either, or the recording
    rules would take it for an exporter's pod and its GPUs for GPUs no pod holds (metric_catalog.yaml)."""
    return [
        {"action": "replace", "regex": "(.*)", "replacement": value, "target_label": label}
        for label, value in labels.items()
    ]


# ---- one detached server per state directory (demo, CLI) ----

# Servers started by up() in this process, so down() in the same process can reap them (no zombie, no
# ResourceWarning); from another process down() finds the group by the recorded pid.
_DETACHED: dict[int, subprocess.Popen] = {}


EXPORTER_JOB = "foxhunt-gpu-exporter"
LIVE_NODE = "sandbox-live-node"
TRAINER_JOB = "example-trainer"
# The sandbox trainer's endless run: every fold again and again, slow enough to cost little CPU.
TRAINER_ARGS = ("--rounds", "0", "--folds", "3", "--epochs", "6", "--batches", "20", "--step-seconds", "0.1",
                "--checkpoint-failure-fold", "2", "--fake-gpus", "2")  # fmt: skip


def start_fake_exporter(
    port: int, workdir: Path, interval: float = 5.0, scenario: Path | None = None, hostname: str = LIVE_NODE
) -> subprocess.Popen:
    """The live path's exporter with its fake NVML backend, in its own process group, ready to scrape."""
    cmd = [
        sys.executable,
        "-m",
        "foxhunt_gpu_exporter",
        "--fake",
        *([str(scenario)] if scenario else []),
        "--listen-address",
        f"127.0.0.1:{port}",
        "--interval",
        str(interval),
        "--hostname",
        hostname,
    ]
    log = (Path(workdir) / "exporter.log").open("ab")
    process = subprocess.Popen(
        cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
    )
    log.close()
    # not serving: is exporter/ installed? (pip install -e ./exporter, which make does)
    return wait_serving(process, port, 20, "foxhunt-gpu-exporter", Path(workdir) / "exporter.log")


def up(
    scenario_name: str,
    state_dir: Path,
    port: int,
    exporter_port: int | None = None,
    trainer: bool = False,
    records_from: datetime | None = None,
) -> dict:
    """Build or reuse the scenario's TSDB under ``state_dir/cache``, run Prometheus on a fresh copy in
    ``state_dir/run`` (detached: it outlives this process) and record it in ``state_dir/sandbox.json``.
    Beside the backfilled history, a live fake exporter (``exporter_port``, default a free port) is
    scraped every 5 s and the catalog's recording rules are loaded: the live path, end to end.
    ``trainer``: the example trainer (foxhunt_obs/sandbox/example_trainer.py) runs too, scraped as the
    training cockpit expects. ``records_from``: a first build records the rules from there on only
    (``build_tsdb``: the demo's). A server already recorded there is stopped first."""
    state_dir = Path(state_dir)
    scenario = load_scenario(scenario_name)
    tsdb = build_tsdb(scenario, state_dir / "cache", records_from=records_from)
    down(state_dir)
    run = state_dir / "run"
    copy_tsdb(tsdb, run / "tsdb")
    exporter_port = exporter_port or free_port()
    exporter = start_fake_exporter(exporter_port, run)
    _DETACHED[exporter.pid] = exporter
    jobs, trainer_process, trainer_port = {EXPORTER_JOB: [f"127.0.0.1:{exporter_port}"]}, None, None
    try:
        if trainer:
            from foxhunt_obs.sandbox.example_trainer import SANDBOX_POD, start_example_trainer

            trainer_port = free_port()
            trainer_process = start_example_trainer(trainer_port, run, *TRAINER_ARGS)
            _DETACHED[trainer_process.pid] = trainer_process
            jobs[TRAINER_JOB] = [f"127.0.0.1:{trainer_port}"]
        server = PrometheusServer(
            run / "tsdb",
            port=port,
            workdir=run,
            scrape_jobs=jobs,
            scrape_interval="5s",
            rule_files=(RECORDING_RULES,),
            sample_labels={TRAINER_JOB: SANDBOX_POD} if trainer else None,
        ).start()
    except BaseException:
        for pid in (exporter.pid, trainer_process and trainer_process.pid):
            if pid:
                kill_group(pid, 5.0, _DETACHED.pop(pid))
        raise
    _DETACHED[server.pid] = server.process
    state = {
        "pid": server.pid,
        "url": server.url,
        "exporter_pid": exporter.pid,
        "exporter_url": f"http://127.0.0.1:{exporter_port}",
        **(
            {"trainer_pid": trainer_process.pid, "trainer_url": f"http://127.0.0.1:{trainer_port}"}
            if trainer_process
            else {}
        ),
        "scenario": scenario.name,
        "fingerprint": scenario.fingerprint(),
        "start": scenario.start.isoformat(),
        "end": scenario.end.isoformat(),
        "tsdb": str(run / "tsdb"),
        "log": str(server.log_path),
    }
    (state_dir / "sandbox.json").write_text(json.dumps(state, indent=2) + "\n")
    return state


def _state(state_dir: Path) -> dict | None:
    return read_state(Path(state_dir) / "sandbox.json")


def down(state_dir: Path) -> None:
    """Stop the server recorded in ``state_dir/sandbox.json`` and remove its run dir; fine if none runs."""
    from foxhunt_obs.sandbox.servers.mlflow_server import down_mlflow  # both import this module
    from foxhunt_obs.sandbox.servers.moto_server import down_moto

    state_dir = Path(state_dir)
    down_mlflow(state_dir)  # before run/ goes: its store and the servers' logs live there
    down_moto(state_dir)
    state = _state(state_dir)
    if state:
        for key in ("pid", "exporter_pid", "trainer_pid"):
            pid = state.get(key)
            process = _DETACHED.pop(pid, None)
            if pid and alive(pid):
                kill_group(pid, 10.0, process)
    (state_dir / "sandbox.json").unlink(missing_ok=True)
    shutil.rmtree(state_dir / "run", ignore_errors=True)


def status(state_dir: Path) -> dict | None:
    """The recorded state if its Prometheus is alive and ready, else None."""
    state = _state(state_dir)
    if state and alive(state["pid"]) and http_ok(f"{state['url']}/-/ready"):
        return state
    return None
