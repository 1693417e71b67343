"""The cloud CLI: `rubberband run --cloud aws|gcp --dry-run` and `rubberband down --cloud aws|gcp`, run as a user
would (a CLI subprocess) against the moto server and the GCE fake."""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass
from pathlib import Path

import boto3
import pytest
from cloud_helpers import (
    AWS_CATALOG_CSV,
    GCP_CATALOG_CSV,
    REGION,
    ec2_faults,  # noqa: F401
    moto_env,  # noqa: F401
    moto_server,  # noqa: F401
)
from executor_helpers import cli_env, make_plan, run_pids, wait_for_events, write_job
from gce_fake import gce_fake  # noqa: F401

from rubberband.catalog import parse_catalog
from rubberband.cloud.aws.provider import AwsProvider
from rubberband.cloud.gcp.provider import GcpProvider
from rubberband.cloud.provider import InstanceRequest
from rubberband.plan import write_plan
from rubberband.spec import load_spec

from conftest import EXAMPLES


#: The service account a GCP head runs with in the tests (the fake's IAM knows it once a test adds it).
GCP_HEAD_SA = "rb-head@rubberband-test.iam.gserviceaccount.com"


def cloud_job(tmp_path: Path, clouds: list[str], **job) -> Path:
    """A small SHA spec (9 trials, η 3 unless ``job`` says otherwise) allowed on ``clouds``."""
    spec_path = write_job(tmp_path / "job", **job)
    data = json.loads(spec_path.read_text())
    data["resources"] = {"clouds": clouds}
    spec_path.write_text(json.dumps(data))
    return spec_path


@dataclass(frozen=True)
class Offer:
    """Where a test plan's stages run: the cloud, the region and the instance type."""

    cloud: str
    region: str
    itype: str


def cloud_plan(
    tmp_path: Path,
    spec_path: Path,
    offer: Offer,
    *,
    counts: tuple[int, ...] = (3, 1),
    durations: tuple[float, ...] = (600.0, 1200.0),
) -> Path:
    """A plan of the spec with every stage on ``offer`` (``counts`` instances, ``durations`` seconds per stage; no
    timeline: the dry run schedules one instance set per stage)."""
    cloud, region, itype = offer.cloud, offer.region, offer.itype
    spec = load_spec(spec_path)
    plan = make_plan(spec, [("local.cpu1", n, 1) for n in counts], durations=list(durations[: len(counts)]))
    stages = [s.model_copy(update={"cloud": cloud, "region": region, "instance_type": itype}) for s in plan.stages]
    plan = plan.model_copy(update={"stages": stages})
    path = tmp_path / f"plan-{cloud}-{itype}-{region}.json"
    write_plan(plan, path)
    return path


def cloud_env(tmp_path: Path, base: dict[str, str] | None = None) -> dict[str, str]:
    """CLI env with the test catalogs (only us-east-1 / us-central1) and runs under tmp_path."""
    catalogs = tmp_path / "catalogs"
    catalogs.mkdir(exist_ok=True)
    (catalogs / "aws.csv").write_text(AWS_CATALOG_CSV)
    (catalogs / "gcp.csv").write_text(GCP_CATALOG_CSV)
    env = cli_env(tmp_path)
    env.update(base or {})
    env["RUBBERBAND_CATALOG_DIR"] = str(catalogs)
    return env


def moto_instances(states=("pending", "running", "stopping", "stopped")) -> list[dict]:
    ec2 = boto3.client("ec2", region_name=REGION)
    return [i for r in ec2.describe_instances()["Reservations"] for i in r["Instances"] if i["State"]["Name"] in states]


def one_error_line(result) -> str:
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr
    return lines[0]


# -- dry run ---------------------------------------------------------------------------------------


