"""Parallel Hyperband brackets in the executor (``rubberband.executor.brackets``).

Unit tests of the pure :class:`BracketPolicy` and of parallel-run accounting, and two end-to-end runs
through the real CLI on real local Ray nodes (most of their time is Ray nodes starting one after
another on a 2-core machine): a Hyperband job (R=3, η=3: bracket 0 runs 3 trials for 1 epoch then its
best for 2 more, bracket 1 runs 2 trials for 3 epochs) with both brackets starting at once (~65 s,
shared by two tests), and one killed with SIGKILL and resumed (~120 s).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from executor_helpers import cli_env, make_plan, run_pids, wait_for_events, write_hyperband_job

from rubberband.executor import journal as J
from rubberband.executor.brackets import BracketPolicy, ParallelController, Waiting, controller_for
from rubberband.executor.controller import Controller, check_plan_matches, trial_configs
from rubberband.plan import write_plan
from rubberband.spec import load_spec

# bracket 0: 3 trials on two 1-worker nodes, its best on a 2-worker node; bracket 1: 2 trials on one 1-worker node
STAGES = [("local.cpu1", 2, 1), ("local.cpu2", 1, 2), ("local.cpu1", 1, 1)]


def _plan(spec, offsets=(0.0, 0.0)):
    plan = make_plan(spec, STAGES, durations=[12.0, 8.0, 12.0])
    return plan.model_copy(update={"brackets": "parallel", "bracket_offsets_s": list(offsets)})


def _job(directory: Path, epoch_s: float, offsets=(0.0, 0.0)):
    spec_path, spec = write_hyperband_job(directory, epoch_s=epoch_s)
    plan = _plan(spec, offsets)
    write_plan(plan, directory / "plan.json")
    return spec_path, spec, plan


def _events(run_dir: Path) -> list[dict]:
    return list(J.iter_events(run_dir / J.JOURNAL_NAME))


# -- the pure policy ---------------------------------------------------------------------------


def test_policy_reads_brackets_and_offsets_from_the_plan(tmp_path):
    spec = load_spec(_job(tmp_path, 0.1)[0])
    policy = BracketPolicy.for_plan(_plan(spec, offsets=(0.0, 30.0)))
    assert policy.ranges == ((0, 2), (2, 3)) and policy.offsets_s == (0.0, 30.0)
    assert [policy.bracket_of(g) for g in range(3)] == [0, 0, 1]
    assert [policy.next_stage(g) for g in range(3)] == [1, None, None]  # never into another bracket
    assert policy.due(0.0, [False, False]) == [0]
    assert policy.due(29.9, [True, False]) == []
    assert policy.due(30.0, [True, False]) == [1]
    assert policy.due(99.0, [True, True]) == []
    # brackets that start together request their instances longest first (the critical path first)
    assert policy.durations_s == (20.0, 12.0)
    assert policy.start_order([1, 0]) == [1, 0]  # bracket 1 starts 30 s later: it ends last
    assert BracketPolicy.for_plan(_plan(spec)).start_order([1, 0]) == [0, 1]
    assert BracketPolicy(((0, 1), (1, 2), (2, 3)), (0.0, 0.0, 0.0), (10.0, 30.0, 10.0)).start_order([0, 1, 2]) == [
        1,
        0,
        2,
    ]
    assert BracketPolicy(((0, 1), (1, 2)), (0.0, 0.0), (10.0, 30.0)).due(0.0, [False, False]) == [1, 0]
    # a sequential plan: one bracket after another, no offsets
    seq = BracketPolicy.for_plan(make_plan(spec, STAGES))
    assert seq.offsets_s == (0.0, 0.0)


def test_policy_hands_a_released_instance_to_another_brackets_waiting_request():
    w = [
        Waiting("a", bracket=0, stage=1, order=0, queued=True),  # the giver's own bracket: never
        Waiting("b", bracket=1, stage=2, order=1, queued=False),  # booting: kept only if nothing queued
        Waiting("c", bracket=2, stage=3, order=3, queued=True),
        Waiting("d", bracket=1, stage=2, order=2, queued=True),
    ]
    assert BracketPolicy.receiver(0, w).token == "d"  # queued first (cancelling it saves its bill), earliest
    assert BracketPolicy.receiver(0, [w[0], w[1]]).token == "b"
    assert BracketPolicy.receiver(0, [w[0]]) is None
    assert BracketPolicy.receiver(1, w).token == "a"
    assert BracketPolicy.receiver(1, []) is None


def test_parallel_plans_are_accepted_and_run_by_the_parallel_controller(tmp_path):
    spec = load_spec(_job(tmp_path, 0.1)[0])
    plan = _plan(spec)
    check_plan_matches(spec, plan)  # no longer refused
    assert controller_for(plan) is ParallelController
    assert controller_for(plan.model_copy(update={"brackets": "sequential"})) is Controller


# -- end to end ------------------------------------------------------------------------------


def _winners(spec, plan) -> dict[int, str]:
    """Bracket 0's stage-0 winner (promoted) and the job's best, from the sampled configs."""
    configs = trial_configs(spec, plan)
    b0 = sorted((t for t in configs if t[1] == 0), key=lambda t: t[3]["quality"])
    everyone = sorted(configs, key=lambda t: t[3]["quality"] / 3)
    return {"promoted": b0[0][0], "best": everyone[0][0]}


def _intervals(events: list[dict]) -> list[tuple[int, float, float]]:
    """(bracket, start, end) of every trial run."""
    bracket = {e["trial_id"]: e["bracket"] for e in events if e["type"] == J.TRIAL_CREATED}
    started: dict[str, float] = {}
    out = []
    for e in events:
        if e["type"] == J.TRIAL_STARTED:
            started[e["trial_id"]] = e["t"]
        elif e["type"] == J.TRIAL_STOPPED and e["trial_id"] in started:
            out.append((bracket[e["trial_id"]], started.pop(e["trial_id"]), e["t"]))
    return out


@pytest.fixture(scope="module")
def parallel_run(tmp_path_factory):
    base = tmp_path_factory.mktemp("brackets")
    spec_path, spec, plan = _job(base, epoch_s=0.1)
    run_dir = base / "run"
    started = time.monotonic()
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "rubberband",
            "run",
            str(spec_path),
            "--plan",
            str(base / "plan.json"),
            "--cloud",
            "local",
            "--run-dir",
            str(run_dir),
            "--yes",
        ],
        capture_output=True,
        text=True,
        env=cli_env(base),
        cwd=base,
        timeout=300,
    )
    print(f"\nparallel-bracket run: {time.monotonic() - started:.1f}s wall")
    return {"spec": spec, "plan": plan, "run_dir": run_dir, "result": result}


@pytest.mark.e2e
@pytest.mark.xdist_group("executor_brackets_parallel_run")  # one worker for the tests that read it: it runs once
def test_parallel_brackets_overlap_promote_hand_over_and_clean_up(parallel_run):
    result, run_dir, spec, plan = (parallel_run[k] for k in ("result", "run_dir", "spec", "plan"))
    assert result.returncode == 0, result.stderr
    events = _events(run_dir)
    finished = {e["stage"]: e for e in events if e["type"] == J.STAGE_FINISHED}
    started = {e["stage"]: e for e in events if e["type"] == J.STAGE_STARTED}
    assert sorted(finished) == [0, 1, 2]

    # the brackets ran side by side: both started at once (offsets 0), and bracket 1's trials ran while
    # bracket 0 was still under way (one after another, they would all run after bracket 0's last stage)
    assert started[2]["t"] < finished[0]["t"] and started[0]["t"] < finished[2]["t"]
    runs = _intervals(events)
    assert [r for r in runs if r[0] == 1] and all(
        started[0]["t"] < s < e < finished[1]["t"] for b, s, e in runs if b == 1
    ), runs

    # no instance ever holds more trials than its slots, whichever bracket they come from
    holding: dict[str, set[str]] = {}
    slots = {"local.cpu1": 1, "local.cpu2": 1}  # one 1-worker trial on a cpu1, one 2-worker trial on a cpu2
    types = {e["id"]: e["instance_type"] for e in events if e["type"] == J.INSTANCE_REQUESTED}
    for e in events:
        if e["type"] == J.TRIAL_STARTED:
            for instance in set(e["instances"]):
                holding.setdefault(instance, set()).add(e["trial_id"])
                assert len(holding[instance]) <= slots[types[instance]], (instance, holding[instance])
        elif e["type"] == J.TRIAL_STOPPED:
            for trials in holding.values():
                trials.discard(e["trial_id"])

    # every bracket's promotions are right: bracket 0 promotes its best stage-0 trial to its own stage 1 only
    winners = _winners(spec, plan)
    assert finished[0]["promoted"] == [winners["promoted"]]
    promotions = [e for e in events if e["type"] == J.TRIAL_PROMOTED]
    assert [(e["trial_id"], e["from_stage"], e["to_stage"]) for e in promotions] == [(winners["promoted"], 0, 1)]
    assert finished[1]["promoted"] == [] and finished[2]["promoted"] == []
    assert {e["trial_id"] for e in events if e["type"] == J.TRIAL_STARTED and e["stage"] == 2} == {
        t for t, b, _, _ in trial_configs(spec, plan) if b == 1
    }

    # an instance bracket 0's first stage released went to bracket 1's first stage (same type) and ran its trials
    handoffs = [e for e in events if e["type"] == J.DECISION and e.get("kind") == "handoff"]
    assert handoffs, "no instance was handed between brackets"
    h = handoffs[0]
    assert (h["from_bracket"], h["to_bracket"], h["instance_type"]) == (0, 1, "local.cpu1")
    assert any(e["type"] == J.TRIAL_STARTED and e["stage"] == 2 and h["id"] in e["instances"] for e in events)

    # nothing is left: every instance requested was terminated, no process of the run is alive
    requested = {e["id"] for e in events if e["type"] == J.INSTANCE_REQUESTED}
    terminated = {e["id"] for e in events if e["type"] == J.INSTANCE_TERMINATED}
    assert requested and requested == terminated
    assert run_pids(run_dir) == []
    assert events[-1]["type"] == J.RUN_FINISHED

    summary = json.loads((run_dir / "result.json").read_text())
    assert summary["status"] == "finished" and summary["best"]["trial_id"] == winners["best"]
    assert summary["actual"]["cost_usd"] > 0


@pytest.mark.e2e
def test_resume_after_sigkill_with_one_bracket_done_and_one_under_way(tmp_path):
    spec_path, spec, plan = _job(tmp_path, epoch_s=0.1, offsets=(0.0, 5.0))  # bracket 1 starts 5 s in
    run_dir = tmp_path / "run"
    env = cli_env(tmp_path)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "rubberband",
            "run",
            str(spec_path),
            "--plan",
            str(tmp_path / "plan.json"),
            "--run-dir",
            str(run_dir),
            "--yes",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
    )

    def bracket1_done_bracket0_not(events: list[dict]) -> bool:
        done = {e["stage"] for e in events if e["type"] == J.STAGE_FINISHED}
        return 2 in done and 1 not in done

    try:
        wait_for_events(proc, run_dir, bracket1_done_bracket0_not, timeout_s=240, poll_s=0.05)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
    before = _events(run_dir)
    assert 1 not in {e["stage"] for e in before if e["type"] == J.STAGE_FINISHED}, "killed too late"
    stage2 = next(e for e in before if e["type"] == J.STAGE_STARTED and e["stage"] == 2)
    assert stage2["t"] - before[0]["t"] >= 5.0 and stage2["offset_s"] == 5.0  # not before its offset

    resumed = subprocess.run(
        [sys.executable, "-m", "rubberband", "run", "--resume", str(run_dir)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert resumed.returncode == 0, resumed.stderr
    events = _events(run_dir)
    after = events[len(before) :]
    # finished stages stay finished: only bracket 0's last stage runs (again), once, with its promoted trial
    assert {e["stage"] for e in after if e["type"] == J.TRIAL_STARTED} == {1}
    assert [e["stage"] for e in after if e["type"] == J.STAGE_FINISHED] == [1]
    winners = _winners(spec, plan)
    summary = json.loads((run_dir / "result.json").read_text())
    assert summary["status"] == "finished" and summary["attempts"] == 2
    assert summary["best"]["trial_id"] == winners["best"]
    requested = {e["id"] for e in events if e["type"] == J.INSTANCE_REQUESTED}
    terminated = {e["id"] for e in events if e["type"] == J.INSTANCE_TERMINATED}
    assert requested == terminated
    assert run_pids(run_dir) == []


@pytest.mark.e2e
@pytest.mark.xdist_group("executor_brackets_parallel_run")
def test_report_of_a_parallel_run_draws_a_lane_per_bracket(parallel_run):
    from rubberband.report.charts import draw_all
    from rubberband.report.model import build_report_data
    from rubberband.report.source import RunSource

    data = build_report_data(RunSource.from_dir(parallel_run["run_dir"]), replan=None)
    charts = draw_all(data)
    assert "a lane per bracket (2)" in charts.actual_gantt.alt
    assert len(charts.actual_gantt.png) > 1000


def test_parallel_run_bills_each_instance_to_the_stages_of_the_brackets_it_served():
    from rubberband.executor.accounting import bill_run

    plan = {"brackets": "parallel", "stages": [{"bracket": 0}, {"bracket": 0}, {"bracket": 1}]}
    events = [
        {
            "type": J.RUN_STARTED,
            "t": 0.0,
            "run_id": "r",
            "spec_sha256": "x",
            "spec": {},
            "plan": plan,
            "cloud": "local",
            "deadline_s": 100.0,
        },
        {"type": J.STAGE_STARTED, "t": 0.0, "stage": 0},
        {"type": J.STAGE_STARTED, "t": 0.0, "stage": 2},
        {"type": J.STAGE_STARTED, "t": 10.0, "stage": 1},
    ]
    for ident in ("n1", "n2"):
        events.append(
            {
                "type": J.INSTANCE_REQUESTED,
                "t": 0.0,
                "id": ident,
                "instance_type": "local.cpu1",
                "cloud": "local",
                "price_hr": 3600.0,
                "stage": 0,
            }
        )
        events.append({"type": J.INSTANCE_TERMINATED, "t": 20.0, "id": ident})
    # n1 goes from bracket 0's stage 0 to bracket 1's stage 2 at t=5; n2 stays in bracket 0
    events.append({"type": J.DECISION, "t": 5.0, "kind": "handoff", "id": "n1", "from_stage": 0, "to_stage": 2})
    bill = bill_run(J.fold(events), now=30.0)
    assert bill.workers_usd == pytest.approx(40.0)  # 2 × 20 s at $1/s
    assert bill.by_stage[0] == pytest.approx(5.0 + 10.0)  # n1 until the hand-over, n2 in stage 0's window
    assert bill.by_stage[1] == pytest.approx(10.0)  # n2 only: n1 was bracket 1's by then
    assert bill.by_stage[2] == pytest.approx(15.0)  # n1 from the hand-over
    # the same journal read as one bracket after another splits by the stage windows, as before
    sequential = J.fold([{**events[0], "plan": {**plan, "brackets": "sequential"}}] + events[1:])
    assert sum(bill_run(sequential, now=30.0).by_stage.values()) == pytest.approx(40.0)
