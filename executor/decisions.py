"""The executor's own decisions, as small policy objects without I/O, clock or cloud.

The executor's loop (:mod:`rubberband.executor.loop`) gathers what happened (an instance up or lost, a trial
done, a notice, a stage boundary, a clock tick); its scheduler and desks ask the objects here what to do, and
its actuator does it (journal, backend, Ray). What the planner's simulator decides too
lives in :mod:`rubberband.planner.policies` (prefetch and carry-over, lateness, spot or on-demand), so a
prediction describes this executor; what only a running executor meets is decided here:

* :class:`DeadlineWatch` — on time, late but within the allowed overrun, or over it (stop now);
* :class:`LossPolicy` — whether a lost or noticed instance is replaced, and when losses are too many;
* :func:`promote` — a stage's ranking and the trials that go on;
* :func:`proposal_problem` and :func:`judge_proposal` — whether a re-planner's proposal is usable, and what
  the :class:`~rubberband.planner.policies.LatenessPolicy` makes of it beside the current plan;
* :func:`stand_in_stages` — the remaining stages with each unavailable type replaced by its stand-in (failover
  without a re-planner), re-priced;
* :func:`mean_task_s` and :func:`startup_samples` — the estimates prefetch and the spot policy are fed.

Each validates its inputs where it is built, so a wrong setting fails when the run starts, not mid-run.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from rubberband.catalog import InstanceType
from rubberband.plan import Plan, StagePlan
from rubberband.clouds import facts_or_like
from rubberband.planner.policies import LateDecision, LatenessPolicy, Outlook
from rubberband.profile import Profile


def price_hr(itype: InstanceType, spot: bool, zone: str | None = None) -> float:
    """$/h of an instance as requested (spot when it has a spot offer): on spot, ``zone``'s own offer where the
    zone is known and has one (:meth:`~rubberband.catalog.InstanceType.zone_price`), else the cheapest zone's."""
    if spot and itype.spot_price_hr is not None:
        return itype.zone_price(zone, spot=True)
    return itype.price_hr


# -- the deadline ------------------------------------------------------------------------------


class DeadlineState(str, Enum):
    """Where a run stands against its deadline."""

    ON_TIME = "on_time"
    LATE = "late"  # past the deadline, within the allowed overrun: the run goes on
    OVER = "over"  # past the deadline plus the overrun: everything stops


@dataclass(frozen=True)
class DeadlineWatch:
    """The deadline and how far past it a run may go (``math.inf``: to the end)."""

    deadline_s: float
    overrun_s: float = 0.0

    def __post_init__(self) -> None:
        if not self.deadline_s > 0 or math.isinf(self.deadline_s):
            raise ValueError(f"deadline_s must be a positive number of seconds, got {self.deadline_s!r}")
        if not self.overrun_s >= 0:
            raise ValueError(f"overrun_s must be ≥ 0 seconds (or inf), got {self.overrun_s!r}")

    def state(self, elapsed_s: float) -> DeadlineState:
        if elapsed_s > self.deadline_s + self.overrun_s:
            return DeadlineState.OVER
        return DeadlineState.LATE if elapsed_s > self.deadline_s else DeadlineState.ON_TIME


# -- lost and noticed instances ----------------------------------------------------------------

#: The reason a backend gives for a spot instance the cloud took back (``check_lost``).
SPOT_INTERRUPTION = "spot-interruption"


