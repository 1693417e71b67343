"""GCP VMs that end themselves end up deleted, not stopped: a VM that powers itself off is only TERMINATED on Compute
Engine — no maxRunDuration applies to it any more, and its disk, the run's firewall rules, subnetwork and NAT stay.

The node watchdog's rendered bash runs for real here, with its metadata server (tests/gce_fake.py GceMetadata) and
the GCE fake as the Compute Engine API; a ``shutdown`` that the script calls plays the guest power-off on the fake
(``GceFake.guest_poweroff``: TERMINATED), as Compute Engine would."""

from __future__ import annotations

import dataclasses
import re
import subprocess
import time

import pytest
from cloud_helpers import cloud_catalog
from gce_fake import GceFake, GceMetadata, gce_fake  # noqa: F401  (fixture)
from test_cloud_head import STUB, VERSIONS

from rubberband.cloud.aws.boot import AWS_BOOT
from rubberband.cloud.gcp.boot import GCP_BOOT
from rubberband.cloud.gcp.boot import GCP_BACKSTOP_S
from rubberband.cloud.bootstrap import BootstrapConfig, WatchdogSettings, render_node_watchdog
from rubberband.cloud.failover import RetryPolicy
from rubberband.cloud.gcp.provider import GcpProvider
from rubberband.cloud.head import WorkerBoot, head_startup_script, self_terminate, worker_startup_script
from rubberband.cloud.provider import TAG_ROLE, Instance, InstanceRequest
from rubberband.cloud.teardown import terminate_run

V100 = cloud_catalog().find("n1-standard-8+V100x1", region="us-central1")
HEAD_SA = "rb-head@rubberband-test.iam.gserviceaccount.com"
RUN = "run-n"


def _provider(fake: GceFake, **kwargs) -> GcpProvider:
    kwargs.setdefault("retry", RetryPolicy(max_tries=3, sleep=lambda s: None))
    return GcpProvider("us-central1", endpoint=fake.url, poll_s=0.01, **kwargs)


def _run(fake: GceFake) -> tuple[Instance, Instance]:
    """A run's head (with its service account) and one worker (with none), in the fake."""
    (head,) = _provider(fake, service_account=HEAD_SA).provision(
        InstanceRequest(RUN, 0, V100, extra_tags={TAG_ROLE: "head"}, max_lifetime_s=3600)
    )
    (worker,) = _provider(fake).provision(InstanceRequest(RUN, 1, V100, max_lifetime_s=3600))
    return head, worker


def _end_itself(fake: GceFake, tmp_path, name: str, role: str, *, why: str) -> list[list[str]]:
    """Run VM ``name``'s rendered node watchdog (a ``role`` node whose state says ``why`` it must end) with its
    metadata server and the fake as the API; a ``shutdown`` it calls powers the VM off as its OS would. Returns the
    stubs' calls."""
    state, runs, stubs = tmp_path / "state", tmp_path / "runs", tmp_path / "stubs"
    for path in (state, runs / RUN, stubs, tmp_path / "venv" / "bin"):
        path.mkdir(parents=True)
    log = tmp_path / "calls.log"
    (stubs / "shutdown").write_text(STUB)
    (stubs / "sleep").write_text(STUB + "/bin/sleep 0.05\n")  # the deletion's waits, really short
    (tmp_path / "venv" / "bin" / "python").write_text(STUB)
    for stub in [*stubs.iterdir(), tmp_path / "venv" / "bin" / "python"]:
        stub.chmod(0o755)
    now = int(time.time())
    (state / "booted_at").write_text(f"{now - 4000}\n")
    (state / "ready").write_text("")
    if why == "cap":
        (state / "expires_at").write_text(f"{now - 1}\n")
    elif why == "poweroff":
        (runs / RUN / "POWEROFF").write_text("")
    elif why == "failed":
        (state / "failed").write_text("")
        subprocess.run(["touch", "-d", "@" + str(now - 700), str(state / "failed")], check=True)
    metadata = GceMetadata(fake, name).start()
    try:
        script = render_node_watchdog(
            BootstrapConfig(
                run_id=RUN,
                dialect=GCP_BOOT,
                role=role,  # type: ignore[arg-type]
                head_address="10.0.0.2" if role == "worker" else None,
                head_lost_timeout_s=60,
                venv=str(tmp_path / "venv"),
                run_root=str(runs),
                state_dir=str(state),
                console=str(tmp_path / "console"),
                metadata_url=metadata.url,
                api_url=fake.url,
                watchdog=WatchdogSettings(submit_timeout_s=600),
                **VERSIONS,
            )
        )
        done = subprocess.run(
            ["bash", "-c", script],
            env={"PATH": f"{stubs}:/usr/bin:/bin", "RB_STUB_LOG": str(log)},
            capture_output=True,
            text=True,
            timeout=60,
        )
    finally:
        metadata.stop()
    assert done.returncode == 0, done.stderr
    calls = [line.split("\0")[:-1] for line in log.read_text().splitlines() if line]
    if any(c[0] == "shutdown" for c in calls) and any(n == name for _, n in fake.instances):
        fake.guest_poweroff(name)  # its OS powered it off: Compute Engine stops it
    return calls


