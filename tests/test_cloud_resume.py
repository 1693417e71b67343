"""The executor killed with SIGKILL in the middle of a cloud run (moto server; instance boots played by local Ray
nodes), then `rubberband run --resume` and `rubberband down`: the resumed run stops what the dead executor left,
finishes, loses no epoch beyond each trial's last checkpoint, and nothing is left in moto or on this machine.

Slow (about 60 s on an idle 2-core machine: two runs' Ray heads and stand-in nodes, one after another)."""

from __future__ import annotations

import json
import signal
import subprocess
import time

import boto3
import pytest
from cli_harness import played_argv
from cloud_helpers import REGION, moto_env, moto_server  # noqa: F401  (fixtures)
from executor_helpers import run_pids, wait_for_events
from test_cloud_cli import Offer, cloud_env, cloud_job, cloud_plan, moto_instances

from rubberband.executor import journal as J
from rubberband.executor.checkpoints import latest_epoch


@pytest.mark.e2e
@pytest.mark.timeout(900)
def test_sigkill_mid_run_then_resume_and_down_loses_no_checkpointed_epoch(cli, tmp_path, moto_env):
    # stage 0: 3 trials x 2 epochs on 2 instances; stage 1: the best one to 6 epochs
    spec = cloud_job(tmp_path, ["aws"], trials=3, eta=3, min_epochs=2, max_epochs=6, epoch_s=1.5)
    plan = cloud_plan(tmp_path, spec, Offer("aws", REGION, "g4dn.xlarge"), counts=(2, 1), durations=(20.0, 20.0))
    env = cloud_env(tmp_path, moto_env)
    run_dir = tmp_path / "run"
    proc = subprocess.Popen(
        played_argv("run", spec, "--cloud", "aws", "--head", "local", "--plan", plan, "--yes", "--run-dir", run_dir),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:  # kill -9 once a trial has saved a checkpoint and goes on training
        wait_for_events(
            proc, run_dir, lambda events: any(e["type"] == J.CHECKPOINT for e in events), timeout_s=400, poll_s=0.1
        )
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
    left = {i["InstanceId"] for i in moto_instances()}
    assert left, "the killed executor's instances are still running (billing) until something ends them"
    time.sleep(2.0)  # the dead driver's trial actors are gone by now: what is on disk is the last checkpoint
    state = J.read_state(run_dir)
    assert state.status == "running"  # nothing recorded the end: the executor died mid-run
    at_kill = {t: latest_epoch(run_dir / "checkpoints" / t) for t in state.trials}
    assert any(e is not None for e in at_kill.values())
    runs_before = {t: dict(trial.epoch_runs) for t, trial in state.trials.items()}
    killed_at = len(list(J.iter_events(run_dir / J.JOURNAL_NAME)))  # what the dead executor journaled

    resumed = cli(
        "run", "--resume", str(run_dir), "--cloud", "aws", "--head", "local", env=env, timeout=600, test_boot="local"
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    summary = json.loads((run_dir / "result.json").read_text())
    assert summary["status"] == "finished" and summary["best"]["trial_id"]
    events = list(J.iter_events(run_dir / J.JOURNAL_NAME))
    resumed_at = next(i for i, e in enumerate(events) if e["type"] == J.RUN_RESUMED)
    # the dead executor's instances were found by their tags and terminated before the run went on (journaled as
    # ended: "orphan" when listed one by one, "lost" when the run-wide sweep of the old head ended them)
    # (the resumed executor does so before it journals run_resumed)
    ended = {e["id"]: i for i, e in enumerate(events) if i >= killed_at and e["type"] == J.INSTANCE_TERMINATED}
    assert left <= set(ended) and all(ended[i] < resumed_at for i in left)
    # no epoch lost beyond the last checkpoint: a trial checkpointed at epoch e restarts from it, and only epochs
    # after e ran twice
    restarts = [e for e in events[resumed_at:] if e["type"] == J.TRIAL_STARTED]
    checkpointed = [e for e in restarts if at_kill.get(e["trial_id"]) is not None]
    assert checkpointed, "a trial that had checkpointed before the kill was resumed"
    first = {}
    for e in checkpointed:
        first.setdefault(e["trial_id"], e)
    for trial_id, started in first.items():
        assert started["from_checkpoint"] == at_kill[trial_id]
        assert started["start_epoch"] == at_kill[trial_id] + 1
    final = J.read_state(run_dir)
    for trial_id, trial in final.trials.items():
        repeated = [epoch for epoch, runs in trial.epoch_runs.items() if runs > 1]
        assert all(at_kill[trial_id] is None or epoch > at_kill[trial_id] for epoch in repeated), (
            trial_id,
            at_kill[trial_id],
            runs_before[trial_id],
            trial.epoch_runs,
        )
        assert sorted(trial.epochs) == list(range(len(trial.epochs)))  # no epoch missing either
    # `down` finds nothing more to end; nothing is left in moto or on this machine
    down = cli("down", str(run_dir), "--cloud", "aws", env=env)
    assert down.returncode == 0, down.stderr
    assert "nothing left on aws" in down.stdout
    assert moto_instances() == []
    groups = boto3.client("ec2", region_name=REGION).describe_security_groups()["SecurityGroups"]
    assert [g["GroupName"] for g in groups if g["GroupName"] != "default"] == []
    assert run_pids(run_dir) == []
