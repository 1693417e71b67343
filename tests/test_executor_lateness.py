"""Graceful lateness end to end: the real CLI (in this process) on a simulated cluster (``--cloud sim``) for a run
that cannot meet its deadline.

A 3-trial SHA job (η=3: 3 trials × 1 epoch, then the winner to 3 epochs) with a 3 s deadline, which the local
head's start (a node's start-up, 3 s) alone uses up: no plan the re-planner finds can meet it. With ``--on-late finish
--overrun none`` it finishes late (exit 4) and says how late; with ``--on-late stop`` it stops at the first
stage boundary (exit 5) with stage 0's winner as its best so far. That every instance is terminated is what
the journal says here; the real processes' teardown is proven on real Ray nodes (test_executor_teardown,
test_executor_e2e).
"""

from __future__ import annotations

import json

from executor_helpers import make_plan, write_job
from sim_helpers import write_cpu_profile
from test_bad_input import invoke

from rubberband.executor import journal as J
from rubberband.executor.plan_checks import trial_configs
from rubberband.plan import write_plan
from rubberband.spec import load_spec


def _job(tmp_path):
    spec_path = write_job(tmp_path / "job", trials=3, eta=3, min_epochs=1, max_epochs=3, epoch_s=0.3)
    data = json.loads(spec_path.read_text())
    data["profile"] = str(write_cpu_profile(tmp_path / "job" / "profile.json", epoch_s=0.3, startup_s=3.0))
    spec_path.write_text(json.dumps(data))
    spec = load_spec(spec_path)
    plan = make_plan(spec, [("local.cpu2", 1, 1), ("local.cpu2", 1, 1)], durations=[2.0, 2.0])
    write_plan(plan, tmp_path / "plan.json")
    winner = min(trial_configs(spec, plan), key=lambda t: t[3]["quality"])[0]  # loss = quality / (epoch + 1)
    return spec_path, winner


def _run(tmp_path, *flags):
    spec_path, winner = _job(tmp_path)
    run_dir = tmp_path / "run"
    plan = tmp_path / "plan.json"
    common = ("--plan", plan, "--run-dir", run_dir, "--cloud", "sim", "--deadline", "3s", "--overrun", "none")
    result = invoke("run", spec_path, *common, *flags, "--yes")
    events = list(J.iter_events(run_dir / J.JOURNAL_NAME))
    requested = {e["id"] for e in events if e["type"] == J.INSTANCE_REQUESTED}
    terminated = {e["id"] for e in events if e["type"] == J.INSTANCE_TERMINATED}
    assert requested and requested <= terminated  # every instance billed up to its termination
    return result, winner, json.loads((run_dir / "result.json").read_text()), events, run_dir


def test_a_run_that_cannot_meet_its_deadline_finishes_late_and_says_how_late(tmp_path):
    result, winner, summary, events, _ = _run(tmp_path)
    assert result.code == 4, result.err[-3000:]
    last = result.out.strip().splitlines()[-1]
    assert last.startswith("outcome: late (exit 4): finished late: ") and "past the deadline" in last
    assert summary["status"] == "finished" and summary["outcome"] == "late" and summary["exit_code"] == 4
    assert summary["late_by_s"] > 0 and summary["met_deadline"] is False
    assert summary["best"]["trial_id"] == winner
    assert summary["best"]["rung"] == {"stage": 1, "bracket": 0, "epochs": 3, "complete": True}
    replan = [e for e in events if e["type"] == J.DECISION and e["kind"] == "replan"]
    assert replan and replan[0]["action"] == "finish_late" and replan[0]["on_late"] == "finish"


def test_on_late_stop_returns_the_best_so_far_and_never_starts_the_stage_it_cannot_finish(tmp_path):
    result, winner, summary, events, run_dir = _run(tmp_path, "--on-late", "stop")
    assert result.code == 5, result.err[-3000:]
    last = result.out.strip().splitlines()[-1]
    assert last.startswith("outcome: stopped (exit 5): stopped after ")
    assert f"best so far {winner} loss=" in last and "(stage 0, 1 epochs)" in last
    assert summary["status"] == "stopped" and summary["outcome"] == "stopped" and summary["exit_code"] == 5
    assert "--on-late stop" in summary["error"] and f"--resume {run_dir} --on-late finish" in summary["error"]
    assert summary["best"]["trial_id"] == winner and summary["best"]["config"]
    assert summary["best"]["rung"] == {"stage": 0, "bracket": 0, "epochs": 1, "complete": True}
    assert not [e for e in events if e["type"] == J.STAGE_STARTED and e["stage"] == 1]  # never started
    assert events[-1]["type"] == J.RUN_STOPPED and events[-1]["best_trial"] == winner
    assert [e["action"] for e in events if e["type"] == J.DECISION and e["kind"] == "replan"] == ["stop"]


def test_on_late_is_checked_before_anything_starts(tmp_path):
    spec_path, _ = _job(tmp_path)
    result = invoke("run", spec_path, "--plan", tmp_path / "plan.json", "--on-late", "later", "--yes")
    assert result.code == 2
    assert result.err.strip().splitlines()[-1].startswith("rubberband: error: --on-late 'later': use 'finish'")
    assert not (tmp_path / "runs").exists()
