"""MLflow training runs of a scenario (its ``training:`` block): exact ground truth, and logging it into a
real MLflow tracking server (docs/design.md#the-sandbox).

Every run logs the eight keys of ``KEYS`` at every logged step: one step every
``3600 / steps_per_hour`` seconds from its start, before its end (exclusive), on the scenario's scrape
grid. Steps are numbered 0, 1, 2, ... in the order they are logged. Healthy shapes (x = hours of training
progress = step × interval, tau = a quarter of the run's window, clipped to 0.25..12 h):

* ``success_rate``    s0 + (s∞ - s0)(1 - e^(-x/tau)) + N(0, 0.015); s0 ~ 0.05-0.2, s∞ ~ 0.78-0.86; 0..1
* ``train/rewards``   rises the same way from ~0.1-0.25 towards ~0.95-0.99 (mean binary reward); 0..1
* ``actor/loss``      falls from l0 to l∞ (PPO 0.3-0.5 → 0.02-0.05, DQN 0.6-1.0 → 0.05-0.1), × e^N(0, 0.05)
* ``actor/entropy``   falls slowly: e0 × (1 - 0.4 (1 - e^(-x/3tau))) + N(0, 0.01); never below ~0.4
* ``timing/generate`` rollout seconds, stable: PPO 30-40 s, DQN 6-9 s (± 0.4 s)
* ``timing/update``   update seconds, stable: PPO 10-14 s, DQN 20-26 s (± 0.3 s). So every PPO run
                      (the ppo-* experiments) is rollout-bound and every DQN run (dqn-atari) update-bound:
                      ``BOTTLENECK`` and ``training_health()["bottleneck"]``.
* ``timing/total``    generate + update + 0.3-0.8 s overhead (rounded to the ms)
* ``accuracy``        fraction of mixed-outcome groups: 0.35 + 0.3 × 4p(1 - p) + N(0, 0.03) with p the
                      mean success rate, clipped to 0.12..0.88, so inside the healthy 0.1-0.9 band ...
                      except after an entropy collapse: a near-deterministic policy answers every sample
                      of a group alike, so accuracy falls to ~0.04 (0.005..0.08) from the collapse on.
                      That is the only place it leaves the band: ``accuracy_excursions()``.

Injected incidents (``incidents()`` lists them as windows, with details):

* ``nan_loss``          ``steps`` consecutive logged steps of ``actor/loss`` are bad: NaN, ..., NaN, +Inf
                        (the last one +Inf). The only non-finite values anywhere in the truth.
* ``entropy_collapse``  ``actor/entropy`` = 0.01 + |N(0, 0.002)| from at_h to the run's last step.
* ``success_drop``      ``success_rate`` falls to 40 % of its level at at_h (~0.75 → ~0.3) and stays.
* ``stall``             a RUNNING run logs nothing from at_h on (and keeps status RUNNING, no end time).

A GPU ``stall`` on a run's pod (a hung trainer) pauses the run's logging for that window: no step is
logged, numbering continues after it (``pauses()``).

Every value is rounded (4 decimals for ratios and entropy, 6 for the loss, 3 for seconds), so what MLflow
returns equals the truth exactly, float for float, with one exception: MLflow's SQL store cannot hold
infinities and keeps ±Inf as ±1.7976931348623157e308 (``INF_STORED``, ``sys.float_info.max``), which is
what ``get_metric_history`` then returns. NaN round-trips as NaN (the store keeps an is_nan flag). The truth
keeps the +Inf; ``as_stored()`` maps it the way MLflow does.

Each (run, key) draws from its own ``np.random.default_rng((seed, 2_000_000, run index, key index))``, so
changing one run, or where a run stops, does not change another number.
"""

from __future__ import annotations

import contextlib
import io
from dataclasses import dataclass, field
from datetime import datetime, timedelta

import numpy as np
import pandas as pd

from foxhunt_obs.sandbox.story.scenario import Scenario, ScenarioError, TrainingRun

KEYS = (
    "success_rate",
    "train/rewards",
    "actor/loss",
    "actor/entropy",
    "timing/generate",
    "timing/update",
    "timing/total",
    "accuracy",
)
INF_STORED = 1.7976931348623157e308  # what MLflow's SQL store keeps for +Inf (and its negative for -Inf)
ACCURACY_BAND = (0.1, 0.9)
ENTROPY_COLLAPSED = 0.01
SUCCESS_DROP_FACTOR = 0.4
BOTTLENECK = {"PPO": "rollout", "DQN": "update"}  # which of timing/generate, timing/update dominates
MAX_METRICS_PER_BATCH = 1000  # MLflow's log_batch limit


