"""What real runs measured, folded into the profile the next plan is made from (``rubberband profile --from-run``).

The profiler times each start-up and each trial's overhead on its own, on a quiet machine. A run meets them
together: on the local cloud the head, the nodes, their worker processes and the executor share this machine's
cores, and 21 real runs landed 18 % past their predictions' centre while their own trials replayed at their
measured speeds predicted them within 1 % (bench/bench_real_runs.py): the miss is in these figures, not in the
trials. A run's journal has them as the run paid them:

* the head's start (its ``requested_at``, else ``run_started`` → the ``head_started`` decision), where the head
  boots first;
* each instance of the first stage's burst: its boot (``instance_ready.startup_s``) and its worker processes'
  start (ready → its first trial), alone for the first boot and the last workers, overlapping otherwise;
* each trial's overhead: its wall time from start to stop less its epochs' own seconds, for fresh trials
  (``task_start_s``) and for trials resumed from a checkpoint (``restart_overhead_s``).

* each bracket's first stage as configuration samples: every trial of it (not only the survivors, so an unbiased
  draw of the search space), its epochs' seconds at the shape it ran and its score there. Eight profiled
  configurations know the population's mean speed to about σ/√8 (20 % at σ 0.6), which moves every trial of a
  run together; 27 more per run narrow it, and the prediction carries what is left of it
  (:mod:`rubberband.planner.noise`, ``config_mean_se``). A run's scores are ranked against its own speeds only
  (its first stage's scores, not the profiler's later ones). Folding a run in again replaces its samples.

:func:`run_measurements` reads them (pure: a journal's events in, values out); :func:`calibrated` returns the
profile with them in place of the quiet figures, and says so in ``sources``.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from rubberband.errors import InputError
from rubberband.profile import EpochMeasurement, Profile, StartupOverlap, StartupSamples


@dataclass(frozen=True)
class ConfigSample:
    """One trial of a bracket's first stage as the run timed it: its configuration, the shape it ran at, its epochs'
    seconds and its score there (oriented: higher is better)."""

    config: dict[str, Any]
    instance_type: str
    workers: int
    nodes: int
    epoch_times_s: tuple[float, ...]
    quality: float | None


@dataclass
class RunMeasurements:
    """What one run's journal says about start-ups and per-trial overheads (seconds; empty: not seen), filled in
    as the journal is read."""

    run_id: str
    cloud: str
    head_start_s: float | None = None
    #: per instance type: the first boot of the first stage's burst (alone), and the later ones (overlapping)
    boots_alone: dict[str, list[float]] = field(default_factory=dict)
    boots_overlapped: dict[str, list[float]] = field(default_factory=dict)
    #: per instance type: ready → first trial, the burst's last instance (alone) and the others (overlapping)
    workers_alone: dict[str, list[float]] = field(default_factory=dict)
    workers_overlapped: dict[str, list[float]] = field(default_factory=dict)
    #: per instance type: worker processes an instance started (its slots)
    workers: dict[str, int] = field(default_factory=dict)
    #: per finished trial: (wall less its epochs' own seconds, epochs), trials from scratch and resumed ones
    fresh_overheads: list[tuple[float, int]] = field(default_factory=list)
    resumed_overheads: list[tuple[float, int]] = field(default_factory=list)
    #: every finished trial of each bracket's first stage
    configurations: list[ConfigSample] = field(default_factory=list)


def run_measurements(events: Iterable[dict[str, Any]], slots: dict[str, int]) -> RunMeasurements:
    """Read one run's journal events (``slots``: worker slots per instance type, from the catalog)."""
    events = list(events)
    if not events or events[0].get("type") != "run_started":
        raise InputError("not a run's journal: its first event is not run_started; pass a run directory")
    return _with_slots(_measured(events, _Walk.of(events)), slots)


def first_stage_samples(events: list[dict[str, Any]]) -> list[ConfigSample]:
    """Every trial that finished its bracket's first stage, with that stage's epochs (less a trial's first, the
    warm-up the profiler leaves out too, where the stage ran more than one) and score (pure)."""
    return _first_stage_samples(events, _Walk.of(events))


def _with_slots(m: RunMeasurements, slots: dict[str, int]) -> RunMeasurements:
    for itype in m.workers:
        m.workers[itype] = slots.get(itype, m.workers[itype])
    return m


