"""Re-planning at a stage boundary: when the controller asks, what it accepts, what the journal says."""

from __future__ import annotations

import math
import time

import pytest
from executor_helpers import LosingBackend, make_plan, write_job

from rubberband.catalog import load_catalog
from rubberband.executor import journal as J
from rubberband.executor.controller import Controller
from rubberband.executor.runtime import ReplanRequest
from rubberband.spec import load_spec


@pytest.fixture
def setup(tmp_path):
    spec = load_spec(write_job(tmp_path / "job"))
    plan = make_plan(spec, [("local.cpu2", 2, 1), ("local.cpu4", 1, 2)], durations=[12.0, 8.0])
    journal = J.Journal(tmp_path / "run")
    now = time.time()
    journal.record(
        J.RunStarted(
            t=now - 100,
            run_id="r1",
            spec_sha256=spec.sha256(),
            spec=spec.model_dump(mode="json"),
            plan=plan.model_dump(mode="json"),
            cloud="local",
            deadline_s=600.0,
        )
    )
    journal.record(J.StageStarted(t=now - 100, stage=0))
    journal.record(J.StageFinished(t=now - 40, stage=0, metrics={}, promoted=[]))  # 60 s, 5× the prediction
    return spec, plan, tmp_path / "run"


def _controller(setup, replanner, deadline_s, **options):
    spec, plan, run_dir = setup
    options.setdefault("overrun_s", math.inf)  # finish late, whatever it takes, unless a test says otherwise
    controller = Controller(
        spec=spec,
        plan=plan,
        catalog=load_catalog(["local"]),
        run_dir=run_dir,
        backend=LosingBackend(),
        runtime=None,
        run_id="r1",
        replanner=replanner,
        deadline_s=deadline_s,
        **options,
    )
    controller.state = controller.journal.state
    return controller


def _proposal(
    plan, instance_type: str, cost: float, p_meet: float = 0.99, trials: int | None = None, jct_p50: float | None = None
):
    stage = plan.stages[1].model_copy(
        update={"instance_type": instance_type, "predicted_cost_usd": cost, **({"trials": trials} if trials else {})}
    )
    jct = plan.predicted.jct_s if jct_p50 is None else plan.predicted.jct_s.model_copy(update={"p50": jct_p50})
    predicted = plan.predicted.model_copy(
        update={
            "cost_usd": plan.predicted.cost_usd.model_copy(update={"mean": cost}),
            "p_meet_deadline": p_meet,
            "jct_s": jct,
        }
    )
    return plan.model_copy(update={"stages": [stage], "predicted": predicted})


def _decisions(run_dir):
    return [e for e in J.iter_events(run_dir / J.JOURNAL_NAME) if e["type"] == J.DECISION]


def test_deadline_at_risk_accepts_a_proposal_that_meets_it(setup):
    seen: list[ReplanRequest] = []

    def replanner(request):
        seen.append(request)
        return _proposal(request.plan, "local.cpu2", cost=1.0)

    controller = _controller(setup, replanner, deadline_s=130.0)  # 100 s gone + 8 s × 5 predicted > 130 s
    controller._maybe_replan(1)
    assert seen[0].at_risk and seen[0].next_stage == 1 and seen[0].remaining_deadline_s == pytest.approx(30, abs=2)
    decision = _decisions(setup[2])[-1]
    assert decision["accepted"] and decision["action"] == "buy_speed"
    assert decision["reason"].startswith("deadline at risk: buying speed (P(meet) 0.00 → 0.99")
    assert decision["slowdown"] == pytest.approx(5.0, rel=0.01)
    assert controller.plan.stages[1].instance_type == "local.cpu2"
    state = J.read_state(setup[2])
    assert state.plan["stages"][1]["instance_type"] == "local.cpu2"  # resume continues with the new plan


def test_a_cheaper_plan_is_taken_even_when_on_time(setup):
    controller = _controller(setup, lambda r: _proposal(r.plan, "local.cpu2", cost=0.0), deadline_s=3600.0)
    controller._maybe_replan(1)
    decision = _decisions(setup[2])[-1]
    assert decision["accepted"] and not decision["at_risk"] and decision["reason"].startswith("cheaper")
    assert decision["action"] == "save"


@pytest.mark.parametrize(
    "proposal, reason",
    [
        (dict(instance_type="local.cpu2", cost=1.0), "current plan is as cheap and on time"),
        (dict(instance_type="local.cpu2", cost=0.0, p_meet=0.5), "proposal misses the confidence"),
        (dict(instance_type="local.cpu2", cost=0.0, trials=2), "proposal does not match the remaining stages"),
    ],
)
def test_proposals_that_do_not_pay_are_rejected(setup, proposal, reason):
    controller = _controller(setup, lambda r: _proposal(r.plan, **proposal), deadline_s=3600.0)
    controller._maybe_replan(1)
    decision = _decisions(setup[2])[-1]
    assert not decision["accepted"] and decision["reason"].startswith(reason) and decision["action"] == "continue"
    assert controller.plan.stages[1].instance_type == "local.cpu4"


