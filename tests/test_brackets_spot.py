"""Spot under a deadline when Hyperband's brackets run side by side (the executor's lanes).

What a sequential run does on a lost or noticed spot instance (tests/test_spot_fallback.py), a parallel run
does too, per bracket: the same :class:`~rubberband.planner.policies.SpotPolicy` decides spot or on-demand for
the replacement, with the run's work left taken as its critical path (the longest remaining bracket, one not
started yet counted from its offset); the decision is journaled (``decision`` kind ``spot``), the replacement
bought in that market, and the trials resume from their checkpoints on it. A notice stops the trials on that
instance after their checkpoint, requests the replacement at once and releases the instance as soon as it is
free (never handed to another bracket).

The tests run the real executor on virtual time (tests/sim_helpers.py) with scripted spot losses and notices,
and read the decisions' figures from the journal. A real lost node, its replacement and the trials' resumption
from their checkpoints on real Ray nodes are proven once (tests/test_executor_spot.py).
"""

from __future__ import annotations

import math

import pytest
from executor_helpers import (
    make_plan,
    write_hyperband_job,
)
from sim_helpers import SimCase, cpu_model

from rubberband.executor import journal as J
from rubberband.executor.run import Settings
from rubberband.executor.simulated import SimScript

# bracket 0: 3 trials × 1 epoch on two 1-worker spot nodes, then its best for 2 more on a 2-worker node;
# bracket 1: 2 trials × 3 epochs on one 1-worker spot node. Both start with the job, bracket 0 first (it is
# predicted to end last); the local backend starts nodes one after another: bracket 0's two nodes (instances 1
# and 2, up 20 s and 30 s into the run: the run's head boots first), then bracket 1's (instance 3, up at 40 s).
STAGES = [("local.cpu1", 2, 1), ("local.cpu2", 1, 2), ("local.cpu1", 1, 1)]
TASKS = (40.0, 60.0, 50.0)  # each stage's planned task time (s): bracket 0 takes 80 + 60, bracket 1 100
DURATIONS = (80.0, 60.0, 100.0)
#: An epoch on one worker takes 40 s (stage 0's tasks as planned); every instance is up 10 s after its request.
MODEL = cpu_model(epoch_s=40.0, startup_s=10.0)


#: The job's plan: its stages (type, instances, workers per trial), their planned task times and durations, the
#: brackets' offsets and mode; a test changes some (``_case``'s ``changes``).
PLAN = dict(stages=STAGES, tasks=TASKS, durations=DURATIONS, offsets=(0.0, 0.0), brackets="parallel")


def _case(tmp_path, deadline_s: float, script: SimScript, **changes) -> SimCase:
    """The job on spot nodes (no spot margin; a late run finishes), ``script``'s losses and notices played."""
    layout = {**PLAN, **changes}
    _, spec = write_hyperband_job(tmp_path)
    plan = make_plan(spec, layout["stages"], durations=list(layout["durations"]))
    stages = [s.model_copy(update={"spot": True, "predicted_task_s": t}) for s, t in zip(plan.stages, layout["tasks"])]
    plan = plan.model_copy(
        update={"stages": stages, "brackets": layout["brackets"], "bracket_offsets_s": list(layout["offsets"])}
    )
    return SimCase(spec, plan, model=MODEL, script=script, settings=Settings(deadline_s=deadline_s, overrun_s=math.inf))


def _requested(out) -> list[dict]:
    """The ``instance_requested`` events in the order the instances came into being (the script's count)."""
    return sorted(out.of(J.INSTANCE_REQUESTED), key=lambda e: int(e["id"].rsplit("-", 1)[1]))


def _started(out, trial_id: str) -> list[dict]:
    return [e for e in out.of(J.TRIAL_STARTED) if e["trial_id"] == trial_id]


