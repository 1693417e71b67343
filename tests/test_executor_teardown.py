"""Teardown: SIGTERM mid-run and a deadline breach both end with every instance of the run gone.

The CLI tests run the real CLI on real Ray nodes (~20-30 s: the Ray head and a node must start
before there is anything to tear down); the overrun test drives the controller's deadline check alone.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import pytest
from executor_helpers import LosingBackend, cli_env, make_plan, run_pids, write_job

from rubberband.catalog import load_catalog
from rubberband.executor import journal as J
from rubberband.executor.controller import Controller, DeadlineExceeded
from rubberband.plan import write_plan
from rubberband.spec import load_spec


def _prepare(tmp_path, epoch_s: float):
    spec_path = write_job(tmp_path / "job", epoch_s=epoch_s)
    write_plan(make_plan(load_spec(spec_path), [("local.cpu2", 1, 1), ("local.cpu2", 1, 2)]), tmp_path / "plan.json")
    return spec_path


def _check_all_terminated(run_dir):
    events = list(J.iter_events(run_dir / J.JOURNAL_NAME))
    requested = {e["id"] for e in events if e["type"] == J.INSTANCE_REQUESTED}
    terminated = {e["id"] for e in events if e["type"] == J.INSTANCE_TERMINATED}
    assert requested and requested <= terminated
    assert run_pids(run_dir) == []
    return events


@pytest.mark.e2e
def test_sigterm_mid_stage_terminates_everything(tmp_path):
    spec_path = _prepare(tmp_path, epoch_s=5.0)
    run_dir = tmp_path / "run"
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
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=cli_env(tmp_path),
    )
    try:
        deadline = time.monotonic() + 180
        while not any(e["type"] == J.TRIAL_STARTED for e in J.iter_events(run_dir / J.JOURNAL_NAME)):
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    assert "SIGTERM" in err.splitlines()[-1]
    events = _check_all_terminated(run_dir)
    assert events[-1]["type"] == J.RUN_INTERRUPTED
    assert any(e["type"] == J.TRIAL_STOPPED and e["reason"] == "interrupted" for e in events)
    assert json.loads((run_dir / "result.json").read_text())["status"] == "interrupted"


def test_a_deadline_breach_stops_the_run_and_its_instances_and_resume_finishes_it(tmp_path, cli):
    spec_path = _prepare(tmp_path, epoch_s=2.0)
    run_dir = tmp_path / "run"
    result = cli(
        "run",
        str(spec_path),
        "--plan",
        str(tmp_path / "plan.json"),
        "--run-dir",
        str(run_dir),
        "--deadline",
        "10s",
        "--overrun",
        "0",
        "--yes",
        env=cli_env(tmp_path),
    )
    assert result.returncode == 5, result.stderr  # stopped, with whatever partial result there is
    last = result.stdout.splitlines()[-1]
    assert last.startswith("outcome: stopped (exit 5): ")
    assert "passed its deadline (10.0s) in stage" in last and f"--resume {run_dir} --overrun none" in last
    events = _check_all_terminated(run_dir)
    assert events[-1]["type"] == J.RUN_STOPPED and "deadline" in events[-1]["reason"]
    summary = json.loads((run_dir / "result.json").read_text())
    assert summary["status"] == "stopped" and summary["met_deadline"] is False and summary["exit_code"] == 5
    # as the message says: resumed with no overrun limit, the late run finishes (late: exit 4)
    resumed = cli("run", "--resume", str(run_dir), "--overrun", "none", env=cli_env(tmp_path))
    assert resumed.returncode == 4, resumed.stderr[-3000:]
    summary = json.loads((run_dir / "result.json").read_text())
    assert summary["status"] == "finished" and summary["outcome"] == "late" and summary["best"]["trial_id"]
    assert summary["met_deadline"] is False and summary["best"]["rung"]["stage"] == 1
    _check_all_terminated(run_dir)


def test_a_late_run_goes_on_within_its_overrun_then_stops(tmp_path):
    spec = load_spec(write_job(tmp_path / "job"))
    plan = make_plan(spec, [("local.cpu2", 1, 1), ("local.cpu2", 1, 2)])
    run_dir = tmp_path / "run"
    J.Journal(run_dir).record(
        J.RunStarted(
            run_id="r1",
            spec_sha256=spec.sha256(),
            spec=spec.model_dump(mode="json"),
            plan=plan.model_dump(mode="json"),
            cloud="local",
            deadline_s=100.0,
        )
    )
    controller = Controller(
        spec=spec,
        plan=plan,
        catalog=load_catalog(["local"]),
        run_dir=run_dir,
        backend=LosingBackend(),
        runtime=None,
        run_id="r1",
        deadline_s=100.0,
        overrun_s=10.0,
    )
    controller.state = controller.journal.state
    controller.state.first_started_at = time.time() - 105.0
    controller._check_deadline()  # late but within the overrun: the run goes on...
    controller._check_deadline()
    passed = [
        e for e in J.iter_events(run_dir / J.JOURNAL_NAME) if e["type"] == J.DECISION and e["kind"] == "deadline_passed"
    ]
    assert len(passed) == 1 and passed[0]["overrun_s"] == 10.0  # ...and the journal says so, once
    controller.state.first_started_at = time.time() - 111.0
    with pytest.raises(DeadlineExceeded, match=r"deadline \(1m 40s\) plus the allowed overrun \(10.0s\)"):
        controller._check_deadline()
    controller._terminator.shutdown(wait=True)
    controller._provisioner.shutdown(wait=True)


def test_progress_numbers_stages_as_the_plan_does_and_says_how_late_a_run_is():
    from rubberband.executor.controller import Progress
    from rubberband.executor.progress import describe

    snapshot = dict(
        stage=4,
        stages=5,
        bracket=0,
        trials_alive=1,
        trials_pending=0,
        epochs_done=243,
        instances=1,
        spent_usd=0.0124,
        predicted_usd=0.0108,
        deadline_s=160.0,
    )
    assert describe(Progress(elapsed_s=130.0, **snapshot)).startswith("stage 4 (5 of 5, bracket 0)")
    assert describe(Progress(elapsed_s=130.0, **snapshot)).endswith("30.0s to deadline")
    assert describe(Progress(elapsed_s=172.5, **snapshot)).endswith("12.5s past the deadline")