def test_aws_dry_run_prints_schedule_bill_and_checks_and_creates_nothing(cli, tmp_path, moto_env, ec2_faults):
    spec = cloud_job(tmp_path, ["aws"])
    plan = cloud_plan(tmp_path, spec, Offer("aws", REGION, "p3.2xlarge"))
    result = cli("run", spec, "--cloud", "aws", "--dry-run", "--plan", plan, env=cloud_env(tmp_path, moto_env))
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "provisioning schedule" in out and "p3.2xlarge" in out and "m6i.large" in out
    # stage 0: 3 × 600 s, stage 1: 1 × 1200 s of p3.2xlarge at $3.06/h, head m6i.large 0..1800+600 s at $0.096/h
    expected = 3.06 * (3 * 600 + 1200) / 3600 + 0.096 * 2400 / 3600
    assert f"Expected bill: ${expected:.2f}" in out
    assert "ec2:RunInstances" in out and "allowed" in out and "DENIED" not in out
    assert "nothing was created" in out
    assert ec2_faults.calls == [] and moto_instances() == []
    assert not (tmp_path / "runs").exists()


def test_aws_dry_run_plans_on_the_fly(cli, tmp_path, moto_env):
    env = cli_env(tmp_path)
    env.update(moto_env)
    env["RUBBERBAND_CATALOG_DIR"] = str(tmp_path / "no-user-catalogs")  # the shipped catalog
    result = cli("run", EXAMPLES / "quickstart.yaml", "--cloud", "aws", "--dry-run", env=env)
    assert result.returncode == 0, result.stderr
    assert "Plan for quickstart-resnet50" in result.stdout and "Expected bill" in result.stdout
    assert "ec2:RunInstances" in result.stdout
    # the plan made on the fly bills the same head the dry run schedules
    assert re.search(r"head\s+instance\s+m6i\.large", result.stdout)
    planned = re.search(r"planner's\s+mean\s+\$[\d.,]+,\s+head\s+\$([\d.]+)", result.stdout)
    scheduled = re.search(r"workers\s+\$[\d.,]+,\s+head\s+\$([\d.]+)", result.stdout)
    assert planned and scheduled and float(planned[1]) == pytest.approx(float(scheduled[1]), rel=0.03)
    assert moto_instances() == []


def test_aws_dry_run_denied_permission_is_one_line_exit_2(cli, tmp_path, moto_env, ec2_faults):
    ec2_faults.denied = {"RunInstances"}
    spec = cloud_job(tmp_path, ["aws"])
    plan = cloud_plan(tmp_path, spec, Offer("aws", REGION, "g4dn.xlarge"))
    result = cli("run", spec, "--cloud", "aws", "--dry-run", "--plan", plan, env=cloud_env(tmp_path, moto_env))
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert "ec2:RunInstances" in one_error_line(result)
    assert moto_instances() == []


def test_aws_dry_run_without_credentials_is_one_line_exit_2(cli, tmp_path, moto_env):
    spec = cloud_job(tmp_path, ["aws"])
    plan = cloud_plan(tmp_path, spec, Offer("aws", REGION, "p3.2xlarge"))
    env = cloud_env(tmp_path, moto_env)
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        env.pop(key, None)
    result = cli("run", spec, "--cloud", "aws", "--dry-run", "--plan", plan, env=env)
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert "credentials" in one_error_line(result)
    assert moto_instances() == []


@pytest.mark.parametrize("service", ["IAM", "STS", "EC2"])
def test_an_unreadable_answer_from_an_aws_api_is_one_line_exit_2(cli, tmp_path, moto_env, service):
    """A proxy's page instead of the API's XML (a real HTTP server on loopback answering every call with HTML):
    one line naming the call, exit 2, nothing created (it was a 97-line botocore traceback)."""
    import http.server
    import threading

    class Portal(http.server.BaseHTTPRequestHandler):
        def _page(self) -> None:
            body = b"<html><body>Please log in to the corporate proxy</body></html>"
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST = _page

        def log_message(self, *args) -> None:
            return None

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Portal)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        spec = cloud_job(tmp_path, ["aws"])
        plan = cloud_plan(tmp_path, spec, Offer("aws", REGION, "p3.2xlarge"))
        env = cloud_env(tmp_path, moto_env)
        env[f"AWS_ENDPOINT_URL_{service}"] = f"http://127.0.0.1:{server.server_address[1]}"
        result = cli("run", spec, "--cloud", "aws", "--dry-run", "--plan", plan, env=env)
    finally:
        server.shutdown()
        server.server_close()
    assert result.returncode == 2, (result.stdout, result.stderr)
    line = one_error_line(result)
    assert "could not be read as the API's" in line and f"{service.lower()}:" in line, line
    assert "Traceback" not in result.stderr and moto_instances() == []


