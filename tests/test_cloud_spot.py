"""Spot interruptions and type failover on AWS (moto server), as the executor sees them.

* ``CloudBackend`` reports what failover obtained, which types are blocked in every zone, and which instances
  the cloud took back (``Server.SpotInstanceTermination`` → ``spot-interruption``).
* End to end through ``rubberband run --cloud aws`` with the test boot injected (``--test-boot local`` of
  tests/cli_harness.py: local Ray nodes play each instance's boot): a worker interrupted mid-run is journaled as a
  spot interruption, replaced, and its trials restart from their checkpoints (a GCP preemption, the GCE fake's
  ``compute.instances.preempted`` operation, end to end: tests/test_spot_e2e.py);
  a planned type sold out in every zone is replaced by failover's alternative, which the journal records and
  bills, and the next stage is re-planned onto it. Nothing is left in moto or on this machine.

moto has no spot interruption: the tests terminate the instance in the (in-process, threaded) moto server, set
the state reason AWS gives a reclaimed spot instance, and stop the instance's stand-in Ray node.

The runs are slow (about 40 s and 25 s on an idle 2-core machine, twice that under the shared CI load):
each local Ray node (head, stand-in instances, the replacement) starts one after another.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path

import boto3
import pytest
from cli_harness import played_argv
from cloud_helpers import AWS_CATALOG_CSV, REGION, cloud_catalog, ec2_faults, moto_env, moto_server  # noqa: F401
from executor_helpers import lose_node_once_checkpointed, run_pids
from test_cloud_cli import Offer, cloud_env, cloud_job, cloud_plan, moto_instances

from rubberband.catalog import parse_catalog
from rubberband.cloud.backend import CloudBackend
from rubberband.cloud.head import HeadBoot, provision_head
from rubberband.cloud.provider import InstanceRequest
from rubberband.cloud.registry import ProviderPool
from rubberband.cloud.teardown import terminate_run
from rubberband.executor import journal as J
from rubberband.plan import load_plan, write_plan

SPOT_CODE = "Server.SpotInstanceTermination"
#: The test catalog plus a second one-T4 type, so that a sold-out g4dn.xlarge has a stand-in.
CATALOG_WITH_STAND_IN = AWS_CATALOG_CSV + "g4dn.2xlarge,T4,1,8,32,,0.752,0.2256,us-east-1,use1-az1\n"


def interrupt_spot(instance_id: str) -> None:
    """What AWS does to a reclaimed spot instance: terminated, state reason Server.SpotInstanceTermination."""
    from moto.core import DEFAULT_ACCOUNT_ID
    from moto.ec2.models import ec2_backends
    from moto.ec2.models.instances import StateReason

    backend = ec2_backends[DEFAULT_ACCOUNT_ID][REGION]
    backend.terminate_instances([instance_id])
    backend.get_instance(instance_id).state_reason = StateReason(f"{SPOT_CODE}: Spot instance termination", SPOT_CODE)


def _events(run_dir: Path) -> list[dict]:
    return list(J.iter_events(run_dir / J.JOURNAL_NAME)) if (run_dir / J.JOURNAL_NAME).exists() else []


def _nothing_left(run_dir: Path) -> None:
    assert moto_instances() == []
    groups = boto3.client("ec2", region_name=REGION).describe_security_groups()["SecurityGroups"]
    assert [g["GroupName"] for g in groups if g["GroupName"] != "default"] == []
    assert run_pids(run_dir) == []


def test_backend_reports_obtained_types_blocked_types_and_spot_losses(moto_env, ec2_faults):
    catalog = cloud_catalog()
    p3, p3_8 = catalog.find("p3.2xlarge", region=REGION), catalog.find("p3.8xlarge", region=REGION)
    pool = ProviderPool({"aws": {"poll_s": 0.01}})
    provider = pool("aws", REGION)
    head = provision_head(provider, "run-s", REGION, p3.zones, HeadBoot(timeout_s=10))
    backend = CloudBackend(pool, head, alternatives=lambda itype: [p3_8], join_check=lambda i, t: None)
    ec2_faults.capacity, ec2_faults.capacity_types = {"*"}, {"p3.2xlarge"}
    (worker,) = backend.provision(InstanceRequest("run-s", 0, p3, spot=True))
    got = backend.obtained(worker.id)
    assert got.instance_type == p3_8 and got.zone == "use1-az1" and [a.outcome for a in got.attempts][-1] == "ok"
    # the spot request found no p3.2xlarge spot capacity in any zone (its on-demand market was never tried)
    assert backend.unavailable(p3, spot=True) and not backend.unavailable(p3, spot=False)
    assert not backend.unavailable(p3_8, spot=True)
    ec2_faults.capacity = set()
    (other,) = backend.provision(InstanceRequest("run-s", 0, p3_8))
    assert backend.check_lost([worker.id, other.id]) == {}
    interrupt_spot(worker.id)
    backend.terminate([other.id])  # terminated by a user: lost, but not a spot interruption
    assert backend.check_lost([worker.id, other.id]) == {worker.id: "spot-interruption", other.id: "lost"}
    assert terminate_run(provider, "run-s", timeout_s=10)[0].id == head.id
    assert provider.list() == []


def spot_loss_run(tmp_path: Path, offer: Offer, env: dict[str, str], take_back: Callable[[str], None]) -> Path:
    """``rubberband run --cloud CLOUD --head local``: one stage, 2 trials × 3 epochs on one spot ``offer.itype``
    (4 slots); once a trial has checkpointed, ``take_back(id)`` has the cloud reclaim its instance and its stand-in
    Ray node dies. Checks that the loss is journaled as a spot interruption, one spot replacement takes the trials,
    which restart from their checkpoints, and the run finishes with no Ray process left; returns the run
    directory."""
    # 2 s epochs: the dying stand-in's workers must not finish the stage before Ray sees the loss
    cloud = offer.cloud
    spec = cloud_job(tmp_path, [cloud], trials=2, eta=3, min_epochs=3, max_epochs=3, epoch_s=2.0)
    plan_path = cloud_plan(tmp_path, spec, offer, counts=(1,), durations=(20.0,))
    plan = load_plan(plan_path)
    write_plan(
        plan.model_copy(update={"stages": [s.model_copy(update={"spot": True}) for s in plan.stages]}), plan_path
    )
    run_dir = tmp_path / "run"
    proc = subprocess.Popen(
        played_argv(
            "run", spec, "--cloud", cloud, "--head", "local", "--plan", plan_path, "--yes", "--run-dir", run_dir
        ),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    # once a trial has checkpointed, the cloud takes its instance back and its Ray node dies
    victim, out, err = lose_node_once_checkpointed(proc, run_dir, before_kill=take_back)
    assert proc.returncode == 0, err[-3000:]
    events = _events(run_dir)
    (lost,) = [e for e in events if e["type"] == J.INSTANCE_LOST]
    assert lost["id"] == victim and lost["reason"] == "spot-interruption"
    at = events.index(lost)
    replacement = [e for e in events[at:] if e["type"] == J.INSTANCE_REQUESTED]
    assert len(replacement) == 1 and replacement[0]["spot"] and replacement[0]["id"] != victim
    restarted = [e for e in events[at:] if e["type"] == J.TRIAL_STARTED]
    assert restarted and all(
        e["instances"] == [replacement[0]["id"]] and e["from_checkpoint"] is not None for e in restarted
    )
    summary = json.loads((run_dir / "result.json").read_text())
    assert summary["status"] == "finished" and summary["instances_lost"] == 1
    assert "finished: best trial" in out
    assert run_pids(run_dir) == []
    return run_dir


def test_aws_spot_interruption_mid_run_is_replaced_and_leaves_nothing(cli, tmp_path, moto_env, ec2_faults):
    """One spot p3.8xlarge (4 slots) interrupted after a checkpoint (see :func:`spot_loss_run`)."""
    run_dir = spot_loss_run(tmp_path, Offer("aws", REGION, "p3.8xlarge"), cloud_env(tmp_path, moto_env), interrupt_spot)
    assert all(spot for _, _, spot in ec2_faults.calls) and len(ec2_faults.calls) == 2
    _nothing_left(run_dir)


def test_aws_planned_type_sold_out_everywhere_is_replaced_billed_and_replanned(cli, tmp_path, moto_env, ec2_faults):
    """g4dn.xlarge has no capacity in any zone: failover takes g4dn.2xlarge (same T4), the journal and the bill
    say so, and the plan's remaining stage moves to g4dn.2xlarge at once (re-planned after the failover; the
    instance is kept for it)."""
    ec2_faults.capacity, ec2_faults.capacity_types = {"*"}, {"g4dn.xlarge"}
    spec = cloud_job(tmp_path, ["aws"], trials=3, eta=3, min_epochs=1, max_epochs=3, epoch_s=0.2)
    plan = cloud_plan(tmp_path, spec, Offer("aws", REGION, "g4dn.xlarge"), counts=(1, 1), durations=(20.0, 20.0))
    env = cloud_env(tmp_path, moto_env)
    (tmp_path / "catalogs" / "aws.csv").write_text(CATALOG_WITH_STAND_IN)
    run_dir = tmp_path / "run"
    result = cli(
        "run",
        spec,
        "--cloud",
        "aws",
        "--head",
        "local",
        "--plan",
        plan,
        "--yes",
        "--run-dir",
        run_dir,
        env=env,
        timeout=240,
        test_boot="local",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    events = _events(run_dir)
    assert [(t, spot) for _, t, spot in ec2_faults.calls] == [("g4dn.xlarge", False), ("g4dn.2xlarge", False)]
    (requested,) = [e for e in events if e["type"] == J.INSTANCE_REQUESTED]
    assert requested["instance_type"] == "g4dn.2xlarge" and requested["requested_type"] == "g4dn.xlarge"
    assert requested["price_hr"] == pytest.approx(0.752)
    (failover,) = [e for e in events if e["type"] == J.DECISION and e.get("kind") == "failover"]
    assert failover["requested"] == "g4dn.xlarge" and failover["obtained"] == "g4dn.2xlarge"
    replans = [e for e in events if e["type"] == J.DECISION and e.get("kind") == "replan"]
    (replan,) = [e for e in replans if e.get("trigger") == "failover"]  # once: the boundary's check changes nothing
    assert not any(e["accepted"] for e in replans if e is not replan)
    assert replan["stage"] == 1 and replan["accepted"] and replan["trigger"] == "failover"
    assert replan["unavailable"] == [f"aws:{REGION}:g4dn.xlarge"]
    assert replan["substitutions"] == {"g4dn.xlarge": "g4dn.2xlarge"}
    (changed,) = [e for e in events if e["type"] == J.PLAN_CHANGED]
    assert changed["stage"] == 1 and changed["plan"]["stages"][1]["instance_type"] == "g4dn.2xlarge"
    assert J.read_state(run_dir).plan["stages"][1]["instance_type"] == "g4dn.2xlarge"  # resume continues on it
    # the one instance was kept for stage 1 (no second request) and billed at the obtained type's price
    assert any(e["type"] == J.DECISION and e.get("kind") == "keep" and e["id"] == requested["id"] for e in events)
    summary = json.loads((run_dir / "result.json").read_text())
    assert summary["status"] == "finished"
    (bill,) = summary["instances"]
    assert bill["instance_type"] == "g4dn.2xlarge" and bill["price_hr"] == pytest.approx(0.752)
    assert bill["cost_usd"] == pytest.approx(bill["billed_s"] * 0.752 / 3600)
    launched = moto_instances(states=("pending", "running", "stopping", "stopped", "shutting-down", "terminated"))
    assert {i["InstanceType"] for i in launched} == {"g4dn.2xlarge"}
    _nothing_left(run_dir)


def test_catalog_stand_in_parses():
    catalog = parse_catalog("aws", CATALOG_WITH_STAND_IN)
    assert catalog.find("g4dn.2xlarge").workers == catalog.find("g4dn.xlarge").workers == 1
