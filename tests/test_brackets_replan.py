"""Re-planning at the stage boundaries of a run whose Hyperband brackets run side by side (the executor's lanes).

At each bracket's stage boundary (and when a bracket starts at its offset) the run is re-planned as a sequential
run is: the remainder is every bracket's stages not started yet, each bracket's from when it can go on (the
bracket at its boundary now, a running bracket once its current stage ends, a bracket not started yet at its
offset); the same :class:`~rubberband.planner.policies.LatenessPolicy` decides and the same ``decision`` kind
``replan`` is journaled. A taken plan is followed by the lanes (requests, prefetched instances); with
``--on-late stop`` a hopeless run stops before the stage and ``result.json`` holds the best so far.

The tests run the real executor on virtual time (tests/sim_helpers.py) with a stand-in re-planner and look at
what it asked, the journal and the result; the real re-planner plans a parallel remainder in
``test_planner_replanner_plans_the_parallel_remainder_at_its_offsets``.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from executor_helpers import make_plan, write_hyperband_job
from sim_helpers import SimCase, cpu_model

from rubberband.catalog import load_catalog
from rubberband.executor import journal as J
from rubberband.executor.decisions import startup_samples
from rubberband.executor.run import Settings
from rubberband.executor.runtime import ReplanAnswer, ReplanRequest
from rubberband.plan import write_plan
from rubberband.planner.policies import PrefetchPolicy

# bracket 0: 3 trials × 1 epoch on two 1-worker nodes (stage 0), then its best for 2 more epochs on a 2-worker
# node (stage 1); bracket 1: 2 trials × 3 epochs on one 1-worker node (stage 2), starting 100 s after the job.
STAGES = [("local.cpu1", 2, 1), ("local.cpu2", 1, 2), ("local.cpu1", 1, 1)]
TASKS = (5.0, 20.0, 30.0)  # planned task times: bracket 0's next stage is prefetched while its last trial runs
#: An epoch on one worker takes 5 s (stage 0's tasks as planned); every instance (and the run's head) is up 2 s
#: after its request, one after another (the local backend): stage 1's prefetched node is up at the boundary.
MODEL = cpu_model(epoch_s=5.0, startup_s=2.0)
CPU1, CPU2 = "local:local:local.cpu1", "local:local:local.cpu2"


def _plan(spec, offsets=(0.0, 100.0)):
    plan = make_plan(spec, STAGES, durations=[10.0, 40.0, 60.0])
    stages = [s.model_copy(update={"predicted_task_s": t}) for s, t in zip(plan.stages, TASKS)]
    return plan.model_copy(update={"stages": stages, "brackets": "parallel", "bracket_offsets_s": list(offsets)})


class StubReplanner:
    """Answers every request with the requested stages, ``changes`` (plan position → (type, instances, workers))
    applied, at ``p_meet`` and ``cost``; the current plan's outlook at ``current_p_meet``. ``first_only``: only
    the first request is answered so; later ones find the run on time (P(meet) 0.99) and change nothing. Keeps
    the requests."""

    def __init__(
        self,
        *,
        current_p_meet: float,
        p_meet: float = 0.99,
        cost: float | None = None,
        changes: dict[int, tuple[str, int, int]] | None = None,
        first_only: bool = False,
    ) -> None:
        self.current_p_meet, self.p_meet, self.cost = current_p_meet, p_meet, cost
        self.changes = changes or {}
        self.first_only = first_only
        self.requests: list[ReplanRequest] = []

    def __call__(self, request: ReplanRequest) -> ReplanAnswer:
        self.requests.append(request)
        later = self.first_only and len(self.requests) > 1
        changes = {} if later else self.changes
        stages = []
        for g in request.positions():
            stage = request.plan.stages[g]
            if g in changes:
                name, n, w = changes[g]
                stage = stage.model_copy(update={"instance_type": name, "instances": n, "workers_per_trial": w})
            stages.append(stage)
        current = sum(request.plan.stages[g].predicted_cost_usd for g in request.positions())
        cost = current if self.cost is None or later else self.cost
        predicted = request.plan.predicted.model_copy(
            update={
                "p_meet_deadline": self.p_meet,
                "cost_usd": request.plan.predicted.cost_usd.model_copy(update={"mean": cost}),
                "jct_s": request.plan.predicted.jct_s.model_copy(update={"p50": 50.0}),
            }
        )
        proposal = request.plan.model_copy(update={"stages": stages, "predicted": predicted})
        return ReplanAnswer(
            proposal,
            current_p_meet=0.99 if later else self.current_p_meet,
            current_jct_p50_s=80.0,
            current_cost_usd=current,
        )


def _case(tmp_path, replanner, *, offsets=(0.0, 100.0), deadline_s: float = 400.0, **settings) -> SimCase:
    _, spec = write_hyperband_job(tmp_path)
    return SimCase(
        spec,
        _plan(spec, offsets),
        model=MODEL,
        settings=Settings(deadline_s=deadline_s, **settings),
        replanner=replanner,
    )


def _requested(out) -> dict[str, dict]:
    """Each instance's request (id → ``instance_requested``)."""
    return {e["id"]: e for e in out.of(J.INSTANCE_REQUESTED)}


