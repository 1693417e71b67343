"""Fixtures for cloud tests: a moto EC2 server (server mode) with fault injection, fake credentials.

Reusable by end-to-end tests that run the CLI in a subprocess: ``moto_env`` returns the
environment (``AWS_ENDPOINT_URL`` and fake keys) to pass to it. The server runs in a thread
of the test process, so patching moto's backend here injects faults into what the
subprocess sees too.

Head mode (``rubberband run --cloud aws|gcp`` run through tests/cli_harness.py with ``--test-boot local``, the
head's boot played by a local Ray head): ``no_played_head_left`` stops whatever played head a test leaves (import it into the test module: it is
autouse there), ``assert_played_head_gone`` checks a head's Ray processes and disk are gone, and
``assert_fetched_run`` checks what the CLI fetched from the head (and that ``rubberband report`` works on it).

Usage in a test module::

    from cloud_helpers import ec2_faults, moto_env, moto_server  # noqa: F401  (fixtures; tests/ is on sys.path)

    def test_something(moto_env):  # moto_env: the env dict for a CLI subprocess
        ...
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import pytest

#: Fake keys; tests grep logs and user-data for them to prove they never leak.
FAKE_ACCESS_KEY = "AKIARUBBERBANDTEST01"
FAKE_SECRET_KEY = "rbFakeSecretKeyDoNotLog0123456789abcdefgh"
REGION = "us-east-1"


@dataclass
class MotoServer:
    url: str
    iam: "IamSimulator | None" = None  # what iam:SimulatePrincipalPolicy answers (set by moto_env)

    def reset(self) -> None:
        request = urllib.request.Request(f"{self.url}/moto-api/reset", method="POST")
        urllib.request.urlopen(request, timeout=10).read()


@pytest.fixture(scope="session")
def moto_server() -> Iterator[MotoServer]:
    """One moto server (server mode, in a thread of the test process) for the whole session."""
    from moto.server import ThreadedMotoServer

    from leak_guard import session_owned

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    session_owned(server._server)  # closed below, at the end of the session
    host, port = server.get_host_and_port()
    try:
        yield MotoServer(url=f"http://{host}:{port}")
    finally:
        server.stop()


@pytest.fixture
def moto_env(moto_server: MotoServer, monkeypatch: pytest.MonkeyPatch, tmp_path) -> Iterator[dict[str, str]]:
    """Empty the moto server and point boto3 at it — in this process, and in subprocesses given the
    returned environment. The server is emptied again afterwards. IAM policy simulation answers as
    :class:`IamSimulator` says (moto has none)."""
    moto_server.reset()
    moto_server.iam = install_iam_simulator(monkeypatch)
    env = {
        "AWS_ENDPOINT_URL": moto_server.url,
        "AWS_ACCESS_KEY_ID": FAKE_ACCESS_KEY,
        "AWS_SECRET_ACCESS_KEY": FAKE_SECRET_KEY,
        "AWS_DEFAULT_REGION": REGION,
        # never read the developer's real AWS configuration
        "AWS_CONFIG_FILE": str(tmp_path / "no-aws-config"),
        "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "no-aws-credentials"),
        "AWS_EC2_METADATA_DISABLED": "true",
        # moto has no Deep Learning AMI parameter in SSM: name an AMI outright
        "RUBBERBAND_AWS_AMI": moto_ami(),
    }
    for key in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN"):
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    create_boundary()
    yield env
    moto_server.reset()


def create_boundary() -> str:
    """Create rubberband's permissions boundary on the moto server, as an account's administrator does once before
    rubberband may create a run's role (docs/clouds.md); its ARN."""
    import boto3

    from rubberband.cloud.aws.identity import BOUNDARY_NAME, IAM_PATH, aws_boundary_policy

    policy = boto3.client("iam").create_policy(
        Path=IAM_PATH, PolicyName=BOUNDARY_NAME, PolicyDocument=json.dumps(aws_boundary_policy())
    )
    return policy["Policy"]["Arn"]


