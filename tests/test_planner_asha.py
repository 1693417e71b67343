"""ASHA simulated on a fixed cluster: closed forms, Ray Tune's continuation rule, the cluster search."""

from __future__ import annotations

import numpy as np
import pytest

from planner_helpers import ideal_model, itype
from rubberband.planner.asha import AshaCluster, AshaSimulator, _percentile, asha_baseline, rungs

GPU1 = itype("gpu1", gpus=1, price=3.6)
GPU4 = itype("gpu4", gpus=4, price=14.4)


def test_rungs_are_ray_tunes_milestones():
    assert rungs(3, 1, 81) == [1, 3, 9, 27, 81]
    assert rungs(4, 1, 100) == [1, 4, 16, 64, 100]
    assert rungs(3, 2, 18) == [2, 6, 18]


def test_percentile_matches_numpy():
    rng = np.random.default_rng(0)
    for n in (1, 2, 5, 17):
        values = sorted(rng.random(n))
        assert _percentile(values, 2 / 3) == pytest.approx(np.percentile(values, 100 * 2 / 3))


def test_one_slot_per_trial_without_noise_has_a_closed_form():
    """Every trial starts at once; the first to report at each rung always continues, so the JCT is
    one trial trained to max_epochs, and the fixed cluster is billed until then."""
    model = ideal_model(t_iter=0.5, dataset=1000, batch=10, startup=30.0, eval_s=5.0, termination=10.0)
    sim = AshaSimulator(model, trials=9, eta=3, min_epochs=1, max_epochs=9, samples=20)
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
    sim = AshaSimulator(model, trials=27, eta=3, min_epochs=1, max_epochs=27, samples=40)
    small, big = sim.simulate(AshaCluster(GPU1, 3, 1)), sim.simulate(AshaCluster(GPU1, 27, 1))
    assert small.jct.mean() > big.jct.mean()
    assert (small.cost / small.jct).mean() < (big.cost / big.jct).mean()
    # spanning trials: 8 workers on 4-GPU instances use two instances per slot
    wide = sim.simulate(AshaCluster(GPU4, 4, 8))
    assert np.all(wide.jct > 0)


def test_cheapest_cluster_meeting_the_deadline_and_the_quickest_when_none_does():
    model = ideal_model(t_iter=0.5, dataset=1000, batch=10, startup=30.0, sigma=0.05)
    sim = AshaSimulator(model, trials=27, eta=3, min_epochs=1, max_epochs=27, samples=60)
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


def test_heads_are_billed_for_the_jct():
    model = ideal_model(t_iter=0.5, dataset=1000, batch=10, startup=30.0)
    sim = AshaSimulator(model, trials=9, eta=3, min_epochs=1, max_epochs=9, samples=10,
                        head_cost=lambda itype, jct: jct * 0.1 / 3600)
    res = sim.simulate(AshaCluster(GPU1, 3, 1))
    assert np.allclose(res.breakdown["head"], res.jct * 0.1 / 3600)
