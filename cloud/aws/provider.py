"""AWS EC2 behind the :class:`~rubberband.cloud.provider.Provider` interface (boto3).

* Credentials only through boto3's default chain (environment, profile, SSO, instance
  role); the endpoint through the standard ``AWS_ENDPOINT_URL`` (or ``endpoint_url``).
* Every instance and its volumes carry the run id, stage, rubberband version and the
  managed marker; IMDSv2 is required (hop limit 1); an instance-initiated shutdown terminates it.
* One security group per run: all TCP between members of the group (Ray, object
  transfer, torch DDP pick ports freely) and SSH only from a CIDR the user gives.
  :meth:`AwsProvider.cleanup_run` deletes it once the run's instances are gone, or the head itself does at the
  run's end (:meth:`AwsProvider.reap_from_head`: it moves out of the group first). The group is found by
  its exact run tag, never by its name (a look-alike group of a user is never reused nor deleted).
* Errors are classified by :func:`rubberband.cloud.failover.classify`; transient ones are
  retried here with bounded backoff, reusing the request's ``ClientToken`` so that a retry
  never launches twice.
"""

from __future__ import annotations

import builtins

import dataclasses
import functools
import re
import threading
import time
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypedDict, TypeVar

import boto3
import botocore.exceptions
import botocore.parsers
from botocore.config import Config

from rubberband import __version__
from rubberband.cloud.aws.boot import AWS_BOOT
from rubberband.cloud.aws.identity import AwsIdentities, default_group, is_own_profile
from rubberband.clouds import chosen_image
from rubberband.cloud.aws.quotas import AWS_QUOTAS
from rubberband.cloud.aws.session import new_session
from rubberband.cloud.bootstrap import check_request, check_ssh_cidr
from rubberband.credentials import assert_no_credentials, redact
from rubberband.cloud.failover import CallContext, RetryPolicy, call_with_retry, classify
from rubberband.cloud.provider import (
    HeadReap,
    PermissionCheck,
    TAG_CREATED,
    TAG_MANAGED,
    TAG_RUN_ID,
    TAG_STAGE,
    Instance,
    InstanceRequest,
    check_option_names,
)
from rubberband.errors import CleanupIncomplete, CloudError, InputError, Location, UnexpectedAnswer

if TYPE_CHECKING:
    from typing_extensions import Unpack

T = TypeVar("T")

#: Public SSM parameter holding the newest AWS Deep Learning AMI with PyTorch (NVIDIA driver, CUDA torch in
#: /opt/pytorch, Ubuntu 24.04): the boot reuses its torch and its Python (a head boots on it, its workers
#: follow), so no node downloads gigabytes of CUDA torch. Name per the DLAMI docs ("Finding the ID of a
#: DLAMI"): the AMI's name without "Deep Learning" and "AMI", the framework version in it.
DEFAULT_AMI_PARAMETER = (
    "/aws/service/deeplearning/ami/x86_64/oss-nvidia-driver-gpu-pytorch-2.11-ubuntu-24.04/latest/ami-id"
)
_STATES = {
    "pending": "pending",
    "running": "running",
    "shutting-down": "stopping",
    "stopping": "stopping",
    "stopped": "stopped",
    "terminated": "terminated",
}
_LIVE_STATES = ["pending", "running", "stopping", "stopped"]
#: The instance metadata service as every node gets it: IMDSv2 only (a session token, fetched with a PUT), and a PUT
#: response hop limit of 1, so the token reaches processes on the instance itself but not a container or anything
#: one network hop further (nodes run no containers: a hop limit of 2 would only widen who can read the head's
#: role credentials).
METADATA_OPTIONS = {"HttpTokens": "required", "HttpEndpoint": "enabled", "HttpPutResponseHopLimit": 1}
_ZONE_ID_RE = re.compile(r"^[a-z]+[0-9]+-az[0-9]+$")  # use1-az1, usw2-az3


@functools.lru_cache(maxsize=1)
def _known_regions() -> frozenset[str]:
    """Every EC2 region botocore's bundled endpoint data knows (static data, read once)."""
    session = new_session()
    return frozenset(
        region
        for partition in session.get_available_partitions()
        for region in session.get_available_regions("ec2", partition_name=partition)
    )


def security_group_name(run_id: str) -> str:
    return f"rubberband-{run_id}"


def _tag_list(tags: dict[str, str]) -> list[dict[str, str]]:
    return [{"Key": k, "Value": v} for k, v in tags.items()]