def _replacement(out, victim: str, *, stage: int, spot: bool) -> str:
    """The journaled replacement of ``victim``: a request for ``stage`` in that market, sent at the decision."""
    (replace,) = out.of("replace")
    assert replace["id"] == victim and replace["stage"] == stage and replace["spot"] is spot
    later = [e for e in _requested(out) if e["t"] >= replace["t"] and e["stage"] == stage]
    assert later and later[0]["spot"] is spot
    return later[0]["id"]


def test_lost_spot_instance_with_slack_on_the_critical_path_is_replaced_on_spot(tmp_path):
    # bracket 0 loses its second node 5 s after it came up (35 s in). Its rest: the running trial's 25 s (40 s,
    # started 15 s before) + one wave of 40 s (the lost and the waiting trial on two slots) + its last stage's
    # 60 s + the replacement's start-up 10 s = 135 s; bracket 1 has 100 s (two trials of 50 s on its slot, its
    # node still booting). Side by side the run has 135 s left (not 235 s, one after another): at 205 s to the
    # deadline the slack covers one more restart (10 s start-up + one 40 s checkpoint interval) — spot.
    out = _case(tmp_path, 240.0, SimScript(losses={2: 5.0})).run(tmp_path / "run")
    assert out.result.status == "finished", out.error
    victim = _requested(out)[1]["id"]
    (lost,) = out.of(J.INSTANCE_LOST)
    assert lost["id"] == victim and lost["reason"] == "spot-interruption"
    (decision,) = out.of("spot")  # started on spot, as planned: nothing journaled before the loss
    assert decision["trigger"] == "preemption" and decision["id"] == victim and decision["stage"] == 0
    assert decision["time_left_s"] == pytest.approx(240.0 - 35.0, abs=1e-3)
    assert decision["work_left_s"] == pytest.approx(25.0 + 40.0 + 60.0 + 10.0, abs=1e-3)
    assert decision["restart_s"] == pytest.approx(10.0 + 40.0, abs=1e-3)
    assert decision["slack_s"] == pytest.approx(
        decision["time_left_s"] - decision["work_left_s"] - decision["restart_s"], abs=1e-2
    )
    assert decision["market"] == "spot" and decision["previous"] == "spot" and decision["slack_s"] > 0
    # one bracket after another the same run would have bracket 1's 100 s on top: no slack, on-demand
    assert decision["time_left_s"] - (decision["work_left_s"] + 100.0) - decision["restart_s"] < 0
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
    assert all(e["spot"] for e in out.of(J.INSTANCE_REQUESTED))
    replacement = _replacement(out, victim, stage=0, spot=True)
    assert next(e for e in _requested(out) if e["id"] == replacement)["instance_type"] == "local.cpu1"
    # the lost trial goes first again: it starts over on the replacement before the trial that waited
    (trial_id,) = lost["trials"]
    again = _started(out, trial_id)[1]
    assert again["instances"] == [replacement] and again["start_epoch"] == 0 and again["from_checkpoint"] is None
    waited = [e for e in out.of(J.TRIAL_STARTED) if e["stage"] == 0 and e["trial_id"] not in (trial_id, "b0-t000")]
    assert waited and all(again["t"] <= e["t"] for e in waited)