@dataclass(frozen=True)
class _Finished:
    """A trial's stage that finished: the event that started it (None: not journaled), the first epoch it trained
    (0: from scratch, else resumed from a checkpoint), its epochs' seconds (None: one is not journaled) and when it
    stopped."""

    started: dict[str, Any] | None
    first_epoch: int
    epochs_s: tuple[float, ...] | None
    stopped_at: float


@dataclass
class _Walk:
    """One pass over a run's journal: what the start-ups, the overheads and the configuration samples are read
    from. The journal's order is not time order (an instance's request is journaled once it is up, a trial's
    last epoch may follow its stop), so a stage's start and epochs are looked up once every event is read."""

    configs: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: instance id -> its type, every instance requested
    types: dict[str, str] = field(default_factory=dict)
    #: the first stage's burst: (requested at, id, type)
    requested: list[tuple[float, str, str]] = field(default_factory=list)
    ready: dict[str, tuple[float, float]] = field(default_factory=dict)
    first_trial: dict[str, float] = field(default_factory=dict)
    head_start_s: float | None = None
    #: each finished stage of a trial, (trial, stage, what it ran), in the order they stopped
    finished: list[tuple[str, int, _Finished]] = field(default_factory=list)
    first_stages: dict[int, int] = field(default_factory=dict)  # bracket -> its first stage's index
    scores: dict[int, dict[str, float]] = field(default_factory=dict)  # stage -> trial -> metric

    @classmethod
    def of(cls, events: list[dict[str, Any]]) -> "_Walk":
        walk = cls()
        t0 = float(events[0].get("t", 0.0)) if events else 0.0
        started: dict[tuple[str, int], dict[str, Any]] = {}
        epochs: dict[str, dict[int, float]] = {}
        stops: list[dict[str, Any]] = []
        for e in events:
            kind = e.get("type")
            if kind == "trial_created":
                walk.configs[e["trial_id"]] = dict(e.get("config") or {})
            elif kind == "decision" and e.get("kind") == "head_started" and walk.head_start_s is None:
                # from when its start began: the command may have begun it while planning, before run_started
                begun = e.get("requested_at")
                walk.head_start_s = float(e["t"]) - (t0 if begun is None else float(begun))
            elif kind == "instance_requested":
                walk.types[e["id"]] = e["instance_type"]
                if e.get("stage") == 0:
                    walk.requested.append((float(e["t"]), e["id"], e["instance_type"]))
            elif kind == "instance_ready":
                walk.ready[e["id"]] = (float(e["t"]), float(e["startup_s"]))
            elif kind == "trial_started":
                started[(e["trial_id"], e["stage"])] = e
                for instance in e.get("instances", []):
                    walk.first_trial.setdefault(instance, float(e["t"]))
            elif kind == "epoch":
                epochs.setdefault(e["trial_id"], {})[int(e["epoch"])] = float(e["seconds"])
            elif kind == "trial_stopped" and e.get("reason") == "finished":
                stops.append(e)
            elif kind == "stage_finished":
                bracket, stage = int(e.get("bracket", 0)), int(e["stage"])
                walk.first_stages[bracket] = min(walk.first_stages.get(bracket, stage), stage)
                walk.scores[stage] = {t: float(v) for t, v in (e.get("metrics") or {}).items() if v is not None}
        for e in stops:
            trained = epochs.get(e["trial_id"], {})
            span = range(int(e["start_epoch"]), int(e["end_epoch"]))
            seconds = None if any(k not in trained for k in span) else tuple(trained[k] for k in span)
            done = _Finished(started.get((e["trial_id"], e["stage"])), span.start, seconds, float(e["t"]))
            walk.finished.append((e["trial_id"], int(e["stage"]), done))
        return walk


def _measured(events: list[dict[str, Any]], walk: _Walk) -> RunMeasurements:
    """The start-ups, the per-trial overheads and the configuration samples."""
    first = events[0]
    m = RunMeasurements(run_id=str(first.get("run_id", "?")), cloud=str(first.get("cloud", "?")))
    for _, _, done in walk.finished:
        if done.started is None or done.epochs_s is None:
            continue
        overhead = max(0.0, done.stopped_at - float(done.started["t"]) - sum(done.epochs_s))
        (m.resumed_overheads if done.first_epoch > 0 else m.fresh_overheads).append((overhead, len(done.epochs_s)))
    m.head_start_s = walk.head_start_s
    _add_burst(m, [(i, t) for _, i, t in sorted(walk.requested)], walk.ready, walk.first_trial)
    m.configurations = _first_stage_samples(events, walk)
    return m