@dataclass(frozen=True)
class LossPolicy:
    """Replace a lost (or noticed) instance while its stage still needs it, up to ``max_losses`` losses.

    An instance serves the stage it is assigned to; it is needed when that stage is a later one (kept for
    it), or the current one with work still waiting or running on it. A flapping cloud must not loop
    forever: past ``max_losses`` losses the run gives up (and can be resumed later). Spot interruptions are
    not counted: a spot plan expects them (its P(meet) and cost include them), and what bounds them is the
    spot policy, which moves the run to on-demand once the slack is short, and the deadline.
    """

    max_losses: int

    def __post_init__(self) -> None:
        if self.max_losses < 0:
            raise ValueError(f"max_losses must be ≥ 0, got {self.max_losses!r}")

    @staticmethod
    def needed(*, serves: int, current: int, work_left: bool) -> bool:
        """Whether an instance assigned to stage ``serves`` is still needed while stage ``current`` runs."""
        return serves > current or (serves == current and work_left)

    def replace(self, *, serves: int, current: int, work_left: bool, losses: int) -> bool:
        """Whether to request a replacement for a lost instance (``losses``: the run's losses, this one counted)."""
        return self.needed(serves=serves, current=current, work_left=work_left) and not self.exhausted(losses)

    def exhausted(self, losses: int) -> bool:
        return losses > self.max_losses

    @staticmethod
    def counts(reason: str) -> bool:
        """Whether a loss for this reason counts toward ``max_losses`` (a spot interruption does not)."""
        return reason != SPOT_INTERRUPTION


def requeue_first(pending: list[tuple[str, int]], trials: Sequence[str], start_epoch: Callable[[str], int]) -> None:
    """Put ``trials`` (stopped by a loss) at the head of ``pending``, in order: their slots were taken from them."""
    for trial_id in reversed(trials):
        if all(t != trial_id for t, _ in pending):
            pending.insert(0, (trial_id, start_epoch(trial_id)))


# -- promotion ----------------------------------------------------------------------------------


def rank(metrics: Mapping[str, float | None], mode: str, order: Sequence[str]) -> list[str]:
    """Trial ids best first; missing metrics last; ties keep ``order``."""
    position = {t: i for i, t in enumerate(order)}
    sign = 1.0 if mode == "min" else -1.0
    return sorted(metrics, key=lambda t: (metrics[t] is None, sign * (metrics[t] or 0.0), position.get(t, 0)))


def promote(
    metrics: Mapping[str, float | None], mode: str, order: Sequence[str], keep: int | None
) -> tuple[list[str], list[str]]:
    """A stage's ranking and the trials promoted to the next stage (the top ``keep``; none after a bracket's last)."""
    ranking = rank(metrics, mode, order)
    return ranking, ([] if keep is None else ranking[:keep])


# -- re-planning at a stage boundary ------------------------------------------------------------


def slowdown(finished: Sequence[tuple[float, float]]) -> float:
    """Actual over predicted duration of the stages finished so far ((actual, predicted) each; 1 before any)."""
    predicted = sum(p for _, p in finished)
    return sum(a for a, _ in finished) / predicted if predicted > 0 else 1.0


def _shape(stages: Sequence[StagePlan]) -> list[tuple[int, int, int, int]]:
    return [(s.bracket, s.stage, s.trials, s.epochs) for s in stages]


def proposal_problem(
    proposal: Sequence[StagePlan],
    rest: Sequence[StagePlan],
    *,
    unavailable: Sequence[str],
    key_of: Callable[[StagePlan], str],
) -> str | None:
    """Why a proposal for the stages ``rest`` cannot be taken (None: it can): another shape, or a type that
    failover found unavailable (``key_of``: a stage's catalog key)."""
    if _shape(proposal) != _shape(rest):
        return "proposal does not match the remaining stages"
    if unavailable and set(unavailable) & {key_of(s) for s in proposal}:
        return "proposal uses an unavailable type"
    return None


@dataclass(frozen=True)
class Judgement:
    """The lateness policy's verdict on a re-plan, and the figures it was made from (for the journal)."""

    verdict: LateDecision
    figures: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Standing:
    """The current plan at a boundary: whether it is at risk by its stage predictions scaled by the slowdown
    (and that remaining time), and the re-planner's outlook of it under its model where it gave one."""

    at_risk: bool
    remaining_pred_s: float
    p_meet: float | None = None
    jct_p50_s: float | None = None


