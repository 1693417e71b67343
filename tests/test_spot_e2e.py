"""The executor keeps the deadline on spot, end to end with real parts: ``rubberband run --cloud aws`` in a
subprocess against the moto server, real local Ray nodes standing in for the instances' boots, the real trial
runtime and notice watcher.

A spot worker gets an interruption notice, served by a local metadata endpoint (IMDSv2) to its watcher,
mid-stage: the executor requests the replacement at once — in the market the slack allows — the trials stop right
after their next checkpoint and resume from it on the replacement, and the noticed instance is released before
the cloud takes it. The slack at the notice depends on how quickly this machine boots the stand-in nodes (a loaded
machine leaves none, a quick one some), so the test accepts either market as long as it is the one the policy's
journaled figures give.

The policy's choices themselves (spot while the slack covers a restart, on-demand for good once it does not, a
preempted VM or a lost node replaced, the noticed instance taking nothing more) are proven on virtual time:
tests/test_spot_fallback.py; a node lost mid-stage on real Ray: tests/test_executor_spot.py; how each cloud
reports a preemption: tests/test_cloud_spot.py (AWS), tests/test_cloud_gcp.py (GCP). About 40 s on an idle
2-core machine (head, victim node and replacement start one after another).
"""

from __future__ import annotations

import json
import subprocess
import threading
from pathlib import Path

import boto3
import pytest
from cli_harness import played_argv
from cloud_helpers import REGION, ec2_faults, moto_env, moto_server  # noqa: F401  (fixtures)
from executor_helpers import checkpointed_instance, run_pids, wait_for_events
from test_cloud_cli import Offer, cloud_env, cloud_job, cloud_plan, moto_instances
from test_spot_fallback import Metadata

from rubberband.executor import journal as J
from rubberband.plan import load_plan, write_plan

pytestmark = pytest.mark.e2e


def _events(run_dir: Path) -> list[dict]:
    return list(J.iter_events(run_dir / J.JOURNAL_NAME))


def _spot(plan_path: Path) -> None:
    plan = load_plan(plan_path)
    write_plan(
        plan.model_copy(update={"stages": [s.model_copy(update={"spot": True}) for s in plan.stages]}), plan_path
    )


def _with_startup_profile(spec_path: Path, cloud: str, samples: list[float]) -> None:
    """Give the spec a profile whose start-ups on ``cloud`` are ``samples`` (a stand-in boot takes ~10-20 s): the
    first request's restart estimate is then not the planner's default cloud boot (~2 min), which no short test
    deadline could cover."""
    profile = json.loads((Path(__file__).resolve().parents[1] / "examples/profiles/quickstart_local.json").read_text())
    profile["startup"] = [{"cloud": cloud, "samples_s": samples, "source": "measured"}]
    (spec_path.parent / "profile.json").write_text(json.dumps(profile))
    data = json.loads(spec_path.read_text())
    data["profile"] = "profile.json"
    spec_path.write_text(json.dumps(data))


def _check_replaced_and_resumed(
    events: list[dict], victim: str, *, trigger: str, on_demand: bool | None = True
) -> dict:
    """The spot decision for the victim's replacement followed the policy's own figures (on-demand exactly when the
    slack no longer covers another restart), the replacement was bought in that market, and the trials resumed from
    their checkpoints on it. ``on_demand``: the market the test requires (None: whichever the slack gave — on the
    clouds the slack at the loss depends on how fast this machine boots the stand-in nodes). Returns the
    replacement's instance_requested event."""
    (decision,) = [e for e in events if e["type"] == J.DECISION and e.get("kind") == "spot"]
    assert decision["trigger"] == trigger and decision["id"] == victim, decision
    fell_back = decision["slack_s"] <= decision["margin_s"]
    assert decision["market"] == ("on_demand" if fell_back else "spot"), json.dumps(decision)
    assert on_demand is None or fell_back == on_demand, json.dumps(decision)
    at = events.index(decision)
    (replacement,) = [e for e in events[at:] if e["type"] == J.INSTANCE_REQUESTED]
    assert replacement["spot"] is (not fell_back) and replacement["id"] != victim
    (replace,) = [e for e in events if e["type"] == J.DECISION and e.get("kind") == "replace"]
    assert replace["id"] == victim and replace["spot"] is (not fell_back)
    restarted = [e for e in events[at:] if e["type"] == J.TRIAL_STARTED]
    assert restarted, "no trial restarted on the replacement"
    for again in restarted:
        assert again["instances"] == [replacement["id"]]
        assert again["from_checkpoint"] is not None and again["start_epoch"] == again["from_checkpoint"] + 1
    return replacement


