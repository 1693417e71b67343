"""Parallel Hyperband brackets: every bracket a lane of one controller loop, instances handed between them.

A plan with ``brackets: parallel`` (docs/plan.md) runs Hyperband's brackets side by side, as
:class:`~rubberband.planner.brackets.ParallelSimulator` predicts: bracket ``b`` starts
``bracket_offsets_s[b]`` seconds after the job starts, and runs its own stages in order, each on
the stage's planned type, count and workers per trial, with the sequential controller's rules
inside a bracket (slots and waves, carry-over to the bracket's next stage, ahead-of-time requests
timed by :class:`~rubberband.planner.policies.PrefetchPolicy`, early release of idle instances).

:class:`ParallelController` is the :class:`~rubberband.executor.controller.Controller` with its
stage loop replaced by one loop over :class:`Lane` s (one per bracket): each pass it starts the
brackets that are due, gives every running stage its free slots, collects finished trials (one
``ray.wait`` over all of them) and finishes, promotes and starts stages bracket by bracket.
Everything else — provisioning, failover, lost instances, the journal, teardown, ``result.json``
— is the controller's own code.

**Hand-overs** (the simulator's rule): an instance a bracket releases is handed to another
bracket that is waiting for a new instance of the same type (its request not yet up) instead of
being terminated. The waiting request is cancelled when it has not gone out yet (the provisioner
serves requests one at a time), else the instance it brings up is released as soon as it is up
(or handed on in turn). Which request is served is the pure :class:`BracketPolicy`'s decision.

**Spot** (the controller's own code, per lane): a spot stage's requests go through the controller's
:class:`~rubberband.planner.policies.SpotPolicy` decision, preemption notices are taken by the lane whose
stage the instance serves (its trials stop after their checkpoint and go first in its queue; a noticed
instance takes no more trials and is never handed over), and a lost one is replaced as in a sequential run.
The policy's work left is the run's critical path: the longest remaining bracket
(:meth:`ParallelController._work_left_s`).

**Re-planning** at every bracket's stage boundary (before a bracket's next stage, and before a bracket's
first stage when it starts at its offset), as a sequential run does at its boundaries: the remaining work is
every bracket's stages not started yet — the bracket at its boundary from the stage it starts now, a running
bracket from the stage after its current one (which starts once the current one's estimated remaining time has
passed), a bracket not started yet from its first stage at its offset
(:func:`~rubberband.planner.brackets.parallel_remainder`). The re-planner plans that remainder with the
brackets side by side at those offsets, and the controller's own decision (the
:class:`~rubberband.planner.policies.LatenessPolicy`: go on, save, buy speed, finish late, stop) and journal
follow. A taken plan is applied by the lanes: instances kept, prefetched or requested for a re-planned stage
that no longer fit its type, market or count are released (or handed to a bracket waiting for their type),
its prefetch is timed again, and its stage requests the new type when it starts.

**Re-planning after a failover** (:meth:`ParallelController._replan_on_failover`): once failover finds a type
planned for the remaining work unavailable (every zone blocked, or another type obtained in its place), the next
pass of the loop re-plans that same remainder of every bracket without it, not waiting for a boundary; the bracket
whose next stage can start first goes first, the others' offsets count from then. It is the sequential run's
failover re-plan (:meth:`~rubberband.executor.controller.Controller._replan_around`): the re-planner with the
unavailable types excluded, else (none, or an unusable proposal) each stage's stand-in — journaled alike
(``decision`` kind ``replan``, ``trigger: failover``, ``unavailable``, ``source``, then ``plan_changed``, which a
resumed run follows) and applied by the lanes as above. Stages already running go on with the type failover
obtained. Each unavailable type is re-planned around once; a boundary that sees one first makes its re-plan this
one.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Sequence

from rubberband.errors import ExecutionError
from rubberband.executor import journal as J
from rubberband.executor import spot as S
from rubberband.executor.controller import LIVENESS_EVERY_S, Controller, PoolInstance
from rubberband.executor.decisions import promote, rank
from rubberband.executor.runtime import ReplanRequest
from rubberband.executor.placement import Slot, make_slots, slot_count
from rubberband.plan import Plan, StagePlan
from rubberband.planner.brackets import Remainder, bracket_ranges, parallel_remainder
from rubberband.planner.policies import bracket_start_order


# -- the pure part ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Waiting:
    """A request for an instance that is not up yet: who asked, and whether it has gone out."""

    token: str
    bracket: int
    stage: int  # plan position of the stage it is for
    order: int  # request order (earlier requests would be up first)
    queued: bool  # not yet sent to the provider: cancelling it costs nothing


@dataclass(frozen=True)
class BracketPolicy:
    """When brackets start, which stage follows which, and which waiting request a released instance serves.

    ``ranges``: (first, end) plan positions of each bracket's stages; ``offsets_s``: each bracket's
    start after the job's. Pure: no I/O, no clock.
    """

    ranges: tuple[tuple[int, int], ...]
    offsets_s: tuple[float, ...]
    durations_s: tuple[float, ...] = ()  # each bracket's predicted duration (its stages' p50s added)

    @classmethod
    def for_plan(cls, plan: Plan) -> "BracketPolicy":
        ranges = bracket_ranges(plan.stages)
        offsets = list(plan.bracket_offsets_s) if plan.parallel_brackets else []
        offsets = (offsets + [0.0] * len(ranges))[: len(ranges)]
        durations = [sum(s.predicted_duration_s or 0.0 for s in plan.stages[lo:hi]) for lo, hi in ranges]
        return cls(tuple(ranges), tuple(float(o) for o in offsets), tuple(durations))

    def bracket_of(self, g: int) -> int:
        """The bracket (its position) stage ``g`` belongs to."""
        return next(b for b, (lo, hi) in enumerate(self.ranges) if lo <= g < hi)

    def next_stage(self, g: int) -> int | None:
        """The stage after ``g`` in its bracket (None after the bracket's last)."""
        lo, hi = self.ranges[self.bracket_of(g)]
        return g + 1 if g + 1 < hi else None

    def due(self, elapsed_s: float, started: Sequence[bool]) -> list[int]:
        """Brackets not started yet whose start offset has passed (``elapsed_s`` since the job started), in
        the order their instances are requested (:meth:`start_order`)."""
        return self.start_order(
            [b for b, (off, on) in enumerate(zip(self.offsets_s, started)) if not on and elapsed_s >= off]
        )

    def start_order(self, brackets: Sequence[int]) -> list[int]:
        """Brackets that start together, the one predicted to end last first: where instances come up one
        after another (the local backend), the critical path gets the first one."""
        return bracket_start_order(
            {b: self.offsets_s[b] + (self.durations_s[b] if b < len(self.durations_s) else 0.0) for b in brackets}
        )

    @staticmethod
    def receiver(giver_bracket: int, waiting: Sequence[Waiting]) -> Waiting | None:
        """The request of another bracket a released instance of the same type serves, if any.

        A request that has not gone out is served first (cancelling it saves its whole bill, as the
        simulator counts a hand-over); among equals the earliest request (it would be up first: the
        simulator serves requests in order of their ready times).
        """
        others = [w for w in waiting if w.bracket != giver_bracket]
        if not others:
            return None
        return min(others, key=lambda w: (not w.queued, w.order))


# -- the loop --------------------------------------------------------------------------------


@dataclass
class Lane:
    """One bracket's progress: the stage it runs and that stage's trials and slots."""

    bracket: int
    first: int
    end: int
    started: bool = False
    g: int | None = None  # plan position of the stage it runs; None before its start and after its end
    done: bool = False
    trials: list[str] = field(default_factory=list)
    pending: list[tuple[str, int]] = field(default_factory=list)
    slots: list[Slot] = field(default_factory=list)
    metrics: dict[str, float | None] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)
    trial_seconds: list[float] = field(default_factory=list)