def test_a_parallel_run_on_time_goes_on_without_change(tmp_path):
    replanner = StubReplanner(current_p_meet=0.99)
    out = _case(tmp_path, replanner).run(tmp_path / "run")
    assert out.result.status == "finished", out.error
    first, last = out.of("replan")
    # bracket 0's boundary: the remainder is bracket 0 from its next stage now, bracket 1 (not started) from its
    # offset, 100 s after the job
    request = replanner.requests[0]
    assert request.next_stage == 1 and request.stages == (1, 2)
    assert request.offsets_s == (0.0, pytest.approx(100.0 - first["elapsed_s"], abs=1e-3))
    assert request.running == {CPU2: 1}  # stage 1's prefetched node, up already
    assert request.bracket_running == ({CPU2: 1}, {})  # bracket 1 has none yet
    assert first["action"] == "continue" and not first["accepted"] and not first["at_risk"]
    assert first["stage"] == 1 and first["bracket"] == 0 and first["stages"] == [1, 2]
    assert set(first) >= {
        "elapsed_s",
        "predicted_remaining_s",
        "slowdown",
        "reason",
        "on_late",
        "current_p_meet",
        "current_jct_p50_s",
        "current_cost_usd",
        "proposal_p_meet",
        "proposal_cost_usd",
        "proposal_jct_p50_s",
        "offsets_s",
    }
    assert not out.of(J.PLAN_CHANGED)
    # the prefetched node serves the stage: nothing more is requested for it, and its trial runs there
    requested = _requested(out)
    assert [(e["instance_type"], e["stage"]) for e in requested.values()] == [
        ("local.cpu1", 0),
        ("local.cpu1", 0),
        ("local.cpu2", 1),
        ("local.cpu1", 2),
    ]
    (prefetch,) = out.of("prefetch")
    assert prefetch["stage"] == 1 and prefetch["t"] < first["t"]
    (started,) = [e for e in out.of(J.TRIAL_STARTED) if e["stage"] == 1]
    assert started["workers"] == 2 and requested[started["instances"][0]]["stage"] == 1
    # bracket 1 starts at its offset: a boundary too (bracket 0 has ended by then: nothing of it is left)
    assert replanner.requests[-1].stages == (2,) and replanner.requests[-1].offsets_s == (0.0,)
    assert last["stage"] == 2 and last["bracket"] == 1 and last["elapsed_s"] == pytest.approx(100.0, abs=1e-3)
    assert len(replanner.requests) == 2
    (stage2,) = [e for e in out.of(J.STAGE_STARTED) if e["stage"] == 2]
    assert stage2["offset_s"] == 100.0 and stage2["t"] >= last["t"]  # decided before the bracket started


