"""Re-planning at a stage boundary: when the executor asks, what it accepts, what the journal says.

Each run is the real executor on virtual time (tests/sim_helpers.py): the head and then the first instance take
1 s each to boot, 9 trials × 1 epoch on that ``local.cpu2`` (two one-worker slots: five waves of 12 s) predicted at
12.2 s take 61 s — 5× the prediction — then 3 trials × 2 more epochs on one ``local.cpu4`` (2 workers each),
predicted at 8 s. At the boundary 62 s are gone and the current plan needs about 40 s more (8 s × 5). A stub re-planner builds its proposal from the request, as a planner would.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re

import pytest
from executor_helpers import make_plan, write_job
from sim_helpers import SimCase, cpu_model

from rubberband.catalog import Catalog, load_catalog
from rubberband.executor import journal as J
from rubberband.executor.run import Settings
from rubberband.executor.runtime import ReplanRequest
from rubberband.executor.simulated import SimScript
from rubberband.spec import load_spec

#: One epoch on one worker: stage 0's five waves take 60 s (61 s with its instance's start-up), 5× 12.2 s.
EPOCH_S = 12.0
#: Stage 0's and stage 1's predicted durations.
DURATIONS = [12.2, 8.0]
#: A deadline the current plan misses at the boundary (62 s gone + 8 s × 5 predicted > 92 s): 30 s left.
AT_RISK_S = 92.0


@pytest.fixture
def case(tmp_path) -> SimCase:
    spec = load_spec(write_job(tmp_path / "job"))
    plan = make_plan(spec, [("local.cpu2", 1, 1), ("local.cpu4", 1, 2)], durations=DURATIONS)
    return SimCase(
        spec,
        plan,
        model=cpu_model(epoch_s=EPOCH_S, startup_s=1.0),
        # finish late, whatever it takes, unless a test says otherwise
        settings=Settings(deadline_s=3600.0, overrun_s=math.inf),
    )


def _run(case: SimCase, tmp_path, replanner, deadline_s: float, **settings):
    settings = {"deadline_s": deadline_s, "overrun_s": math.inf, **settings}
    return case.but(replanner=replanner, settings=Settings(**settings)).run(tmp_path / "run")


@dataclasses.dataclass(frozen=True)
class Proposal:
    """What a stand-in re-planner proposes for the stage left (stage 1): its instance type, its cost, its P(meet
    deadline), its trials (None: the plan's) and its JCT p50 (None: the plan's)."""

    instance_type: str
    cost: float
    p_meet: float = 0.99
    trials: int | None = None
    jct_p50: float | None = None

    def of(self, plan):
        """The proposed remainder of ``plan``: its stage 1 as proposed, with the proposal's predictions."""
        trials = {"trials": self.trials} if self.trials else {}
        stage = plan.stages[1].model_copy(
            update={"instance_type": self.instance_type, "predicted_cost_usd": self.cost, **trials}
        )
        jct = plan.predicted.jct_s
        if self.jct_p50 is not None:
            jct = jct.model_copy(update={"p50": self.jct_p50})
        predicted = plan.predicted.model_copy(
            update={
                "cost_usd": plan.predicted.cost_usd.model_copy(update={"mean": self.cost}),
                "p_meet_deadline": self.p_meet,
                "jct_s": jct,
            }
        )
        return plan.model_copy(update={"stages": [stage], "predicted": predicted})


def _boundary(out) -> dict:
    """The re-plan decision before stage 1."""
    (decision,) = [e for e in out.of("replan") if e["stage"] == 1 and e.get("trigger") != "failover"]
    return decision


def _stage_type(out, g: int) -> str | None:
    """The type stage ``g`` started on (None: it never started)."""
    started = [e for e in out.of(J.STAGE_STARTED) if e["stage"] == g]
    return started[0]["instance_type"] if started else None


