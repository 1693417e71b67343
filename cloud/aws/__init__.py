"""AWS: EC2 instances, IAM head identities, IMDSv2 notices (the package's modules; its descriptor is below).

``provider``: :class:`~rubberband.cloud.aws.provider.AwsProvider`; ``boot``: the boot script's EC2 lines;
``identity``: the head's IAM role under rubberband's permissions boundary; ``notices``: the spot interruption
notice; ``pricing``: ``rubberband catalog update aws``; ``quotas``: the Service Quotas a launch hits; ``session``:
boto3 sessions whose unreadable answers are one-line errors.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rubberband.cloud.descriptor import HeadFlags, NoticeRead, RefreshedCatalog, ssh_flags_needed
from rubberband.cloud.head_identity import HeadIdentity
from rubberband.cloud.provider import PermissionCheck, Provider
from rubberband.clouds import CloudFacts, cloud
from rubberband.errors import InputError


@dataclass(frozen=True)
class AwsHead:
    """Head mode on AWS: an instance profile named by ``--instance-profile``, else a role made for the run; the head
    is reached over SSH with an EC2 key pair; workers keep their public address (no egress to set up)."""

    def check_flags(self, flags: HeadFlags, *, over_ssh: bool) -> None:
        if flags.service_account:
            raise InputError("--service-account is for --cloud gcp; on AWS pass --instance-profile NAME (or neither)")
        if flags.worker_egress is not None:
            raise InputError(
                "--worker-egress is for --cloud gcp (AWS workers keep their public address; the run's "
                "security group admits only the run's own nodes); drop it"
            )
        if over_ssh and not (flags.ssh_cidr and flags.ssh_key and flags.key_name):
            raise InputError(ssh_flags_needed("aws", " and --key-name EC2_KEY_PAIR"))

    def provider_options(
        self,
        *,
        identity: str | None = None,
        ssh_cidr: str | None = None,
        key_name: str | None = None,
        worker_egress: str | None = None,
        image: str | None = None,
    ) -> dict[str, Any]:
        wanted = {"instance_profile": identity, "ssh_cidr": ssh_cidr, "key_name": key_name, "image_id": image}
        return {name: value for name, value in wanted.items() if value}

    def identity(self, run_id: str, region: str, flags: HeadFlags) -> HeadIdentity:
        from rubberband.cloud.aws.identity import AwsIdentities

        self.check_flags(flags, over_ssh=False)
        if flags.instance_profile:
            return HeadIdentity("aws", flags.instance_profile)
        return AwsIdentities().create(run_id, region)

    def prepare_run(self, provider: Any, run_id: str) -> None:
        return None  # the run's security group comes with its first launch

    def delete_identity(self, run_id: str) -> list[str]:
        from rubberband.cloud.aws.identity import AwsIdentities

        return AwsIdentities().delete(run_id)

    def identity_left(self, run_id: str) -> str:
        from rubberband.cloud.aws.identity import identity_name

        return f"role/{identity_name(run_id)}"

    def sweep_identities(
        self, live: set[str], regions: list[str], *, older_than_s: float, now: float, echo: Callable[[str], None]
    ) -> int:
        """Head roles of runs started in the regions swept that have no instance left."""
        from rubberband.cloud.aws.identity import AwsIdentities

        identities, deleted = AwsIdentities(), 0
        for run_id in identities.leftover_runs(live, regions, older_than_s=older_than_s, now=now):
            for resource in identities.delete(run_id):
                deleted += 1
                echo(f"deleted aws {resource} (run {run_id})")
        return deleted

    def check_identity(self, flags: HeadFlags, run_id: str) -> list[PermissionCheck]:
        from rubberband.cloud.aws.identity import AwsIdentities

        self.check_flags(flags, over_ssh=False)
        identities = AwsIdentities()
        if flags.instance_profile:
            return identities.check_profile(flags.instance_profile, run_id)
        return identities.check_creator()

    def policy_docs(self) -> str:
        from rubberband.cloud.aws.identity import policy_docs

        return policy_docs()


@dataclass(frozen=True)
class AwsCloud:
    """The AWS descriptor (:class:`~rubberband.cloud.descriptor.CloudDescriptor`)."""

    facts: CloudFacts = field(default_factory=lambda: cloud("aws"))
    head: AwsHead = AwsHead()

    @staticmethod
    def refresh_catalog(regions: list[str] | None, types: list[str] | None, directory: Path) -> RefreshedCatalog:
        from rubberband.cloud.aws.pricing import refresh_catalog

        return refresh_catalog(regions, types, directory)

    def provider(self, region: str, **options: Any) -> Provider:
        from rubberband.cloud.aws.provider import AwsProvider

        return AwsProvider(region, **options)

    def notice_reader(self, base_url: str, timeout_s: float) -> NoticeRead:
        from rubberband.cloud.aws.notices import AwsNoticeReader

        return AwsNoticeReader(base_url, timeout_s)


DESCRIPTOR = AwsCloud()