def _first_stage_samples(events: list[dict[str, Any]], walk: _Walk) -> list[ConfigSample]:
    """:func:`first_stage_samples` from the journal's walk."""
    spec = events[0].get("spec") or {}
    minimise = (spec.get("metric") or {}).get("mode") == "min"
    finished = {(trial, stage): done for trial, stage, done in walk.finished}
    out = []
    for stage in sorted(walk.first_stages.values()):
        for trial_id, metric in sorted(walk.scores.get(stage, {}).items()):
            done = finished.get((trial_id, stage))
            if done is None or done.started is None or done.epochs_s is None or trial_id not in walk.configs:
                continue
            instances = list(done.started.get("instances") or [])
            if not done.epochs_s or not instances or instances[0] not in walk.types:
                continue
            # as the profiler times configurations: a trial's first epoch warms up
            warm_up = len(done.epochs_s) > 1 and done.first_epoch == 0
            out.append(
                ConfigSample(
                    config=walk.configs[trial_id],
                    instance_type=walk.types[instances[0]],
                    workers=int(done.started.get("workers", 1)),
                    nodes=max(1, len(set(instances))),
                    epoch_times_s=done.epochs_s[1:] if warm_up else done.epochs_s,
                    quality=-metric if minimise else metric,
                )
            )
    return out


def _add_burst(
    m: RunMeasurements,
    requested: list[tuple[str, str]],
    ready: dict[str, tuple[float, float]],
    first_trial: dict[str, float],
) -> None:
    """The first stage's instances (in request order), as the run's serial provisioning overlapped them."""
    burst = [(i, t) for i, t in requested if i in ready]
    for k, (instance, itype) in enumerate(burst):
        up_at, boot = ready[instance]
        (m.boots_alone if k == 0 else m.boots_overlapped).setdefault(itype, []).append(boot)
        if instance in first_trial:
            last = k == len(burst) - 1
            target = m.workers_alone if last else m.workers_overlapped
            target.setdefault(itype, []).append(max(0.0, first_trial[instance] - up_at))
        m.workers.setdefault(itype, 1)


def read_run(run_dir: Path, slots: dict[str, int]) -> RunMeasurements:
    """A run directory's measurements; a one-line InputError when it holds no journal, or its run was simulated."""
    from rubberband.executor import journal as J
    from rubberband.executor.backends import SIM_RUNTIME

    path = Path(run_dir) / J.JOURNAL_NAME
    if not path.is_file():
        raise InputError(f"--from-run {run_dir}: no {J.JOURNAL_NAME} there; pass the directory of a finished run")
    events = list(J.iter_events(path))
    if events and events[0].get("type") == "run_started" and events[0].get("trial_runtime") == SIM_RUNTIME:
        raise InputError(
            f"--from-run {run_dir}: that run was played on virtual time (--cloud sim), so its timings are the "
            f"model's own, not measurements; pass runs made on local, aws or gcp"
        )
    return run_measurements(events, slots)


