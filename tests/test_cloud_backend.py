"""CloudBackend: the executor's view of a cloud run (head handle, failover, join, head never listed)."""

from __future__ import annotations

import base64

import boto3
import pytest
from cloud_helpers import REGION, cloud_catalog, ec2_faults, moto_env, moto_server  # noqa: F401

from rubberband.cloud.backend import CloudBackend
from rubberband.cloud.head import HeadBoot, provision_head
from rubberband.cloud.provider import InstanceRequest
from rubberband.cloud.registry import ProviderPool
from rubberband.cloud.teardown import terminate_run
from rubberband.errors import CloudError

CATALOG = cloud_catalog()
P3 = CATALOG.find("p3.2xlarge", region=REGION)
P3_8 = CATALOG.find("p3.8xlarge", region=REGION)


def user_data(instance_id: str) -> str:
    value = boto3.client("ec2", region_name=REGION).describe_instance_attribute(
        InstanceId=instance_id, Attribute="userData"
    )["UserData"]["Value"]
    return base64.b64decode(value).decode()


def test_backend_provisions_workers_that_join_this_head(moto_env, ec2_faults):
    pool = ProviderPool({"aws": {"poll_s": 0.01}})
    provider = pool("aws", REGION)
    head = provision_head(provider, "run-b", REGION, P3.zones, HeadBoot(timeout_s=10))
    joined: list[str] = []
    backend = CloudBackend(pool, head, alternatives=lambda itype: [P3_8], join_check=lambda i, t: joined.append(i.id))
    handle = backend.start_head("run-b")
    assert handle.address == f"{head.address}:6379" and handle.pid is None and backend.stop_head() is False

    ec2_faults.capacity, ec2_faults.capacity_types = {"*"}, {"p3.2xlarge"}
    (worker,) = backend.provision(InstanceRequest("run-b", 0, P3))
    assert worker.instance_type == "p3.8xlarge" and worker.role == "worker" and joined == [worker.id]
    assert [(a.instance_type, a.outcome) for a in backend.attempts] == [
        ("p3.2xlarge", "capacity"),
        ("p3.2xlarge", "capacity"),
        ("p3.8xlarge", "ok"),
    ]
    script = user_data(worker.id)
    assert f"RB_HEAD={head.address}:6379" in script and "--num-gpus=4" in script  # rendered for the type used

    assert [i.id for i in backend.list("run-b")] == [worker.id]  # the head is never offered for termination
    backend.terminate([head.id, worker.id])
    assert [i.id for i in provider.list("run-b")] == [head.id]
    assert terminate_run(provider, "run-b", timeout_s=10)[0].id == head.id


def test_backend_terminates_a_worker_that_never_joins(moto_env):
    pool = ProviderPool({"aws": {"poll_s": 0.01}})
    provider = pool("aws", REGION)
    head = provision_head(provider, "run-c", REGION, P3.zones, HeadBoot(timeout_s=10))

    def never(instance, timeout_s):
        raise CloudError(f"{instance.id} did not join", kind="transient", code="JoinTimeout")

    backend = CloudBackend(pool, head, join_check=never)
    with pytest.raises(CloudError, match="did not join"):
        backend.provision(InstanceRequest("run-c", 0, P3, count=2))
    assert [i.id for i in provider.list("run-c")] == [head.id]  # both workers were terminated
    with pytest.raises(CloudError, match="belongs to run run-c"):
        backend.start_head("run-x")
    terminate_run(provider, "run-c", timeout_s=10)
    assert provider.list() == []


