"""What a run cost: bills every instance from the journal's timestamps.

An instance is billed under its cloud's :data:`~rubberband.catalog.BILLING_RULES` for its
lifetime, from the moment it was requested to the moment it was terminated (what the
clouds bill: a booting machine is paid for). An instance the journal never saw terminated
is billed up to ``now`` (still alive, or the executor died and resume has not stopped it yet).
Per-stage costs split each instance's bill over the stages in proportion to the time it
lived during each stage's window (a stage's window runs from its start to the next stage's
start; time before the first stage goes to the first one).

In head mode the run's head instance (journaled once, :class:`~rubberband.executor.journal.HeadLife`)
is billed under the same rule from its launch until ``grace_s`` after ``now`` (the run's end: the
head's watchdog ends it after its results grace), the span the planner bills for it. It is part of
the run's total, outside every stage.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

from rubberband.catalog import BILLING_RULES, BillingRule
from rubberband.executor.journal import HeadLife, InstanceLife, RunState


@dataclass(frozen=True)
class InstanceBill:
    id: str
    instance_type: str
    cloud: str
    price_hr: float
    lifetime_s: float
    billed_s: float
    cost_usd: float


@dataclass(frozen=True)
class Bill:
    instances: tuple[InstanceBill, ...]
    total_usd: float  # workers and head
    by_stage: dict[int, float]  # workers only
    head: InstanceBill | None = None

    @property
    def head_usd(self) -> float:
        return self.head.cost_usd if self.head is not None else 0.0

    @property
    def workers_usd(self) -> float:
        return self.total_usd - self.head_usd


def bill_instance(life: InstanceLife, *, now: float, rules: dict[str, BillingRule] = BILLING_RULES) -> InstanceBill:
    end = life.terminated_at if life.terminated_at is not None else now
    lifetime = max(0.0, end - life.requested_at)
    rule = rules.get(life.cloud, BillingRule())
    billed = rule.billed_seconds(lifetime)
    return InstanceBill(
        life.id, life.instance_type, life.cloud, life.price_hr, lifetime, billed, rule.cost(lifetime, life.price_hr)
    )


def bill_head(head: HeadLife, *, now: float, rules: dict[str, BillingRule] = BILLING_RULES) -> InstanceBill:
    """The head's bill: launch until ``now`` (the run's end) plus its results grace."""
    lifetime = max(0.0, now + head.grace_s - head.launched_at)
    rule = rules.get(head.cloud, BillingRule())
    return InstanceBill(
        head.id,
        head.instance_type,
        head.cloud,
        head.price_hr,
        lifetime,
        rule.billed_seconds(lifetime),
        rule.cost(lifetime, head.price_hr),
    )


def _stage_shares(life: InstanceLife, end: float, starts: list[tuple[float, int]]) -> dict[int, float]:
    """Fraction of the instance's lifetime spent in each stage's window."""
    if not starts:
        return {life.stage: 1.0}
    times = [t for t, _ in starts]
    span = end - life.requested_at
    if span <= 0:
        index = max(0, bisect.bisect_right(times, life.requested_at) - 1)
        return {starts[index][1]: 1.0}
    shares: dict[int, float] = {}
    for i, (start, stage) in enumerate(starts):
        lo = -float("inf") if i == 0 else start
        hi = starts[i + 1][0] if i + 1 < len(starts) else float("inf")
        overlap = min(hi, end) - max(lo, life.requested_at)
        if overlap > 0:
            shares[stage] = shares.get(stage, 0.0) + overlap / span
    return shares or {starts[-1][1]: 1.0}


def _parallel_shares(life: InstanceLife, end: float, state: RunState) -> dict[int, float] | None:
    """Parallel brackets: the instance's lifetime split over the stage windows of the bracket it served
    at each moment (its first bracket, then each bracket it was handed to); None for other plans."""
    plan_stages = state.plan.get("stages", []) if isinstance(state.plan, dict) else []
    bracket_of = [int(s.get("bracket", 0)) for s in plan_stages]
    if state.plan.get("brackets") != "parallel" or len(set(bracket_of)) < 2 or not 0 <= life.stage < len(bracket_of):
        return None
    moves = sorted(
        (float(d["t"]), int(d["to_stage"]))
        for d in state.decisions
        if d.get("kind") == "handoff" and d.get("id") == life.id and 0 <= int(d["to_stage"]) < len(bracket_of)
    )
    cuts = [(life.requested_at, bracket_of[life.stage])] + [(t, bracket_of[g]) for t, g in moves]
    shares: dict[int, float] = {}
    for i, (lo, bracket) in enumerate(cuts):
        hi = cuts[i + 1][0] if i + 1 < len(cuts) else end
        starts = sorted(
            (rec.started_at, g)
            for g, rec in state.stages.items()
            if rec.started_at is not None and g < len(bracket_of) and bracket_of[g] == bracket
        )
        if hi <= lo or not starts:
            continue
        part = InstanceLife(
            id=life.id,
            instance_type=life.instance_type,
            cloud=life.cloud,
            price_hr=life.price_hr,
            spot=life.spot,
            stage=life.stage,
            requested_at=lo,
        )
        weight = (hi - lo) / max(end - life.requested_at, 1e-9)
        for g, share in _stage_shares(part, hi, starts).items():
            shares[g] = shares.get(g, 0.0) + share * weight
    return shares or None


def bill_run(state: RunState, *, now: float, rules: dict[str, BillingRule] = BILLING_RULES) -> Bill:
    """Bill every instance of the run (the head too, if journaled) and attribute the workers' to stages
    (with parallel brackets, to the stages of the brackets the instance served)."""
    starts = sorted((rec.started_at, s) for s, rec in state.stages.items() if rec.started_at is not None)
    bills = []
    by_stage: dict[int, float] = {}
    for life in sorted(state.instances.values(), key=lambda x: x.requested_at):
        item = bill_instance(life, now=now, rules=rules)
        bills.append(item)
        end = life.terminated_at if life.terminated_at is not None else now
        for stage, share in (_parallel_shares(life, end, state) or _stage_shares(life, end, starts)).items():
            by_stage[stage] = by_stage.get(stage, 0.0) + item.cost_usd * share
    head = bill_head(state.head, now=now, rules=rules) if state.head is not None else None
    total = sum(b.cost_usd for b in bills) + (head.cost_usd if head is not None else 0.0)
    return Bill(tuple(bills), total, by_stage, head)
