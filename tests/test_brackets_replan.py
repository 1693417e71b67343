"""Re-planning at the stage boundaries of a run whose Hyperband brackets run side by side (``ParallelController``).

At each bracket's stage boundary (and when a bracket starts at its offset) the run is re-planned as a sequential
run is: the remainder is every bracket's stages not started yet, each bracket's from when it can go on (the
bracket at its boundary now, a running bracket once its current stage ends, a bracket not started yet at its
offset); the same :class:`~rubberband.planner.policies.LatenessPolicy` decides and the same ``decision`` kind
``replan`` is journaled. A taken plan is followed by the lanes (requests, prefetched instances); with
``--on-late stop`` a hopeless run stops before the stage and ``result.json`` holds the best so far.

The unit tests drive the controller's pieces by hand (a stand-in backend whose instances are up at once, a
stand-in trial runtime, a stand-in re-planner); ``test_parallel_run_replans_at_every_bracket_boundary_e2e`` runs
the real CLI with the real re-planner on local Ray nodes.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from executor_helpers import (
    FakeRuntime,
    cli_env,
    finished_outcome,
    journaled_controller,
    make_plan,
    run_pids,
    write_hyperband_job,
)

from rubberband.executor import journal as J
from rubberband.executor.brackets import ParallelController
from rubberband.executor.controller import RunStopped
from rubberband.executor.runtime import ReplanAnswer, ReplanRequest
from rubberband.plan import write_plan

# bracket 0: 3 trials × 1 epoch on two 1-worker nodes (stage 0), then its best for 2 more epochs on a 2-worker
# node (stage 1); bracket 1: 2 trials × 3 epochs on one 1-worker node (stage 2), starting 100 s after the job.
STAGES = [("local.cpu1", 2, 1), ("local.cpu2", 1, 2), ("local.cpu1", 1, 1)]
TASKS = (5.0, 20.0, 30.0)  # planned task times: bracket 0's next stage is prefetched while its last trial runs
STARTUP = [10.0, 12.0]  # measured start-ups: the prefetch lead (p90) is 11.8 s


def _plan(spec, offsets=(0.0, 100.0)):
    plan = make_plan(spec, STAGES, durations=[10.0, 40.0, 60.0])
    stages = [s.model_copy(update={"predicted_task_s": t}) for s, t in zip(plan.stages, TASKS)]
    return plan.model_copy(update={"stages": stages, "brackets": "parallel", "bracket_offsets_s": list(offsets)})


class StubReplanner:
    """Answers every request with the requested stages, ``changes`` (plan position → (type, instances, workers))
    applied, at ``p_meet`` and ``cost``; the current plan's outlook at ``current_p_meet``. Keeps the requests."""

    def __init__(
        self,
        *,
        current_p_meet: float,
        p_meet: float = 0.99,
        cost: float | None = None,
        changes: dict[int, tuple[str, int, int]] | None = None,
    ) -> None:
        self.current_p_meet, self.p_meet, self.cost = current_p_meet, p_meet, cost
        self.changes = changes or {}
        self.requests: list[ReplanRequest] = []

    def __call__(self, request: ReplanRequest) -> ReplanAnswer:
        self.requests.append(request)
        stages = []
        for g in request.positions():
            stage = request.plan.stages[g]
            if g in self.changes:
                name, n, w = self.changes[g]
                stage = stage.model_copy(update={"instance_type": name, "instances": n, "workers_per_trial": w})
            stages.append(stage)
        current = sum(request.plan.stages[g].predicted_cost_usd for g in request.positions())
        cost = current if self.cost is None else self.cost
        predicted = request.plan.predicted.model_copy(
            update={
                "p_meet_deadline": self.p_meet,
                "cost_usd": request.plan.predicted.cost_usd.model_copy(update={"mean": cost}),
                "jct_s": request.plan.predicted.jct_s.model_copy(update={"p50": 50.0}),
            }
        )
        proposal = request.plan.model_copy(update={"stages": stages, "predicted": predicted})
        return ReplanAnswer(
            proposal, current_p_meet=self.current_p_meet, current_jct_p50_s=80.0, current_cost_usd=current
        )


class Backend:
    """The stand-in backend of executor_helpers (instances up at once), listing nothing for teardown."""

    def __init__(self, inner) -> None:
        self.inner = inner

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def list(self, run_id):
        return []


