"""The real executor on a simulated cluster on virtual time (``rubberband run --cloud sim``; no Ray, no cloud).

What is simulated is the cluster (executor/simulated.py); what runs is the executor's own loop, policies, journal
and result. ``bench/bench_sim_executor.py`` checks it against the planner's prediction over many seeds; these
tests pin what one run must do.
"""

from __future__ import annotations

import json
import math
import statistics
import sys
import types
from pathlib import Path

import pytest
import yaml

from conftest import EXAMPLES
from test_bad_input import invoke

from rubberband.cloud.provider import InstanceRequest, node_resource
from rubberband.errors import CloudError, TrainingError
from rubberband.executor import journal as J
from rubberband.executor.run import Executor, Job, Target
from rubberband.executor.sim_world import SimSettings
from rubberband.executor.simulated import SimCluster, SimWorld, simulated_for
from rubberband.inputs import load_job_inputs
from rubberband.planner.policies import PrefetchPolicy
from rubberband.planning import PlanningOptions, plan_from_inputs

START = 1_800_000_000.0  # the virtual clock's start: nowhere near today's wall clock


def _job(tmp_path: Path, **changes) -> Path:
    data = yaml.safe_load((EXAMPLES / "quickstart.yaml").read_text())
    data["profile"] = str((EXAMPLES / data["profile"]).resolve())
    data.update(changes)
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def _execute(inputs, plan, run_dir: Path, seed: int):
    """The unchanged executor on a simulated cluster for ``plan`` (seed ``seed``): (sim, result)."""
    job = Job(inputs.spec, plan, inputs.catalog, inputs.profile)
    sim = simulated_for(job, seed=seed, start=START)
    target = Target(f"sim-{seed}", run_dir, sim.backend, sim.runtime, cluster=sim.cluster, clock=sim.clock)
    return sim, Executor(job, target).run()


def _simulate(spec_path: Path, run_dir: Path, *, seed: int = 0):
    inputs = load_job_inputs(spec_path)
    plan = plan_from_inputs(inputs, options=PlanningOptions(samples=300))
    sim, result = _execute(inputs, plan, run_dir, seed)
    return plan, sim, result


@pytest.fixture(scope="module")
def quickstart_run(tmp_path_factory):
    base = tmp_path_factory.mktemp("sim")
    return _simulate(_job(base), base / "run")


def test_the_quickstart_runs_to_its_end_on_virtual_time_as_predicted(quickstart_run):
    plan, sim, result = quickstart_run
    events = list(J.iter_events(result.run_dir / J.JOURNAL_NAME))
    assert result.status == "finished" and result.result["outcome"] == "met"
    actual = result.result["actual"]
    assert actual["jct_s"] == pytest.approx(plan.predicted.jct_s.p50, rel=0.05)
    assert actual["cost_usd"] == pytest.approx(plan.predicted.cost_usd.mean, rel=0.05)
    stamps = [e["t"] for e in events]
    assert START <= min(stamps) and max(stamps) <= sim.clock.time() + 1e-3  # virtual time throughout
    started = [e for e in events if e["type"] == J.TRIAL_STARTED]
    assert len({e["trial_id"] for e in started if e["stage"] == 0}) == 81
    requested = {e["id"] for e in events if e["type"] == J.INSTANCE_REQUESTED}
    terminated = {e["id"] for e in events if e["type"] == J.INSTANCE_TERMINATED}
    assert len(requested) == 81 and requested == terminated  # every instance released
    assert all(s.ended_at is not None for s in sim.world.instances.values())
    assert (result.run_dir / "result.json").exists()


def test_every_simulated_task_reports_each_of_its_epochs(quickstart_run):
    """A task's last epoch ends where the task does, though its epochs are summed one by one against a clock near
    1.8e9 s: its report must not be lost to the rounding (the stage's metric is the last epoch's)."""
    _, _, result = quickstart_run
    events = list(J.iter_events(result.run_dir / J.JOURNAL_NAME))
    reported = {(e["trial_id"], e["epoch"]) for e in events if e["type"] == J.EPOCH}
    for task in (e for e in events if e["type"] == J.TRIAL_STARTED):
        epochs = range(task["start_epoch"], task["end_epoch"])
        assert all((task["trial_id"], epoch) in reported for epoch in epochs), task["trial_id"]


