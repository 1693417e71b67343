"""Spot interruptions and type failover on AWS (moto server), as the executor sees them through its backend.

``CloudBackend`` reports what failover obtained, which types are blocked in every zone (per market), and which
instances the cloud took back (``Server.SpotInstanceTermination`` → ``spot-interruption``; a user's terminate →
``lost``). What the executor does with that is proven on virtual time (tests/test_spot_fallback.py,
tests/test_executor_replan.py, tests/test_executor_spot.py); the real runs keep one per recovery path: a node
lost mid-stage (tests/test_executor_spot.py), an AWS interruption notice through the metadata endpoint
(tests/test_spot_e2e.py) and a GCP stockout mid-run (tests/test_cloud_gcp_failover.py).

moto has no spot interruption: :func:`interrupt_spot` terminates the instance in the (in-process, threaded) moto
server and sets the state reason AWS gives a reclaimed spot instance.
"""

from __future__ import annotations

from cloud_helpers import REGION, cloud_catalog, ec2_faults, moto_env, moto_server  # noqa: F401

from rubberband.cloud.backend import CloudBackend
from rubberband.cloud.head import HeadBoot, provision_head
from rubberband.cloud.provider import InstanceRequest
from rubberband.cloud.registry import ProviderPool
from rubberband.cloud.teardown import terminate_run

SPOT_CODE = "Server.SpotInstanceTermination"


def interrupt_spot(instance_id: str) -> None:
    """What AWS does to a reclaimed spot instance: terminated, state reason Server.SpotInstanceTermination."""
    from moto.core import DEFAULT_ACCOUNT_ID
    from moto.ec2.models import ec2_backends
    from moto.ec2.models.instances import StateReason

    backend = ec2_backends[DEFAULT_ACCOUNT_ID][REGION]
    backend.terminate_instances([instance_id])
    backend.get_instance(instance_id).state_reason = StateReason(f"{SPOT_CODE}: Spot instance termination", SPOT_CODE)


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