def test_a_parallel_run_behind_plan_buys_speed_for_later_bracket_stages(tmp_path):
    # the re-planner's model says the current plan misses the deadline; its proposal meets it with a faster
    # stage 1 (one 4-worker node) and bracket 1 (not started) on a 2-worker node with a trial per worker
    replanner = StubReplanner(
        current_p_meet=0.3, cost=1.0, changes={1: ("local.cpu4", 1, 2), 2: ("local.cpu2", 1, 1)}, first_only=True
    )
    out = _case(tmp_path, replanner).run(tmp_path / "run")
    assert out.result.status == "finished", out.error
    decision, at_offset = out.of("replan")
    assert decision["action"] == "buy_speed" and decision["accepted"] and decision["stages"] == [1, 2]
    assert decision["current_p_meet"] == 0.3 and decision["proposal_p_meet"] == 0.99
    (changed,) = out.of(J.PLAN_CHANGED)
    assert changed["stage"] == 1 and changed["changed"] == [1, 2]
    assert [(s["instance_type"], s["instances"], s["workers_per_trial"]) for s in changed["plan"]["stages"]] == [
        ("local.cpu1", 2, 1),
        ("local.cpu4", 1, 2),
        ("local.cpu2", 1, 1),
    ]
    assert out.state.plan["stages"][2]["instance_type"] == "local.cpu2"  # resume follows
    # the lanes follow: stage 1's prefetched cpu2 node is released, a cpu4 requested; its trial runs there
    requested = _requested(out)
    (prefetched,) = [i for i, e in requested.items() if e["instance_type"] == "local.cpu2" and e["stage"] == 1]
    (release,) = [e for e in out.of("release") if e["id"] == prefetched]
    assert release["reason"] == "re-planned: stage 1 runs 1 × local.cpu4" and release["t"] == decision["t"]
    assert prefetched in {e["id"] for e in out.of(J.INSTANCE_TERMINATED)}
    (started,) = [e for e in out.of(J.TRIAL_STARTED) if e["stage"] == 1]
    (node,) = started["instances"]
    assert (requested[node]["instance_type"], requested[node]["stage"]) == ("local.cpu4", 1)
    assert started["workers"] == 2
    # bracket 1 starts at its offset on the new stage config: one cpu2 node, both trials side by side on it
    assert at_offset["stage"] == 2 and at_offset["action"] == "continue"
    started = [e for e in out.of(J.TRIAL_STARTED) if e["stage"] == 2]
    assert len(started) == 2 and all(e["workers"] == 1 for e in started)
    (node,) = {tuple(e["instances"]) for e in started}
    assert (requested[node[0]]["instance_type"], requested[node[0]]["stage"]) == ("local.cpu2", 2)
    assert len({e["t"] for e in started}) == 1  # side by side, not one after the other


def test_a_running_brackets_rest_starts_when_its_current_stage_is_estimated_to_end(tmp_path):
    # bracket 1 starts at its offset (3 s) while bracket 0's first stage still waits for its two nodes (the run's
    # head was up at 2 s, the first node is at 4 s): bracket 0's next stage can start after the start-up lead
    # (a quantile of the local cloud's start-ups: none measured yet) and two waves of its 3 trials on 2 slots
    # (5 s each, as planned)
    replanner = StubReplanner(current_p_meet=0.99)
    out = _case(tmp_path, replanner, offsets=(0.0, 3.0)).run(tmp_path / "run")
    assert out.result.status == "finished", out.error
    request = replanner.requests[0]
    assert request.next_stage == 2 and request.stages == (2, 1)  # the bracket at its boundary first
    lead = PrefetchPolicy().lead_s(startup_samples(load_catalog(["local"]).find("local.cpu1"), {}, None))
    assert request.offsets_s == (0.0, pytest.approx(lead + 2 * 5.0, abs=0.01))
    # bracket 0's next stage may keep its running (here: coming) nodes of the same type
    assert request.bracket_running == ({}, {CPU1: 2})
    decision = out.of("replan")[0]
    assert decision["stage"] == 2 and decision["bracket"] == 1 and decision["action"] == "continue"
    assert decision["elapsed_s"] == pytest.approx(3.0, abs=1e-3)
    assert not [e for e in out.of(J.INSTANCE_READY) if e["t"] <= decision["t"]]  # nothing was up yet
    assert decision["offsets_s"] == [0.0, pytest.approx(lead + 10.0, abs=0.01)]


def test_on_late_stop_never_starts_a_bracket_stage_it_cannot_finish(tmp_path):
    # nothing meets the deadline any more (the quickest plan's P(meet) is 0.2): with --on-late stop the run
    # stops at the boundary, before stage 1 starts, and result.json holds the best of stage 0
    replanner = StubReplanner(current_p_meet=0.0, p_meet=0.2)
    out = _case(tmp_path, replanner, on_late="stop").run(tmp_path / "run")
    assert out.result.status == "stopped", out.error
    assert re.search(
        r"--on-late stop: stopping before the next stage .* \(before stage 1\)", out.result.result["error"]
    )
    (decision,) = out.of("replan")
    assert decision["action"] == "stop" and not decision["accepted"] and decision["on_late"] == "stop"
    assert [e["stage"] for e in out.of(J.STAGE_STARTED)] == [0]  # nor bracket 1, due 100 s after the job
    result = json.loads((out.run_dir / "result.json").read_text())
    assert result["outcome"] == "stopped" and result["exit_code"] == 5
    (stage0,) = out.of(J.STAGE_FINISHED)
    best = result["best"]
    assert best["trial_id"] == stage0["ranking"][0] and best["metric"] == pytest.approx(
        stage0["metrics"][best["trial_id"]]
    )
    assert best["rung"]["stage"] == 0 and best["rung"]["complete"]
    requested = set(_requested(out))
    assert requested and requested <= {e["id"] for e in out.of(J.INSTANCE_TERMINATED)}  # the prefetched one too
    assert out.events[-1]["type"] == J.RUN_STOPPED


