"""Graceful lateness end to end: real CLI runs on real local Ray nodes that cannot meet their deadline.

A 3-trial SHA job (η=3: 3 trials × 1 epoch, then the winner to 3 epochs) with a 5 s deadline, which
the Ray head's start alone exceeds. With ``--on-late finish --overrun none`` it finishes late (exit 4);
with ``--on-late stop`` it stops at the first stage boundary (exit 5) with stage 0's winner as its best
so far. Each run takes about 20-30 s on a 2-core machine.
"""

from __future__ import annotations

import json

import pytest
from executor_helpers import cli_env, make_plan, run_pids, write_job

from rubberband.executor import journal as J
from rubberband.executor.plan_checks import trial_configs
from rubberband.plan import write_plan
from rubberband.spec import load_spec

pytestmark = pytest.mark.e2e


def _job(tmp_path):
    spec_path = write_job(tmp_path / "job", trials=3, eta=3, min_epochs=1, max_epochs=3, epoch_s=0.3)
    spec = load_spec(spec_path)
    plan = make_plan(spec, [("local.cpu2", 1, 1), ("local.cpu2", 1, 1)], durations=[2.0, 2.0])
    write_plan(plan, tmp_path / "plan.json")
    winner = min(trial_configs(spec, plan), key=lambda t: t[3]["quality"])[0]  # loss = quality / (epoch + 1)
    return spec_path, winner


def _all_terminated(run_dir):
    events = list(J.iter_events(run_dir / J.JOURNAL_NAME))
    requested = {e["id"] for e in events if e["type"] == J.INSTANCE_REQUESTED}
    terminated = {e["id"] for e in events if e["type"] == J.INSTANCE_TERMINATED}
    assert requested and requested <= terminated
    assert run_pids(run_dir) == []  # no Ray node or head of the run is left
    return events


def test_a_run_that_cannot_meet_its_deadline_finishes_late_and_says_how_late(tmp_path, cli):
    spec_path, winner = _job(tmp_path)
    run_dir = tmp_path / "run"
    result = cli(
        "run",
        str(spec_path),
        "--plan",
        str(tmp_path / "plan.json"),
        "--run-dir",
        str(run_dir),
        "--deadline",
        "5s",
        "--overrun",
        "none",
        "--yes",
        env=cli_env(tmp_path),
    )
    assert result.returncode == 4, result.stderr[-3000:]
    last = result.stdout.strip().splitlines()[-1]
    assert last.startswith("outcome: late (exit 4): finished late: ") and "past the deadline" in last
    summary = json.loads((run_dir / "result.json").read_text())
    assert summary["status"] == "finished" and summary["outcome"] == "late" and summary["exit_code"] == 4
    assert summary["late_by_s"] > 0 and summary["met_deadline"] is False
    assert summary["best"]["trial_id"] == winner
    assert summary["best"]["rung"] == {"stage": 1, "bracket": 0, "epochs": 3, "complete": True}
    events = _all_terminated(run_dir)
    replan = [e for e in events if e["type"] == J.DECISION and e["kind"] == "replan"]
    assert replan and replan[0]["action"] == "finish_late" and replan[0]["on_late"] == "finish"


def test_on_late_stop_returns_the_best_so_far_and_leaves_nothing_running(tmp_path, cli):
    spec_path, winner = _job(tmp_path)
    run_dir = tmp_path / "run"
    result = cli(
        "run",
        str(spec_path),
        "--plan",
        str(tmp_path / "plan.json"),
        "--run-dir",
        str(run_dir),
        "--deadline",
        "5s",
        "--overrun",
        "none",
        "--on-late",
        "stop",
        "--yes",
        env=cli_env(tmp_path),
    )
    assert result.returncode == 5, result.stderr[-3000:]
    last = result.stdout.strip().splitlines()[-1]
    assert last.startswith("outcome: stopped (exit 5): stopped after ")
    assert f"best so far {winner} loss=" in last and "(stage 0, 1 epochs)" in last
    summary = json.loads((run_dir / "result.json").read_text())
    assert summary["status"] == "stopped" and summary["outcome"] == "stopped" and summary["exit_code"] == 5
    assert "--on-late stop" in summary["error"] and f"--resume {run_dir} --on-late finish" in summary["error"]
    assert summary["best"]["trial_id"] == winner and summary["best"]["config"]
    assert summary["best"]["rung"] == {"stage": 0, "bracket": 0, "epochs": 1, "complete": True}
    assert summary["best"]["checkpoint"]
    events = _all_terminated(run_dir)
    assert not [e for e in events if e["type"] == J.STAGE_STARTED and e["stage"] == 1]  # never started
    assert events[-1]["type"] == J.RUN_STOPPED and events[-1]["best_trial"] == winner
    assert [e["action"] for e in events if e["type"] == J.DECISION and e["kind"] == "replan"] == ["stop"]


def test_on_late_is_checked_before_anything_starts(tmp_path, cli):
    spec_path, _ = _job(tmp_path)
    result = cli(
        "run",
        str(spec_path),
        "--plan",
        str(tmp_path / "plan.json"),
        "--on-late",
        "later",
        "--yes",
        env=cli_env(tmp_path),
    )
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1].startswith("rubberband: error: --on-late 'later': use 'finish'")
    assert not (tmp_path / "runs").exists()
