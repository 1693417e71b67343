"""GCP: Compute Engine VMs, a service account with a role bound per run, metadata-server notices (the package's
modules; its descriptor is below).

``provider``: :class:`~rubberband.cloud.gcp.provider.GcpProvider`; ``boot``: the boot script's GCE lines (a node
deletes its own VM); ``identity``: the head's role binding conditioned on the run; ``names``: the run's resource
names; ``notices``: the preemption notice; ``quotas``: the quota a launch hits; ``session``: project and endpoint.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from rubberband.cloud.descriptor import HeadFlags, NoticeRead, ssh_flags_needed
from rubberband.cloud.head_identity import HeadIdentity
from rubberband.cloud.provider import PermissionCheck, Provider
from rubberband.clouds import CloudFacts, cloud
from rubberband.errors import CloudError, InputError

#: How workers reach the internet (the provider's ``worker_egress``): the run's own Cloud NAT, the network's
#: existing egress, or an external address each.
WORKER_EGRESS = ("nat", "existing", "public")
NEEDS_ACCOUNT = (
    "--cloud gcp runs the executor on a head instance that needs a service account: pass "
    "--service-account EMAIL (one holding the role in docs/clouds.md), or run with --head local"
)


@dataclass(frozen=True)
class GcpHead:
    """Head mode on GCP: the user's service account (required) with rubberband's role bound for the run alone; the
    workers' egress is the run's own Cloud NAT unless the user chose otherwise."""

    def check_flags(self, flags: HeadFlags, *, over_ssh: bool) -> None:
        if flags.instance_profile:
            raise InputError("--instance-profile is for --cloud aws; on GCP pass --service-account EMAIL")
        if not flags.service_account:
            raise InputError(NEEDS_ACCOUNT)
        if "@" not in flags.service_account:
            raise InputError(
                f"--service-account {flags.service_account!r} is not an email (NAME@PROJECT.iam.gserviceaccount.com)"
            )
        if flags.worker_egress is not None and flags.worker_egress not in WORKER_EGRESS:
            raise InputError(
                f"--worker-egress {flags.worker_egress!r}: use nat (the run's own Cloud NAT), "
                f"existing (your network's egress) or public (workers get an external address)"
            )
        if over_ssh and not (flags.ssh_cidr and flags.ssh_key):
            raise InputError(ssh_flags_needed("gcp"))

    def provider_options(
        self,
        *,
        identity: str | None = None,
        ssh_cidr: str | None = None,
        key_name: str | None = None,
        worker_egress: str | None = None,
        image: str | None = None,
    ) -> dict[str, Any]:
        wanted = {"service_account": identity, "ssh_cidr": ssh_cidr, "worker_egress": worker_egress, "image": image}
        return {name: value for name, value in wanted.items() if value}

    def identity(self, run_id: str, region: str, flags: HeadFlags) -> HeadIdentity:
        """The user's account, with the head's role bound to it for this run alone (marked ``created``: the run's
        end removes the binding). IAM applies a new binding within a minute or two, well before the head's executor
        makes its first call."""
        from rubberband.cloud.gcp.identity import GcpIdentities

        self.check_flags(flags, over_ssh=False)
        email = str(flags.service_account)
        GcpIdentities().bind_run(email, run_id, worker_egress=flags.worker_egress)
        return HeadIdentity("gcp", email, created=True)

    def prepare_run(self, provider: Any, run_id: str) -> None:
        provider.ensure_worker_egress(run_id)  # the workers' Cloud NAT first: a network without room fails now

    def delete_identity(self, run_id: str) -> list[str]:
        from rubberband.cloud.gcp.identity import GcpIdentities

        return GcpIdentities().unbind_run(run_id)

    def identity_left(self, run_id: str) -> str:
        from rubberband.cloud.gcp.identity import GCP_BINDING_TITLE

        return f"the IAM binding titled {GCP_BINDING_TITLE}{run_id}"

    def sweep_identities(
        self, live: set[str], regions: list[str], *, older_than_s: float, now: float, echo: Callable[[str], None]
    ) -> int:
        """The head role's bindings of runs with no instance left (the project's whole policy: regions do not
        matter)."""
        from rubberband.cloud.gcp.identity import GCP_BINDING_TITLE, GcpIdentities

        identities, removed = GcpIdentities(), 0
        try:
            for run_id in identities.leftover_runs(live, older_than_s=older_than_s, now=now):
                for resource in identities.unbind_run(run_id):
                    removed += 1
                    echo(f"deleted gcp {resource} (run {run_id})")
        except CloudError as exc:  # the VMs and run resources went already; say what was not swept
            echo(
                f"could not sweep the head role's run bindings ({exc.message}); "
                f"remove {GCP_BINDING_TITLE}* ones by hand"
            )
        return removed

    def check_identity(self, flags: HeadFlags, run_id: str) -> list[PermissionCheck]:
        from rubberband.cloud.gcp.identity import GcpIdentities

        self.check_flags(flags, over_ssh=False)
        return GcpIdentities().check_service_account(str(flags.service_account))

    def policy_docs(self) -> str:
        from rubberband.cloud.gcp.identity import policy_docs

        return policy_docs()


@dataclass(frozen=True)
class GcpCloud:
    """The GCP descriptor (:class:`~rubberband.cloud.descriptor.CloudDescriptor`)."""

    facts: CloudFacts = field(default_factory=lambda: cloud("gcp"))
    head: GcpHead = GcpHead()
    refresh_catalog: None = None  # its prices ship with rubberband

    def provider(self, region: str, **options: Any) -> Provider:
        from rubberband.cloud.gcp.provider import GcpProvider

        return GcpProvider(region, **options)

    def notice_reader(self, base_url: str, timeout_s: float) -> NoticeRead:
        from rubberband.cloud.gcp.notices import GcpNoticeReader

        return GcpNoticeReader(base_url, timeout_s)


DESCRIPTOR = GcpCloud()
