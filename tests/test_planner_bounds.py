"""planner/bounds.py: the work bound and the deadline-aware bound, on a closed-form model and against the exact
optimum."""

from __future__ import annotations

import math

import pytest

from rubberband.planner.baselines import exact_optimum
from rubberband.planner.bounds import Accounting, deadline_bound, stage_min_cost, work_bound
from rubberband.planner.schedule import sha_stages
from rubberband.planner.search import Evaluator, Goal, PlanSearch, PlanSpace
from rubberband.planner.plan_space import StageConfig
from rubberband.planner.simulator import SimSettings, Simulator
from planner_helpers import ideal_model, itype

GPU1 = itype("gpu1", price=3.6)  # $0.001 a second
GPU4 = itype("gpu4", gpus=4, price=14.4)
STAGES = sha_stages(4, 2, 1, 2)  # 4 trials for 1 epoch, then 2 for 1 more


def test_with_perfect_scaling_and_no_start_up_the_bounds_are_the_work():
    """50 s epochs, 6 trial-epochs at $0.001/s: $0.30 however the trials are laid out, if the deadline allows."""
    space = PlanSpace(STAGES, [GPU1], ideal_model(t_iter=0.5, dataset=1000, batch=10), 1)
    assert work_bound(space) == pytest.approx(0.30)
    assert deadline_bound(space, 1e4, Accounting()) == pytest.approx(0.30)
    # two stages of one 50 s wave each is the fastest any plan can be: a shorter deadline has no plan
    assert deadline_bound(space, 100.0, Accounting()) == pytest.approx(0.30)
    assert math.isinf(deadline_bound(space, 99.0, Accounting()))


def test_a_part_filled_instance_is_paid_whole():
    """One trial on a 4-GPU instance keeps it billed: its three idle GPUs count."""
    space = PlanSpace(STAGES, [GPU4], ideal_model(t_iter=0.5, dataset=1000, batch=10), 1)
    assert stage_min_cost(space, 1, StageConfig(GPU4, 1, 1), 1.0) == pytest.approx(50 * 0.004)
    assert stage_min_cost(space, 0, StageConfig(GPU4, 1, 1), 1.0) == pytest.approx(50 * 0.004)


@pytest.mark.parametrize("factor", [1.05, 1.5, 3.0])
def test_the_deadline_aware_bound_is_below_the_exact_optimum_and_tightens_with_the_deadline(factor):
    model = ideal_model(t_iter=0.5, dataset=1000, batch=10, startup=30.0, sigma=0.05, restart=3.0)
    space = PlanSpace(STAGES, [GPU1, GPU4], model, 2)
    sim = Simulator(STAGES, model, SimSettings(samples=100, seed=0))
    deadline = 200.0 * factor
    exact = exact_optimum(PlanSearch(space, Evaluator(sim, 32), Goal(deadline, 0.9)))
    assert exact.result is not None and not exact.capped
    bound = deadline_bound(space, deadline, Accounting(sim.min_factor()))
    assert bound <= exact.result.cost_mean
    assert bound >= deadline_bound(space, deadline * 2, Accounting(sim.min_factor()))
