"""Teardown: SIGTERM mid-run and a deadline breach both end with every instance of the run gone.

SIGTERM runs the real CLI on real Ray nodes (~20-30 s: the Ray head and a node must start before there is
anything to tear down: what only real processes prove); the deadline tests run the executor on virtual time
(tests/sim_helpers.py), where the journal and the simulated cloud say what was left.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time

import pytest
from executor_helpers import cli_env, make_plan, run_pids, write_job
from sim_helpers import START, SimCase, cpu_model

from rubberband.executor import journal as J
from rubberband.executor.progress import Progress
from rubberband.executor.run import Settings
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


def test_a_deadline_breach_stops_the_run_and_its_instances_and_resume_finishes_it(tmp_path):
    # on virtual time: 2 s epochs, a 10 s deadline with no overrun; then resumed in the same world (its cloud) with
    # no overrun limit, as the stop message says
    spec = load_spec(write_job(tmp_path / "job", epoch_s=2.0))
    plan = make_plan(spec, [("local.cpu2", 1, 1), ("local.cpu2", 1, 2)])
    case = SimCase(spec, plan, model=cpu_model(epoch_s=2.0), settings=Settings(deadline_s=10.0, overrun_s=0.0))
    run_dir, sim = tmp_path / "run", case.world()
    out = case.run(run_dir, sim=sim)
    assert out.result is not None and out.result.status == "stopped"  # with whatever partial result there is
    error = out.result.result["error"]
    assert "passed its deadline (10.0s) in stage" in error and f"--resume {run_dir} --overrun none" in error
    events = out.events
    assert events[-1]["type"] == J.RUN_STOPPED and "deadline" in events[-1]["reason"]
    summary = json.loads((run_dir / "result.json").read_text())
    assert summary["status"] == "stopped" and summary["met_deadline"] is False and summary["exit_code"] == 5
    assert all(s.ended_at is not None for s in sim.world.instances.values())  # nothing left in the cloud
    resumed = case.but(settings=Settings(deadline_s=10.0, overrun_s=float("inf"))).run(run_dir, sim=sim, resume=True)
    assert resumed.result is not None and resumed.result.status == "finished", resumed.error
    summary = json.loads((run_dir / "result.json").read_text())
    assert summary["status"] == "finished" and summary["outcome"] == "late" and summary["best"]["trial_id"]
    assert summary["met_deadline"] is False and summary["best"]["rung"]["stage"] == 1 and summary["exit_code"] == 4
    requested = {e["id"] for e in resumed.events if e["type"] == J.INSTANCE_REQUESTED}
    assert requested <= {e["id"] for e in resumed.events if e["type"] == J.INSTANCE_TERMINATED}


def test_a_late_run_goes_on_within_its_overrun_then_stops(tmp_path):
    # on virtual time (tests/sim_helpers.py): 25 s epochs, five waves of them in stage 0, on one local.cpu2 up at 4 s;
    # a wave ends 104 s in, between the deadline (100 s) and the end of its overrun (110 s)
    spec = load_spec(write_job(tmp_path / "job"))
    plan = make_plan(spec, [("local.cpu2", 1, 1), ("local.cpu2", 1, 2)])
    case = SimCase(spec, plan, model=cpu_model(epoch_s=25.0), settings=Settings(deadline_s=100.0, overrun_s=10.0))
    out = case.run(tmp_path / "run")
    assert out.result.status == "stopped"
    assert re.search(r"deadline \(1m 40s\) plus the allowed overrun \(10.0s\)", out.result.result["error"])
    (passed,) = out.of("deadline_passed")  # late but within the overrun: the run goes on, and the journal says so once
    assert passed["overrun_s"] == 10.0 and passed["elapsed_s"] >= 100.0
    finished = [e["t"] - START for e in out.of(J.TRIAL_STOPPED) if e["reason"] == "finished"]
    assert any(100.0 < t <= 110.0 for t in finished)  # trials went on finishing past the deadline...
    end = out.events[-1]
    assert end["type"] == J.RUN_STOPPED and end["t"] - START == pytest.approx(110.0, abs=0.01)  # ...until its end
    requested = {e["id"] for e in out.events if e["type"] == J.INSTANCE_REQUESTED}
    assert requested <= {e["id"] for e in out.events if e["type"] == J.INSTANCE_TERMINATED}


def test_progress_numbers_stages_as_the_plan_does_and_says_how_late_a_run_is():
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
