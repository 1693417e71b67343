"""Decisions shared by the simulator and the executor, as small pure policy objects.

A prediction is only worth something if it describes what the executor will do. The decisions
both engines take therefore live here, once, without I/O or a clock:

* :class:`PrefetchPolicy` — when the next stage's extra instances are requested (the lead time:
  a quantile of the start-up latency), how many instances carry over to the next stage (scale-down
  keeps the rest only while its own stage needs them), and when a stage may promote (its barrier).
  The simulator (:mod:`rubberband.planner.simulator`) requests at ``first task + predicted stage
  duration − lead``; the executor requests once its estimated remaining stage time is at most the
  same lead. On a deterministic workload both fire at the same moment.
* :class:`LatenessPolicy` — at a stage boundary, given the predicted probability of meeting the
  deadline of the current plan and of the best alternative the re-planner found, whether to go
  on, take a cheaper plan, buy speed, finish late or stop now (Ray Tune's ``TrialScheduler`` style:
  a tiny vocabulary, :class:`Action`). Only the executor takes this decision; it is here because it
  is pure and the simulated-time executor (issue 13) will call it too.
* :class:`SpotPolicy` — spot or on-demand for the next piece of work (Uniform Progress: stay on spot
  while the slack covers one more restart), taken by the simulator at each sampled preemption and by
  the executor on each preemption notice (issue 15).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum
from typing import Mapping, Sequence, TypeGuard

from rubberband.units import format_duration

#: Start-up quantile both engines use as the prefetch lead time: the next stage's instances are
#: requested so that nine times in ten they are up before the current stage ends.
PREFETCH_QUANTILE = 0.9
#: The values ``--on-late`` takes.
ON_LATE = ("finish", "stop")


def quantile(values: Sequence[float], q: float) -> float:
    """The ``q`` quantile of ``values`` (linear interpolation, numpy's default), without numpy."""
    ordered = sorted(values)
    if not ordered:
        raise ValueError("quantile of no values")
    pos = q * (len(ordered) - 1)
    lo = int(math.floor(pos))
    hi = min(lo + 1, len(ordered) - 1)
    return float(ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo))


def bracket_start_order(ends_s: Mapping[int, float]) -> list[int]:
    """Hyperband brackets that start together, in the order their instances are requested: the one
    predicted to end last first (``ends_s``: bracket → its start offset plus predicted duration), ties by
    bracket. Where instances come up one after another (the local backend) the critical path gets the
    first one. The executor requests in this order (``executor.lanes.LaneLayout``) and the
    simulator queues the brackets' start-ups in it (:mod:`rubberband.planner.provisioning`)."""
    return sorted(ends_s, key=lambda b: (-ends_s[b], b))


@dataclass(frozen=True)
class PrefetchPolicy:
    """Elastic timing of both engines: prefetch lead time, carry-over (scale-down), promotion.

    ``quantile``: the start-up quantile used as the lead time (0.5: the median, optimistic and
    cheaper; 0.9: instances nearly always ready at the barrier, at the price of some idle time).
    """

    quantile: float = PREFETCH_QUANTILE

    def __post_init__(self) -> None:
        if not 0.0 <= self.quantile <= 1.0:
            raise ValueError(f"PrefetchPolicy.quantile must be within [0, 1], got {self.quantile!r}")

    # -- prefetch --------------------------------------------------------------------------
    def lead_s(self, startup_samples: Sequence[float]) -> float:
        """How long before the current stage ends the next stage's extra instances are requested."""
        return quantile(startup_samples, self.quantile)

    def request_offset_s(self, predicted_stage_s: float, lead_s: float) -> float:
        """Seconds after the current stage's first task started at which to request (simulator's view)."""
        return max(0.0, predicted_stage_s - lead_s)

    def should_request(self, remaining_s: float, lead_s: float, *, first_task_started: bool = True) -> bool:
        """Request now? Once the current stage's first task has started (the simulator times requests from it)
        and its estimated remaining time is at most the lead (executor's view)."""
        return first_task_started and remaining_s <= lead_s

    @staticmethod
    def remaining_s(*, per_trial_s: float, running_elapsed_s: Sequence[float], waiting: int, slots: int) -> float:
        """The current stage's estimated remaining time: the longest-running trial's remainder plus the
        waves still waiting (``waiting`` trials on ``slots`` slots), each ``per_trial_s`` long."""
        left = max((max(0.0, per_trial_s - e) for e in running_elapsed_s), default=0.0)
        return left + math.ceil(waiting / max(1, slots)) * per_trial_s

    # -- scale-down ------------------------------------------------------------------------
    @staticmethod
    def carried(same_type: bool, current: int, following: int) -> int:
        """Instances of the current stage that go on to the next one (the rest are released as soon as
        their own stage no longer needs them): all it needs, when it uses the same type (and market)."""
        return min(current, following) if same_type else 0

    def keep_for_next(self, same_type: bool, kept: int, following: int, later: int = 0) -> bool:
        """An idle instance of the current stage: keep it for the next (True) or release it now.

        ``later``: instances of the same type still busy in the current stage. The next stage keeps the
        instances that free last (as :meth:`carried` has it in the simulator): an instance that went idle early
        is kept only when ``kept`` and those still busy cannot fill the next stage, else it idles until the
        barrier for nothing."""
        return same_type and kept + later < following

    # -- promotion -------------------------------------------------------------------------
    @staticmethod
    def may_promote(unfinished: int) -> bool:
        """Promotion waits for the stage's barrier: the top 1/η is known only once every trial reported."""
        return unfinished == 0


