"""Sandbox scenarios: a synthetic GPU cluster and the incidents injected into it (docs/design.md#the-sandbox).

A scenario is data (``scenarios/<name>.yaml``); this module loads and validates it. ``truth.py`` turns it
into exact samples and ``openmetrics.py`` writes those samples for Prometheus. Every time in a scenario is
an offset from ``start`` that must sit on the scrape grid, so the ground truth is exactly what Prometheus
returns, sample for sample.

YAML layout (see scenarios/small.yaml for a commented example)::

    name, start, hours, scrape_interval_s, seed
    node_defaults: {instance_type, gpus, model, mem_mib, cpus, mem_gib, exporter}   # optional
    nodes:        [{name, ...overrides, mig?, time_sliced?}]  or  [name, ...]
    experiments:  [{name, namespace}]
    pods:         [{name, experiment, node, gpus: [idx | "idx/gi"], start_h, end_h,  # hours, or "H:MM[:SS]"
                    util: {base, amplitude, period_h, noise}, container?}]
    incidents:    [{kind: stall, pod, namespace?, start_h, minutes}
                   {kind: ecc_sbe | ecc_dbe, node, gpu, start_h, minutes, count}
                   {kind: node_lost, node, start_h, minutes}
                   {kind: oom_loop, pod, namespace?, start_h, minutes, count}]   # `count` container restarts
    training:                                                             # optional: MLflow runs
      steps_per_hour: 12            # logging cadence: 3600 / steps_per_hour s, a multiple of the scrape
      runs:         [{name, experiment, algo: PPO|DQN, fold, pod? | pods?: [name, ...], start_h?, end_h?,
                      status: FINISHED|FAILED|KILLED|RUNNING, deleted?: false}]
      incidents:    [{kind: nan_loss, run, at_h, steps}        # `steps` logged steps bad: NaN.., last +Inf
                     {kind: entropy_collapse, run, at_h}       # actor/entropy ~0.01 from at_h on
                     {kind: success_drop, run, at_h}           # success_rate falls to 40 % and stays
                     {kind: stall, run, at_h}]                 # a RUNNING run logs nothing from at_h on
    aws:                                                                  # optional: see aws_scenario.py
      {account_id, region, tags, fsx: [...], billed: {s3_buckets, eks_cluster}, budget, incidents: [fsx_fill]}
    ray:          [{name, head, workers: [pod, ...],                      # optional: KubeRay clusters
                    incidents?: [{kind: worker_lost, pod, start_h, minutes}]}]

A pod is identified by (namespace, name, start), never by its name alone: its namespace is its
experiment's, and a name may come back (a StatefulSet's ``trainer-0`` recreated later, on the same or
another node) and may exist in several namespaces at once. Two pods of one namespace and name may not
live at the same time and must carry the same experiment (a StatefulSet's pod template keeps its labels).
``Pod.index`` (its position in the file) is what the truth and the generators refer to it by. Where the
YAML names a pod (incidents, runs) the name must resolve to exactly one pod: by ``namespace`` where the
name exists in several, and by the time of the incident or run where it exists several times.

The ``training`` block describes MLflow runs (``training.py`` writes them into a real MLflow store).
A run's ``experiment`` must be a scenario experiment (it becomes the MLflow experiment name), and its pods
are looked up in that experiment's namespace. A run with a ``pod`` (or several: ``pods``, a Ray job's
head and workers) inherits the latest start and the earliest end of its pods unless given and must lie
within each pod's lifetime; its MLflow tag ``pod`` lists them comma-separated, ``namespace`` names their
namespace. A run on a pod name that exists several times must give start_h (the incarnation it ran on).
A run without one (a workstation, another cluster) must give start_h and, unless RUNNING, end_h. A run logs
every metric at start + k * (3600 / steps_per_hour) for every such time before its end (exclusive), so
start_h, end_h and every at_h must sit on that logging grid. A RUNNING run has no end time in MLflow: it
logs until the scenario ends, or until its ``stall``; one that ends earlier (its pod ends) must carry a
stall at or before that end (the trainer died and never terminated its run). A GPU ``stall`` incident
on one of a run's pods pauses that run's logging for the stall's window (a hung trainer logs nothing);
training incidents may not fall into such a pause. ``deleted: true`` deletes the run after it is logged.

The ``ray`` block makes pods a KubeRay cluster (``name`` is its ray.io/cluster): a head and its workers,
pods of one experiment, each a Ray node reporting Ray's own series (truth.ray_track, openmetrics.py) while
it lives; the workers live within the head's lifetime and hold whole GPUs (Ray's logical GPUs are the
pod's). A ``worker_lost`` incident kills a worker's raylet for its window (its scrape fails, its actor
restarts, its work waits for a node): it must lie within the worker's lifetime. It changes no GPU sample.

The ``aws`` block (aws_scenario.py) describes the bills and FSx file systems: bills.py is their exact truth
and moto_server.py seeds a moto server with it. It changes no Prometheus or MLflow sample.

A node's ``exporter`` says how its dcgm-exporter is deployed, which is what its series look like
(openmetrics.py): ``gpu-operator`` (the default: NVIDIA GPU Operator, namespace gpu-operator, pods and
container ``nvidia-dcgm-exporter``) or ``helm-chart`` (NVIDIA's own dcgm-exporter chart: container
``exporter``, pods ``dcgm-exporter-xxxxx``, its built-in counters list, which has no ECC fields and no
DCGM_FI_DRIVER_VERSION label; ECC incidents cannot be told on such a node). Both are scraped with
honor_labels off, so a holder arrives as exported_pod and every series carries the exporter pod's own
namespace/pod/container, as ``up`` does.

A node's ``mig`` puts GPUs in MIG mode: ``mig: {0: [3g.40gb, 3g.40gb]}`` slices GPU 0 into GPU instances
of those profiles, with GPU instance ids 1, 2, ... in the order listed (what ``nvidia-smi mig -cgi`` gives
the first instances on an empty A100/H100; other layouts get other ids on real GPUs, which nothing
here depends on). The profiles' compute slices may not exceed the GPU's (7 on an A100; mig_profiles.yaml),
nor their memory the GPU's. A MIG GPU has no whole-GPU holder: a pod holds a slice, ``gpus: ["0/1"]``
(GPU 0, GPU instance 1), and two pods may hold the two slices of one GPU at the same time. Each slice
reports its own activity (DCGM_FI_PROF_GR_ENGINE_ACTIVE; no DCGM_FI_DEV_GPU_UTIL) and memory, and the
GPU's device values (temperature, power, clocks, energy, XID) on each of its slices. Stall incidents need
a pod holding whole GPUs and ECC incidents a whole GPU: the truth tells them per GPU.

A node's ``time_sliced`` shares GPUs between pods by time-slicing (the NVIDIA device plugin's
``sharing.timeSlicing``): ``time_sliced: {gpus: [1], replicas: 2}`` advertises each listed GPU as
``replicas`` devices ``<GPU UUID>::0``, ``::1``, ... and up to that many pods may hold the GPU at the same
time, each one replica: the lowest replica free when the pod starts (``Pod.vgpu``). It is the only case
where two pods may hold one GPU at the same step; anywhere else that is an error. The node's
dcgm-exporter runs with ``--kubernetes-virtual-gpus`` (openmetrics.py), so it must be a GPU Operator
node (``exporter: gpu-operator``), and a time-sliced GPU may not be in MIG mode. (A real device plugin
config shares every GPU of the node; listing GPUs keeps the other GPUs' series as they were, which is
also what the exporter writes for a GPU that is not shared.) A stall on a pod holding a time-sliced GPU
cannot be told from the GPU (the other pods keep it busy): stall incidents need unshared GPUs.
"""

