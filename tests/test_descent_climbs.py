"""The greedy descent's way out of a local minimum: a trade pairs a move with a second one (planner/search.py).

A hand-made plan graph on a stub simulator: each plan has a fixed cost and JCT, the moves are the graph's edges,
so the test says exactly which plans the descent may reach and what a trade or a climb must find.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rubberband.planner.search import DescentLimits, Evaluator, Goal, PlanSearch, descend
from rubberband.planner.simulator import SimResult

DEADLINE_S = 100.0


@dataclass(frozen=True)
class Node:
    """A whole plan of the stub graph (a one-element plan): its name is its key."""

    name: str

    @property
    def key(self) -> tuple:
        return (self.name,)


#: name → (mean cost, JCT of every sample)
PLANS = {
    "start": (10.0, 50.0),
    "up": (10.2, 60.0),  # a climb: a little costlier, still in time
    "down": (9.5, 60.0),  # one step beyond the climb: cheaper than the start
    "miss": (9.0, 200.0),  # cheaper but late, and nothing wins its time back
    "dearer": (11.0, 40.0),
}
EDGES = {"start": ["up", "miss", "dearer"], "up": ["start", "down"], "miss": ["start"], "dearer": ["start"]}


class StubSim:
    """Simulates a stub plan of ``plans``: its cost and JCT in every sample."""

    samples = 40

    def __init__(self, plans: dict[str, tuple[float, float]]) -> None:
        self.plans = plans

    def simulate(self, plan, samples=None) -> SimResult:
        cost, jct = self.plans[plan[0].name]
        n = samples or self.samples
        return SimResult(
            configs=plan,
            jct=np.full(n, jct),
            cost=np.full(n, cost),
            stage_durations=[],
            stage_costs=[],
            breakdown={},
            by_type={},
            samples=n,
        )


def moves(space, plan):
    return [(Node(name),) for name in EDGES.get(plan[0].name, [])]


def run(limits: DescentLimits, plans: dict[str, tuple[float, float]] = PLANS):
    search = PlanSearch(None, Evaluator(StubSim(plans), 8), Goal(DEADLINE_S, 0.9))  # type: ignore[arg-type]
    return descend(search, (Node("start"),), moves, limits)


def test_a_small_stuck_descent_climbs_one_step_to_reach_a_cheaper_plan():
    out = run(DescentLimits())
    assert out.plan == (Node("down"),)
    assert out.result.cost_mean == 9.5


def test_without_climbs_the_descent_stays_at_its_local_minimum():
    """The deadline-missing saving ("miss") is paired too, but nothing from it is in time: only the climb helps."""
    for limits in (DescentLimits(climbs=0), DescentLimits(climb_neighbourhood=2), DescentLimits(trades=0)):
        out = run(limits)
        assert out.plan == (Node("start"),), limits
        assert out.result.cost_mean == 10.0


def test_a_climb_is_taken_only_when_the_second_step_ends_cheaper_than_where_it_started():
    out = run(DescentLimits(), {**PLANS, "down": (10.1, 60.0)})  # cheaper than the climb, dearer than the start
    assert out.plan == (Node("start"),)