def test_deadline_at_risk_accepts_a_proposal_that_meets_it(case, tmp_path):
    seen: list[ReplanRequest] = []

    def replanner(request):
        seen.append(request)
        return Proposal("local.cpu2", cost=1.0).of(request.plan)

    out = _run(case, tmp_path, replanner, AT_RISK_S)
    assert out.result.status == "finished"
    (request,) = seen
    assert request.at_risk and request.next_stage == 1 and request.remaining_deadline_s == pytest.approx(30, abs=2)
    decision = _boundary(out)
    assert decision["accepted"] and decision["action"] == "buy_speed"
    assert decision["reason"].startswith("deadline at risk: buying speed (P(meet) 0.00 → 0.99")
    assert decision["slowdown"] == pytest.approx(5.0, rel=0.01)
    assert _stage_type(out, 1) == "local.cpu2"  # the run follows the new plan
    (changed,) = out.of(J.PLAN_CHANGED)
    assert changed["stage"] == 1 and changed["changed"] == [1]
    assert out.state.plan["stages"][1]["instance_type"] == "local.cpu2"  # resume continues with the new plan
    stage1 = [e for e in out.of(J.TRIAL_STARTED) if e["stage"] == 1]
    requested = {e["id"]: e["instance_type"] for e in out.of(J.INSTANCE_REQUESTED)}
    assert stage1 and {requested[e["instances"][0]] for e in stage1} == {"local.cpu2"}


def test_a_cheaper_plan_is_taken_even_when_on_time(case, tmp_path):
    out = _run(case, tmp_path, lambda r: Proposal("local.cpu2", cost=0.0).of(r.plan), 3600.0)
    decision = _boundary(out)
    assert decision["accepted"] and not decision["at_risk"] and decision["reason"].startswith("cheaper")
    assert decision["action"] == "save"
    assert _stage_type(out, 1) == "local.cpu2"


@pytest.mark.parametrize(
    "proposal, reason",
    [
        (dict(instance_type="local.cpu2", cost=1.0), "current plan is as cheap and on time"),
        (dict(instance_type="local.cpu2", cost=0.0, p_meet=0.5), "proposal misses the confidence"),
        (dict(instance_type="local.cpu2", cost=0.0, trials=2), "proposal does not match the remaining stages"),
    ],
)
def test_proposals_that_do_not_pay_are_rejected(case, tmp_path, proposal, reason):
    out = _run(case, tmp_path, lambda r: Proposal(**proposal).of(r.plan), 3600.0)
    decision = _boundary(out)
    assert not decision["accepted"] and decision["reason"].startswith(reason) and decision["action"] == "continue"
    assert _stage_type(out, 1) == "local.cpu4" and not out.of(J.PLAN_CHANGED)
    assert out.result.status == "finished"


@pytest.mark.parametrize("jct_p50, accepted", [(20.0, True), (39.0, False)])
def test_out_of_reach_a_late_proposal_is_taken_only_when_clearly_sooner(case, tmp_path, jct_p50, accepted):
    # 62 s gone, 30 s left; the current plan needs about 40 s more (8 s predicted × 5 slowdown)
    late = dict(instance_type="local.cpu2", cost=9.0, p_meet=0.0, jct_p50=jct_p50)
    out = _run(case, tmp_path, lambda r: Proposal(**late).of(r.plan), AT_RISK_S)
    decision = _boundary(out)
    assert decision["at_risk"] and decision["accepted"] == accepted and decision["action"] == "finish_late"
    if accepted:
        assert decision["reason"].startswith(
            "deadline out of reach (best P(meet) 0.00 < 0.95): the quickest plan (p50 20.0s left, vs 40."
        )
        assert _stage_type(out, 1) == "local.cpu2"
    else:
        assert decision["reason"].endswith("no plan is clearly quicker; finishing late")
        assert _stage_type(out, 1) == "local.cpu4"
    assert out.result.status == "finished"


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


def test_without_a_replanner_the_decision_is_still_journaled(case, tmp_path):
    out = _run(case, tmp_path, None, AT_RISK_S)
    decision = _boundary(out)
    assert decision["kind"] == "replan" and decision["at_risk"] and not decision["accepted"]
    assert decision["reason"].startswith("no re-planner available")
    assert out.result.status == "finished"


def test_a_failing_replanner_keeps_the_plan(case, tmp_path):
    def broken(request):
        raise RuntimeError("solver exploded")

    out = _run(case, tmp_path, broken, AT_RISK_S)
    assert "solver exploded" in _boundary(out)["reason"]
    assert _stage_type(out, 1) == "local.cpu4" and out.result.status == "finished"


