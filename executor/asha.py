"""ASHA executed: asynchronous successive halving on a cluster that shrinks as the rung ladder empties.

:class:`AshaScheduler` runs an ASHA plan (``scheduler: {kind: asha}``): every free slot takes work at once — a
promoted trial's next rung first, else a new trial (its configuration asked for from the search only then, so a
model-based sampler has seen every result so far) — and a trial that reaches a rung is promoted the moment it
does when its result is not below the ``1 − 1/η`` percentile of the results recorded at that rung before it,
as Ray Tune's ``ASHAScheduler`` decides (:class:`~rubberband.planner.asha.AshaRungs`, the simulator's own rule);
else it stops there. There are no stage barriers. Each rung is one task of the trial's (its epochs from the
previous rung's), resumed from its checkpoint on warm workers.

The cluster follows the plan's phases (:class:`~rubberband.planner.policies.AshaPhasePolicy`, which the
planner's simulator follows too): phase ``k`` starts once every trial has started and none trains below rung
``k``; entering a phase that holds fewer instances, idle instances go at once and the surplus stops taking work,
each released the moment it is idle. Rung ``k``'s record closes (``stage_finished``) when phase ``k + 1``
begins. A resumed run takes up the results, promotions and stops its journal holds.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Generator, Iterator

from rubberband.executor.actions import (
    Action,
    CloseStage,
    CreateTrials,
    RungResult,
    EnterPhase,
    OpenStage,
    Promote,
    ReleaseInstance,
    RequestInstances,
    StartTrial,
    StopTrial,
)
from rubberband.executor.decisions import LossPolicy, rank
from rubberband.executor.instances import PoolInstance
from rubberband.executor.observations import (
    Begin,
    Ending,
    InstancesLost,
    NoticeSeen,
    Observation,
    Tick,
    TrialEnded,
)
from rubberband.executor.placement import Slot, make_slots
from rubberband.executor.scheduling import RunView
from rubberband.planner.asha import AshaRungs
from rubberband.planner.policies import AshaPhasePolicy
from rubberband.search import trial_id_for


@dataclass(frozen=True)
class Work:
    """A trial's next rung, waiting for a slot."""

    trial_id: str
    rung: int