class Action(str, Enum):
    """What a stage boundary decides (journaled as ``decision.action``)."""

    CONTINUE = "continue"  # the current plan meets the deadline: keep it
    SAVE = "save"  # the current plan meets it, and a clearly cheaper one does too: take that
    BUY_SPEED = "buy_speed"  # the current plan misses the confidence, a quicker one meets it: take that
    FINISH_LATE = "finish_late"  # nothing meets it: go on (on the quicker plan when clearly quicker), be late
    STOP = "stop"  # nothing meets it and the run must not go on: stop now, return the best so far


@dataclass(frozen=True)
class Outlook:
    """A plan's prediction for the rest of the run, from now: P(end ≤ deadline), median time left, mean cost."""

    p_meet: float
    jct_p50_s: float
    cost_usd: float


@dataclass(frozen=True)
class LateDecision:
    action: Action
    take_proposal: bool
    reason: str


@dataclass(frozen=True)
class LatenessPolicy:
    """Admission and graceful lateness at a stage boundary.

    ``confidence``: the P(meet deadline) the run asked for. ``on_late``: ``finish`` (go on and say how
    late) or ``stop`` (stop now with the best so far; a stage that is not predicted to meet the deadline
    is never started). ``overrun_s``: the hard limit past the deadline (math.inf: none); even with
    ``finish``, a run whose quickest plan is predicted (median) to end past it stops now rather than
    pay for stages the overrun would cut. ``cheaper_gain`` / ``late_gain``: how much cheaper (an
    on-time proposal) or quicker (a late one) a proposal must be to replace the current plan.
    """

    confidence: float
    on_late: str = "finish"
    overrun_s: float = math.inf
    cheaper_gain: float = 0.03
    late_gain: float = 0.05

    def __post_init__(self) -> None:
        if self.on_late not in ON_LATE:
            raise ValueError(f"on_late must be one of {', '.join(ON_LATE)}, got {self.on_late!r}")
        if not 0.0 < self.confidence <= 1.0:
            raise ValueError(f"confidence must be within (0, 1], got {self.confidence!r}")

    def meets(self, outlook: Outlook | None) -> TypeGuard[Outlook]:
        """Whether ``outlook`` is a prediction that meets the deadline at the confidence."""
        return outlook is not None and outlook.p_meet >= self.confidence

    def decide(self, current: Outlook, proposal: Outlook | None, *, time_left_s: float) -> LateDecision:
        """The decision at a boundary; ``time_left_s``: seconds to the deadline (negative once past)."""
        p = self.confidence
        if self.meets(current):
            if self.meets(proposal) and proposal.cost_usd < current.cost_usd * (1.0 - self.cheaper_gain):
                return LateDecision(Action.SAVE, True, "cheaper plan meets the deadline")
            why = (
                "proposal misses the confidence"
                if proposal is not None and not self.meets(proposal)
                else "current plan is as cheap and on time"
            )
            return LateDecision(Action.CONTINUE, False, why)
        if self.meets(proposal):
            return LateDecision(
                Action.BUY_SPEED,
                True,
                f"deadline at risk: buying speed (P(meet) {current.p_meet:.2f} → {proposal.p_meet:.2f}, ≥ {p:g})",
            )
        clearly_quicker = proposal is not None and proposal.jct_p50_s < current.jct_p50_s * (1.0 - self.late_gain)
        quicker = proposal if clearly_quicker else None
        best = current if quicker is None else quicker
        out_of_reach = (
            f"deadline out of reach (best P(meet) "
            f"{max(current.p_meet, proposal.p_meet if proposal else 0.0):.2f} < {p:g})"
        )
        if self.on_late == "stop":
            return LateDecision(
                Action.STOP,
                False,
                f"{out_of_reach}; --on-late stop: stopping before the next stage with the best so far",
            )
        if math.isfinite(self.overrun_s) and best.jct_p50_s > time_left_s + self.overrun_s:
            return LateDecision(
                Action.STOP,
                False,
                f"{out_of_reach}; even the quickest plan (p50 {format_duration(best.jct_p50_s)} left) "
                f"ends past the deadline plus the allowed overrun "
                f"({format_duration(max(0.0, time_left_s + self.overrun_s))} left): stopping now "
                f"with the best so far",
            )
        if quicker is not None:
            return LateDecision(
                Action.FINISH_LATE,
                True,
                f"{out_of_reach}: the quickest plan (p50 {format_duration(quicker.jct_p50_s)} left, "
                f"vs {format_duration(current.jct_p50_s)}) makes the run less late",
            )
        return LateDecision(Action.FINISH_LATE, False, f"{out_of_reach}: no plan is clearly quicker; finishing late")