@dataclass(frozen=True)
class _Profile:
    loss0: tuple[float, float]
    loss_inf: tuple[float, float]
    entropy0: tuple[float, float]
    generate_s: tuple[float, float]
    update_s: tuple[float, float]
    params: dict[str, tuple[str, ...]]


PROFILES = {
    "PPO": _Profile(
        loss0=(0.3, 0.5),
        loss_inf=(0.02, 0.05),
        entropy0=(1.2, 1.5),
        generate_s=(30.0, 40.0),  # rollout-bound: environment stepping dominates
        update_s=(10.0, 14.0),
        params={
            "lr": ("1e-4", "3e-4", "5e-4"),
            "batch_size": ("2048", "4096", "8192"),
            "gamma": ("0.99", "0.995"),
            "gae_lambda": ("0.95",),
            "clip_range": ("0.1", "0.2", "0.3"),
            "n_epochs": ("4", "10"),
            "ent_coef": ("0.0", "0.01"),
        },
    ),
    "DQN": _Profile(
        loss0=(0.6, 1.0),
        loss_inf=(0.05, 0.1),
        entropy0=(0.8, 1.0),
        generate_s=(6.0, 9.0),
        update_s=(20.0, 26.0),  # update-bound: replay sampling and gradient steps dominate
        params={
            "lr": ("6.25e-5", "1e-4", "2.5e-4"),
            "batch_size": ("32", "64", "256"),
            "gamma": ("0.99",),
            "eps_start": ("1.0",),
            "eps_end": ("0.01", "0.05"),
            "eps_decay_steps": ("250000", "1000000"),
            "target_update_interval": ("8000", "10000"),
            "buffer_size": ("1000000",),
        },
    ),
}


def _training(scenario: Scenario):
    if scenario.training is None:
        raise ScenarioError(f"scenario {scenario.name}: no training: block")
    return scenario.training


def _incident(scenario: Scenario, run: TrainingRun, kind: str):
    return next((i for i in _training(scenario).incidents if i.run == run.name and i.kind == kind), None)


def pause_windows(scenario: Scenario, run: TrainingRun) -> list[tuple[int, int]]:
    """(start_s, end_s) of the GPU stalls on the run's pods: the run logs nothing then."""
    return sorted(
        (i.start_s, i.end_s) for i in scenario.incidents if i.kind == "stall" and i.pod_index in run.pods
    )


def log_offsets(scenario: Scenario, run: TrainingRun) -> np.ndarray:
    """Offsets (s from the scenario start) of every logged step of the run, in step order."""
    stall = _incident(scenario, run, "stall")
    stop = stall.at_s if stall else run.end_s
    t = np.arange(run.start_s, stop, _training(scenario).interval_s, dtype=np.int64)
    for ps, pe in pause_windows(scenario, run):
        t = t[(t < ps) | (t >= pe)]
    return t


def _tau_h(run: TrainingRun) -> float:
    return float(np.clip((run.end_s - run.start_s) / 3600 / 4, 0.25, 12.0))


