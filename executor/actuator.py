"""Carrying out a scheduler's actions: the journal, the instances, the trials, the search and the re-plans.

:class:`Actuator` is where a decision becomes an effect. Each action of :mod:`rubberband.executor.actions` has
one method here; a re-plan that changes the plan is followed at once (the scheduler is told, and its answer
carried out in turn).
"""

from __future__ import annotations

from typing import Any, Callable, Iterator

from rubberband.executor import journal as J
from rubberband.executor.actions import (
    Action,
    CloseStage,
    CreateTrials,
    EnterPhase,
    FinishFromCheckpoint,
    HandOver,
    KeepInstance,
    OpenStage,
    Promote,
    ReleaseInstance,
    Replan,
    RequestInstances,
    RungResult,
    StartTrial,
    StopTrial,
)
from rubberband.executor.fleet import Fleet
from rubberband.executor.lane_outlook import LaneOutlook
from rubberband.executor.observations import Observation, PlanFollowed
from rubberband.executor.replanning import Replanning
from rubberband.executor.scheduling import Outlook, RunView
from rubberband.executor.services import Services
from rubberband.executor.spotdesk import SpotDesk
from rubberband.executor.trialrunner import TrialRunner
from rubberband.search import ConfigSource, trial_id_for

Dispatch = Callable[[Observation], None]


