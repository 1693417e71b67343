"""Which shapes the profiler measures, and the worker counts it refuses."""

from __future__ import annotations

import pytest

from rubberband.catalog import load_catalog
from rubberband.errors import InputError
from rubberband.profiler.shapes import Shape, nodes_needed, parse_workers, plan_shapes, type_to_profile


def _type(name: str, cloud: str = "local"):
    return load_catalog([cloud]).find(name, cloud=cloud)


def test_the_default_type_measures_the_widest_allowed_trial_on_one_node():
    """A spec of local.cpu1 and local.cpu2 with 2-worker trials is profiled on local.cpu2, so the 2-worker trial is
    timed on one node as well as across two; the first type stays where it holds every allowed trial, or where no
    type of its device holds more."""
    cpu1, cpu2, cpu4 = _type("local.cpu1"), _type("local.cpu2"), _type("local.cpu4")
    assert type_to_profile([cpu1, cpu2], 2) == cpu2
    assert plan_shapes(cpu2, [1, 2]) == [Shape(1, 1), Shape(2, 1), Shape(2, 2)]
    assert type_to_profile([cpu1, cpu2], 1) == cpu1  # one-worker trials: the first type measures them all
    assert type_to_profile([cpu1, cpu4, cpu2], 2) == cpu2  # the narrowest that holds the trial
    assert type_to_profile([cpu1, cpu2], 4) == cpu2  # none holds 4 on one node: the widest there is
    assert type_to_profile([cpu4, cpu1], 2) == cpu4
    aws = load_catalog(["aws"])
    t4, v100 = aws.find("g4dn.xlarge"), aws.find("p3.8xlarge")
    assert type_to_profile([t4, v100], 4) == t4  # another device: the spec's first stays the reference


def test_one_node_and_two_nodes_where_the_type_allows():
    shapes = plan_shapes(_type("local.cpu2"), [1, 2, 4])
    assert shapes == [Shape(1, 1), Shape(2, 1), Shape(2, 2), Shape(4, 2)]
    assert nodes_needed(shapes) == 2
    assert plan_shapes(_type("local.cpu4"), [1, 2], cross_node=False) == [Shape(1, 1), Shape(2, 1)]
    assert plan_shapes(_type("local.cpu1"), [1, 2]) == [Shape(1, 1), Shape(2, 2)]


def test_placement_splits_workers_over_instances_rank0_first():
    assert Shape(3, 2).split() == (2, 1)
    assert Shape(3, 2).placement(["rb-node-a", "rb-node-b"]) == ("rb-node-a", "rb-node-a", "rb-node-b")
    assert Shape(2, 1).placement(["rb-node-a", "rb-node-b"]) == ("rb-node-a", "rb-node-a")


def test_worker_count_the_type_cannot_hold():
    with pytest.raises(InputError, match=r"5 workers do not fit on 2 local.cpu2 instances .* at most 4"):
        plan_shapes(_type("local.cpu2"), [1, 5])
    with pytest.raises(InputError, match="at most 2"):
        plan_shapes(_type("p3.2xlarge", "aws"), [4])


@pytest.mark.parametrize("text", ["", "0", "1,x", "-1,2"])
def test_bad_worker_lists(text):
    with pytest.raises(InputError, match="--workers"):
        parse_workers(text)


def test_worker_list_is_sorted_and_unique():
    assert parse_workers("4, 1,2,2") == [1, 2, 4]


def test_the_probe_may_use_all_but_the_smallest_share_of_each_later_run():
    """The probe's limit is not its even share: a cold worker start on a loaded machine outlasted a third of
    180 s in CI, and the profile then failed as "budget too small" before its function's own error."""
    from rubberband.profiler.runner import MIN_SHAPE_S, probe_limit_s

    assert probe_limit_s(129.0, later_runs=2) == 129.0 - 2 * MIN_SHAPE_S
    assert probe_limit_s(5.0, later_runs=4) == MIN_SHAPE_S  # nothing left: the shortest run still gets its floor


def test_configurations_on_warm_workers_are_not_charged_the_cold_start():
    """The shape's set-up paid the workers' cold start (tens of seconds on a loaded machine); configurations reuse
    those workers, so charging it per configuration capped their epochs at 5 of 20 iterations in CI."""
    from rubberband.profiler.measured import MIN_EPOCH_ITERATIONS, ConfigRunCost

    cold = ConfigRunCost(epochs=5, iteration_s=0.02, epoch_gap_s=0.01, setup_s=40.0, warm=False)
    warm = ConfigRunCost(epochs=5, iteration_s=0.02, epoch_gap_s=0.01, setup_s=40.0, warm=True)
    assert warm.seconds(20) == pytest.approx(1.0 + 5 * (20 * 0.02 + 0.01))
    assert cold.seconds(20) == pytest.approx(warm.seconds(20) + 40.0)
    assert warm.iterations_within(100.0, runs=3, wanted=20) == 20
    assert cold.iterations_within(100.0, runs=3, wanted=20) == MIN_EPOCH_ITERATIONS  # 3 cold starts do not fit
    # capped to what fits, never above what is wanted nor below the floor
    capped = warm.iterations_within(3 * warm.seconds(12), runs=3, wanted=20)
    assert capped in (11, 12) and warm.seconds(capped) * 3 <= 3 * warm.seconds(12) + 1e-9
    assert warm.iterations_within(1.0, runs=3, wanted=20) == MIN_EPOCH_ITERATIONS