class AwsOptions(TypedDict, total=False):
    """:class:`AwsProvider`'s options, each optional (for ``aws``, :class:`~rubberband.cloud.registry.ProviderPool`
    passes these as keywords)."""

    endpoint_url: str | None  # EC2's and SSM's endpoint (default: boto3's own, e.g. ``AWS_ENDPOINT_URL``)
    session: boto3.Session | None  # default: a new session from boto3's default credential chain
    image_id: str | None  # the AMI (default: ``RUBBERBAND_AWS_AMI``, else the newest PyTorch DLAMI)
    ssh_cidr: str | None  # the run's security group admits SSH from this CIDR only (default: from nowhere)
    key_name: str | None  # the EC2 key pair instances start with
    instance_profile: str | None  # the IAM instance profile instances start with
    vpc_id: str | None  # the VPC of the run's security group (default: the region's default VPC)
    retry: RetryPolicy | None  # backoff for transient errors (default: ``RetryPolicy()``)
    poll_s: float  # how often :meth:`AwsProvider.wait` looks (default 5 s)
    version: str  # the rubberband version in tags and the user agent (default: this one)


class AwsProvider:
    """EC2 instances of one region for rubberband runs."""

    cloud = "aws"
    boot_dialect = AWS_BOOT

    def __init__(self, region: str, **options: Unpack[AwsOptions]) -> None:
        check_option_names("AwsProvider", options, AwsOptions.__optional_keys__)
        self.session = options.get("session") or new_session()
        if region not in _known_regions():
            raise InputError(f"AWS region {region!r} is unknown; use one of e.g. us-east-1, us-west-2, eu-west-1")
        if self.session.get_credentials() is None:
            raise classify("NoCredentials", "boto3 found no credentials", CallContext("aws", region=region))
        ssh_cidr = options.get("ssh_cidr")
        version = options.get("version", __version__)
        self.region = region
        self.ssh_cidr = check_ssh_cidr(ssh_cidr) if ssh_cidr else None
        self.key_name = options.get("key_name")
        self.instance_profile = options.get("instance_profile")
        self.vpc_id = options.get("vpc_id")
        self.retry = options.get("retry") or RetryPolicy()
        self.poll_s = options.get("poll_s", 5.0)
        self.version = version
        self._image_id = options.get("image_id") or chosen_image("aws")
        self._groups: dict[str, str] = {}
        # one find-or-create of a run's group at a time: the run's instances are launched from several threads
        self._group_lock = threading.Lock()
        self._zone_names: dict[str, str] | None = None  # zone ID -> this account's zone name
        config = Config(
            region_name=region,
            retries={"total_max_attempts": 1, "mode": "standard"},
            user_agent_extra=f"rubberband/{version}",
            connect_timeout=10,
            read_timeout=60,
        )
        endpoint_url = options.get("endpoint_url")
        self.ec2 = self.session.client("ec2", endpoint_url=endpoint_url, config=config)
        self.ssm = self.session.client("ssm", endpoint_url=endpoint_url, config=config)
        self._client_args = {"endpoint_url": endpoint_url, "config": config}
        self._secrets_client: Any = None

    # -- plumbing ---------------------------------------------------------------------------

    def _call(
        self, action: str, fn: Callable[[], T], *, request: InstanceRequest | None = None, retry: bool = True
    ) -> T:
        """Run one API call, classifying failures (``request``: the launch it makes, named in its errors);
        transient ones are retried (bounded)."""
        context = CallContext(
            "aws", region=self.region, action=action if ":" in action else f"ec2:{action}", quotas=AWS_QUOTAS
        )
        if request is not None:
            context = dataclasses.replace(
                context, zone=request.zone, instance_type=request.instance_type.name, spot=request.spot
            )

        def once() -> T:
            try:
                return fn()
            except botocore.exceptions.ClientError as exc:
                error = exc.response.get("Error", {})
                status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
                raise classify(error.get("Code", ""), error.get("Message", ""), context, http_status=status) from None
            except botocore.exceptions.NoCredentialsError:
                raise classify(
                    "NoCredentials", "boto3 found no credentials", CallContext("aws", region=self.region)
                ) from None
            except botocore.parsers.ResponseParserError as exc:  # XML that is no API answer
                raise UnexpectedAnswer(f"aws {context.action} in {self.region}", str(exc)) from None
            except (
                botocore.exceptions.EndpointConnectionError,
                botocore.exceptions.ConnectionClosedError,
                botocore.exceptions.ReadTimeoutError,
                botocore.exceptions.ConnectTimeoutError,
            ) as exc:
                raise CloudError(
                    f"aws {action} in {self.region}: {exc}",
                    kind="transient",
                    code="ConnectionError",
                    where=Location(region=self.region),
                ) from None

        return call_with_retry(once, self.retry) if retry else once()

    def _tags(self, request: InstanceRequest) -> dict[str, str]:
        return {"Name": f"rb-{request.run_id}-{request.stage}", **request.tags(self.version)}

    def image_id(self) -> str:
        """The AMI to boot: ``image_id``, ``RUBBERBAND_AWS_AMI``, or the newest PyTorch Deep Learning AMI."""
        if self._image_id is None:
            try:
                response = self._call("ssm:GetParameter", lambda: self.ssm.get_parameter(Name=DEFAULT_AMI_PARAMETER))
            except CloudError as exc:
                raise CloudError(
                    f"cannot look up the default AMI ({exc.message}); set RUBBERBAND_AWS_AMI",
                    kind="fatal",
                    code=exc.code,
                    where=Location(region=self.region),
                ) from None
            self._image_id = response["Parameter"]["Value"]
        return self._image_id

    def zone_name(self, zone: str) -> str:
        """This account's name for a zone given by ID (``use1-az1``, as catalogs list them) or by name.

        Zone IDs are the same in every account; names (``us-east-1a``) are shuffled per account, and
        ``Placement.AvailabilityZone`` wants the name.
        """
        if not _ZONE_ID_RE.match(zone):
            return zone
        if self._zone_names is None:
            zones = self._call(
                "DescribeAvailabilityZones", lambda: self.ec2.describe_availability_zones(AllAvailabilityZones=True)
            )
            self._zone_names = {z["ZoneId"]: z["ZoneName"] for z in zones["AvailabilityZones"] if "ZoneId" in z}
        if zone not in self._zone_names:
            raise InputError(
                f"zone ID {zone!r} does not exist in {self.region}; known: {', '.join(sorted(self._zone_names))}"
            )
        return self._zone_names[zone]

    # -- security group ---------------------------------------------------------------------

    def _vpc(self) -> str:
        if self.vpc_id is None:
            vpcs = self._call(
                "DescribeVpcs", lambda: self.ec2.describe_vpcs(Filters=[{"Name": "isDefault", "Values": ["true"]}])
            )["Vpcs"]
            if not vpcs:
                raise CloudError(
                    f"aws: region {self.region} has no default VPC; pass vpc_id",
                    kind="fatal",
                    code="NoDefaultVpc",
                    where=Location(region=self.region),
                )
            self.vpc_id = vpcs[0]["VpcId"]
        return self.vpc_id

    def find_security_group(self, run_id: str) -> str | None:
        """The run's security group, found by its exact run tag (never by its name: a group of the same
        name that rubberband did not create is not the run's)."""
        groups = self._run_groups(run_id)
        return groups[0] if groups else None

    def _run_groups(self, run_id: str) -> list[str]:
        """Every security group in the VPC tagged with the run: one, unless something else made a second."""
        groups = self._call(
            "DescribeSecurityGroups",
            lambda: self.ec2.describe_security_groups(
                Filters=[
                    {"Name": f"tag:{TAG_MANAGED}", "Values": ["true"]},
                    {"Name": f"tag:{TAG_RUN_ID}", "Values": [run_id]},
                    {"Name": "vpc-id", "Values": [self._vpc()]},
                ]
            ),
        )["SecurityGroups"]
        return [g["GroupId"] for g in groups]

    def ensure_security_group(self, run_id: str) -> str:
        """The run's security group: Ray/DDP traffic only among its members, SSH only from ``ssh_cidr``.

        One thread at a time finds or creates it. The run's instances are launched from several threads; two
        that both found none both called CreateSecurityGroup, and the second was kept out only by EC2's check
        of the name (moto's is not atomic: it once made two groups, and the run's teardown deleted one).
        """
        with self._group_lock:
            return self._ensure_security_group(run_id)

    def _ensure_security_group(self, run_id: str) -> str:
        if run_id in self._groups:
            return self._groups[run_id]
        group_id = self.find_security_group(run_id)
        if group_id is None:
            tags = {
                TAG_MANAGED: "true",
                TAG_RUN_ID: run_id,
                "Name": security_group_name(run_id),
                TAG_CREATED: str(int(time.time())),
            }
            try:
                group_id = self._call(
                    "CreateSecurityGroup",
                    lambda: self.ec2.create_security_group(
                        GroupName=security_group_name(run_id),
                        VpcId=self._vpc(),
                        Description=f"rubberband run {run_id}: Ray traffic within the run only",
                        TagSpecifications=[{"ResourceType": "security-group", "Tags": _tag_list(tags)}],
                    ),
                )["GroupId"]
            except CloudError as exc:
                if exc.code != "InvalidGroup.Duplicate":
                    raise
                group_id = self.find_security_group(run_id)  # made by another process of the run
                if group_id is None:
                    raise CloudError(
                        f"aws: a security group named {security_group_name(run_id)} exists in "
                        f"{self.region} but rubberband did not create it (no {TAG_RUN_ID} tag); "
                        f"rename or delete it, or use another run id",
                        kind="fatal",
                        code="InvalidGroup.Duplicate",
                        where=Location(region=self.region),
                    ) from None
            else:
                permissions: list[dict[str, Any]] = [
                    {
                        "IpProtocol": "tcp",
                        "FromPort": 0,
                        "ToPort": 65535,
                        "UserIdGroupPairs": [
                            {"GroupId": group_id, "Description": "Ray and torch DDP between nodes of this run"}
                        ],
                    }
                ]
                if self.ssh_cidr:
                    permissions.append(
                        {
                            "IpProtocol": "tcp",
                            "FromPort": 22,
                            "ToPort": 22,
                            "IpRanges": [{"CidrIp": self.ssh_cidr, "Description": "SSH for the rubberband user"}],
                        }
                    )
                self._call(
                    "AuthorizeSecurityGroupIngress",
                    lambda: self.ec2.authorize_security_group_ingress(GroupId=group_id, IpPermissions=permissions),
                )
        self._groups[run_id] = group_id
        return group_id

    # -- Provider ---------------------------------------------------------------------------

    def run_instances_params(self, request: InstanceRequest, group_id: str | None) -> dict[str, Any]:
        """The run_instances arguments for ``request`` (also used for DryRun permission checks)."""
        itype = request.instance_type
        tags = self._tags(request)
        params: dict[str, Any] = {
            "ImageId": self.image_id(),
            "InstanceType": itype.host_type or itype.name,
            "MinCount": request.count,
            "MaxCount": request.count,
            "TagSpecifications": [
                {"ResourceType": "instance", "Tags": _tag_list(tags)},
                {"ResourceType": "volume", "Tags": _tag_list(tags)},
            ],
            "MetadataOptions": METADATA_OPTIONS,
            "InstanceInitiatedShutdownBehavior": "terminate",
        }
        if group_id:
            params["SecurityGroupIds"] = [group_id]
        if request.zone:
            params["Placement"] = {"AvailabilityZone": self.zone_name(request.zone)}
        if request.spot:
            params["InstanceMarketOptions"] = {
                "MarketType": "spot",
                "SpotOptions": {"SpotInstanceType": "one-time", "InstanceInterruptionBehavior": "terminate"},
            }
        if request.startup_script:
            params["UserData"] = assert_no_credentials(request.startup_script, what="EC2 user-data")
        if self.key_name:
            params["KeyName"] = self.key_name
        if self.instance_profile:
            params["IamInstanceProfile"] = {"Name": self.instance_profile}
        return params

    def _check_request(self, request: InstanceRequest) -> None:
        check_request(request, cloud="aws", region=self.region, provider="AWS")

    def provision(self, request: InstanceRequest) -> list[Instance]:
        self._check_request(request)
        self.image_id()  # a missing image fails before anything is created
        group_id = self.ensure_security_group(request.run_id)
        params = self.run_instances_params(request, group_id)
        params["ClientToken"] = uuid.uuid4().hex  # one per request: a retried call never launches twice
        response = self._call("RunInstances", lambda: self.ec2.run_instances(**params), request=request)
        return [self._instance(raw) for raw in response["Instances"]]

    def describe(self, instance_ids: list[str]) -> list[Instance]:
        if not instance_ids:
            return []
        pages = self._call(
            "DescribeInstances",
            lambda: list(self.ec2.get_paginator("describe_instances").paginate(InstanceIds=list(instance_ids))),
        )
        return [self._instance(raw) for page in pages for res in page["Reservations"] for raw in res["Instances"]]

    def wait(self, instance_ids: list[str], timeout_s: float) -> list[Instance]:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                instances = self.describe(instance_ids)
            except CloudError as exc:
                if exc.code != "InvalidInstanceID.NotFound":  # new ids take a moment to be visible
                    raise
                instances = []
            gone = [i for i in instances if i.state in ("stopping", "stopped", "terminated")]
            if gone:
                raise CloudError(
                    f"aws: instance {gone[0].id} ({gone[0].instance_type}) in {gone[0].zone} went "
                    f"{gone[0].state} before running (capacity reclaimed)",
                    kind="capacity",
                    code="InstanceTerminatedEarly",
                    where=Location(region=self.region, zone=gone[0].zone),
                )
            if len(instances) == len(instance_ids) and all(i.state == "running" for i in instances):
                return instances
            if time.monotonic() >= deadline:
                waiting = [i for i in instance_ids if i not in {x.id for x in instances if x.state == "running"}]
                raise CloudError(
                    f"aws: instances {', '.join(waiting[:5])} not running after {timeout_s:g}s",
                    kind="transient",
                    code="WaitTimeout",
                    where=Location(region=self.region),
                )
            time.sleep(min(self.poll_s, max(0.0, deadline - time.monotonic())))

    def list(self, run_id: str | None = None) -> builtins.list[Instance]:
        filters = [
            {"Name": f"tag:{TAG_MANAGED}", "Values": ["true"]},
            {"Name": "instance-state-name", "Values": _LIVE_STATES},
        ]
        if run_id is not None:
            filters.append({"Name": f"tag:{TAG_RUN_ID}", "Values": [run_id]})
        pages = self._call(
            "DescribeInstances", lambda: list(self.ec2.get_paginator("describe_instances").paginate(Filters=filters))
        )
        return [self._instance(raw) for page in pages for res in page["Reservations"] for raw in res["Instances"]]

    def terminate(self, instance_ids: builtins.list[str]) -> None:
        ids = builtins.list(dict.fromkeys(instance_ids))
        for start in range(0, len(ids), 500):
            chunk = ids[start : start + 500]
            try:
                self._call("TerminateInstances", lambda: self.ec2.terminate_instances(InstanceIds=chunk))
            except CloudError as exc:
                if not exc.code.startswith("InvalidInstanceID"):
                    raise
                for one in chunk:  # some id is already gone: terminate the rest one by one
                    try:
                        self._call("TerminateInstances", lambda: self.ec2.terminate_instances(InstanceIds=[one]))
                    except CloudError as inner:
                        if not inner.code.startswith("InvalidInstanceID"):
                            raise

    def console_output(self, instance_id: str, *, lines: int = 20) -> str:
        """The last ``lines`` of an instance's console (its boot log: the startup script writes there); "" if none.

        EC2 keeps the console output of a running or recently terminated instance for a while."""
        try:
            output = self.ec2.get_console_output(InstanceId=instance_id, Latest=True).get("Output") or ""
        except Exception:  # noqa: BLE001 - best effort: an error message must not hide the original one
            return ""
        return redact("\n".join(output.splitlines()[-lines:]))

    def set_labels(self, instance_id: str, labels: dict[str, str]) -> None:
        """Merge tags into an instance's tags (e.g. a new stage when an instance is reused)."""
        self._call("CreateTags", lambda: self.ec2.create_tags(Resources=[instance_id], Tags=_tag_list(labels)))

    def check_permissions(self, request: InstanceRequest) -> builtins.list[PermissionCheck]:
        """Probe the calls a run makes with ``DryRun=True``: nothing is created.

        ``DryRunOperation`` means allowed, ``UnauthorizedOperation`` denied; a probe that fails
        on the placeholder resource id itself (not on authorization) is reported as unchecked.
        """
        self._check_request(request)
        checks: builtins.list[PermissionCheck] = []
        placeholder_instance, placeholder_group = "i-0000000000000000f", "sg-0000000000000000f"

        def probe(action: str, fn: Callable[[], Any]) -> None:
            try:
                self._call(action, fn)
            except CloudError as exc:
                if exc.code == "DryRunOperation":
                    checks.append(PermissionCheck("aws", self.region, f"ec2:{action}", True))
                elif exc.code == "UnauthorizedOperation":
                    checks.append(PermissionCheck("aws", self.region, f"ec2:{action}", False, "UnauthorizedOperation"))
                elif exc.kind == "fatal" and exc.code.startswith(
                    ("InvalidInstanceID", "InvalidGroup", "InvalidVolume")
                ):
                    checks.append(
                        PermissionCheck(
                            "aws",
                            self.region,
                            f"ec2:{action}",
                            None,
                            f"not verifiable with a placeholder id ({exc.code})",
                        )
                    )
                else:
                    raise
            else:  # a read-only call that went through
                checks.append(PermissionCheck("aws", self.region, f"ec2:{action}", True))

        params = self.run_instances_params(request, None)
        probe("DescribeInstances", lambda: self.ec2.describe_instances(MaxResults=5))
        probe("RunInstances", lambda: self.ec2.run_instances(DryRun=True, **params))
        probe(
            "CreateSecurityGroup",
            lambda: self.ec2.create_security_group(
                DryRun=True,
                GroupName=security_group_name(request.run_id),
                Description="rubberband dry run",
                VpcId=self._vpc(),
            ),
        )
        probe(
            "AuthorizeSecurityGroupIngress",
            lambda: self.ec2.authorize_security_group_ingress(
                DryRun=True,
                GroupId=placeholder_group,
                IpPermissions=[
                    {"IpProtocol": "tcp", "FromPort": 22, "ToPort": 22, "IpRanges": [{"CidrIp": "203.0.113.7/32"}]}
                ],
            ),
        )
        probe(
            "TerminateInstances", lambda: self.ec2.terminate_instances(DryRun=True, InstanceIds=[placeholder_instance])
        )
        probe("DeleteSecurityGroup", lambda: self.ec2.delete_security_group(DryRun=True, GroupId=placeholder_group))
        probe("DeleteVolume", lambda: self.ec2.delete_volume(DryRun=True, VolumeId="vol-0000000000000000f"))
        return checks

    # -- run-level resources ------------------------------------------------------------------

    def cleanup_run(self, run_id: str, timeout_s: float = 600.0) -> builtins.list[str]:
        """Delete the run's run-level resources, all found by the exact run tag, and return what was deleted: its
        security groups once no instance uses them (every group of the run, should there be more than one), then
        its detached volumes (a volume an instance kept shows up once that instance is gone), then its secrets.

        Each kind is deleted on its own: one the credentials may not list or delete (the secrets, without
        ``secretsmanager:ListSecrets``) never keeps the others alive. :class:`~rubberband.errors.CleanupIncomplete`
        once all were tried, naming what failed and carrying what went."""
        deadline = time.monotonic() + timeout_s
        steps: builtins.list[tuple[str, Callable[[], list[str]]]] = [
            ("security groups", lambda: self._delete_groups(run_id, deadline, timeout_s)),
            ("detached volumes", lambda: self._delete_volumes(run_id)),
            ("secrets", lambda: self._delete_secrets(run_id)),
        ]
        deleted: builtins.list[str] = []
        failed: builtins.list[tuple[str, CloudError]] = []
        for what, step in steps:
            try:
                deleted += step()
            except CloudError as exc:
                failed.append((what, exc))
        if failed:
            reasons = "; ".join(f"its {what}: {exc.message}" for what, exc in failed)
            went = f" (deleted: {', '.join(deleted)})" if deleted else ""
            raise CleanupIncomplete(
                f"aws: could not clean up all of run {run_id} in {self.region}{went}: {reasons}",
                deleted=deleted,
                first=failed[0][1],
            )
        return deleted

    def _delete_groups(self, run_id: str, deadline: float, timeout_s: float) -> builtins.list[str]:
        """Delete every security group of the run once no instance uses it; the ones that went."""
        self._groups.pop(run_id, None)
        return [
            group_id
            for group_id in self._run_groups(run_id)
            if self._delete_group_when_unused(run_id, group_id, deadline, timeout_s)
        ]

    def _delete_group_when_unused(self, run_id: str, group_id: str, deadline: float, timeout_s: float) -> bool:
        """Delete ``group_id`` once no instance uses it (False: it was gone already); CloudError at ``deadline``
        (``timeout_s`` after the cleanup began)."""
        while True:
            remaining = self._call(
                "DescribeInstances",
                lambda: self.ec2.describe_instances(
                    Filters=[
                        {"Name": "instance.group-id", "Values": [group_id]},
                        {
                            "Name": "instance-state-name",
                            "Values": ["pending", "running", "shutting-down", "stopping", "stopped"],
                        },
                    ]
                ),
            )["Reservations"]
            if not remaining:
                try:
                    self._call("DeleteSecurityGroup", lambda: self.ec2.delete_security_group(GroupId=group_id))
                    return True
                except CloudError as exc:
                    if exc.code == "InvalidGroup.NotFound":
                        return False
                    if exc.code != "DependencyViolation":
                        raise
            if time.monotonic() >= deadline:
                raise CloudError(
                    f"aws: security group {group_id} of run {run_id} is still in use after "
                    f"{timeout_s:g}s; delete it with `aws ec2 delete-security-group --group-id "
                    f"{group_id}`",
                    kind="transient",
                    code="DependencyViolation",
                    where=Location(region=self.region),
                )
            time.sleep(self.poll_s)

    # -- the run's end from its head ------------------------------------------------------------

    def reap_from_head(self, run_id: str, head_id: str, timeout_s: float = 300.0) -> HeadReap:
        """The head's own end of its run (:class:`~rubberband.cloud.provider.ReapsFromItsHead`), with the head's
        own identity, after its watchdog terminated the workers.

        The run's security group cannot go while the head's interface is in it, and once the head is gone nothing
        of the run is left to delete it: so the head moves its own instance into its VPC's default group, waits
        until no instance of the run is in the run's group (a terminated worker's interface goes with it), and
        deletes the group. Then, when the head runs with the role rubberband created for the run (never a
        ``--instance-profile`` of the user's), it ends that identity as its very last API calls
        (:meth:`~rubberband.cloud.aws.identity.AwsIdentities.end_own`) and is ``powerless``: the watchdog powers
        it off (``InstanceInitiatedShutdownBehavior=terminate`` ends it). What it cannot do is left to
        ``rubberband down`` and said in ``problems``; a head that kept its rights terminates itself as before."""
        deleted: builtins.list[str] = []
        problems: builtins.list[str] = []
        try:
            reservations = self._call("DescribeInstances", lambda: self.ec2.describe_instances(InstanceIds=[head_id]))[
                "Reservations"
            ]
            (head,) = [raw for res in reservations for raw in res["Instances"]]
        except (CloudError, ValueError) as exc:
            return HeadReap(problems=[f"could not describe its head {head_id}: {exc}"])
        try:
            deleted += self._leave_and_delete_groups(run_id, head, time.monotonic() + timeout_s, timeout_s)
        except CloudError as exc:
            problems.append(f"its security group: {exc.message}")
        if not is_own_profile((head.get("IamInstanceProfile") or {}).get("Arn", ""), run_id):
            return HeadReap(deleted, False, problems)
        identities = AwsIdentities(session=self.session, endpoint_url=self._client_args["endpoint_url"])
        try:
            deleted += identities.end_own(run_id)
        except CloudError as exc:
            return HeadReap(deleted, False, [*problems, f"its role: {exc.message}"])
        return HeadReap(deleted, True, problems)

    def _leave_and_delete_groups(
        self, run_id: str, head: dict[str, Any], deadline: float, timeout_s: float
    ) -> builtins.list[str]:
        """Move the head out of the run's groups into its VPC's default group, then delete them once unused."""
        groups = self._run_groups(run_id)
        if not groups:
            return []
        if any(g["GroupId"] in groups for g in head.get("SecurityGroups", [])):
            parking = default_group(self._call, self.ec2, head.get("VpcId") or self._vpc())
            if parking is None:
                raise CloudError(
                    f"aws: the head's VPC has no default security group to leave run {run_id}'s group for",
                    kind="fatal",
                    code="NoDefaultGroup",
                    where=Location(region=self.region),
                )
            self._call(
                "ModifyInstanceAttribute",
                lambda: self.ec2.modify_instance_attribute(InstanceId=head["InstanceId"], Groups=[parking]),
            )
        return self._delete_groups(run_id, deadline, timeout_s)

    def _volumes(self, run_id: str | None = None) -> builtins.list[dict[str, Any]]:
        """Detached (``available``) EBS volumes carrying rubberband's tags (one run's when given): a volume of a
        terminated instance that was not deleted with it, still billing."""
        filters = [{"Name": f"tag:{TAG_MANAGED}", "Values": ["true"]}, {"Name": "status", "Values": ["available"]}]
        if run_id is not None:
            filters.append({"Name": f"tag:{TAG_RUN_ID}", "Values": [run_id]})
        pages = self._call(
            "DescribeVolumes", lambda: list(self.ec2.get_paginator("describe_volumes").paginate(Filters=filters))
        )
        return [v for page in pages for v in page["Volumes"]]

    def _delete_volumes(self, run_id: str) -> builtins.list[str]:
        deleted = []
        for volume in self._volumes(run_id):
            try:
                self._call("DeleteVolume", lambda: self.ec2.delete_volume(VolumeId=volume["VolumeId"]))
                deleted.append(volume["VolumeId"])
            except CloudError as exc:
                if exc.code not in ("InvalidVolume.NotFound", "VolumeInUse"):
                    raise
        return deleted

    def _secrets(self, run_id: str | None = None) -> builtins.list[dict[str, Any]]:
        """Secrets Manager secrets carrying rubberband's tags (one run's when given), e.g. a run's Ray token."""
        filters = [{"Key": "tag-key", "Values": [TAG_MANAGED]}, {"Key": "tag-value", "Values": ["true"]}]
        if self._secrets_client is None:  # built on first use: only teardown and the sweep need it
            self._secrets_client = self.session.client("secretsmanager", **self._client_args)
        pages = self._call(
            "secretsmanager:ListSecrets",
            lambda: list(self._secrets_client.get_paginator("list_secrets").paginate(Filters=filters)),
        )
        found = []
        for page in pages:
            for secret in page["SecretList"]:
                tags = {t["Key"]: t["Value"] for t in secret.get("Tags", [])}
                if (
                    tags.get(TAG_MANAGED) == "true"
                    and tags.get(TAG_RUN_ID)
                    and (run_id is None or tags[TAG_RUN_ID] == run_id)
                ):
                    found.append(secret)
        return found

    def _listable_secrets(self) -> builtins.list[dict[str, Any]]:
        """Every rubberband secret, or none where the credentials may not list secrets: the sweep still finds the
        runs left by their groups and volumes (whose cleanup then names the missing permission)."""
        try:
            return self._secrets()
        except CloudError as exc:
            if exc.code not in ("AccessDeniedException", "UnauthorizedOperation"):
                raise
            return []

    def _delete_secrets(self, run_id: str) -> builtins.list[str]:
        deleted = []
        for secret in self._secrets(run_id):
            try:
                self._call(
                    "secretsmanager:DeleteSecret",
                    lambda: self._secrets_client.delete_secret(SecretId=secret["ARN"], ForceDeleteWithoutRecovery=True),
                )
                deleted.append(f"secret/{secret['Name']}")
            except CloudError as exc:
                if exc.code != "ResourceNotFoundException":
                    raise
        return deleted

    def leftover_runs(self, *, older_than_s: float = 0.0, now: float | None = None) -> builtins.list[str]:
        """Runs whose security group, detached volumes or secrets outlived their instances (to clean up with
        :meth:`cleanup_run`), found by exact tags; a group younger than ``older_than_s`` (its ``rubberband-created``
        tag) belongs to a run being started and is left alone."""
        now = time.time() if now is None else now
        groups = self._call(
            "DescribeSecurityGroups",
            lambda: self.ec2.describe_security_groups(Filters=[{"Name": f"tag:{TAG_MANAGED}", "Values": ["true"]}]),
        )["SecurityGroups"]
        runs = set()
        for group in groups:
            tags = {t["Key"]: t["Value"] for t in group.get("Tags", [])}
            created = tags.get(TAG_CREATED, "")
            if tags.get(TAG_RUN_ID) and (not created.isdigit() or now - int(created) >= older_than_s):
                runs.add(tags[TAG_RUN_ID])
        for volume in self._volumes():
            tags = {t["Key"]: t["Value"] for t in volume.get("Tags", [])}
            created = volume.get("CreateTime")
            if tags.get(TAG_RUN_ID) and (created is None or now - created.timestamp() >= older_than_s):
                runs.add(tags[TAG_RUN_ID])
        for secret in self._listable_secrets():
            created = secret.get("CreatedDate")
            if created is None or now - created.timestamp() >= older_than_s:
                runs.add({t["Key"]: t["Value"] for t in secret["Tags"]}[TAG_RUN_ID])
        live = {i.run_id for i in self.list()}
        return sorted(runs - live)

    # -- conversion ---------------------------------------------------------------------------

    def _instance(self, raw: dict[str, Any]) -> Instance:
        tags = {t["Key"]: t["Value"] for t in raw.get("Tags", [])}
        launched = raw.get("LaunchTime")
        try:
            stage = int(tags.get(TAG_STAGE, "0"))
        except ValueError:
            stage = 0
        return Instance(
            id=raw["InstanceId"],
            cloud="aws",
            instance_type=raw.get("InstanceType", ""),
            zone=raw.get("Placement", {}).get("AvailabilityZone", ""),
            state=_STATES.get(raw.get("State", {}).get("Name", ""), "pending"),
            run_id=tags.get(TAG_RUN_ID, ""),
            stage=stage,
            address=raw.get("PrivateIpAddress"),
            launched_at=launched.timestamp() if launched is not None else None,
            tags=tags,
            public_address=raw.get("PublicIpAddress"),
            state_reason=(raw.get("StateReason") or {}).get("Code", ""),
            identity=(raw.get("IamInstanceProfile") or {}).get("Arn", ""),
        )
