"""Spot under a deadline, the executor's side: what it feeds :class:`~rubberband.planner.policies.SpotPolicy`.

The decision itself (stay on spot or move to on-demand) is the planner's pure ``SpotPolicy``, the object the
simulator calls too. This module turns what the executor knows into the policy's
:class:`~rubberband.planner.policies.SpotSituation`, without I/O or a clock:

* :func:`stage_market` — the market a stage is planned on (one accessor, so the per-stage market of the plan
  schema can replace the ``spot`` flag in one place);
* :func:`at_confidence` — a stage's predicted duration at the run's confidence, from the plan's p50 and p95
  (a normal tail between them);
* :func:`decision_outlook` — a stage's predicted duration on the type its spot work falls back to
  (:func:`fallback_slowdown`): the work left is measured there, as Uniform Progress measures it on on-demand;
* :func:`work_left_s` — the run's predicted remaining time: the current stage's estimated remainder (the
  prefetch policy's estimate) and the later stages at the confidence, scaled by the slowdown measured so far;
* :func:`restart_s` — what one more preemption costs: a replacement's start-up (the prefetch quantile),
  the checkpoint restore (trial setup), and the work lost since the last checkpoint (one checkpoint interval).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from statistics import NormalDist
from typing import Any

from rubberband.planner.policies import Market

#: The quantile of the predictions the spot decisions see: the median, as the planner's simulator feeds the same
#: :class:`~rubberband.planner.policies.SpotPolicy` (its P(meet) is computed for decisions made that way, so the
#: plan's prediction describes this executor; ``margin_s`` is the knob for more caution).
DECISION_QUANTILE = 0.5
#: z of the 0.95 quantile: the plan's p95 is p50 + this many standard deviations.
_Z95 = NormalDist().inv_cdf(0.95)


def stage_market(stage: Any) -> Market:
    """The market a stage is planned on: its ``market`` when the plan names one, else its ``spot`` flag."""
    market = getattr(stage, "market", None)
    if market is not None:
        return Market(getattr(market, "value", market))
    return Market.SPOT if getattr(stage, "spot", False) else Market.ON_DEMAND


def on_demand_allowed(stage: Any) -> bool:
    """Whether a spot stage may fall back to on-demand (the plan may forbid it; allowed by default)."""
    return bool(getattr(stage, "on_demand_fallback", True))


def at_confidence(p50: float, p95: float | None, confidence: float) -> float:
    """A duration's ``confidence`` quantile from its median and 0.95 quantile (normal between them).

    Below the median the median is used: a spot decision must not count on luck.
    """
    if p95 is None or confidence <= 0.5 or p95 <= p50:
        return p50
    z = NormalDist().inv_cdf(min(confidence, 0.9999))
    return p50 + (p95 - p50) * z / _Z95


@dataclass(frozen=True)
class StageOutlook:
    """A later stage's predicted duration (p50, p95 when the plan has it)."""

    p50_s: float
    p95_s: float | None = None


def stage_outlook(plan: Any, i: int) -> StageOutlook:
    """Stage ``i``'s predicted duration: the plan's p50 (and p95 where the plan's prediction has it)."""
    stage = plan.stages[i]
    dists = plan.predicted.stage_duration_s
    dist = dists[i] if i < len(dists) else None
    p50 = stage.predicted_duration_s if stage.predicted_duration_s is not None else (dist.p50 if dist else 0.0)
    p95 = dist.p95 * p50 / dist.p50 if dist is not None and dist.p50 > 0 else None
    return StageOutlook(p50, p95)


def checkpoint_every(plan: Any, stage: Any) -> int:
    """Epochs between a trial's checkpoints in ``stage``: the plan's spot interval (``plan.spot.checkpoint_epochs``,
    chosen with the preemptions) on a spot stage, else every epoch (what the simulator plays)."""
    spot = getattr(plan, "spot", None)
    if spot is None or stage_market(stage) is not Market.SPOT:
        return 1
    return max(1, int(getattr(spot, "checkpoint_epochs", 1) or 1))


def fallback_slowdown(stage: Any) -> float:
    """How much longer a stage's work takes on the type it falls back to (epoch time there over here): the plan's
    ``fallback_slowdown`` for a spot stage with a ``fallback_instance_type``, else 1."""
    if stage_market(stage) is not Market.SPOT or not getattr(stage, "fallback_instance_type", None):
        return 1.0
    return float(getattr(stage, "fallback_slowdown", None) or 1.0)


def decision_outlook(plan: Any, i: int) -> StageOutlook:
    """Stage ``i`` as the spot decisions count it: on its fall-back type, where Uniform Progress measures the work
    left (the simulator's tails too)."""
    out = stage_outlook(plan, i)
    slow = fallback_slowdown(plan.stages[i])
    return out if slow == 1.0 else StageOutlook(out.p50_s * slow, None if out.p95_s is None else out.p95_s * slow)


@dataclass(frozen=True)
class StageRest:
    """The current stage's estimated remainder (running trials' rest + waiting waves) and its confidence quantile
    over its median (≥ 1), applied to that remainder."""

    remaining_s: float = 0.0
    ratio: float = 1.0


def work_left_s(
    current: StageRest,
    later: Sequence[StageOutlook],
    *,
    confidence: float,
    slowdown: float,
    waiting_for_instance_s: float = 0.0,
) -> float:
    """The run's predicted remaining time if nothing more were preempted: the ``current`` stage's rest, ``later``
    stages each at ``confidence`` and scaled by ``slowdown`` (actual / predicted of the stages done; never below
    1: an early fast stage does not buy risk), and ``waiting_for_instance_s``: a replacement the stage must wait
    for (its start-up), which spot and on-demand pay alike.
    """
    ratio = max(1.0, slowdown)
    rest = sum(at_confidence(s.p50_s, s.p95_s, confidence) for s in later) * ratio
    return max(0.0, current.remaining_s) * max(1.0, current.ratio) + rest + max(0.0, waiting_for_instance_s)


def restart_s(*, startup_s: float, restore_s: float, checkpoint_interval_s: float) -> float:
    """One preemption's cost in time: a replacement's start-up + checkpoint restore + work since the checkpoint."""
    return max(0.0, startup_s) + max(0.0, restore_s) + max(0.0, checkpoint_interval_s)
