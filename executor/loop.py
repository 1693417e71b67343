"""The executor's one loop, for every scheduler: wait for something to happen, tell the scheduler, do what it says.

Each turn, :class:`RunLoop`:

1. checks the guard (a signal that arrived; the deadline plus the overrun);
2. ticks the scheduler (:class:`~rubberband.executor.observations.Tick`: lanes that are due start, stages at
   their barrier promote, idle instances go, trials take free slots) and carries out its actions;
3. waits — on the cluster, for a trial to finish or a preemption notice to come, woken early when a side call
   (an instance request) finishes, and at the latest when the next timer is due: the scheduler's own (a
   bracket's offset, a prefetch's moment), the deadline, the periodic liveness check of the run's nodes, the
   progress display;
4. turns what happened into observations — instances up, trials ended, instances lost (their other trials
   stopped), notices, epochs reported — and hands each to the scheduler, whose actions it carries out.

The same loop runs on a real Ray cluster on wall time and on a simulated one on virtual time
(``--cloud sim``): only the cluster and the clock differ.
"""

from __future__ import annotations

import math
from typing import Callable

from rubberband.executor.actuator import Actuator
from rubberband.executor.fleet import Fleet
from rubberband.executor.losses import LossDesk
from rubberband.executor.observations import Ending, EpochReported, InstanceUp, Observation, Tick, TrialEnded
from rubberband.executor.scheduling import RunView, Scheduler
from rubberband.executor.services import Services
from rubberband.executor.spotdesk import SpotDesk
from rubberband.executor.stopping import RunGuard
from rubberband.executor.trialrunner import TrialRunner

#: The longest the loop sleeps with nothing due (a safety net: every timer it knows is sooner).
MAX_WAIT_S = 30.0


class RunLoop:
    """One run's loop over a scheduler (see the module docstring). ``progress``: called after each turn."""

    def __init__(
        self,
        services: Services,
        scheduler: Scheduler,
        parts: tuple[Fleet, TrialRunner, LossDesk, SpotDesk, Actuator],
        guard: RunGuard,
        progress: Callable[[], None] | None = None,
    ) -> None:
        self.services = services
        self.scheduler = scheduler
        self.fleet, self.runner, self.losses, self.spot, self.actuator = parts
        self.guard = guard
        self.progress = progress
        self.view = RunView(services, self.fleet.runplan, self.fleet, self.runner)
        self.actuator.dispatch = self.dispatch
        self._epochs_seen: dict[str, int] = {}

    def dispatch(self, observation: Observation) -> None:
        """Hand ``observation`` to the scheduler and carry out its actions as it yields them."""
        self.actuator.run(self.scheduler.on(observation, self.view), self.view)

    def run(self) -> tuple[str | None, float | None]:
        """Turn until the scheduler has run every trial; the best trial and its metric."""
        while True:
            self.guard.check(self.scheduler.progress()[0])
            self.dispatch(Tick(self.services.elapsed()))
            if self.scheduler.finished:
                return self.scheduler.best()
            for observation in self._observe():
                self.dispatch(observation)
            self.fleet.collect_terminations()
            if self.progress is not None:
                self.progress()

    # -- waiting and observing --------------------------------------------------------------------------
    def _timeout(self) -> float:
        due = [MAX_WAIT_S, self.guard.next_due_s()]
        wanted = self.scheduler.next_tick_s(self.view)
        if wanted is not None:
            due.append(wanted)
        if self.fleet.alive() and self.losses.every_s > 0:
            due.append(self.losses.next_due_s())
        if self.progress is not None:
            due.append(self.services.cluster.idle_tick_s)
        if self.fleet.arrived():  # an instance is up already: take it now
            due.append(0.0)
        return max(0.0, min(d for d in due if not math.isnan(d)))

    def _observe(self) -> list[Observation]:
        self.services.journal.state  # once a turn: the workers' epochs and checkpoints the sink appended
        trials = self.runner.refs()
        notices = self.fleet.watchers.refs()
        ready = self.services.cluster.wait(trials + notices, self._timeout())
        live_check = self.losses.due()
        out: list[Observation] = [InstanceUp(e.token, e.id or "") for e in self.fleet.collect()]
        ended = self.runner.collect([r for r in ready if r in self.runner.running])
        out.extend(ended)
        out.extend(self._losses(ended, live_check))
        asked = tuple(dict.fromkeys(i for e in ended if e.ending is Ending.PREEMPTED for i in e.instances))
        if asked or live_check or any(r in notices for r in ready):
            out.extend(self.spot.notices(asked, self.view))
        out.extend(self._epochs())
        return out

    def _losses(self, ended: list[TrialEnded], live_check: bool) -> list[Observation]:
        """Instances found gone — by a trial that ended on them, or the periodic liveness check — journaled; the
        other trials on them stopped."""
        gone: dict[str, str] = {}
        stopped: list[tuple[str, tuple[str, ...]]] = []
        for e in ended:
            if e.ending is Ending.LOST:
                gone.update(dict(e.gone))
                stopped.append((e.trial_id, e.instances))
        if live_check:
            self.fleet.watch_ready()
            gone.update(self.losses.poll())
        if not gone:
            return []
        others = self.runner.stop_on(set(gone))
        stopped += [(e.trial_id, e.instances) for e in others]
        current = self.scheduler.progress()[0]
        out: list[Observation] = list(others)
        out.append(self.losses.record(gone, stopped, current))
        return out

    def _epochs(self) -> list[Observation]:
        """Epochs the running trials reported since the last turn (through the journal sink)."""
        out: list[Observation] = []
        trials = self.services.journal.current.trials
        for run in self.runner.runs():
            epochs = trials[run.trial_id].epochs
            seen = self._epochs_seen.get(run.trial_id, 0)
            if len(epochs) > seen:
                out.extend(EpochReported(run.trial_id, e) for e in sorted(epochs)[seen:])
                self._epochs_seen[run.trial_id] = len(epochs)
        return out