def test_a_worker_whose_boot_failed_stops_the_run_with_its_console_line(moto_env):
    """A boot that failed (here: the image lacks the client's Python) is read from the instance's console:
    one fatal error with the script's reason, the instance terminated; no other zone or type is tried."""
    pool = ProviderPool({"aws": {"poll_s": 0.01}})
    provider = pool("aws", REGION)
    head = provision_head(provider, "run-f", REGION, P3.zones, HeadBoot(timeout_s=10))
    assert isinstance(provider.console_output(head.id), str)  # moto serves EC2's GetConsoleOutput
    console = (
        "cloud-init: running user-data\nrubberband-boot: 00:01:02 booting a worker of run run-f\n"
        "rubberband-boot: FAILED: this image has no Python 3.11, the version of the rubberband CLI\n"
    )
    provider.console_output = lambda instance_id, lines=20: console

    def never(instance, timeout_s):
        raise CloudError(f"{instance.id} did not join", kind="transient", code="JoinTimeout")

    backend = CloudBackend(pool, head, alternatives=lambda itype: [P3_8], join_check=never)
    with pytest.raises(CloudError, match="failed to boot: .*FAILED: this image has no Python 3.11") as caught:
        backend.provision(InstanceRequest("run-f", 0, P3))
    assert caught.value.kind == "fatal" and caught.value.code == "BootFailed"
    assert [a.instance_type for a in backend.attempts] == ["p3.2xlarge"]  # not retried elsewhere
    assert [i.id for i in provider.list("run-f")] == [head.id]
    terminate_run(provider, "run-f", timeout_s=10)


def test_the_cli_stops_waiting_for_a_head_whose_boot_failed(moto_env, monkeypatch):
    """While the head's job server does not answer, the CLI reads the head's console: a failed boot ends the
    wait at once with the script's reason (instead of after the 20-minute boot timeout)."""
    from rubberband.cloud import head_session
    from rubberband.cloud.aws.provider import AwsProvider
    from rubberband.cloud.head_link import DirectLink
    from rubberband.cloud.head_session import HeadRecord, HeadSession

    provider = ProviderPool({"aws": {"poll_s": 0.01}})("aws", REGION)
    head = provision_head(provider, "run-h", REGION, P3.zones, HeadBoot(timeout_s=10))
    record = HeadRecord(
        run_id="run-h",
        cloud="aws",
        region=REGION,
        instance_id=head.id,
        zone=head.zone,
        address=head.address,
        public_address=None,
        regions=[REGION],
        metric="loss",
    )
    monkeypatch.setattr(head_session, "CONSOLE_CHECK_S", 0.0)
    monkeypatch.setattr(
        AwsProvider,
        "console_output",
        lambda self, instance_id, lines=20: (
            "rubberband-boot: FAILED: Ray 2.9.3 is installed here but the CLI runs Ray 2.60.0\n"
        ),
    )
    try:
        with pytest.raises(CloudError, match="failed to boot: .*Ray 2.9.3 is installed here") as caught:
            with HeadSession(record, DirectLink("http://127.0.0.1:9"), connect_timeout_s=60):
                pass
        assert caught.value.kind == "fatal"
    finally:
        terminate_run(provider, "run-h", timeout_s=10)


def test_lifetime_caps_come_from_the_plan_and_the_cloud_enforces_them(moto_env):
    """deadline + overrun + grace (+ a boot margin) caps every node; a worker gets what is left of the run's cap
    when it is requested, in its script (shutdown +N) and, on AWS, an instance-initiated shutdown terminates it."""
    from rubberband.cloud.backend import MIN_WORKER_LIFETIME_S
    from rubberband.cloud.bootstrap import LIFETIME_MARGIN_S, MAX_LIFETIME_CEILING_S, lifetime_cap_s

    assert lifetime_cap_s(3600, 600, 300) == 3600 + 600 + 300 + LIFETIME_MARGIN_S
    assert lifetime_cap_s(3600, float("inf"), 300) == MAX_LIFETIME_CEILING_S  # --overrun none: the ceiling only
    assert lifetime_cap_s(None) == MAX_LIFETIME_CEILING_S and lifetime_cap_s(1e9) == MAX_LIFETIME_CEILING_S

    pool = ProviderPool({"aws": {"poll_s": 0.01}})
    provider = pool("aws", REGION)
    head = provision_head(provider, "run-l", REGION, P3.zones, HeadBoot(timeout_s=10))
    now = [1000.0]
    backend = CloudBackend(pool, head, join_check=lambda i, t: None, expires_at=1000.0 + 7200, clock=lambda: now[0])
    assert backend.worker_lifetime_s() == 7200
    now[0] += 3600
    (worker,) = backend.provision(InstanceRequest("run-l", 0, P3))
    assert "shutdown -h +60 || true" in user_data(worker.id)  # what was left: 3600 s
    now[0] += 7200
    assert backend.worker_lifetime_s() == MIN_WORKER_LIFETIME_S  # past the cap: a late request still boots
    ec2 = boto3.client("ec2", region_name=REGION)
    for instance in (head.id, worker.id):
        behaviour = ec2.describe_instance_attribute(InstanceId=instance, Attribute="instanceInitiatedShutdownBehavior")
        assert behaviour["InstanceInitiatedShutdownBehavior"]["Value"] == "terminate"
    terminate_run(provider, "run-l", timeout_s=10)


