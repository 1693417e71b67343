"""Who runs a bracket's next stage, and how fast each of them has been: what the boundary re-plan predicts from.

At a stage boundary every trial that goes on has been timed in the stages before (``epoch`` events carry each
epoch's seconds; the journal's fold keeps them per trial). :func:`measured_survivors` lists, per bracket of the
remaining work, the trials its next stage will run (a finished stage's promotions, best first) or, while the
bracket's current stage still runs, its trials ranked by their latest metric (the order promotion will most likely
keep), each with its epochs' seconds and the shape each epoch ran at. The re-planner turns those into each
trial's speed relative to its re-fitted model (:class:`~rubberband.planner.noise.KnownTrials`), in place of
drawing survivors from the population. Pure: reads the run's state and plan, nothing else.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable

from rubberband.catalog import InstanceType
from rubberband.executor.decisions import rank
from rubberband.executor.runstate import RunState
from rubberband.plan import StagePlan


@dataclass(frozen=True)
class EpochTime:
    """One measured epoch of a trial: the shape it ran at (device, workers, nodes) and its seconds."""

    device: str
    workers: int
    nodes: int
    seconds: float


@dataclass(frozen=True)
class TrialTimes:
    """A trial the remaining work will run, with every epoch the run measured of it."""

    trial_id: str
    epochs: tuple[EpochTime, ...]


def measured_survivors(
    state: RunState,
    stages: list[StagePlan],
    positions: Iterable[int],
    metric: tuple[str, str],
    type_of: Callable[[StagePlan], InstanceType],
) -> dict[int, tuple[TrialTimes, ...]]:
    """Per bracket of the remaining stages ``positions``, its trials for its next stage, best ranked first, with
    their measured epochs (brackets that have not started, or whose trials have no timed epoch, are left out).
    ``metric``: the spec's metric (name, mode); ``type_of``: a stage's instance type (the run's substitutes
    included)."""
    out: dict[int, tuple[TrialTimes, ...]] = {}
    for g in _first_of_each_bracket(stages, positions):
        bracket = stages[g].bracket
        ranked = _ranked_candidates(state, stages, g, metric)
        timed = tuple(t for t in (_times(state, stages, bracket, trial, type_of) for trial in ranked) if t.epochs)
        if timed:
            out[bracket] = timed
    return out


def bracket_history(
    state: RunState, stages: list[StagePlan], metric: tuple[str, str], type_of: Callable[[StagePlan], InstanceType]
) -> dict[int, tuple[TrialTimes, ...]]:
    """Per bracket, every trial the run timed in the order its promotions put them (the last stage's ranking
    first, then each earlier stage's trials that went no further, by that stage's ranking), with its measured
    epochs: what a replay of a finished run plays its own trials as (``bench/bench_real_runs.py``)."""
    name, mode = metric
    out: dict[int, tuple[TrialTimes, ...]] = {}
    for bracket in sorted({s.bracket for s in stages}):
        order: list[str] = []
        for g in reversed([i for i, s in enumerate(stages) if s.bracket == bracket]):
            record = state.stages.get(g)
            if record is None:
                continue
            for trial_id in rank(record.metrics, mode, sorted(record.metrics)):
                if trial_id not in order:
                    order.append(trial_id)
        timed = tuple(t for t in (_times(state, stages, bracket, tid, type_of) for tid in order) if t.epochs)
        if timed:
            out[bracket] = timed
    return out


def _first_of_each_bracket(stages: list[StagePlan], positions: Iterable[int]) -> list[int]:
    seen: dict[int, int] = {}
    for g in positions:
        seen.setdefault(stages[g].bracket, g)
    return list(seen.values())


def _ranked_candidates(state: RunState, stages: list[StagePlan], g: int, metric: tuple[str, str]) -> list[str]:
    """The trials stage ``g`` will run, best first: the previous stage's promotions once it finished; while it
    runs, its trials by their latest metric; none before the bracket's first stage."""
    bracket = stages[g].bracket
    previous = [i for i in range(g) if stages[i].bracket == bracket]
    if not previous:
        return []
    p = previous[-1]
    record = state.stages.get(p)
    if record is not None and record.finished_at is not None:
        return list(record.promoted)
    before = [i for i in previous if i < p]
    running = [
        t.trial_id
        for t in state.trials.values()
        if t.bracket == bracket and t.pruned_at is None and (not before or before[-1] in t.promoted_from)
    ]
    name, mode = metric
    latest = {tid: _latest_metric(state, tid, name) for tid in running}
    return rank(latest, mode, sorted(running, key=lambda tid: state.trials[tid].index))


def _latest_metric(state: RunState, trial_id: str, name: str) -> float | None:
    """The trial's metric at its latest epoch that reported one (None: none yet)."""
    trial = state.trials[trial_id]
    for epoch in sorted(trial.epochs, reverse=True):
        value = trial.epochs[epoch].get(name)
        if value is not None:
            return float(value)
    return None


def _times(
    state: RunState, stages: list[StagePlan], bracket: int, trial_id: str, type_of: Callable[[StagePlan], InstanceType]
) -> TrialTimes:
    """A trial's measured epochs, each with the shape of the bracket's stage it belongs to."""
    trial = state.trials.get(trial_id)
    if trial is None:
        return TrialTimes(trial_id, ())
    own = [s for s in stages if s.bracket == bracket]
    epochs = []
    for epoch, seconds in sorted(trial.epoch_seconds.items()):
        stage = next((s for s in own if s.epochs - s.epochs_this_stage <= epoch < s.epochs), None)
        if stage is None or not seconds > 0:
            continue
        itype = type_of(stage)
        nodes = -(-stage.workers_per_trial // max(1, itype.workers))
        epochs.append(EpochTime(itype.device, stage.workers_per_trial, nodes, float(seconds)))
    return TrialTimes(trial_id, tuple(epochs))
