"""ASHA simulated on a fixed cluster: closed forms, Ray Tune's continuation rule, the cluster search."""

from __future__ import annotations

import math
from dataclasses import replace
from types import SimpleNamespace

import numpy as np
import pytest

from planner_helpers import ideal_model, itype
from rubberband.planner.asha import (
    AshaCluster,
    AshaRungs,
    AshaSchedule,
    AshaSettings,
    AshaSimulator,
    TrialStarts,
    allowed_late,
    asha_baseline,
    lateness_order,
    rungs,
)
from rubberband.planner.start_lanes import StartLanes, TrialStart

GPU1 = itype("gpu1", gpus=1, price=3.6)
GPU4 = itype("gpu4", gpus=4, price=14.4)


def lanes(concurrency: float | None, sigma: float = 0.0):
    """Trial starts on ``concurrency`` lanes per instance on every type (None: independent starts), built (and
    so validated) now."""
    starts = None if concurrency is None else TrialStarts(concurrency, sigma=sigma)
    return lambda _type: starts


def test_rungs_are_ray_tunes_milestones():
    assert rungs(3, 1, 81) == [1, 3, 9, 27, 81]
    assert rungs(4, 1, 100) == [1, 4, 16, 64, 100]
    assert rungs(3, 2, 18) == [2, 6, 18]


def test_a_rung_cuts_at_numpys_percentile_of_the_results_before():
    """Ray Tune's rule: a result continues iff it is not below numpy's (linear) (1 - 1/eta) percentile of the
    rung's results so far."""
    rng = np.random.default_rng(0)
    for n in (1, 2, 5, 17):
        values = list(rng.random(n))
        cut = float(np.percentile(values, 100 * 2 / 3))
        for value, continues in ((cut - 1e-9, False), (cut, True), (cut + 1e-9, True)):
            rungs = AshaRungs(3, 1)
            for v in values:
                rungs.on_result(0, v)
            assert rungs.on_result(0, value) is continues, (n, value)
    assert AshaRungs(3, 1).on_result(0, -1.0)  # the first result at a rung always continues


def test_one_slot_per_trial_without_noise_has_a_closed_form():
    """Every trial starts at once; the first to report at each rung always continues, so the JCT is
    one trial trained to max_epochs, and the fixed cluster is billed until then."""
    model = ideal_model(t_iter=0.5, dataset=1000, batch=10, startup=30.0, eval_s=5.0, termination=10.0)
    sim = AshaSimulator(model, AshaSchedule(trials=9, eta=3, min_epochs=1, max_epochs=9), AshaSettings(samples=20))
    res = sim.simulate(AshaCluster(GPU1, 9, 1))
    jct = 30.0 + 9 * 50.0 + 3 * 5.0  # start-up, 9 epochs, an evaluation at rungs 1, 3 and 9
    assert np.allclose(res.jct, jct)
    assert np.allclose(res.cost, 9 * 3.6 / 3600 * (jct - 0 + 10.0))
    assert np.all(res.promotions[:, 0] == 9)
    # Ray Tune's rule continues at least as many trials as synchronous SHA promotes
    assert np.all(res.promotions[:, 1] >= 3) and np.all(res.promotions[:, 2] >= 1)
    parts = res.breakdown
    assert np.allclose(parts["training"] + parts["startup"] + parts["idle"] + parts["head"], res.cost)


def test_fewer_instances_take_longer_and_cost_per_hour_less():
    model = ideal_model(t_iter=0.5, dataset=1000, batch=10, startup=30.0, sigma=0.1)
    sim = AshaSimulator(model, AshaSchedule(trials=27, eta=3, min_epochs=1, max_epochs=27), AshaSettings(samples=40))
    small, big = sim.simulate(AshaCluster(GPU1, 3, 1)), sim.simulate(AshaCluster(GPU1, 27, 1))
    assert small.jct.mean() > big.jct.mean()
    assert (small.cost / small.jct).mean() < (big.cost / big.jct).mean()
    # spanning trials: 8 workers on 4-GPU instances use two instances per slot
    wide = sim.simulate(AshaCluster(GPU4, 4, 8))
    assert np.all(wide.jct > 0)