class ParallelController(Controller):
    """Runs a parallel-bracket plan (see the module docstring); a sequential plan runs as the Controller runs it."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.brackets = BracketPolicy.for_plan(self.plan)
        self.lanes: list[Lane] = []
        self._replanned_around: set[str] = set()  # unavailable type keys a failover re-plan has answered

    # -- entry: the stage loop --------------------------------------------------------------
    def _run_stages(self) -> tuple[str | None, float | None]:
        if not self.plan.parallel_brackets:
            return super()._run_stages()
        done = set(self.state.completed_stages())
        finals = self._open_lanes()
        for b in self.brackets.start_order(range(len(self.lanes))):
            lane = self.lanes[b]
            if not lane.done and any(g in self.state.stages for g in range(lane.first, lane.end)):
                lane.started = True  # it ran before a resume: go on at once
                g = next(g for g in range(lane.first, lane.end) if g not in done)
                if g > lane.first and g not in self.state.stages:  # stopped exactly at its boundary
                    self._replan_lanes(lane, g)
                self._start_stage(lane, g)
        while not all(lane.done for lane in self.lanes):
            self._check_deadline()
            self._collect_provisioned()
            self._replan_on_failover()
            self._collect_terminations()
            self._start_due(self.clock.time() - self.state.first_started_at)
            self._liveness()
            for lane in self._active():
                self._fill_slots(lane)
            finished = self._wait_some()
            by_lane: dict[int, list] = {}
            for run in finished:
                b = self._lane_of_trial(run.trial_id)
                by_lane.setdefault(b, []).append(run)
            for b, runs in by_lane.items():
                self._collect(self.lanes[b], runs)
            for lane in self._active():
                finals.update(self._tend_lane(lane))
            active = self._active()
            if active:
                g = max(lane.g for lane in active)
                self._report_progress(g, sum(len(lane.pending) for lane in active))
        if not finals:
            return None, None
        best = rank(finals, self.spec.metric.mode, sorted(finals))[0]
        return best, finals[best]

    def _start_due(self, elapsed: float) -> None:
        """Start the brackets whose offset has passed (``elapsed`` since the job started). A bracket starting
        after the job's start is a boundary too: the run is re-planned before its first stage starts."""
        for b in self.brackets.due(elapsed, [lane.started for lane in self.lanes]):
            lane = self.lanes[b]
            lane.started = True
            if self.brackets.offsets_s[b] > 0 and lane.first not in self.state.stages:
                self._replan_lanes(lane, lane.first)
            self._start_stage(lane, lane.first)

    def _open_lanes(self) -> dict[str, float | None]:
        """A lane per bracket (finished brackets done already); returns the final metrics of those."""
        done = set(self.state.completed_stages())
        finals: dict[str, float | None] = {}
        self.lanes = []
        for lo, hi in self.brackets.ranges:
            lane = Lane(bracket=self.plan.stages[lo].bracket, first=lo, end=hi)
            for g in range(lo, hi):
                if g not in done:
                    break
                if g + 1 == hi:
                    finals.update(self.state.stages[g].metrics)
            else:
                lane.started = lane.done = True
            self.lanes.append(lane)
        return finals

    def _tend_lane(self, lane: Lane) -> dict[str, float | None]:
        """After a pass's trials are collected: release what the lane's stage needs no more, request its next stage's
        instances when due, and finish the stage at its barrier. Returns the bracket's final metrics (last stage)."""
        g = lane.g
        self.stage_index = g
        self._release_noticed(g, lane.slots)
        if lane.pending and not self._stage_pool(g):  # every instance went (noticed, lost): the stage needs one
            self._refill(g, self.plan.stages[g], lane.pending)
        if not lane.pending:
            self._release_lane_idle(lane)
        self._prefetch_next(lane)
        if self.prefetch.may_promote(len(lane.pending) + self._running_in(lane)):
            return self._finish_stage(lane)
        return {}

    def _active(self) -> list[Lane]:
        return [lane for lane in self.lanes if lane.g is not None]

    def _lane_of_trial(self, trial_id: str) -> int:
        bracket = self.state.trials[trial_id].bracket
        return next(b for b, lane in enumerate(self.lanes) if lane.bracket == bracket)

    def _lane_of_stage(self, g: int) -> Lane:
        return self.lanes[self.brackets.bracket_of(g)]

    def _running_in(self, lane: Lane) -> int:
        return sum(1 for run in self.running.values() if self.state.trials[run.trial_id].bracket == lane.bracket)

    # -- one bracket's stage ----------------------------------------------------------------
    def _start_stage(self, lane: Lane, g: int) -> None:
        """Start stage ``g`` of the lane's bracket: its trials (new ones for a first stage), pending list, instances."""
        stage = self.plan.stages[g]
        self.stage_index = g
        if stage.stage == 0:
            self._create_trials(stage)
        lane.g = g
        lane.trials = self._stage_trials(g)
        lane.pending, lane.slots, lane.metrics, lane.failures, lane.trial_seconds = [], [], {}, [], []
        for trial_id in lane.trials:
            trial = self.state.trials[trial_id]
            if g in trial.finished_stages:
                lane.metrics[trial_id] = trial.finished_stages[g]
                continue
            start = self._settle(g, stage, trial_id, self._start_epoch(trial_id, stage), lane.metrics)
            if start is not None:
                lane.pending.append((trial_id, start))
        self.journal.record(
            J.StageStarted(
                stage=g,
                bracket=stage.bracket,
                stage_in_bracket=stage.stage,
                trials=len(lane.trials),
                to_run=len(lane.pending),
                epochs=stage.epochs,
                instance_type=stage.instance_type,
                instances=stage.instances,
                workers_per_trial=stage.workers_per_trial,
                predicted_duration_s=stage.predicted_duration_s,
                offset_s=self.brackets.offsets_s[self.brackets.bracket_of(g)],
            )
        )
        missing = stage.instances - len(self._stage_pool(g))
        if lane.pending and missing > 0:
            spot = self._buy_spot(stage, trigger="start", waiting=len(lane.pending))
            itype = self._stage_itype(stage)
            for _ in range(missing):
                self._request(g, itype, spot)

    def _fill_slots(self, lane: Lane) -> None:
        """Slots on the stage's instances that came up (or were handed over); pending trials onto free slots."""
        g = lane.g
        stage = self.plan.stages[g]
        used = {i for s in lane.slots for i in s.instance_ids}
        unused = [p.id for p in self._stage_pool(g) if p.ready and p.id not in used and self._workers_up(p)]
        if unused:
            lane.slots.extend(make_slots(unused, self._stage_itype(stage).workers, stage.workers_per_trial))
        for slot in lane.slots:
            if not lane.pending:
                break
            if slot.free and not self._noticed.keys() & set(slot.instance_ids):  # a noticed instance takes none
                self.stage_index = g
                self._start_next(g, stage, lane.pending, slot, lane.metrics)

    def _collect(self, lane: Lane, runs: list) -> None:
        g = lane.g
        stage = self.plan.stages[g]
        lost_now: dict[str, str] = {}
        stopped: list[tuple[str, tuple[str, ...]]] = []
        preempted: list[str] = []  # instances whose trials stopped on a notice
        for run in runs:
            metric, error, seconds, lost = self._collect_trial(g, stage, run)
            run.slot.trial_id = None
            if run.preempted:  # first in line again, after its checkpoint, on another instance
                lane.pending.insert(0, (run.trial_id, self._start_epoch(run.trial_id, stage)))
                preempted.extend(run.slot.instance_ids)
                continue
            if lost:
                lost_now.update(lost)
                stopped.append((run.trial_id, run.slot.instance_ids))
                continue
            if not run.cold:
                lane.trial_seconds.append(seconds)
            if error:
                lane.failures.append(error)
            lane.metrics[run.trial_id] = metric
        if lost_now:
            self.stage_index = g
            self._handle_lost(g, lost_now, lane.slots, lane.pending, stopped=stopped)
        if preempted:  # the workers saw a notice first: take it now, before placing anything there again
            self._route_notices(ask=tuple(dict.fromkeys(preempted)))

    def _finish_stage(self, lane: Lane) -> dict[str, float | None]:
        """Rank, promote, journal; start the bracket's next stage. Returns the bracket's final metrics (last stage)."""
        g = lane.g
        stage = self.plan.stages[g]
        trials = lane.trials
        if trials and all(lane.metrics.get(t) is None for t in trials) and lane.failures:
            raise ExecutionError(f"all {len(trials)} trials of stage {g} failed; first error: {lane.failures[0]}")
        self._release_lane_idle(lane, stage_done=True)
        metrics = {t: lane.metrics.get(t) for t in trials}
        nxt = self.brackets.next_stage(g)
        ranking, promoted = promote(
            metrics, self.spec.metric.mode, trials, None if nxt is None else self.plan.stages[nxt].trials
        )
        for position, trial_id in enumerate(promoted):
            self.journal.record(
                J.TrialPromoted(trial_id=trial_id, from_stage=g, to_stage=nxt, metric=metrics[trial_id], rank=position)
            )
        self.journal.record(
            J.StageFinished(stage=g, bracket=stage.bracket, metrics=metrics, promoted=promoted, ranking=ranking)
        )
        self.search.rung_finished(stage.epochs, metrics, None if nxt is None else promoted)
        self.state = self.journal.state
        if nxt is None:
            lane.g, lane.done = None, True
            return metrics
        self._replan_lanes(lane, nxt)
        self._start_stage(lane, nxt)
        return {}

    # -- re-planning at a bracket's stage boundary, and after a failover ------------------------
    def _replan_lanes(self, lane: Lane, g: int) -> None:
        """At the boundary before stage ``g`` of ``lane``'s bracket: re-plan every bracket's remaining stages
        and decide as a sequential run does (:meth:`~rubberband.executor.controller.Controller._replan_decide`:
        go on, save, buy speed, finish late, or stop now — before ``g`` starts — with the best so far).

        The remaining time by the stage predictions (``predicted_remaining_s``, what ``at_risk`` compares with
        the deadline) is the longest bracket's: its wait (a running stage's estimated rest, or the time to its
        offset) plus its stages not started, scaled by the slowdown so far. When a planned type of the remainder
        turned unavailable since the last failover re-plan (:meth:`_replan_on_failover` has not seen it yet),
        the boundary's re-plan is that failover re-plan instead, as in a sequential run.
        """
        elapsed = self.clock.time() - self.state.first_started_at
        parts, kept, boundary = self._remainder_parts(elapsed, lane, g)
        rest = parallel_remainder(parts, boundary)
        request, decision, remaining_pred = self._remainder_request(g, elapsed, parts, kept, rest)
        if self._newly_unavailable(request.unavailable):
            self._replan_and_follow(g, lambda: self._replan_around(g, request, decision))
        else:
            self._replan_and_follow(g, lambda: self._replan_decide(g, request, decision, remaining_pred))

    def _replan_on_failover(self) -> None:
        """Failover found a planned type of the remaining work unavailable (every zone blocked, or another type
        obtained in its place): re-plan every bracket's remaining stages without it now, once per type.

        The remainder is the boundary re-plan's (:meth:`_remainder_parts`) with no bracket at a boundary: the
        bracket whose next stage can start first goes first, and the others' offsets count from then (the
        re-planner's "now", so its remaining deadline is shortened by that wait, journaled as ``starts_in_s``).
        The re-plan is the sequential run's (:meth:`~rubberband.executor.controller.Controller._replan_around`:
        the re-planner with those types excluded, else each replaced by its stand-in; ``decision`` kind
        ``replan`` with ``trigger: failover``, then ``plan_changed``) and a changed plan is followed by the lanes
        (:meth:`_apply_replan`). Stages already running go on with the type failover obtained. Called after each
        pass's provisioned instances are collected; cheap when nothing changed (the backend's blocked zones are
        looked up in memory).
        """
        if not self.plan.parallel_brackets or not self.lanes:
            return
        elapsed = self.clock.time() - self.state.first_started_at
        parts, _, _ = self._remainder_parts(elapsed, timed=False)  # every pass: the stages only, no estimates
        stages = [self.plan.stages[i] for positions, _ in parts for i in positions]
        if not stages or not self._newly_unavailable(self._unavailable(stages)):
            return  # nothing left to re-plan (every bracket in its last stage), or nothing new unavailable
        parts, kept, _ = self._remainder_parts(elapsed)
        waiting = [k for k, (positions, _) in enumerate(parts) if positions]
        first = min(waiting, key=lambda k: (max(0.0, parts[k][1]), k))
        shift = max(0.0, parts[first][1])
        rest = parallel_remainder([(positions, wait - shift) for positions, wait in parts], first)
        g = rest.positions[0]
        request, decision, _ = self._remainder_request(g, elapsed, parts, kept, rest, starts_in_s=round(shift, 3))
        request = replace(
            request,
            running=dict(request.bracket_running[0]),
            remaining_deadline_s=max(1.0, request.remaining_deadline_s - shift),
        )
        self._replan_and_follow(g, lambda: self._replan_around(g, request, decision))

    def _remainder_request(
        self,
        g: int,
        elapsed: float,
        parts: list[tuple[list[int], float]],
        kept: list[dict[str, int]],
        rest: Remainder,
        **fields: Any,
    ) -> tuple[ReplanRequest, dict[str, Any], float]:
        """The re-planner's request for ``rest`` (first stage ``g``), the ``replan`` decision record (with
        ``fields``) and the run's remaining time by the stage predictions (:meth:`_remaining_pred`)."""
        ratio = self._slowdown()
        remaining_pred = self._remaining_pred(parts, ratio)
        at_risk = elapsed + remaining_pred > self.deadline_s
        decision = dict(
            kind="replan",
            stage=g,
            elapsed_s=elapsed,
            predicted_remaining_s=remaining_pred,
            slowdown=ratio,
            at_risk=at_risk,
            bracket=self.plan.stages[g].bracket,
            stages=list(rest.positions),
            offsets_s=[round(o, 3) for o in rest.offsets_s],
            **fields,
        )
        request = self._replan_request(
            g,
            elapsed,
            at_risk,
            [self.plan.stages[i] for i in rest.positions],
            stages=rest.positions,
            offsets_s=rest.offsets_s,
            bracket_running=self._bracket_running(parts, kept, rest),
        )
        return request, decision, remaining_pred

    def _replan_and_follow(self, g: int, replan: Callable[[], None]) -> None:
        """Run ``replan`` (which may change the plan) as the re-plan before stage ``g``; the lanes follow a
        changed plan (:meth:`_apply_replan`)."""
        before = list(self.plan.stages)
        self.stage_index = g
        replan()
        if self.plan.stages != before:
            self._apply_replan(before)

    def _newly_unavailable(self, keys: Sequence[str]) -> bool:
        """Whether ``keys`` (unavailable type keys) hold one no failover re-plan has answered yet; from now on
        every one of them counts as answered (a type is re-planned around once, not on every request)."""
        new = [k for k in keys if k not in self._replanned_around]
        self._replanned_around.update(keys)
        return bool(new)

    def _remainder_parts(
        self, elapsed: float, lane: Lane | None = None, g: int | None = None, *, timed: bool = True
    ) -> tuple[list[tuple[list[int], float]], list[dict[str, int]], int]:
        """Each bracket's part of the remaining work (for :func:`~rubberband.planner.brackets.parallel_remainder`):
        (plan positions of its stages not started yet, seconds until the first of them can start), with the
        instances (type key → count) its next stage may keep, and the index of ``lane``'s part (at its boundary
        before stage ``g``; -1 without one). A running bracket goes on after its current stage's estimated rest
        (:meth:`_stage_rest_s`), a bracket not started yet at its offset; a done one has no part. Not ``timed``:
        the positions only (a running bracket's wait 0, nothing kept)."""
        done = set(self.state.completed_stages())
        parts: list[tuple[list[int], float]] = []
        kept: list[dict[str, int]] = []  # per part: instances of its bracket that its next stage may keep
        boundary = -1
        for b, other in enumerate(self.lanes):
            lo, hi = self.brackets.ranges[b]
            if other is lane:
                boundary = len(parts)
                parts.append((list(range(g, hi)), 0.0))
                kept.append(self._instance_counts([g]))
            elif other.done:
                continue
            elif other.g is not None:  # running: what follows its current stage, once that one ends
                parts.append((list(range(other.g + 1, hi)), self._stage_rest_s(other) if timed else 0.0))
                kept.append(self._instance_counts([other.g, other.g + 1]) if timed else {})
            else:  # not started yet: everything from its offset
                first = next((i for i in range(lo, hi) if i not in done), None)
                if first is not None:
                    parts.append((list(range(first, hi)), max(0.0, self.brackets.offsets_s[b] - elapsed)))
                    kept.append(self._instance_counts([first]))
        return parts, kept, boundary

    def _remaining_pred(self, parts: list[tuple[list[int], float]], ratio: float) -> float:
        """The run's remaining time by the stage predictions: the longest part's wait plus its stages' predicted
        durations times the slowdown so far (``ratio``)."""
        return max(
            (
                wait + ratio * sum(self.plan.stages[i].predicted_duration_s or 0.0 for i in positions)
                for positions, wait in parts
            ),
            default=0.0,
        )

    @staticmethod
    def _bracket_running(
        parts: list[tuple[list[int], float]], kept: list[dict[str, int]], rest: Remainder
    ) -> tuple[dict[str, int], ...]:
        """Per bracket of ``rest`` (in its order), what its next stage may keep (``ReplanRequest.bracket_running``)."""
        first_of = {positions[0]: k for k, (positions, _) in enumerate(parts) if positions}
        return tuple(kept[first_of[i]] for i in rest.positions if i in first_of)

    def _instance_counts(self, stages: list[int]) -> dict[str, int]:
        """Instances (up or coming) serving ``stages``, by type key: what a bracket's next stage can keep."""
        counts: dict[str, int] = {}
        for i in stages:
            if i < len(self.plan.stages):
                for entry in self._stage_pool(i):
                    counts[entry.itype.key] = counts.get(entry.itype.key, 0) + 1
        return counts

    def _stage_rest_s(self, lane: Lane) -> float:
        """The estimated remaining time of the stage ``lane`` runs (its running trials' rest and its waiting
        waves, as the prefetch estimate has it; plus the start-up lead while none of its instances is up)."""
        stage = self.plan.stages[lane.g]
        itype = self._stage_itype(stage)
        slots = max(1, slot_count(stage.instances, itype.workers, stage.workers_per_trial))
        now = self.clock.time()
        mine = [
            now - r.started_at for r in self.running.values() if self.state.trials[r.trial_id].bracket == lane.bracket
        ]
        booting = self._prefetch_lead(itype) if lane.pending and not lane.slots else 0.0
        return booting + self.prefetch.remaining_s(
            per_trial_s=self._per_trial_s(lane.g), running_elapsed_s=mine, waiting=len(lane.pending), slots=slots
        )

    def _apply_replan(self, before: list[StagePlan]) -> None:
        """A re-plan changed stages not started yet: the lanes follow it. Instances kept, prefetched or requested
        for a changed stage that no longer fit its type, market or count are released (handed to a bracket waiting
        for their type where one is); the stage's prefetch is timed again (:meth:`_prefetch_next`) and its start
        requests what it still lacks (:meth:`_start_stage`)."""
        self.brackets = BracketPolicy.for_plan(self.plan)
        for i, (old, new) in enumerate(zip(before, self.plan.stages)):
            if old == new or i in self.state.stages:
                continue
            pool = self._stage_pool(i)
            fitting = sorted(
                (e for e in pool if self._serves(e, new) and e.id not in self._noticed),
                key=lambda e: not e.ready,
            )  # the ones up stay
            surplus = [e for e in pool if e not in fitting] + fitting[new.instances :]
            for entry in surplus:
                if entry.id is None and entry.future is not None and entry.future.cancel():
                    entry.released = True  # not sent to the provider yet: nothing to boot, nothing billed
                    continue
                for other in self.lanes:  # a kept instance may still have (free) slots in its current stage
                    other.slots[:] = [s for s in other.slots if entry.id is None or entry.id not in s.instance_ids]
                self._release(entry, f"re-planned: stage {i} runs {new.instances} × {new.instance_type}")

    # -- instances --------------------------------------------------------------------------
    def _release_lane_idle(self, lane: Lane, *, stage_done: bool = False) -> None:
        """No pending trials: keep idle instances the bracket's next stage can use, release (or hand over) the rest."""
        g = lane.g
        busy = {i for s in lane.slots if not s.free for i in s.instance_ids}
        nxt_g = self.brackets.next_stage(g)
        nxt = self.plan.stages[nxt_g] if nxt_g is not None else None
        moving = {i for s in lane.slots if not s.free for i in s.instance_ids if i in self._noticed}
        pool = self._stage_pool(g)
        later = self._carriable(nxt, [p for p in pool if p.id in busy])
        for entry in pool:
            if entry.id in busy:
                continue
            if entry.replaces in moving and not stage_done:  # its trials come over at their next checkpoint
                continue
            same = self._carriable(nxt, [entry]) == 1
            if nxt is not None and self.prefetch.keep_for_next(
                same, len(self._stage_pool(nxt_g)), nxt.instances, later=later
            ):
                entry.assigned_stage = nxt_g
                self.journal.record(J.Decision(kind="keep", id=entry.id or entry.token, stage=nxt_g))
            else:
                self.stage_index = g
                self._release(entry, f"idle: stage {g} needs it no more")

    def _release(self, entry: PoolInstance, why: str) -> None:
        """Hand an instance that is up to another bracket waiting for its type; else release it as the controller does."""
        if entry.released:
            return
        if (
            entry.id is not None
            and entry.id not in self._noticed
            and self.plan.parallel_brackets
            and self.lanes
            and self._hand_over(entry)
        ):  # a noticed instance goes: the cloud takes it back
            return
        super()._release(entry, why)

    def _hand_over(self, entry: PoolInstance) -> bool:
        giver = self.brackets.bracket_of(entry.assigned_stage)
        waiting = []
        for order, p in enumerate(self.pool.values()):
            if p is entry or p.released or p.id is not None or p.future is None or p.future.done():
                continue
            if p.itype.key != entry.itype.key or p.spot != entry.spot:
                continue
            queued = not (p.future.running() or p.future.done())
            waiting.append(
                Waiting(p.token, self.brackets.bracket_of(p.assigned_stage), p.assigned_stage, order, queued)
            )
        pick = self.brackets.receiver(giver, waiting)
        if pick is None:
            return False
        target = self.pool[pick.token]
        cancelled = target.future.cancel()
        target.released = True  # cancelled; or released (or handed on) the moment it is up
        from_stage = entry.assigned_stage
        entry.assigned_stage = target.assigned_stage
        giver_lane = self.lanes[giver]
        giver_lane.slots[:] = [s for s in giver_lane.slots if entry.id not in s.instance_ids]
        self.journal.record(
            J.Decision(
                kind="handoff",
                id=entry.id,
                instance_type=entry.itype.name,
                from_stage=from_stage,
                to_stage=target.assigned_stage,
                from_bracket=self.plan.stages[from_stage].bracket,
                to_bracket=self.plan.stages[target.assigned_stage].bracket,
                request=target.token,
                request_outcome="cancelled" if cancelled else "released when up",
            )
        )
        return True

    def _prefetch_next(self, lane: Lane) -> None:
        """The bracket's next stage's extra instances, requested once this stage's remaining time ≤ the lead time."""
        g = lane.g
        nxt_g = self.brackets.next_stage(g)
        if nxt_g is None or nxt_g in self.prefetched:
            return
        stage, nxt = self.plan.stages[g], self.plan.stages[nxt_g]
        itype = self._stage_itype(nxt)
        reusable = self.prefetch.carried(self._same_type(stage, nxt), stage.instances, nxt.instances)
        extra = nxt.instances - reusable - len(self._stage_pool(nxt_g))
        if extra <= 0:
            self.prefetched.add(nxt_g)
            return
        n_slots = max(1, len(lane.slots))
        if lane.trial_seconds:
            per_trial = statistics.mean(lane.trial_seconds)
        elif stage.predicted_task_s:
            per_trial = stage.predicted_task_s
        elif stage.predicted_duration_s:
            per_trial = stage.predicted_duration_s / max(1, math.ceil(stage.trials / n_slots))
        else:
            return
        now = self.clock.time()
        mine = [r for r in self.running.values() if self.state.trials[r.trial_id].bracket == lane.bracket]
        remaining = self.prefetch.remaining_s(
            per_trial_s=per_trial,
            waiting=len(lane.pending),
            slots=n_slots,
            running_elapsed_s=[now - r.started_at for r in mine],
        )
        lead = self._prefetch_lead(itype)
        if self.prefetch.should_request(remaining, lead, first_task_started=bool(mine) or bool(lane.trial_seconds)):
            self.prefetched.add(nxt_g)
            self.journal.record(
                J.Decision(
                    kind="prefetch",
                    stage=nxt_g,
                    count=extra,
                    instance_type=itype.name,
                    estimated_remaining_s=remaining,
                    lead_s=lead,
                    quantile=self.prefetch.quantile,
                )
            )
            spot = self._buy_spot(nxt, trigger="prefetch", waiting=len(lane.pending))
            for _ in range(extra):
                self._request(nxt_g, itype, spot)

    def _liveness(self) -> None:
        """Every few seconds: every ready instance's Ray node still there? Lost ones go to the lane they serve."""
        now = self.clock.monotonic()
        if now - self._last_liveness < LIVENESS_EVERY_S:
            return
        self._last_liveness = now
        self._route_notices()
        self._watch_ready()
        lost = self._poll_lost()
        per_lane: dict[int, dict[str, str]] = {}
        for ident, reason in lost.items():
            entry = self._entry(ident)
            if entry is not None:
                per_lane.setdefault(self.brackets.bracket_of(entry.assigned_stage), {})[ident] = reason
        for b, gone in per_lane.items():
            lane = self.lanes[b]
            g = lane.g if lane.g is not None else min(p.assigned_stage for p in self.pool.values() if p.id in gone)
            self.stage_index = g
            self._handle_lost(g, gone, lane.slots, lane.pending, stopped=[])

    def _request_first_instances(self) -> None:
        """Request the instances of every bracket due at once (fresh: offset 0; resumed: every bracket under way)."""
        if not self.plan.parallel_brackets:
            super()._request_first_instances()
            return
        done = set(self.state.completed_stages())
        elapsed = self.clock.time() - self.state.first_started_at
        for b in self.brackets.start_order(range(len(self.brackets.ranges))):
            lo, hi = self.brackets.ranges[b]
            g = next((i for i in range(lo, hi) if i not in done), None)
            if g is None or elapsed < self.brackets.offsets_s[b]:
                continue
            stage = self.plan.stages[g]
            missing = stage.instances - len(self._stage_pool(g))
            if missing <= 0:
                continue
            self.stage_index = g  # the spot decision looks at the run from this bracket's stage
            spot = self._buy_spot(stage, trigger="start", waiting=stage.trials)
            itype = self._stage_itype(stage)
            for _ in range(missing):
                self._request(g, itype, spot)

    # -- spot: notices and the run's remaining work, per bracket ---------------------------------
    def _route_notices(self, ask: tuple[str, ...] = ()) -> None:
        """Preemption notices that came (and those of ``ask``, asked now), each taken by the lane its instance
        serves: journaled, and the replacement requested through the spot policy (the controller's own code)."""
        for ident, notice in self._notices_found(ask).items():
            entry = self._entry(ident)
            lane = self._lane_of_stage(entry.assigned_stage) if entry is not None and self.lanes else None
            if lane is not None and lane.g is not None:
                g, pending = lane.g, lane.pending
            else:  # a bracket not started or done: nothing of it waits
                g, pending = (entry.assigned_stage if entry is not None else self.stage_index), []
            self.stage_index = g
            self._take_notice(g, pending, ident, notice)

    def _next_stage_of(self, g: int) -> int | None:
        if not self.plan.parallel_brackets:
            return super()._next_stage_of(g)
        return self.brackets.next_stage(g)

    def _stage_seconds_of(self, g: int) -> list[float]:
        if not self.plan.parallel_brackets:
            return super()._stage_seconds_of(g)
        lane = self._lane_of_stage(g) if self.lanes else None
        return lane.trial_seconds if lane is not None and lane.g == g else []

    def _work_left_s(self, g: int, *, waiting: int, awaited_s: float) -> float:
        """The run's remaining time with its brackets side by side: its critical path, the longest remaining bracket.

        Each bracket under way: its current stage's remainder (its own running trials, and its waiting ones —
        ``waiting`` for stage ``g``'s bracket) and its later stages, as the sequential run counts them; a bracket
        not started yet: the wait for its offset and all its stages. The bracket of stage ``g``
        also waits ``awaited_s`` (a replacement's start-up). The market is the run's (one ``on_spot``), so the
        run's slack decides it: a bracket off the critical path can still push the run to on-demand when the
        longest one has no room for another restart.
        """
        if not self.plan.parallel_brackets:
            return super()._work_left_s(g, waiting=waiting, awaited_s=awaited_s)
        mine = self.brackets.bracket_of(g)
        elapsed = self.clock.time() - self.state.first_started_at
        done = set(self.state.completed_stages())
        longest = 0.0
        for b, (lo, hi) in enumerate(self.brackets.ranges):
            lane = self.lanes[b] if b < len(self.lanes) else None
            awaited = awaited_s if b == mine else 0.0
            if lane is not None and lane.done:
                continue
            if lane is not None and lane.g is not None:
                running = [r for r in self.running.values() if self.state.trials[r.trial_id].bracket == lane.bracket]
                left = self._stages_left_s(
                    lane.g, hi, waiting=waiting if b == mine else len(lane.pending), running=running, awaited_s=awaited
                )
            else:
                first = next((i for i in range(lo, hi) if i not in done), None)
                if first is None:
                    continue
                later = [S.decision_outlook(self.plan, i) for i in range(first, hi)]
                left = max(0.0, self.brackets.offsets_s[b] - elapsed) + S.work_left_s(
                    current_remaining_s=0.0,
                    current_ratio=1.0,
                    later=later,
                    confidence=S.DECISION_QUANTILE,
                    slowdown=self._slowdown(),
                    waiting_for_instance_s=awaited,
                )
            longest = max(longest, left)
        return longest


def controller_for(plan: Plan) -> type[Controller]:
    """The controller class that runs ``plan``: :class:`ParallelController` for parallel brackets."""
    return ParallelController if plan.parallel_brackets else Controller


__all__ = ["BracketPolicy", "Lane", "ParallelController", "Waiting", "controller_for"]