# -- re-planning after failover obtained another type -----------------------------------------------------


def _failover(out) -> dict:
    (decision,) = [e for e in out.of("replan") if e.get("trigger") == "failover"]
    return decision


def test_failover_forces_a_replan_without_the_unavailable_type(case, tmp_path):
    seen: list[ReplanRequest] = []

    def replanner(request):
        seen.append(request)
        return Proposal("local.cpu2", cost=5.0).of(request.plan)  # dearer than the current plan: taken anyway

    # local.cpu4 is sold out in every zone: failover finds no local type of 4 workers to stand in
    out = case.but(replanner=replanner, script=SimScript(sold_out=frozenset({"local.cpu4"}))).run(tmp_path / "run")
    assert seen[0].unavailable == ("local:local:local.cpu4",)
    decision = _failover(out)
    assert decision["accepted"] and decision["source"] == "replanner"
    assert decision["unavailable"] == ["local:local:local.cpu4"]
    assert _stage_type(out, 1) == "local.cpu2"
    assert out.state.plan["stages"][1]["instance_type"] == "local.cpu2"
    assert out.result.status == "finished"  # nothing asked the sold-out type for an instance


def _with_a_second_4_worker_type() -> Catalog:
    """The local catalog plus ``local.cpu4b``: 4 workers at half local.cpu4's price (what failover can obtain)."""
    local = load_catalog(["local"])
    cpu4 = local.find("local.cpu4")
    cpu4b = dataclasses.replace(cpu4, name="local.cpu4b", price_hr=0.10, spot_price_hr=0.04)
    return Catalog(types=local.types + (cpu4b,), dates=dict(local.dates))


def test_failover_replan_falls_back_to_the_obtained_type(tmp_path):
    # both stages on local.cpu4, sold out: failover obtains local.cpu4b for stage 0; the re-planner insists on cpu4
    spec = load_spec(write_job(tmp_path / "job"))
    plan = make_plan(spec, [("local.cpu4", 1, 1), ("local.cpu4", 1, 2)], durations=DURATIONS)
    case = SimCase(
        spec,
        plan,
        model=cpu_model(epoch_s=EPOCH_S, startup_s=1.0),
        catalog=_with_a_second_4_worker_type(),
        script=SimScript(sold_out=frozenset({"local.cpu4"})),
        settings=Settings(deadline_s=3600.0, overrun_s=math.inf),
        replanner=lambda r: Proposal("local.cpu4", cost=0.0).of(r.plan),
    )
    out = case.run(tmp_path / "run")
    (failover,) = out.of("failover")
    assert failover["obtained"] == "local.cpu4b" and failover["substituted"]
    decision = _failover(out)
    assert decision["accepted"] and decision["source"] == "substitution"
    assert decision["substitutions"] == {"local.cpu4": "local.cpu4b"}
    assert "uses an unavailable type" in decision["reason"]
    stage = out.state.plan["stages"][1]
    assert stage["instance_type"] == "local.cpu4b"
    assert stage["predicted_cost_usd"] == pytest.approx(plan.stages[1].predicted_cost_usd * 0.10 / 0.20)
    # at the boundary the re-planner insists again: a proposal must not bring the unavailable type back
    boundary = _boundary(out)
    assert not boundary["accepted"] and boundary["reason"].startswith("proposal uses an unavailable type")
    assert _stage_type(out, 1) == "local.cpu4b" and out.result.status == "finished"