def test_cheapest_cluster_meeting_the_deadline_and_the_quickest_when_none_does():
    model = ideal_model(t_iter=0.5, dataset=1000, batch=10, startup=30.0, sigma=0.05)
    sim = AshaSimulator(model, AshaSchedule(trials=27, eta=3, min_epochs=1, max_epochs=27), AshaSettings(samples=60))
    wide = sim.simulate(AshaCluster(GPU1, 27, 1))
    deadline = float(np.quantile(wide.jct, 0.9)) * 1.5
    res, meets = asha_baseline(sim, [GPU1], 1, deadline, 0.9)
    assert meets and res.meets(deadline, 0.9)
    k = res.cluster.instances
    assert k < 27
    if k > 1:
        assert not sim.simulate(AshaCluster(GPU1, k - 1, 1), 48).meets(deadline, 0.9)
    res, meets = asha_baseline(sim, [GPU1], 1, 60.0, 0.9)
    assert not meets and res.cluster.instances == 27


def test_a_type_alike_in_another_region_is_searched_once_and_a_dearer_one_too():
    """The same type in two regions at the same prices runs and bills alike: the search simulates it once (the
    first region wins, as it would any tie); at another price it is another pair."""
    model = ideal_model(t_iter=0.5, dataset=1000, batch=10, startup=30.0, sigma=0.05)
    sim = AshaSimulator(model, AshaSchedule(trials=27, eta=3, min_epochs=1, max_epochs=27), AshaSettings(samples=60))
    twin, dearer = replace(GPU1, region="r2", zones=("r2a",)), replace(GPU1, region="r3", price_hr=4.0)
    deadline = float(np.quantile(sim.simulate(AshaCluster(GPU1, 27, 1)).jct, 0.9)) * 1.5
    runs = sim.runs
    alone = asha_baseline(sim, [GPU1], 1, deadline, 0.9)
    once = sim.runs - runs
    res, meets = asha_baseline(sim, [GPU1, twin], 1, deadline, 0.9)
    assert sim.runs - runs == 2 * once and meets and res.cluster.instance_type.region == "r1"
    assert (res.cost == alone[0].cost).all()
    runs = sim.runs
    asha_baseline(sim, [GPU1, dearer], 1, deadline, 0.9)
    assert sim.runs - runs > once


def test_a_cluster_that_misses_stops_at_its_first_misses_and_one_that_meets_is_simulated_whole():
    """simulate_unless_late decides as simulate does: a meeting cluster's result is simulate's, sample for sample;
    a missing one stops once more samples are late than the confidence allows, and run in that order again (the
    latest first), its misses show after exactly that many samples."""
    model = ideal_model(t_iter=0.5, dataset=1000, batch=10, startup=30.0, sigma=0.2)
    sim = AshaSimulator(model, AshaSchedule(trials=27, eta=3, min_epochs=1, max_epochs=27), AshaSettings(samples=60))
    goal = (float(np.quantile(sim.simulate(AshaCluster(GPU1, 6, 1)).jct, 0.9)), 0.9)
    allowed = 60 - math.ceil(0.9 * 60 - 1e-9)
    for k in (3, 4, 5, 6, 9, 27):
        whole = sim.simulate(AshaCluster(GPU1, k, 1))
        out = sim.simulate_unless_late(AshaCluster(GPU1, k, 1), goal)
        if whole.meets(*goal):
            assert not isinstance(out, list)
            assert (out.jct == whole.jct).all() and (out.cost == whole.cost).all()
        else:
            assert isinstance(out, list) and len(out) < 60
            assert sum(whole.jct[s] > goal[0] for s in out) == allowed + 1
            assert [whole.jct[s] for s in out] == sorted((whole.jct[s] for s in out), reverse=True)
            again = sim.simulate_unless_late(AshaCluster(GPU1, k, 1), goal, first=out)
            assert again == out[: allowed + 1]
    # the screening samples alone: the same decision as simulate on them
    few = sim.simulate_unless_late(AshaCluster(GPU1, 27, 1), goal, samples=20)
    assert not isinstance(few, list) and (few.jct == sim.simulate(AshaCluster(GPU1, 27, 1), 20).jct).all()