from __future__ import annotations

import hashlib
import math
import re
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import yaml

from foxhunt_obs.lib.ingest.mig import MigError, slice_share
from foxhunt_obs.sandbox.story.aws_scenario import Aws, parse_aws

# Bump whenever the generator writes different samples for the same YAML: it is part of the cache key.
GENERATOR_VERSION = "8"
SCENARIO_DIR = Path(__file__).resolve().parent / "scenarios"
INCIDENT_KINDS = ("stall", "ecc_sbe", "ecc_dbe", "node_lost", "oom_loop")
RAY_INCIDENT_KINDS = ("worker_lost",)
TRAINING_INCIDENT_KINDS = ("nan_loss", "entropy_collapse", "success_drop", "stall")
RUN_STATUSES = ("FINISHED", "FAILED", "KILLED", "RUNNING")
ALGOS = ("PPO", "DQN")
EXPORTERS = ("gpu-operator", "helm-chart")  # how a node's dcgm-exporter is deployed (openmetrics.py)

_NODE_DEFAULTS = {
    "instance_type": "p4de.24xlarge",
    "gpus": 8,
    "model": "NVIDIA A100-SXM4-80GB",
    "mem_mib": 81920,
    "cpus": 4,  # node_exporter CPUs written; a real p4de has 96, 4 keeps the files small
    "mem_gib": 1152,
    "exporter": "gpu-operator",
}


def _h(offset_s: int) -> str:
    """An offset for messages: "4.5h" on quarter hours, else "H:MM" ("2:40") or "H:MM:SS"."""
    if offset_s % 900 == 0:
        return f"{offset_s / 3600:g}h"
    h, rest = divmod(offset_s, 3600)
    return f"{h}:{rest // 60:02d}" + (f":{rest % 60:02d}" if rest % 60 else "")


class ScenarioError(ValueError):
    """A scenario file that cannot describe a consistent cluster."""


@dataclass(frozen=True)
class MigSlice:
    """A MIG GPU instance: GPU ``gpu`` of its node, GPU_I_ID ``instance``, GPU_I_PROFILE ``profile``."""

    gpu: int
    instance: int
    profile: str  # "3g.40gb"
    share: float  # of its GPU: the profile's compute slices over the GPU's (mig_profiles.yaml)
    mem_mib: int  # its framebuffer: the profile's GB x 1024 MiB (FB_USED + FB_FREE)


@dataclass(frozen=True)
class Node:
    name: str
    index: int  # position in the file: part of every random seed of this node
    instance_type: str
    gpus: int
    model: str
    mem_mib: int
    cpus: int
    mem_total_bytes: int
    exporter: str = "gpu-operator"  # one of EXPORTERS
    mig: tuple[MigSlice, ...] = ()  # the slices of its GPUs in MIG mode, by GPU then instance
    time_sliced: tuple[int, ...] = ()  # GPUs shared by time-slicing, each as `replicas` devices
    replicas: int = 1  # devices per time-sliced GPU: at most this many pods hold it at once

    def slices(self, gpu: int) -> tuple[MigSlice, ...]:
        """The GPU's MIG slices; () for a whole GPU."""
        return tuple(s for s in self.mig if s.gpu == gpu)

    def is_mig(self, gpu: int) -> bool:
        return any(s.gpu == gpu for s in self.mig)

    def is_time_sliced(self, gpu: int) -> bool:
        return gpu in self.time_sliced

    def replicas_of(self, gpu: int) -> int:
        """How many pods may hold the GPU at once: ``replicas`` if time-sliced, else 1."""
        return self.replicas if gpu in self.time_sliced else 1


@dataclass(frozen=True)
class Experiment:
    name: str
    namespace: str


@dataclass(frozen=True)
class UtilProfile:
    """util % = base + amplitude * sin(2π t / period_h) + noise * N(0, 1), clipped to 0..100."""

    base: float
    amplitude: float = 0.0
    period_h: float = 0.0  # 0: no wave
    noise: float = 0.0


@dataclass(frozen=True)
class Pod:
    name: str
    experiment: str
    namespace: str
    node: str
    gpus: tuple[int, ...]  # whole GPUs held
    start: datetime
    end: datetime  # exclusive
    start_s: int  # offsets from the scenario start, seconds
    end_s: int
    util: UtilProfile
    container: str = "trainer"
    slices: tuple[tuple[int, int], ...] = ()  # MIG slices held: (GPU, GPU instance id), "0/1" in YAML
    index: int = -1  # position in the file: its identity (scenario.pods[index] is this pod)
    vgpu: tuple[tuple[int, int], ...] = ()  # (GPU, replica) of each time-sliced GPU it holds

    @property
    def key(self) -> tuple[str, str, int]:
        """(namespace, name, start_s): who the pod is. A name alone may be reused or in two namespaces."""
        return (self.namespace, self.name, self.start_s)

    def replica(self, gpu: int) -> int | None:
        """The replica (dcgm-exporter's ``vgpu`` label) it holds of a time-sliced GPU; None otherwise."""
        return next((r for g, r in self.vgpu if g == gpu), None)

    def describe(self) -> str:
        """How messages name one pod among its namesakes: 'name' (namespace, start..end)."""
        return f"{self.name!r} ({self.namespace}, {_h(self.start_s)}..{_h(self.end_s)})"


@dataclass(frozen=True)
class Incident:
    kind: str  # one of INCIDENT_KINDS
    start: datetime
    end: datetime  # exclusive
    start_s: int
    end_s: int
    node: str
    gpu: int | None = None  # ecc_*
    pod: str | None = None  # stall, oom_loop: the pod's name
    count: int = 0  # ecc_*: errors added over the window; oom_loop: container restarts
    pod_index: int | None = None  # stall, oom_loop: the pod (scenario.pods[pod_index])


