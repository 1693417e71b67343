"""Planner honesty: the greedy descent alone, the whole planner and the exact baseline, on small cases.

The descent is tested on its own (from the paper's start, maximum useful parallelism) so that a
no-op descent fails here; the exact optimum runs without an incumbent from the plan under test
and says whether it proved optimality or hit its node cap.
"""

import functools

import pytest

from rubberband.catalog import load_catalog
from rubberband.errors import InfeasibleError
from rubberband.planner.api import STATIC_TIE, SearchOptions, plan_stages, static_is_as_good
from rubberband.planner.baselines import exact_optimum
from rubberband.planner.model import fit_performance_model
from rubberband.planner.schedule import sha_stages
from rubberband.planner.search import Evaluator, Goal, PlanSearch, PlanSpace, descend, local_moves
from rubberband.planner.simulator import SimSettings, Simulator
from rubberband.profile import load_profile
from conftest import EXAMPLES

SAMPLES = 200
CASES = [(9, 3, 9), (8, 2, 8), (12, 3, 16)]
FACTORS = (1.2, 1.5, 2.0)


@functools.lru_cache(maxsize=None)
def setup():
    model = fit_performance_model(load_profile(EXAMPLES / "profiles" / "resnet50_cifar10_v100.json"))
    catalog = load_catalog(["aws"])
    types = tuple(catalog.find(n) for n in ("p3.2xlarge", "g4dn.xlarge", "p3.8xlarge"))
    return model, types


@functools.lru_cache(maxsize=None)
def shortest(case):
    model, types = setup()
    with pytest.raises(InfeasibleError) as info:
        plan_stages(
            PlanSpace(sha_stages(*case[:2], 1, case[2]), types, model, 2), Goal(1.0, 0.9), SimSettings(samples=SAMPLES)
        )
    return info.value.shortest_jct_s


@functools.lru_cache(maxsize=None)
def gaps():
    """Per case: (cost of the start / exact, descent alone / exact, whole planner / exact, whether the planner chose
    the best static plan within its tie)."""
    model, types = setup()
    out = {}
    for case in CASES:
        stages = sha_stages(case[0], case[1], 1, case[2])
        for factor in FACTORS:
            deadline = shortest(case) * factor
            space = PlanSpace(stages, types, model, 2)
            evaluator = Evaluator(Simulator(stages, model, SimSettings(samples=SAMPLES, seed=0)), 32)
            exact = exact_optimum(PlanSearch(space, evaluator, Goal(deadline, 0.9)))
            assert not exact.capped and exact.plan is not None
            start = space.fastest()
            alone = descend(PlanSearch(space, evaluator, Goal(deadline, 0.9)), start, local_moves)
            assert alone.result.meets(deadline, 0.9)
            whole = plan_stages(PlanSpace(stages, types, model, 2), Goal(deadline, 0.9), SimSettings(samples=SAMPLES))
            e = exact.result.cost_mean
            out[(case, factor)] = (
                evaluator.full(start).cost_mean / e,
                alone.result.cost_mean / e,
                whole.result.cost_mean / e,
                any(note.startswith("the best static plan is as cheap") for note in whole.notes),
            )
    return out


def test_the_greedy_descent_alone_comes_within_5_percent_of_the_exact_optimum():
    ratios = gaps()
    starts = [r[0] for r in ratios.values()]
    alone = [r[1] for r in ratios.values()]
    # a no-op descent stays at its start, which is far from optimal in every case
    assert min(starts) > 1.3
    assert all(r >= 1 - 1e-9 for r in alone)  # the exact optimum is a lower bound
    # measured (p90 prefetch, two-move trades): 8 of 9 cases within 1.32 %; SHA n=9 η=3 R=9 at 1.5× the
    # shortest deadline stays 13.6 % above (three stages on three types, one move at a time cannot get
    # there: the optimum runs every stage on p3.2xlarge at other waves, each step there costs more; a re-timing
    # step from the knapsack's estimates did not get there either, as they miss the carry-over), and without
    # the trades two cases were 13.6 % and 34.3 % above. The whole planner starts from the pool (below)
    assert sum(r <= 1.02 for r in alone) >= len(alone) - 1, alone
    assert max(alone) <= 1.15, alone


def test_the_whole_planner_comes_within_1_percent_of_the_exact_optimum():
    """Within the static tie everywhere (the best static plan is preferred to an elastic one up to 1 % cheaper,
    measured 0.23 % at most here), and at the optimum where it plans elastically."""
    ratios = gaps().values()
    assert all(1 - 1e-9 <= r[2] <= 1 + STATIC_TIE for r in ratios), ratios
    elastic = [r[2] for r in ratios if not r[3]]
    assert elastic and all(r <= 1.001 for r in elastic), elastic


def test_the_exact_search_says_when_it_hit_its_cap():
    model, types = setup()
    case = CASES[0]
    stages = sha_stages(case[0], case[1], 1, case[2])
    space = PlanSpace(stages, types, model, 2)
    evaluator = Evaluator(Simulator(stages, model, SimSettings(samples=SAMPLES, seed=0)), 32)
    capped = exact_optimum(PlanSearch(space, evaluator, Goal(shortest(case) * 1.5, 0.9)), max_nodes=20)
    assert capped.capped and capped.nodes == 20
    assert capped.optimality() == "capped after 20 nodes, not proven optimal"
    full = exact_optimum(PlanSearch(space, evaluator, Goal(shortest(case) * 1.5, 0.9)))
    assert not full.capped and full.optimality().startswith("proven optimal")
    # the planner reports the extent of its exact check
    out = plan_stages(
        PlanSpace(stages, types, model, 2),
        Goal(shortest(case) * 1.5, 0.9),
        SimSettings(samples=SAMPLES),
        SearchOptions(include_exact=True),
    )
    assert out.exact_note.startswith("proven optimal")


def test_a_static_plan_as_cheap_and_as_fast_is_preferred():
    import numpy as np

    from rubberband.planner.simulator import SimResult

    def result(cost, jct):
        return SimResult(
            configs=(),
            jct=np.full(10, jct),
            cost=np.full(10, cost),
            stage_durations=[],
            stage_costs=[],
            breakdown={},
            by_type={},
            samples=10,
        )

    assert static_is_as_good(result(1.0000015, 100.0), result(1.0, 100.0), 0.9)
    assert not static_is_as_good(result(1.0000015, 101.0), result(1.0, 100.0), 0.9)  # slower
    assert not static_is_as_good(result(1.05, 90.0), result(1.0, 100.0), 0.9)  # 5 % dearer


@pytest.mark.e2e
def test_plan_cli_reports_the_exact_search_extent(cli_here, tmp_path):
    import yaml

    spec = yaml.safe_load((EXAMPLES / "quickstart.yaml").read_text())
    spec["scheduler"].update(trials=9, max_epochs=9)
    spec["deadline"] = "40m"
    spec["profile"] = str(EXAMPLES / "profiles" / "resnet50_cifar10_v100.json")
    (tmp_path / "small.yaml").write_text(yaml.safe_dump(spec))
    out = tmp_path / "plan.json"
    result = cli_here("plan", tmp_path / "small.yaml", "--samples", "200", "--exact", "--head", "local", "--out", out)
    assert result.returncode == 0, result.stderr
    assert "Exact optimum:" in result.stdout and "proven optimal" in result.stdout
    assert "1.00× cheaper" not in result.stdout
    import json

    exact = json.loads(out.read_text())["baselines"]["exact"]
    assert exact["note"].startswith("proven optimal")