def test_planner_replanner_plans_the_parallel_remainder_at_its_offsets(tmp_path):
    """The real re-planner on a two-bracket remainder: bracket 1 at its start (stage 2, now) and bracket 0's last
    stage (1) once its running stage ends, 10 s or 100 s from now. The current plan and the proposal are both
    simulated with the brackets side by side at those offsets; the proposal comes in the request's order."""
    from rubberband.executor.runtime import planner_replanner
    from rubberband.inputs import load_job_inputs

    spec_path, plan_path = _optimistic_hyperband(tmp_path / "job")
    inputs = load_job_inputs(spec_path)
    plan = json.loads(plan_path.read_text())
    from rubberband.plan import parse_plan

    plan = parse_plan(plan)
    replan = planner_replanner(inputs.catalog, inputs.profile)
    answers = {}
    for wait in (10.0, 100.0):
        request = ReplanRequest(
            spec=inputs.spec,
            plan=plan,
            next_stage=2,
            elapsed_s=20.0,
            spent_usd=0.001,
            remaining_deadline_s=150.0,
            running={},
            stages=(2, 1),
            offsets_s=(0.0, wait),
        )
        answers[wait] = answer = replan(request)
        assert [(s.bracket, s.stage) for s in answer.proposal.stages] == [(1, 0), (0, 1)]
        assert answer.current_jct_p50_s > wait and answer.proposal.predicted.jct_s.p50 > wait
    assert answers[100.0].current_jct_p50_s > answers[10.0].current_jct_p50_s + 50.0
    assert answers[10.0].current_p_meet >= answers[100.0].current_p_meet


# -- end to end --------------------------------------------------------------------------------


def _optimistic_hyperband(base: Path, offsets=(0.0, 0.0)):
    """The quickstart's synthetic workload and profile as Hyperband R=3, η=3 (bracket 0: 3 trials × 1 epoch, then
    its best for 2 more; bracket 1: 2 trials × 3 epochs), each bracket on one local.cpu1, bracket 1 starting
    ``offsets[1]`` after the job; its predictions (re-simulated with the profile) divided by 4: a plan far too
    optimistic. Returns (spec path, plan path)."""
    import shutil

    import yaml

    from conftest import REPO
    from rubberband.inputs import load_job_inputs
    from rubberband.planner import simulate_plan

    examples = REPO / "examples"
    base.mkdir(parents=True, exist_ok=True)
    shutil.copy(examples / "synthetic.py", base / "synthetic.py")
    (base / "profiles").mkdir(exist_ok=True)
    shutil.copy(examples / "profiles" / "quickstart_local.json", base / "profiles" / "quickstart_local.json")
    data = yaml.safe_load((examples / "quickstart_local.yaml").read_text())
    data["scheduler"] = {"kind": "hyperband", "eta": 3, "min_epochs": 1, "max_epochs": 3, "brackets": "parallel"}
    data["deadline"] = "40s"
    spec_path = base / "job.yaml"
    spec_path.write_text(json.dumps(data))
    inputs = load_job_inputs(spec_path)
    plan = make_plan(inputs.spec, [("local.cpu1", 1, 1)] * 3, prices={"local.cpu1": 0.05})
    plan = plan.model_copy(update={"brackets": "parallel", "bracket_offsets_s": list(offsets)})
    plan = simulate_plan(plan, inputs.profile, inputs.catalog, samples=200)
    optimistic = [
        s.model_copy(
            update={"predicted_duration_s": s.predicted_duration_s / 4, "predicted_task_s": s.predicted_task_s / 4}
        )
        for s in plan.stages
    ]
    plan = plan.model_copy(update={"stages": optimistic})
    write_plan(plan, base / "plan.json")
    return spec_path, base / "plan.json"