@dataclass(frozen=True)
class TrainingRun:
    """An MLflow run. [start, end) is its logging window (end exclusive); for a non-RUNNING run ``end`` is
    also its MLflow end time, a RUNNING run has none (``end`` is then where its logging window closes)."""

    name: str
    index: int  # position in the file: part of every random seed of this run
    experiment: str
    namespace: str
    algo: str  # one of ALGOS
    fold: int
    pod: str | None  # its MLflow tag `pod`: the pods' names, comma-separated; None: logged from outside
    status: str  # one of RUN_STATUSES
    deleted: bool
    start: datetime
    end: datetime
    start_s: int  # offsets from the scenario start, seconds
    end_s: int
    pods: tuple[int, ...] = ()  # its pods (indexes in scenario.pods), in the order of the tag


@dataclass(frozen=True)
class TrainingIncident:
    kind: str  # one of TRAINING_INCIDENT_KINDS
    run: str
    at: datetime
    at_s: int
    steps: int = 0  # nan_loss: consecutive logged steps with a bad actor/loss


@dataclass(frozen=True)
class Training:
    steps_per_hour: int
    runs: tuple[TrainingRun, ...]
    incidents: tuple[TrainingIncident, ...]

    @property
    def interval_s(self) -> int:
        """Seconds between two logged steps of a run."""
        return 3600 // self.steps_per_hour

    def run(self, name: str) -> TrainingRun:
        for r in self.runs:
            if r.name == name:
                return r
        raise KeyError(f"no training run {name!r}")


@dataclass(frozen=True)
class RayIncident:
    kind: str  # one of RAY_INCIDENT_KINDS
    pod_index: int  # the worker (scenario.pods[pod_index])
    start_s: int
    end_s: int


@dataclass(frozen=True)
class RayCluster:
    """A KubeRay cluster: ``name`` (ray.io/cluster), its head and workers (indexes in scenario.pods)."""

    name: str
    namespace: str
    experiment: str
    head: int
    workers: tuple[int, ...]
    incidents: tuple[RayIncident, ...] = ()

    @property
    def pods(self) -> tuple[int, ...]:
        return (self.head, *self.workers)


@dataclass(frozen=True)
class Scenario:
    name: str
    start: datetime
    hours: int
    step_s: int
    seed: int
    nodes: tuple[Node, ...]
    experiments: tuple[Experiment, ...]
    pods: tuple[Pod, ...]
    incidents: tuple[Incident, ...]
    source: str = field(default="", repr=False, compare=False)  # the YAML text, for the fingerprint
    training: Training | None = None  # the optional `training:` block (MLflow runs)
    aws: Aws | None = None  # the optional `aws:` block (bills, FSx; bills.py, moto_server.py)
    ray: tuple[RayCluster, ...] = ()  # the optional `ray:` block (KubeRay clusters)

    @property
    def end(self) -> datetime:
        return self.start + timedelta(hours=self.hours)

    @property
    def steps(self) -> int:
        """Scrapes per series over [start, end)."""
        return self.hours * 3600 // self.step_s

    def node(self, name: str) -> Node:
        for n in self.nodes:
            if n.name == name:
                return n
        raise KeyError(f"scenario {self.name}: no node {name!r}")

    def experiment(self, name: str) -> Experiment:
        for e in self.experiments:
            if e.name == name:
                return e
        raise KeyError(f"scenario {self.name}: no experiment {name!r}")

    def pods_named(self, name: str, namespace: str | None = None) -> list[Pod]:
        """Every pod with that name (in that namespace), in file order: a name may be reused."""
        return [p for p in self.pods if p.name == name and namespace in (None, p.namespace)]

    def pod(self, ref: Pod | int | str, namespace: str | None = None) -> Pod:
        """A pod by Pod, index, or a name (and namespace) that must name exactly one pod."""
        if isinstance(ref, Pod):
            return ref
        if isinstance(ref, int):
            return self.pods[ref]
        found = self.pods_named(ref, namespace)
        if len(found) != 1:
            which = ", ".join(p.describe() for p in found) or "none"
            raise KeyError(f"scenario {self.name}: {ref!r} names {len(found)} pods ({which}), not one")
        return found[0]

    def fingerprint(self) -> str:
        """Cache key of everything generated from this scenario."""
        return hashlib.sha256(f"{GENERATOR_VERSION}\n{self.source}".encode()).hexdigest()


def load_scenario(name_or_path: str | Path) -> Scenario:
    """Load ``scenarios/<name>.yaml`` for a bare name, else the YAML file at the given path."""
    text = str(name_or_path)
    is_name = "/" not in text and not text.endswith((".yaml", ".yml"))
    path = SCENARIO_DIR / f"{text}.yaml" if is_name else Path(text)
    if not path.is_file():
        known = ", ".join(sorted(p.stem for p in SCENARIO_DIR.glob("*.yaml")))
        raise ScenarioError(f"scenario {text!r}: no file {path} (bundled scenarios: {known})")
    return parse_scenario(path.read_text(), origin=str(path))


def parse_scenario(source: str, origin: str = "<string>") -> Scenario:
    try:
        raw = yaml.safe_load(source)
    except yaml.YAMLError as e:
        raise ScenarioError(f"scenario {origin}: not valid YAML: {e}") from e
    if not isinstance(raw, dict):
        raise ScenarioError(f"scenario {origin}: expected a mapping at the top level")
    return ScenarioParser(origin).parse(raw, source)


