"""Running one lane's stage: its trials, where each resumes, and their placement on the stage's free slots.

:class:`StageRunning` is handed the lane it acts on. It opens a stage (a bracket's first stage asks the search
for its configurations — all of them when it opens, or, for a sampler that learns, each right before the trial
starts on a free slot, so that it has heard every result in by then; a later stage takes the trials the previous
stage promoted), works out where each trial
resumes — right after its newest checkpoint within the stage, or not at all when its checkpoint covers the
stage and its last epoch's metric is in the journal — puts waiting trials on free slots in order (they run in
waves, as the simulator has them), and takes back what ended: a result, a failure, or a trial to restart first
from its checkpoint (its instance was lost or noticed).
"""

from __future__ import annotations

from typing import Generator, Iterator, Sequence

from rubberband.executor.actions import (
    Action,
    CreateTrials,
    FinishFromCheckpoint,
    OpenStage,
    RungResult,
    StartTrial,
)
from rubberband.executor.decisions import requeue_first
from rubberband.executor.lanes import Lane
from rubberband.executor.observations import Ending, TrialEnded
from rubberband.executor.placement import Slot, make_slots
from rubberband.executor.scheduling import RunView
from rubberband.search import trial_id_for


class StageRunning:
    """Stage starts, trial placement and results of a lane's stage (see the module docstring).

    ``metric``: the spec's metric name (a trial's last epoch's value in the journal finishes it); ``ask_at_start``:
    a bracket's configurations are asked one by one as their trials start, not all when the bracket opens (the
    same start times either way: the ask happens on the slot the trial takes).
    """

    def __init__(self, metric: str, *, ask_at_start: bool = False) -> None:
        self.metric = metric
        self.ask_at_start = ask_at_start
        self._rerun_last: set[tuple[int, str]] = set()  # (stage, trial): last epoch checkpointed, never reported

    # -- opening a stage -------------------------------------------------------------------------------
    def open(self, lane: Lane, g: int, view: RunView, promoted: Sequence[str] | None = None) -> Iterator[Action]:
        """Start stage ``g`` of ``lane``: its trials (``promoted`` by the stage before, else those the journal
        knows or new ones for a bracket's first stage), which of them still have epochs to run, journaled."""
        stage = view.plan.stage(g)
        if stage.stage == 0:
            if not self.ask_at_start:
                yield CreateTrials(bracket=stage.bracket, count=stage.trials)
            trials = [trial_id_for(stage.bracket, i) for i in range(stage.trials)]
        elif promoted is not None:
            trials = list(promoted)
        else:
            trials = list(view.state.stages[g - 1].promoted)
        lane.open(g, trials)
        for trial_id in trials:
            trial = view.trial(trial_id)
            if trial is not None and g in trial.finished_stages:
                lane.metrics[trial_id] = trial.finished_stages[g]
                continue
            start = yield from self._settle(lane, trial_id, view.first_epoch(trial_id, stage), view)
            if start is not None:
                lane.pending.append((trial_id, start))
        yield OpenStage(stage=g, trials=len(trials), to_run=len(lane.pending))

    def _settle(self, lane: Lane, trial_id: str, start: int, view: RunView) -> Generator[Action, None, int | None]:
        """Generator returning the first epoch a waiting trial must run, past its newest checkpoint; None if it
        needs none (it then finishes from the journal's metric: :class:`FinishFromCheckpoint`).

        Asked when a stage opens and again right before the trial starts: a checkpoint can appear after a trial
        was queued (the workers of a lost local node may outlive it by a moment). A trial whose checkpoint covers
        the stage's last epoch takes its metric from the journal (a trial reports an epoch before checkpointing
        it); only if that report never arrived is the last epoch run again.
        """
        g = lane.g
        assert g is not None
        if (g, trial_id) in self._rerun_last:
            return start
        stage = view.plan.stage(g)
        start = max(start, view.first_epoch(trial_id, stage))
        if start < stage.epochs:
            return start
        metric = view.reported(trial_id, stage.epochs - 1, self.metric)
        if metric is None:
            self._rerun_last.add((g, trial_id))
            return stage.epochs - 1
        lane.metrics[trial_id] = metric
        yield FinishFromCheckpoint(trial_id=trial_id, stage=g, metric=metric)
        return None

    # -- placing trials --------------------------------------------------------------------------------
    def fill(self, lane: Lane, view: RunView) -> Iterator[Action]:
        """Slots on the stage's instances that came up (or were handed over); waiting trials onto free slots."""
        g = lane.g
        if g is None:
            return
        stage = view.plan.stage(g)
        # free slots on instances gone elsewhere (released, handed over) go; one kept for the next stage still
        # takes this stage's trials meanwhile (a trial a loss stopped, say)
        nxt = view.plan.layout.next_stage(g)
        serving = {p.id for p in view.of_stage(g) + (view.of_stage(nxt) if nxt is not None else [])}
        lane.slots[:] = [s for s in lane.slots if not s.free or set(s.instance_ids) <= serving]
        used = {i for s in lane.slots for i in s.instance_ids}
        fresh = [p.id for p in view.usable(g) if p.id is not None and p.id not in used]
        if fresh:  # a spanning trial waits for enough of them
            lane.slots.extend(make_slots(fresh, view.plan.stage_itype(stage).workers, stage.workers_per_trial))
        noticed = view.choices.noticed
        for slot in lane.slots:
            if not lane.pending:
                return
            if slot.free and not noticed.keys() & set(slot.instance_ids):  # a noticed instance takes none
                yield from self._start_next(lane, slot, view)

    def _start_next(self, lane: Lane, slot: Slot, view: RunView) -> Iterator[Action]:
        """Start the first waiting trial that still has epochs to run on a free slot."""
        assert lane.g is not None
        stage = view.plan.stage(lane.g)
        while lane.pending:
            trial_id, start = lane.pending.pop(0)
            settled = yield from self._settle(lane, trial_id, start, view)
            if settled is not None:
                if view.trial(trial_id) is None:  # asked now, on the slot it takes (journaled before it starts)
                    yield CreateTrials(bracket=stage.bracket, count=1, index=lane.trials.index(trial_id))
                slot.trial_id = trial_id
                yield StartTrial(
                    trial_id=trial_id, stage=lane.g, start_epoch=settled, end_epoch=stage.epochs, slot=slot
                )
                return

    # -- what ended --------------------------------------------------------------------------------------
    def take(self, lane: Lane, ended: TrialEnded, view: RunView) -> Iterator[Action]:
        """A task of the lane's stage ended: its result (the search hears it at once), or (stopped on a notice)
        first in line again. A trial lost with its instance is requeued by :meth:`requeue`, with the others the
        loss stopped."""
        if ended.ending is Ending.PREEMPTED:  # first in line again, after its checkpoint, on another instance
            stage = view.plan.stage(ended.stage)
            lane.pending.insert(0, (ended.trial_id, view.first_epoch(ended.trial_id, stage)))
            return
        if ended.ending is Ending.LOST:
            return
        if not ended.cold:  # a task time as the simulator has it: a new node's worker start is not in it
            lane.trial_seconds.append(ended.seconds)
        if ended.error:
            lane.failures.append(ended.error)
        lane.metrics[ended.trial_id] = ended.metric
        yield RungResult(ended.trial_id, ended.stage, ended.metric, last=ended.stage == lane.end - 1)

    @staticmethod
    def requeue(lane: Lane, trials: Sequence[str], view: RunView) -> None:
        """Trials a loss stopped go first, in order: their slots were taken from them."""
        if lane.g is None:
            return
        stage = view.plan.stage(lane.g)
        requeue_first(lane.pending, list(trials), lambda trial_id: view.first_epoch(trial_id, stage))
