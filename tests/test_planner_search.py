import functools

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from rubberband.catalog import load_catalog
from rubberband.errors import InfeasibleError, ProfileError
from rubberband.planner.api import SearchOptions, plan_stages
from rubberband.planner.model import fit_performance_model
from rubberband.planner.schedule import sha_stages
from rubberband.planner.search import Evaluator, Goal, PlanSearch, PlanSpace, knapsack_plans
from rubberband.planner.simulator import SimSettings, Simulator
from rubberband.profile import load_profile
from conftest import EXAMPLES
from planner_helpers import itype

SAMPLES = 200


@functools.lru_cache(maxsize=None)
def setup():
    model = fit_performance_model(load_profile(EXAMPLES / "profiles" / "resnet50_cifar10_v100.json"))
    catalog = load_catalog(["aws"])
    types = tuple(catalog.find(n) for n in ("p3.2xlarge", "g4dn.xlarge", "p3.8xlarge"))
    stages = tuple(sha_stages(9, 3, 1, 9))
    with pytest.raises(InfeasibleError) as info:
        plan_stages(PlanSpace(stages, types, model, 2), Goal(1.0, 0.9), SimSettings(samples=SAMPLES))
    return model, types, stages, info.value.shortest_jct_s


@functools.lru_cache(maxsize=None)
def cost(factor: float, confidence: float = 0.9) -> float | None:
    model, types, stages, shortest = setup()
    try:
        out = plan_stages(
            PlanSpace(stages, types, model, 2), Goal(shortest * factor, confidence), SimSettings(samples=SAMPLES)
        )
    except InfeasibleError:
        return None
    assert out.result.meets(shortest * factor, confidence)
    if out.static is not None:  # never costlier than the best static plan
        assert out.result.cost_mean <= out.static[1].cost_mean + 1e-12
    return out.result.cost_mean


FACTORS = st.sampled_from([1.0, 1.05, 1.1, 1.2, 1.35, 1.5, 1.75, 2.0, 2.5, 3.0, 4.0])
CONFIDENCES = st.sampled_from([0.5, 0.7, 0.8, 0.9, 0.95, 0.99])
PROPS = settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@PROPS
@given(FACTORS, FACTORS)
def test_looser_deadline_never_costs_more(f1, f2):
    lo, hi = sorted((f1, f2))
    assert cost(lo) is not None  # the shortest JCT itself is feasible
    assert cost(hi) <= cost(lo) + 1e-12


@PROPS
@given(CONFIDENCES, CONFIDENCES, FACTORS)
def test_higher_confidence_never_costs_less(p1, p2, factor):
    lo, hi = sorted((p1, p2))
    c_lo, c_hi = cost(factor, lo), cost(factor, hi)
    if c_hi is not None:
        assert c_lo is not None and c_hi >= c_lo - 1e-12


def test_elastic_plan_beats_static_and_matches_exact_on_a_small_case():
    model, types, stages, shortest = setup()
    out = plan_stages(
        PlanSpace(stages, types, model, 2),
        Goal(shortest * 2.0, 0.9),
        SimSettings(samples=SAMPLES),
        SearchOptions(include_exact=True),
    )
    assert out.static is not None and out.result.cost_mean < out.static[1].cost_mean
    exact = out.exact[1].cost_mean
    assert exact <= out.result.cost_mean + 1e-12
    assert out.result.cost_mean <= exact * 1.05
    assert out.candidates_evaluated > 0 and out.iterations > 0
    assert len(out.timeline.tasks) == sum(s.trials for s in stages)


def test_infeasible_deadline_reports_shortest_jct_and_its_cost():
    model, types, stages, shortest = setup()
    with pytest.raises(InfeasibleError) as info:
        plan_stages(PlanSpace(stages, types, model, 2), Goal(shortest * 0.5, 0.9), SimSettings(samples=SAMPLES))
    assert info.value.shortest_jct_s == pytest.approx(shortest)
    assert info.value.cost_usd > 0
    assert "shortest feasible JCT" in str(info.value) and "$" in str(info.value)


def test_budget_cap_reports_cheapest_plan_cost():
    model, types, stages, shortest = setup()
    with pytest.raises(InfeasibleError, match="budget") as info:
        plan_stages(
            PlanSpace(stages, types, model, 2), Goal(shortest * 3, 0.9, budget_usd=0.01), SimSettings(samples=SAMPLES)
        )
    assert info.value.cost_usd == pytest.approx(cost(3.0))


def test_unplannable_devices_are_skipped_or_rejected():
    model, _, stages, _ = setup()
    cpu = itype("cpu.big", gpus=0, device="CPU")
    with pytest.raises(ProfileError, match="device_speed"):
        PlanSpace(stages, [cpu], model, 2)
    space = PlanSpace(stages, [cpu, itype("v100", device="V100")], model, 2)
    assert space.skipped == ["cpu.big"] and [t.name for t in space.types] == ["v100"]