@pytest.mark.parametrize("case", ["cloud-not-in-spec", "unknown-type", "unknown-region", "plan-of-other-cloud"])
def test_dry_run_bad_input_is_one_line_exit_2(cli, tmp_path, moto_env, ec2_faults, case):
    spec = cloud_job(tmp_path, ["gcp"] if case == "cloud-not-in-spec" else ["aws", "gcp"])
    itype, region, cloud = "p3.2xlarge", REGION, "aws"
    if case == "unknown-type":
        itype = "p9.imaginary"
    elif case == "unknown-region":
        region = "us-nowhere-1"
    elif case == "plan-of-other-cloud":
        cloud, region, itype = "gcp", "us-central1", "n1-standard-8"
    plan = cloud_plan(tmp_path, spec, Offer(cloud, region, itype))
    result = cli("run", spec, "--cloud", "aws", "--dry-run", "--plan", plan, env=cloud_env(tmp_path, moto_env))
    assert result.returncode == 2, (result.stdout, result.stderr)
    line = one_error_line(result)
    expected = {
        "cloud-not-in-spec": "resources.clouds",
        "unknown-type": "p9.imaginary",
        "unknown-region": "us-nowhere-1",
        "plan-of-other-cloud": "gcp",
    }[case]
    assert expected in line
    assert ec2_faults.calls == [] and moto_instances() == []


@pytest.mark.e2e
def test_gcp_dry_run_against_the_fake(cli, tmp_path, gce_fake):
    """The head's service account is checked through the IAM API (exists, the CLI may attach it, its roles grant
    every permission the head needs); one permission short is one line naming it, exit 2."""
    from rubberband.cloud.gcp.identity import GCP_HEAD_PERMISSIONS

    spec = cloud_job(tmp_path, ["gcp"])
    plan = cloud_plan(tmp_path, spec, Offer("gcp", "us-central1", "n1-standard-8+V100x1"))
    env = cloud_env(tmp_path)
    env.update({"RUBBERBAND_GCE_ENDPOINT": gce_fake.url, "COLUMNS": "250"})  # permission names unwrapped
    gce_fake.add_service_account(GCP_HEAD_SA, permissions=list(GCP_HEAD_PERMISSIONS))
    result = cli("run", spec, "--cloud", "gcp", "--dry-run", "--plan", plan, "--service-account", GCP_HEAD_SA, env=env)
    assert result.returncode == 0, result.stderr
    assert "e2-standard-2" in result.stdout and "Expected bill" in result.stdout
    # Compute Engine has no DryRun: the CLI's own rights are asked of projects.testIamPermissions
    assert "compute.instances.setServiceAccount" in result.stdout and "you (the CLI)" in result.stdout
    assert "compute.instances.delete" in result.stdout and "DENIED" not in result.stdout
    gce_fake.add_service_account(
        GCP_HEAD_SA, permissions=[p for p in GCP_HEAD_PERMISSIONS if p != "compute.instances.delete"]
    )
    short = cli("run", spec, "--cloud", "gcp", "--dry-run", "--plan", plan, "--service-account", GCP_HEAD_SA, env=env)
    assert short.returncode == 2, (short.stdout, short.stderr)
    line = one_error_line(short)
    assert "compute.instances.delete" in line and GCP_HEAD_SA in line and "docs/clouds.md" in line
    missing = cli("run", spec, "--cloud", "gcp", "--dry-run", "--plan", plan, env=env)
    assert missing.returncode == 2 and "--service-account" in one_error_line(missing)
    assert gce_fake.inserts == [] and not gce_fake.instances and not gce_fake.firewalls and not gce_fake.routers


