"""The work a run has left, read off its lanes: what the spot decisions and the re-plans are told.

* :meth:`LaneOutlook.work_left_s` — the run's predicted remaining time from now, its critical path: the longest
  chain of stages left (one chain when lanes run one after another; each bracket's when they run side by side),
  each chain's running stage by the prefetch estimate (running trials' rest + waiting waves), its later stages
  by their predictions at the spot decisions' quantile, scaled by the slowdown so far, and on their fall-back
  type where Uniform Progress measures the work left (:mod:`rubberband.executor.spot`);
* :meth:`LaneOutlook.remainder` — the remaining work at a re-plan, chain by chain: the plan positions of its
  stages not started yet, when the first of them can start (now at the boundary, after the running stage's
  estimated rest, or at the bracket's offset), and the instances its next stage may keep.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from rubberband.executor import spot as S
from rubberband.executor.decisions import mean_task_s, slowdown
from rubberband.executor.lanes import Lane
from rubberband.executor.placement import slot_count
from rubberband.executor.scheduling import RunView
from rubberband.executor.trialrunner import RunningTrial
from rubberband.planner.policies import PrefetchPolicy


@dataclass(frozen=True)
class Now:
    """A chain's running stage now: the trials it still has to start, those running, and the replacement start-up
    it waits for."""

    waiting: int
    running: list[RunningTrial]
    awaited_s: float = 0.0


@dataclass(frozen=True)
class Chain:
    """A piece of the remaining work: plan positions ``positions``, able to start in ``wait_s``; ``kept``: the
    instances (type key → count) up or coming that its first stage may keep; ``lane``: whose it is."""

    lane: int
    positions: list[int]
    wait_s: float
    kept: dict[str, int]


class LaneOutlook:
    """The work left of a scheduler's ``lanes`` (see the module docstring)."""

    def __init__(self, lanes: list[Lane], prefetch: PrefetchPolicy) -> None:
        self.lanes = lanes
        self.prefetch = prefetch

    # -- the spot decisions' view ------------------------------------------------------------------------
    def work_left_s(self, g: int, *, waiting: int, awaited_s: float, view: RunView) -> float:
        """The run's remaining time with stage ``g``'s lane ``waiting`` trials short and waiting ``awaited_s`` for
        a replacement (see the module docstring). The market is the run's (one ``on_spot``): a chain off the
        critical path can still push the run to on-demand when the longest one has no room for another restart."""
        layout = view.plan.layout
        mine = layout.lane_of(min(g, layout.stages - 1))
        elapsed = view.elapsed()
        done = set(view.state.completed_stages())
        longest = 0.0
        for b, lane, lo, hi in self._chains(view):
            awaited = awaited_s if b == mine else 0.0
            if lane.g is not None:
                runs = view.running_of(lane.bracket) if layout.parallel else view.running()
                now = Now(waiting if b == mine else len(lane.pending), runs, awaited)
                left = self._stages_left_s(lane.g, hi, now, view)
            else:
                first = next((i for i in range(lo, hi) if i not in done), None)
                if first is None:
                    continue
                later = [S.decision_outlook(view.plan.plan, i) for i in range(first, hi)]
                offset = layout.offsets_s[b] if layout.parallel else 0.0
                left = max(0.0, offset - elapsed) + S.work_left_s(
                    S.StageRest(),
                    later,
                    confidence=S.DECISION_QUANTILE,
                    slowdown=self.slowdown(view),
                    waiting_for_instance_s=awaited,
                )
            longest = max(longest, left)
        return longest

    def _chains(self, view: RunView) -> list[tuple[int, Lane, int, int]]:
        """(lane position, lane, first, end plan position) of each chain of stages left: every lane not done side
        by side; one after another, the lane running (or the first not done) up to the plan's end."""
        layout = view.plan.layout
        if layout.parallel:
            return [
                (b, lane, lo, hi) for b, (lane, (lo, hi)) in enumerate(zip(self.lanes, layout.ranges)) if not lane.done
            ]
        for b, lane in enumerate(self.lanes):
            if not lane.done:
                return [(b, lane, layout.ranges[b][0], layout.stages)]
        return []

    def _stages_left_s(self, g: int, end: int, now: Now, view: RunView) -> float:
        """Stages ``g … end − 1`` from now: ``g``'s remainder as the prefetch estimate has it, the later ones'
        predictions at the decisions' quantile scaled by the slowdown so far, and the replacement awaited."""
        plan = view.plan
        stage = plan.stage(g)
        n_slots = max(1, slot_count(stage.instances, plan.stage_itype(stage).workers, stage.workers_per_trial))
        at = view.now()
        current = self.prefetch.remaining_s(
            per_trial_s=self.per_trial_s(g, view),
            waiting=now.waiting,
            slots=n_slots,
            running_elapsed_s=[at - r.started_at for r in now.running],
        )
        cur = S.stage_outlook(plan.plan, g)
        conf = S.DECISION_QUANTILE
        ratio = S.at_confidence(cur.p50_s, cur.p95_s, conf) / cur.p50_s if cur.p50_s > 0 else 1.0
        return S.work_left_s(
            S.StageRest(current * S.fallback_slowdown(stage), ratio),
            [S.decision_outlook(plan.plan, i) for i in range(g + 1, end)],
            confidence=conf,
            slowdown=self.slowdown(view),
            waiting_for_instance_s=now.awaited_s,
        )

    def per_trial_s(self, g: int, view: RunView) -> float:
        """Stage ``g``'s mean task time: measured in this run (not cold), else the plan's, else its duration per
        wave."""
        stage = view.plan.stage(g)
        n_slots = slot_count(stage.instances, view.plan.stage_itype(stage).workers, stage.workers_per_trial)
        lane = self.lanes[view.plan.layout.lane_of(g)] if self.lanes else None
        measured = lane.trial_seconds if lane is not None and lane.g == g else []
        return mean_task_s(measured, stage, slots=n_slots) or 0.0

    def slowdown(self, view: RunView) -> float:
        """Actual over predicted duration of the stages finished so far (1 before any)."""
        return slowdown(self.finished_durations(view))

    @staticmethod
    def finished_durations(view: RunView) -> list[tuple[float, float]]:
        """(actual, predicted) duration of each finished stage."""
        stages, plan = view.state.stages, view.plan.stages
        return [
            (stages[i].finished_at - stages[i].started_at, plan[i].predicted_duration_s or 0.0)  # type: ignore[operator]
            for i in view.state.completed_stages()
            if i < len(plan) and stages[i].started_at is not None
        ]

    # -- the re-plans' view ------------------------------------------------------------------------------
    def remainder(self, view: RunView, boundary: tuple[Lane, int] | None, *, timed: bool = True) -> list[Chain]:
        """The remaining work, chain by chain (see the module docstring); not ``timed``: the positions only (a
        running chain's wait 0, nothing kept)."""
        layout = view.plan.layout
        elapsed = view.elapsed()
        out = []
        for part in layout.parts(self.lanes, set(view.state.completed_stages()), boundary):
            positions = list(part.positions)
            lane = self.lanes[part.lane] if part.lane < len(self.lanes) else None
            if part.waits_for == "at_boundary":
                wait, kept = 0.0, self.instance_counts(positions[:1], view)
            elif part.waits_for == "running" and lane is not None and lane.g is not None:
                wait = self.stage_rest_s(lane, view) if timed else 0.0
                kept = self.instance_counts([lane.g, lane.g + 1], view) if timed else {}
            else:
                offset = layout.offsets_s[part.lane] if layout.parallel else 0.0
                wait, kept = max(0.0, offset - elapsed), self.instance_counts(positions[:1], view)
            out.append(Chain(part.lane, positions, wait, kept))
        return out

    def stage_rest_s(self, lane: Lane, view: RunView) -> float:
        """The estimated remaining time of the stage ``lane`` runs (its running trials' rest and its waiting waves,
        as the prefetch estimate has it; plus the start-up lead while none of its instances is up)."""
        assert lane.g is not None
        stage = view.plan.stage(lane.g)
        itype = view.plan.stage_itype(stage)
        slots = max(1, slot_count(stage.instances, itype.workers, stage.workers_per_trial))
        now = view.now()
        mine = [now - r.started_at for r in view.running_of(lane.bracket)]
        up = any(entry.ready for entry in view.of_stage(lane.g))  # one may be up before the lane has its slots
        booting = view.lead_s(itype) if lane.pending and not lane.slots and not up else 0.0
        return booting + self.prefetch.remaining_s(
            per_trial_s=self.per_trial_s(lane.g, view), running_elapsed_s=mine, waiting=len(lane.pending), slots=slots
        )

    @staticmethod
    def remaining_pred_s(chains: Sequence[Chain], ratio: float, view: RunView) -> float:
        """The run's remaining time by the stage predictions: the longest chain's wait plus its stages' predicted
        durations times the slowdown so far (``ratio``)."""
        plan = view.plan.stages
        return max(
            (c.wait_s + ratio * sum(plan[i].predicted_duration_s or 0.0 for i in c.positions) for c in chains),
            default=0.0,
        )

    @staticmethod
    def instance_counts(stages: Sequence[int], view: RunView) -> dict[str, int]:
        """Instances (up or coming) serving ``stages``, by type key: what a chain's next stage can keep."""
        counts: dict[str, int] = {}
        for i in stages:
            if i < len(view.plan.stages):
                for entry in view.of_stage(i):
                    counts[entry.itype.key] = counts.get(entry.itype.key, 0) + 1
        return counts