def run_track(scenario: Scenario, run: TrainingRun) -> dict[str, np.ndarray]:
    """``offset_s`` and ``step`` of every logged step and each key's values, incidents injected."""
    tr = _training(scenario)
    t = log_offsets(scenario, run)
    n = len(t)
    x = np.arange(n) * tr.interval_s / 3600  # hours of training progress (pauses do not count)
    tau = _tau_h(run)
    prof = PROFILES[run.algo]

    def rng(k: int) -> np.random.Generator:
        return np.random.default_rng((scenario.seed, 2_000_000, run.index, k))

    lv = rng(100)  # the run's levels, always drawn in this order
    s0, s_inf = lv.uniform(0.05, 0.2), lv.uniform(0.78, 0.86)
    r0, r_inf = lv.uniform(0.1, 0.25), lv.uniform(0.95, 0.99)
    l0, l_inf = lv.uniform(*prof.loss0), lv.uniform(*prof.loss_inf)
    e0 = lv.uniform(*prof.entropy0)
    g_base, u_base = lv.uniform(*prof.generate_s), lv.uniform(*prof.update_s)

    z = {k: rng(k).standard_normal(n) for k in range(len(KEYS))}
    rise = 1 - np.exp(-x / tau)
    success_mean = s0 + (s_inf - s0) * rise
    success = success_mean + 0.015 * z[0]
    rewards = r_inf - (r_inf - r0) * np.exp(-x / tau) + 0.01 * z[1]
    loss = (l_inf + (l0 - l_inf) * np.exp(-2 * x / tau)) * np.exp(0.05 * z[2])
    entropy = e0 * (1 - 0.4 * (1 - np.exp(-x / (3 * tau)))) + 0.01 * z[3]
    generate = np.round(np.maximum(g_base + 0.4 * z[4], 0.5), 3)
    update = np.round(np.maximum(u_base + 0.3 * z[5], 0.5), 3)
    overhead = 0.3 + 0.5 * rng(6).uniform(0, 1, n)
    mixed = 4 * success_mean * (1 - success_mean)
    accuracy = np.clip(0.35 + 0.3 * mixed + 0.03 * z[7], 0.12, 0.88)

    if inc := _incident(scenario, run, "success_drop"):
        after = t >= inc.at_s
        level = SUCCESS_DROP_FACTOR * success_mean[np.argmax(after)]
        success[after] = level + 0.015 * z[0][after]
    if inc := _incident(scenario, run, "entropy_collapse"):
        after = t >= inc.at_s
        entropy[after] = ENTROPY_COLLAPSED + 0.002 * np.abs(z[3][after])
        accuracy[after] = np.clip(0.04 + 0.01 * z[7][after], 0.005, 0.08)
    loss = np.round(loss, 6)
    if inc := _incident(scenario, run, "nan_loss"):
        i = int(np.searchsorted(t, inc.at_s))
        loss[i : i + inc.steps - 1] = np.nan
        loss[i + inc.steps - 1] = np.inf
    return {
        "offset_s": t,
        "step": np.arange(n, dtype=np.int64),
        "success_rate": np.round(np.clip(success, 0, 1), 4),
        "train/rewards": np.round(np.clip(rewards, 0, 1), 4),
        "actor/loss": loss,
        "actor/entropy": np.round(entropy, 4),
        "timing/generate": generate,
        "timing/update": update,
        "timing/total": np.round(generate + update + overhead, 3),
        "accuracy": np.round(accuracy, 4),
    }


def _params(scenario: Scenario, run: TrainingRun) -> dict[str, str]:
    rng = np.random.default_rng((scenario.seed, 2_000_000, run.index, 101))
    out = {k: str(rng.choice(list(v))) for k, v in PROFILES[run.algo].params.items()}
    out["seed"] = str(1000 + run.fold)
    out["fold"] = str(run.fold)
    return out


def run_tags(run: TrainingRun) -> dict[str, str]:
    """Tags of the run: ``namespace`` (its experiment's), ``pod`` its pods' names comma-separated (a Ray
    job's "<run>-head,<run>-worker-0,<run>-worker-1"). A run without a pod (logged from outside the
    cluster) has no ``pod`` tag."""
    tags = {
        "namespace": run.namespace,
        "experiment": run.experiment,
        "algo": run.algo,
        "fold": str(run.fold),
        "mlflow.runName": run.name,
    }
    if run.pod is not None:
        tags["pod"] = run.pod
    return dict(sorted(tags.items()))


def _ts(scenario: Scenario, offsets) -> pd.Series:
    sec = int(scenario.start.timestamp()) + np.asarray(offsets, dtype=np.int64)
    return pd.Series(pd.to_datetime(sec, unit="s", utc=True)).astype("datetime64[ms, UTC]")


def training_runs(scenario: Scenario) -> pd.DataFrame:
    """One row per run, in file order: run_name, experiment, algo, fold, pod (None without one),
    namespace, status, deleted, start, end (datetime64[ms, UTC]; NaT for RUNNING: MLflow has no end time),
    params (dict str -> str), tags (dict str -> str)."""
    runs = _training(scenario).runs
    df = pd.DataFrame(
        {
            "run_name": [r.name for r in runs],
            "experiment": [r.experiment for r in runs],
            "algo": [r.algo for r in runs],
            "fold": np.array([r.fold for r in runs], dtype=np.int64),
            "pod": pd.Series([r.pod for r in runs], dtype=object),
            "namespace": [r.namespace for r in runs],
            "status": [r.status for r in runs],
            "deleted": np.array([r.deleted for r in runs], dtype=bool),
            "start": _ts(scenario, [r.start_s for r in runs]),
            "end": _ts(scenario, [r.end_s for r in runs]),
            "params": [_params(scenario, r) for r in runs],
            "tags": [run_tags(r) for r in runs],
        }
    )
    df.loc[df["status"] == "RUNNING", "end"] = pd.NaT
    return df