def test_lateness_order_puts_the_late_first_the_unknown_next_and_the_on_time_last():
    # 4 and 7 were late on the cluster just run, 1 and 5 on time there; 3 came first before; 0, 2, 6 never ran
    assert lateness_order([4, 7, 1, 5], 2, [3, 5, 1], 8) == [4, 7, 3, 0, 2, 6, 1, 5]
    assert allowed_late(200, 0.95) == 10 and allowed_late(32, 0.95) == 1 and allowed_late(60, 0.9) == 6


def test_borderline_misses_in_a_row_show_after_a_few_samples_in_lateness_order():
    """Clusters one instance apart that all just miss the deadline (as the baseline's confirmation walks up from
    the screened size): run in :func:`lateness_order`, each miss after the first two shows after a few dozen of
    200 samples, where in index order most of them run."""
    model = ideal_model(t_iter=0.5, dataset=1000, batch=10, startup=30.0, sigma=0.2)
    sim = AshaSimulator(model, AshaSchedule(trials=27, eta=3, min_epochs=1, max_epochs=27), AshaSettings(samples=200))
    goal = (2064.0, 0.95)  # p95 of 13 to 18 instances: 2067-2131 s
    late = allowed_late(200, 0.95) + 1
    ordered, plain, order = [], [], []
    for k in range(13, 19):
        out = sim.simulate_unless_late(AshaCluster(GPU1, k, 1), goal, order)
        again = sim.simulate_unless_late(AshaCluster(GPU1, k, 1), goal)
        assert isinstance(out, list) and isinstance(again, list)  # the same decision in any order
        ordered.append(len(out))
        plain.append(len(again))
        order = lateness_order(out, late, order, 200)
    assert all(n <= 2 * late for n in ordered[2:])
    assert sum(ordered[2:]) < sum(plain[2:]) / 5


def test_heads_are_billed_for_the_jct():
    model = ideal_model(t_iter=0.5, dataset=1000, batch=10, startup=30.0)
    sim = AshaSimulator(
        model,
        AshaSchedule(trials=9, eta=3, min_epochs=1, max_epochs=9),
        AshaSettings(samples=10, head_cost=lambda itype, jct: jct * 0.1 / 3600),
    )
    res = sim.simulate(AshaCluster(GPU1, 3, 1))
    assert np.allclose(res.breakdown["head"], res.jct * 0.1 / 3600)


def test_start_lanes_as_many_as_slots_are_todays_model():
    """No trial starts modelled (the default) or at least as many start lanes as slots per instance: no
    start slows another, the same run."""
    model = ideal_model(t_iter=0.5, dataset=1000, batch=10, startup=30.0, sigma=0.2, task_start=7.0, epoch_overhead=1.0)
    base = AshaSimulator(model, AshaSchedule(trials=27, eta=3, min_epochs=1, max_epochs=27), AshaSettings(samples=20))
    wide = AshaSimulator(
        model,
        AshaSchedule(trials=27, eta=3, min_epochs=1, max_epochs=27),
        AshaSettings(samples=20, starts=lanes(4)),
    )
    for cluster in (AshaCluster(GPU4, 2, 1), AshaCluster(GPU1, 5, 1)):
        a, b = base.simulate(cluster), wide.simulate(cluster)
        assert np.allclose(a.jct, b.jct) and np.array_equal(a.promotions, b.promotions)
        assert np.allclose(a.cost, b.cost)
    with pytest.raises(ValueError):
        AshaSimulator(model, AshaSchedule(trials=9, eta=3, min_epochs=1, max_epochs=9), AshaSettings(starts=lanes(0.5)))