def test_lost_spot_instance_goes_on_demand_when_the_longest_bracket_leaves_no_slack(tmp_path):
    # bracket 0: its 3 trials on one local.cpu1 (3 waves of 30 s, as planned) then 60 s; bracket 1: its 2 trials
    # side by side on one local.cpu2 (80 s planned). 210 s deadline: at the start the critical path (bracket 0:
    # 90 + 60 s) leaves room for a restart (a start-up quantile of 2.85 s + one 30 s checkpoint interval), so the
    # brackets start on spot. Bracket 1's node is lost 41 s after it came up (71 s in), after its trials'
    # checkpoints of epoch 0. Bracket 1 alone would still have slack (139 s to go: one wave of 80 s + the
    # replacement's 10 s start-up, and one restart of 10 + 80/3 s), but bracket 0 has 109 s left (its running
    # trial's 19 s, one more trial of 30 s, its last stage's 60 s): the run's critical path leaves less than one
    # restart — on-demand, and the run's spot stages stay on-demand.
    out = _case(
        tmp_path,
        210.0,
        SimScript(losses={2: 41.0}),
        stages=[("local.cpu1", 1, 1), ("local.cpu2", 1, 2), ("local.cpu2", 1, 1)],
        tasks=(30.0, 60.0, 80.0),
        durations=(90.0, 60.0, 80.0),
    ).run(tmp_path / "run")
    assert out.result.status == "finished", out.error
    victim = _requested(out)[1]["id"]
    (decision,) = out.of("spot")
    assert decision["trigger"] == "preemption" and decision["id"] == victim and decision["stage"] == 2
    assert decision["work_left_s"] == pytest.approx(19.0 + 30.0 + 60.0, abs=1e-3)
    assert decision["time_left_s"] == pytest.approx(210.0 - 71.0, abs=1e-3)
    assert decision["restart_s"] == pytest.approx(10.0 + 80.0 / 3, abs=0.01)
    assert decision["market"] == "on_demand" and decision["slack_s"] <= 0
    assert "on-demand keeps the deadline" in decision["reason"]
    assert decision["time_left_s"] - (80.0 + 10.0) - decision["restart_s"] > 0  # bracket 1 alone: spot
    requested = {e["id"]: e for e in out.of(J.INSTANCE_REQUESTED)}
    assert requested[victim]["spot"] is True and requested[victim]["stage"] == 2
    replacement = _replacement(out, victim, stage=2, spot=False)
    # both of bracket 1's trials stopped after their checkpoint of epoch 0, and resume from it on the replacement
    stopped = [e for e in out.of(J.TRIAL_STOPPED) if e["reason"] == "instance_lost"]
    assert sorted(e["trial_id"] for e in stopped) == ["b1-t000", "b1-t001"]
    assert all(e["checkpoint_epoch"] == 0 for e in stopped)
    for e in stopped:
        again = _started(out, e["trial_id"])[1]
        assert again["instances"] == [replacement] and again["start_epoch"] == 1 and again["from_checkpoint"] == 0
    # bracket 0's next stage (planned on spot) is bought on-demand too, quietly: the market moved for the run
    (nxt,) = [e for e in out.of(J.INSTANCE_REQUESTED) if e["stage"] == 1]
    assert nxt["instance_type"] == "local.cpu2" and nxt["spot"] is False
    assert len(out.of("spot")) == 1


def test_notice_stops_the_trial_after_its_checkpoint_and_replaces_the_instance_now(tmp_path):
    # bracket 1's node gets a preemption notice 5 s after it came up (45 s in), in its first trial's first epoch;
    # the trial's workers see it at their checkpoint of epoch 0 (80 s in) and stop
    out = _case(tmp_path, 3600.0, SimScript(notices={3: 5.0})).run(tmp_path / "run")
    assert out.result.status == "finished", out.error
    victim = _requested(out)[2]["id"]
    (noticed,) = out.of("notice")
    assert noticed["id"] == victim and noticed["stage"] == 2 and noticed["action"] == "terminate"
    assert noticed["trials"] == ["b1-t000"]
    (decision,) = out.of("spot")
    assert decision["trigger"] == "notice" and decision["id"] == victim and decision["market"] == "spot"
    assert decision["t"] == noticed["t"]
    replacement = _replacement(out, victim, stage=2, spot=True)
    (replace,) = out.of("replace")
    assert replace["t"] == noticed["t"]  # now: not once the trial has stopped
    (stopped,) = [e for e in out.of(J.TRIAL_STOPPED) if e["reason"] == "preempted"]
    assert stopped["trial_id"] == "b1-t000" and stopped["checkpoint_epoch"] == 0
    (checkpoint,) = [e for e in out.of("checkpoint") if e["trial_id"] == "b1-t000" and e["epoch"] == 0]
    assert stopped["t"] == checkpoint["t"] > noticed["t"]  # right after its checkpoint
    # the noticed instance takes nothing more (the waiting trial goes to the replacement) and is released as soon
    # as its trial stopped, before its work is done elsewhere; never handed to bracket 0
    assert not [e for e in out.of(J.TRIAL_STARTED) if victim in e["instances"] and e["t"] > noticed["t"]]
    assert _started(out, "b1-t001")[0]["instances"] == [replacement]
    (release,) = [e for e in out.of("release") if e["id"] == victim]
    assert release["reason"] == "preemption notice" and release["t"] == stopped["t"]
    (gone,) = [e for e in out.of(J.INSTANCE_TERMINATED) if e["id"] == victim]
    assert gone["reason"] == "preemption notice" and not out.of("handoff")
    # the trial resumes from its checkpoint on the replacement
    again = _started(out, "b1-t000")[1]
    assert again["instances"] == [replacement] and again["start_epoch"] == 1 and again["from_checkpoint"] == 0


