"""The executor's decisions (executor/decisions.py): pure objects, checked without a run."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rubberband.executor.decisions import (
    DeadlineState,
    DeadlineWatch,
    LossPolicy,
    proposal_problem,
    promote,
    rank,
    requeue_first,
    slowdown,
)


def test_the_deadline_watch_says_on_time_late_within_the_overrun_and_over():
    watch = DeadlineWatch(deadline_s=100.0, overrun_s=20.0)
    assert watch.state(100.0) is DeadlineState.ON_TIME
    assert watch.state(100.5) is DeadlineState.LATE
    assert watch.state(120.5) is DeadlineState.OVER
    assert DeadlineWatch(100.0, math.inf).state(1e9) is DeadlineState.LATE  # --overrun none: to the end
    assert DeadlineWatch(100.0).state(100.5) is DeadlineState.OVER  # no overrun: late is over


@pytest.mark.parametrize(
    "deadline, overrun", [(0.0, 0.0), (-5.0, 0.0), (math.inf, 0.0), (100.0, -1.0), (100.0, math.nan)]
)
def test_a_deadline_watch_refuses_nonsense_where_it_is_built(deadline, overrun):
    with pytest.raises(ValueError):
        DeadlineWatch(deadline, overrun)


def test_a_lost_instance_is_replaced_while_its_stage_needs_it_and_until_the_loss_limit():
    policy = LossPolicy(max_losses=2)
    assert policy.replace(serves=1, current=1, work_left=True, losses=1)
    assert not policy.replace(serves=1, current=1, work_left=False, losses=1)  # its stage's work is all placed
    assert policy.replace(serves=2, current=1, work_left=False, losses=1)  # kept for the next stage
    assert not policy.replace(serves=0, current=1, work_left=True, losses=1)  # an earlier stage's leftover
    assert not policy.replace(serves=1, current=1, work_left=True, losses=3)  # past the limit
    assert policy.exhausted(3) and not policy.exhausted(2)
    assert not LossPolicy.counts("spot-interruption") and LossPolicy.counts("lost")  # a spot plan expects those
    with pytest.raises(ValueError):
        LossPolicy(max_losses=-1)


def test_trials_stopped_by_a_loss_go_first_in_their_order_and_once():
    pending = [("t3", 0), ("t1", 0)]
    requeue_first(pending, ["t1", "t2", "t0"], start_epoch=lambda t: 4)
    assert pending == [("t2", 4), ("t0", 4), ("t3", 0), ("t1", 0)]


@settings(max_examples=60, deadline=None)
@given(
    st.dictionaries(
        st.sampled_from([f"t{i}" for i in range(8)]),
        st.one_of(st.none(), st.floats(-10, 10, allow_nan=False)),
        min_size=1,
    ),
    st.sampled_from(["min", "max"]),
    st.integers(0, 8),
)
def test_promotion_takes_the_best_first_and_missing_metrics_last(metrics, mode, keep):
    order = sorted(metrics)
    ranking, promoted = promote(metrics, mode, order, keep)
    assert sorted(ranking) == order and promoted == ranking[:keep] and ranking == rank(metrics, mode, order)
    known = [metrics[t] for t in ranking if metrics[t] is not None]
    assert known == sorted(known, reverse=mode == "max")
    assert all(metrics[t] is None for t in ranking[len(known) :])
    assert promote(metrics, mode, order, None)[1] == []  # a bracket's last stage promotes nobody


def test_the_slowdown_so_far_is_actual_over_predicted_of_the_stages_finished():
    assert slowdown([]) == 1.0
    assert slowdown([(150.0, 100.0), (150.0, 100.0)]) == 1.5
    assert slowdown([(50.0, 0.0)]) == 1.0  # nothing predicted: no scale


def test_a_proposal_must_keep_the_remaining_stages_shape_and_avoid_unavailable_types():
    from types import SimpleNamespace as NS

    def stage(trials, itype="a"):
        return NS(bracket=0, stage=1, trials=trials, epochs=3, instance_type=itype)

    key = lambda s: s.instance_type  # noqa: E731
    assert proposal_problem([stage(9)], [stage(9)], unavailable=(), key_of=key) is None
    assert "does not match" in proposal_problem([stage(3)], [stage(9)], unavailable=(), key_of=key)
    assert "unavailable" in proposal_problem([stage(9, "b")], [stage(9)], unavailable=("b",), key_of=key)


def test_a_stages_task_time_is_measured_else_planned_else_its_duration_per_wave():
    from types import SimpleNamespace as NS

    from rubberband.executor.decisions import mean_task_s

    stage = NS(predicted_task_s=30.0, predicted_duration_s=200.0, trials=9)
    assert mean_task_s([10.0, 20.0], stage, slots=3) == 15.0
    assert mean_task_s([], stage, slots=3) == 30.0
    assert mean_task_s([], NS(predicted_task_s=None, predicted_duration_s=90.0, trials=9), slots=3) == 30.0
    assert mean_task_s([], NS(predicted_task_s=None, predicted_duration_s=None, trials=9), slots=3) is None


def test_past_the_deadline_no_proposal_meets_it_whatever_its_prediction_says():
    from rubberband.executor.decisions import Standing, judge_proposal
    from rubberband.plan import Distribution, Prediction
    from rubberband.planner.policies import LatenessPolicy

    class _Plan:  # what judge_proposal reads of a proposal
        predicted = Prediction(
            jct_s=Distribution(mean=1.0, p50=1.0, p95=1.0),
            cost_usd=Distribution(mean=1.0, p50=1.0, p95=1.0),
            p_meet_deadline=1.0,
        )

    lateness = LatenessPolicy(confidence=0.9, on_late="stop")
    standing = Standing(at_risk=True, remaining_pred_s=10.0)
    late = judge_proposal(lateness, [], _Plan(), standing, time_left_s=-2.0)  # type: ignore[arg-type]
    assert late.verdict.action.value == "stop" and late.figures["proposal_p_meet"] == 0.0
    on_time = judge_proposal(lateness, [], _Plan(), standing, time_left_s=30.0)  # type: ignore[arg-type]
    assert on_time.verdict.action.value == "buy_speed"