def _controller(tmp_path, replanner, *, deadline_s: float = 400.0, **options):
    _, spec = write_hyperband_job(tmp_path)
    controller, backend = journaled_controller(
        tmp_path,
        spec,
        _plan(spec),
        deadline_s=deadline_s,
        controller_class=ParallelController,
        runtime=FakeRuntime(),
        replanner=replanner,
        **options,
    )
    controller.backend = Backend(backend)
    controller.search = controller._restore_search()
    controller.startup_seconds = {"local.cpu1": list(STARTUP), "local.cpu2": list(STARTUP), "local.cpu4": list(STARTUP)}
    controller._open_lanes()
    return controller, backend


def _served(controller) -> None:
    """Wait until the provisioner thread has handed every request so far to the stand-in backend."""
    for entry in list(controller.pool.values()):
        if entry.future is not None:
            entry.future.result(timeout=10)


def _up(controller) -> None:
    """Every request the stand-in backend serves is up: collect them as the loop does."""
    _served(controller)
    startups = {k: list(v) for k, v in controller.startup_seconds.items()}
    controller._collect_provisioned()
    controller.startup_seconds = startups  # the stand-in's instant start-ups would shorten the lead


def _finish(controller, lane, metric=lambda trial_id: int(trial_id.rsplit("t", 1)[1]) / 10) -> None:
    """Every running trial of ``lane`` finishes (loss: its index / 10); waiting ones start and finish in turn;
    the lane is tended after each wave, as the loop does."""
    while True:
        controller._fill_slots(lane)
        mine = [
            (ref, run)
            for ref, run in controller.running.items()
            if controller.state.trials[run.trial_id].bracket == lane.bracket
        ]
        if not mine:
            return
        ref, run = mine[0]
        del controller.running[ref]
        run.handle.outcome = finished_outcome(run.trial_id, run.start_epoch, run.end_epoch, metric(run.trial_id))
        controller._collect(lane, [run])
        g = lane.g
        controller._tend_lane(lane)
        _up(controller)
        if lane.g != g:
            return


def _events(controller) -> list[dict]:
    return list(J.iter_events(controller.run_dir / J.JOURNAL_NAME))


def _replans(controller) -> list[dict]:
    return [e for e in _events(controller) if e["type"] == J.DECISION and e.get("kind") == "replan"]


def _close(controller) -> None:
    controller._terminator.shutdown(wait=True)
    controller._provisioner.shutdown(wait=True)


def _to_first_boundary(controller):
    """Bracket 0 starts with the job, its stage 0 runs to its end (stage 1's node prefetched meanwhile); the
    boundary before stage 1 is re-planned. Returns bracket 0's lane."""
    controller._start_due(0.0)
    lane = controller.lanes[0]
    assert lane.g == 0 and not controller.lanes[1].started  # bracket 1 waits for its offset
    _up(controller)
    _finish(controller, lane)
    return lane


