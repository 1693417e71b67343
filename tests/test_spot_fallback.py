"""The executor keeps the deadline on spot: the plumbing into ``SpotPolicy``, the market step of failover, and
preemption notices, without the slow end-to-end runs (those are in tests/test_spot_e2e.py).

* pure: a stage's market, a duration at the run's confidence, the run's work left and one restart's cost;
* the executor on virtual time (tests/sim_helpers.py, scripted losses and notices, no Ray): a preempted spot
  instance's replacement stays on spot while the slack covers another restart and goes on-demand (journaled, for
  good) when it does not;
* failover: a spot request without spot capacity in any zone falls over to on-demand when the plan allows —
  with fake providers, against the moto server (AWS) and the GCE fake (``provisioningModel``);
* notices: the watcher reads AWS IMDSv2 (token, 404 until the notice) and GCP metadata (``Metadata-Flavor``)
  from a local HTTP endpoint; a worker stops right after its checkpoint once a notice came.

The tests with a server (moto, the GCE fake, the metadata endpoint) are in the e2e tier but take a second or two.
"""

from __future__ import annotations

import http.server
import json
import math
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest
from cloud_helpers import REGION, cloud_catalog, ec2_faults, moto_env, moto_server  # noqa: F401  (fixtures)
from executor_helpers import make_plan, worker_context, write_job
from gce_fake import gce_fake  # noqa: F401  (fixture)
from sim_helpers import SimCase, cpu_model

from rubberband.cloud.failover import FailoverExhausted, FailoverPolicy, provision_with_failover
from rubberband.cloud.provider import Instance, InstanceRequest
from rubberband.errors import CloudError, Location, TrialPreempted
from rubberband.executor import journal as J
from rubberband.executor import notices
from rubberband.executor import spot as S
from rubberband.executor.run import Settings
from rubberband.executor.simulated import SimScript
from rubberband.planner.policies import Market, SpotPolicy
from rubberband.spec import load_spec

# -- pure --------------------------------------------------------------------------------------------------


def test_stage_market_reads_a_market_field_first_then_the_spot_flag():
    @dataclass
    class Old:
        spot: bool

    @dataclass
    class New:
        spot: bool
        market: str

    assert S.stage_market(Old(True)) is Market.SPOT and S.stage_market(Old(False)) is Market.ON_DEMAND
    assert S.stage_market(New(True, "on_demand")) is Market.ON_DEMAND
    assert S.stage_market(New(False, Market.SPOT)) is Market.SPOT
    assert S.on_demand_allowed(Old(True))


def test_the_decisions_count_a_spot_stages_work_on_its_fallback_type():
    @dataclass
    class Stage:
        spot: bool
        fallback_instance_type: str | None = None
        fallback_slowdown: float | None = None
        predicted_duration_s: float = 100.0

    @dataclass
    class Predicted:
        stage_duration_s: list

    @dataclass
    class Plan:
        stages: list
        predicted: Predicted

    stages = [Stage(True, "g5.xlarge", 1.25), Stage(True), Stage(False, "g5.xlarge", 1.25), Stage(True, "g5", None)]
    assert [S.fallback_slowdown(s) for s in stages] == [1.25, 1.0, 1.0, 1.0]
    plan = Plan(stages, Predicted([]))
    assert [S.decision_outlook(plan, i).p50_s for i in range(4)] == [125.0, 100.0, 100.0, 100.0]


def test_a_duration_at_the_confidence_is_its_median_or_more():
    assert S.at_confidence(100.0, 130.0, 0.5) == 100.0
    assert S.at_confidence(100.0, 130.0, 0.3) == 100.0  # never counts on luck
    assert S.at_confidence(100.0, 130.0, 0.95) == pytest.approx(130.0)
    assert S.at_confidence(100.0, 130.0, 0.99) > 130.0
    assert S.at_confidence(100.0, None, 0.99) == 100.0


def test_work_left_and_one_restart():
    later = [S.StageOutlook(100.0, 130.0), S.StageOutlook(50.0)]
    work = S.work_left_s(S.StageRest(40.0, 1.5), later, confidence=0.95, slowdown=2.0, waiting_for_instance_s=12.0)
    assert work == pytest.approx(40 * 1.5 + (130 + 50) * 2 + 12)
    fast = S.work_left_s(S.StageRest(40.0, 0.5), later, confidence=0.95, slowdown=0.5)
    assert fast == pytest.approx(40 + 180)  # a fast run so far does not shrink the estimate
    assert S.restart_s(startup_s=20.0, restore_s=1.5, checkpoint_interval_s=6.0) == pytest.approx(27.5)


# -- the executor's decision plumbing, on virtual time (no Ray) ------------------------------------------

