"""The real controller on a simulated cluster on virtual time (``rubberband run --cloud sim``; no Ray, no cloud).

What is simulated is the cluster (executor/simulated.py); what runs is the executor's own loop, policies, journal
and result. ``bench/bench_sim_executor.py`` checks it against the planner's prediction over many seeds; these
tests pin what one run must do.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml

from conftest import EXAMPLES
from test_bad_input import invoke

from rubberband.executor import journal as J
from rubberband.executor.brackets import controller_for
from rubberband.executor.simulated import SimWorld, simulated_for
from rubberband.inputs import load_job_inputs
from rubberband.planner.policies import PrefetchPolicy
from rubberband.planning import plan_from_inputs

START = 1_800_000_000.0  # the virtual clock's start: nowhere near today's wall clock


def _job(tmp_path: Path, **changes) -> Path:
    data = yaml.safe_load((EXAMPLES / "quickstart.yaml").read_text())
    data["profile"] = str((EXAMPLES / data["profile"]).resolve())
    data.update(changes)
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def _simulate(spec_path: Path, run_dir: Path, *, seed: int = 0):
    inputs = load_job_inputs(spec_path)
    plan = plan_from_inputs(inputs, samples=300)
    sim = simulated_for(inputs.spec, plan, inputs.catalog, inputs.profile, seed=seed, start=START)
    controller = controller_for(plan)(spec=inputs.spec, plan=plan, catalog=inputs.catalog, run_dir=run_dir,
                                      backend=sim.backend, runtime=sim.runtime, run_id=f"sim-{seed}",
                                      profile=inputs.profile, clock=sim.clock, cluster=sim.cluster)
    return plan, sim, controller.run()


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
    assert result.result["actual"]["head_usd"] == pytest.approx(
        plan.predicted.cost_breakdown.head_usd, rel=0.1)


def test_a_local_plans_nodes_come_up_one_after_another(tmp_path):
    """The local backend starts its Ray nodes one at a time: so does the simulated one (the controller's single
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
    runs = [_simulate(spec_path, tmp_path / f"run{i}", seed=seed)[2].result["actual"]["jct_s"]
            for i, seed in enumerate((3, 3, 4))]
    assert runs[0] == runs[1] != runs[2]


def test_an_idle_instance_is_kept_only_when_later_ones_cannot_fill_the_next_stage():
    policy = PrefetchPolicy()
    assert not policy.keep_for_next(True, 0, 3, later=3)  # three still busy: they free last, they carry over
    assert policy.keep_for_next(True, 1, 3, later=1)
    assert not policy.keep_for_next(False, 0, 3, later=0)


def test_a_wait_skips_to_the_next_event_but_no_further_than_a_step():
    from rubberband.executor.clock import VirtualClock
    from rubberband.executor.simulated import SimCluster
    from rubberband.planner.model import fit_performance_model
    from rubberband.profile import load_profile

    model = fit_performance_model(load_profile(EXAMPLES / "profiles" / "quickstart_local.json"))
    world = SimWorld(model=model, clock=VirtualClock(START), seed=0, max_step_s=5.0)
    cluster = SimCluster(world)
    assert cluster.wait([], 0.2) == [] and world.clock.time() == START + 5.0  # nothing due: one step
    with pytest.raises(ValueError):
        SimWorld(model=model, clock=world.clock, seed=0, max_step_s=0.0)


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
