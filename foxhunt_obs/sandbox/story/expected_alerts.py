"""Which alert each injected incident of a scenario must raise, and a check of a replay against that
(the pipeline must find every injected incident: docs/design.md#the-sandbox). Used by the end-to-end replay test and by
``make demo``, which fails when an incident goes unnoticed.

An incident is found when its rule fired for it exactly once, no earlier than the incident began and no
later than ``LATE`` after it ended, then resolved exactly once, no earlier than it ended; an incident
that lasts to the end of the replay (a RUNNING run still silent) must still be firing there. Other
alerts (a pod that barely uses its GPUs, a budget past its limit) are no incident: they are listed, and
the test that knows the scenario asserts them.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

import yaml

from foxhunt_obs.sandbox.story import truth
from foxhunt_obs.sandbox.story.scenario import Scenario
from foxhunt_obs.sandbox.writers import bills, training

LATE = timedelta(minutes=30)  # the longest `for` / look-back between an incident's end and its alert
DAY = timedelta(days=1)


@dataclass(frozen=True)
class Expected:
    rule: str
    ident: str  # who it is about: ident(notification) must equal it
    start: datetime
    end: datetime | None  # None: lasts beyond the replay (must still fire at its end)
    what: str  # the incident in words


def rule_overrides(scenario: Scenario) -> dict:
    """The alert rules' settings the sandbox cluster itself decides, as a FOXHUNT_ALERT_RULES file holds
    them: gpu_node_missing expects as many GPU nodes as the scenario has (the catalog's default is 2
    nodes; with more nodes one lost node would leave enough reporting to say nothing)."""
    return {"rules": {"gpu_node_missing": {"thresholds": {"expected_nodes": len(scenario.nodes)}}}}


def write_rule_overrides(scenario: Scenario, path: Path) -> Path:
    """rule_overrides as a YAML file at ``path``, for FOXHUNT_ALERT_RULES or load_rules(overrides=...)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(rule_overrides(scenario), sort_keys=False))
    return path


def ident(rule: str, labels: dict[str, str]) -> str:
    """The label that says whom an alert is about: node/gpu for ECC and XID errors, else the run, the
    pod, the Ray cluster, the file system, the project or the budget; '' for cluster-wide alerts
    (gpu_node_missing)."""
    if rule in ("ecc_errors", "xid_errors"):
        return f"{labels.get('node', '')}/{labels.get('gpu', '')}"
    if rule == "untracked_spend":
        return labels.get("name") or labels.get("instance_id", "")
    for key in ("run_name", "pod", "ray_io_cluster", "file_system_name", "project", "budget_name"):
        if labels.get(key):
            return labels[key]
    return ""


