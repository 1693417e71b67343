"""Dry run: a plan's provisioning schedule and bill, AWS DryRun permission checks; nothing is created."""

from __future__ import annotations

import boto3
import pytest
from cloud_helpers import (
    REGION,
    cloud_catalog,
    ec2_faults,  # noqa: F401
    make_plan,
    moto_ami,
    moto_env,  # noqa: F401
    moto_server,  # noqa: F401
)
from gce_fake import gce_fake  # noqa: F401
from rich.console import Console

from rubberband.cloud.aws.provider import AwsProvider
from rubberband.cloud.dryrun import dry_run, dry_run_report, render_dry_run
from rubberband.cloud.gcp.provider import GcpProvider
from rubberband.errors import CloudError, InputError


CATALOG = cloud_catalog()


def ec2_counts() -> tuple[int, int]:
    ec2 = boto3.client("ec2", region_name=REGION)
    instances = sum(len(r["Instances"]) for r in ec2.describe_instances()["Reservations"])
    groups = [g for g in ec2.describe_security_groups()["SecurityGroups"] if g["GroupName"] != "default"]
    return instances, len(groups)


def test_aws_dry_run_schedules_bills_and_checks_without_creating(moto_env, ec2_faults):
    ami = moto_ami()
    report = dry_run(make_plan("aws", REGION, "p3.2xlarge"), lambda c, r: AwsProvider(r, image_id=ami), catalog=CATALOG)
    workers = [s for s in report.schedule if s.role == "worker"]
    assert [(s.id, s.zone, s.billed_s, s.price_hr) for s in workers] == [
        ("i0", "use1-az1", 3600, 3.06),
        ("i1", "use1-az1", 60, 3.06),
    ]
    assert workers[0].cost_usd == pytest.approx(3.06) and workers[1].cost_usd == pytest.approx(3.06 / 60)
    (head,) = [s for s in report.schedule if s.role == "head"]
    assert head.instance_type == "m6i.large" and head.release_at_s == 3600 + 600 and not head.spot
    assert report.total_usd == pytest.approx(3.06 + 3.06 / 60 + 0.096 * 4200 / 3600)
    assert report.peak_instances == 3 and report.end_s == 4200
    assert {c.action for c in report.checks} >= {
        "ec2:RunInstances",
        "ec2:CreateSecurityGroup",
        "ec2:TerminateInstances",
    }
    assert all(c.allowed for c in report.checks), report.checks
    assert ec2_faults.calls == [] and ec2_counts() == (0, 0)

    console = Console(record=True, width=160)
    console.print(render_dry_run(report))
    text = console.export_text()
    assert "Expected bill: $3.22" in text and "p3.2xlarge" in text and "DENIED" not in text


def test_aws_dry_run_names_a_denied_permission(moto_env, ec2_faults):
    ami = moto_ami()
    ec2_faults.denied = {"RunInstances"}
    plan = make_plan("aws", REGION, "g4dn.xlarge", spot=True)
    with pytest.raises(CloudError) as info:
        dry_run(plan, lambda c, r: AwsProvider(r, image_id=ami), catalog=CATALOG)
    assert info.value.kind == "fatal" and "ec2:RunInstances" in info.value.message
    assert "\n" not in info.value.message
    report = dry_run_report(plan, lambda c, r: AwsProvider(r, image_id=ami), catalog=CATALOG)
    assert [c.action for c in report.denied] == ["ec2:RunInstances"]
    assert report.schedule[1].spot and report.schedule[1].price_hr == 0.2010
    assert ec2_counts() == (0, 0)


def test_gcp_dry_run_prices_composed_types_and_creates_nothing(gce_fake):
    plan = make_plan("gcp", "us-central1", "n1-standard-8+V100x1", spot=True)
    report = dry_run(plan, lambda c, r: GcpProvider(r, endpoint=gce_fake.url), catalog=CATALOG)
    assert report.schedule[1].price_hr == pytest.approx(0.0963 + 0.992)
    assert report.schedule[0].instance_type == "e2-standard-2"
    # Compute Engine has no DryRun: projects.testIamPermissions says whether the CLI holds what a run needs
    from rubberband.cloud.gcp.identity import GCP_CLI_PERMISSIONS

    assert [c.action for c in report.checks] == list(GCP_CLI_PERMISSIONS) and all(c.allowed for c in report.checks)
    assert gce_fake.inserts == [] and not gce_fake.firewalls and not gce_fake.disks
    gce_fake.caller_permissions = set(GCP_CLI_PERMISSIONS) - {"compute.firewalls.create"}
    with pytest.raises(CloudError, match="permission missing: compute.firewalls.create"):
        dry_run(plan, lambda c, r: GcpProvider(r, endpoint=gce_fake.url), catalog=CATALOG)
    report = dry_run_report(plan, lambda c, r: GcpProvider(r, endpoint=gce_fake.url), catalog=CATALOG)
    assert [c.action for c in report.denied] == ["compute.firewalls.create"]
    # the workers' Cloud NAT (private workers by default) is checked alike
    gce_fake.caller_permissions = set(GCP_CLI_PERMISSIONS) - {"compute.routers.create", "compute.regionOperations.get"}
    report = dry_run_report(plan, lambda c, r: GcpProvider(r, endpoint=gce_fake.url), catalog=CATALOG)
    assert [c.action for c in report.denied] == ["compute.routers.create", "compute.regionOperations.get"]
    assert not gce_fake.routers


def test_the_gce_fake_tests_permissions_as_strictly_as_the_real_api(gce_fake):
    """projects.testIamPermissions refuses wildcards, names that are no permission and more than 100 at once (HTTP
    400), and answers the subset the caller holds."""
    import requests

    url = f"{gce_fake.url}/v1/projects/rubberband-test:testIamPermissions"
    for bad in (["compute.*"], ["computeinstancesdelete"], [f"compute.instances.p{i}" for i in range(101)], []):
        assert requests.post(url, json={"permissions": bad}, timeout=5).status_code == 400
    gce_fake.rejected.clear()
    gce_fake.caller_permissions = {"compute.instances.get"}
    answer = requests.post(
        url, json={"permissions": ["compute.instances.get", "compute.instances.delete"]}, timeout=5
    ).json()
    assert answer == {"permissions": ["compute.instances.get"]}


def test_dry_run_refuses_local_plans():
    with pytest.raises(InputError, match="needs a plan for aws or gcp"):
        dry_run(make_plan("local", "local", "local.cpu1"), None)