def test_without_a_probe_the_first_shape_may_use_all_but_the_smallest_share_of_each_later_run(monkeypatch, tmp_path):
    """With few iterations no probe runs, so the first shape pays the workers' cold start: an even third of 120 s
    ran out in CI beside three other tests, and the profile failed as "budget too small" before the error the
    test expected. The shapes after it share what is left evenly."""
    from rubberband.profiler import runner
    from rubberband.profiler.measured import ProfileOptions
    from rubberband.profiler.runner import MIN_SHAPE_S, _Budget, _measure_shapes, _Steps

    shares: list[float] = []
    # every run times out
    monkeypatch.setattr(runner, "_run_shape", lambda steps, shape, ckpt, bounds, pool: shares.append(bounds.share_s))
    options = ProfileOptions(
        cloud="local",
        instance_type=_type("local.cpu2"),
        workers=(1, 2),
        budget_s=120.0,
        iterations=4,
        measure_restart=False,
    )
    shapes = [Shape(1, 1), Shape(2, 1)]
    budget = _Budget(120.0)
    notes: list[str] = []
    steps = _Steps(None, options, {}, [], tmp_path, budget, notes, lambda *a, **k: None)
    _measure_shapes(steps, shapes, None)
    assert shares[0] == pytest.approx(120.0 - 2 * MIN_SHAPE_S, abs=1.0)  # one later shape, and the configurations
    assert shares[1] == pytest.approx(budget.left() / 2, abs=1.0)
    assert len(notes) == 2 and all("did not finish within" in note for note in notes)


def test_many_iterations_are_probed_then_capped_to_fit_each_shares_budget(monkeypatch, tmp_path):
    """20 000 iterations of 20 ms (400 s) asked within a 60 s budget: a short probe times an iteration, then each
    shape runs only as many iterations as fit its share (with room for its set-up), saying so. The whole command
    against the budget on a real cluster: bench/bench_profiler.py --budget-check 60."""
    from rubberband.profiler import runner
    from rubberband.profiler.measured import ProfileOptions, ShapeResult
    from rubberband.profiler.runner import PROBE_ITERATIONS, _Budget, _measure_shapes, _Steps

    asked: list[tuple[int, float]] = []

    def run_shape(steps, shape, ckpt, bounds, pool):
        asked.append((bounds.iterations, bounds.share_s))
        return ShapeResult(shape, latencies_s=(0.02,) * min(bounds.iterations, 50), setup_s=0.5), 2.0

    monkeypatch.setattr(runner, "_run_shape", run_shape)
    options = ProfileOptions(
        cloud="local", instance_type=_type("local.cpu2"), workers=(1, 2), budget_s=60.0, iterations=20000
    )
    notes: list[str] = []
    steps = _Steps(None, options, {}, [], tmp_path, _Budget(60.0), notes, lambda *a, **k: None)
    results = _measure_shapes(steps, [Shape(1, 1), Shape(2, 1)], None)
    assert asked[0][0] == PROBE_ITERATIONS  # the probe
    for iterations, share in asked[1:]:
        assert 2 <= iterations < 20000 and 2.0 + iterations * 0.02 <= share  # set-up and iterations fit the share
    assert [r.skipped for r in results] == [None, None]
    assert sum("capped at" in n for n in notes) == 2


def test_the_shapes_leave_ray_tunes_probe_its_reserve_and_small_budgets_skip_it(monkeypatch, tmp_path):
    """Ray Tune's trial starts come after the shapes and the configurations, which leave them
    TUNE_START_RESERVE_S of the budget; a budget under TUNE_START_MIN_BUDGET_S, or --no-tune-start, skips the probe
    (saying why) and keeps nothing back for it."""
    from rubberband.profiler import runner
    from rubberband.profiler.measured import ProfileOptions
    from rubberband.profiler.runner import (
        MIN_SHAPE_S,
        TUNE_START_MIN_BUDGET_S,
        TUNE_START_RESERVE_S,
        _Budget,
        _measure_shapes,
        _Steps,
        _tune_start_skipped,
    )

    shares: list[float] = []
    monkeypatch.setattr(runner, "_run_shape", lambda steps, shape, ckpt, bounds, pool: shares.append(bounds.share_s))
    options = ProfileOptions(
        cloud="local", instance_type=_type("local.cpu2"), workers=(1,), budget_s=300.0, iterations=4
    )
    assert _tune_start_skipped(options) is None  # Ray Tune is in the test extra
    steps = _Steps(None, options, {}, [], tmp_path, _Budget(300.0), [], lambda *a, **k: None, TUNE_START_RESERVE_S)
    _measure_shapes(steps, [Shape(1, 1)], None)
    restarts = 10.0
    assert shares[0] == pytest.approx(300.0 - restarts - TUNE_START_RESERVE_S - MIN_SHAPE_S, abs=1.0)

    small = ProfileOptions(
        cloud="local", instance_type=_type("local.cpu2"), workers=(1,), budget_s=TUNE_START_MIN_BUDGET_S - 1
    )
    assert "a --budget under 120s leaves no time for it" in _tune_start_skipped(small)
    off = ProfileOptions(cloud="local", instance_type=_type("local.cpu2"), workers=(1,), tune_start=False)
    assert _tune_start_skipped(off) == "not asked for (--no-tune-start)"