@pytest.mark.e2e
def test_aws_dry_run_checks_a_named_instance_profile(cli, tmp_path, moto_env):
    """--instance-profile: it must exist (one line otherwise) and its role may do what the head does, simulated
    with the run's tag context; without the flag the CLI's right to create the role is simulated instead."""
    from rubberband.cloud.aws.identity import AwsIdentities

    spec = cloud_job(tmp_path, ["aws"])
    plan = cloud_plan(tmp_path, spec, Offer("aws", REGION, "g4dn.xlarge"))
    env = {**cloud_env(tmp_path, moto_env), "COLUMNS": "250"}
    absent = cli("run", spec, "--cloud", "aws", "--dry-run", "--plan", plan, "--instance-profile", "nope", env=env)
    assert absent.returncode == 2 and "no such IAM instance profile" in one_error_line(absent)
    AwsIdentities().create("dry-run", REGION)
    named = cli("run", spec, "--cloud", "aws", "--dry-run", "--plan", plan, "--instance-profile", "rb-dry-run", env=env)
    assert named.returncode == 0, named.stderr
    assert "iam:GetInstanceProfile" in named.stdout and "DENIED" not in named.stdout
    own = cli("run", spec, "--cloud", "aws", "--dry-run", "--plan", plan, env=env)
    assert own.returncode == 0 and "iam:CreateRole" in own.stdout, own.stderr
    assert moto_instances() == []


# -- down ------------------------------------------------------------------------------------------


def _launch_aws(run_id: str, count: int = 2) -> list[str]:
    provider = AwsProvider(REGION, poll_s=0.05)
    itype = parse_catalog("aws", AWS_CATALOG_CSV).find("g4dn.xlarge")
    made = provider.provision(
        InstanceRequest(run_id=run_id, stage=0, instance_type=itype, count=count, zone="use1-az1")
    )
    return [i.id for i in made]


def test_aws_down_run_terminates_its_instances_and_group(cli, tmp_path, moto_env):
    ours = _launch_aws("run-down-a")
    other = _launch_aws("run-down-b", count=1)
    result = cli("down", "run-down-a", "--cloud", "aws", env=cloud_env(tmp_path, moto_env))
    assert result.returncode == 0, result.stderr
    for instance_id in ours:
        assert f"terminated aws {instance_id}" in result.stdout
    assert "deleted aws sg-" in result.stdout and "(run run-down-a)" in result.stdout  # the run's security group
    assert [i["InstanceId"] for i in moto_instances()] == other
    again = cli("down", "run-down-a", "--cloud", "aws", "--region", REGION, env=cloud_env(tmp_path, moto_env))
    assert again.returncode == 0 and "nothing left on aws" in again.stdout


def test_aws_down_run_uses_the_journal_regions(cli, tmp_path, moto_env):
    from rubberband.executor import journal as J

    run_dir = tmp_path / "runs" / "jr-run"
    run_dir.mkdir(parents=True)
    journal = J.Journal(run_dir)
    journal.record(
        J.InstanceRequested(
            id="x", instance_type="g4dn.xlarge", cloud="aws", region=REGION, price_hr=0.526, spot=False, stage=0
        )
    )
    ids = _launch_aws("jr-run")
    env = cloud_env(tmp_path, moto_env)
    env["RUBBERBAND_CATALOG_DIR"] = str(tmp_path / "empty-catalogs")  # the shipped catalog: many regions
    result = cli("down", str(run_dir), "--cloud", "aws", env=env)
    assert result.returncode == 0, result.stderr
    assert all(f"terminated aws {i}" in result.stdout for i in ids)
    assert moto_instances() == []
    terminated = [e for e in J.iter_events(run_dir / J.JOURNAL_NAME) if e["type"] == J.INSTANCE_TERMINATED]
    assert sorted(e["id"] for e in terminated) == sorted(ids) and {e["reason"] for e in terminated} == {"down"}


def test_aws_down_all_orphans(cli, tmp_path, moto_env):
    ids = _launch_aws("run-orphan")
    env = cloud_env(tmp_path, moto_env)
    young = cli("down", "--all-orphans", "--cloud", "aws", env=env)  # default 1h: nothing that old
    assert young.returncode == 0, young.stderr
    assert "no orphaned" in young.stdout and len(moto_instances()) == 2
    time.sleep(1.1)
    result = cli("down", "--all-orphans", "--cloud", "aws", "--older-than", "1s", "--region", REGION, env=env)
    assert result.returncode == 0, result.stderr
    assert all(f"terminated aws {i}" in result.stdout for i in ids)
    assert moto_instances() == []