def calibrated(
    profile: Profile,
    runs: list[RunMeasurements],
    epoch_overhead_s: float | None = None,
    devices: dict[str, str] | None = None,
) -> Profile:
    """``profile`` with what ``runs`` measured in place of the quiet figures (each figure only where a run measured
    it; the rest unchanged): the head start and first boots as samples, the overlap of the burst's starts, the
    worker start, the per-trial overheads (less the per-epoch overhead the model adds for each epoch), and, where
    ``devices`` names the device of an instance type (the catalog's), each first-stage trial as a configuration
    sample (a run folded in again replaces its own)."""
    if not runs:
        return profile
    per_epoch = profile.workload.epoch_overhead_s if epoch_overhead_s is None else epoch_overhead_s
    ids = ", ".join(r.run_id for r in runs)
    sources = dict(profile.sources)
    update: dict[str, Any] = {}
    workload: dict[str, Any] = {}
    fresh = [x - n * per_epoch for r in runs for x, n in r.fresh_overheads]
    resumed = [x - n * per_epoch for r in runs for x, n in r.resumed_overheads]
    if fresh:
        workload["task_start_s"] = round(max(0.0, statistics.mean(fresh)), 4)
        sources["task_start_s"] = f"measured in real runs ({ids}): mean per-trial wall less its epochs, fresh trials"
    if resumed:
        workload["restart_overhead_s"] = round(max(0.0, statistics.mean(resumed)), 4)
        sources["restart_overhead_s"] = (
            f"measured in real runs ({ids}): mean per-trial wall less its epochs, trials resumed from a checkpoint"
        )
    alone = [x for r in runs for xs in r.workers_alone.values() for x in xs]
    if alone:
        workload["worker_start_s"] = round(statistics.median(alone), 4)
        sources["worker_start_s"] = f"measured in real runs ({ids}): an instance up → its first trial, alone"
    if workload:
        update["workload"] = profile.workload.model_copy(update=workload)
    heads = [r.head_start_s for r in runs if r.head_start_s is not None]
    if heads:
        cloud = runs[0].cloud
        others = [s for s in profile.head_startup if s.cloud != cloud]
        update["head_startup"] = [*others, StartupSamples(cloud=cloud, samples_s=heads, source="measured")]
        sources["head_startup"] = f"measured in real runs ({ids}): run start → its head takes nodes"
    samples = _configurations(profile, runs, devices or {})
    if samples is not None:
        update["epoch_measurements"], folded = samples
        sources["epoch_measurements"] = (
            f"{sources.get('epoch_measurements', 'the profiler')}; and {folded} first-stage trials of real runs "
            f"({ids}), each its run's epochs at the shape it ran"
        )
    startup, overlap = _starts(profile, runs)
    if startup is not None:
        update["startup"] = startup
        sources["startup"] = f"measured in real runs ({ids}): the first stage's first boot (alone)"
    if overlap:
        update["startup_overlap"] = overlap
        sources["startup_overlap"] = f"measured in real runs ({ids}): the first stage's later boots and workers"
    return profile.model_copy(update={**update, "sources": sources})


def _configurations(
    profile: Profile, runs: list[RunMeasurements], devices: dict[str, str]
) -> tuple[list[EpochMeasurement], int] | None:
    """The profile's configuration samples plus the runs' first-stage trials on a device it models (None: none)."""
    profiled = {m.device for m in profile.measurements}
    folded = [
        EpochMeasurement(
            config=c.config,
            device=devices[c.instance_type],
            instance_type=c.instance_type,
            workers=c.workers,
            nodes=c.nodes,
            iterations_per_epoch=profile.workload.iterations_per_epoch(c.workers),
            epoch_times_s=list(c.epoch_times_s),
            quality=c.quality,
            run_id=r.run_id,
        )
        for r in runs
        for c in r.configurations
        if devices.get(c.instance_type) in profiled
    ]
    if not folded:
        return None
    again = {r.run_id for r in runs}
    kept = [m for m in profile.epoch_measurements if m.run_id not in again]
    return kept + folded, len(folded)


def _starts(profile: Profile, runs: list[RunMeasurements]) -> tuple[list[StartupSamples] | None, list]:
    """The profile's start-up samples with the runs' alone boots in place of its own for those types, and the
    overlap of every type whose burst had both an alone and an overlapping figure of each kind."""
    types = sorted({t for r in runs for t in r.boots_alone})
    if not types:
        return None, []
    cloud = runs[0].cloud
    startup = [s for s in profile.startup if not (s.cloud == cloud and s.instance_type in types)]
    overlap = []
    for itype in types:
        boots = [x for r in runs for x in r.boots_alone.get(itype, [])]
        startup.append(StartupSamples(cloud=cloud, instance_type=itype, samples_s=boots, source="measured"))
        later = [x for r in runs for x in r.boots_overlapped.get(itype, [])]
        w_alone = [x for r in runs for x in r.workers_alone.get(itype, [])]
        w_over = [x for r in runs for x in r.workers_overlapped.get(itype, [])]
        if later and w_alone and w_over:
            overlap.append(
                StartupOverlap(
                    cloud=cloud,
                    instance_type=itype,
                    workers=next(r.workers[itype] for r in runs if itype in r.workers),
                    boot_alone_s=round(statistics.median(boots), 3),
                    boot_overlapped_s=round(statistics.median(later), 3),
                    workers_alone_s=round(statistics.median(w_alone), 3),
                    workers_overlapped_s=round(statistics.median(w_over), 3),
                )
            )
    return startup, overlap or list(profile.startup_overlap)