def test_notice_seen_by_the_watcher_is_taken_by_the_bracket_the_instance_serves(tmp_path):
    # bracket 0's first node gets a notice 5 s after it came up (25 s in), while its first trial runs
    out = _case(tmp_path, 3600.0, SimScript(notices={1: 5.0})).run(tmp_path / "run")
    assert out.result.status == "finished", out.error
    victim = _requested(out)[0]["id"]
    (noticed,) = out.of("notice")
    assert noticed["id"] == victim and noticed["stage"] == 0 and noticed["trials"] == ["b0-t000"]
    (decision,) = out.of("spot")
    assert decision["trigger"] == "notice" and decision["stage"] == 0 and decision["market"] == "spot"
    replacement = _replacement(out, victim, stage=0, spot=True)
    # its trial runs to its next checkpoint (a one-epoch trial: its end); the waiting trial never goes onto the
    # noticed instance but onto the replacement; the noticed one is released once free
    (first,) = _started(out, "b0-t000")
    assert first["instances"] == [victim]
    assert not [e for e in out.of(J.TRIAL_STARTED) if victim in e["instances"] and e["t"] > noticed["t"]]
    assert _started(out, "b0-t002")[0]["instances"] == [replacement]
    (release,) = [e for e in out.of("release") if e["id"] == victim]
    assert release["reason"] == "preemption notice"
    assert len(out.of("spot")) == 1 and len(out.of("replace")) == 1


@pytest.mark.parametrize(
    "offsets, brackets, work_left_s",
    [
        # bracket 1 starts 100 s after the job: 79 s away, then its predicted 100 s — the longest
        ((0.0, 100.0), "parallel", 79.0 + 100.0),
        # 50 s after the job: 29 + 100 s; bracket 0 is the longest: two waves of 40 s (its 3 trials on 2 slots),
        # its last stage's 60 s and the replacement's start-up of 10 s
        ((0.0, 50.0), "parallel", 2 * 40.0 + 60.0 + 10.0),
        # the same stages one bracket after another: everything left, in one chain
        ((0.0, 0.0), "sequential", 2 * 40.0 + 60.0 + 100.0 + 10.0),
    ],
)
def test_work_left_is_the_longest_bracket_a_later_one_counted_from_its_offset(tmp_path, offsets, brackets, work_left_s):
    # bracket 0's first node is lost a second after it came up (21 s in), its trial with it; its second node is
    # still booting
    case = _case(tmp_path, 600.0, SimScript(losses={1: 1.0}), offsets=offsets, brackets=brackets)
    out = case.run(tmp_path / "run")
    assert out.result.status == "finished", out.error
    (decision,) = out.of("spot")
    assert decision["trigger"] == "preemption" and decision["stage"] == 0
    assert decision["time_left_s"] == pytest.approx(600.0 - 21.0, abs=1e-3)
    assert decision["work_left_s"] == pytest.approx(work_left_s, abs=1e-3)


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