#: One epoch on one worker, and every instance's start-up (measured by the run: the restart's first part).
EPOCH_S, STARTUP_S = 10.0, 10.0


def _spot_case(tmp_path, *, deadline_s: float, spec=None, plan=None, **options) -> SimCase:
    """2 trials × 3 epochs in one spot stage on one ``local.cpu2`` (two slots), predicted at 30 s a trial; the
    run may go past its deadline (``overrun_s`` inf)."""
    spec = spec or load_spec(write_job(tmp_path / "job", trials=2, eta=3, min_epochs=3, max_epochs=3))
    plan = plan or _spot_plan(spec, [("local.cpu2", 1, 1)], [30.0], task_s=[30.0])
    options.setdefault("model", cpu_model(epoch_s=EPOCH_S, startup_s=STARTUP_S))
    settings = options.pop("settings", {})
    return SimCase(spec, plan, settings=Settings(deadline_s=deadline_s, overrun_s=math.inf, **settings), **options)


def _spot_plan(spec, stages, durations, *, task_s=None, spot=True):
    plan = make_plan(spec, stages, durations=durations)
    updates = [{"spot": spot, **({"predicted_task_s": task_s[i]} if task_s else {})} for i in range(len(stages))]
    return plan.model_copy(update={"stages": [s.model_copy(update=u) for s, u in zip(plan.stages, updates)]})


#: The first instance is taken back 15 s after it is up (its trials checkpointed epoch 0).
LOSE_THE_FIRST = SimScript(losses={1: 15.0})


def test_preempted_spot_instance_is_replaced_on_spot_while_the_slack_covers_a_restart(tmp_path):
    out = _spot_case(tmp_path, deadline_s=3600.0, script=LOSE_THE_FIRST).run(tmp_path / "run")
    assert out.result.status == "finished"
    (decision,) = out.of("spot")
    assert decision["trigger"] == "preemption" and decision["id"] == "sim-1" and decision["market"] == "spot"
    assert decision["margin_s"] == 0.0  # neither the spec nor the plan sets one
    assert decision["slack_s"] == pytest.approx(
        decision["time_left_s"] - decision["work_left_s"] - decision["restart_s"], abs=1e-2
    )
    # the replacement's start-up (10 s, measured) is both awaited now and in the next restart's cost
    assert decision["restart_s"] >= STARTUP_S and decision["work_left_s"] >= STARTUP_S + 30.0
    (replace,) = out.of("replace")
    assert replace["id"] == "sim-1" and replace["spot"] is True
    requested = {e["id"]: e["spot"] for e in out.of(J.INSTANCE_REQUESTED)}
    assert requested == {"sim-1": True, "sim-2": True}
    assert out.state.choices.on_spot


def test_spot_decisions_see_the_median_prediction_as_the_planners_simulator_does(tmp_path):
    # the simulator feeds SpotPolicy the median of the remaining work (its P(meet) is for decisions made so): a wide
    # tail in the plan's prediction must not move the executor to on-demand earlier than the plan assumed
    spec = load_spec(write_job(tmp_path / "job", trials=3, eta=3, min_epochs=1, max_epochs=3))
    plan = _spot_plan(spec, [("local.cpu2", 1, 1), ("local.cpu2", 1, 1)], [30.0, 40.0])

    def decision(p95_factor: float, where) -> dict:
        dists = [d.model_copy(update={"p95": d.p50 * p95_factor}) for d in plan.predicted.stage_duration_s]
        wide = plan.model_copy(update={"predicted": plan.predicted.model_copy(update={"stage_duration_s": dists})})
        case = _spot_case(tmp_path, deadline_s=3600.0, spec=spec, plan=wide, script=SimScript(losses={1: 5.0}))
        (spot,) = case.run(where).of("spot")
        return spot

    narrow, wide = decision(1.0, tmp_path / "narrow"), decision(3.0, tmp_path / "wide")
    assert narrow["trigger"] == "preemption" and narrow["work_left_s"] >= 40.0  # stage 1 counted, at its median
    assert narrow["work_left_s"] == pytest.approx(wide["work_left_s"])
    assert narrow["quantile"] == wide["quantile"] == S.DECISION_QUANTILE == 0.5


