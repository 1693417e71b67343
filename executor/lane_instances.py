"""The instances of one lane's stage: which it keeps, requests ahead, releases, hands over or replaces.

:class:`LaneInstances` is handed the lane it acts on and decides from the planner's own
:class:`~rubberband.planner.policies.PrefetchPolicy` (so the simulator's prediction describes it):

* a stage starts with the instances kept for it; the rest it still needs are requested;
* the next stage's extra instances are requested once the stage's estimated remaining time drops to the lead
  time (a start-up quantile);
* an idle instance is kept for the next stage only while those still busy cannot fill it; else it goes at once
  — to another lane waiting for its type (parallel brackets), else released;
* an instance with a preemption notice takes nothing more and goes once its trials stopped; a lost or noticed
  instance is replaced while its stage still needs it (:class:`~rubberband.executor.decisions.LossPolicy`);
* after a re-plan, instances that no longer fit a changed stage's type, market or count go.
"""

from __future__ import annotations

from typing import Iterator, Sequence

from rubberband.executor.actions import Action, HandOver, KeepInstance, ReleaseInstance, RequestInstances
from rubberband.executor.decisions import LossPolicy, mean_task_s
from rubberband.executor.instances import PoolInstance
from rubberband.executor.lanes import Lane, Waiting
from rubberband.executor.runstate import SPOT_INTERRUPTION
from rubberband.executor.scheduling import RunView
from rubberband.plan import StagePlan
from rubberband.planner.policies import PrefetchPolicy