def test_an_instance_of_a_type_sold_out_mid_run_keeps_serving_its_stand_in_stages(tmp_path):
    # one local.cpu4 launches, then it is sold out (a stockout mid-run, as GCP's ZONE_RESOURCE_POOL_EXHAUSTED):
    # stage 1's second instance fails over to local.cpu4b and the rest is re-planned onto it; the first cpu4,
    # still held, runs stage 1's trials instead of being released for not being the stand-in type
    spec = load_spec(write_job(tmp_path / "job"))
    plan = make_plan(spec, [("local.cpu4", 1, 1), ("local.cpu4", 2, 1)], durations=DURATIONS)
    case = SimCase(
        spec,
        plan,
        model=cpu_model(epoch_s=EPOCH_S, startup_s=1.0),
        catalog=_with_a_second_4_worker_type(),
        script=SimScript(stock={"local.cpu4": 1}),
        settings=Settings(deadline_s=3600.0, overrun_s=math.inf),
    )
    out = case.run(tmp_path / "run")
    (first,) = [e["id"] for e in out.of(J.INSTANCE_REQUESTED) if e["instance_type"] == "local.cpu4"]
    (failover,) = out.of("failover")
    assert failover["requested"] == "local.cpu4" and failover["obtained"] == "local.cpu4b"
    decision = _failover(out)
    assert decision["accepted"] and decision["substitutions"] == {"local.cpu4": "local.cpu4b"}
    assert out.state.plan["stages"][1]["instance_type"] == "local.cpu4b"
    assert [e for e in out.of("keep") if e["id"] == first and e["stage"] == 1]
    assert {e["instances"][0] for e in out.of(J.TRIAL_STARTED) if e["stage"] == 1} == {first}
    assert not [e for e in out.of("release") if e["id"] == first and e["stage"] < 1]
    assert out.result is not None and out.result.status == "finished"


def test_failover_replan_without_a_stand_in_keeps_the_plan(case, tmp_path):
    out = case.but(script=SimScript(sold_out=frozenset({"local.cpu4"}))).run(tmp_path / "run")
    decision = _failover(out)
    assert not decision["accepted"] and "no available type can stand in" in decision["reason"]
    assert out.state.plan["stages"][1]["instance_type"] == "local.cpu4"
    # the plan is kept, so stage 1's instance is asked of the sold-out type: the run fails, saying so
    assert out.result is None and "could not provision a local.cpu4" in str(out.error)
    assert json.loads((out.run_dir / "result.json").read_text())["status"] == "failed"


# -- admission and graceful lateness (the LatenessPolicy's decision, carried out) ---------------------------


def test_on_late_stop_stops_before_a_stage_predicted_to_miss_the_deadline(case, tmp_path):
    late = dict(instance_type="local.cpu2", cost=9.0, p_meet=0.2, jct_p50=20.0)  # quicker, still late
    out = _run(case, tmp_path, lambda r: Proposal(**late).of(r.plan), AT_RISK_S, on_late="stop")
    assert out.result.status == "stopped"
    assert re.search(
        r"--on-late stop: stopping before the next stage .* \(before stage 1\); .* --on-late finish",
        out.result.result["error"],
    )
    decision = _boundary(out)
    assert decision["action"] == "stop" and not decision["accepted"] and decision["on_late"] == "stop"
    assert out.state.plan["stages"][1]["instance_type"] == "local.cpu4"  # nothing taken, nothing started
    assert _stage_type(out, 1) is None
    assert out.events[-1]["type"] == J.RUN_STOPPED


def test_on_late_stop_still_buys_speed_first(case, tmp_path):
    out = _run(case, tmp_path, lambda r: Proposal("local.cpu2", cost=9.0).of(r.plan), AT_RISK_S, on_late="stop")
    assert _boundary(out)["action"] == "buy_speed"  # the proposal meets the deadline: no stop
    assert _stage_type(out, 1) == "local.cpu2" and out.result.status == "finished"


def test_without_a_replanner_stop_follows_the_slowdown_estimate(case, tmp_path):
    out = _run(case, tmp_path, None, AT_RISK_S, on_late="stop")
    assert out.result.status == "stopped" and _stage_type(out, 1) is None
    assert _boundary(out)["reason"].startswith("no re-planner available; deadline out of reach")


def test_finish_stops_when_the_overrun_would_cut_the_run_anyway(case, tmp_path):
    # 30 s to the deadline, 5 s of overrun, about 40 s of work left on the current plan and no quicker one
    out = _run(case, tmp_path, None, AT_RISK_S, overrun_s=5.0)
    assert out.result.status == "stopped" and _stage_type(out, 1) is None
    assert "allowed overrun" in out.result.result["error"] and "--overrun none" in out.result.result["error"]