def test_replacement_goes_on_demand_for_good_once_the_slack_runs_short(tmp_path):
    # 25 s to the deadline at the loss, 40 s of work left: on-demand
    out = _spot_case(tmp_path, deadline_s=60.0, script=LOSE_THE_FIRST).run(tmp_path / "run")
    (decision,) = out.of("spot")
    assert decision["market"] == "on_demand" and decision["previous"] == "spot" and decision["slack_s"] <= 0
    assert "on-demand keeps the deadline" in decision["reason"]
    (replace,) = out.of("replace")
    assert replace["spot"] is False
    requested = {e["id"]: e["spot"] for e in out.of(J.INSTANCE_REQUESTED)}
    assert requested == {"sim-1": True, "sim-2": False}
    # the on-demand replacement serves the spot stage: the stopped trials finish on it
    after = [e for e in out.of(J.TRIAL_STARTED) if e["t"] > decision["t"]]
    assert after and {i for e in after for i in e["instances"]} == {"sim-2"}
    assert out.result.status == "finished" and not out.state.choices.on_spot and out.state.choices.fell_back


def _two_spot_stages(tmp_path, **settings) -> SimCase:
    """3 trials × 1 epoch on a ``local.cpu2`` then the best one 2 more epochs on a ``local.cpu1``, both on spot;
    stage 0's prediction is pessimistic (30 s a trial; they take 10 s). The first instance is lost 5 s after it is
    up: with 140 s to the deadline the slack is short then (the replacement goes on-demand) and ample by the time
    stage 1's instance is requested."""
    spec = load_spec(write_job(tmp_path / "job", trials=3, eta=3, min_epochs=1, max_epochs=3))
    plan = _spot_plan(spec, [("local.cpu2", 1, 1), ("local.cpu1", 1, 1)], [60.0, 10.0], task_s=[30.0, 10.0])
    return _spot_case(
        tmp_path, deadline_s=140.0, spec=spec, plan=plan, script=SimScript(losses={1: 5.0}), settings=settings
    )


def test_later_spot_requests_stay_on_demand_quietly_unless_the_policy_returns_to_spot(tmp_path):
    out = _two_spot_stages(tmp_path).run(tmp_path / "run")
    (decision,) = out.of("spot")  # the move to on-demand, and nothing after it
    assert decision["trigger"] == "preemption" and decision["market"] == "on_demand"
    stage1 = [e for e in out.of(J.INSTANCE_REQUESTED) if e["stage"] == 1]
    assert stage1 and not any(e["spot"] for e in stage1)  # no return to spot by default
    assert out.result.status == "finished"
    # with a policy that returns to spot when the slack is ample again, it does (and says so)
    back = _two_spot_stages(tmp_path, spot_policy=SpotPolicy(return_factor=2.0)).run(tmp_path / "back")
    first, again = back.of("spot")
    assert first["market"] == "on_demand"
    assert again["for_stage"] == 1 and again["previous"] == "on_demand" and again["market"] == "spot"
    assert again["slack_s"] >= 2.0 * again["restart_s"]
    stage1 = [e for e in back.of(J.INSTANCE_REQUESTED) if e["stage"] == 1]
    assert stage1 and all(e["spot"] for e in stage1)


def test_the_spot_margin_comes_from_the_plan_else_the_spec_and_moves_the_threshold(tmp_path):
    """``resources.spot_margin_s`` (or a spot plan's ``spot.margin_s``) is the executor's margin: the same
    loss that stays on spot with no margin goes on-demand once the slack is within the margin."""
    from rubberband.plan import SpotInfo

    free = _spot_case(tmp_path, deadline_s=600.0, script=LOSE_THE_FIRST).run(tmp_path / "none")
    (decision,) = free.of("spot")
    assert decision["market"] == "spot" and decision["margin_s"] == 0.0
    # a margin just above the slack at the loss (the first request, 25 s earlier, had about 40 s more of it)
    margin = round(decision["slack_s"]) + 10.0
    spec = _spot_case(tmp_path, deadline_s=600.0).spec
    spec = spec.model_copy(update={"resources": spec.resources.model_copy(update={"spot_margin_s": margin})})
    case = _spot_case(tmp_path, deadline_s=600.0, spec=spec, script=LOSE_THE_FIRST)
    out = case.run(tmp_path / "spec")
    (decision,) = out.of("spot")
    assert decision["trigger"] == "preemption" and decision["market"] == "on_demand"
    assert decision["margin_s"] == margin and decision["slack_s"] > 0
    assert [e["spot"] for e in out.of(J.INSTANCE_REQUESTED)] == [True, False]
    # a plan with a spot model carries its own margin, which wins over the spec's
    plan = case.plan.model_copy(update={"spot": SpotInfo(model_source="test", margin_s=60.0)})
    (decision,) = case.but(plan=plan).run(tmp_path / "plan").of("spot")
    assert decision["margin_s"] == 60.0 and decision["market"] == "spot"