def training_metrics(scenario: Scenario) -> pd.DataFrame:
    """One row per run, key and logged step, sorted by run_name, key, step: run_name, key, step (int64,
    from 0), ts (datetime64[ms, UTC]), value (float64; NaN and +Inf where nan_loss injects them)."""
    parts = []
    for run in _training(scenario).runs:
        track = run_track(scenario, run)
        ts = _ts(scenario, track["offset_s"])
        for key in KEYS:
            parts.append(
                pd.DataFrame(
                    {"run_name": run.name, "key": key, "step": track["step"], "ts": ts, "value": track[key]}
                )
            )
    df = pd.concat(parts, ignore_index=True)
    return df.sort_values(["run_name", "key", "step"], ignore_index=True)


def as_stored(values):
    """Values as MLflow's SQL store returns them: ±Inf → ±1.7976931348623157e308, NaN stays NaN."""
    v = np.asarray(values, dtype=np.float64)
    return np.where(np.isinf(v), np.sign(v) * INF_STORED, v)


@dataclass(frozen=True)
class RunIncident:
    """What the pipeline should flag on a run. ``end`` is exclusive; None when it lasts to the run's
    last logged step (or, for a stall, for ever)."""

    kind: str
    run_name: str
    start: datetime
    end: datetime | None
    experiment: str
    pod: str | None
    details: dict = field(default_factory=dict, compare=False)


def incidents(scenario: Scenario) -> list[RunIncident]:
    """The declared training incidents, sorted by start. details:

    * nan_loss: key, steps (the bad step numbers), nan, inf (counts), first_ts, last_ts (bad log times)
    * entropy_collapse: key, step (first collapsed), before (mean of the 6 steps before), level (~0.01)
    * success_drop: key, step, before (the healthy mean level at the drop), after (mean after it)
    * stall: last_step, last_logged (the last metric's time), silent_at_end (timedelta to scenario end)
    """
    tr = _training(scenario)
    out = []
    for inc in tr.incidents:
        run = tr.run(inc.run)
        track = run_track(scenario, run)
        t = track["offset_s"]
        i = int(np.searchsorted(t, inc.at_s))
        end = None
        if inc.kind == "nan_loss":
            bad = slice(i, i + inc.steps)
            details = {
                "key": "actor/loss",
                "steps": track["step"][bad].tolist(),
                "nan": inc.steps - 1,
                "inf": 1,
                "first_ts": scenario.start + timedelta(seconds=int(t[bad][0])),
                "last_ts": scenario.start + timedelta(seconds=int(t[bad][-1])),
            }
            end = scenario.start + timedelta(seconds=int(t[bad][-1]) + tr.interval_s)
        elif inc.kind == "entropy_collapse":
            e = track["actor/entropy"]
            details = {
                "key": "actor/entropy",
                "step": i,
                "before": float(e[max(i - 6, 0) : i].mean()),
                "level": float(e[i:].mean()),
            }
        elif inc.kind == "success_drop":
            s = track["success_rate"]
            details = {
                "key": "success_rate",
                "step": i,
                "before": float(s[max(i - 6, 0) : i].mean()),
                "after": float(s[i:].mean()),
            }
        else:  # stall
            last = scenario.start + timedelta(seconds=int(t[-1]))
            details = {
                "last_step": int(track["step"][-1]),
                "last_logged": last,
                "silent_at_end": scenario.end - last,
            }
        out.append(RunIncident(inc.kind, run.name, inc.at, end, run.experiment, run.pod, details))
    return sorted(out, key=lambda w: (w.start, w.run_name))


