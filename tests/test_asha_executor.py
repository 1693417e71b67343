"""ASHA executed: the executor's AshaScheduler on the one loop, on virtual time (public seams only).

An ASHA plan (``scheduler: {kind: asha}``) runs asynchronously: a free slot takes work at once (a promoted trial's
next rung first, else a new trial whose configuration is asked for only then), a trial is promoted the moment its
rung result is not below the rung's cut so far (Ray Tune's rule, :class:`~rubberband.planner.asha.AshaRungs`),
and the cluster shrinks by the plan's phases (:class:`~rubberband.planner.policies.AshaPhasePolicy`).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from conftest import EXAMPLES
from executor_helpers import write_job
from sim_helpers import SimCase, cpu_model
from test_bad_input import invoke

from rubberband.executor import journal as J
from rubberband.executor.simulated import SimScript
from rubberband.inputs import load_job_inputs
from rubberband.planner.asha import AshaRungs
from rubberband.planning import PlanningOptions, plan_from_inputs
from rubberband.spec import load_spec


def _asha_plan(tmp_path: Path, phases: tuple[int, ...], *, trials: int = 9, epoch_s: float = 2.0):
    """An ASHA job of ``trials`` trials (η 3, 1 to 9 epochs: rungs 1, 3, 9) on local.cpu1, ``phases`` instances."""
    from executor_helpers import make_plan

    spec_path = write_job(tmp_path / "job", trials=trials, eta=3, min_epochs=1, max_epochs=9, epoch_s=epoch_s)
    data = json.loads(spec_path.read_text())
    data["scheduler"]["kind"] = "asha"
    spec_path.write_text(json.dumps(data))
    spec = load_spec(spec_path)
    plan = make_plan(spec, [("local.cpu1", n, 1) for n in phases], durations=[20.0] * len(phases))
    return spec, plan


def _case(tmp_path: Path, phases: tuple[int, ...], **options) -> SimCase:
    spec, plan = _asha_plan(tmp_path, phases, **{k: v for k, v in options.items() if k in ("trials", "epoch_s")})
    rest = {k: v for k, v in options.items() if k not in ("trials", "epoch_s")}
    return SimCase(spec, plan, model=cpu_model(epoch_s=options.get("epoch_s", 2.0), startup_s=2.0), **rest)


def test_an_asha_plan_runs_to_its_end_through_the_same_loop(tmp_path):
    out = _case(tmp_path, (3, 2, 1)).run(tmp_path / "run")
    assert out.error is None and out.result is not None and out.result.status == "finished", out.error
    created = out.of(J.TRIAL_CREATED)
    assert len(created) == 9
    # configurations are asked for as slots free, not all at once: later trials are created after results came in
    first_result = min(e["t"] for e in out.of(J.TRIAL_STOPPED))
    assert any(e["t"] >= first_result for e in created)
    # rung 0 runs every trial; the rest continue only when promoted, and the best reaches the last rung
    starts = out.of(J.TRIAL_STARTED)
    assert {e["trial_id"] for e in starts if e["stage"] == 0} == {e["trial_id"] for e in created}
    promoted = out.of(J.TRIAL_PROMOTED)
    assert promoted and all(
        any(s["trial_id"] == p["trial_id"] and s["stage"] == p["to_stage"] and s["t"] >= p["t"] for s in starts)
        for p in promoted
    )
    best = out.result.best_trial
    assert any(e["trial_id"] == best and e["stage"] == 2 and e["reason"] == "finished" for e in out.of(J.TRIAL_STOPPED))
    assert [e["stage"] for e in out.of(J.STAGE_FINISHED)] == [0, 1, 2]


def test_a_trial_is_promoted_as_soon_as_its_result_makes_the_cut_not_at_a_barrier(tmp_path):
    out = _case(tmp_path, (3, 3, 3)).run(tmp_path / "run")
    rung0 = [e for e in out.of(J.TRIAL_STOPPED) if e["stage"] == 0 and e["reason"] == "finished"]
    first_promotion = min(e["t"] for e in out.of(J.TRIAL_PROMOTED))
    assert first_promotion < max(e["t"] for e in rung0)  # ASHA: before the rung's last result is in


def test_promotions_follow_ray_tunes_rule_on_the_results_as_they_came(tmp_path):
    out = _case(tmp_path, (2, 2, 2)).run(tmp_path / "run")
    rungs = AshaRungs(3, 3)
    promoted = {(e["trial_id"], e["from_stage"]) for e in out.of(J.TRIAL_PROMOTED)}
    pruned = {(e["trial_id"], e["stage"]) for e in out.of(J.TRIAL_STOPPED) if e["reason"] == "pruned"}
    for e in out.of(J.TRIAL_STOPPED):
        if e["reason"] != "finished" or e["stage"] == 2:
            continue
        goes_on = rungs.on_result(e["stage"], -e["metric"])  # loss: lower is better
        assert ((e["trial_id"], e["stage"]) in promoted) == goes_on, e
        assert ((e["trial_id"], e["stage"]) in pruned) == (not goes_on), e


def test_the_cluster_shrinks_by_phase_and_a_fixed_one_holds_to_the_end(tmp_path):
    elastic = _case(tmp_path / "e", (6, 2, 1)).run(tmp_path / "elastic")
    fixed = _case(tmp_path / "f", (6, 6, 6)).run(tmp_path / "fixed")
    phases = elastic.of("asha_phase")
    assert phases and phases[-1]["instances"] == 1
    first = min(e["t"] for e in phases)
    released = [e for e in elastic.of("release") if e["reason"].startswith("ASHA phase")]
    assert len(released) == 5 and all(e["t"] >= first for e in released)  # down to one instance
    assert max(e["t"] for e in elastic.of(J.TRIAL_STARTED) if e["stage"] == 0) <= first  # every trial had started
    assert not [e for e in fixed.of("release") if e["reason"].startswith("ASHA phase")]
    assert elastic.result.result["actual"]["cost_usd"] < fixed.result.result["actual"]["cost_usd"]
    assert elastic.result.best_trial == fixed.result.best_trial


def test_a_lost_instance_sends_its_trial_back_first_and_is_replaced_while_the_phase_needs_it(tmp_path):
    out = _case(tmp_path, (3, 1, 1), script=SimScript(losses={1: 3.0})).run(tmp_path / "run")
    assert out.result is not None and out.result.status == "finished", out.error
    (lost,) = out.of(J.INSTANCE_LOST)
    stopped = [e for e in out.of(J.TRIAL_STOPPED) if e["reason"] == "instance_lost"]
    assert stopped and all(
        any(s["trial_id"] == e["trial_id"] and s["t"] >= e["t"] for s in out.of(J.TRIAL_STARTED)) for e in stopped
    )
    assert [e["id"] for e in out.of("replace")] == [lost["id"]]


@pytest.mark.e2e  # the whole CLI, planning included (in this process)
def test_rubberband_runs_an_asha_spec_on_simulated_time(tmp_path):
    data = yaml.safe_load((EXAMPLES / "quickstart.yaml").read_text())
    data["profile"] = str((EXAMPLES / data["profile"]).resolve())
    data["scheduler"] = {"kind": "asha", "trials": 27, "eta": 3, "min_epochs": 1, "max_epochs": 9}
    data["deadline"] = "30m"
    spec = tmp_path / "asha.yaml"
    spec.write_text(yaml.safe_dump(data))
    result = invoke("run", spec, "--cloud", "sim", "--yes", "--run-dir", tmp_path / "run")
    assert result.code == 0, result.err[-3000:]
    outcome = json.loads((tmp_path / "run" / "result.json").read_text())
    assert outcome["status"] == "finished" and outcome["outcome"] == "met"
    phases = [e for e in J.iter_events(tmp_path / "run" / J.JOURNAL_NAME) if e.get("kind") == "asha_phase"]
    assert phases


def test_the_asha_example_plans_elastic_phases():
    inputs = load_job_inputs(EXAMPLES / "asha_local.yaml")
    plan = plan_from_inputs(inputs, options=PlanningOptions(samples=100))
    assert plan.is_asha and plan.phase_instances[0] > plan.phase_instances[-1]