def judge_proposal(
    lateness: LatenessPolicy, rest: Sequence[StagePlan], candidate: Plan | None, standing: Standing, time_left_s: float
) -> Judgement:
    """The current plan's outlook (at risk: it does not meet the deadline, whatever a model says) beside the
    proposal's for the stages ``rest``, decided by the lateness policy (``time_left_s``: to the deadline). Past
    the deadline nothing meets it, whatever P(meet) a re-plan for the shortest remaining deadline claims."""
    current_cost = sum(s.predicted_cost_usd or 0.0 for s in rest)
    past = time_left_s <= 0
    p_current = 0.0 if standing.at_risk or past else 1.0
    if standing.p_meet is not None:
        p_current = min(p_current, standing.p_meet)
    jct = standing.jct_p50_s or standing.remaining_pred_s
    current = Outlook(p_meet=p_current, jct_p50_s=jct, cost_usd=current_cost)
    proposal = (
        None
        if candidate is None
        else Outlook(
            p_meet=0.0 if past else candidate.predicted.p_meet_deadline,
            jct_p50_s=candidate.predicted.jct_s.p50,
            cost_usd=candidate.predicted.cost_usd.mean,
        )
    )
    verdict = lateness.decide(current, proposal, time_left_s=time_left_s)
    figures: dict[str, Any] = dict(
        current_cost_usd=current_cost,
        current_p_meet=current.p_meet,
        current_jct_p50_s=current.jct_p50_s,
        on_late=lateness.on_late,
    )
    if proposal is not None:
        figures.update(
            proposal_cost_usd=proposal.cost_usd, proposal_p_meet=proposal.p_meet, proposal_jct_p50_s=proposal.jct_p50_s
        )
    return Judgement(verdict, figures)


def stand_in_stages(
    rest: Sequence[StagePlan],
    unavailable: Sequence[str],
    *,
    type_of: Callable[[StagePlan], InstanceType],
    stand_in: Callable[[InstanceType, bool], InstanceType | None],
) -> tuple[list[StagePlan], dict[str, str]]:
    """``rest`` with each stage on an unavailable type moved to its stand-in (same workers per instance, so
    placement and epochs are unchanged) and re-priced; and the substitutions made (type name → stand-in name)."""
    stages: list[StagePlan] = []
    substitutions: dict[str, str] = {}
    for stage in rest:
        itype = type_of(stage)
        sub = stand_in(itype, stage.spot) if itype.key in unavailable else None
        if sub is None:
            stages.append(stage)
            continue
        substitutions[itype.name] = sub.name
        ratio = price_hr(sub, stage.spot) / max(price_hr(itype, stage.spot), 1e-12)
        cost = stage.predicted_cost_usd * ratio if stage.predicted_cost_usd is not None else None
        stages.append(
            stage.model_copy(
                update={"instance_type": sub.name, "cloud": sub.cloud, "region": sub.region, "predicted_cost_usd": cost}
            )
        )
    return stages, substitutions


# -- estimates the decisions are fed ------------------------------------------------------------


def mean_task_s(measured: Sequence[float], stage: StagePlan, *, slots: int) -> float | None:
    """A stage's mean task time: measured in this run (not cold), else the plan's (the simulator's own figure),
    else (an older plan) its predicted duration per wave of ``slots`` trials; None when there is nothing."""
    if measured:
        return statistics.mean(measured)
    if stage.predicted_task_s:
        return stage.predicted_task_s
    if stage.predicted_duration_s:  # includes waiting for instances: an over-estimate
        return stage.predicted_duration_s / max(1, math.ceil(stage.trials / max(1, slots)))
    return None


def startup_samples(
    itype: InstanceType, measured: Mapping[str, Sequence[float]], profile: Profile | None
) -> list[float]:
    """Start-up seconds of ``itype`` to take a quantile of: what this run measured, else the profile's samples of
    its cloud (and type), else the planner model's documented per-cloud defaults."""
    samples = list(measured.get(itype.name, []))
    if not samples and profile is not None:
        samples = [
            x
            for s in profile.startup
            if s.cloud == itype.cloud and s.instance_type in (None, itype.name)
            for x in s.samples_s
        ]
    if not samples:
        samples = list(facts_or_like(itype.cloud).startup_s)
    return samples
