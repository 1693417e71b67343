"""The policies both engines share (prefetch, carry-over, promotion) and the lateness decision: pure, no I/O."""

from __future__ import annotations

import math

import pytest

from rubberband.planner.policies import Action, LatenessPolicy, Outlook, PrefetchPolicy, quantile

# -- prefetch ------------------------------------------------------------------------------------------


def test_quantile_is_numpys_linear_one():
    import numpy as np

    values = [9.0, 3.0, 14.0, 11.5, 20.0]
    for q in (0.0, 0.5, 0.9, 1.0):
        assert quantile(values, q) == pytest.approx(float(np.quantile(values, q)))


def test_the_lead_time_is_the_policys_start_up_quantile():
    samples = [10.0, 12.0, 14.0, 16.0, 20.0]
    assert PrefetchPolicy(quantile=0.5).lead_s(samples) == 14.0
    assert PrefetchPolicy().lead_s(samples) == pytest.approx(18.4)  # default: 0.9
    with pytest.raises(ValueError, match="quantile"):
        PrefetchPolicy(quantile=1.5)


def test_simulator_and_executor_views_of_the_request_time_agree():
    """The simulator requests at first task + predicted − lead; the executor once its estimated remaining
    time is at most the lead. On a deterministic stage both fire at the same moment."""
    policy = PrefetchPolicy()
    lead, per_trial, waves, slots = 7.0, 4.0, 3, 2
    predicted = waves * per_trial
    offset = policy.request_offset_s(predicted, lead)  # 5 s after the first task
    trials = waves * slots
    fired = None
    for tick in range(0, 130):  # the executor polls every 0.1 s
        t = tick / 10
        wave = min(int(t // per_trial), waves - 1)
        running = [t - wave * per_trial] * slots
        waiting = trials - (wave + 1) * slots
        remaining = policy.remaining_s(per_trial_s=per_trial, running_elapsed_s=running, waiting=waiting, slots=slots)
        if policy.should_request(remaining, lead):
            fired = t
            break
    assert fired == pytest.approx(offset, abs=0.1)
    assert policy.request_offset_s(3.0, lead) == 0.0  # a stage shorter than the lead: at once


def test_carry_over_keep_and_promotion():
    policy = PrefetchPolicy()
    assert policy.carried(True, 4, 2) == 2 and policy.carried(True, 1, 3) == 1 and policy.carried(False, 4, 2) == 0
    assert policy.keep_for_next(True, 0, 1) and not policy.keep_for_next(True, 1, 1)
    assert not policy.keep_for_next(False, 0, 1)
    assert policy.may_promote(0) and not policy.may_promote(1)


# -- lateness ------------------------------------------------------------------------------------------

ON_TIME = Outlook(p_meet=0.97, jct_p50_s=100.0, cost_usd=1.0)
LATE = Outlook(p_meet=0.40, jct_p50_s=130.0, cost_usd=1.0)


@pytest.mark.parametrize("on_late", ["finish", "stop"])
def test_an_on_time_plan_goes_on_or_takes_a_clearly_cheaper_one(on_late):
    policy = LatenessPolicy(confidence=0.95, on_late=on_late)
    assert policy.decide(ON_TIME, None, time_left_s=120).action is Action.CONTINUE
    same = Outlook(p_meet=0.99, jct_p50_s=90.0, cost_usd=0.98)
    decision = policy.decide(ON_TIME, same, time_left_s=120)
    assert decision.action is Action.CONTINUE and not decision.take_proposal
    cheaper = Outlook(p_meet=0.96, jct_p50_s=110.0, cost_usd=0.5)
    decision = policy.decide(ON_TIME, cheaper, time_left_s=120)
    assert decision.action is Action.SAVE and decision.take_proposal
    risky = Outlook(p_meet=0.90, jct_p50_s=110.0, cost_usd=0.5)
    decision = policy.decide(ON_TIME, risky, time_left_s=120)
    assert decision.action is Action.CONTINUE and decision.reason == "proposal misses the confidence"


@pytest.mark.parametrize("on_late", ["finish", "stop"])
def test_below_the_confidence_it_first_buys_speed(on_late):
    faster = Outlook(p_meet=0.96, jct_p50_s=90.0, cost_usd=1.6)  # dearer, and meets it
    decision = LatenessPolicy(confidence=0.95, on_late=on_late).decide(LATE, faster, time_left_s=120)
    assert decision.action is Action.BUY_SPEED and decision.take_proposal
    assert "0.40 → 0.96" in decision.reason


def test_out_of_reach_finish_goes_on_on_the_quicker_plan_when_clearly_quicker():
    policy = LatenessPolicy(confidence=0.95, on_late="finish")
    quicker = Outlook(p_meet=0.60, jct_p50_s=110.0, cost_usd=2.0)
    decision = policy.decide(LATE, quicker, time_left_s=100)
    assert decision.action is Action.FINISH_LATE and decision.take_proposal
    barely = Outlook(p_meet=0.60, jct_p50_s=127.0, cost_usd=2.0)  # not 5% quicker: keep the plan
    decision = policy.decide(LATE, barely, time_left_s=100)
    assert decision.action is Action.FINISH_LATE and not decision.take_proposal
    assert policy.decide(LATE, None, time_left_s=-20).action is Action.FINISH_LATE  # past it: no limit, go on


def test_out_of_reach_stop_stops_now():
    policy = LatenessPolicy(confidence=0.95, on_late="stop")
    quicker = Outlook(p_meet=0.60, jct_p50_s=110.0, cost_usd=2.0)
    for proposal in (None, quicker):
        decision = policy.decide(LATE, proposal, time_left_s=100)
        assert decision.action is Action.STOP and not decision.take_proposal
        assert "--on-late stop" in decision.reason


def test_finish_stops_too_when_even_the_overrun_cannot_cover_the_quickest_plan():
    # 100 s to the deadline + 20 s overrun: a plan needing 130 s would be cut by the overrun anyway
    policy = LatenessPolicy(confidence=0.95, on_late="finish", overrun_s=20.0)
    decision = policy.decide(LATE, None, time_left_s=100)
    assert decision.action is Action.STOP and "allowed overrun" in decision.reason
    quicker = Outlook(p_meet=0.60, jct_p50_s=115.0, cost_usd=2.0)  # the quicker plan fits in the overrun
    decision = policy.decide(LATE, quicker, time_left_s=100)
    assert decision.action is Action.FINISH_LATE and decision.take_proposal
    no_limit = LatenessPolicy(confidence=0.95, on_late="finish", overrun_s=math.inf)
    assert no_limit.decide(LATE, None, time_left_s=100).action is Action.FINISH_LATE


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="on_late"):
        LatenessPolicy(confidence=0.9, on_late="panic")
    with pytest.raises(ValueError, match="confidence"):
        LatenessPolicy(confidence=0.0)


def test_no_request_before_the_stage_has_started_a_task():
    # the simulator times requests from the stage's first task: neither engine requests while it waits for instances
    assert not PrefetchPolicy().should_request(1.0, 10.0, first_task_started=False)
    assert PrefetchPolicy().should_request(1.0, 10.0, first_task_started=True)


def test_plans_carry_the_simulators_task_time_for_the_executors_prefetch():
    from planner_helpers import ideal_model, itype

    from rubberband.planner.plan_record import stage_plans
    from rubberband.planner.schedule import stages_for
    from rubberband.planner.plan_space import StageConfig
    from rubberband.planner.simulator import SimSettings, Simulator

    model = ideal_model(t_iter=0.5, task_start=2.0, restart=7.0)  # 100 iterations per epoch: 50 s
    stages = stages_for("sha", trials=4, eta=2, min_epochs=1, max_epochs=2)
    configs = [StageConfig(itype("a"), 2, 1), StageConfig(itype("b"), 1, 1)]
    plans = stage_plans(stages, configs, None, model=model)
    assert [p.predicted_task_s for p in plans] == pytest.approx([52.0, 57.0])  # the second moves: restart
    sim = Simulator(stages, model, SimSettings(samples=1))
    lead = PrefetchPolicy().lead_s(model.startup("aws", "b").samples_s)
    # the executor's estimate at the first task (waves × task) gives the simulator's request offset
    remaining = PrefetchPolicy.remaining_s(
        per_trial_s=plans[0].predicted_task_s, running_elapsed_s=[0.0, 0.0], waiting=2, slots=2
    )
    assert sim.request_offsets(configs)[1] == pytest.approx(PrefetchPolicy().request_offset_s(remaining, lead))


def test_bracket_start_order_puts_the_bracket_ending_last_first():
    from rubberband.planner.policies import bracket_start_order

    assert bracket_start_order({0: 50.0, 1: 80.0, 2: 80.0, 3: 10.0}) == [1, 2, 0, 3]
    assert bracket_start_order({}) == []