def test_knapsack_ladder_and_fastest_plan_are_in_the_plan_space():
    model, types, stages, _ = setup()
    space = PlanSpace(stages, types, model, 2)
    plans = knapsack_plans(space)
    assert plans and all(len(p) == len(stages) for p in plans)
    options = [set(c.key for c in space.options(i)) for i in range(len(stages))]
    assert all(c.key in options[i] for p in plans for i, c in enumerate(p))
    fastest = space.fastest()
    ev = Evaluator(Simulator(stages, model, SimSettings(samples=64)), 32)
    # the fastest plan is at least as fast as every knapsack plan (by the mean JCT)
    assert ev.full(fastest).jct_mean <= min(ev.full(p).jct_mean for p in plans) + 1.0


def test_branch_and_bound_equals_brute_force_and_bounds_hold():
    import itertools

    from rubberband.planner.baselines import cheapest_feasible, exact_optimum, lower_bounds

    model, types, _, _ = setup()
    stages = sha_stages(4, 2, 1, 4)  # (4, 1), (2, 2), (1, 4)
    space = PlanSpace(stages, types[:2], model, 2)
    ev = Evaluator(Simulator(stages, model, SimSettings(samples=100, seed=2)), 32)
    plans = list(itertools.product(*[space.options(i) for i in range(len(stages))]))
    results = {p: ev.full(p) for p in plans}
    for plan, res in results.items():  # the bounds used for pruning are valid
        cost_lb, jct_lb = lower_bounds(space, ev, plan)
        assert cost_lb <= res.cost_mean + 1e-12 and jct_lb <= res.jct.min() + 1e-9
    deadline = sorted(r.jct_quantile(0.9) for r in results.values())[len(results) // 3]
    feasible = [(r.cost_mean, p) for p, r in results.items() if r.meets(deadline, 0.9)]
    best_cost = min(c for c, _ in feasible)
    assert exact_optimum(PlanSearch(space, ev, Goal(deadline, 0.9))).result.cost_mean == pytest.approx(best_cost)
    assert cheapest_feasible(PlanSearch(space, ev, Goal(deadline, 0.9)), plans).result.cost_mean == pytest.approx(
        best_cost
    )


class _RecordingEvaluator(Evaluator):
    """An evaluator that records, at each full simulation, whether the mid sample ranked the plan cheaper than the
    cheapest plan meeting the goal simulated in full before it."""

    def __init__(self, sim: Simulator, screen_samples: int, goal: Goal) -> None:
        super().__init__(sim, screen_samples)
        self.goal, self.best, self.ranked_cheaper = goal, None, []

    def full(self, plan):
        res = super().full(plan)
        if self.best is not None:
            self.ranked_cheaper.append(self.mid(plan).cost_mean < self.mid(self.best[0]).cost_mean)
        if self.goal.met_by(res) and (self.best is None or res.cost_mean < self.best[1].cost_mean):
            self.best = (plan, res)
        return res


def test_branch_and_bound_with_screens_confirms_only_plans_the_mid_sample_ranks_cheaper():
    """With screening (``screen_slack``, ``cost_margin``) the pool search simulates in full only plans its 200-sample
    mid screen ranks cheaper than the best so far, and still finds the exhaustive search's answer."""
    from rubberband.planner.baselines import cheapest_feasible, shrink, static_plans

    model, types, _, _ = setup()
    stages = sha_stages(81, 3, 1, 27)
    space = PlanSpace(stages, types, model, 2)
    pool = knapsack_plans(space) + static_plans(space) + [shrink(space, p) for p in static_plans(space)]
    settings = SimSettings(samples=1000, seed=2)
    probe = Evaluator(Simulator(stages, model, settings), 32)
    goal = Goal(sorted(probe.screen(p).jct_quantile(0.9) for p in pool)[len(pool) // 2], 0.9)
    recording = _RecordingEvaluator(Simulator(stages, model, settings), 32, goal)
    found = cheapest_feasible(PlanSearch(space, recording, goal), pool, screen_slack=4, cost_margin=0.003)
    exhaustive = cheapest_feasible(PlanSearch(space, Evaluator(Simulator(stages, model, settings), 32), goal), pool)
    assert found.result is not None and exhaustive.result is not None and goal.met_by(found.result)
    assert found.result.cost_mean == pytest.approx(exhaustive.result.cost_mean, rel=1e-9)
    assert recording.ranked_cheaper and all(recording.ranked_cheaper)
    assert found.evaluated < exhaustive.evaluated