class AshaScheduler:
    """ASHA on elastic phases (see the module docstring). ``trials``: how many trials the search proposes;
    ``eta``: the reduction factor; ``mode``: the spec's metric mode."""

    outlook = None  # no re-plans: ASHA has no stage boundaries

    def __init__(self, *, trials: int, eta: int, mode: str, loss_policy: LossPolicy) -> None:
        self.total = trials
        self.eta = eta
        self.mode = mode
        self.loss_policy = loss_policy
        self.rungs: AshaRungs | None = None
        self.phases: AshaPhasePolicy | None = None
        self.queue: list[Work] = []
        self.slots: list[Slot] = []
        self.in_flight: dict[str, int] = {}  # trial -> the rung it trains toward
        self.created = 0
        self.phase = 0
        self.opened: set[int] = set()
        self.closed: set[int] = set()
        self.results: dict[int, dict[str, float | None]] = {}
        self.continued: dict[int, list[str]] = {}
        self.finals: dict[str, float | None] = {}
        self.idle_since: dict[str, float] = {}  # instance -> when its last task ended
        self._undecided: list[tuple[str, int, float | None]] = []
        self._began = False

    # -- the seam -----------------------------------------------------------------------------------------
    @property
    def finished(self) -> bool:
        return self._began and self.created >= self.total and not self.queue and not self.in_flight

    def best(self) -> tuple[str | None, float | None]:
        done = {t: m for t, m in self.finals.items() if m is not None}
        if not done:
            return None, None
        best = rank(done, self.mode, sorted(done))[0]
        return best, done[best]

    def progress(self) -> tuple[int, int, int]:
        return self.phase, 0, len(self.queue) + self.total - self.created

    def next_tick_s(self, view: RunView) -> float | None:
        return None

    def work_left_s(self, g: int, *, waiting: int, awaited_s: float, view: RunView) -> float:
        return 0.0  # ASHA plans buy on-demand: the spot decisions never ask

    def per_trial_s(self, g: int, view: RunView) -> float:
        return 0.0

    def on(self, observation: Observation, view: RunView) -> Iterator[Action]:
        if isinstance(observation, Tick):
            yield from self._tick(view)
        elif isinstance(observation, TrialEnded):
            yield from self._ended(observation, view)
        elif isinstance(observation, InstancesLost):
            yield from self._lost(observation, view)
        elif isinstance(observation, NoticeSeen):
            yield from self._replace(observation.instance_id, "preemption-notice", "notice", view)
        elif isinstance(observation, Begin):
            yield from self._begin(view)

    # -- the start ------------------------------------------------------------------------------------------
    def _begin(self, view: RunView) -> Iterator[Action]:
        """The rungs and phases of the plan, what a resumed run's journal says of each trial, and the first
        phase's instances (requested before the driver connects)."""
        stages = view.plan.stages
        self.rungs = AshaRungs(self.eta, len(stages))
        self.phases = AshaPhasePolicy(tuple(s.instances for s in stages))
        self._restore(view)
        self._began = True
        missing = self.phases.target(self.phase) - len(view.of_stage(0))
        if missing > 0 and (self.queue or self.created < self.total):
            yield RequestInstances(stage=0, count=missing, trigger="start", waiting=self.total - self.created)

    def _restore(self, view: RunView) -> None:
        """Take up an earlier executor's trials: results recorded per rung, finals, and each trial's next rung."""
        assert self.rungs is not None
        state = view.state
        last = len(view.plan.stages) - 1
        for trial in sorted(state.trials.values(), key=lambda t: t.index):
            self.created += 1
            for k, metric in trial.finished_stages.items():
                self.results.setdefault(k, {})[trial.trial_id] = metric
            top = max(trial.finished_stages, default=None)
            if top is None:
                self.queue.append(Work(trial.trial_id, 0))
            elif top == last:
                self.finals[trial.trial_id] = trial.finished_stages[top]
            elif top in trial.promoted_from:
                self.queue.append(Work(trial.trial_id, top + 1))
                self.continued.setdefault(top, []).append(trial.trial_id)
            elif trial.pruned_at != top:  # its result came in, the decision did not: taken at the first tick
                self._undecided.append((trial.trial_id, top, trial.finished_stages[top]))
        undecided = {(t, k) for t, k, _ in self._undecided}
        for trial in state.trials.values():
            for k, metric in trial.finished_stages.items():
                if metric is not None and (trial.trial_id, k) not in undecided:
                    bisect.insort(self.rungs.recorded[k], self._value(metric))
        self.opened = set(state.stages)
        self.closed = set(state.completed_stages())
        self.phase = view.choices.asha_phase

    def _value(self, metric: float) -> float:
        """Higher is better, as :class:`AshaRungs` compares."""
        return metric if self.mode == "max" else -metric

    # -- each wake --------------------------------------------------------------------------------------------
    def _tick(self, view: RunView) -> Iterator[Action]:
        undecided, self._undecided = self._undecided, []
        for trial_id, k, metric in undecided:
            yield from self._decide(trial_id, k, metric, view)
        yield from self._advance(view)
        yield from self._shrink(view)
        yield from self._fill(view)
        if self.finished:
            yield from self._close_through(len(view.plan.stages), view)

    def _advance(self, view: RunView) -> Iterator[Action]:
        """Enter the phase the ladder has reached (rungs below it close)."""
        assert self.phases is not None
        lowest = min([*self.in_flight.values(), *(w.rung for w in self.queue)], default=None)
        unstarted = self.total - self.created + sum(1 for w in self.queue if w.rung == 0)
        phase = max(self.phase, self.phases.phase(unstarted=unstarted, lowest_rung=lowest))
        if self.finished or phase == self.phase:
            return
        yield from self._close_through(phase, view)
        self.phase = phase
        yield EnterPhase(phase=phase, instances=self.phases.target(phase), alive=len(view.of_stage(0)))

    def _close_through(self, phase: int, view: RunView) -> Iterator[Action]:
        """Close the record of every rung below ``phase``."""
        for k in range(phase):
            if k in self.closed:
                continue
            self.closed.add(k)
            metrics = dict(self.results.get(k, {}))
            ranking = rank(metrics, self.mode, sorted(metrics))
            last = k == len(view.plan.stages) - 1
            yield CloseStage(k, metrics, tuple(self.continued.get(k, [])), tuple(ranking), last)

    def _shrink(self, view: RunView) -> Iterator[Action]:
        """Down to the phase's instances: idle ones go, the first idle first (one never used: from when it was
        up; ties by request order), as the planner's simulator releases them."""
        assert self.phases is not None
        alive = view.of_stage(0)
        surplus = self.phases.surplus(self.phase, len(alive))
        if surplus <= 0:
            return
        busy = {i for s in self.slots if not s.free for i in s.instance_ids}
        order = {p.token: k for k, p in enumerate(view.entries())}

        def went_idle(p: PoolInstance) -> tuple[float, int]:
            up = p.ready_at if p.ready_at is not None else view.now()
            return self.idle_since.get(p.id or "", up), order[p.token]

        idle = sorted((p for p in alive if p.id not in busy), key=went_idle)
        for entry in idle[:surplus]:
            if entry.id is not None:
                self.slots[:] = [s for s in self.slots if entry.id not in s.instance_ids]
            yield ReleaseInstance(entry.token, f"ASHA phase {self.phase} holds {self.phases.target(self.phase)}", 0)

    def _fill(self, view: RunView) -> Iterator[Action]:
        """Work onto every free slot: a promoted trial's next rung first, else a new trial."""
        stage = view.plan.stage(0)
        serving = {p.id for p in view.of_stage(0)}
        self.slots[:] = [s for s in self.slots if not s.free or set(s.instance_ids) <= serving]
        used = {i for s in self.slots for i in s.instance_ids}
        fresh = [p.id for p in view.usable(0) if p.id is not None and p.id not in used]
        if fresh:
            self.slots.extend(make_slots(fresh, view.plan.stage_itype(stage).workers, stage.workers_per_trial))
        for slot in self.slots:
            if not slot.free:
                continue
            work = yield from self._next_work()
            if work is None:
                return
            yield from self._start(work, slot, view)

    def _next_work(self) -> Generator[Action, None, Work | None]:
        """Generator returning the next :class:`Work` (a new trial is created for it), or None."""
        if self.queue:
            return self.queue.pop(0)
        if self.created >= self.total:
            return None
        yield CreateTrials(bracket=0, count=1, index=self.created)
        self.created += 1
        return Work(trial_id_for(0, self.created - 1), 0)

    def _start(self, work: Work, slot: Slot, view: RunView) -> Iterator[Action]:
        stage = view.plan.stage(work.rung)
        if work.rung not in self.opened:
            self.opened.add(work.rung)
            yield OpenStage(stage=work.rung, trials=stage.trials, to_run=stage.trials)
        slot.trial_id = work.trial_id
        self.in_flight[work.trial_id] = work.rung
        start = view.first_epoch(work.trial_id, stage)
        yield StartTrial(work.trial_id, work.rung, start, stage.epochs, slot)

    # -- what happened ------------------------------------------------------------------------------------------
    def _ended(self, ended: TrialEnded, view: RunView) -> Iterator[Action]:
        self.in_flight.pop(ended.trial_id, None)
        for ident in ended.instances:
            self.idle_since[ident] = view.now()
        if ended.ending in (Ending.PREEMPTED, Ending.LOST):  # first in line again, from its checkpoint
            self.queue.insert(0, Work(ended.trial_id, ended.stage))
            return
        self.results.setdefault(ended.stage, {})[ended.trial_id] = ended.metric
        last = ended.stage == len(view.plan.stages) - 1
        yield RungResult(ended.trial_id, ended.stage, ended.metric, last=last)  # heard before the next trial's ask
        if ended.ending is Ending.FAILED or ended.metric is None:
            return
        if last:
            self.finals[ended.trial_id] = ended.metric
            return
        assert self.rungs is not None
        if not self.rungs.on_result(ended.stage, self._value(ended.metric)):
            yield StopTrial(ended.trial_id, ended.stage, ended.metric)
            return
        yield from self._promote(ended.trial_id, ended.stage, ended.metric)
        slot = next((s for s in self.slots if s.free and s.instance_ids == ended.instances), None)
        if slot is not None:  # it goes on where it ran, at once (a continuation is not new work)
            yield from self._start(self.queue.pop(0), slot, view)

    def _decide(self, trial_id: str, k: int, metric: float | None, view: RunView) -> Iterator[Action]:
        """A trial whose rung result a resumed run finds without a decision: decided now."""
        assert self.rungs is not None
        if metric is not None and self.rungs.on_result(k, self._value(metric)):
            yield from self._promote(trial_id, k, metric)
        else:
            yield StopTrial(trial_id, k, metric)

    def _promote(self, trial_id: str, k: int, metric: float) -> Iterator[Action]:
        self.continued.setdefault(k, []).append(trial_id)
        self.queue.insert(0, Work(trial_id, k + 1))
        yield Promote(trial_id=trial_id, from_stage=k, to_stage=k + 1, metric=metric, rank=len(self.continued[k]) - 1)

    def _lost(self, lost: InstancesLost, view: RunView) -> Iterator[Action]:
        gone = set(lost.lost)
        self.slots[:] = [s for s in self.slots if not gone & set(s.instance_ids)]
        for ident, reason in lost.lost.items():
            trigger = "preemption" if reason == "spot-interruption" else "lost"
            yield from self._replace(ident, reason, trigger, view)

    def _replace(self, ident: str, reason: str, trigger: str, view: RunView) -> Iterator[Action]:
        """A lost or noticed instance is replaced while the phase holds more instances than are alive and work is
        left, up to the loss limit."""
        assert self.phases is not None
        if ident in view.choices.replaced:
            return
        work_left = bool(self.queue or self.in_flight or self.created < self.total)
        short = len(view.of_stage(0)) < self.phases.target(self.phase)
        if short and self.loss_policy.replace(
            serves=0, current=0, work_left=work_left, losses=view.choices.counted_losses
        ):
            yield RequestInstances(
                stage=0, count=1, trigger=trigger, waiting=len(self.queue), replaces=ident, reason=reason
            )