def test_starts_on_one_instance_share_the_start_lanes():
    """Four 1-epoch trials start together on a 4-slot instance: with c lanes each start takes
    task_start · 4 / c (processor sharing), then its epoch of 100 iterations × 0.5 s."""
    model = ideal_model(t_iter=0.5, dataset=1000, batch=10, task_start=3.0)
    for c, start in ((1.0, 12.0), (2.0, 6.0), (3.0, 4.0), (None, 3.0)):
        sim = AshaSimulator(
            model,
            AshaSchedule(trials=4, eta=3, min_epochs=1, max_epochs=1),
            AshaSettings(samples=2, starts=lanes(c)),
        )
        assert np.allclose(sim.simulate(AshaCluster(GPU4, 1, 1)).jct, start + 50.0)
    # one slot per instance: the instances' starts never contend
    sim = AshaSimulator(
        model, AshaSchedule(trials=4, eta=3, min_epochs=1, max_epochs=1), AshaSettings(samples=2, starts=lanes(1.0))
    )
    assert np.allclose(sim.simulate(AshaCluster(GPU1, 4, 1)).jct, 3.0 + 50.0)


def test_overlapping_starts_progress_by_processor_sharing():
    starts = StartLanes(1.0, 2.0)
    starts.add(0, TrialStart(2.0, 0.0, 0, 0, instance=0))
    starts.add(0, TrialStart(2.0, 1.0, 1, 1, instance=0))  # trial 0 has 1 s of work left; both now progress at 1/2
    starts.add(1, TrialStart(2.0, 1.0, 2, 2, instance=1))  # another instance: alone, done at 3
    assert starts.next_time() == pytest.approx(3.0)
    assert [(t, trial) for t, _, trial, _ in starts.pop_done()] == [(pytest.approx(3.0), 0), (pytest.approx(3.0), 2)]
    assert starts.next_time() == pytest.approx(4.0)  # trial 1: 1 s of work left, alone
    done = starts.pop_done()
    assert [(round(t, 9), began, trial, slot) for t, began, trial, slot in done] == [(4.0, 1.0, 1, 1)]
    assert starts.next_time() == math.inf


def test_an_instances_starts_complete_in_the_order_they_began_and_a_finished_one_waits_without_a_lane():
    """Two starts on one instance share its one lane; the later, shorter one is done first but completes with the
    earlier one, which has the lane to itself meanwhile. A start on another instance of the same host (one
    contention domain) completes on its own."""
    starts = StartLanes(1.0, 2.0)
    starts.add(0, TrialStart(4.0, 0.0, 0, 0, instance=0))
    starts.add(0, TrialStart(1.0, 0.0, 1, 1, instance=0))
    assert starts.next_time() == pytest.approx(2.0)  # trial 1's work is done at 2 (half a lane each)...
    assert starts.pop_done() == []  # ...but trial 0, which began first, is still starting
    assert starts.next_time() == pytest.approx(5.0)  # trial 0: 3 s left, now alone on the lane
    assert [(round(t, 9), trial) for t, _, trial, _ in starts.pop_done()] == [(5.0, 0), (5.0, 1)]
    shared = StartLanes(3.0, 2.0)
    shared.add(0, TrialStart(4.0, 0.0, 0, 0, instance=0))
    shared.add(0, TrialStart(1.0, 0.0, 1, 1, instance=0))
    shared.add(0, TrialStart(1.0, 0.0, 2, 2, instance=1))
    assert [trial for _, _, trial, _ in shared.pop_done()] == [2]  # at 1: instance 1's, alone on its instance
    assert [trial for _, _, trial, _ in shared.pop_done()] == [0, 1]  # at 4
    assert shared.next_time() == math.inf