def test_noticed_instance_takes_nothing_more_and_its_replacement_waits_for_its_trials(tmp_path):
    # the notice comes 11 s after the first instance is up; its trials stop after their next checkpoint (epoch 1,
    # 20 s after it is up); the replacement (5 s start-up) is up before that, with nothing to run yet
    model = cpu_model(epoch_s=EPOCH_S, startup_s=5.0)
    case = _spot_case(tmp_path, deadline_s=3600.0, model=model, script=SimScript(notices={1: 11.0}))
    out = case.run(tmp_path / "run")
    assert out.result.status == "finished"
    events = out.events
    (notice,) = out.of("notice")
    assert notice["id"] == "sim-1" and notice["trials"] == ["b0-t000", "b0-t001"]
    (decision,) = out.of("spot")
    assert decision["trigger"] == "notice"
    (replace,) = out.of("replace")
    assert replace["id"] == "sim-1" and replace["reason"] == "preemption-notice"
    ready = {e["id"]: e["t"] for e in out.of(J.INSTANCE_READY)}
    preempted = [e for e in out.of(J.TRIAL_STOPPED) if e["reason"] == "preempted"]
    assert len(preempted) == 2 and ready["sim-2"] < min(e["t"] for e in preempted)
    # the noticed instance takes nothing more; it goes once its trials are off it
    assert not [e for e in out.of(J.TRIAL_STARTED) if e["t"] > notice["t"] and "sim-1" in e["instances"]]
    releases = [e for e in events if e["type"] == J.DECISION and e.get("kind") == "release"]
    (noticed,) = [e for e in releases if e["id"] == "sim-1"]
    assert noticed["reason"] == "preemption notice"
    assert events.index(noticed) > max(events.index(e) for e in preempted)
    # the replacement, idle while they moved over, was kept for them: they resume on it after their checkpoint
    (kept,) = [e for e in releases if e["id"] == "sim-2"]
    moved = [e for e in out.of(J.TRIAL_STARTED) if e["instances"] == ["sim-2"]]
    assert sorted(e["trial_id"] for e in moved) == ["b0-t000", "b0-t001"] and {e["start_epoch"] for e in moved} == {2}
    assert events.index(kept) > max(events.index(e) for e in moved)  # released only once nothing moves or waits
    assert kept["reason"].startswith("idle")


def test_a_stage_left_without_instances_requests_them(tmp_path):
    # the first instance's notice comes 3 s after it is up; its replacement gets one too, 0.5 s after it is up,
    # while nothing runs on it: it goes, not replaced. Once the first instance's trials stop, no instance is left
    model = cpu_model(epoch_s=EPOCH_S, startup_s=2.0)
    case = _spot_case(tmp_path, deadline_s=3600.0, model=model, script=SimScript(notices={1: 3.0, 2: 0.5}))
    out = case.run(tmp_path / "run")
    assert out.result.status == "finished"
    refill = [e for e in out.of("replace") if e["id"] is None]
    (request,) = refill
    assert "no instance left" in request["reason"] and request["stage"] == 0 and request["spot"] is True
    requested = [e for e in out.of(J.INSTANCE_REQUESTED) if e["t"] >= request["t"]]
    assert [e["id"] for e in requested] == ["sim-3"] and requested[0]["spot"]
    assert {i for e in out.of(J.TRIAL_STARTED) if e["t"] >= request["t"] for i in e["instances"]} == {"sim-3"}


def test_on_demand_stage_never_asks_the_spot_policy(tmp_path):
    spec = load_spec(write_job(tmp_path / "job", trials=2, eta=3, min_epochs=3, max_epochs=3))
    plan = _spot_plan(spec, [("local.cpu2", 1, 1)], [30.0], task_s=[30.0], spot=False)
    # a deadline long gone and an instance lost: nothing asks the spot policy, nothing is bought on spot
    out = _spot_case(tmp_path, deadline_s=1.0, spec=spec, plan=plan, script=LOSE_THE_FIRST).run(tmp_path / "run")
    assert out.result.status == "finished" and len(out.of(J.INSTANCE_LOST)) == 1
    assert not out.of("spot")
    assert [e["spot"] for e in out.of(J.INSTANCE_REQUESTED)] == [False, False]
    assert out.of("replace")[0]["spot"] is False


# -- failover's market step --------------------------------------------------------------------------------


@dataclass
class MarketProvider:
    """Spot sold out where ``no_spot`` says (zones, or "*"); on-demand everywhere."""

    no_spot: set[str]
    calls: list[tuple[str, str | None, bool]] = field(default_factory=list)
    cloud: str = "aws"

    def provision(self, request):
        self.calls.append((request.instance_type.name, request.zone, request.spot))
        if request.spot and ("*" in self.no_spot or request.zone in self.no_spot):
            raise CloudError(
                "no spot capacity",
                kind="capacity",
                code="InsufficientInstanceCapacity",
                where=Location(zone=request.zone),
            )
        return [
            Instance(
                id=f"i-{len(self.calls)}",
                cloud="aws",
                instance_type=request.instance_type.name,
                zone=request.zone or "",
                state="running",
                run_id=request.run_id,
            )
        ]