def test_down_flags_bad_input(cli, tmp_path):
    env = cloud_env(tmp_path)
    for args, needle in [
        (["--all-orphans"], "--cloud"),
        (["--all-orphans", "--cloud", "azure"], "azure"),
        (["--all-orphans", "--cloud", "aws", "--older-than", "soon"], "--older-than"),
        ([], "RUN_ID"),
    ]:
        result = cli("down", *args, env=env)
        assert result.returncode == 2, (args, result.stderr)
        assert needle in one_error_line(result)


def test_gcp_down_run_and_orphans_against_the_fake(cli, tmp_path, gce_fake):
    provider = GcpProvider("us-central1", endpoint=gce_fake.url)
    catalog = parse_catalog("gcp", GCP_CATALOG_CSV)
    itype = catalog.find("n1-standard-8+V100x1")
    ours = provider.provision(InstanceRequest(run_id="run-gd", stage=0, instance_type=itype, count=2))
    orphan = provider.provision(InstanceRequest(run_id="run-go", stage=0, instance_type=itype, count=1))
    env = cloud_env(tmp_path)
    env["RUBBERBAND_GCE_ENDPOINT"] = gce_fake.url
    result = cli("down", "run-gd", "--cloud", "gcp", env=env)
    assert result.returncode == 0, result.stderr
    assert all(f"terminated gcp {i.id}" in result.stdout for i in ours)
    assert [i.id for i in provider.list()] == [orphan[0].id]
    time.sleep(1.1)
    result = cli("down", "--all-orphans", "--cloud", "gcp", "--older-than", "1s", env=env)
    assert result.returncode == 0, result.stderr
    assert f"terminated gcp {orphan[0].id}" in result.stdout
    assert provider.list() == [] and not gce_fake.instances and not gce_fake.firewalls and not gce_fake.routers


# -- end to end: `rubberband run --cloud aws` against moto, instance boots played by local Ray nodes ---------------


def test_aws_run_killed_with_sigkill_then_down_leaves_nothing(cli, tmp_path, moto_env):
    """kill -9 of the executor mid-run leaves its instances billing; `rubberband down RUN_DIR --cloud aws` ends them."""
    import signal
    import subprocess

    from cli_harness import played_argv
    from rubberband.executor import journal as J

    spec = cloud_job(tmp_path, ["aws"], trials=3, eta=3, min_epochs=1, max_epochs=3, epoch_s=1.0)
    plan = cloud_plan(tmp_path, spec, Offer("aws", REGION, "g4dn.xlarge"), counts=(2, 1), durations=(20.0, 20.0))
    env = cloud_env(tmp_path, moto_env)
    run_dir = tmp_path / "run"
    proc = subprocess.Popen(
        played_argv("run", spec, "--cloud", "aws", "--head", "local", "--plan", plan, "--yes", "--run-dir", run_dir),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
    )
    try:  # kill once a trial trains on an instance
        wait_for_events(
            proc, run_dir, lambda events: any(e["type"] == J.TRIAL_STARTED for e in events), timeout_s=180, poll_s=0.2
        )
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
    left = {i["InstanceId"] for i in moto_instances()}
    assert left, "the killed executor's instances should still be running"
    _assert_the_local_head_speaks_only_the_runs_token(run_dir, tmp_path)  # the killed run's cluster is still up
    result = cli("down", str(run_dir), "--cloud", "aws", env=env)
    assert result.returncode == 0, result.stderr
    assert all(f"terminated aws {i}" in result.stdout for i in left), result.stdout
    assert moto_instances() == []
    assert not (run_dir / "ray-token").exists()  # the cluster it opened is gone
    groups = boto3.client("ec2", region_name=REGION).describe_security_groups()["SecurityGroups"]
    assert [g["GroupName"] for g in groups if g["GroupName"] != "default"] == []
    local = cli("down", str(run_dir), env=env)  # the test's stand-in Ray nodes and the CLI machine's Ray head
    assert local.returncode == 0, local.stderr
    assert run_pids(run_dir) == []


