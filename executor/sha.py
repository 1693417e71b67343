"""Successive halving and Hyperband on lanes: one scheduler for SHA, sequential and parallel brackets.

:class:`ShaScheduler` holds one :class:`~rubberband.executor.lanes.Lane` per bracket and the plan's
:class:`~rubberband.executor.lanes.LaneLayout` says how they follow each other (one after another, or side by
side from their offsets, handing instances over). Each lane runs its bracket's stages in order, each on the
stage's planned type, count and workers per trial; the objects it hands a lane to do the rest:

* :class:`~rubberband.executor.stage_running.StageRunning` — a stage's trials, where each resumes, placement on
  free slots (waves), results;
* :class:`~rubberband.executor.lane_instances.LaneInstances` — keep, request ahead, release, hand over and
  replace the lane's instances (the planner's own :class:`~rubberband.planner.policies.PrefetchPolicy`);
* :class:`~rubberband.executor.boundaries.Boundaries` — the barrier, ranking and promotion of the top 1/η;
* :class:`~rubberband.executor.lane_outlook.LaneOutlook` — the work left, for spot decisions and re-plans.

At each boundary — before a bracket's next stage, and before a bracket's first stage when it starts after the
job (the next bracket of a sequential plan, a parallel bracket at its offset) — it asks for a re-plan; once
failover finds a planned type of the remaining work unavailable, at once.
"""

from __future__ import annotations

from typing import Iterator

from rubberband.executor.actions import Action, Replan, RequestInstances
from rubberband.executor.boundaries import Boundaries
from rubberband.executor.decisions import LossPolicy, rank
from rubberband.executor.lane_instances import LaneInstances
from rubberband.executor.lane_outlook import LaneOutlook
from rubberband.executor.lanes import Lane
from rubberband.executor.observations import (
    Begin,
    InstancesLost,
    InstanceUp,
    NoticeSeen,
    Observation,
    PlanFollowed,
    Tick,
    TrialEnded,
)
from rubberband.executor.scheduling import RunView
from rubberband.executor.stage_running import StageRunning
from rubberband.planner.policies import PrefetchPolicy
from rubberband.spec import Metric


