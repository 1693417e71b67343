"""The scheduler seam: what a scheduler sees (a read-only view) and what it must answer.

A scheduler decides; it does no I/O. For each observation (:mod:`rubberband.executor.observations`) the loop
asks :meth:`Scheduler.on`, which yields actions (:mod:`rubberband.executor.actions`); the loop carries out each
action as it is yielded, so the scheduler's next look at the :class:`RunView` already sees it (a trial created,
an instance requested). Two schedulers implement it:

* :class:`~rubberband.executor.sha.ShaScheduler` — successive halving and Hyperband, brackets one after another
  or side by side (lanes), with stage barriers, promotion of the top 1/η, carry-over, prefetch and release;
* :class:`~rubberband.executor.asha.AshaScheduler` — asynchronous successive halving: a trial is promoted the
  moment its rung has enough results, as Ray Tune's ``ASHAScheduler`` does, on a cluster that shrinks as the
  rung ladder empties.

A scheduler also answers what the spot decisions and re-plans need to know of the work left
(:class:`Outlook`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterator, Protocol

from rubberband.catalog import InstanceType
from rubberband.executor.actions import Action
from rubberband.executor.checkpoints import latest_epoch
from rubberband.executor.fleet import Fleet, Waiter
from rubberband.executor.instances import PoolInstance
from rubberband.executor.observations import Observation
from rubberband.executor.runplan import RunPlan
from rubberband.executor.runstate import DecisionState, RunState, TrialState
from rubberband.executor.services import Services
from rubberband.executor.trialrunner import RunningTrial, TrialRunner
from rubberband.plan import StagePlan


class RunView:
    """What a scheduler may look at: the run's state (the journal's fold), its plan and types, its instances and
    its trials in flight. Read-only: nothing here changes the run."""

    def __init__(self, services: Services, runplan: RunPlan, fleet: Fleet, runner: TrialRunner) -> None:
        self._services = services
        self.plan = runplan
        self._fleet = fleet
        self._runner = runner

    # -- time and state ---------------------------------------------------------------------------
    def now(self) -> float:
        return self._services.clock.time()

    def elapsed(self) -> float:
        """Seconds since the run first started."""
        return self._services.elapsed()

    @property
    def state(self) -> RunState:
        return self._services.journal.current

    @property
    def choices(self) -> DecisionState:
        return self.state.choices

    @property
    def metric_mode(self) -> str:
        return self._services.spec.metric.mode

    def trial(self, trial_id: str) -> TrialState | None:
        return self.state.trials.get(trial_id)

    # -- instances --------------------------------------------------------------------------------
    def entries(self) -> list[PoolInstance]:
        return list(self._fleet.entries.values())

    def entry(self, instance_id: str) -> PoolInstance | None:
        return self._fleet.entry(instance_id)

    def request(self, token: str) -> PoolInstance:
        return self._fleet.entries[token]

    def of_stage(self, g: int) -> list[PoolInstance]:
        """Stage ``g``'s instances, up or coming (not released)."""
        return self._fleet.of_stage(g)

    def usable(self, g: int) -> list[PoolInstance]:
        """Stage ``g``'s instances that take trials now: up, workers answering, no preemption notice."""
        return self._fleet.usable(g)

    def alive(self) -> list[PoolInstance]:
        return self._fleet.alive()

    def waiting_for(self, entry: PoolInstance) -> list[Waiter]:
        return self._fleet.waiting_for(entry)

    def unavailable(self, stages: list[StagePlan]) -> list[str]:
        """Keys of the planned types of ``stages`` failover found unavailable (the cloud's blocked zones, in
        memory)."""
        return self.plan.unavailable(stages, self._services.backend)

    def lead_s(self, itype: InstanceType) -> float:
        """The prefetch lead time of ``itype`` (a start-up quantile)."""
        return self._fleet.lead_s(itype)

    # -- trials -----------------------------------------------------------------------------------
    def running(self) -> list[RunningTrial]:
        return self._runner.runs()

    def running_of(self, bracket: int) -> list[RunningTrial]:
        trials = self.state.trials
        return [r for r in self._runner.runs() if trials[r.trial_id].bracket == bracket]

    def checkpoint_dir(self, trial_id: str) -> Path:
        return self._runner.checkpoint_dir(trial_id)

    def first_epoch(self, trial_id: str, stage: StagePlan) -> int:
        """First epoch a trial must run in ``stage``: right after its newest checkpoint (journal or disk) within
        the stage, else the stage's first."""
        base = stage.epochs - stage.epochs_this_stage
        trial = self.trial(trial_id)
        journaled = trial.checkpoint_epoch if trial is not None else None
        found = [e for e in (journaled, latest_epoch(self.checkpoint_dir(trial_id))) if e is not None]
        ckpt = max(found, default=None)
        return ckpt + 1 if ckpt is not None and ckpt + 1 > base else base

    def reported(self, trial_id: str, epoch: int, metric: str) -> float | None:
        """The metric a trial reported for ``epoch`` (through the journal sink), if it did."""
        trial = self.trial(trial_id)
        return None if trial is None else trial.epochs.get(epoch, {}).get(metric)


class Scheduler(Protocol):
    """Decides a run's trials and instances from what the loop observes (see the module docstring)."""

    def on(self, observation: Observation, view: RunView) -> Iterator[Action]:
        """The actions ``observation`` calls for, in order (each carried out before the next is asked for)."""
        ...

    @property
    def finished(self) -> bool:
        """Whether every trial has run its last rung."""
        ...

    def best(self) -> tuple[str | None, float | None]:
        """The best trial at its last rung, and its metric (None before any)."""
        ...

    def next_tick_s(self, view: RunView) -> float | None:
        """Seconds until the scheduler wants a :class:`~rubberband.executor.observations.Tick` even if nothing
        happens (a bracket's offset, a prefetch's moment); None: only on events."""
        ...

    def progress(self) -> tuple[int, int, int]:
        """(the most advanced stage running, its bracket, trials waiting to start) for the progress display."""
        ...


class Outlook(Protocol):
    """The work left, as the spot decisions and re-plans see it (a scheduler that plans no spot and no re-plan
    answers simply)."""

    def work_left_s(self, g: int, *, waiting: int, awaited_s: float, view: RunView) -> float:
        """The run's predicted remaining time from now with stage ``g`` ``waiting`` trials short (``awaited_s``: a
        replacement's start-up it waits for)."""
        ...

    def per_trial_s(self, g: int, view: RunView) -> float:
        """Stage ``g``'s mean task time: measured, else the plan's."""
        ...