class Actuator:
    """Carries out actions (see the module docstring). ``outlook``: the scheduler's view of the work left;
    ``dispatch``: hands an observation to the scheduler and carries out its answer (a followed re-plan)."""

    def __init__(
        self, services: Services, fleet: Fleet, runner: TrialRunner, spot: SpotDesk, replanning: Replanning
    ) -> None:
        self.services = services
        self.fleet = fleet
        self.runner = runner
        self.spot = spot
        self.replanning = replanning
        self.journal = services.journal
        self.search: ConfigSource | None = None
        self.outlook: Outlook | None = None  # the scheduler's: the work left, for spot decisions
        self.remainder: LaneOutlook | None = None  # the lanes' remaining work, for re-plans (SHA / Hyperband)
        self.dispatch: Dispatch | None = None
        self._do: dict[type, Callable[[Any, RunView], None]] = {
            CreateTrials: self._create,
            RungResult: self._result,
            OpenStage: self._open,
            StartTrial: self._start,
            FinishFromCheckpoint: self._finish_from_checkpoint,
            Promote: self._promote,
            StopTrial: self._stop,
            CloseStage: self._close,
            RequestInstances: self._request,
            KeepInstance: self._keep,
            ReleaseInstance: self._release,
            HandOver: self._hand_over,
            Replan: self._replan,
            EnterPhase: self._phase,
        }

    def run(self, actions: Iterator[Action], view: RunView) -> None:
        """Carry out each action as the scheduler yields it (its next look at the view sees the effect)."""
        for action in actions:
            self._do[type(action)](action, view)

    # -- trials and stages ------------------------------------------------------------------------------
    def _create(self, action: CreateTrials, view: RunView) -> None:
        """Ask the search for configurations, as late as the scheduler asks: a learning sampler's trial right before
        it starts (after every result told so far), journaled before it runs."""
        assert self.search is not None
        spec = self.services.spec
        for index in range(action.index, action.index + action.count):
            trial_id = trial_id_for(action.bracket, index)
            if trial_id not in view.state.trials:  # all of them fresh; any a crash cut off on resume
                config = {**spec.config, **self.search.propose(trial_id)}
                self.journal.record(
                    J.TrialCreated(trial_id=trial_id, bracket=action.bracket, index=index, config=config)
                )

    def _result(self, action: RungResult, view: RunView) -> None:
        """One trial's rung result, told at once: it goes on for now (the rung decides), or is done at its last."""
        assert self.search is not None
        epochs = view.plan.stage(action.stage).epochs
        self.search.rung_finished(epochs, {action.trial_id: action.metric}, None if action.last else [action.trial_id])

    def _open(self, action: OpenStage, view: RunView) -> None:
        stage = view.plan.stage(action.stage)
        layout = view.plan.layout
        offset: dict[str, Any] = {"offset_s": layout.offsets_s[layout.lane_of(action.stage)]} if layout.parallel else {}
        self.journal.record(
            J.StageStarted(
                stage=action.stage,
                bracket=stage.bracket,
                stage_in_bracket=stage.stage,
                trials=action.trials,
                to_run=action.to_run,
                epochs=stage.epochs,
                instance_type=stage.instance_type,
                instances=stage.instances,
                workers_per_trial=stage.workers_per_trial,
                predicted_duration_s=stage.predicted_duration_s,
                **offset,
            )
        )

    def _start(self, action: StartTrial, view: RunView) -> None:
        self.runner.start(action, view.plan.stage(action.stage))

    def _finish_from_checkpoint(self, action: FinishFromCheckpoint, view: RunView) -> None:
        self.journal.record(
            J.TrialStopped(
                trial_id=action.trial_id,
                stage=action.stage,
                reason="finished",
                metric=action.metric,
                note="every epoch of the stage was checkpointed before the interruption",
            )
        )

    def _promote(self, action: Promote, view: RunView) -> None:
        self.journal.record(
            J.TrialPromoted(
                trial_id=action.trial_id,
                from_stage=action.from_stage,
                to_stage=action.to_stage,
                metric=action.metric,
                rank=action.rank,
            )
        )

    def _stop(self, action: StopTrial, view: RunView) -> None:
        self.journal.record(
            J.TrialStopped(trial_id=action.trial_id, stage=action.stage, reason="pruned", metric=action.metric)
        )
        assert self.search is not None  # stopped now (ASHA): the search hears it pruned, not at the end
        self.search.rung_finished(view.plan.stage(action.stage).epochs, {action.trial_id: action.metric}, [])

    def _close(self, action: CloseStage, view: RunView) -> None:
        stage = view.plan.stage(action.stage)
        self.journal.record(
            J.StageFinished(
                stage=action.stage,
                bracket=stage.bracket,
                metrics=action.metrics,
                promoted=list(action.promoted),
                ranking=list(action.ranking),
            )
        )
        assert self.search is not None
        self.search.rung_finished(stage.epochs, action.metrics, None if action.last else list(action.promoted))

    def _phase(self, action: EnterPhase, view: RunView) -> None:
        self.journal.record(J.AshaPhase(phase=action.phase, instances=action.instances, alive=action.alive))

    # -- instances --------------------------------------------------------------------------------------
    def _request(self, action: RequestInstances, view: RunView) -> None:
        """Request ``count`` instances on the market the spot policy says; journal a prefetch or a replacement."""
        assert self.outlook is not None
        stage = view.plan.stage(action.stage)
        if action.prefetch is not None:
            remaining, lead = action.prefetch
            self.journal.record(
                J.Prefetch(
                    stage=action.stage,
                    count=action.count,
                    instance_type=view.plan.stage_itype(stage).name,
                    estimated_remaining_s=remaining,
                    lead_s=lead,
                    quantile=self.fleet.prefetch.quantile,
                )
            )
        spot = self.spot.market(action, self.outlook, view)
        noticed = view.choices.noticed
        for _ in range(action.count):
            entry = self.fleet.request(action.stage, spot)
            if action.replaces is not None:
                entry.replaces = action.replaces if action.replaces in noticed else None
            if action.reason is not None:
                self.journal.record(
                    J.Replace(
                        id=action.replaces,
                        stage=action.stage,
                        token=entry.token,
                        instance_type=entry.itype.name,
                        reason=action.reason,
                        spot=spot,
                    )
                )

    def _keep(self, action: KeepInstance, view: RunView) -> None:
        self.fleet.keep(view.request(action.token), action.stage)

    def _release(self, action: ReleaseInstance, view: RunView) -> None:
        self.fleet.release(view.request(action.token), action.reason, action.stage)

    def _hand_over(self, action: HandOver, view: RunView) -> None:
        entry, target = view.request(action.token), view.request(action.request)
        stages = view.plan.stages
        lanes = (stages[entry.assigned_stage].bracket, stages[target.assigned_stage].bracket)
        self.fleet.hand_over(entry, action.request, lanes)

    # -- re-plans -----------------------------------------------------------------------------------------
    def _replan(self, action: Replan, view: RunView) -> None:
        """Re-plan at a boundary (or after a failover); the scheduler follows a changed plan at once."""
        outlook = self.remainder
        if outlook is None:
            return
        if action.lane is None:
            changed = self.replanning.after_failover(outlook, view)
        else:
            changed = self.replanning.at_boundary(action.stage, action.lane, outlook, view)
        if changed and self.dispatch is not None:
            self.dispatch(PlanFollowed(tuple(changed)))