def test_every_backend_the_executor_is_given_implements_the_whole_contract(tmp_path):
    """The executor calls every :class:`ExecutorBackend` member directly (no probing): the local provider, both
    cloud backends and the tests' stand-in have them all (names here; signatures: mypy in .ci/typecheck)."""
    from executor_helpers import LosingBackend

    from rubberband.cloud.backend import ExecutorBackend
    from rubberband.cloud.head_run import OnHeadCloudBackend
    from rubberband.cloud.local.provider import LocalProvider
    from rubberband.cloud.local_head import LocalHeadCloudBackend
    from rubberband.cloud.provider import Instance

    head = Instance(
        id="i-head",
        cloud="aws",
        instance_type="m5.large",
        zone="us-east-1a",
        state="running",
        run_id="",
        address="10.0.0.1",
    )
    backends = [
        LocalProvider(tmp_path / "l"),
        LosingBackend(),
        LocalHeadCloudBackend(cloud="aws", run_dir=tmp_path / "c", regions=[REGION], catalog=CATALOG),
        OnHeadCloudBackend(cloud="aws", run_dir=tmp_path / "h", regions=[REGION], catalog=CATALOG, head_instance=head),
    ]
    for backend in backends:
        assert isinstance(backend, ExecutorBackend), type(backend).__name__
    local = backends[0]
    assert (local.ray_auth_mode, local.device_policy, local.obtained("n1"), local.runtime_env(str(tmp_path))) == (
        "token",
        None,
        None,
        None,
    )
    assert not local.unavailable(CATALOG.find("p3.2xlarge", region=REGION), spot=True)
    assert not isinstance(object(), ExecutorBackend)


def test_cloud_capabilities_are_declared_by_a_protocol_and_the_local_provider_falls_back(tmp_path):
    # what only a real cloud answers (describe, console, permission probe, run-level resources) is asked through
    # one declared protocol per capability, never by probing for attributes (AWS and GCP implement them all:
    # CloudProvider, checked by mypy in tests/contracts_typecheck.py); the local provider has none and falls back
    from rubberband.cloud import provider as P
    from rubberband.cloud.backend import boot_report
    from rubberband.cloud.bootstrap import BOOT_FAILED
    from rubberband.cloud.local.provider import LocalProvider
    from rubberband.cloud.teardown import cleanup_leftovers

    local = LocalProvider(tmp_path)
    assert not any(
        isinstance(local, c)
        for c in (
            P.DescribesInstances,
            P.ReadsConsoles,
            P.ProbesPermissions,
            P.CleansUpRuns,
            P.FindsLeftoverRuns,
            P.CloudProvider,
        )
    )
    assert boot_report(local, "n1") == "" and cleanup_leftovers(local) == []

    class Console:
        def console_output(self, instance_id, *, lines=20):
            return f"booting\n{BOOT_FAILED} pip install\nmore\nlines\nafter\nit\n"

    assert isinstance(Console(), P.ReadsConsoles)
    assert boot_report(Console(), "n1") == f"booting | {BOOT_FAILED} pip install"  # the failure line, not the tail