class Market(str, Enum):
    """Where a stage's (or a trial's) instances are bought."""

    SPOT = "spot"
    ON_DEMAND = "on_demand"


@dataclass(frozen=True)
class SpotSituation:
    """What a spot decision looks at, from now (seconds; no clock inside).

    ``time_left_s``: to the deadline. ``work_left_s``: the predicted remaining time of the run at the
    confidence asked for, if it ran uninterrupted from now (on the plan's shapes). ``restart_s``: what
    one preemption costs in time: a replacement's start-up (its quantile) + checkpoint restore + the
    work lost since the last checkpoint. ``on_spot``: whether the trial (or stage) is on spot now.
    """

    time_left_s: float
    work_left_s: float
    restart_s: float
    on_spot: bool = True

    @property
    def slack_s(self) -> float:
        """Time left − work left − one restart: what one more preemption may still eat."""
        return self.time_left_s - self.work_left_s - self.restart_s


@dataclass(frozen=True)
class SpotPolicy:
    """Uniform-Progress-style fall-back (NSDI'24 "Can't Be Late"), one decision for both engines.

    Stay on (or return to) spot while the slack covers one more restart; move to on-demand once the
    slack runs short. ``margin_s``: slack kept in reserve beyond one restart (the executor's reaction
    time). ``return_factor``: hysteresis — a trial moved to on-demand goes back to spot only when the
    slack is at least this many restarts (never, with ``math.inf``, the default: switching back costs a
    restart of its own). The simulator calls :meth:`decide` at every preemption and at each trial's
    start; the executor calls it on each preemption notice and before (re)starting a trial.
    """

    margin_s: float = 0.0
    return_factor: float = math.inf

    def __post_init__(self) -> None:
        if self.margin_s < 0 or not math.isfinite(self.margin_s):
            raise ValueError(f"SpotPolicy.margin_s must be a finite number ≥ 0, got {self.margin_s!r}")
        if self.return_factor < 1:
            raise ValueError(f"SpotPolicy.return_factor must be ≥ 1, got {self.return_factor!r}")

    def decide(self, situation: SpotSituation) -> Market:
        """Spot or on-demand for the next piece of work."""
        if situation.on_spot:
            return Market.SPOT if situation.slack_s > self.margin_s else Market.ON_DEMAND
        if (
            math.isfinite(self.return_factor)
            and situation.slack_s >= self.return_factor * situation.restart_s + self.margin_s
        ):
            return Market.SPOT
        return Market.ON_DEMAND


@dataclass(frozen=True)
class AshaPhasePolicy:
    """Elastic ASHA, one rule for both engines: how many instances each phase of the rung ladder holds.

    ASHA (asynchronous successive halving) has no stage barriers, but its ladder empties from the bottom:
    every trial starts at rung 0, and once every trial has started, the work left moves up the rungs. Phase
    ``k`` is the part of the run where the lowest rung any trial still trains toward (or waits to train
    toward) is ``k``; phase 0 also lasts while a trial has not started. ``instances[k]`` is the cluster
    phase ``k`` holds (non-increasing: the wide rungs first, fewer instances as the ladder empties). On
    entering a phase that holds fewer instances than are alive, idle instances are released at once and
    busy ones the moment their trial's task ends (the ones that go idle first go first). The planner's
    simulator (:mod:`rubberband.planner.asha`) and the executor's ASHA scheduler both follow this rule, so
    a prediction describes the run. Pure: no I/O, no clock.
    """

    instances: tuple[int, ...]

    def __post_init__(self) -> None:
        if not self.instances or any(n < 1 for n in self.instances):
            raise ValueError(f"AshaPhasePolicy.instances must be ≥ 1 per phase, got {self.instances!r}")
        if any(b > a for a, b in zip(self.instances, self.instances[1:])):
            raise ValueError(f"AshaPhasePolicy.instances must not grow from one phase to the next: {self.instances!r}")

    @property
    def phases(self) -> int:
        return len(self.instances)

    def phase(self, *, unstarted: int, lowest_rung: int | None) -> int:
        """The phase now: ``unstarted`` trials not started yet; ``lowest_rung``: the lowest rung index a running
        or waiting trial trains toward (None: none runs or waits)."""
        if unstarted > 0:
            return 0
        last = len(self.instances) - 1
        return last if lowest_rung is None else max(0, min(lowest_rung, last))

    def target(self, phase: int) -> int:
        """Instances phase ``phase`` holds."""
        return self.instances[max(0, min(phase, len(self.instances) - 1))]

    def surplus(self, phase: int, alive: int) -> int:
        """How many of ``alive`` instances phase ``phase`` no longer needs (released as they go idle)."""
        return max(0, alive - self.target(phase))