@dataclass
class Ec2Faults:
    """Faults the moto server raises from run_instances (and any action, for denied permissions).

    ``capacity``: zones (or ``"*"``) where InsufficientInstanceCapacity is raised, optionally
    only for the types in ``capacity_types``; ``quota``: raise VcpuLimitExceeded (or
    MaxSpotInstanceCountExceeded for spot requests); ``throttle``: raise RequestLimitExceeded
    this many more times; ``capacity_spot_only``: the capacity faults hit spot requests only; ``denied``: EC2 actions answered with UnauthorizedOperation
    (also under DryRun). ``calls`` records (zone, type, spot) of every run_instances call.
    """

    capacity: set[str] = field(default_factory=set)
    capacity_types: set[str] = field(default_factory=set)
    capacity_spot_only: bool = False  # the capacity faults hit spot requests only (on-demand still sells)
    quota: bool = False
    throttle: int = 0
    denied: set[str] = field(default_factory=set)
    calls: list[tuple[str | None, str, bool]] = field(default_factory=list)


@pytest.fixture
def ec2_faults(moto_env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> Ec2Faults:
    from moto.ec2.exceptions import EC2ClientError
    from moto.ec2.models.instances import InstanceBackend
    from moto.ec2.responses._base_response import EC2BaseResponse

    faults = Ec2Faults()
    original_run = InstanceBackend.run_instances
    original_dryrun = EC2BaseResponse.error_on_dryrun

    def run_instances(self, image_id, count, user_data, security_group_names, **kwargs):
        zone = kwargs.get("placement")
        itype = kwargs.get("instance_type", "")
        spot = bool(kwargs.get("instance_market_options"))
        faults.calls.append((zone, itype, spot))
        if faults.throttle > 0:
            faults.throttle -= 1
            raise EC2ClientError("RequestLimitExceeded", "Request limit exceeded.")
        if faults.quota:
            if spot:
                raise EC2ClientError("MaxSpotInstanceCountExceeded", "Max spot instance count exceeded")
            raise EC2ClientError(
                "VcpuLimitExceeded",
                "You have requested more vCPU capacity than your current "
                "vCPU limit of 0 allows for the instance bucket that the specified instance type "
                "belongs to.",
            )
        if (
            (zone in faults.capacity or "*" in faults.capacity)
            and (not faults.capacity_types or itype in faults.capacity_types)
            and (spot or not faults.capacity_spot_only)
        ):
            raise EC2ClientError(
                "InsufficientInstanceCapacity",
                f"We currently do not have sufficient {itype} "
                f"capacity in the Availability Zone you requested ({zone}).",
            )
        return original_run(self, image_id, count, user_data, security_group_names, **kwargs)

    def error_on_dryrun(self):
        action = self._get_action()
        if action in faults.denied:
            raise EC2ClientError(
                "UnauthorizedOperation",
                "You are not authorized to perform this operation. Encoded authorization failure message: abc123",
            )
        return original_dryrun(self)

    monkeypatch.setattr(InstanceBackend, "run_instances", run_instances)
    monkeypatch.setattr(EC2BaseResponse, "error_on_dryrun", error_on_dryrun)
    return faults


#: Test catalogs in the shipped CSV layout, independent of the shipped (refreshed) price files. AWS zones are
#: zone IDs, as in the shipped catalog; MOTO_ZONES maps them to moto's zone names for us-east-1.
AWS_CATALOG_CSV = """# date: 2025-05-31
InstanceType,AcceleratorName,AcceleratorCount,vCPUs,MemoryGiB,GpuInfo,Price,SpotPrice,Region,AvailabilityZone
p3.2xlarge,V100,1,8,61,,3.06,0.5197,us-east-1,use1-az1
p3.2xlarge,V100,1,8,61,,3.06,0.5197,us-east-1,use1-az2
p3.8xlarge,V100,4,32,244,,12.24,1.8029,us-east-1,use1-az1
g4dn.xlarge,T4,1,4,16,,0.526,0.2010,us-east-1,use1-az1
"""
GCP_CATALOG_CSV = """# date: 2025-05-31
InstanceType,vCPUs,MemoryGiB,AcceleratorName,AcceleratorCount,GpuInfo,Region,AvailabilityZone,Price,SpotPrice
n1-standard-8,8,30,,,,us-central1,us-central1-a,0.38,0.0963
n1-standard-8,8,30,,,,us-central1,us-central1-b,0.38,0.0963
,,,V100,1,,us-central1,us-central1-a,2.48,0.992
,,,V100,1,,us-central1,us-central1-b,2.48,0.992
,,,T4,4,,us-central1,us-central1-a,1.40,0.56
a2-highgpu-1g,12,85,A100,1,,us-central1,us-central1-a,0.73948,0.29576
,,,A100,1,,us-central1,us-central1-a,2.93391,1.1
"""
MOTO_ZONES = {"use1-az6": "us-east-1a", "use1-az1": "us-east-1b", "use1-az2": "us-east-1c", "use1-az4": "us-east-1d"}


_T = TypeVar("_T")


def at_once(call: Callable[[], _T], threads: int = 6) -> list[_T]:
    """``call()`` in ``threads`` threads released together (as a run's launches are), its results in a list; the
    first exception a thread raised is raised here."""
    barrier = threading.Barrier(threads)

    def released() -> _T:
        barrier.wait()
        return call()

    with ThreadPoolExecutor(threads) as pool:
        futures = [pool.submit(released) for _ in range(threads)]
        return [f.result() for f in futures]


def cloud_catalog():
    """The AWS and GCP test catalogs above, as one Catalog."""
    from rubberband.catalog import Catalog, parse_catalog

    aws, gcp = parse_catalog("aws", AWS_CATALOG_CSV), parse_catalog("gcp", GCP_CATALOG_CSV)
    return Catalog(types=aws.types + gcp.types, dates={**aws.dates, **gcp.dates})


def moto_ami(region: str = REGION) -> str:
    """An AMI id for moto (one of its bundled example images; moto does not validate AMIs by default).

    Listing moto's images costs ~2 s per call, so the id is a constant.
    """
    return "ami-12c6146b"


def make_plan(cloud: str, region: str, itype: str, *, spot: bool = False):
    """A two-stage plan whose timeline has one instance spanning both stages and one that lives 30 s."""
    from rubberband.plan import (
        CatalogInfo,
        Distribution,
        JobInfo,
        Plan,
        Prediction,
        StagePlan,
        Timeline,
        TimelineInstance,
    )

    stages = [
        StagePlan(
            stage=0,
            trials=4,
            epochs=1,
            epochs_this_stage=1,
            cloud=cloud,
            region=region,
            instance_type=itype,
            instances=2,
            workers_per_trial=1,
            spot=spot,
        ),
        StagePlan(
            stage=1,
            trials=2,
            epochs=3,
            epochs_this_stage=2,
            cloud=cloud,
            region=region,
            instance_type=itype,
            instances=1,
            workers_per_trial=1,
            spot=spot,
        ),
    ]
    timeline = Timeline(
        instances=[
            TimelineInstance(
                id="i0",
                instance_type=itype,
                cloud=cloud,
                first_stage=0,
                last_stage=1,
                requested_s=0,
                ready_s=120,
                released_s=3600,
                cost_usd=0,
            ),
            TimelineInstance(
                id="i1",
                instance_type=itype,
                cloud=cloud,
                first_stage=0,
                last_stage=0,
                requested_s=0,
                ready_s=20,
                released_s=30,
                cost_usd=0,
            ),
        ]
    )  # lives 30 s: billed the 60 s minimum
    dist = Distribution(mean=3.2, p50=3.1, p95=3.9)
    return Plan(
        job=JobInfo(
            name="mnist",
            spec_sha256="0" * 64,
            scheduler="sha",
            eta=2,
            min_epochs=1,
            max_epochs=3,
            metric="loss",
            mode="min",
        ),
        catalog=CatalogInfo(clouds=[cloud], regions=[region], dates={}),
        deadline_s=7200,
        confidence=0.9,
        stages=stages,
        predicted=Prediction(jct_s=dist, cost_usd=dist, p_meet_deadline=0.95),
        timeline=timeline,
    )


# -- head mode ---------------------------------------------------------------------------------------------------


@pytest.fixture(autouse=True)
def no_played_head_left():
    """Whatever a test leaves, stop the played heads it started (their Ray nodes, their boot process)."""
    import glob
    import shutil

    from rubberband.cloud.local.provider import LocalProvider
    from played_boots import head_disk

    before = set(glob.glob(str(head_disk("*"))))
    yield
    for disk in map(Path, set(glob.glob(str(head_disk("*")))) - before):
        local = LocalProvider(disk)
        local.terminate([r.id for r in local.records() if r.role == "node"])
        local.stop_head()
        try:
            os.killpg(int((disk / "boot.pid").read_text()), signal.SIGKILL)
        except (OSError, ValueError):
            pass
        shutil.rmtree(disk, ignore_errors=True)


def assert_played_head_gone(head_id: str, timeout_s: float = 30.0) -> None:
    """The played head ended with its instance: its disk is removed and no process of it is left."""
    from played_boots import head_disk

    deadline = time.monotonic() + timeout_s
    while head_disk(head_id).exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not head_disk(head_id).exists()
    ours = [p for p in Path("/proc").iterdir() if p.name.isdigit() and str(head_disk(head_id)).encode() in _cmdline(p)]
    assert ours == []


def _cmdline(proc: Path) -> bytes:
    try:
        return (proc / "cmdline").read_bytes()
    except OSError:
        return b""


def assert_fetched_run(cli: Callable, run_dir: Path, report: Path, env: dict[str, str]) -> dict:
    """The run directory fetched from the head: a finished result.json, no Ray temp files or node records, of the
    checkpoints only the best trial's newest (result.json names the local copy); ``rubberband report`` works on it.
    Returns result.json."""
    from rubberband.cloud.head_run import PACK_EXCLUDE

    summary = json.loads((run_dir / "result.json").read_text())
    assert summary["status"] == "finished" and summary["best"]["trial_id"]
    assert not any((run_dir / name).exists() for name in PACK_EXCLUDE if name != "checkpoints")
    best = summary["best"]
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == [best["trial_id"]]
    assert Path(best["checkpoint"]).is_file() and Path(best["checkpoint"]).is_relative_to(run_dir.resolve())
    result = cli("report", run_dir, "--out", report, env=env)
    assert result.returncode == 0, result.stderr
    assert report.stat().st_size > 0
    return summary


# -- IAM policy simulation (moto has no iam:SimulatePrincipalPolicy) ------------------------------------------------


@dataclass
class IamSimulator:
    """What ``iam:SimulatePrincipalPolicy`` answers on the moto server, decided by :func:`iam_eval.evaluate`.

    For a role moto holds: its inline policies under its permissions boundary (the managed policy moto holds at the
    role's boundary ARN; a boundary moto does not hold allows nothing), for the request's action, resource
    (``ResourceArns``, else ``*``) and context entries — IAM's simulation fills no context key itself, principal
    tags included. For any other principal (the CLI's user): ``user_policies`` when set, else every action is
    allowed. Actions in ``denied`` are denied either way. ``calls`` records (principal ARN, action)."""

    denied: set[str] = field(default_factory=set)
    user_policies: list[dict] | None = None
    calls: list[tuple[str, str]] = field(default_factory=list)

    def decide(self, arn: str, action: str, resource: str, context: dict[str, str]) -> str:
        from iam_eval import evaluate
        from moto.core import DEFAULT_ACCOUNT_ID
        from moto.iam.models import iam_backends

        self.calls.append((arn, action))
        if action in self.denied:
            return "implicitDeny"
        if ":role/" not in arn:
            if self.user_policies is None:
                return "allowed"
            return evaluate(action, resource, context, policies=self.user_policies)
        backend = iam_backends[DEFAULT_ACCOUNT_ID]["global"]
        role = next((r for r in backend.roles.values() if r.arn == arn), None)
        if role is None:
            return "implicitDeny"
        policies = [json.loads(document) for document in role.policies.values()]
        boundary = None
        if role.permissions_boundary_arn:
            managed = backend.managed_policies.get(role.permissions_boundary_arn)
            default = [v.document for v in managed.versions if v.is_default] if managed is not None else []
            boundary = json.loads(default[0]) if default else {"Statement": []}
        return evaluate(action, resource, context, policies=policies, boundary=boundary)


@pytest.fixture
def iam_simulator(moto_server: MotoServer, moto_env: dict[str, str]) -> IamSimulator:
    """The moto server's IAM policy simulator for this test (``denied``: actions the CLI's user may not do)."""
    assert moto_server.iam is not None
    return moto_server.iam


def install_iam_simulator(monkeypatch: pytest.MonkeyPatch) -> IamSimulator:
    from moto.core.responses import ActionResult
    from moto.iam.responses import IamResponse

    sim = IamSimulator()

    def simulate_principal_policy(self):
        arn = self._get_param("PolicySourceArn")
        actions = self._get_param("ActionNames", [])
        resources = self._get_param("ResourceArns", []) or ["*"]
        context = {e["ContextKeyName"]: e["ContextKeyValues"][0] for e in self._get_param("ContextEntries", [])}
        return ActionResult(
            {
                "EvaluationResults": [
                    {"EvalActionName": a, "EvalResourceName": r, "EvalDecision": sim.decide(arn, a, r, context)}
                    for a in actions
                    for r in resources
                ],
                "IsTruncated": False,
            }
        )

    monkeypatch.setattr(IamResponse, "simulate_principal_policy", simulate_principal_policy, raising=False)
    return sim