def test_a_clouds_stage_instances_start_side_by_side(quickstart_run):
    """On AWS the 81 requests of stage 0 go out at once and each is up after its own start-up (a thread per
    request, as the simulator has it), not one after another."""
    _, sim, result = quickstart_run
    first = sorted(sim.world.instances.values(), key=lambda s: s.instance.launched_at)[:81]
    assert len({s.instance.launched_at for s in first}) == 1
    ups = [s.up_at - s.instance.launched_at for s in first]
    assert max(ups) < 3 * sorted(ups)[len(ups) // 2]  # no up-time is a sum of start-ups


def test_the_plans_head_instance_is_billed(quickstart_run):
    plan, _, result = quickstart_run
    assert plan.head is not None
    assert result.result["actual"]["head_usd"] == pytest.approx(plan.predicted.cost_breakdown.head_usd, rel=0.1)


def test_a_local_plans_nodes_come_up_one_after_another(tmp_path):
    """The local backend starts its Ray nodes one at a time: so does the simulated one (the executor's single
    provisioning thread), and a local run's head boots first."""
    data = yaml.safe_load((EXAMPLES / "quickstart_local.yaml").read_text())
    data["profile"] = str((EXAMPLES / data["profile"]).resolve())
    spec_path = tmp_path / "local.yaml"
    spec_path.write_text(yaml.safe_dump(data))
    plan, sim, result = _simulate(spec_path, tmp_path / "run")
    assert result.status == "finished"
    instances = sorted(sim.world.instances.values(), key=lambda s: s.instance.launched_at)
    stage0 = [s for s in instances if s.instance.stage == 0]
    assert stage0[0].instance.launched_at > START  # after the head
    for before, after in zip(stage0, stage0[1:]):
        assert after.instance.launched_at >= before.up_at - 1e-6


def test_the_same_seed_plays_the_same_run_and_another_seed_another(tmp_path):
    spec_path = _job(tmp_path, scheduler={"kind": "sha", "trials": 9, "eta": 3, "min_epochs": 1, "max_epochs": 9})
    runs = [
        _simulate(spec_path, tmp_path / f"run{i}", seed=seed)[2].result["actual"]["jct_s"]
        for i, seed in enumerate((3, 3, 4))
    ]
    assert runs[0] == runs[1] != runs[2]


def test_an_idle_instance_is_kept_only_when_later_ones_cannot_fill_the_next_stage():
    policy = PrefetchPolicy()
    assert not policy.keep_for_next(True, 0, 3, later=3)  # three still busy: they free last, they carry over
    assert policy.keep_for_next(True, 1, 3, later=1)
    assert not policy.keep_for_next(False, 0, 3, later=0)


def test_a_wait_skips_to_the_next_event_but_no_further_than_a_step_or_the_timeout():
    from rubberband.executor.clock import VirtualClock
    from rubberband.executor.simulated import SimCluster
    from rubberband.planner.model import fit_performance_model
    from rubberband.profile import load_profile

    model = fit_performance_model(load_profile(EXAMPLES / "profiles" / "quickstart_local.json"))
    world = SimWorld(model, VirtualClock(START), SimSettings(max_step_s=5.0))
    cluster = SimCluster(world)
    assert cluster.wait([], 60.0) == [] and world.clock.time() == START + 5.0  # nothing due: one step
    assert cluster.wait([], 0.2) == [] and world.clock.time() == START + 5.2  # or as far as the loop's timer
    with pytest.raises(ValueError):
        SimWorld(model, world.clock, SimSettings(max_step_s=0.0))


def test_the_cli_runs_a_spec_on_simulated_time(tmp_path):
    run_dir = tmp_path / "run"
    result = invoke("run", _job(tmp_path), "--cloud", "sim", "--yes", "--run-dir", run_dir)
    assert result.code == 0, result.err[-3000:]
    assert "simulated: aws instances and trials played on virtual time" in result.err
    outcome = json.loads((run_dir / "result.json").read_text())
    assert outcome["status"] == "finished" and outcome["outcome"] == "met"
    assert "ray" not in sys.modules or not sys.modules["ray"].is_initialized()
    again = invoke("run", "--resume", run_dir)
    assert "is a simulated run (--cloud sim); it is not resumed" in again.refused()


@pytest.mark.parametrize("flags", [["--resume", "x"], ["--dry-run"], ["--detach"]])
def test_cloud_sim_refuses_what_a_simulated_run_does_not_do(tmp_path, flags):
    result = invoke("run", _job(tmp_path), "--cloud", "sim", "--yes", *flags)
    assert "--cloud sim takes none of" in result.refused()
    assert not (tmp_path / "runs").exists()


# -- spot: preemptions and capacity from the plan's spot model ----------------------------------------------------

SPOT_ZONE = "us-east-1*"  # the shipped model's pooled zone of p3.2xlarge in us-east-1, where spot plans go


def _spot_model(tmp_path: Path, *, rate_per_h: float, p_unavailable: float) -> Path:
    """The shipped spot model with its us-east-1 p3.2xlarge zone made to preempt at ``rate_per_h`` and find no
    capacity with ``p_unavailable`` (in every zone tried); the other types never have spot capacity (entries of
    their own, so no prior pooled from p3.2xlarge's makes them spot candidates)."""
    from rubberband.spotmodel import default_model_path

    data = json.loads(Path(default_model_path()).read_text())
    zone = next(z for z in data["zones"] if z["zone"] == SPOT_ZONE)
    zone.update(preemption_rate_per_h=rate_per_h, p_unavailable=p_unavailable, p_none_of=[p_unavailable])
    never = [
        {**zone, "instance_type": t, "p_unavailable": 1.0, "p_none_of": [1.0]} for t in ("g4dn.xlarge", "g5.xlarge")
    ]
    data["zones"] = [zone, *never]
    path = tmp_path / f"spot-{rate_per_h:g}-{p_unavailable:g}.json"
    path.write_text(json.dumps(data))
    return path


def _spot_plan(tmp_path: Path, deadline: str, *, rate_per_h: float = 2.0, p_unavailable: float = 0.0):
    inputs = load_job_inputs(
        _job(
            tmp_path,
            deadline=deadline,
            resources={
                "clouds": ["aws"],
                "instance_types": ["p3.2xlarge", "g4dn.xlarge", "g5.xlarge"],
                "max_workers_per_trial": 1,
                "spot": True,
            },
        )
    )
    model = _spot_model(tmp_path, rate_per_h=rate_per_h, p_unavailable=p_unavailable)
    plan = plan_from_inputs(inputs, options=PlanningOptions(samples=300, spot_model=str(model)))
    assert all(s.spot and s.instance_type == "p3.2xlarge" for s in plan.stages) and plan.spot is not None
    return inputs, plan


def _run(inputs, plan, run_dir: Path, seed: int):
    sim, result = _execute(inputs, plan, run_dir, seed)
    return sim, result, list(J.iter_events(run_dir / J.JOURNAL_NAME))


@pytest.fixture(scope="module")
def spot_2h(tmp_path_factory):
    """The quickstart on spot with 2 h to its deadline, p3.2xlarge preempted twice an hour (seed 0)."""
    base = tmp_path_factory.mktemp("spot")
    inputs, plan = _spot_plan(base, "2h")
    return (inputs, plan, *_run(inputs, plan, base / "run", 0))


@pytest.mark.xdist_group("sim_spot_2h")  # one worker plans and runs the fixture, once
def test_spot_instances_are_preempted_and_their_trials_restart_from_their_checkpoints(spot_2h):
    inputs, plan, sim, result, events = spot_2h
    assert result.status == "finished" and result.result["outcome"] == "met"
    lost = [e for e in events if e["type"] == J.INSTANCE_LOST]
    assert lost and all(e["reason"] == "spot-interruption" for e in lost)
    for e in lost:  # seen the moment the cloud took it back; billed up to then; Ray no longer shows it
        s = sim.world.instances[e["id"]]
        assert s.spot and e["t"] == pytest.approx(s.taken_at) and s.ended_at == pytest.approx(s.taken_at)
        assert any(t["type"] == J.INSTANCE_TERMINATED and t["id"] == e["id"] and t["t"] == e["t"] for t in events)
        assert node_resource(e["id"]) not in sim.cluster.node_resources()
    replaced = [e for e in events if e["type"] == J.DECISION and e.get("kind") == "replace"]
    assert {e["id"] for e in replaced} == {e["id"] for e in lost}
    price = inputs.catalog.find("p3.2xlarge", cloud="aws", region="us-east-1").spot_price_hr
    requested = [e for e in events if e["type"] == J.INSTANCE_REQUESTED]
    assert all(e["spot"] and e["price_hr"] == price for e in requested)  # the replacements stayed on spot
    # a trial on a lost instance died with it (a dead worker, not a training error) after checkpointing the
    # epochs it finished; it restarted from the epoch after its checkpoint and finished its stage
    died = [e for e in events if e["type"] == J.TRIAL_STOPPED and e["reason"] == "instance_lost"]
    assert died and all("SimWorkerDied" in e["error"] for e in died)
    restarts = []
    for stop in died:
        checkpoints = [
            e["epoch"]
            for e in events
            if e["type"] == "checkpoint"
            and e["trial_id"] == stop["trial_id"]
            and e["t"] <= stop["t"]
            and e["epoch"] < stop["end_epoch"]
        ]
        after = next(
            e
            for e in events
            if e["type"] == J.TRIAL_STARTED and e["trial_id"] == stop["trial_id"] and e["t"] >= stop["t"]
        )
        assert after["start_epoch"] == max([stop["start_epoch"] - 1, *checkpoints]) + 1
        restarts.append(after["start_epoch"] - stop["start_epoch"])
    assert max(restarts) > 0  # at least one restart skipped the epochs its checkpoint covered
    finished = {
        (e["trial_id"], e["stage"]) for e in events if e["type"] == J.TRIAL_STOPPED and e["reason"] == "finished"
    }
    assert {(e["trial_id"], e["stage"]) for e in died} <= finished


@pytest.mark.xdist_group("sim_spot_2h")  # one worker plans and runs the fixture, once
def test_spot_runs_are_the_same_for_a_seed_and_differ_between_seeds(tmp_path, spot_2h):
    inputs, plan, _, result, events = spot_2h

    def losses(evs):
        return [(e["id"], round(e["t"], 6)) for e in evs if e["type"] == J.INSTANCE_LOST]

    _, again, events_again = _run(inputs, plan, tmp_path / "again", 0)
    _, other, events_other = _run(inputs, plan, tmp_path / "other", 1)
    assert losses(events_again) == losses(events) and again.result["actual"] == result.result["actual"]
    assert losses(events_other) != losses(events)


def test_with_little_slack_the_spot_policy_moves_to_on_demand(tmp_path):
    """95 min for a plan whose median is ~82 min: after a few preemptions the slack no longer covers another
    restart and the executor's SpotPolicy buys the replacement on-demand: of the plan's fall-back type (g5.xlarge,
    cheaper per epoch than an on-demand p3.2xlarge), billed at its on-demand price."""
    inputs, plan = _spot_plan(tmp_path, "95m")
    assert {(s.instance_type, s.fallback_instance_type) for s in plan.stages if s.spot} == {("p3.2xlarge", "g5.xlarge")}
    _, result, events = _run(inputs, plan, tmp_path / "run", 1)
    assert result.status == "finished"
    moved = [e for e in events if e["type"] == J.DECISION and e.get("kind") == "spot" and e["market"] == "on_demand"]
    assert moved and moved[0]["slack_s"] <= moved[0]["margin_s"]
    fallback = inputs.catalog.find("g5.xlarge", cloud="aws", region="us-east-1")
    on_demand = [e for e in events if e["type"] == J.INSTANCE_REQUESTED and not e["spot"]]
    assert on_demand and all(
        e["instance_type"] == "g5.xlarge" and e["price_hr"] == fallback.price_hr and e["t"] >= moved[0]["t"]
        for e in on_demand
    )
    assert not [e for e in events if e["type"] == J.DECISION and e.get("kind") == "failover"]  # the plan's choice


def test_slow_checkpoint_saves_make_the_plan_checkpoint_spot_stages_every_few_epochs(tmp_path):
    """The profile says a save takes 25 s of the epoch's 30 s overhead and spot is preempted rarely: the plan checkpoints
    its spot stages every few epochs (``spot.checkpoint_epochs``) and the executor's trials save only then (and after
    their last epoch); a trial whose instance is taken back restarts from such a checkpoint."""
    from dataclasses import replace

    inputs = load_job_inputs(
        _job(
            tmp_path,
            deadline="2h",
            resources={
                "clouds": ["aws"],
                "instance_types": ["p3.2xlarge", "g4dn.xlarge", "g5.xlarge"],
                "max_workers_per_trial": 1,
                "spot": True,
            },
        )
    )
    workload = inputs.profile.workload.model_copy(update={"epoch_overhead_s": 30.0, "checkpoint_save_s": 25.0})
    inputs = replace(inputs, profile=inputs.profile.model_copy(update={"workload": workload}))
    model = _spot_model(tmp_path, rate_per_h=1.0, p_unavailable=0.0)
    plan = plan_from_inputs(inputs, options=PlanningOptions(samples=300, spot_model=str(model)))
    every = plan.spot.checkpoint_epochs
    assert every > 1 and any(s.spot for s in plan.stages)
    _, result, events = _run(inputs, plan, tmp_path / "run", 0)
    assert result.status == "finished" and any(e["type"] == J.INSTANCE_LOST for e in events)
    ends = {s.epochs - 1 for s in plan.stages}
    saved = [e["epoch"] for e in events if e["type"] == J.CHECKPOINT]
    assert saved and all((epoch + 1) % every == 0 or epoch in ends for epoch in saved)
    firsts = {s.epochs - s.epochs_this_stage for s in plan.stages}
    lost = {e["trial_id"] for e in events if e["type"] == J.TRIAL_STOPPED and e["reason"] == "instance_lost"}
    redone = 0  # epochs a restarted trial had reported, past its last due checkpoint: trained again
    for trial in lost:
        mine = [e for e in events if e.get("trial_id") == trial]
        for i, e in enumerate(mine):
            if e["type"] == J.TRIAL_STARTED and i and any(x["type"] == J.TRIAL_STOPPED for x in mine[:i]):
                start = e["start_epoch"]
                assert start in firsts or start % every == 0  # right after a due checkpoint
                redone += sum(1 for x in mine[:i] if x["type"] == J.EPOCH and x["epoch"] >= start)
    assert lost and redone > 0


@pytest.mark.xdist_group("sim_spot_2h")  # one worker plans and runs the fixture, once
def test_a_spot_request_without_capacity_falls_over_to_on_demand(tmp_path, spot_2h):
    """The cloud has no spot capacity (p_unavailable 1, which the plan did not expect): every request falls over to
    on-demand on the plan's fall-back type, journaled as the failover's market change and billed on-demand; on-demand
    is never preempted, and the fall-back type is no failover substitute (later requests still ask for spot
    p3.2xlarge)."""
    inputs, plan, *_ = spot_2h
    zones = [z.model_copy(update={"p_unavailable": 1.0}) for z in plan.spot.zones]
    sold_out = plan.model_copy(update={"spot": plan.spot.model_copy(update={"zones": zones})})
    sim, result, events = _run(inputs, sold_out, tmp_path / "run", 0)
    assert result.status == "finished"
    requested = [e for e in events if e["type"] == J.INSTANCE_REQUESTED]
    price = inputs.catalog.find("g5.xlarge", cloud="aws", region="us-east-1").price_hr
    assert requested and all(
        not e["spot"] and e["instance_type"] == "g5.xlarge" and e["price_hr"] == price for e in requested
    )
    failover = [e for e in events if e["type"] == J.DECISION and e.get("kind") == "failover"]
    assert len(failover) == len(requested)
    assert all(
        e["requested"] == "p3.2xlarge"
        and e["requested_market"] == "spot"
        and e["obtained_market"] == "on_demand"
        and "fall-back type g5.xlarge" in e["reason"]
        for e in failover
    )
    assert not [e for e in events if e["type"] == J.INSTANCE_LOST]
    assert all(not s.spot and s.taken_at is None for s in sim.world.instances.values())


def _spot_world(*, rate_per_h: float = 0.0, p_unavailable: float = 0.0, seed: int = 0):
    from rubberband.catalog import load_catalog
    from rubberband.executor.clock import VirtualClock
    from rubberband.executor.simulated import SimBackend
    from rubberband.planner.model import fit_performance_model
    from rubberband.planner.spot import DURATION_LEVELS, ZoneModel
    from rubberband.profile import load_profile

    itype = load_catalog(["aws"]).find("p3.2xlarge", cloud="aws", region="us-east-1")
    zone = ZoneModel(
        cloud="aws",
        instance_type=itype.name,
        region=itype.region,
        zone=SPOT_ZONE,
        preemption_rate_per_h=rate_per_h,
        p_unavailable=p_unavailable,
        unavailable_s=tuple(600.0 + 600.0 * q for q in DURATION_LEVELS),
    )  # 10-20 min
    model = fit_performance_model(load_profile(EXAMPLES / "profiles" / "resnet50_cifar10_v100.json"))
    world = SimWorld(model, VirtualClock(START), SimSettings(seed=seed, max_step_s=3600.0, spot_zones={zone.key: zone}))
    return world, SimBackend(world, load_catalog(["aws"]), itype), itype, zone


def test_preemptions_and_sold_out_requests_are_drawn_from_the_zone_model():
    world, _, _, zone = _spot_world(rate_per_h=2.0, p_unavailable=0.25)
    after = [world.preemption_after_s(zone) for _ in range(4000)]
    assert statistics.fmean(after) == pytest.approx(1800.0, rel=0.06)  # exponential, 2 an hour
    # requests an hour apart (longer than any unavailability) find none with p_unavailable
    found = [world.spot_capacity(zone, START + 3600.0 * i) for i in range(4000)]
    assert 1 - statistics.fmean(found) == pytest.approx(0.25, abs=0.03)
    # requests made together share one draw; once none is found, none is until the drawn duration ends
    t = next(START + 3600.0 * i for i, ok in enumerate(found) if not ok)
    assert not world.spot_capacity(zone, t) and not world.spot_capacity(zone, t + 599.0)
    never, _, _, calm = _spot_world(rate_per_h=0.0)
    assert never.preemption_after_s(calm) == math.inf


def test_a_preempted_instance_is_lost_and_its_trial_dies_with_it_after_its_checkpoints():
    from rubberband.executor.simulated import SimTrial, Span, SimWorkerDied

    world, backend, itype, _ = _spot_world(rate_per_h=1.0)
    (instance,) = backend.provision(InstanceRequest("run", 0, itype, spot=True, on_demand_fallback=True))
    sim = world.instances[instance.id]
    assert sim.spot and sim.taken_at is not None and sim.taken_at > sim.up_at
    sim.taken_at = sim.up_at + 250.0  # pinned: the trial below finishes two of its epochs by then
    world.clock.advance_to(sim.up_at)
    assert backend.check_lost([instance.id]) == {} and node_resource(instance.id) in SimCluster(world).node_resources()
    recorded: list = []
    sink = types.SimpleNamespace(record=recorded.append)
    spec = types.SimpleNamespace(trial_id="b0-t000", start_epoch=3, end_epoch=9, checkpoint_every=1, config={})
    span = Span(started_at=world.clock.time(), overhead_s=20.0, epoch_s=(100.0,) * 6, lost_at=sim.taken_at)
    trial = SimTrial(world, spec, sink, span)
    assert SimCluster(world).wait([trial], 1000.0) == [trial] and world.clock.time() == sim.taken_at
    with pytest.raises(SimWorkerDied) as died:
        trial.result()
    assert not isinstance(died.value, TrainingError)
    assert [(e.type, e.epoch) for e in recorded] == [("epoch", 3), ("checkpoint", 3), ("epoch", 4), ("checkpoint", 4)]
    assert world.interrupted == {"b0-t000"}  # its next task restores the checkpoint
    assert backend.check_lost([instance.id]) == {instance.id: "spot-interruption"}
    assert node_resource(instance.id) not in SimCluster(world).node_resources() and backend.list() == []
    backend.terminate([instance.id])
    assert sim.ended_at == sim.taken_at  # billed up to the loss, as the executor journals it


def test_a_spot_request_without_capacity_takes_on_demand_only_where_allowed():
    world, backend, itype, _ = _spot_world(rate_per_h=1.0, p_unavailable=1.0)
    (instance,) = backend.provision(InstanceRequest("run", 0, itype, spot=True, on_demand_fallback=True))
    got = backend.obtained(instance.id)
    assert got is not None and not got.spot and got.instance_type.key == itype.key
    assert [(a.market, a.outcome) for a in got.attempts] == [("spot", "capacity"), ("on_demand", "ok")]
    assert world.instances[instance.id].taken_at is None  # on-demand: never taken back
    with pytest.raises(CloudError) as exc:
        backend.provision(InstanceRequest("run", 0, itype, spot=True))
    assert exc.value.kind == "capacity"
    (on_demand,) = backend.provision(InstanceRequest("run", 0, itype))  # on-demand asks nothing of the spot model
    assert backend.obtained(on_demand.id) is None and world.instances[on_demand.id].taken_at is None
