"""The planner's walk up from the cheapest plan (planner/search.py ``ascend``), and why the planner takes it.

A hand-made plan graph on the stub simulator of test_descent_climbs.py: each plan has a fixed cost and JCT, the
moves are the graph's edges, so the test says exactly which plan the ascent must reach. Then one drawn workload of
bench_planner_gap.py whose optimum only the ascent finds, planned for real.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from rubberband.catalog import load_catalog
from rubberband.errors import InfeasibleError
from rubberband.planner.api import plan_stages
from rubberband.planner.baselines import exact_optimum
from rubberband.planner.model import DeviceModel, StartupModel, fit_performance_model
from rubberband.planner.schedule import hyperband_brackets
from rubberband.planner.search import (
    AscentLimits,
    Evaluator,
    Goal,
    PlanSearch,
    PlanSpace,
    ascend,
    rising_moves,
)
from rubberband.planner.plan_space import plan_key
from rubberband.planner.simulator import SimSettings, Simulator
from rubberband.profile import load_profile
from conftest import EXAMPLES
from test_descent_climbs import Node, StubSim

DEADLINE_S = 100.0

#: name → (mean cost, JCT of every sample)
PLANS = {
    "cheapest": (5.0, 180.0),
    "jump": (7.5, 20.0),  # far past the deadline: 160 s for 2.5, but only 80 s of it is worth anything
    "step": (7.0, 90.0),  # just in time: 80 s for 2.0
    "cheaper-late": (4.0, 400.0),
    "half-way": (5.5, 150.0),  # late, but faster: a second step reaches the deadline
    "after-half-way": (6.0, 95.0),
}
EDGES = {
    "cheapest": ["jump", "step", "cheaper-late"],
    "slow": ["half-way", "cheaper-late"],
    "half-way": ["after-half-way", "slow"],
}


def moves(space, plan):
    return [(Node(name),) for name in EDGES.get(plan[0].name, [])]


def climb(start: str, plans=None, limits: AscentLimits = AscentLimits()):
    plans = {**PLANS, "slow": (5.0, 180.0), **(plans or {})}
    search = PlanSearch(None, Evaluator(StubSim(plans), 8), Goal(DEADLINE_S, 0.9))  # type: ignore[arg-type]
    return ascend(search, (Node(start),), moves, limits)


def test_the_ascent_buys_time_up_to_the_deadline_not_past_it():
    out = climb("cheapest")
    assert out.met
    assert out.plan == (Node("step"),)  # "jump" buys more time per dollar, most of it past the deadline
    assert out.result.cost_mean == 7.0
    assert out.result.samples == StubSim.samples  # confirmed with every sample


def test_the_ascent_takes_as_many_steps_as_it_needs():
    out = climb("slow")
    assert out.met and out.plan == (Node("after-half-way"),)
    assert out.iterations == 2


def test_the_ascent_says_when_it_met_nothing():
    assert not climb("slow", limits=AscentLimits(max_steps=1)).met  # one step is not enough
    assert not climb("cheapest", limits=AscentLimits(neighbourhood=2)).met  # three moves: too many to look at
    stuck = climb("cheapest", {"step": (7.0, 180.0), "jump": (7.5, 181.0)})  # nothing buys time
    assert not stuck.met and stuck.plan == (Node("cheapest"),)
    assert stuck.candidates_evaluated == 3


def test_a_start_far_from_the_deadline_is_left_to_the_descent():
    far = climb("cheapest", {"cheapest": (5.0, 201.0)})  # more than 2x late: a long walk up
    assert not far.met and far.iterations == 0 and far.candidates_evaluated == 0
    assert climb("cheapest", {"cheapest": (5.0, 201.0)}, limits=AscentLimits(late_factor=3.0)).met


def test_moves_that_cost_as_much_as_the_plan_in_hand_are_not_taken():
    search = PlanSearch(None, Evaluator(StubSim({**PLANS, "slow": (5.0, 180.0)}), 8), Goal(DEADLINE_S, 0.9))  # type: ignore[arg-type]
    out = ascend(search, (Node("cheapest"),), moves, below_usd=7.0)
    assert not out.met  # "step" (7.0) and "jump" (7.5) would meet it, at no saving


def test_a_cheapest_plan_already_in_time_is_the_ascents_answer():
    out = climb("cheapest", {"cheapest": (5.0, 50.0)})
    assert out.met and out.plan == (Node("cheapest"),) and out.iterations == 0


@pytest.fixture(scope="module")
def slow_starts():
    """bench_planner_gap.py's seed-1 workload #93: Hyperband η=3 R=3 (brackets one after another) on four AWS types,
    linear scaling, instances starting in 241 s (±30 %), trials of up to 2 workers, 1.95x the shortest deadline."""
    base = fit_performance_model(load_profile(EXAMPLES / "profiles" / "resnet50_cifar10_v100.json"))
    devices = {
        name: DeviceModel(
            alpha_grad=d.alpha_grad,
            beta_grad=d.beta_grad,
            alpha_sync_node=0.0,
            beta_sync_node=0.0,
            alpha_sync_cross=0.01 * d.alpha_grad,
            beta_sync_cross=0.0,
            gamma=1.5,
            source="test",
        )
        for name, d in base.devices.items()
    }
    startup = StartupModel(tuple(241.0 * f for f in (0.7, 0.85, 1.0, 1.15, 1.3)), "test")
    model = replace(base, devices=devices, startup_by_cloud={**base.startup_by_cloud, "aws": startup})
    catalog = load_catalog(["aws"])
    types = [catalog.find(n, region="us-east-1") for n in ("g5.xlarge", "p3.2xlarge", "g4dn.12xlarge", "p3.8xlarge")]
    stages = [s for b in hyperband_brackets(3, 1, 3) for s in b]
    space = PlanSpace(stages, types, model, 2)
    with pytest.raises(InfeasibleError) as info:
        plan_stages(space, Goal(1.0, 0.9), SimSettings(samples=200))
    return space, info.value.shortest_jct_s * 1.95


def test_the_planner_reaches_an_optimum_below_every_walk_down(slow_starts):
    """The optimum starts two instances for the first stage and keeps one through the rest; every plan between it
    and the descent's local minimum (two instances throughout) is costlier or late."""
    space, deadline = slow_starts
    goal = Goal(deadline, 0.9)
    planned = plan_stages(space, goal, SimSettings(samples=200))
    search = PlanSearch(space, Evaluator(Simulator(space.stages, space.model, SimSettings(samples=200)), 32), goal)
    exact = exact_optimum(search)
    assert not exact.capped and exact.result is not None
    assert planned.result.cost_mean <= exact.result.cost_mean * 1.001
    assert [c.instances for c in planned.configs] == [2, 1, 1]
    assert np.quantile(planned.result.jct, 0.9) <= deadline


def test_rising_moves_change_one_stage_to_a_faster_configuration(slow_starts):
    space, _ = slow_starts
    cheapest = space.cheapest()
    moves = rising_moves(space, cheapest)
    assert moves and len({plan_key(m) for m in moves}) == len(moves)
    for move in moves:
        changed = [i for i, (a, b) in enumerate(zip(cheapest, move)) if a != b]
        assert len(changed) == 1
        i = changed[0]
        assert space.stage_time(i, move[i]) <= space.stage_time(i, cheapest[i])
    first = cheapest[0]
    assert any(  # one more instance for the first stage: the step to this job's optimum
        (m[0].instance_type, m[0].workers, m[0].instances) == (first.instance_type, first.workers, first.instances + 1)
        for m in moves
    )