class LaneInstances:
    """Keep, request, release and hand over a lane's instances (see the module docstring).

    ``elastic``: False holds every instance to the end (the static baseline, for benchmarks).
    """

    def __init__(self, prefetch: PrefetchPolicy, loss_policy: LossPolicy, *, elastic: bool = True) -> None:
        self.prefetch = prefetch
        self.loss_policy = loss_policy
        self.elastic = elastic

    # -- a stage's start ------------------------------------------------------------------------------
    def claim(self, lane: Lane, lanes: Sequence[Lane], view: RunView) -> Iterator[Action]:
        """Give the lane's new stage its instances: keep idle ones of earlier stages that serve it (its lane's, or
        any lane's before it when lanes run one after another), let go the rest, request what is missing."""
        g = lane.g
        assert g is not None
        stage = view.plan.stage(g)
        first = 0 if not view.plan.layout.parallel else lane.first
        busy = {i for other in lanes for i in other.busy_instances()}
        for entry in view.alive():
            if not first <= entry.assigned_stage < g or entry.id in busy:
                continue
            if view.plan.serves(entry, stage) and (len(view.of_stage(g)) < stage.instances or not self.elastic):
                yield KeepInstance(entry.token, g)
            else:
                yield from self.let_go(entry, f"not needed by stage {g}", g, view)
        missing = stage.instances - len(view.of_stage(g))
        if lane.pending and missing > 0:
            yield RequestInstances(stage=g, count=missing, trigger="start", waiting=len(lane.pending))

    def refill(self, lane: Lane, view: RunView) -> Iterator[Action]:
        """Trials wait and the stage has no instance left (none running, none coming): request its instances."""
        g = lane.g
        if g is None or not lane.pending or view.of_stage(g):
            return
        yield RequestInstances(
            stage=g,
            count=view.plan.stage(g).instances,
            trigger="start",
            waiting=len(lane.pending),
            reason="no instance left for the stage's trials",
        )

    # -- ahead of the next stage ----------------------------------------------------------------------
    def prefetch_next(self, lane: Lane, view: RunView) -> Iterator[Action]:
        """The next stage's extra instances, requested once this stage's remaining time ≤ the lead time."""
        wait = self.prefetch_wait_s(lane, view)
        if wait is not None and wait[0] <= 0:
            g, nxt_g = lane.g, view.plan.layout.next_stage(lane.g or 0)
            assert g is not None and nxt_g is not None
            remaining, lead, extra = wait[1], wait[2], wait[3]
            yield RequestInstances(
                stage=nxt_g,
                count=extra,
                trigger="prefetch",
                waiting=len(lane.pending),
                prefetch=(remaining, lead),
                at=g,
            )

    def prefetch_wait_s(self, lane: Lane, view: RunView) -> tuple[float, float, float, int] | None:
        """(seconds until the next stage's extra instances are due, the estimated remaining time, the lead time,
        how many) — None when there is nothing to request ahead, or nothing to time it by yet."""
        g = lane.g
        nxt_g = None if g is None else view.plan.layout.next_stage(g)
        if g is None or nxt_g is None or nxt_g in view.choices.prefetched:
            return None
        stage, nxt = view.plan.stage(g), view.plan.stage(nxt_g)
        reusable = self.prefetch.carried(view.plan.same_type(stage, nxt), stage.instances, nxt.instances)
        extra = nxt.instances - reusable - len(view.of_stage(nxt_g))
        n_slots = max(1, len(lane.slots))
        per_trial = mean_task_s(lane.trial_seconds, stage, slots=n_slots)  # the plan's: timed as predicted
        mine = view.running_of(lane.bracket)
        if extra <= 0 or per_trial is None or not (mine or lane.trial_seconds):
            return None
        now = view.now()
        remaining = self.prefetch.remaining_s(
            per_trial_s=per_trial,
            waiting=len(lane.pending),
            slots=n_slots,
            running_elapsed_s=[now - r.started_at for r in mine],
        )
        lead = view.lead_s(view.plan.stage_itype(nxt))
        return remaining - lead, remaining, lead, extra

    # -- idle, noticed and surplus instances -----------------------------------------------------------
    def release_noticed(self, lane: Lane, view: RunView) -> Iterator[Action]:
        """A noticed instance whose trials have stopped takes no more: its slots go and it is released now."""
        noticed = view.choices.noticed
        g = lane.g
        if not noticed or g is None:
            return
        busy = lane.busy_instances()
        nxt = view.plan.layout.next_stage(g)
        for entry in view.of_stage(g) + (view.of_stage(nxt) if nxt is not None else []):
            if entry.id in noticed and entry.id not in busy and entry.ready:
                lane.drop_instances({entry.id})
                yield ReleaseInstance(entry.token, "preemption notice", g)

    def release_idle(self, lane: Lane, view: RunView, *, stage_done: bool = False) -> Iterator[Action]:
        """No waiting trials: keep idle instances the next stage can use, let the rest go now."""
        g = lane.g
        assert g is not None
        nxt_g = view.plan.layout.next_stage(g)
        nxt = view.plan.stage(nxt_g) if nxt_g is not None else None
        if not self.elastic:
            if nxt_g is not None and stage_done:
                for entry in view.of_stage(g):
                    yield KeepInstance(entry.token, nxt_g)
            if nxt_g is not None or not stage_done:
                return
        busy = lane.busy_instances()
        noticed = view.choices.noticed
        moving = {i for i in busy if i in noticed}
        pool = view.of_stage(g)
        later = self._carriable(nxt, [p for p in pool if p.id in busy], view)
        for entry in pool:
            if entry.id in busy:  # a still-booting instance is idle too: kept or let go at once
                continue
            if entry.replaces in moving and not stage_done:  # its trials come over at their next checkpoint
                continue
            same = self._carriable(nxt, [entry], view) == 1
            kept = len(view.of_stage(nxt_g)) if nxt_g is not None else 0
            if nxt is not None and nxt_g is not None and self.prefetch.keep_for_next(same, kept, nxt.instances, later):
                yield KeepInstance(entry.token, nxt_g)
            else:
                yield from self.let_go(entry, f"idle: stage {g} needs it no more", g, view)

    @staticmethod
    def _carriable(nxt: StagePlan | None, entries: list[PoolInstance], view: RunView) -> int:
        """How many of ``entries`` the stage ``nxt`` could keep: its type and market, and no preemption notice."""
        if nxt is None:
            return 0
        noticed = view.choices.noticed
        return sum(1 for e in entries if view.plan.serves(e, nxt) and e.id not in noticed)

    def follow_replan(self, changed: Sequence[int], lanes: Sequence[Lane], view: RunView) -> Iterator[Action]:
        """A re-plan changed stages not started yet: instances kept, prefetched or requested for a changed stage
        that no longer fit its type, market or count go (the ones up stay first)."""
        noticed = view.choices.noticed
        for i in changed:
            if i in view.state.stages:
                continue
            new = view.plan.stage(i)
            pool = view.of_stage(i)
            fitting = sorted(
                (e for e in pool if view.plan.serves(e, new) and e.id not in noticed), key=lambda e: not e.ready
            )
            for entry in [e for e in pool if e not in fitting] + fitting[new.instances :]:
                for lane in lanes:  # a kept instance may still have (free) slots in its current stage
                    if entry.id is not None:
                        lane.drop_instances({entry.id})
                yield from self.let_go(
                    entry, f"re-planned: stage {i} runs {new.instances} × {new.instance_type}", i, view
                )

    def let_go(self, entry: PoolInstance, why: str, g: int, view: RunView) -> Iterator[Action]:
        """An instance a lane no longer needs: handed to another lane waiting for its type (parallel brackets; not
        a noticed one: the cloud takes it back), else released."""
        if entry.released:
            return
        layout = view.plan.layout
        if entry.id is not None and entry.id not in view.choices.noticed and layout.parallel:
            giver = layout.lane_of(entry.assigned_stage)
            waiting = [
                Waiting(
                    w.entry.token, layout.lane_of(w.entry.assigned_stage), w.entry.assigned_stage, w.order, w.queued
                )
                for w in view.waiting_for(entry)
            ]
            pick = layout.receiver(giver, waiting)
            if pick is not None:
                yield HandOver(entry.token, pick.token)
                return
        yield ReleaseInstance(entry.token, why, g)

    # -- replacements ---------------------------------------------------------------------------------
    def replace_lost(self, ident: str, reason: str, lane: Lane | None, view: RunView, current: int) -> Iterator[Action]:
        """A lost instance is replaced while its stage still needs it, up to the loss limit (not twice: one whose
        notice came was replaced then)."""
        entry = view.entry(ident)
        if entry is None or ident in view.choices.replaced:
            return
        pending = lane.pending if lane is not None and lane.g is not None else []
        if self.loss_policy.replace(
            serves=entry.assigned_stage, current=current, work_left=bool(pending), losses=view.choices.counted_losses
        ):
            trigger = (
                "notice" if ident in view.choices.noticed else "preemption" if reason == SPOT_INTERRUPTION else "lost"
            )
            yield RequestInstances(
                stage=entry.assigned_stage,
                count=1,
                trigger=trigger,
                waiting=len(pending),
                replaces=ident,
                reason=reason,
                at=current,
            )

    def replace_noticed(
        self, ident: str, trials: Sequence[str], lane: Lane | None, view: RunView, current: int
    ) -> Iterator[Action]:
        """A noticed instance is replaced now when its stage (or the next it is kept for) still needs it."""
        entry = view.entry(ident)
        if entry is None or entry.released or ident in view.choices.replaced:
            return
        pending = lane.pending if lane is not None and lane.g is not None else []
        if LossPolicy.needed(serves=entry.assigned_stage, current=current, work_left=bool(pending or trials)):
            yield RequestInstances(
                stage=entry.assigned_stage,
                count=1,
                trigger="notice",
                waiting=len(pending) + len(trials),
                replaces=ident,
                reason="preemption-notice",
                at=current,
            )