def test_spot_capacity_falls_over_zones_then_to_on_demand_and_blocks_per_market():
    catalog = cloud_catalog()
    p3 = catalog.find("p3.2xlarge", region=REGION)
    provider = MarketProvider({"*"})
    policy = FailoverPolicy()
    result = provision_with_failover(
        InstanceRequest("r", 0, p3, spot=True, on_demand_fallback=True),
        lambda t: provider,
        policy=policy,
        on_demand_fallback=True,
    )
    assert not result.spot and result.zone == "use1-az1"
    assert provider.calls == [
        ("p3.2xlarge", "use1-az1", True),
        ("p3.2xlarge", "use1-az2", True),
        ("p3.2xlarge", "use1-az1", False),
    ]
    assert [(a.market, a.outcome) for a in result.attempts] == [
        ("spot", "capacity"),
        ("spot", "capacity"),
        ("on_demand", "ok"),
    ]
    assert policy.is_blocked(p3, "use1-az1", spot=True) and not policy.is_blocked(p3, "use1-az1")
    # the next spot request skips the blocked spot zones at once
    provider.calls.clear()
    again = provision_with_failover(
        InstanceRequest("r", 0, p3, spot=True), lambda t: provider, policy=policy, on_demand_fallback=True
    )
    assert provider.calls == [("p3.2xlarge", "use1-az1", False)] and not again.spot
    # a spot zone with capacity is taken on spot; without the plan's leave, no on-demand
    provider = MarketProvider({"use1-az1"})
    got = provision_with_failover(InstanceRequest("r", 0, p3, spot=True), lambda t: provider, on_demand_fallback=True)
    assert got.spot and got.zone == "use1-az2"
    provider = MarketProvider({"*"})
    with pytest.raises(FailoverExhausted):
        provision_with_failover(InstanceRequest("r", 0, p3, spot=True), lambda t: provider)
    assert all(spot for _, _, spot in provider.calls)


def test_a_spot_request_falls_over_to_its_plans_on_demand_type_first():
    """``on_demand_type`` (the plan's fall-back type): on-demand tries it first, then the requested type."""
    catalog = cloud_catalog()
    p3, g4dn = catalog.find("p3.2xlarge", region=REGION), catalog.find("g4dn.xlarge", region=REGION)
    provider = MarketProvider({"*"})
    result = provision_with_failover(
        InstanceRequest("r", 0, p3, spot=True, on_demand_fallback=True, on_demand_type=g4dn),
        lambda t: provider,
        on_demand_fallback=True,
    )
    assert not result.spot and result.instance_type == g4dn
    assert provider.calls == [
        ("p3.2xlarge", "use1-az1", True),
        ("p3.2xlarge", "use1-az2", True),
        ("g4dn.xlarge", "use1-az1", False),
    ]

    class NoG4dn(MarketProvider):
        def provision(self, request):
            if request.instance_type.name == "g4dn.xlarge":
                self.calls.append((request.instance_type.name, request.zone, request.spot))
                raise CloudError(
                    "sold out", kind="capacity", code="InsufficientInstanceCapacity", where=Location(zone=request.zone)
                )
            return super().provision(request)

    provider = NoG4dn({"*"})
    result = provision_with_failover(
        InstanceRequest("r", 0, p3, spot=True, on_demand_fallback=True, on_demand_type=g4dn),
        lambda t: provider,
        on_demand_fallback=True,
    )
    assert not result.spot and result.instance_type == p3 and provider.calls[-1] == ("p3.2xlarge", "use1-az1", False)


def test_aws_spot_without_capacity_buys_the_plans_fallback_type_on_demand(moto_env, ec2_faults):
    """moto server: spot p3.2xlarge sold out in every zone; the request names g4dn.xlarge as its on-demand type:
    the worker EC2 launches is an on-demand g4dn.xlarge, and the backend says so."""
    from rubberband.cloud.backend import CloudBackend
    from rubberband.cloud.head import HeadBoot, provision_head
    from rubberband.cloud.registry import ProviderPool
    from rubberband.cloud.teardown import terminate_run

    catalog = cloud_catalog()
    p3, g4dn = catalog.find("p3.2xlarge", region=REGION), catalog.find("g4dn.xlarge", region=REGION)
    pool = ProviderPool({"aws": {"poll_s": 0.01}})
    provider = pool("aws", REGION)
    head = provision_head(provider, "run-f", REGION, p3.zones, HeadBoot(timeout_s=10))
    try:
        backend = CloudBackend(pool, head, join_check=lambda i, t: None)
        ec2_faults.capacity, ec2_faults.capacity_spot_only = {"*"}, True
        request = InstanceRequest("run-f", 0, p3, spot=True, on_demand_fallback=True, on_demand_type=g4dn)
        (worker,) = backend.provision(request)
        got = backend.obtained(worker.id)
        assert got.spot is False and got.instance_type == g4dn
        import boto3

        described = boto3.client("ec2", region_name=REGION).describe_instances(InstanceIds=[worker.id])
        (inst,) = [i for r in described["Reservations"] for i in r["Instances"]]
        assert inst["InstanceType"] == "g4dn.xlarge" and "InstanceLifecycle" not in inst
    finally:
        terminate_run(provider, "run-f", timeout_s=10)
    assert provider.list() == []