class ShaScheduler:
    """SHA / Hyperband on lanes (see the module docstring). ``metric``: the spec's (name, mode); ``elastic``: False
    holds every instance to the end (the static baseline, for benchmarks); ``ask_at_start``: each configuration
    is asked as its trial starts (a sampler that learns), not when its bracket opens."""

    def __init__(
        self,
        *,
        metric: Metric,
        prefetch: PrefetchPolicy,
        loss_policy: LossPolicy,
        elastic: bool = True,
        ask_at_start: bool = False,
    ) -> None:
        self.lanes: list[Lane] = []
        self.prefetch = prefetch
        self.outlook = LaneOutlook(self.lanes, prefetch)
        self.stages = StageRunning(metric.name, ask_at_start=ask_at_start)
        self.instances = LaneInstances(prefetch, loss_policy, elastic=elastic)
        self.boundaries = Boundaries(metric.mode)
        self.mode = metric.mode
        self.finals: dict[str, float | None] = {}
        self._resumed_started = False

    # -- the seam ---------------------------------------------------------------------------------------
    @property
    def finished(self) -> bool:
        return bool(self.lanes) and all(lane.done for lane in self.lanes)

    def best(self) -> tuple[str | None, float | None]:
        if not self.finals:
            return None, None
        best = rank(self.finals, self.mode, sorted(self.finals))[0]
        return best, self.finals[best]

    def progress(self) -> tuple[int, int, int]:
        active = [lane for lane in self.lanes if lane.g is not None]
        if not active:
            return 0, 0, 0
        ahead = max(active, key=lambda lane: lane.g or 0)
        return ahead.g or 0, ahead.bracket, sum(len(lane.pending) for lane in active)

    def next_tick_s(self, view: RunView) -> float | None:
        """A parallel bracket's offset, or a lane's prefetch moment, whichever comes first."""
        layout, elapsed = view.plan.layout, view.elapsed()
        waits = []
        if layout.parallel:
            waits += [off - elapsed for lane, off in zip(self.lanes, layout.offsets_s) if not lane.started]
        for lane in self.lanes:
            due = self.instances.prefetch_wait_s(lane, view)
            if due is not None:
                waits.append(due[0])
        return max(0.0, min(waits)) if waits else None

    def work_left_s(self, g: int, *, waiting: int, awaited_s: float, view: RunView) -> float:
        return self.outlook.work_left_s(g, waiting=waiting, awaited_s=awaited_s, view=view)

    def per_trial_s(self, g: int, view: RunView) -> float:
        return self.outlook.per_trial_s(g, view)

    def on(self, observation: Observation, view: RunView) -> Iterator[Action]:
        if isinstance(observation, Tick):
            yield from self._tick(view)
        elif isinstance(observation, TrialEnded):
            yield from self._ended(observation, view)
        elif isinstance(observation, InstanceUp):
            yield from self._up(observation, view)
        elif isinstance(observation, InstancesLost):
            yield from self._lost(observation, view)
        elif isinstance(observation, NoticeSeen):
            yield from self._noticed(observation, view)
        elif isinstance(observation, PlanFollowed):
            yield from self.instances.follow_replan(observation.changed, self.lanes, view)
        elif isinstance(observation, Begin):
            yield from self._begin(view)

    # -- the start ----------------------------------------------------------------------------------------
    def _begin(self, view: RunView) -> Iterator[Action]:
        """Open a lane per bracket (brackets finished before a resume are done) and request the instances of
        every lane that starts now, before the driver even connects (the first nodes boot meanwhile)."""
        layout, state = view.plan.layout, view.state
        done = set(state.completed_stages())
        self.lanes[:] = layout.lanes([view.plan.stage(lo).bracket for lo, _ in layout.ranges])
        for lane in self.lanes:
            if all(g in done for g in range(lane.first, lane.end)):
                lane.started = lane.done = True
                self.finals.update(state.stages[lane.end - 1].metrics)
        started, finished = [lane.started for lane in self.lanes], [lane.done for lane in self.lanes]
        for b in layout.due(view.elapsed(), started, finished):
            lane = self.lanes[b]
            g = next(i for i in range(lane.first, lane.end) if i not in done)
            if g not in state.stages and state.stages:  # a boundary under way: re-planned before it starts
                continue
            missing = view.plan.stage(g).instances - len(view.of_stage(g))
            if missing > 0:
                yield RequestInstances(stage=g, count=missing, trigger="start", waiting=view.plan.stage(g).trials)
            yield from self._prefetched_again(g, view)

    def _prefetched_again(self, g: int, view: RunView) -> Iterator[Action]:
        """A resumed run whose next stage's instances were requested ahead (they went with the orphans): asked
        for again now, as the decision stands (not journaled again)."""
        nxt = view.plan.layout.next_stage(g)
        if nxt is None or nxt not in view.choices.prefetched or nxt in view.state.stages:
            return
        stage, following = view.plan.stage(g), view.plan.stage(nxt)
        carried = self.prefetch.carried(view.plan.same_type(stage, following), stage.instances, following.instances)
        extra = following.instances - carried - len(view.of_stage(nxt))
        if extra > 0:
            yield RequestInstances(stage=nxt, count=extra, trigger="prefetch", at=g)

    def _start_resumed(self, view: RunView) -> Iterator[Action]:
        """Lanes a resumed run had under way go on at once (one stopped exactly at a boundary is re-planned)."""
        self._resumed_started = True
        state = view.state
        done = set(state.completed_stages())
        for b in view.plan.layout.start_order(range(len(self.lanes))):
            lane = self.lanes[b]
            if lane.done or not any(g in state.stages for g in range(lane.first, lane.end)):
                continue
            lane.started = True
            g = next(g for g in range(lane.first, lane.end) if g not in done)
            if g > lane.first and g not in state.stages:
                yield Replan(g, b)
            yield from self._open(lane, g, view)

    def _start_due(self, view: RunView) -> Iterator[Action]:
        """Start the lanes that are due: at their offset (parallel) or once the one before is done (sequential).
        A lane starting after the job started is a boundary too: re-planned before its first stage."""
        layout = view.plan.layout
        started, done = [lane.started for lane in self.lanes], [lane.done for lane in self.lanes]
        for b in layout.due(view.elapsed(), started, done):
            lane = self.lanes[b]
            lane.started = True
            later = layout.offsets_s[b] > 0 if layout.parallel else b > 0
            if later and lane.first not in view.state.stages:
                yield Replan(lane.first, b)
            yield from self._open(lane, lane.first, view)

    def _open(self, lane: Lane, g: int, view: RunView, promoted: tuple[str, ...] | None = None) -> Iterator[Action]:
        yield from self.stages.open(lane, g, view, promoted)
        yield from self.instances.claim(lane, self.lanes, view)

    # -- each wake ------------------------------------------------------------------------------------------
    def _tick(self, view: RunView) -> Iterator[Action]:
        if not self._resumed_started:
            yield from self._start_resumed(view)
        yield from self._start_due(view)
        for b, lane in enumerate(self.lanes):
            if lane.g is not None:
                yield from self._tend(b, lane, view)
        yield from self._start_due(view)  # a sequential lane whose predecessor just ended
        for lane in self.lanes:
            yield from self.stages.fill(lane, view)

    def _tend(self, b: int, lane: Lane, view: RunView) -> Iterator[Action]:
        """Release what the lane's stage needs no more, request its next stage's instances when due, and cross the
        stage's boundary at its barrier."""
        yield from self.instances.release_noticed(lane, view)
        yield from self.instances.refill(lane, view)
        if not lane.pending:
            yield from self.instances.release_idle(lane, view)
        yield from self.instances.prefetch_next(lane, view)
        if not self.prefetch.may_promote(len(lane.pending) + len(view.running_of(lane.bracket))):
            return
        yield from self.instances.release_idle(lane, view, stage_done=True)
        crossing = yield from self.boundaries.cross(lane, view)
        if crossing.next_stage is None:
            lane.g, lane.done = None, True
            self.finals.update(crossing.finals)
            return
        yield Replan(crossing.next_stage, b)
        yield from self._open(lane, crossing.next_stage, view, crossing.promoted)

    # -- what happened -----------------------------------------------------------------------------------------
    def _lane_of_trial(self, trial_id: str, view: RunView) -> Lane | None:
        trial = view.trial(trial_id)
        return next((lane for lane in self.lanes if trial is not None and lane.bracket == trial.bracket), None)

    def _lane_of_stage(self, g: int, view: RunView) -> Lane:
        return self.lanes[view.plan.layout.lane_of(g)]

    def _ended(self, ended: TrialEnded, view: RunView) -> Iterator[Action]:
        lane = self._lane_of_trial(ended.trial_id, view)
        if lane is not None and lane.g == ended.stage:
            yield from self.stages.take(lane, ended, view)

    def _up(self, up: InstanceUp, view: RunView) -> Iterator[Action]:
        """An instance came up: one no longer wanted goes (handed over or released); a planned type found
        unavailable since the last failover re-plan has the remaining work re-planned now."""
        entry = view.request(up.token)
        if entry.unwanted:
            entry.unwanted = False
            yield from self.instances.let_go(entry, "no longer needed when it came up", entry.assigned_stage, view)
        chains = self.outlook.remainder(view, None, timed=False)
        stages = [view.plan.stage(i) for c in chains for i in c.positions]
        if stages and set(view.unavailable(stages)) - view.choices.replanned_around:
            yield Replan(stage=chains[0].positions[0] if chains[0].positions else 0, lane=None)

    def _lost(self, lost: InstancesLost, view: RunView) -> Iterator[Action]:
        """Trials the loss stopped go first again in their lanes; the lost instances' slots go; each is replaced
        while its stage still needs it."""
        for lane in self.lanes:
            mine = [t for t in lost.trials if (trial := view.trial(t)) is not None and trial.bracket == lane.bracket]
            self.stages.requeue(lane, mine, view)
            lane.drop_instances(set(lost.lost))
        for ident, reason in lost.lost.items():
            entry = view.entry(ident)
            served = self._lane_of_stage(entry.assigned_stage, view) if entry is not None else None
            current = served.g if served is not None and served.g is not None else lost.stage.get(ident, 0)
            yield from self.instances.replace_lost(ident, reason, served, view, current)

    def _noticed(self, seen: NoticeSeen, view: RunView) -> Iterator[Action]:
        entry = view.entry(seen.instance_id)
        lane = self._lane_of_stage(entry.assigned_stage, view) if entry is not None else None
        current = lane.g if lane is not None and lane.g is not None else seen.stage
        yield from self.instances.replace_noticed(seen.instance_id, seen.trials, lane, view, current)
