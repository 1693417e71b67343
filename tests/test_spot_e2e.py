"""The executor keeps the deadline on spot, end to end with real parts: ``rubberband run`` in a subprocess, real
local Ray nodes (standing in for the cloud instances' boots on AWS / GCP), the real trial runtime.

* **AWS** (moto server): a spot worker gets an interruption notice, served by a local metadata endpoint (IMDSv2)
  to its watcher, mid-stage: the executor requests the replacement at once — in the market the slack allows —
  the trials stop right after their next checkpoint and resume from it on the replacement, and the noticed
  instance is released before the cloud takes it.
* **GCP** (GCE fake): a SPOT VM is preempted mid-stage (no notice): the replacement is a STANDARD VM when the slack
  is short, and the trials resume from their checkpoints on it.
* **local**: a spot "instance" (a local Ray node) is preempted by killing its node by pid: with a short
  deadline its replacement is on-demand and the trials resume from their checkpoints.

On the clouds the slack at the loss depends on how quickly this machine boots the stand-in nodes (a loaded machine
leaves none, a quick one some), so those two accept either market as long as it is the one the policy's journaled
figures give; the local run's spot margin (20 s, from its spec) puts the threshold between the slack at the start and
the slack at the loss on any machine, and requires on-demand.

A generous deadline keeps a replacement on spot: tests/test_cloud_spot.py (AWS) runs that case.
Each run costs 30–60 s on an idle 2-core machine (head, victim node and replacement start one after another).
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from cli_harness import played_argv
from cloud_helpers import REGION, ec2_faults, moto_env, moto_server  # noqa: F401  (fixtures)
from executor_helpers import (
    checkpointed_instance,
    cli_env,
    lose_node_once_checkpointed,
    make_plan,
    once_time_left_is_below,
    run_pids,
    wait_for_events,
    write_job,
)
from gce_fake import gce_fake  # noqa: F401  (fixture)
from test_cloud_cli import Offer, cloud_env, cloud_job, cloud_plan, moto_instances
from test_spot_fallback import Metadata

from rubberband.cloud.gcp import PREEMPTED_OPERATION
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


def test_local_spot_node_killed_with_short_slack_is_replaced_on_demand(tmp_path):
    """Local backend: the spot node running the trials is killed (by its pid) after a checkpoint, once less than
    the spec's 20 s spot margin is left to the 90 s deadline: the slack cannot cover another restart, so the
    replacement is on-demand, of the plan's fall-back type (a cheaper 2-worker type in this test's catalog), and
    the trials resume on it.

    The outcome does not depend on this machine's pace: at the first request the slack is the deadline less the
    time the run took to get there (the head's start), the plan's 10 s and one restart (a node's start-up), well
    above the margin even on a loaded machine (spot); at the loss the time left alone is below it (on-demand).
    With a 60 s deadline a loaded CI machine once left no more than the margin at the first request, which went
    on-demand. The trials' 35 epochs of 2 s (70 s) start once the head and the node are up, so they are still
    running at the loss, 70 s into the run (as 20 epochs were at 40 s with the 60 s deadline)."""
    spec_path = write_job(tmp_path / "job", trials=2, eta=3, min_epochs=35, max_epochs=35, epoch_s=2.0)
    data = json.loads(spec_path.read_text())
    data.setdefault("resources", {})["spot_margin_s"] = "20s"
    spec_path.write_text(json.dumps(data))
    from rubberband.spec import load_spec

    catalogs = tmp_path / "catalogs"
    catalogs.mkdir()
    local_csv = Path(__file__).resolve().parents[1] / "rubberband" / "catalogs" / "local.csv"
    (catalogs / "local.csv").write_text(local_csv.read_text() + "local.cpu2b,,0,2,4,,0.08,0.03,local,local-a\n")
    plan = make_plan(load_spec(spec_path), [("local.cpu2", 1, 1)], durations=[10.0])
    plan = plan.model_copy(
        update={"stages": [s.model_copy(update={"fallback_instance_type": "local.cpu2b"}) for s in plan.stages]}
    )
    plan_path = tmp_path / "plan.json"
    write_plan(plan, plan_path)
    _spot(plan_path)
    run_dir = tmp_path / "run"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "rubberband",
            "run",
            str(spec_path),
            "--plan",
            str(plan_path),
            "--run-dir",
            str(run_dir),
            "--yes",
            "--deadline",
            "90s",
            "--overrun",
            "none",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**cli_env(tmp_path), "RUBBERBAND_CATALOG_DIR": str(catalogs)},
    )
    victim, out, err = lose_node_once_checkpointed(proc, run_dir, timeout_s=150, victim_of=once_time_left_is_below(20))
    assert proc.returncode in (0, 4), err[-3000:]  # met or late: the point is that it finished
    events = _events(run_dir)
    (first,) = [e for e in events if e["type"] == J.INSTANCE_REQUESTED and e["id"] == victim]
    assert first["spot"] is True and first["price_hr"] == pytest.approx(0.04)
    replacement = _check_replaced_and_resumed(events, victim, trigger="lost")
    assert replacement["instance_type"] == "local.cpu2b" and replacement["price_hr"] == pytest.approx(0.08)
    assert not replacement["spot"]  # billed on-demand, at the fall-back type's price
    summary = json.loads((run_dir / "result.json").read_text())
    assert summary["status"] == "finished" and summary["instances_lost"] == 1
    assert run_pids(run_dir) == []


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
    assert moto_instances() == []


def test_gcp_preempted_spot_vm_is_replaced_in_the_market_the_slack_allows(tmp_path, gce_fake):
    """GCE fake: the SPOT VM running the trial is preempted (compute.instances.preempted, VM deleted) after a
    checkpoint; with a 90 s deadline (enough for spot at the start; for another restart by then only on a quick
    machine) the replacement is a STANDARD VM when the slack is short, else SPOT, and the trial resumes from its
    checkpoint."""
    spec = cloud_job(tmp_path, ["gcp"], trials=1, eta=3, min_epochs=3, max_epochs=3, epoch_s=2.0)
    _with_startup_profile(spec, "gcp", [10.0, 12.0, 14.0])
    plan_path = cloud_plan(
        tmp_path, spec, Offer("gcp", "us-central1", "n1-standard-8+T4x4"), counts=(1,), durations=(20.0,)
    )
    _spot(plan_path)
    env = cloud_env(tmp_path)
    env["RUBBERBAND_GCE_ENDPOINT"] = gce_fake.url
    run_dir = tmp_path / "run"
    proc = subprocess.Popen(
        played_argv(
            "run",
            spec,
            "--cloud",
            "gcp",
            "--head",
            "local",
            "--plan",
            plan_path,
            "--yes",
            "--run-dir",
            run_dir,
            "--deadline",
            "90s",
            "--overrun",
            "none",
        ),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    victim, out, err = lose_node_once_checkpointed(proc, run_dir, before_kill=gce_fake.preempt)
    assert proc.returncode in (0, 4), err[-3000:]
    events = _events(run_dir)
    # Compute Engine's compute.instances.preempted operation makes the loss a spot interruption, not just a lost VM
    preempted = [o for o in gce_fake.operations.values() if o["operationType"] == PREEMPTED_OPERATION]
    assert [o["targetLink"].rsplit("/", 1)[-1] for o in preempted] == [victim]
    (lost,) = [e for e in events if e["type"] == J.INSTANCE_LOST]
    assert lost["id"] == victim and lost["reason"] == "spot-interruption"
    replacement = _check_replaced_and_resumed(events, victim, trigger="preemption", on_demand=None)
    models = [i["scheduling"]["provisioningModel"] for i in gce_fake.inserted()]
    assert models == ["SPOT", "SPOT" if replacement["spot"] else "STANDARD"]
    assert _finished(run_dir, out)["instances_lost"] == 1
    assert not gce_fake.instances and not gce_fake.firewalls and not gce_fake.routers
