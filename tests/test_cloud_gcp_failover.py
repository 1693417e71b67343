"""A GCP capacity error in the middle of a run: `rubberband run --cloud gcp --head local` against the GCE fake,
instance boots played by local Ray nodes. The first n1-standard-8 VM boots and stage 0 trains on it; every later
n1-standard-8 insert ends in ZONE_RESOURCE_POOL_EXHAUSTED (Compute Engine's stockout, reported in the insert's
operation). Stage 1's extra instance fails over to the stand-in type (n1-standard-16+T4x4: same T4 ×4), the journal
and the bill say so, and the remaining stages are re-planned onto it at once — as the AWS test has it
(tests/test_cloud_spot.py); the first VM, still held, keeps serving them (a sold-out type cannot be bought again). About 60 s on an idle 2-core machine (Ray head and two stand-in nodes).

It found a deadlock: a trial on an instance kept across the re-plan asked Ray for what a worker of the *new*
stage's type has (4 CPUs per GPU instead of 2), and warm workers of the old shape held the node's CPUs."""

from __future__ import annotations

import json

import pytest
from cloud_helpers import GCP_CATALOG_CSV
from executor_helpers import run_pids
from gce_fake import gce_fake  # noqa: F401  (fixture)
from test_cloud_cli import Offer, cloud_env, cloud_job, cloud_plan

from rubberband.executor import journal as J

#: The test catalog plus a bigger host, so that n1-standard-8+T4x4 has a stand-in (n1-standard-16+T4x4).
CATALOG_WITH_STAND_IN = GCP_CATALOG_CSV + "n1-standard-16,16,60,,,,us-central1,us-central1-a,0.76,0.19\n"


@pytest.mark.e2e
@pytest.mark.timeout(600)
def test_gcp_stockout_mid_run_fails_over_and_replans(cli, tmp_path, gce_fake):
    gce_fake.stock = {"n1-standard-8": 1}  # the first VM of it boots; after that it is sold out in every zone
    spec = cloud_job(tmp_path, ["gcp"], trials=9, eta=3, min_epochs=1, max_epochs=9, epoch_s=0.1)
    plan = cloud_plan(
        tmp_path,
        spec,
        Offer("gcp", "us-central1", "n1-standard-8+T4x4"),
        counts=(1, 2, 1),
        durations=(20.0, 20.0, 20.0),
    )
    env = cloud_env(tmp_path)
    (tmp_path / "catalogs" / "gcp.csv").write_text(CATALOG_WITH_STAND_IN)
    env["RUBBERBAND_GCE_ENDPOINT"] = gce_fake.url
    run_dir = tmp_path / "run"
    result = cli(
        "run",
        spec,
        "--cloud",
        "gcp",
        "--head",
        "local",
        "--plan",
        plan,
        "--yes",
        "--run-dir",
        run_dir,
        env=env,
        timeout=300,
        test_boot="local",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    events = list(J.iter_events(run_dir / J.JOURNAL_NAME))
    # the stockout came in the middle of the run: after stage 0's trials had started on the first VM
    assert [m for _, m in gce_fake.inserts][:2] == ["n1-standard-8", "n1-standard-8"]
    assert "n1-standard-16" in [m for _, m in gce_fake.inserts]
    failovers = [e for e in events if e["type"] == J.DECISION and e.get("kind") == "failover"]
    assert failovers and failovers[0]["requested"] == "n1-standard-8+T4x4"
    assert failovers[0]["obtained"] == "n1-standard-16+T4x4"
    first_trial = next(i for i, e in enumerate(events) if e["type"] == J.TRIAL_STARTED)
    assert events.index(failovers[0]) > first_trial
    requested = [e for e in events if e["type"] == J.INSTANCE_REQUESTED]
    stand_in = [e for e in requested if e["instance_type"] == "n1-standard-16+T4x4"]
    assert stand_in and stand_in[0]["requested_type"] == "n1-standard-8+T4x4"
    assert stand_in[0]["price_hr"] == pytest.approx(0.76 + 1.40)
    # re-planned once the stockout is known (stage 1's extra VM is requested ahead of it, while stage 0 trains):
    # the rest of the run goes on the stand-in. That may come before the stand-in is up (and its failover decision
    # journaled): the stockout itself is what the re-plan reacts to.
    (replan,) = [
        e for e in events if e["type"] == J.DECISION and e.get("kind") == "replan" and e.get("trigger") == "failover"
    ]
    assert replan["accepted"] and replan["stage"] in (1, 2) and events.index(replan) > first_trial
    assert replan["unavailable"] == ["gcp:us-central1:n1-standard-8+T4x4"]
    (changed,) = [e for e in events if e["type"] == J.PLAN_CHANGED]
    assert [s["instance_type"] for s in changed["plan"]["stages"][replan["stage"] :]] == ["n1-standard-16+T4x4"] * (
        3 - replan["stage"]
    )
    summary = json.loads((run_dir / "result.json").read_text())
    assert summary["status"] == "finished" and summary["best"]["trial_id"]
    billed = {i["instance_type"] for i in summary["instances"]}
    assert billed == {"n1-standard-8+T4x4", "n1-standard-16+T4x4"}
    # nothing left: every VM and firewall rule deleted, no local Ray process
    assert any(r.startswith("POST") and r.endswith("/routers") for r in gce_fake.requests)  # workers' NAT
    assert not gce_fake.instances and not gce_fake.firewalls and not gce_fake.routers
    assert run_pids(run_dir) == []