def test_a_parallel_run_on_time_goes_on_without_change(tmp_path):
    replanner = StubReplanner(current_p_meet=0.99)
    controller, backend = _controller(tmp_path, replanner)
    lane = _to_first_boundary(controller)
    assert lane.g == 1
    # the remainder: bracket 0 from its next stage now, bracket 1 (not started) from its offset, ~100 s away
    (request,) = replanner.requests
    assert request.next_stage == 1 and request.stages == (1, 2)
    assert request.offsets_s[0] == 0.0 and request.offsets_s[1] == pytest.approx(100.0, abs=2.0)
    assert request.running == {"local:local:local.cpu2": 1}  # stage 1's prefetched node is up
    assert request.bracket_running == ({"local:local:local.cpu2": 1}, {})  # bracket 1 has none yet
    (decision,) = _replans(controller)
    assert decision["action"] == "continue" and not decision["accepted"] and not decision["at_risk"]
    assert decision["stage"] == 1 and decision["bracket"] == 0 and decision["stages"] == [1, 2]
    assert set(decision) >= {
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
    assert not [e for e in _events(controller) if e["type"] == J.PLAN_CHANGED]
    # the prefetched node serves the stage: nothing more requested
    _served(controller)
    assert [r.instance_type.name for r in backend.requests] == ["local.cpu1", "local.cpu1", "local.cpu2"]
    controller._fill_slots(lane)
    started = [e for e in _events(controller) if e["type"] == J.TRIAL_STARTED and e["stage"] == 1]
    assert len(started) == 1 and started[0]["workers"] == 2
    # bracket 1 starts at its offset: a boundary too (bracket 0 runs its last stage: nothing of it is left)
    controller._start_due(150.0)
    assert replanner.requests[-1].stages == (2,) and replanner.requests[-1].offsets_s == (0.0,)
    assert [d["stage"] for d in _replans(controller)] == [1, 2]
    assert controller.lanes[1].g == 2
    _close(controller)


def test_a_parallel_run_behind_plan_buys_speed_for_later_bracket_stages(tmp_path):
    # the re-planner's model says the current plan misses the deadline; its proposal meets it with a faster
    # stage 1 (one 4-worker node) and bracket 1 (not started) on a 2-worker node with a trial per worker
    replanner = StubReplanner(current_p_meet=0.3, cost=1.0, changes={1: ("local.cpu4", 1, 2), 2: ("local.cpu2", 1, 1)})
    controller, backend = _controller(tmp_path, replanner)
    lane = _to_first_boundary(controller)
    (decision,) = _replans(controller)
    assert decision["action"] == "buy_speed" and decision["accepted"] and decision["stages"] == [1, 2]
    assert decision["current_p_meet"] == 0.3 and decision["proposal_p_meet"] == 0.99
    changed = [e for e in _events(controller) if e["type"] == J.PLAN_CHANGED]
    assert len(changed) == 1 and changed[0]["stage"] == 1
    assert [(s["instance_type"], s["instances"], s["workers_per_trial"]) for s in changed[0]["plan"]["stages"]] == [
        ("local.cpu1", 2, 1),
        ("local.cpu4", 1, 2),
        ("local.cpu2", 1, 1),
    ]
    assert J.read_state(controller.run_dir).plan["stages"][2]["instance_type"] == "local.cpu2"  # resume follows
    # the lanes follow: stage 1's prefetched cpu2 node is released, a cpu4 requested; its trial runs there
    prefetched = backend.provisioned[2]
    releases = [
        e
        for e in _events(controller)
        if e["type"] == J.DECISION and e.get("kind") == "release" and e["id"] == prefetched
    ]
    assert releases and releases[0]["reason"] == "re-planned: stage 1 runs 1 × local.cpu4"
    controller._collect_terminations(wait=True)
    assert prefetched in backend.terminated
    _served(controller)
    assert (backend.requests[-1].instance_type.name, backend.requests[-1].stage) == ("local.cpu4", 1)
    assert lane.g == 1
    _up(controller)
    controller._fill_slots(lane)
    (started,) = [e for e in _events(controller) if e["type"] == J.TRIAL_STARTED and e["stage"] == 1]
    assert started["instances"] == [backend.provisioned[-1]] and started["workers"] == 2
    # bracket 1 starts at its offset on the new stage config: one cpu2 node, both trials side by side on it
    replanner.changes = {}
    replanner.current_p_meet = 0.99
    controller._start_due(150.0)
    assert _replans(controller)[-1]["action"] == "continue"
    _up(controller)  # the stand-in backend sees a request once the provisioner thread runs it
    assert (backend.requests[-1].instance_type.name, backend.requests[-1].stage) == ("local.cpu2", 2)
    controller._fill_slots(controller.lanes[1])
    started = [e for e in _events(controller) if e["type"] == J.TRIAL_STARTED and e["stage"] == 2]
    assert len(started) == 2 and {tuple(e["instances"]) for e in started} == {(backend.provisioned[-1],)}
    assert all(e["workers"] == 1 for e in started)
    _close(controller)


def test_a_running_brackets_rest_starts_when_its_current_stage_is_estimated_to_end(tmp_path):
    # bracket 1 starts at its offset while bracket 0's first stage still waits for its two nodes: bracket 0's
    # next stage can start after their start-up lead (11.8 s) and two waves of its 3 trials on 2 slots (5 s each)
    replanner = StubReplanner(current_p_meet=0.99)
    controller, _ = _controller(tmp_path, replanner)
    controller._start_due(0.0)
    assert controller.lanes[0].pending and not controller.lanes[0].slots  # nothing up yet
    controller._start_due(150.0)
    (request,) = replanner.requests
    assert request.next_stage == 2 and request.stages == (2, 1)  # the bracket at its boundary first
    assert request.offsets_s == (0.0, pytest.approx(11.8 + 2 * 5.0, abs=0.01))
    # bracket 0's next stage may keep its running (here: coming) nodes of the same type
    assert request.bracket_running == ({}, {"local:local:local.cpu1": 2})
    (decision,) = _replans(controller)
    assert decision["stage"] == 2 and decision["bracket"] == 1 and decision["action"] == "continue"
    _up(controller)
    _close(controller)


def test_on_late_stop_never_starts_a_bracket_stage_it_cannot_finish(tmp_path):
    # nothing meets the deadline any more (the quickest plan's P(meet) is 0.2): with --on-late stop the run
    # stops at the boundary, before stage 1 starts, and result.json holds the best of stage 0
    replanner = StubReplanner(current_p_meet=0.0, p_meet=0.2)
    controller, backend = _controller(tmp_path, replanner, on_late="stop")
    with pytest.raises(RunStopped, match=r"--on-late stop: stopping before the next stage .* \(before stage 1\)"):
        _to_first_boundary(controller)
    (decision,) = _replans(controller)
    assert decision["action"] == "stop" and not decision["accepted"] and decision["on_late"] == "stop"
    assert not [e for e in _events(controller) if e["type"] == J.STAGE_STARTED and e["stage"] != 0]
    controller._teardown("stopped", decision["reason"])
    result = json.loads((controller.run_dir / "result.json").read_text())
    assert result["outcome"] == "stopped" and result["exit_code"] == 5
    best = result["best"]
    assert best["trial_id"] == "b0-t000" and best["metric"] == pytest.approx(0.0)
    assert best["rung"]["stage"] == 0 and best["rung"]["complete"]
    assert set(backend.provisioned) <= set(backend.terminated)  # every instance terminated, prefetched one too


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


@pytest.mark.e2e
def test_parallel_run_replans_at_every_bracket_boundary_e2e(tmp_path):
    """A real parallel Hyperband run on local Ray nodes with the real re-planner (the spec's profile): the plan
    promised a quarter of the real stage times. Bracket 1 starts 15 s after the job: its start and bracket 0's
    boundary are both re-planned, and whichever comes first sees the other bracket's stages in the remainder
    (bracket 1 not started yet; or bracket 0 in its first stage, or not even started when the Ray head took
    longer than 15 s and both brackets are due in the loop's first pass): the real re-planner simulates both
    brackets side by side. At bracket 0's boundary the run is behind (slowdown > 1.5); it finishes with its best."""
    spec_path, plan_path = _optimistic_hyperband(tmp_path / "job", offsets=(0.0, 15.0))
    run_dir = tmp_path / "run"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "rubberband",
            "run",
            str(spec_path),
            "--plan",
            str(plan_path),
            "--cloud",
            "local",
            "--run-dir",
            str(run_dir),
            "--yes",
            "--on-late",
            "finish",
            "--overrun",
            "none",
        ],
        capture_output=True,
        text=True,
        env=cli_env(tmp_path),
        cwd=tmp_path,
        timeout=300,
    )
    assert result.returncode in (0, 4), result.stderr[-3000:]
    events = list(J.iter_events(run_dir / J.JOURNAL_NAME))
    replans = {e["stage"]: e for e in events if e["type"] == J.DECISION and e.get("kind") == "replan"}
    for e in replans.values():
        print(
            f"replan before stage {e['stage']}: stages {e['stages']} offsets {e['offsets_s']} "
            f"slowdown {e['slowdown']:.2f} P(meet) {e['current_p_meet']} -> {e.get('proposal_p_meet')}: "
            f"{e['action']} ({e['reason']})"
        )
    assert set(replans) == {1, 2}, replans  # bracket 0's next stage, bracket 1's start at its offset
    assert replans[1]["bracket"] == 0 and replans[2]["bracket"] == 1
    assert any(len(e["offsets_s"]) == 2 for e in replans.values()), replans  # both brackets side by side
    assert replans[1]["slowdown"] > 1.5
    for e in replans.values():
        assert e["action"] in ("continue", "save", "buy_speed", "finish_late")
        assert e["current_p_meet"] is not None and "proposal_p_meet" in e  # the real re-planner answered
        started = next(s for s in events if s["type"] == J.STAGE_STARTED and s["stage"] == e["stage"])
        assert started["t"] >= e["t"]  # decided before the stage started
    summary = json.loads((run_dir / "result.json").read_text())
    assert summary["best"] is not None and summary["outcome"] in ("met", "late")
    assert not run_pids(run_dir)
