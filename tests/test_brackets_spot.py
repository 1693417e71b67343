"""Spot under a deadline when Hyperband's brackets run side by side (``ParallelController``).

What the sequential loop does on a lost or noticed spot instance (tests/test_spot_fallback.py), a parallel run
does too, per bracket: the same :class:`~rubberband.planner.policies.SpotPolicy` decides spot or on-demand for
the replacement, with the run's work left taken as its critical path (the longest remaining bracket); the
decision is journaled (``decision`` kind ``spot``), the replacement bought in that market, and the trials
resume from their checkpoints on it. A notice stops the trials on that instance after their checkpoint,
requests the replacement at once and releases the instance as soon as it is free (never handed to another
bracket).

The unit tests drive the controller's pieces by hand: a stand-in backend (instances up at once), a stand-in
trial runtime (no Ray), a journaled run start. The end-to-end test runs the real CLI on real local Ray nodes and
kills a spot node by its pid.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
from executor_helpers import (
    FakeRuntime,
    cli_env,
    finished_outcome,
    journaled_controller,
    lose_node_once_checkpointed,
    make_plan,
    once_time_left_is_below,
    run_pids,
    write_hyperband_job,
)

from rubberband.errors import TrainingError, TrialPreempted
from rubberband.executor import journal as J
from rubberband.executor.brackets import ParallelController
from rubberband.plan import write_plan

# bracket 0: 3 trials × 1 epoch on two 1-worker spot nodes, then its best for 2 more on a 2-worker node;
# bracket 1: 2 trials × 3 epochs on one 1-worker spot node. Both start at once.
STAGES = [("local.cpu1", 2, 1), ("local.cpu2", 1, 2), ("local.cpu1", 1, 1)]
TASKS = (40.0, 60.0, 50.0)  # each stage's planned task time (s): bracket 0 takes 80 + 60, bracket 1 100
STARTUP = [10.0, 12.0]  # measured start-ups: the prefetch lead (p90) is 11.8 s


def _spot_plan(spec, durations=(80.0, 60.0, 100.0), tasks=TASKS):
    plan = make_plan(spec, STAGES, durations=list(durations))
    stages = [s.model_copy(update={"spot": True, "predicted_task_s": t}) for s, t in zip(plan.stages, tasks)]
    return plan.model_copy(update={"stages": stages, "brackets": "parallel", "bracket_offsets_s": [0.0, 0.0]})


def _up(controller) -> None:
    """Every request the stand-in backend serves is up: collect them as the loop does."""
    for entry in list(controller.pool.values()):
        if entry.future is not None:
            entry.future.result(timeout=10)
    controller._collect_provisioned()


def _started(tmp_path, *, deadline_s: float):
    """A parallel spot run a moment after its start: both brackets' first stages on their instances, every slot
    busy (bracket 0: two trials running, one waiting; bracket 1: one running, one waiting)."""
    _, spec = write_hyperband_job(tmp_path)
    controller, backend = journaled_controller(
        tmp_path,
        spec,
        _spot_plan(spec),
        deadline_s=deadline_s,
        controller_class=ParallelController,
        runtime=FakeRuntime(),
    )
    controller.search = controller._restore_search()
    # start-ups as measured on a cloud (the stand-in backend's are instant: set again once its instances are up)
    controller.startup_seconds = {"local.cpu1": list(STARTUP), "local.cpu2": list(STARTUP)}
    controller._open_lanes()
    for b in controller.brackets.due(0.0, [False, False]):
        lane = controller.lanes[b]
        lane.started = True
        controller._start_stage(lane, lane.first)
    _up(controller)
    controller.startup_seconds = {"local.cpu1": list(STARTUP), "local.cpu2": list(STARTUP)}
    for lane in controller.lanes:
        controller._fill_slots(lane)
    assert [len(lane.pending) for lane in controller.lanes] == [1, 1] and len(controller.running) == 3
    return controller, backend


def _instance_of(controller, stage: int) -> str:
    return next(p.id for p in controller.pool.values() if p.assigned_stage == stage and not p.released)


def _run_on(controller, ident: str):
    ref, run = next((ref, run) for ref, run in controller.running.items() if ident in run.slot.instance_ids)
    del controller.running[ref]  # what _wait_some does with a finished trial
    return run


def _checkpoint(controller, trial_id: str, epoch: int) -> None:
    ckpt = controller.run_dir / "checkpoints" / trial_id
    ckpt.mkdir(parents=True, exist_ok=True)
    (ckpt / f"epoch-{epoch}.pt").write_bytes(b"x")
    (ckpt / "latest").write_text(f"epoch-{epoch}.pt\n")
    controller.journal.record(J.Checkpoint(trial_id=trial_id, epoch=epoch))


def _events(controller) -> list[dict]:
    return list(J.iter_events(controller.run_dir / J.JOURNAL_NAME))


def _decisions(controller, kind: str) -> list[dict]:
    return [e for e in _events(controller) if e["type"] == J.DECISION and e.get("kind") == kind]


def _close(controller) -> None:
    controller._terminator.shutdown(wait=True)
    controller._provisioner.shutdown(wait=True)


def _resumes_on_replacement(controller, lane: int, trial_id: str, start_epoch: int) -> str:
    """Once the replacement is up, the trial starts again on it from its checkpoint; returns the replacement's id
    (known once the provisioner thread has served the request)."""
    _up(controller)
    (replace,) = _decisions(controller, "replace")
    replacement = controller.pool[replace["token"]].id
    controller._fill_slots(controller.lanes[lane])
    (again,) = [e for e in _events(controller) if e["type"] == J.TRIAL_STARTED and e["trial_id"] == trial_id][1:]
    assert again["instances"] == [replacement] and again["start_epoch"] == start_epoch
    assert again["from_checkpoint"] == (start_epoch - 1 if start_epoch else None)
    return replacement


def test_lost_spot_instance_with_slack_on_the_critical_path_is_replaced_on_spot(tmp_path):
    # bracket 0 loses one of its two nodes. Its rest: the running trial's 40 s + one wave of 40 s (the lost and the
    # waiting trial on two slots) + its last stage's 60 s + the replacement's start-up 11.8 s = 151.8 s; bracket 1
    # has 100 s left. Side by side the run has 151.8 s left (not 251.8 s, one after another): at 240 s to the
    # deadline the slack covers one more restart (11.8 s start-up + one 40 s checkpoint interval) — spot.
    controller, backend = _started(tmp_path, deadline_s=240.0)
    victim = _instance_of(controller, 0)
    run = _run_on(controller, victim)
    run.handle.error = TrainingError("worker died")
    controller._collect(controller.lanes[0], [run])
    (decision,) = _decisions(controller, "spot")
    assert decision["trigger"] == "preemption" and decision["id"] == victim and decision["stage"] == 0
    assert decision["work_left_s"] == pytest.approx(151.8, abs=1.5)  # the running trial's first second(s) passed
    assert decision["restart_s"] == pytest.approx(51.8, abs=0.01)
    assert decision["slack_s"] == pytest.approx(
        decision["time_left_s"] - decision["work_left_s"] - decision["restart_s"], abs=1e-2
    )
    assert decision["market"] == "spot" and decision["previous"] == "spot" and decision["slack_s"] > 0
    assert set(decision) >= {
        "time_left_s",
        "work_left_s",
        "restart_s",
        "slack_s",
        "margin_s",
        "confidence",
        "quantile",
        "for_stage",
        "reason",
    }
    assert _replacement_requested(controller, stage=0).itype.name == "local.cpu1"
    (replace,) = _decisions(controller, "replace")
    assert replace["id"] == victim
    assert controller.lanes[0].pending[0] == (run.trial_id, 0)  # first in line again
    _resumes_on_replacement(controller, 0, run.trial_id, 0)
    _close(controller)


def test_lost_spot_instance_goes_on_demand_when_the_longest_bracket_leaves_no_slack(tmp_path):
    # 200 s deadline: at the start the critical path (bracket 0: 2 waves of 40 s + 60 s) leaves room for a restart
    # (11.8 s + one 40 s checkpoint interval), so the brackets start on spot. 45 s later (their nodes took that long
    # to come up: the trials just started) bracket 1 loses its node after its trial's checkpoint of epoch 0.
    # Bracket 1 alone would still have slack (155 s to go, 2 × 50 s + 11.8 s left, one restart of 11.8 + 50/3 s),
    # but bracket 0 has 140 s left: the run's critical path leaves less than one restart — on-demand, and the
    # run's spot stages stay on-demand.
    controller, backend = _started(tmp_path, deadline_s=200.0)
    assert not _decisions(controller, "spot")  # started on spot, as planned
    controller.state.first_started_at -= 45.0
    victim = _instance_of(controller, 2)
    run = _run_on(controller, victim)
    _checkpoint(controller, run.trial_id, 0)
    run.handle.error = TrainingError("worker died")
    controller._collect(controller.lanes[1], [run])
    (decision,) = _decisions(controller, "spot")
    assert decision["trigger"] == "preemption" and decision["id"] == victim and decision["stage"] == 2
    assert decision["work_left_s"] == pytest.approx(140.0, abs=1.5)
    assert decision["time_left_s"] == pytest.approx(155.0, abs=1.5)
    assert decision["restart_s"] == pytest.approx(11.8 + 50.0 / 3, abs=0.01)
    assert decision["market"] == "on_demand" and decision["slack_s"] <= 0
    assert "on-demand keeps the deadline" in decision["reason"]
    _replacement_requested(controller, stage=2, spot=False)
    # the trial resumes from its checkpoint on the on-demand replacement
    replacement = _resumes_on_replacement(controller, 1, run.trial_id, 1)
    requested = {e["id"]: e for e in _events(controller) if e["type"] == J.INSTANCE_REQUESTED}
    assert requested[replacement]["spot"] is False and requested[victim]["spot"] is True
    # bracket 0's next stage (planned on spot) is bought on-demand too, quietly: the market moved for the run
    lane = controller.lanes[0]
    for ident in [p.id for p in controller.pool.values() if p.assigned_stage == 0 and not p.released]:
        done = _run_on(controller, ident)
        done.handle.outcome = finished_outcome(done.trial_id, 0, 1, 0.5)
        controller._collect(lane, [done])
    controller._fill_slots(lane)
    last = _run_on(
        controller,
        next(i for r in controller.running.values() if r.trial_id == lane.trials[-1] for i in r.slot.instance_ids),
    )
    last.handle.outcome = finished_outcome(last.trial_id, 0, 1, 0.1)
    controller._collect(lane, [last])
    controller._tend_lane(lane)
    assert lane.g == 1
    (nxt,) = [p for p in controller.pool.values() if p.assigned_stage == 1]
    assert nxt.itype.name == "local.cpu2" and not nxt.spot
    assert len(_decisions(controller, "spot")) == 1
    _close(controller)


def test_notice_stops_the_trial_after_its_checkpoint_and_replaces_the_instance_now(tmp_path, monkeypatch):
    # bracket 1's node gets a preemption notice; its trial's workers see it at their checkpoint of epoch 0 and stop
    controller, backend = _started(tmp_path, deadline_s=3600.0)
    victim = _instance_of(controller, 2)
    notice = {"cloud": "aws", "action": "terminate", "time": "2026-11-24T04:00:00Z"}
    asked: list[tuple] = []

    def found(ask=()):  # the watcher's answer (its Ray part is tested with the sequential loop, tests/test_spot_e2e)
        asked.append(tuple(ask))
        return {victim: notice} if victim in ask else {}

    monkeypatch.setattr(controller, "_notices_found", found)
    run = _run_on(controller, victim)
    _checkpoint(controller, run.trial_id, 0)
    run.handle.error = TrialPreempted("preemption notice (aws terminate): stopped after the checkpoint of epoch 0")
    lane = controller.lanes[1]
    controller._collect(lane, [run])
    assert asked == [(victim,)]
    (stopped,) = [e for e in _events(controller) if e["type"] == J.TRIAL_STOPPED]
    assert stopped["reason"] == "preempted" and stopped["checkpoint_epoch"] == 0
    assert lane.pending[0] == (run.trial_id, 1) and run.trial_id not in lane.metrics  # not finished: requeued
    (noticed,) = _decisions(controller, "notice")
    assert noticed["id"] == victim and noticed["stage"] == 2 and noticed["action"] == "terminate"
    (decision,) = _decisions(controller, "spot")
    assert decision["trigger"] == "notice" and decision["id"] == victim and decision["market"] == "spot"
    _replacement_requested(controller, stage=2)
    # the noticed instance takes nothing more and is released now (not handed to bracket 0), before the replacement
    # is up
    controller._tend_lane(lane)
    controller._fill_slots(lane)
    assert not [e for e in _events(controller) if e["type"] == J.TRIAL_STARTED and e["trial_id"] == run.trial_id][1:]
    controller._collect_terminations(wait=True)
    (gone,) = [e for e in _events(controller) if e["type"] == J.INSTANCE_TERMINATED and e["id"] == victim]
    assert gone["reason"] == "preemption notice" and not _decisions(controller, "handoff")
    _resumes_on_replacement(controller, 1, run.trial_id, 1)
    _close(controller)


def _replacement_requested(controller, *, stage: int, spot: bool = True):
    """The journaled replacement is a request for ``stage`` in that market (read from the controller's pool, which
    holds it at once: the stand-in backend's request list fills from the provisioner thread, later)."""
    (replace,) = _decisions(controller, "replace")
    entry = controller.pool[replace["token"]]
    assert replace["spot"] is spot and entry.spot is spot and entry.assigned_stage == stage
    return entry


def test_notice_seen_by_the_watcher_is_taken_by_the_bracket_the_instance_serves(tmp_path, monkeypatch):
    controller, backend = _started(tmp_path, deadline_s=3600.0)
    victim = _instance_of(controller, 0)
    notice = {"cloud": "gcp", "action": "preempted", "time": None}
    monkeypatch.setattr(controller, "_notices_found", lambda ask=(): {victim: notice})
    controller._last_liveness = 0.0
    controller._liveness()
    (noticed,) = _decisions(controller, "notice")
    assert noticed["id"] == victim and noticed["stage"] == 0 and len(noticed["trials"]) == 1
    (decision,) = _decisions(controller, "spot")
    assert decision["trigger"] == "notice" and decision["stage"] == 0 and decision["market"] == "spot"
    _replacement_requested(controller, stage=0)
    # its trial stops at its next checkpoint; the waiting trial never goes onto the noticed instance
    lane = controller.lanes[0]
    run = _run_on(controller, victim)
    run.handle.error = TrialPreempted("preemption notice (gcp preempted)")
    controller._collect(lane, [run])
    controller._tend_lane(lane)
    controller._fill_slots(lane)
    assert not [e for e in _events(controller) if e["type"] == J.TRIAL_STARTED and victim in e["instances"]][1:]
    assert len(_decisions(controller, "spot")) == 1 and len(_decisions(controller, "replace")) == 1
    _close(controller)


def test_work_left_is_the_longest_bracket_a_later_one_counted_from_its_offset(tmp_path):
    _, spec = write_hyperband_job(tmp_path)
    plan = _spot_plan(spec).model_copy(update={"bracket_offsets_s": [0.0, 50.0]})
    controller, _ = journaled_controller(
        tmp_path, spec, plan, deadline_s=600.0, controller_class=ParallelController, runtime=FakeRuntime()
    )
    # no lane yet (the first requests, while the driver connects): each bracket from its first stage's prediction;
    # bracket 1 starts 50 s in and takes 100 s, bracket 0 takes 80 + 60 s
    assert controller._work_left_s(0, waiting=3, awaited_s=0.0) == pytest.approx(150.0, abs=0.5)
    controller.state.first_started_at -= 30.0  # 30 s later: bracket 1 is 20 s away, bracket 0 is the longest
    assert controller._work_left_s(0, waiting=3, awaited_s=12.0) == pytest.approx(152.0, abs=0.5)
    assert controller._work_left_s(2, waiting=3, awaited_s=12.0) == pytest.approx(140.0, abs=0.5)
    # the same stages one bracket after another: everything left, as the sequential controller counts it
    sequential = plan.model_copy(update={"brackets": "sequential"})
    other, _ = journaled_controller(
        tmp_path / "seq", spec, sequential, deadline_s=600.0, controller_class=ParallelController, runtime=FakeRuntime()
    )
    assert other._work_left_s(0, waiting=3, awaited_s=0.0) == pytest.approx(80.0 + 60.0 + 100.0, abs=0.5)
    _close(controller)
    _close(other)


# -- end to end: a local spot node of one bracket killed by its pid ------------------------------------------


def _bracket1_checkpointed(events: list[dict]) -> str | None:
    """The instance of the first trial of bracket 1 to save a checkpoint (None before one has)."""
    started = {
        e["trial_id"]: e["instances"][0]
        for e in events
        if e["type"] == J.TRIAL_STARTED and e["trial_id"].startswith("b1-")
    }
    saved = [e for e in events if e["type"] == J.CHECKPOINT and e["trial_id"] in started]
    return started[saved[0]["trial_id"]] if saved else None


@pytest.mark.e2e
def test_parallel_run_replaces_a_killed_spot_node_on_demand_and_resumes_its_bracket(tmp_path):
    """Both brackets start at once on spot local nodes (bracket 0 on a ``local.cpu1``, bracket 1's two 3-epoch
    trials on a ``local.cpu2``). Once a bracket-1 trial has checkpointed and less than the spec's 20 s spot margin
    is left to the 60 s deadline, that node is killed by its pid: the run's critical path leaves too little slack
    for another restart, so the replacement is on-demand; bracket 1's trials resume from their checkpoints on it;
    bracket 0 loses nothing.

    The outcome does not depend on this machine's pace: at the start the slack is the deadline less the plan's
    critical path and one restart, well above the margin even on a loaded machine (spot); at the loss the time
    left alone is below it (on-demand). Bracket 1's epochs of 12 s outlast the moment of the loss."""
    spec_path, spec = write_hyperband_job(tmp_path, epoch_s=12.0, spot_margin_s=20.0)
    plan = make_plan(
        spec, [("local.cpu1", 1, 1), ("local.cpu1", 1, 1), ("local.cpu2", 1, 1)], durations=[6.0, 4.0, 6.0]
    )
    stages = [s.model_copy(update={"spot": True, "predicted_task_s": t}) for s, t in zip(plan.stages, (2.0, 4.0, 6.0))]
    plan = plan.model_copy(update={"stages": stages, "brackets": "parallel", "bracket_offsets_s": [0.0, 0.0]})
    write_plan(plan, tmp_path / "plan.json")
    run_dir = tmp_path / "run"
    started = time.monotonic()
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
            "--deadline",
            "60s",
            "--overrun",
            "none",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=cli_env(tmp_path),
    )
    victim, out, err = lose_node_once_checkpointed(
        proc, run_dir, timeout_s=150, victim_of=once_time_left_is_below(20, _bracket1_checkpointed)
    )
    print(f"\nparallel spot run with a killed node: {time.monotonic() - started:.1f}s wall")
    assert proc.returncode in (0, 4), err[-3000:]  # met or late: the point is that it finished
    events = list(J.iter_events(run_dir / J.JOURNAL_NAME))
    requested = {e["id"]: e for e in events if e["type"] == J.INSTANCE_REQUESTED}
    assert requested[victim]["spot"] is True and requested[victim]["stage"] == 2
    (lost,) = [e for e in events if e["type"] == J.INSTANCE_LOST]
    assert lost["id"] == victim and lost["stage"] == 2
    (decision,) = [e for e in events if e["type"] == J.DECISION and e.get("kind") == "spot"]
    assert decision["trigger"] == "lost" and decision["id"] == victim and decision["stage"] == 2
    assert decision["market"] == "on_demand" and decision["slack_s"] <= decision["margin_s"], decision
    at = events.index(decision)
    (replacement,) = [e for e in events[at:] if e["type"] == J.INSTANCE_REQUESTED and e["stage"] == 2]
    assert replacement["spot"] is False and replacement["id"] != victim
    (replace,) = [e for e in events if e["type"] == J.DECISION and e.get("kind") == "replace"]
    assert replace["id"] == victim and replace["spot"] is False
    # bracket 1's trials go on from their checkpoints on the replacement (or, if the dying node's worker saved the
    # last epoch, finish from the journal); bracket 0 never lost anything
    stopped = [e["trial_id"] for e in events if e["type"] == J.TRIAL_STOPPED and e["reason"] == "instance_lost"]
    assert stopped and all(t.startswith("b1-") for t in stopped)
    for trial_id in stopped:
        again = [e for e in events[at:] if e["type"] == J.TRIAL_STARTED and e["trial_id"] == trial_id]
        if again:
            assert again[0]["instances"] == [replacement["id"]]
            checkpoint = again[0]["from_checkpoint"]
            assert checkpoint is not None and again[0]["start_epoch"] == checkpoint + 1
    assert not [e for e in events if e["type"] == J.TRIAL_STOPPED and e["reason"] == "failed"]
    finished = {e["stage"] for e in events if e["type"] == J.STAGE_FINISHED}
    assert finished == {0, 1, 2}
    summary = json.loads((run_dir / "result.json").read_text())
    assert summary["status"] == "finished" and summary["instances_lost"] == 1
    assert {e["id"] for e in events if e["type"] == J.INSTANCE_TERMINATED} == set(requested)
    assert run_pids(run_dir) == []
