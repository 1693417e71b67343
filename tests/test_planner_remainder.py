"""Re-planning what is left of a parallel-bracket run: each bracket's remaining stages from its own start.

At one bracket's stage boundary the remainder is every bracket's stages not started yet; a running
bracket's rest starts when its current stage ends, a bracket not started yet at its offset. The planner
plans that remainder with the brackets side by side at those fixed offsets (``plan_stages(offsets=...)``).
"""

from __future__ import annotations

import numpy as np
import pytest

from planner_helpers import ideal_model, itype
from rubberband.errors import InfeasibleError
from rubberband.planner.api import SearchOptions, plan_stages
from rubberband.planner.brackets import BracketSetup, ParallelSimulator, Remainder, parallel_remainder
from rubberband.planner.schedule import Stage, hyperband_brackets
from rubberband.planner.search import Goal, PlanSpace
from rubberband.planner.simulator import SimSettings

GPU1 = itype("gpu1", gpus=1, price=3.6)
GPU4 = itype("gpu4", gpus=4, price=14.4)
HB = [s for b in hyperband_brackets(3, 1, 9) for s in b]  # brackets of 9 (stages 0-2), 5 (3-4) and 3 (5) trials


def test_the_remainder_starts_with_the_bracket_at_its_boundary_then_by_start():
    # bracket 0 runs its stage 0 (30 s left), bracket 1 is at its boundary before stage 3, bracket 2 is in its
    # last stage (nothing left to plan), bracket 3 is past its offset but not started
    parts = [([1, 2], 30.0), ([3, 4], 0.0), ([], 12.0), ([6, 7], -5.0)]
    assert parallel_remainder(parts, 1) == Remainder(positions=(3, 4, 6, 7, 1, 2), offsets_s=(0.0, 0.0, 30.0))
    with pytest.raises(ValueError, match="at its boundary"):
        parallel_remainder(parts, 2)


def _remainder(delay_s: float):
    """Bracket 1 at its boundary (stages 3, 4 from now); bracket 0's stages 1, 2 after its running stage's
    ``delay_s``; bracket 2 (stage 5) not started, its offset 50 s away."""
    stages = [HB[3], HB[4], HB[1], HB[2], HB[5]]
    return stages, (0.0, delay_s, 50.0)


def _model_and_types():
    return (ideal_model(t_iter=0.5, dataset=1000, batch=10, startup=60.0, sigma=0.05, termination=10.0), [GPU1, GPU4])


def _shortest(stages, offsets) -> float:
    """The remainder's shortest feasible JCT at those offsets (what an impossible deadline is answered with)."""
    model, types = _model_and_types()
    with pytest.raises(InfeasibleError) as exc:
        plan_stages(
            PlanSpace(stages, types, model, 8),
            Goal(1.0, 0.9),
            SimSettings(samples=100),
            SearchOptions(brackets=BracketSetup(offsets=offsets)),
        )
    return exc.value.shortest_jct_s


def test_a_parallel_remainder_is_planned_at_its_fixed_offsets():
    model, types = _model_and_types()
    stages, offsets = _remainder(200.0)
    shortest = _shortest(stages, offsets)
    # bracket 0's rest cannot start before its running stage ends
    with pytest.raises(InfeasibleError) as alone:
        plan_stages(PlanSpace([HB[1], HB[2]], types, model, 8), Goal(1.0, 0.9), SimSettings(samples=100))
    assert shortest >= 200.0 + 0.95 * alone.value.shortest_jct_s
    # a deadline that loose makes one bracket after another cheapest for a fresh plan (test_planner_brackets);
    # mid-run the brackets run side by side whatever: the offsets stay as given, never searched
    for deadline in (shortest * 1.3, shortest * 5):
        out = plan_stages(
            PlanSpace(stages, types, model, 8),
            Goal(deadline, 0.9),
            SimSettings(samples=100),
            SearchOptions(brackets=BracketSetup(offsets=offsets)),
        )
        assert out.brackets == "parallel" and out.offsets == offsets
        assert out.result.meets(deadline, 0.9) and out.result.jct.min() >= 200.0
        again = ParallelSimulator(stages, model, SimSettings(samples=100), BracketSetup(offsets=offsets)).simulate(
            out.configs
        )
        assert np.allclose(again.jct, out.result.jct)


def test_a_later_start_buys_speed_for_the_delayed_bracket():
    """The same remainder with bracket 0's rest starting 0 s or 300 s from now, at the same deadline: the
    delayed one needs a faster (costlier) plan for that bracket."""
    model, types = _model_and_types()
    stages, late = _remainder(300.0)
    deadline = _shortest(stages, late) * 1.1
    early = plan_stages(
        PlanSpace(stages, types, model, 8),
        Goal(deadline, 0.9),
        SimSettings(samples=100),
        SearchOptions(brackets=BracketSetup(offsets=(0.0, 0.0, 50.0))),
    )
    delayed = plan_stages(
        PlanSpace(stages, types, model, 8),
        Goal(deadline, 0.9),
        SimSettings(samples=100),
        SearchOptions(brackets=BracketSetup(offsets=late)),
    )
    assert delayed.result.meets(deadline, 0.9)
    assert delayed.result.cost_mean > early.result.cost_mean


def test_a_brackets_running_instances_are_kept_not_requested_nor_handed_over():
    """Mid-run, bracket 1's next stage keeps the instance its current stage runs on (``bracket_states``): it
    starts at its offset without a start-up, pays nothing for one, and no released instance is handed to it
    (the simulator's rule for a request that boots while another bracket releases one)."""
    from rubberband.planner.plan_space import StageConfig
    from rubberband.planner.simulator import RunningState, SimSettings

    model = ideal_model(t_iter=0.5, dataset=1000, batch=10, startup=100.0, termination=20.0)  # 50 s an epoch
    stages = [Stage(0, 0, 1, 1, 1), Stage(1, 0, 1, 1, 1)]
    configs = [StageConfig(GPU1, 1, 1), StageConfig(GPU1, 1, 1)]
    fresh = RunningState("", 0)
    kept = [fresh, RunningState(GPU1.key, 1)]
    shared = ParallelSimulator(stages, model, SimSettings(samples=10), BracketSetup(offsets=[0.0, 100.0], states=kept))
    alone = ParallelSimulator(
        stages, model, SimSettings(samples=10), BracketSetup(offsets=[0.0, 100.0], states=kept, share=False)
    )
    res = shared.simulate(configs)
    assert np.allclose(res.jct, 150.0)  # bracket 0: 100 s start-up + 50 s; bracket 1: 100 s wait + 50 s
    assert np.allclose(res.cost, alone.simulate(configs).cost)  # nothing handed over to a running instance
    booting = ParallelSimulator(
        stages, model, SimSettings(samples=10), BracketSetup(offsets=[0.0, 100.0], states=[fresh, fresh])
    )
    assert np.allclose(booting.simulate(configs).jct, 250.0)  # without: bracket 1 boots a new one
    with pytest.raises(ValueError, match="one start state"):
        ParallelSimulator(stages, model, brackets=BracketSetup(offsets=[0.0, 100.0], states=[fresh]))