def test_aws_spot_without_capacity_becomes_on_demand_through_the_backend(moto_env, ec2_faults):
    """moto server: spot sold out in every zone (on-demand still sells): the worker is on-demand, and says so."""
    from rubberband.cloud.backend import CloudBackend
    from rubberband.cloud.head import HeadBoot, provision_head
    from rubberband.cloud.registry import ProviderPool
    from rubberband.cloud.teardown import terminate_run

    catalog = cloud_catalog()
    p3 = catalog.find("p3.2xlarge", region=REGION)
    pool = ProviderPool({"aws": {"poll_s": 0.01}})
    provider = pool("aws", REGION)
    head = provision_head(provider, "run-m", REGION, p3.zones, HeadBoot(timeout_s=10))
    backend = CloudBackend(pool, head, join_check=lambda i, t: None)
    ec2_faults.capacity, ec2_faults.capacity_spot_only = {"*"}, True
    (worker,) = backend.provision(InstanceRequest("run-m", 0, p3, spot=True, on_demand_fallback=True))
    got = backend.obtained(worker.id)
    assert got.spot is False and got.instance_type == p3
    assert [spot for _, _, spot in ec2_faults.calls[1:]] == [True, True, False]  # after the head's on-demand call
    import boto3

    described = boto3.client("ec2", region_name=REGION).describe_instances(InstanceIds=[worker.id])
    (inst,) = [i for r in described["Reservations"] for i in r["Instances"]]
    assert "InstanceLifecycle" not in inst  # on-demand (a spot instance says "spot")
    terminate_run(provider, "run-m", timeout_s=10)
    assert provider.list() == []


def test_gcp_spot_stockout_becomes_a_standard_vm(gce_fake):
    """GCE fake (strict): SPOT inserts sold out in every zone, STANDARD ones sell: the fall-back is STANDARD."""
    from rubberband.cloud.gcp.provider import GcpProvider
    from rubberband.cloud.teardown import terminate_run

    catalog = cloud_catalog()
    t4 = catalog.find("n1-standard-8+T4x4", region="us-central1")
    provider = GcpProvider("us-central1", endpoint=gce_fake.url, poll_s=0.01)
    gce_fake.stockout_zones, gce_fake.stockout_spot_only = {"us-central1-a"}, True
    result = provision_with_failover(
        InstanceRequest("run-g", 0, t4, spot=True, on_demand_fallback=True), lambda t: provider, on_demand_fallback=True
    )
    assert not result.spot
    models = [i["scheduling"]["provisioningModel"] for i in gce_fake.inserted()]
    assert models == ["SPOT", "STANDARD"]  # the SPOT insert's operation ended ZONE_RESOURCE_POOL_EXHAUSTED
    (vm,) = gce_fake.instances.values()
    assert vm["scheduling"]["provisioningModel"] == "STANDARD"
    assert not gce_fake.rejected
    terminate_run(provider, "run-g", timeout_s=10)
    assert not gce_fake.instances


def test_gcp_spot_stockout_buys_the_plans_fallback_type_as_a_standard_vm(gce_fake):
    """GCE fake (strict): SPOT n1-standard-8+V100x1 sold out in every zone; the request names a2-highgpu-1g as its
    on-demand type: the VM inserted after the SPOT tries is a STANDARD a2-highgpu-1g."""
    from rubberband.cloud.gcp.provider import GcpProvider
    from rubberband.cloud.teardown import terminate_run

    catalog = cloud_catalog()
    v100 = catalog.find("n1-standard-8+V100x1", region="us-central1")
    a100 = catalog.find("a2-highgpu-1g", region="us-central1")
    provider = GcpProvider("us-central1", endpoint=gce_fake.url, poll_s=0.01)
    gce_fake.stockout_zones, gce_fake.stockout_spot_only = {"us-central1-a", "us-central1-b"}, True
    try:
        result = provision_with_failover(
            InstanceRequest("run-h", 0, v100, spot=True, on_demand_fallback=True, on_demand_type=a100),
            lambda t: provider,
            on_demand_fallback=True,
        )
        assert not result.spot and result.instance_type == a100
        models = [i["scheduling"]["provisioningModel"] for i in gce_fake.inserted()]
        assert models == ["SPOT", "SPOT", "STANDARD"]
        (vm,) = gce_fake.instances.values()
        assert vm["scheduling"]["provisioningModel"] == "STANDARD" and vm["machineType"].endswith("/a2-highgpu-1g")
        assert not gce_fake.rejected
    finally:
        terminate_run(provider, "run-h", timeout_s=10)
    assert not gce_fake.instances