@pytest.mark.parametrize("jct_p50, accepted", [(20.0, True), (39.0, False)])
def test_out_of_reach_a_late_proposal_is_taken_only_when_clearly_sooner(setup, jct_p50, accepted):
    # 100 s gone, 30 s left; the current plan needs about 40 s more (8 s predicted × 5 slowdown)
    late = dict(instance_type="local.cpu2", cost=9.0, p_meet=0.0, jct_p50=jct_p50)
    controller = _controller(setup, lambda r: _proposal(r.plan, **late), deadline_s=130.0)
    controller._maybe_replan(1)
    decision = _decisions(setup[2])[-1]
    assert decision["at_risk"] and decision["accepted"] == accepted and decision["action"] == "finish_late"
    if accepted:
        assert decision["reason"].startswith(
            "deadline out of reach (best P(meet) 0.00 < 0.95): the quickest plan (p50 20.0s left, vs 40."
        )
        assert controller.plan.stages[1].instance_type == "local.cpu2"
    else:
        assert decision["reason"].endswith("no plan is clearly quicker; finishing late")
        assert controller.plan.stages[1].instance_type == "local.cpu4"


def test_planner_replanner_proposes_the_quickest_plan_when_the_deadline_is_out_of_reach():
    from rubberband.executor.runtime import ReplanAnswer, planner_replanner
    from rubberband.inputs import load_job_inputs
    from rubberband.planner import simulate_plan

    from conftest import REPO

    inputs = load_job_inputs(REPO / "examples" / "quickstart_local.yaml")
    spec = inputs.spec
    # the rest of the run on one single-worker local.cpu1: far from the quickest the remaining stages can go
    slow = simulate_plan(
        make_plan(spec, [("local.cpu2", 2, 1)] + [("local.cpu1", 1, 1)] * 3),
        inputs.profile,
        inputs.catalog,
        samples=200,
    )
    replan = planner_replanner(inputs.catalog, inputs.profile)
    request = ReplanRequest(
        spec=spec,
        plan=slow,
        next_stage=1,
        elapsed_s=170.0,
        spent_usd=0.001,
        remaining_deadline_s=10.0,
        at_risk=True,
        running={"local:local:local.cpu1": 1},
    )
    answer = replan(request)
    assert isinstance(answer, ReplanAnswer)
    proposal = answer.proposal
    assert [(s.trials, s.epochs) for s in proposal.stages] == [(s.trials, s.epochs) for s in slow.stages[1:]]
    assert proposal.predicted.p_meet_deadline < spec.confidence  # it is late too...
    # ...but clearly less late than the current plan, both under the same re-fitted model
    assert answer.current_p_meet < spec.confidence and answer.current_cost_usd > 0
    assert proposal.predicted.jct_s.p50 < 0.95 * answer.current_jct_p50_s
    # whether at risk or not, the answer is the same: the lateness policy decides what to do with it
    on_time = replan(ReplanRequest(**{**request.__dict__, "at_risk": False}))
    assert on_time.proposal.predicted.jct_s.p50 == pytest.approx(proposal.predicted.jct_s.p50)


def test_planner_replanner_prices_the_current_plan_and_a_faster_one_that_meets_the_deadline():
    from rubberband.executor.runtime import planner_replanner
    from rubberband.inputs import load_job_inputs
    from rubberband.planner import simulate_plan

    from conftest import REPO

    inputs = load_job_inputs(REPO / "examples" / "quickstart_local.yaml")
    slow = simulate_plan(
        make_plan(
            inputs.spec, [("local.cpu2", 2, 1), ("local.cpu1", 1, 1), ("local.cpu1", 1, 1), ("local.cpu1", 1, 1)]
        ),
        inputs.profile,
        inputs.catalog,
        samples=200,
    )
    quick = ReplanRequest(
        spec=inputs.spec,
        plan=slow,
        next_stage=1,
        elapsed_s=10.0,
        spent_usd=0.001,
        remaining_deadline_s=1.0,
        at_risk=False,
        running={"local:local:local.cpu1": 1},
    )
    first = planner_replanner(inputs.catalog, inputs.profile)(quick)
    # a deadline the single cpu1 misses but a wider plan meets: buying speed is possible
    between = (first.proposal.predicted.jct_s.p95 + first.current_jct_p50_s) / 2
    answer = planner_replanner(inputs.catalog, inputs.profile)(
        ReplanRequest(**{**quick.__dict__, "remaining_deadline_s": between})
    )
    assert answer.current_p_meet < inputs.spec.confidence <= answer.proposal.predicted.p_meet_deadline
    assert answer.proposal.predicted.jct_s.p50 < answer.current_jct_p50_s


def test_without_a_replanner_the_decision_is_still_journaled(setup):
    controller = _controller(setup, None, deadline_s=130.0)
    controller._maybe_replan(1)
    decision = _decisions(setup[2])[-1]
    assert decision["kind"] == "replan" and decision["at_risk"] and not decision["accepted"]


