"""The simulator's per-task overheads, new instances' worker start, termination latency and billing.

These are what made local runs slower and dearer than predicted (issue #5): each is checked in a
closed form, and the simulated instances are billed by the executor's own accounting function.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from rubberband.catalog import BILLING_RULES, BillingRule
from rubberband.executor.accounting import bill_instance
from rubberband.executor.journal import InstanceLife
from rubberband.planner.model import StartupModel
from rubberband.planner.schedule import Stage, sha_stages
from rubberband.planner.plan_space import StageConfig
from rubberband.planner.simulator import SimSettings, Simulator
from planner_helpers import ideal_model, itype

GPU1 = itype("gpu1", gpus=1, price=3.6)


def test_epoch_overhead_task_start_worker_start_and_termination_closed_form():
    """2 trials × 3 epochs of 10 s on one instance: every overhead lands where the executor pays it."""
    model = ideal_model(
        t_iter=1.0,
        dataset=100,
        batch=10,
        startup=10.0,
        termination=2.0,
        epoch_overhead=0.5,
        task_start=0.2,
        worker_start=3.0,
    )
    sim = Simulator([Stage(0, 0, 2, 3, 3)], model, SimSettings(samples=4))
    res = sim.simulate([StageConfig(GPU1, 1, 1)])
    ready = 10.0 + 3.0  # node start-up, then its worker processes
    task = 3 * 10.0 + 3 * 0.5 + 0.2  # epochs, per-epoch overhead, warm start of the run
    assert np.allclose(res.jct, ready + 2 * task)
    life = ready + 2 * task + 2.0  # billed until it is gone, 2 s after the release
    assert np.allclose(res.cost, np.ceil(life) * 3.6 / 3600)
    assert np.allclose(res.breakdown["startup"], ready * 3.6 / 3600)
    assert np.allclose(res.breakdown["idle"], 2.0 * 3.6 / 3600)
    assert np.allclose(res.breakdown["billing_minimum"], (np.ceil(life) - life) * 3.6 / 3600)
    timeline, _, critical = sim.trace([StageConfig(GPU1, 1, 1)], 0)
    assert critical == pytest.approx(res.jct[0])
    assert timeline.instances[0].cost_usd == pytest.approx(res.cost[0])


def test_moved_trials_pay_the_restart_instead_of_the_warm_start():
    model = ideal_model(t_iter=1.0, dataset=100, batch=10, restart=4.0, task_start=0.5)
    assert model.task_overhead(2, moved=False) == pytest.approx(0.5)
    assert model.task_overhead(2, moved=True) == pytest.approx(4.0)
    with_epochs = dataclasses.replace(model, epoch_overhead_s=0.25, eval_time_s=1.0)
    assert with_epochs.task_overhead(4, moved=False) == pytest.approx(4 * 0.25 + 1.0 + 0.5)


def test_billing_function_is_shared_and_element_wise():
    rule = BillingRule(granularity_s=1.0, minimum_s=60.0)
    lifetimes = np.array([-1.0, 0.0, 59.2, 60.0, 60.0000000001, 61.3, 3600.5])
    assert list(rule.billed_seconds(lifetimes)) == [rule.billed_seconds(float(x)) for x in lifetimes]
    assert rule.billed_seconds(61.3) == 62.0 and isinstance(rule.billed_seconds(61.3), float)


def test_simulated_instances_are_billed_exactly_as_the_accounting_bills_a_journal():
    """A noisy 3-stage local plan (serial start-ups, carry-over, early release): billing each simulated
    instance from its request until it is gone with ``accounting.bill_instance`` gives the simulated cost."""
    local1 = itype("local.cpu1", cloud="local", gpus=1, price=0.05)
    local2 = itype("local.cpu2", cloud="local", gpus=2, price=0.10)
    base = ideal_model(
        t_iter=0.05,
        dataset=640,
        batch=32,
        sigma=0.05,
        startup_samples=[5.5, 6.0, 7.5],
        epoch_overhead=0.1,
        task_start=0.05,
        worker_start=2.5,
        restart=0.3,
    )
    model = dataclasses.replace(
        base,
        startup_by_cloud={"local": StartupModel((5.5, 6.0, 7.5), "test")},
        termination_by_cloud={"local": StartupModel((0.6, 0.9, 1.4), "test")},
    )
    stages = sha_stages(9, 3, 1, 9)
    configs = [StageConfig(local1, 4, 1), StageConfig(local2, 2, 2), StageConfig(local1, 1, 1)]
    carrying = [StageConfig(local1, 6, 1), StageConfig(local1, 3, 1), StageConfig(local1, 2, 2)]
    sim = Simulator(stages, model, SimSettings(samples=32, seed=3))
    res = sim.simulate(configs)
    gone = model.termination("local", "local.cpu1").quantile(0.5)
    assert gone == pytest.approx(0.9)
    for plan, i in [(configs, 0), (configs, res.representative_index()), (configs, 17), (carrying, 0), (carrying, 5)]:
        res = sim.simulate(plan)
        timeline, _, critical = sim.trace(plan, i)
        assert critical == pytest.approx(res.jct[i])
        lives = [
            InstanceLife(
                id=x.id,
                instance_type=x.instance_type,
                cloud=x.cloud,
                price_hr=0.05 if x.instance_type == "local.cpu1" else 0.10,
                spot=False,
                stage=x.first_stage,
                requested_at=x.requested_s,
                ready_at=x.ready_s,
                terminated_at=x.released_s + gone,
            )
            for x in timeline.instances
        ]
        billed = sum(bill_instance(life, now=1e9, rules=BILLING_RULES).cost_usd for life in lives)
        assert billed == pytest.approx(res.cost[i], rel=1e-9)
        # no task starts before its instances are up, carried ones still starting at the barrier included
        ready = {x.id: x.ready_s for x in timeline.instances}
        assert all(t.start_s >= ready[iid] - 1e-9 for t in timeline.tasks for iid in t.instance_ids)
        if plan is carrying:  # 6 nodes one after another: the last are still starting when stage 0 ends
            stage0_end = max(t.end_s for t in timeline.tasks if t.stage == 0)
            assert any(x.ready_s > stage0_end and x.last_stage > 0 for x in timeline.instances)
        # nodes start one after another: each is requested (billed) when the one before is up
        first = sorted((x for x in timeline.instances if x.first_stage == 0), key=lambda x: x.requested_s)
        for before, after in zip(first, first[1:]):
            assert after.requested_s == pytest.approx(before.ready_s - model.worker_start_s)