# -- preemption notices --------------------------------------------------------------------------------------


class Metadata(http.server.ThreadingHTTPServer):
    """A local metadata server: AWS IMDSv2 (token required; instance-action 404 until ``notice``) and GCP
    (``Metadata-Flavor: Google`` required; ``instance/preempted`` FALSE until ``notice``); per instance when the
    path starts with ``/<instance id>/``."""

    daemon_threads = True

    def __init__(self) -> None:
        self.noticed: set[str] = set()  # instance ids (or "" for every path) with a notice
        self.seen: list[str] = []

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def _send(self, status: int, body: str = "") -> None:
                data = body.encode()
                self.send_response(status)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_PUT(self):  # noqa: N802
                server.seen.append(f"PUT {self.path}")
                if self.path.endswith("/latest/api/token") and self.headers.get("X-aws-ec2-metadata-token-ttl-seconds"):
                    return self._send(200, "TOKEN-1")
                return self._send(400)

            def do_GET(self):  # noqa: N802
                server.seen.append(f"GET {self.path}")
                who = self.path.split("/")[1] if self.path.count("/") > 2 else ""
                noticed = "" in server.noticed or who in server.noticed
                if self.path.endswith("/latest/meta-data/spot/instance-action"):
                    if self.headers.get("X-aws-ec2-metadata-token") != "TOKEN-1":
                        return self._send(401)
                    if not noticed:
                        return self._send(404)
                    return self._send(200, json.dumps({"action": "terminate", "time": "2026-11-24T04:00:00Z"}))
                if self.path.endswith("/instance/preempted"):
                    if self.headers.get("Metadata-Flavor") != "Google":
                        return self._send(403)
                    return self._send(200, "TRUE" if noticed else "FALSE")
                return self._send(404)

        server = self
        super().__init__(("127.0.0.1", 0), Handler)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/"


@pytest.fixture
def metadata() -> Iterator[Metadata]:
    server = Metadata()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


@pytest.mark.e2e  # a local HTTP server (fast)
def test_aws_notice_read_with_an_imdsv2_token(metadata):
    reader = notices.NoticeReader(notices.NoticeSource("aws", metadata.url))
    assert reader.read() is None  # 404: nothing scheduled
    metadata.noticed.add("")
    notice = reader.read()
    assert notice == {"cloud": "aws", "action": "terminate", "time": "2026-11-24T04:00:00Z"}
    assert metadata.seen.count("PUT /latest/api/token") == 1  # the token is reused


@pytest.mark.e2e  # a local HTTP server (fast)
def test_gcp_notice_and_per_instance_endpoints(metadata):
    source = notices.notice_source("gcp", metadata.url + "{instance}")
    reader = notices.NoticeReader(source.for_instance("vm-1"))
    other = notices.NoticeReader(source.for_instance("vm-2"))
    assert reader.read() is None
    metadata.noticed.add("vm-1")
    assert reader.read() == {"cloud": "gcp", "action": "preempted", "time": None}
    assert other.read() is None and "GET /vm-1/instance/preempted" in metadata.seen


def test_notice_sources_default_to_the_clouds_metadata_servers():
    assert notices.notice_source("aws").base_url == "http://169.254.169.254/"
    assert notices.notice_source("gcp", None).base_url.startswith("http://metadata.google.internal/")
    assert notices.notice_source("aws", "http://127.0.0.1:8/{instance}").base_url == "http://127.0.0.1:8/{instance}/"
    assert notices.notice_source("local", "http://x/") is None and notices.notice_source("sim") is None


def test_no_metadata_server_is_no_notice():
    reader = notices.NoticeReader(notices.NoticeSource("aws", "http://127.0.0.1:9/"), timeout_s=0.5)
    assert reader.read() is None