def test_rungs_decide_as_ray_tunes_bracket():
    """The continuation rule against Ray Tune's own ``_Bracket`` on random asynchronous orders."""
    async_hyperband = pytest.importorskip("ray.tune.schedulers.async_hyperband")
    rng = np.random.default_rng(3)
    milestones = [1, 3, 9]  # max_t 27: Ray stops every trial there regardless
    for _ in range(30):
        ray_bracket = async_hyperband._Bracket(1, 27, 3, 0)
        ours = AshaRungs(3, len(milestones))
        values = rng.permutation(40).astype(float) if rng.random() < 0.5 else rng.integers(0, 5, 40).astype(float)
        pending = [(i, 0) for i in range(40)]  # (trial, next rung)
        while pending:
            trial, rung = pending.pop(int(rng.integers(len(pending))))
            ray_action = ray_bracket.on_result(SimpleNamespace(trial_id=str(trial)), milestones[rung], values[trial])
            go = ours.on_result(rung, float(values[trial]))
            assert go == (ray_action == "CONTINUE")
            if go and rung + 1 < len(milestones):
                pending.append((trial, rung + 1))


def test_start_sigma_zero_is_todays_model_and_uneven_starts_keep_their_order_on_an_instance():
    """A start spread σ of 0 (the default): every start alike, the same runs. With σ > 0 the trial starts differ
    in length, and the mean start time stays near task_start_s. On one instance they still complete in the order
    they began, as Ray Tune's driver starts its trials (with one fixed quality order every sample promotes alike,
    though the JCT varies); on two, a trial queued later can report first and change who ASHA promotes."""
    model = ideal_model(t_iter=0.5, dataset=1000, batch=10, startup=30.0, sigma=0.1, task_start=5.0)
    cluster = AshaCluster(GPU4, 1, 1)
    base = AshaSimulator(
        model,
        AshaSchedule(trials=27, eta=3, min_epochs=1, max_epochs=9),
        AshaSettings(samples=40, starts=lanes(2.0)),
    )
    zero = AshaSimulator(
        model,
        AshaSchedule(trials=27, eta=3, min_epochs=1, max_epochs=9),
        AshaSettings(samples=40, starts=lanes(2.0, 0.0)),
    )
    a, b = base.simulate(cluster), zero.simulate(cluster)
    assert np.array_equal(a.jct, b.jct) and np.array_equal(a.promotions, b.promotions)
    order = np.arange(27, dtype=float)[::-1]  # the first queued is the best
    model = ideal_model(t_iter=0.5, dataset=1000, batch=10, startup=30.0, sigma=0.0, task_start=5.0)  # even epochs
    fixed = AshaSimulator(
        model,
        AshaSchedule(trials=27, eta=3, min_epochs=1, max_epochs=9),
        AshaSettings(samples=40, starts=lanes(2.0)),
    )
    fixed.set_qualities(order)
    uneven = AshaSimulator(
        model,
        AshaSchedule(trials=27, eta=3, min_epochs=1, max_epochs=9),
        AshaSettings(samples=40, starts=lanes(2.0, 0.5)),
    )
    uneven.set_qualities(order)
    same, kept = fixed.simulate(cluster), uneven.simulate(cluster)
    assert len({tuple(row) for row in same.promotions}) == 1  # one order, no start noise: every sample promotes alike
    assert len({tuple(row) for row in kept.promotions}) == 1 and len(set(kept.jct)) > 1
    varied = uneven.simulate(AshaCluster(GPU4, 2, 1)).promotions
    assert len({tuple(row) for row in varied}) > 1
    assert abs(float(np.exp(0.5 * uneven._start_z).mean()) - np.exp(0.5**2 / 2)) < 0.15
    with pytest.raises(ValueError):
        AshaSimulator(
            model, AshaSchedule(trials=9, eta=3, min_epochs=1, max_epochs=9), AshaSettings(starts=lanes(1.0, -0.1))
        )
    with pytest.raises(ValueError):
        fixed.set_qualities([1.0, 2.0])