@pytest.mark.e2e  # executes the rendered watchdog with bash
@pytest.mark.parametrize("why", ["cap", "poweroff", "failed"])
def test_a_gcp_head_that_ends_itself_is_deleted_not_stopped(gce_fake, tmp_path, why):
    """The head's node watchdog ends the head (its lifetime cap, the run watchdog's POWEROFF marker, a failed boot):
    it deletes its own VM through the Compute Engine API with its service account's token from the metadata server,
    waits until it is gone and never powers off; the token is in no log."""
    head, _ = _run(gce_fake)
    calls = _end_itself(gce_fake, tmp_path, head.id, "head", why=why)
    left = {n: i["status"] for (_, n), i in gce_fake.instances.items()}
    assert head.id not in left, f"not deleted: {left}"
    assert not [c for c in calls if c[0] == "shutdown"]
    assert ("DELETE", f"/compute/v1/projects/rubberband-test/zones/{head.zone}/instances/{head.id}", HEAD_SA) in (
        gce_fake.authorized
    )
    console = (tmp_path / "console").read_text()
    assert "deleting this VM through the Compute Engine API" in console and "ya29." not in console


@pytest.mark.e2e  # executes the rendered watchdog with bash
def test_a_gcp_worker_without_an_identity_powers_off_and_the_head_or_down_deletes_it(gce_fake, tmp_path):
    """A worker has no service account (no token: the metadata server answers 404), so its watchdog powers it off:
    Compute Engine stops it. The head's run watchdog (self_terminate) deletes the run's
    stopped workers with the rest of the run — rules, subnetwork, NAT — and so does `down` (terminate_run)."""
    head, worker = _run(gce_fake)
    calls = _end_itself(gce_fake, tmp_path, worker.id, "worker", why="cap")
    assert [c for c in calls if c[0] == "shutdown"] == [["shutdown", "-h", "now"]]
    assert gce_fake.instances[(worker.zone, worker.id)]["status"] == "TERMINATED"
    assert not gce_fake.authorized  # it asked for no token it could use
    ended = self_terminate(_provider(gce_fake), RUN, head.id, shutdown=lambda: None)
    assert [w.id for w in ended] == [worker.id] and not gce_fake.instances
    assert not gce_fake.firewalls and not gce_fake.routers and not gce_fake.subnetworks and not gce_fake.disks

    head, worker = _run(gce_fake)  # again, ended by `down` this time, both stopped
    gce_fake.guest_poweroff(worker.id)
    gce_fake.guest_poweroff(head.id)
    assert {i.id for i in terminate_run(_provider(gce_fake), RUN)} == {head.id, worker.id}
    assert not gce_fake.instances and not gce_fake.firewalls and not gce_fake.routers and not gce_fake.subnetworks


def test_gcp_power_offs_only_back_up_compute_engines_deletion():
    """On GCP Compute Engine deletes a VM at its maxRunDuration (instanceTerminationAction DELETE) and the node
    watchdog deletes it through the API; the VM's own power-offs — the lifetime cap's `shutdown +N`, its expiry, a
    failed boot's `shutdown +M` — come GCP_BACKSTOP_S later, never first (a VM that powers itself off first is stopped
    and stays). On AWS a power-off terminates the instance: no backstop."""
    head = head_startup_script(GCP_BOOT, "us-central1", RUN, WatchdogSettings(max_lifetime_s=7200))
    on = Instance(id="rb-run-n-0-abc", cloud="gcp", instance_type="", zone="us-central1-a", state="running", run_id=RUN)
    worker = worker_startup_script(GCP_BOOT, RUN, dataclasses.replace(on, address="10.0.0.2"), V100, WorkerBoot(3600))
    for script, cap in ((head, 7200), (worker, 3600)):
        (minutes,) = re.findall(r"shutdown -h \+(\d+) \|\| true\n", script)
        assert int(minutes) * 60 >= cap + GCP_BACKSTOP_S
        assert f"$(date +%s) + {int(cap + GCP_BACKSTOP_S)} ))" in script
        (failed,) = re.findall(r"shutdown -h \+(\d+) \|\| true; exit 1", script)
        assert int(failed) * 60 >= 600 + GCP_BACKSTOP_S  # after the watchdog's 10 minutes
    aws = head_startup_script(AWS_BOOT, "us-east-1", RUN, WatchdogSettings(max_lifetime_s=7200))
    assert "shutdown -h +120 || true\n" in aws and "shutdown -h +10 || true; exit 1" in aws
    assert "self_delete" not in aws and "self_delete && exit 0" in head