class ScenarioParser:
    """Turns the raw YAML mapping into a Scenario; every error names the file and the item."""

    def __init__(self, origin: str):
        self.origin = origin

    def fail(self, where: str, msg: str) -> ScenarioError:
        return ScenarioError(f"scenario {self.origin}: {where}: {msg}")

    def fields(self, d: Any, where: str, required: set[str], optional: set[str] = frozenset()) -> dict:
        if not isinstance(d, dict):
            raise self.fail(where, f"expected a mapping, got {d!r}")
        missing = required - d.keys()
        unknown = d.keys() - required - optional
        if missing:
            raise self.fail(where, f"missing {', '.join(sorted(missing))}")
        if unknown:
            raise self.fail(where, f"unknown field(s) {', '.join(sorted(unknown))}")
        return d

    def offset(self, value: float | str, unit_s: int, where: str, what: str) -> int:
        """Seconds for a value in hours/minutes (or an "H:MM[:SS]" string), which must be on the grid."""
        if isinstance(value, str) and ":" in value:
            try:
                s = sum(float(x) * u for x, u in zip(value.split(":"), (3600, 60, 1)))
            except ValueError:
                raise self.fail(where, f"{what}={value!r} is not H:MM[:SS]") from None
        else:
            s = float(value) * unit_s
        k = round(s / self.step)
        if not math.isclose(k * self.step, s, abs_tol=1e-6):
            raise self.fail(where, f"{what}={value} is not on the {self.step} s scrape grid")
        return k * self.step

    def parse(self, raw: dict, source: str) -> Scenario:
        top = self.fields(
            raw,
            "top level",
            {"name", "start", "hours", "scrape_interval_s", "seed", "nodes", "experiments", "pods"},
            {"node_defaults", "incidents", "description", "training", "aws", "ray"},
        )
        start = top["start"]
        if isinstance(start, str):
            start = datetime.fromisoformat(start.replace("Z", "+00:00"))
        if not isinstance(start, datetime):
            raise self.fail("start", f"expected an ISO timestamp, got {start!r}")
        start = start.replace(tzinfo=timezone.utc) if start.tzinfo is None else start.astimezone(timezone.utc)
        self.start, self.step, self.hours = start, int(top["scrape_interval_s"]), int(top["hours"])
        if self.step <= 0 or 3600 % self.step:
            raise self.fail("scrape_interval_s", f"{self.step} must divide an hour")
        if self.hours <= 0 or top["hours"] != self.hours:
            raise self.fail("hours", f"expected a positive whole number, got {top['hours']!r}")
        if start.timestamp() % 3600:
            raise self.fail("start", "must be on a whole hour (cpu/network rates change per hour)")

        defaults = {**_NODE_DEFAULTS, **(top.get("node_defaults") or {})}
        self.fields(defaults, "node_defaults", set(), set(_NODE_DEFAULTS))
        nodes = tuple(self.node(i, n, defaults) for i, n in enumerate(top["nodes"]))
        experiments = tuple(self.experiment(e) for e in top["experiments"])
        self.unique(nodes, "node")
        self.unique(experiments, "experiment")
        self.nodes = {n.name: n for n in nodes}
        self.experiments = {e.name: e for e in experiments}
        pods = tuple(self.pod(i, p) for i, p in enumerate(top["pods"]))
        self.check_identities(pods)
        pods = self.check_overlaps(pods)
        self.pods = pods
        self.pods_by_name: dict[str, list[Pod]] = {}
        for p in pods:
            self.pods_by_name.setdefault(p.name, []).append(p)
        incidents = tuple(self.incident(i, d) for i, d in enumerate(top.get("incidents") or []))
        self.check_outages(pods, incidents)
        self.gpu_incidents = incidents
        training = self.training(top["training"]) if top.get("training") is not None else None
        aws = parse_aws(self, top["aws"]) if top.get("aws") is not None else None
        ray = self.ray(top.get("ray") or [])
        return Scenario(
            name=str(top["name"]),
            start=start,
            hours=self.hours,
            step_s=self.step,
            seed=int(top["seed"]),
            nodes=nodes,
            experiments=experiments,
            pods=pods,
            incidents=incidents,
            source=source,
            training=training,
            aws=aws,
            ray=ray,
        )

    def unique(self, items, kind: str) -> None:
        seen = set()
        for it in items:
            if it.name in seen:
                raise self.fail(f"{kind} {it.name!r}", "defined twice")
            seen.add(it.name)

    def known(self, table: dict, name: Any, kind: str, where: str):
        if name not in table:
            raise self.fail(where, f"unknown {kind} {name!r} (known: {', '.join(table)})")
        return table[name]

    def node(self, i: int, d: Any, defaults: dict) -> Node:
        d = {"name": d} if isinstance(d, str) else d
        where = f"nodes[{i}]" + (f" ({d.get('name')!r})" if isinstance(d, dict) and "name" in d else "")
        d = self.fields(d, where, {"name"}, {*_NODE_DEFAULTS, "mig", "time_sliced"})
        v = {**defaults, **d}
        if v["exporter"] not in EXPORTERS:
            raise self.fail(where, f"exporter must be one of {', '.join(EXPORTERS)}, got {v['exporter']!r}")
        node = Node(
            name=v["name"],
            index=i,
            instance_type=v["instance_type"],
            gpus=int(v["gpus"]),
            model=v["model"],
            mem_mib=int(v["mem_mib"]),
            cpus=int(v["cpus"]),
            mem_total_bytes=int(v["mem_gib"]) << 30,
            exporter=v["exporter"],
        )
        if d.get("mig") is not None:
            node = replace(node, mig=self.mig(node, d["mig"], f"{where}: mig"))
        if d.get("time_sliced") is not None:
            node = self.time_sliced(node, d["time_sliced"], f"{where}: time_sliced")
        return node

    def time_sliced(self, node: Node, d: Any, where: str) -> Node:
        """``{gpus: [idx, ...], replicas: N}``: each listed GPU advertised as N devices <UUID>::0..N-1."""
        d = self.fields(d, where, {"gpus", "replicas"})
        replicas = d["replicas"]
        if not isinstance(replicas, int) or isinstance(replicas, bool) or replicas < 2:
            raise self.fail(where, f"replicas must be a whole number >= 2, got {replicas!r}")
        gpus = d["gpus"]
        if (
            not isinstance(gpus, list)
            or not gpus
            or not all(isinstance(g, int) and not isinstance(g, bool) for g in gpus)
        ):
            raise self.fail(where, f"gpus must be a non-empty list of GPU indexes, got {gpus!r}")
        if len(set(gpus)) != len(gpus):
            raise self.fail(where, f"gpus must not name a GPU twice, got {gpus!r}")
        if node.exporter != "gpu-operator":
            raise self.fail(
                where,
                f"{node.name}'s exporter is {node.exporter}: time-sliced GPUs are written as the GPU "
                "Operator's dcgm-exporter with --kubernetes-virtual-gpus writes them (exporter: gpu-operator)",
            )
        for g in gpus:
            if not 0 <= g < node.gpus:
                raise self.fail(where, f"GPU index {g} out of range (node {node.name} has {node.gpus} GPUs)")
            if node.is_mig(g):
                raise self.fail(
                    where, f"GPU {g} of {node.name} is in MIG mode: it cannot also be time-sliced"
                )
        return replace(node, time_sliced=tuple(sorted(gpus)), replicas=replicas)

    def mig(self, node: Node, d: Any, where: str) -> tuple[MigSlice, ...]:
        """``{gpu: [profile, ...]}``: GPU instance ids 1, 2, ... in the order listed."""
        if not isinstance(d, dict) or not d:
            raise self.fail(where, f"expected a mapping of GPU index to a list of MIG profiles, got {d!r}")
        by_gpu: dict[int, Any] = {}
        for key, profiles in d.items():
            if isinstance(key, bool) or not re.fullmatch(r"\d+", str(key)):
                raise self.fail(where, f"{key!r} is not a GPU index")
            if int(key) in by_gpu:
                raise self.fail(where, f"GPU {int(key)} is listed twice")
            by_gpu[int(key)] = profiles
        out: list[MigSlice] = []
        for gpu, profiles in sorted(by_gpu.items()):
            if not 0 <= gpu < node.gpus:
                raise self.fail(
                    where, f"GPU index {gpu} out of range (node {node.name} has {node.gpus} GPUs)"
                )
            if not isinstance(profiles, list) or not profiles:
                raise self.fail(
                    where, f"GPU {gpu}: expected a non-empty list of MIG profiles, got {profiles!r}"
                )
            used, total, mib = 0, 0, 0
            for k, profile in enumerate(profiles, start=1):
                m = re.fullmatch(r"(\d+)g\.(\d+)gb", str(profile))
                if not m:
                    raise self.fail(where, f"GPU {gpu}: {profile!r} is not a MIG profile like 3g.40gb")
                try:
                    share = slice_share(str(profile), node.model)
                except MigError as e:
                    raise self.fail(where, f"GPU {gpu}: {e}") from None
                used += int(m.group(1))
                total = round(int(m.group(1)) / share)  # the GPU's compute slices
                mib += int(m.group(2)) * 1024
                out.append(MigSlice(gpu, k, str(profile), share, int(m.group(2)) * 1024))
            if used > total:
                raise self.fail(
                    where,
                    f"GPU {gpu}: the slices {', '.join(map(str, profiles))} take {used} compute slices, "
                    f"the GPU ({node.model}) has {total}",
                )
            if mib > node.mem_mib:
                raise self.fail(
                    where,
                    f"GPU {gpu}: the slices need {mib} MiB of memory, the GPU has {node.mem_mib} MiB",
                )
        return tuple(out)

    def experiment(self, d: Any) -> Experiment:
        d = self.fields(d, f"experiment {d!r}", {"name", "namespace"})
        return Experiment(str(d["name"]), str(d["namespace"]))

    def window(self, d: dict, where: str, end_key: str) -> tuple[int, int]:
        """(start_s, end_s) from start_h plus end_h (pods) or minutes (incidents), inside the scenario."""
        s = self.offset(d["start_h"], 3600, where, "start_h")
        if end_key == "end_h":
            e = self.offset(d["end_h"], 3600, where, "end_h")
        else:
            e = s + self.offset(d["minutes"], 60, where, "minutes")
        if not 0 <= s < e <= self.hours * 3600:
            raise self.fail(
                where, f"window {s / 3600:g}h..{e / 3600:g}h is empty or outside 0..{self.hours}h"
            )
        return s, e

    def at(self, offset_s: int) -> datetime:
        return self.start + timedelta(seconds=offset_s)

    def pod(self, i: int, d: Any) -> Pod:
        where = f"pod {d.get('name') if isinstance(d, dict) else d!r}"
        d = self.fields(
            d, where, {"name", "experiment", "node", "gpus", "start_h", "end_h", "util"}, {"container"}
        )
        exp = self.known(self.experiments, d["experiment"], "experiment", where)
        node = self.known(self.nodes, d["node"], "node", where)
        gpus, slices = self.held(node, d["gpus"], where)
        u = self.fields(d["util"], f"{where}: util", {"base"}, {"amplitude", "period_h", "noise"})
        s, e = self.window(d, where, "end_h")
        return Pod(
            name=d["name"],
            experiment=exp.name,
            namespace=exp.namespace,
            node=node.name,
            gpus=gpus,
            start=self.at(s),
            end=self.at(e),
            start_s=s,
            end_s=e,
            util=UtilProfile(**{k: float(v) for k, v in u.items()}),
            container=d.get("container", "trainer"),
            slices=slices,
            index=i,
        )

    def held(self, node: Node, raw: Any, where: str) -> tuple[tuple[int, ...], tuple[tuple[int, int], ...]]:
        """A pod's ``gpus``: whole GPUs by index (0) and MIG slices as "GPU/GPU instance" ("0/1")."""
        if not isinstance(raw, list) or not raw:
            raise self.fail(
                where, f'gpus must be a non-empty list of GPU indexes or "gpu/instance" slices, got {raw!r}'
            )
        gpus: list[int] = []
        slices: list[tuple[int, int]] = []
        for item in raw:
            m = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", item) if isinstance(item, str) else None
            if m:
                g, gi = int(m.group(1)), int(m.group(2))
            elif isinstance(item, int) and not isinstance(item, bool):
                g, gi = item, None
            else:
                raise self.fail(
                    where, f'{item!r} is neither a GPU index nor a MIG slice "gpu/instance" like "0/1"'
                )
            if not 0 <= g < node.gpus:
                raise self.fail(where, f"GPU index {g} out of range (node {node.name} has {node.gpus} GPUs)")
            if gi is None:
                if node.is_mig(g):
                    ids = ", ".join(f'"{g}/{s.instance}"' for s in node.slices(g))
                    raise self.fail(
                        where, f"GPU {g} of {node.name} is in MIG mode: a pod holds one of its slices ({ids})"
                    )
                gpus.append(g)
            else:
                if not node.is_mig(g):
                    raise self.fail(where, f"GPU {g} of {node.name} is not in MIG mode: hold it whole ({g})")
                if gi not in {s.instance for s in node.slices(g)}:
                    known = ", ".join(str(s.instance) for s in node.slices(g))
                    raise self.fail(
                        where, f"GPU {g} of {node.name} has no MIG GPU instance {gi} (instances: {known})"
                    )
                slices.append((g, gi))
        if len(set(gpus)) != len(gpus) or len(set(slices)) != len(slices):
            raise self.fail(where, f"gpus must not name a GPU or slice twice, got {raw!r}")
        return tuple(gpus), tuple(slices)

    def check_identities(self, pods: tuple[Pod, ...]) -> None:
        """A (namespace, name) lives once at a time, with one experiment: a reused name comes back later."""
        seen: dict[tuple[str, str], list[Pod]] = {}
        for p in pods:
            for q in seen.setdefault((p.namespace, p.name), []):
                if p.start_s < q.end_s and q.start_s < p.end_s:
                    raise self.fail(
                        f"pod {p.name!r}",
                        f"defined twice in namespace {p.namespace} at the same time "
                        f"({_h(q.start_s)}..{_h(q.end_s)} and {_h(p.start_s)}..{_h(p.end_s)}): a reused "
                        "pod name must come back after the earlier pod is gone",
                    )
                if p.experiment != q.experiment:
                    raise self.fail(
                        f"pod {p.name!r}",
                        f"comes back in namespace {p.namespace} with experiment {p.experiment!r}, "
                        f"was {q.experiment!r}: a reused pod name keeps its labels",
                    )
            seen[(p.namespace, p.name)].append(p)

    def check_overlaps(self, pods: tuple[Pod, ...]) -> tuple[Pod, ...]:
        """No two pods hold a GPU or slice at the same step, except a time-sliced GPU's replicas: up to
        ``replicas`` pods, each given the lowest replica free when it starts (pods by start, then file
        order). Returns the pods with their ``vgpu``."""
        held: dict[tuple[str, int, int | None], list[Pod]] = {}
        units = lambda p: [(g, None) for g in p.gpus] + list(p.slices)  # noqa: E731
        vgpu: dict[int, list[tuple[int, int]]] = {p.index: [] for p in pods}
        replica_of: dict[tuple[int, int], int] = {}  # (pod index, gpu) -> replica
        for p in sorted(pods, key=lambda p: (p.start_s, p.index)):
            node = self.nodes[p.node]
            for g, gi in units(p):
                live = [q for q in held.setdefault((p.node, g, gi), []) if p.start_s < q.end_s]
                what = f"GPU {g}" if gi is None else f"GPU {g} MIG instance {gi}"
                if gi is None and node.is_time_sliced(g):
                    busy = {replica_of[(q.index, g)] for q in live}
                    if len(busy) >= node.replicas:
                        names = ", ".join(q.describe() for q in live)
                        raise self.fail(
                            f"pod {p.name!r}",
                            f"would be pod {len(busy) + 1} on {p.node} {what} at {_h(p.start_s)}, which is "
                            f"time-sliced into {node.replicas} replicas (held by {names})",
                        )
                    r = min(set(range(node.replicas)) - busy)
                    replica_of[(p.index, g)] = r
                    vgpu[p.index].append((g, r))
                elif live:
                    hint = "" if gi is not None else " (a GPU two pods share needs the node's time_sliced)"
                    raise self.fail(
                        f"pod {p.name!r}", f"overlaps pod {live[0].name!r} on {p.node} {what}{hint}"
                    )
                held[(p.node, g, gi)].append(p)
        return tuple(replace(p, vgpu=tuple(sorted(vgpu[p.index]))) for p in pods)

    def pod_ref(
        self, name: Any, namespace: str | None, where: str, window: tuple[int, int] | None = None
    ) -> Pod:
        """The one pod a YAML reference means: by name, then namespace, then the (start_s, end_s) window
        it must contain when the name was used more than once."""
        found = self.pods_by_name.get(name) if isinstance(name, str) else None
        if not found:
            raise self.fail(where, f"unknown pod {name!r} (known: {', '.join(self.pods_by_name)})")
        if namespace is not None:
            ours = [p for p in found if p.namespace == namespace]
            if not ours:
                elsewhere = ", ".join(sorted({p.namespace for p in found}))
                raise self.fail(where, f"no pod {name!r} in namespace {namespace} (only in {elsewhere})")
            found = ours
        if len(found) == 1:
            return found[0]
        if window is not None:
            s, e = window
            inside = [p for p in found if p.start_s <= s and e <= p.end_s]
            if len(inside) == 1:
                return inside[0]
        which = ", ".join(p.describe() for p in found)
        need = "a namespace and a time" if len({p.namespace for p in found}) > 1 else "a time"
        raise self.fail(
            where, f"pod {name!r} names {len(found)} pods ({which}): give {need} inside one of them"
        )

    def incident(self, i: int, d: Any) -> Incident:
        kind = d.get("kind") if isinstance(d, dict) else None
        where = f"incidents[{i}] ({kind})"
        if kind not in INCIDENT_KINDS:
            raise self.fail(where, f"kind must be one of {', '.join(INCIDENT_KINDS)}")
        if kind == "stall":
            d = self.fields(d, where, {"kind", "pod", "start_h", "minutes"}, {"namespace"})
            s, e = self.window(d, where, "minutes")
            pod = self.pod_ref(d["pod"], d.get("namespace"), where, (s, e))
            if pod.slices:
                raise self.fail(
                    where,
                    f"pod {pod.name!r} holds MIG slices ({', '.join(f'{g}/{i}' for g, i in pod.slices)}): "
                    "a stall needs a pod holding whole GPUs",
                )
            if pod.vgpu:
                raise self.fail(
                    where,
                    f"pod {pod.name!r} holds time-sliced GPU(s) ({', '.join(str(g) for g, _ in pod.vgpu)}) "
                    f"of {pod.node}: a stall needs a pod holding unshared GPUs",
                )
            if not pod.start_s <= s < e <= pod.end_s:
                raise self.fail(where, f"the stall must lie within pod {pod.name!r}'s lifetime")
            return Incident(
                kind, self.at(s), self.at(e), s, e, node=pod.node, pod=pod.name, pod_index=pod.index
            )
        if kind == "oom_loop":
            d = self.fields(d, where, {"kind", "pod", "start_h", "minutes", "count"}, {"namespace"})
            s, e = self.window(d, where, "minutes")
            pod = self.pod_ref(d["pod"], d.get("namespace"), where, (s, e))
            if not pod.start_s <= s < e <= pod.end_s:
                raise self.fail(where, f"the restarts must lie within pod {pod.name!r}'s lifetime")
            if int(d["count"]) < 1:
                raise self.fail(where, "count must be at least 1")
            return Incident(
                kind,
                self.at(s),
                self.at(e),
                s,
                e,
                node=pod.node,
                pod=pod.name,
                count=int(d["count"]),
                pod_index=pod.index,
            )
        if kind == "node_lost":
            d = self.fields(d, where, {"kind", "node", "start_h", "minutes"})
            node = self.known(self.nodes, d["node"], "node", where)
            s, e = self.window(d, where, "minutes")
            return Incident(kind, self.at(s), self.at(e), s, e, node=node.name)
        d = self.fields(d, where, {"kind", "node", "gpu", "start_h", "minutes", "count"})
        node = self.known(self.nodes, d["node"], "node", where)
        if not 0 <= int(d["gpu"]) < node.gpus:
            raise self.fail(
                where, f"GPU index {d['gpu']} out of range (node {node.name} has {node.gpus} GPUs)"
            )
        if node.is_mig(int(d["gpu"])):
            raise self.fail(
                where, f"GPU {d['gpu']} of {node.name} is in MIG mode: ECC incidents need a whole GPU"
            )
        if node.exporter != "gpu-operator":
            raise self.fail(
                where,
                f"{node.name}'s exporter ({node.exporter}) exports no ECC counters (its counters list "
                "leaves DCGM_FI_DEV_ECC_*_VOL_TOTAL out): ECC incidents need exporter: gpu-operator",
            )
        if int(d["count"]) < 1:
            raise self.fail(where, "count must be at least 1")
        s, e = self.window(d, where, "minutes")
        return Incident(
            kind, self.at(s), self.at(e), s, e, node=node.name, gpu=int(d["gpu"]), count=int(d["count"])
        )

    def check_outages(self, pods: tuple[Pod, ...], incidents: tuple[Incident, ...]) -> None:
        # A lost node runs no pods and no ECC burst: what happens there could never be observed, and the
        # truth would have to say what "held but unseen" means. Keeping outages empty keeps it exact.
        for lost in (i for i in incidents if i.kind == "node_lost"):
            for p in pods:
                if p.node == lost.node and p.start_s < lost.end_s and lost.start_s < p.end_s:
                    raise self.fail(f"pod {p.name!r}", f"runs on {lost.node} while that node is lost")
            for i in incidents:
                if (
                    i.kind.startswith("ecc")
                    and i.node == lost.node
                    and i.start_s < lost.end_s
                    and lost.start_s < i.end_s
                ):
                    raise self.fail(f"{i.kind} on {i.node}", "falls inside the node's outage")

    # ---- the optional ray: block (KubeRay clusters) ----

    def ray(self, raw: Any) -> tuple[RayCluster, ...]:
        if not isinstance(raw, list):
            raise self.fail("ray", "expected a list of Ray clusters")
        clusters = tuple(self.ray_cluster(i, d) for i, d in enumerate(raw))
        self.unique(clusters, "Ray cluster")
        taken: dict[int, str] = {}
        for c in clusters:
            for i in c.pods:
                if i in taken:
                    raise self.fail(
                        f"Ray cluster {c.name!r}", f"pod {self.pods[i].describe()} is also in {taken[i]!r}"
                    )
                taken[i] = c.name
        return clusters

    def ray_cluster(self, i: int, d: Any) -> RayCluster:
        where = f"ray[{i}]" + (f" ({d.get('name')!r})" if isinstance(d, dict) else "")
        d = self.fields(d, where, {"name", "head", "workers"}, {"incidents"})
        head = self.pod_ref(d["head"], None, where)
        if not isinstance(d["workers"], list) or not d["workers"]:
            raise self.fail(where, "workers must be a non-empty list of pod names")
        workers = tuple(self.pod_ref(w, head.namespace, where) for w in d["workers"])
        for p in (head, *workers):
            if p.experiment != head.experiment:
                raise self.fail(
                    where, f"pod {p.describe()} runs {p.experiment!r}, the head {head.experiment!r}"
                )
            if p.slices:
                raise self.fail(
                    where, f"pod {p.describe()} holds MIG slices: a Ray node here holds whole GPUs"
                )
        for w in workers:
            if not head.start_s <= w.start_s < w.end_s <= head.end_s:
                raise self.fail(where, f"worker {w.describe()} must live within the head's lifetime")
        if len({w.index for w in workers} | {head.index}) != len(workers) + 1:
            raise self.fail(where, "a pod is named twice")
        incidents = []
        for k, x in enumerate(d.get("incidents") or []):
            at = f"{where}: incidents[{k}]"
            x = self.fields(x, at, {"kind", "pod", "start_h", "minutes"})
            if x["kind"] not in RAY_INCIDENT_KINDS:
                raise self.fail(at, f"kind must be one of {', '.join(RAY_INCIDENT_KINDS)}")
            s, e = self.window(x, at, "minutes")
            pod = next((w for w in workers if w.name == x["pod"]), None)
            if pod is None:
                raise self.fail(at, f"{x['pod']!r} is none of the cluster's workers")
            if not pod.start_s <= s < e <= pod.end_s:
                raise self.fail(at, f"the outage must lie within worker {pod.describe()}'s lifetime")
            incidents.append(RayIncident(x["kind"], pod.index, s, e))
        return RayCluster(
            name=str(d["name"]),
            namespace=head.namespace,
            experiment=head.experiment,
            head=head.index,
            workers=tuple(w.index for w in workers),
            incidents=tuple(sorted(incidents, key=lambda x: x.start_s)),
        )

    # ---- the optional training: block (MLflow runs) ----

    def training(self, d: Any) -> Training:
        d = self.fields(d, "training", {"steps_per_hour", "runs"}, {"incidents"})
        sph = d["steps_per_hour"]
        if not isinstance(sph, int) or isinstance(sph, bool) or sph <= 0 or 3600 % sph:
            raise self.fail(
                "training.steps_per_hour", f"{sph!r} must be a positive whole number dividing 3600"
            )
        self.sph, self.log_step = sph, 3600 // sph
        if self.log_step % self.step:
            raise self.fail(
                "training.steps_per_hour",
                f"{sph} logs every {self.log_step} s, not a multiple of the {self.step} s scrape interval",
            )
        if not isinstance(d["runs"], list) or not d["runs"]:
            raise self.fail("training.runs", "expected a non-empty list of runs")
        runs = tuple(self.training_run(i, r) for i, r in enumerate(d["runs"]))
        self.unique(runs, "training run")
        self.runs = {r.name: r for r in runs}
        raw = d.get("incidents") or []
        if not isinstance(raw, list):
            raise self.fail("training.incidents", "expected a list")
        incidents = tuple(self.training_incident(i, x) for i, x in enumerate(raw))
        self.check_training(runs, incidents)
        return Training(steps_per_hour=sph, runs=runs, incidents=incidents)

    def log_offset(self, value: Any, where: str, what: str) -> int:
        s = self.offset(value, 3600, where, what)
        if s % self.log_step:
            raise self.fail(
                where,
                f"{what}={value} is not on the {self.log_step} s logging grid "
                f"(training.steps_per_hour: {self.sph})",
            )
        return s

    def pauses(self, pods: tuple[int, ...]) -> list[tuple[int, int]]:
        """GPU stall windows of a run's pods (indexes): the run logs nothing while a trainer hangs."""
        return sorted(
            (i.start_s, i.end_s) for i in self.gpu_incidents if i.kind == "stall" and i.pod_index in pods
        )

    def training_run(self, i: int, d: Any) -> TrainingRun:
        where = f"training.runs[{i}]" + (f" ({d.get('name')!r})" if isinstance(d, dict) else "")
        d = self.fields(
            d,
            where,
            {"name", "experiment", "algo", "fold", "status"},
            {"pod", "pods", "start_h", "end_h", "deleted"},
        )
        exp = self.known(self.experiments, d["experiment"], "experiment", where)
        if d["algo"] not in ALGOS:
            raise self.fail(where, f"algo must be one of {', '.join(ALGOS)}, got {d['algo']!r}")
        if d["status"] not in RUN_STATUSES:
            raise self.fail(where, f"status must be one of {', '.join(RUN_STATUSES)}, got {d['status']!r}")
        fold = d["fold"]
        if not isinstance(fold, int) or isinstance(fold, bool) or fold < 0:
            raise self.fail(where, f"fold must be a whole number >= 0, got {fold!r}")
        deleted = d.get("deleted", False)
        if not isinstance(deleted, bool):
            raise self.fail(where, f"deleted must be true or false, got {deleted!r}")
        if "pod" in d and "pods" in d:
            raise self.fail(where, "give pod (one) or pods (several), not both")
        names = d.get("pods") if "pods" in d else ([d["pod"]] if d.get("pod") is not None else [])
        if "pods" in d and (
            not isinstance(names, list) or not names or not all(isinstance(n, str) for n in names)
        ):
            raise self.fail(where, f"pods must be a non-empty list of pod names, got {names!r}")
        if len(set(names)) != len(names):
            raise self.fail(where, f"pods must not name a pod twice, got {names!r}")
        s = self.log_offset(d["start_h"], where, "start_h") if "start_h" in d else None
        e = self.log_offset(d["end_h"], where, "end_h") if "end_h" in d else None
        pods: list[Pod] = []
        for name in names:
            found = [p for p in self.pods_by_name.get(name, []) if p.experiment == exp.name]
            if not found and self.pods_by_name.get(name):
                others = ", ".join(sorted({p.experiment for p in self.pods_by_name[name]}))
                raise self.fail(where, f"pod {name!r} runs experiment {others!r}, not {exp.name!r}")
            window = None if s is None else (s, e if e is not None else s + self.log_step)
            pods.append(self.pod_ref(name, exp.namespace, where, window))

        def inherited(key: str, pod: Pod, offset_s: int) -> int:
            if offset_s % self.log_step:
                raise self.fail(
                    where,
                    f"{key} inherited from pod {pod.name!r} ({_h(offset_s)}) is not on the "
                    f"{self.log_step} s logging grid: give {key}",
                )
            return offset_s

        if s is None:
            if not pods:
                raise self.fail(where, "a run without a pod needs start_h")
            latest = max(pods, key=lambda p: p.start_s)
            s = inherited("start_h", latest, latest.start_s)
        if e is None:
            if pods:
                earliest = min(pods, key=lambda p: p.end_s)
                e = inherited("end_h", earliest, earliest.end_s)
            elif d["status"] == "RUNNING":
                e = self.hours * 3600
            else:
                raise self.fail(
                    where, "a run without a pod needs end_h (only a RUNNING one may leave it out)"
                )
        if not 0 <= s < e <= self.hours * 3600:
            raise self.fail(where, f"window {_h(s)}..{_h(e)} is empty or outside 0..{self.hours}h")
        for pod in pods:
            if not pod.start_s <= s < e <= pod.end_s:
                raise self.fail(
                    where,
                    f"window {_h(s)}..{_h(e)} must lie within the lifetime of pod {pod.name!r} "
                    f"({_h(pod.start_s)}..{_h(pod.end_s)})",
                )
        return TrainingRun(
            name=str(d["name"]),
            index=i,
            experiment=exp.name,
            namespace=exp.namespace,
            algo=d["algo"],
            fold=fold,
            pod=",".join(p.name for p in pods) if pods else None,
            status=d["status"],
            deleted=deleted,
            start=self.at(s),
            end=self.at(e),
            start_s=s,
            end_s=e,
            pods=tuple(p.index for p in pods),
        )

    def training_incident(self, i: int, d: Any) -> TrainingIncident:
        kind = d.get("kind") if isinstance(d, dict) else None
        where = f"training.incidents[{i}] ({kind})"
        if kind not in TRAINING_INCIDENT_KINDS:
            raise self.fail(where, f"kind must be one of {', '.join(TRAINING_INCIDENT_KINDS)}")
        d = self.fields(d, where, {"kind", "run", "at_h"} | ({"steps"} if kind == "nan_loss" else set()))
        run = self.known(self.runs, d["run"], "run", where)
        at = self.log_offset(d["at_h"], where, "at_h")
        span = f"{_h(run.start_s)}..{_h(run.end_s)}"
        steps = 0
        if kind == "stall":
            if run.status != "RUNNING":
                raise self.fail(where, f"a stall needs a RUNNING run; {run.name!r} is {run.status}")
            if not run.start_s < at <= run.end_s:
                raise self.fail(
                    where, f"at_h={d['at_h']} must be after the run's start and by its end ({span})"
                )
        elif not run.start_s < at < run.end_s:
            raise self.fail(where, f"at_h={d['at_h']} must fall strictly inside run {run.name!r} ({span})")
        last = at  # the incident's last affected log time (inclusive)
        if kind == "nan_loss":
            steps = d["steps"]
            if not isinstance(steps, int) or isinstance(steps, bool) or steps < 2:
                raise self.fail(
                    where, f"steps must be a whole number >= 2 (NaN first, +Inf last), got {steps!r}"
                )
            last = at + (steps - 1) * self.log_step
            if last >= run.end_s:
                raise self.fail(
                    where, f"{steps} bad steps from at_h={d['at_h']} run past the run's end ({span})"
                )
        for ps, pe in self.pauses(run.pods):
            if at < pe and ps <= last:
                raise self.fail(
                    where,
                    f"falls into the GPU stall of pod {run.pod!r} ({_h(ps)}..{_h(pe)}), when the run logs nothing",
                )
        return TrainingIncident(kind=kind, run=run.name, at=self.at(at), at_s=at, steps=steps)

    def check_training(self, runs: tuple[TrainingRun, ...], incidents: tuple[TrainingIncident, ...]) -> None:
        seen = set()
        for inc in incidents:
            if (inc.kind, inc.run) in seen:
                raise self.fail(f"training run {inc.run!r}", f"has two {inc.kind} incidents")
            seen.add((inc.kind, inc.run))
        stall = {i.run: i.at_s for i in incidents if i.kind == "stall"}
        for inc in incidents:
            last = inc.at_s + max(inc.steps - 1, 0) * self.log_step
            if inc.kind != "stall" and inc.run in stall and last >= stall[inc.run]:
                raise self.fail(
                    f"training run {inc.run!r}",
                    f"its {inc.kind} at {_h(inc.at_s)} falls after its stall at "
                    f"{_h(stall[inc.run])}, when it logs nothing",
                )
        for r in runs:
            if (
                r.status == "RUNNING"
                and r.end_s < self.hours * 3600
                and stall.get(r.name, r.end_s + 1) > r.end_s
            ):
                raise self.fail(
                    f"training run {r.name!r}",
                    f"a RUNNING run logs until the scenario ends ({self.hours}h) but this one's window ends at "
                    f"{_h(r.end_s)}: give it a stall at or before then, or another status",
                )
            stop = stall.get(r.name, r.end_s)
            logged = sum(
                1
                for t in range(r.start_s, stop, self.log_step)
                if not any(ps <= t < pe for ps, pe in self.pauses(r.pods))
            )
            if not logged:
                raise self.fail(f"training run {r.name!r}", "logs no step at all")