@pytest.mark.e2e  # a local HTTP server (fast)
def test_watcher_polls_until_the_notice_and_answers_at_once(metadata):
    watcher = notices.NoticeWatcher(notices.NoticeSource("aws", metadata.url), poll_s=0.05)
    try:
        assert watcher.notice() is None and watcher.wait_notice(0.2) is None
        metadata.noticed.add("")
        notice = watcher.wait_notice(5.0)
        assert notice is not None and notice["action"] == "terminate" and notice["seen_at"] <= time.time()
        assert watcher.notice() == notice
    finally:
        watcher.stop()


def test_worker_stops_right_after_its_checkpoint_on_a_notice(tmp_path, monkeypatch):
    from rubberband.executor.checkpoints import latest_epoch

    monkeypatch.setenv(notices.WATCHERS_ENV, "rb-notice-i-1")
    asked: list[list[str]] = []
    answer: dict = {}

    def check(names, cache, **_):
        asked.append(list(names))
        return answer.get("notice")

    monkeypatch.setattr(notices, "check_watchers", check)
    ctx = worker_context(tmp_path / "ck")
    ctx.report(0, loss=1.0)
    ctx.save_checkpoint({"w": 1})  # no notice: goes on
    answer["notice"] = {"cloud": "aws", "action": "terminate"}
    ctx.report(1, loss=0.5)
    with pytest.raises(notices.PreemptionNotice, match="after the checkpoint of epoch 1"):
        ctx.save_checkpoint({"w": 2})
    assert latest_epoch(tmp_path / "ck") == 1 and ctx.preemption_notice["action"] == "terminate"
    assert asked == [["rb-notice-i-1"], ["rb-notice-i-1"]]
    other = worker_context(tmp_path / "ck", rank=1, world_size=2)
    with pytest.raises(notices.PreemptionNotice):  # every rank stops at the same point
        other.save_checkpoint({"w": 2})


def test_a_plan_interval_skips_saves_but_never_the_last_nor_one_on_a_notice(tmp_path, monkeypatch):
    """``checkpoint_every`` 3 over epochs 0–6 of a task ending at 7: saves after epochs 2 and 5 and the last (6);
    a notice after epoch 3 saves there at once and stops the trial."""
    from rubberband.executor.checkpoints import due, latest_epoch

    assert [e for e in range(7) if due(e, 7, 3)] == [2, 5, 6] and all(due(e, 7, 1) for e in range(7))
    saved: list[int] = []

    def context(directory):
        ctx = worker_context(directory, end_epoch=7, checkpoint_every=3)
        monkeypatch.setattr(ctx, "_emit", lambda event: saved.append(event.epoch))
        return ctx

    ctx = context(tmp_path / "a")
    for epoch in range(7):
        ctx.report(epoch, loss=1.0)
        ctx.save_checkpoint({"epoch": epoch})
    assert [e for e in saved if e is not None] == [0, 1, 2, 2, 3, 4, 5, 5, 6, 6]  # epochs reported, saves after 2, 5, 6
    assert latest_epoch(tmp_path / "a") == 6 and len(ctx.checkpoint_saved_s) == 3

    monkeypatch.setenv(notices.WATCHERS_ENV, "rb-notice-i-1")
    answer: dict = {}
    monkeypatch.setattr(notices, "check_watchers", lambda names, cache, **_: answer.get("notice"))
    saved.clear()
    ctx = context(tmp_path / "b")
    for epoch in range(3):
        ctx.report(epoch, loss=1.0)
        ctx.save_checkpoint({"epoch": epoch})
    answer["notice"] = {"cloud": "gcp", "action": "preempted"}
    ctx.report(3, loss=1.0)
    with pytest.raises(notices.PreemptionNotice, match="after the checkpoint of epoch 3"):
        ctx.save_checkpoint({"epoch": 3})
    assert latest_epoch(tmp_path / "b") == 3 and len(ctx.checkpoint_saved_s) == 2  # after 2, and on the notice


def test_a_preempted_rank_makes_the_trial_preempted_not_failed():
    from rubberband.executor.trials import TrialSpec, training_error
    from rubberband.executor.worker import WorkerFailure

    spec = TrialSpec(
        trial_id="b0-t000",
        config={},
        entry_point="m:f",
        code_dir="",
        start_epoch=0,
        end_epoch=3,
        placement=("rb-node-a", "rb-node-a"),
        checkpoint_dir="",
    )
    failures = [
        WorkerFailure(
            rank=1, kind="train", error_type="DistBackendError", message="gloo: connection closed", failed_at=1.0
        ),
        WorkerFailure(
            rank=0,
            kind="preempted",
            error_type="PreemptionNotice",
            message="preemption notice (aws terminate): stopped after the checkpoint of epoch 1",
            failed_at=2.0,
        ),
    ]
    error = training_error(spec, failures, {}, [])
    assert isinstance(error, TrialPreempted) and "rank 0" in str(error)