def expected(scenario: Scenario, silent_minutes: float = 30) -> list[Expected]:
    """Every alert the scenario's incidents must raise, by start. ``silent_minutes``: the
    training_run_silent threshold (a logging pause shorter than that raises nothing)."""
    out: list[Expected] = []
    for i in scenario.incidents:
        where = f"{i.kind} {i.pod or i.node} {i.start:%Y-%m-%d %H:%M}-{i.end:%H:%M}"
        if i.kind == "stall":
            out.append(Expected("gpu_training_stall", i.pod, i.start, i.end, where))
        elif i.kind in ("ecc_sbe", "ecc_dbe"):
            out.append(Expected("ecc_errors", f"{i.node}/{i.gpu}", i.start, i.end, where))
        elif i.kind == "node_lost":
            out.append(Expected("gpu_node_missing", "", i.start, i.end, where))
        elif i.kind == "oom_loop":
            out.append(Expected("gpu_oom_restarts", i.pod, i.start, i.end, where))
    for o in truth.ray_outages(scenario):
        what = f"worker_lost {o.pod} ({o.cluster}) {o.start:%Y-%m-%d %H:%M}-{o.end:%H:%M}"
        out.append(Expected("ray_worker_lost", o.cluster, o.start, o.end, what))
    if scenario.training is not None:
        runs = {r.name: r for r in scenario.training.runs}
        rule_of = {
            "stall": "training_run_silent",
            "nan_loss": "nan_loss",
            "entropy_collapse": "entropy_collapse",
            "success_drop": "success_rate_drop",
        }
        for w in training.incidents(scenario):
            run = runs[w.run_name]
            # until the bad values stop, else until the run ends; a RUNNING run keeps it to the end
            end = w.end or (run.end if run.status != "RUNNING" else None)
            out.append(Expected(rule_of[w.kind], w.run_name, w.start, end, f"{w.kind} in {w.run_name}"))
        for w in training.pauses(scenario):
            if w.end - w.start > timedelta(minutes=silent_minutes):
                what = f"{w.run_name} logs nothing while {w.pod}'s GPUs stall"
                out.append(Expected("training_run_silent", w.run_name, w.start, w.end, what))
    if scenario.aws is not None:
        for fill in scenario.aws.fills:
            for start, end in bills.fsx_low_windows(scenario, fill.fsx):
                out.append(Expected("fsx_low_space", fill.fsx, start, end, f"fsx_fill on {fill.fsx}"))
        project = scenario.aws.default_tags.get("Project", "")
        for stray in scenario.aws.strays:
            what = f"stray {stray.instance_type} {stray.name} running {stray.start:%Y-%m-%d %H:%M}-{stray.end:%H:%M}"
            # seen running by the first tick of its hours (EC2 describe_instances), until it stops
            out.append(Expected("untracked_spend", stray.name, stray.start, stray.end, what))
            # cost_spike reads complete days: the morning after the expensive day, for one day
            last_day = (stray.end - timedelta(microseconds=1)).date()
            morning = datetime.combine(last_day, datetime.min.time(), stray.end.tzinfo) + DAY
            what = f"stray {stray.instance_type} {stray.name} billed {stray.start:%Y-%m-%d %H:%M}-{stray.end:%H:%M}"
            out.append(Expected("cost_spike", project, morning, morning + DAY, what))
    return sorted(out, key=lambda e: (e.start, e.rule, e.ident))


@dataclass
class Verdict:
    found: list[Expected]
    missed: list[tuple[Expected, str]]  # and why
    other: list[tuple[datetime, object]]  # notifications no incident explains

    @property
    def ok(self) -> bool:
        return not self.missed


def check(
    want: list[Expected], sent: list[tuple[datetime, object]], start: datetime, end: datetime
) -> Verdict:
    """``sent``: (tick, Notification) in tick order from a replay whose ticks ran from ``start`` to
    ``end`` (its last tick). Incidents whose alert window does not start inside it are not judged."""
    judged = [e for e in want if start <= e.start <= end]
    episodes: dict[tuple[str, str], list[tuple[datetime, str]]] = {}
    for tick, n in sent:
        episodes.setdefault((n.rule, ident(n.rule, n.labels)), []).append((tick, n.status))
    found, missed, explained = [], [], set()
    for key in sorted({(e.rule, e.ident) for e in judged}):
        mine = [e for e in judged if (e.rule, e.ident) == key]
        seen = episodes.get(key, [])
        explained.add(key)
        k = 0
        for j, e in enumerate(mine):
            why = None
            if k >= len(seen) or seen[k][1] != "firing":
                why = "never fired"
            elif not e.start <= seen[k][0] <= (e.end or end) + LATE:
                why = f"fired at {seen[k][0]:%Y-%m-%d %H:%M}, outside its window"
            elif e.end is not None and e.end <= end:
                if k + 1 >= len(seen) or seen[k + 1][1] != "resolved":
                    why = "never resolved"
                elif seen[k + 1][0] < e.end:
                    why = f"resolved at {seen[k + 1][0]:%Y-%m-%d %H:%M}, before it ended"
                k += 2
            else:
                k += 1
            if why:  # the rest of this rule's notifications for it cannot be matched reliably
                missed += [(e, why)] + [(x, "not judged after an earlier miss") for x in mine[j + 1 :]]
                break
            found.append(e)
        else:
            if k < len(seen):
                missed.append((mine[-1], f"{len(seen) - k} notification(s) more than its incidents explain"))
    other = [(t, n) for t, n in sent if (n.rule, ident(n.rule, n.labels)) not in explained]
    return Verdict(found, missed, other)