def _finished(run_dir: Path, out: str) -> dict:
    summary = json.loads((run_dir / "result.json").read_text())
    assert summary["status"] == "finished", summary.get("error")
    assert "finished: best trial" in out or "best trial" in out
    assert run_pids(run_dir) == []
    return summary


def test_aws_notice_from_the_metadata_endpoint_moves_the_trials_early(tmp_path, moto_env, ec2_faults):
    """moto: one spot p3.8xlarge (4 slots, 2 trials × 4 epochs of 2 s). Once a trial has checkpointed, the local
    metadata endpoint posts the instance's interruption notice (IMDSv2). The watcher on its node sees it, the
    executor journals it and requests the replacement at once (in the market the slack allows: on-demand when the
    85 s deadline leaves none by then, as on a loaded machine; spot on a quick one), the
    trials stop after their next checkpoint and resume from it on the replacement, and the noticed instance is
    terminated as soon as its trials are off it — nothing left in moto or on this machine."""
    metadata = Metadata()
    server = threading.Thread(target=metadata.serve_forever, daemon=True)
    server.start()
    try:
        spec = cloud_job(tmp_path, ["aws"], trials=2, eta=3, min_epochs=4, max_epochs=4, epoch_s=2.0)
        _with_startup_profile(spec, "aws", [10.0, 12.0, 14.0])
        plan_path = cloud_plan(tmp_path, spec, Offer("aws", REGION, "p3.8xlarge"), counts=(1,), durations=(20.0,))
        _spot(plan_path)
        env = cloud_env(tmp_path, moto_env)
        run_dir = tmp_path / "run"
        proc = subprocess.Popen(
            played_argv(
                "run",
                spec,
                "--cloud",
                "aws",
                "--head",
                "local",
                "--plan",
                plan_path,
                "--yes",
                "--run-dir",
                run_dir,
                "--deadline",
                "85s",
                "--overrun",
                "none",
                metadata_url=metadata.url + "{instance}/",
            ),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        try:
            victim = wait_for_events(proc, run_dir, checkpointed_instance, timeout_s=150, poll_s=0.05)
            metadata.noticed.add(victim)  # AWS posts the notice two minutes ahead
            out, err = proc.communicate(timeout=200)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)
    finally:
        metadata.shutdown()
        metadata.server_close()
        server.join(timeout=5)
    assert proc.returncode in (0, 4), err[-3000:]
    assert any(line.startswith(f"GET /{victim}/latest/meta-data/spot/instance-action") for line in metadata.seen)
    events = _events(run_dir)
    (notice,) = [e for e in events if e["type"] == J.DECISION and e.get("kind") == "notice"]
    assert notice["id"] == victim and notice["cloud"] == "aws" and notice["action"] == "terminate"
    at = events.index(notice)
    replacement = _check_replaced_and_resumed(events, victim, trigger="notice", on_demand=None)
    assert events.index(replacement) > at
    # the trials stopped right after a checkpoint (whether their workers or the executor saw the notice first),
    # and nothing was placed on the noticed instance again
    stopped = [e for e in events if e["type"] == J.TRIAL_STOPPED and e["reason"] == "preempted"]
    assert {e["trial_id"] for e in stopped} == {"b0-t000", "b0-t001"}
    assert all(e["checkpoint_epoch"] is not None for e in stopped)
    first = events.index(stopped[0])
    assert not [e for e in events[first:] if e["type"] == J.TRIAL_STARTED and victim in e["instances"]]
    assert not [e for e in events if e["type"] == J.TRIAL_STOPPED and e["reason"] == "failed"]
    (gone,) = [e for e in events if e["type"] == J.INSTANCE_TERMINATED and e["id"] == victim]
    assert gone["reason"] == "preemption notice"
    # the spot worker, then its replacement in the market the policy chose
    assert [spot for _, _, spot in ec2_faults.calls] == [True, replacement["spot"]]
    _finished(run_dir, out)
    assert moto_instances() == []  # nothing left in moto: no instance, no security group
    groups = boto3.client("ec2", region_name=REGION).describe_security_groups()["SecurityGroups"]
    assert [g["GroupName"] for g in groups if g["GroupName"] != "default"] == []