def test_a_failing_replanner_keeps_the_plan(setup):
    def broken(request):
        raise RuntimeError("solver exploded")

    controller = _controller(setup, broken, deadline_s=130.0)
    controller._maybe_replan(1)
    assert "solver exploded" in _decisions(setup[2])[-1]["reason"]
    assert controller.plan.stages[1].instance_type == "local.cpu4"


# -- re-planning after failover obtained another type -----------------------------------------------------


class _Blocked:
    """A backend whose failover policy has blocked every zone of some types."""

    def __init__(self, *names: str) -> None:
        self.names = set(names)

    def unavailable(self, itype, spot: bool = False) -> bool:
        return itype.name in self.names


def test_failover_forces_a_replan_without_the_unavailable_type(setup):
    seen: list[ReplanRequest] = []

    def replanner(request):
        seen.append(request)
        return _proposal(request.plan, "local.cpu2", cost=5.0)  # dearer than the current plan: taken anyway

    controller = _controller(setup, replanner, deadline_s=3600.0)
    controller.backend = _Blocked("local.cpu4")
    controller._maybe_replan(1)
    assert seen[0].unavailable == ("local:local:local.cpu4",)
    decision = _decisions(setup[2])[-1]
    assert decision["accepted"] and decision["trigger"] == "failover" and decision["source"] == "replanner"
    assert controller.plan.stages[1].instance_type == "local.cpu2"
    assert J.read_state(setup[2]).plan["stages"][1]["instance_type"] == "local.cpu2"


def test_failover_replan_falls_back_to_the_obtained_type(setup):
    catalog = load_catalog(["local"])
    controller = _controller(setup, lambda r: _proposal(r.plan, "local.cpu4", cost=0.0), deadline_s=3600.0)
    controller.substitutes["local:local:local.cpu4"] = catalog.find("local.cpu2")  # what failover got instead
    controller._maybe_replan(1)
    decision = _decisions(setup[2])[-1]
    assert decision["accepted"] and decision["source"] == "substitution"
    assert decision["substitutions"] == {"local.cpu4": "local.cpu2"}
    assert "uses an unavailable type" in decision["reason"]
    stage = controller.plan.stages[1]
    assert stage.instance_type == "local.cpu2"
    assert stage.predicted_cost_usd == pytest.approx(setup[1].stages[1].predicted_cost_usd * 0.10 / 0.20)


def test_failover_replan_without_a_stand_in_keeps_the_plan(setup):
    controller = _controller(setup, None, deadline_s=3600.0)
    controller.backend = _Blocked("local.cpu4")  # no other 4-worker local type exists
    controller._maybe_replan(1)
    decision = _decisions(setup[2])[-1]
    assert not decision["accepted"] and "no available type can stand in" in decision["reason"]
    assert controller.plan.stages[1].instance_type == "local.cpu4"


# -- admission and graceful lateness (the LatenessPolicy's decision, carried out) ---------------------------


def test_on_late_stop_stops_before_a_stage_predicted_to_miss_the_deadline(setup):
    from rubberband.executor.controller import RunStopped

    late = dict(instance_type="local.cpu2", cost=9.0, p_meet=0.2, jct_p50=20.0)  # quicker, still late
    controller = _controller(setup, lambda r: _proposal(r.plan, **late), deadline_s=130.0, on_late="stop")
    with pytest.raises(
        RunStopped,
        match=r"--on-late stop: stopping before the next stage .* \(before stage 1\); "
        r".* --on-late finish",
    ):
        controller._maybe_replan(1)
    decision = _decisions(setup[2])[-1]
    assert decision["action"] == "stop" and not decision["accepted"] and decision["on_late"] == "stop"
    assert controller.plan.stages[1].instance_type == "local.cpu4"  # nothing taken, nothing started
    assert not [e for e in J.iter_events(setup[2] / J.JOURNAL_NAME) if e["type"] == J.STAGE_STARTED and e["stage"] == 1]


def test_on_late_stop_still_buys_speed_first(setup):
    controller = _controller(
        setup, lambda r: _proposal(r.plan, "local.cpu2", cost=9.0), deadline_s=130.0, on_late="stop"
    )
    controller._maybe_replan(1)  # the proposal meets the deadline: no stop
    assert _decisions(setup[2])[-1]["action"] == "buy_speed"
    assert controller.plan.stages[1].instance_type == "local.cpu2"


def test_without_a_replanner_stop_follows_the_slowdown_estimate(setup):
    from rubberband.executor.controller import RunStopped

    controller = _controller(setup, None, deadline_s=130.0, on_late="stop")
    with pytest.raises(RunStopped):
        controller._maybe_replan(1)
    decision = _decisions(setup[2])[-1]
    assert decision["reason"].startswith("no re-planner available; deadline out of reach")


def test_finish_stops_when_the_overrun_would_cut_the_run_anyway(setup):
    from rubberband.executor.controller import RunStopped

    # 30 s to the deadline, 5 s of overrun, about 40 s of work left on the current plan and no quicker one
    controller = _controller(setup, None, deadline_s=130.0, overrun_s=5.0)
    with pytest.raises(RunStopped, match="allowed overrun .* --overrun none"):
        controller._maybe_replan(1)
