"""No credential ever reaches user-data, startup scripts, logs, reports or error messages."""

from __future__ import annotations

import base64
import logging

import boto3
import pytest
from cloud_helpers import (
    FAKE_ACCESS_KEY,
    FAKE_SECRET_KEY,
    REGION,
    ec2_faults,  # noqa: F401
    cloud_catalog,
    make_plan,
    moto_ami,
    moto_env,  # noqa: F401
    moto_server,  # noqa: F401
)
from gce_fake import gce_fake  # noqa: F401
from rich.console import Console

from rubberband.cloud.aws.boot import AWS_BOOT
from rubberband.cloud.gcp.boot import GCP_BOOT
from rubberband.cloud.aws.provider import AwsProvider
from rubberband.cloud.dryrun import dry_run, render_dry_run
from rubberband.cloud.failover import CallContext, classify, provision_with_failover
from rubberband.cloud.gcp.provider import GcpProvider
from rubberband.cloud.head import HeadBoot, provision_head, self_terminate, worker_startup_script
from rubberband.cloud.provider import InstanceRequest
from rubberband.cloud.teardown import terminate_run
from rubberband.errors import CloudError


def test_fake_keys_never_leave_the_credential_chain(moto_env, ec2_faults, gce_fake, caplog):
    caplog.set_level(logging.INFO)
    caplog.set_level(logging.DEBUG, logger="rubberband")
    outputs: list[str] = []
    catalog = cloud_catalog()
    g4 = catalog.find("g4dn.xlarge", region=REGION)
    aws = AwsProvider(REGION, image_id=moto_ami(), poll_s=0.01)

    head = provision_head(aws, "run-z", REGION, g4.zones, HeadBoot(timeout_s=10))
    script = worker_startup_script(AWS_BOOT, "run-z", head, g4)
    workers = aws.provision(InstanceRequest("run-z", 0, g4, count=2, startup_script=script))
    ec2 = boto3.client("ec2", region_name=REGION)
    for inst in [head, *workers]:
        value = ec2.describe_instance_attribute(InstanceId=inst.id, Attribute="userData")["UserData"]["Value"]
        outputs.append(base64.b64decode(value).decode())
    assert "ray.scripts.scripts start --head" in outputs[0] and "RB_HEAD=" in outputs[1]
    outputs += [repr(i) for i in aws.list("run-z")]  # what a journal would record

    ec2_faults.capacity = {"*"}
    with pytest.raises(CloudError) as capacity:
        provision_with_failover(InstanceRequest("run-z", 1, g4), lambda t: aws)
    outputs.append(capacity.value.message)
    ec2_faults.capacity = set()
    self_terminate(aws, "run-z", head.id, shutdown=lambda: None)
    terminate_run(aws, "run-z", timeout_s=10)

    report = dry_run(make_plan("aws", REGION, "g4dn.xlarge"), lambda c, r: aws, catalog=catalog)
    console = Console(record=True, width=200)
    console.print(render_dry_run(report))
    outputs.append(console.export_text())

    gcp = GcpProvider("us-central1", endpoint=gce_fake.url, poll_s=0.01)
    v100 = catalog.find("n1-standard-8+V100x1")
    gcp_head = provision_head(gcp, "run-z", "us-central1", v100.zones, HeadBoot(timeout_s=10))
    gcp.provision(
        InstanceRequest("run-z", 0, v100, startup_script=worker_startup_script(GCP_BOOT, "run-z", gcp_head, v100))
    )
    terminate_run(gcp, "run-z")
    outputs += gce_fake.bodies
    assert any("startup-script" in body for body in gce_fake.bodies)

    outputs += [record.getMessage() for record in caplog.records]
    everything = "\n".join(outputs)
    assert FAKE_ACCESS_KEY not in everything and FAKE_SECRET_KEY not in everything
    assert not [i for i in aws.list()] and not gce_fake.instances


def test_provider_messages_are_redacted():
    err = classify(
        "SignatureDoesNotMatch",
        f"Credential={FAKE_ACCESS_KEY}/20261121/us-east-1/ec2",
        CallContext("aws", region=REGION),
    )
    assert FAKE_ACCESS_KEY not in err.message and "[redacted]" in err.message and err.kind == "fatal"