def pauses(scenario: Scenario) -> list[RunIncident]:
    """Derived, not declared: kind "pause", a run's logging gap during a GPU stall on its pod.
    details: gpu_stall_pod, missed (log times skipped), step (the first step after the gap)."""
    tr = _training(scenario)
    out = []
    for run in tr.runs:
        t = log_offsets(scenario, run)
        for ps, pe in pause_windows(scenario, run):
            first = -(-max(ps - run.start_s, 0) // tr.interval_s) * tr.interval_s + run.start_s
            missed = len(range(first, min(pe, run.end_s), tr.interval_s))
            if not missed:
                continue
            details = {"gpu_stall_pod": run.pod, "missed": missed, "step": int(np.searchsorted(t, pe))}
            out.append(
                RunIncident(
                    "pause",
                    run.name,
                    scenario.start + timedelta(seconds=ps),
                    scenario.start + timedelta(seconds=pe),
                    run.experiment,
                    run.pod,
                    details,
                )
            )
    return sorted(out, key=lambda w: (w.start, w.run_name))


def accuracy_excursions(scenario: Scenario) -> list[RunIncident]:
    """Derived: kind "accuracy_out_of_band", where ``accuracy`` leaves 0.1-0.9: from each entropy
    collapse to the run's last step (end None). Nowhere else."""
    out = []
    for w in incidents(scenario):
        if w.kind == "entropy_collapse":
            details = {"key": "accuracy", "band": ACCURACY_BAND, "step": w.details["step"]}
            out.append(
                RunIncident("accuracy_out_of_band", w.run_name, w.start, None, w.experiment, w.pod, details)
            )
    return out


def training_health(scenario: Scenario) -> pd.DataFrame:
    """Per run, what a health check should conclude: run_name, status, deleted, bottleneck (rollout |
    update), nan_count, inf_count (actor/loss), entropy_collapse_at, success_drop_at, stalled_at,
    accuracy_out_of_band_from (NaT when none), last_logged, logged_steps, paused_steps."""
    tr = _training(scenario)
    metrics = training_metrics(scenario)
    loss = metrics[metrics["key"] == "actor/loss"]
    rows = []
    for run in tr.runs:
        v = loss.loc[loss["run_name"] == run.name, "value"].to_numpy()
        t = log_offsets(scenario, run)

        def at(kind: str, run: TrainingRun = run):
            inc = _incident(scenario, run, kind)
            return pd.Timestamp(inc.at) if inc else pd.NaT

        rows.append(
            {
                "run_name": run.name,
                "status": run.status,
                "deleted": run.deleted,
                "bottleneck": BOTTLENECK[run.algo],
                "nan_count": int(np.isnan(v).sum()),
                "inf_count": int(np.isinf(v).sum()),
                "entropy_collapse_at": at("entropy_collapse"),
                "success_drop_at": at("success_drop"),
                "stalled_at": at("stall"),
                "accuracy_out_of_band_from": at("entropy_collapse"),
                "last_logged": pd.Timestamp(scenario.start + timedelta(seconds=int(t[-1]))),
                "logged_steps": len(t),
                "paused_steps": sum(w.details["missed"] for w in pauses(scenario) if w.run_name == run.name),
            }
        )
    df = pd.DataFrame(rows)
    for c in (
        "entropy_collapse_at",
        "success_drop_at",
        "stalled_at",
        "accuracy_out_of_band_from",
        "last_logged",
    ):
        df[c] = pd.to_datetime(df[c], utc=True).astype("datetime64[ms, UTC]")
    return df


def _ms(ts) -> int:
    return int(pd.Timestamp(ts).timestamp() * 1000)


def log_scenario(scenario: Scenario, tracking_uri: str) -> dict[str, str]:
    """Log every run of the scenario into the MLflow tracking server at ``tracking_uri``; run_name → run_id.

    Experiments are found by name or created (tag ``namespace``). Every call creates new runs: log into a
    fresh store (``mlflow_server.build_store`` does). Non-RUNNING runs are terminated with their status and
    end time, deleted runs then deleted (lifecycle_stage "deleted", still found with ViewType.ALL).
    """
    from mlflow import MlflowClient
    from mlflow.entities import Metric, Param

    client = MlflowClient(tracking_uri)
    exp_ids = {}
    for e in scenario.experiments:
        found = client.get_experiment_by_name(e.name)
        exp_ids[e.name] = (
            found.experiment_id
            if found
            else client.create_experiment(e.name, tags={"namespace": e.namespace})
        )
    runs = training_runs(scenario)
    metrics = training_metrics(scenario)
    metrics["ts_ms"] = metrics["ts"].astype("int64")  # datetime64[ms]: epoch milliseconds
    by_run = dict(tuple(metrics.groupby("run_name", sort=False)))
    ids = {}
    for r in runs.itertuples(index=False):
        run = client.create_run(
            exp_ids[r.experiment], start_time=_ms(r.start), tags=r.tags, run_name=r.run_name
        )
        run_id = run.info.run_id
        client.log_batch(run_id, params=[Param(k, v) for k, v in r.params.items()])
        m = by_run[r.run_name]
        batch = [
            Metric(k, float(v), int(ts), int(s))
            for k, v, ts, s in zip(m["key"], m["value"], m["ts_ms"], m["step"])
        ]
        for i in range(0, len(batch), MAX_METRICS_PER_BATCH):
            client.log_batch(run_id, metrics=batch[i : i + MAX_METRICS_PER_BATCH])
        if r.status != "RUNNING":
            with contextlib.redirect_stdout(io.StringIO()):  # it prints "View run ... at: <url>"
                client.set_terminated(run_id, r.status, end_time=_ms(r.end))
        if r.deleted:
            client.delete_run(run_id)
        ids[r.run_name] = run_id
    return ids