def _assert_the_local_head_speaks_only_the_runs_token(run_dir: Path, tmp_path: Path) -> None:
    """--head local runs Ray with the run's own token, like every other mode: its workers boot in token mode, and its
    head refuses a driver without the token and lets in one with it."""
    import base64
    import secrets

    from ray_clients import DRIVER, ray_client

    from rubberband.cloud.local.provider import LocalProvider

    token = run_dir / "ray-token"
    assert token.stat().st_mode & 0o777 == 0o600
    ec2 = boto3.client("ec2", region_name=REGION)
    for instance in moto_instances():
        data = ec2.describe_instance_attribute(InstanceId=instance["InstanceId"], Attribute="userData")
        script = base64.b64decode(data["UserData"]["Value"]).decode()
        assert "RAY_AUTH_MODE=token" in script and "RAY_AUTH_MODE=disabled" not in script
        assert token.read_text().strip() not in script  # the token itself never travels in user-data
    head = next(r for r in LocalProvider(run_dir).records() if r.role == "head")
    home = tmp_path / "client-home"
    home.mkdir()
    wrong = {"HOME": str(home), "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32)}
    refused = ray_client(DRIVER, head.address, wrong, timeout_s=10)
    assert not refused["ok"] and "InvalidAuthToken" in refused.get("stderr", refused["error"]), refused
    admitted = ray_client(
        DRIVER, head.address, {"HOME": str(home), "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token)}
    )
    assert admitted["ok"], admitted


def test_aws_run_that_cannot_provision_fails_and_leaves_nothing(cli, tmp_path, moto_env, ec2_faults):
    """No vCPU quota: the run fails (exit 1, one line naming the quota) with no instance, group or Ray process left."""
    ec2_faults.quota = True
    spec = cloud_job(tmp_path, ["aws"], trials=3, eta=3, min_epochs=1, max_epochs=3, epoch_s=0.2)
    plan = cloud_plan(tmp_path, spec, Offer("aws", REGION, "g4dn.xlarge"), counts=(1, 1), durations=(20.0, 20.0))
    env = cloud_env(tmp_path, moto_env)
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
        timeout=180,
        test_boot="local",
    )
    assert result.returncode == 1, (result.stdout, result.stderr[-3000:])
    assert "VcpuLimitExceeded" in result.stderr or "quota" in result.stderr.lower()
    assert ec2_faults.calls  # it did try
    assert json.loads((run_dir / "result.json").read_text())["status"] == "failed"
    assert moto_instances() == []
    groups = boto3.client("ec2", region_name=REGION).describe_security_groups()["SecurityGroups"]
    assert [g["GroupName"] for g in groups if g["GroupName"] != "default"] == []
    assert run_pids(run_dir) == []


def small_gcp_job(tmp_path: Path, gce_fake) -> tuple[Path, Path, dict[str, str]]:
    """Spec and plan of a small GCP run (3 trials; 2 stages on one n1-standard-8+V100x1 each) and the CLI env
    for the GCE fake (run it with ``test_boot="local"``: instance boots played by local Ray nodes)."""
    spec = cloud_job(tmp_path, ["gcp"], trials=3, eta=3, min_epochs=1, max_epochs=3, epoch_s=0.2)
    plan = cloud_plan(
        tmp_path, spec, Offer("gcp", "us-central1", "n1-standard-8+V100x1"), counts=(1, 1), durations=(20.0, 20.0)
    )
    env = cloud_env(tmp_path)
    env.update(
        {"RUBBERBAND_GCE_ENDPOINT": gce_fake.url, "RUBBERBAND_SERVICE_ACCOUNT": GCP_HEAD_SA}
    )  # head mode on GCP needs one; --head local ignores it
    from rubberband.cloud.gcp.identity import GCP_HEAD_PERMISSIONS

    gce_fake.add_service_account(GCP_HEAD_SA, list(GCP_HEAD_PERMISSIONS))  # and its role, which the CLI binds per run
    return spec, plan, env


def test_worker_egress_is_refused_without_a_head_instance(cli, tmp_path, gce_fake):
    """A GCP run end to end is head mode's (tests/test_cloud_headmode.py) and the stockout's
    (tests/test_cloud_gcp_failover.py); ``--worker-egress`` is for a head instance only."""
    spec, plan, env = small_gcp_job(tmp_path, gce_fake)
    flag = cli(
        "run",
        spec,
        "--cloud",
        "gcp",
        "--head",
        "local",
        "--plan",
        plan,
        "--yes",
        "--worker-egress",
        "public",
        env=env,
        test_boot="local",
    )
    assert flag.returncode == 2 and "--worker-egress is for a run on a head instance" in flag.stderr
    assert not gce_fake.requests  # refused before any call
