"""A run's network on Compute Engine: its firewall rules, and for private workers its own subnetwork and Cloud NAT.

The run's firewall rules deny by default: a rule at priority :data:`DENY_PRIORITY` denies every protocol from
anywhere to the run's network tag (it outranks the ``default`` network's own rules at 65534), and rules at
:data:`ALLOW_PRIORITY` open TCP only between VMs carrying that tag, plus SSH from a user-given CIDR to the head alone.
With ``worker_egress="nat"`` the run makes, before its first worker in a region, its own subnetwork there (a free /20
of :data:`SUBNET_POOL`) and its own Cloud Router with a Cloud NAT of that subnetwork alone. None of these carries
labels: the run's ownership marker ends their description (:func:`~rubberband.cloud.gcp.names.owner_marker`), and
only what carries it is reused or deleted, never anything matched by its name alone.
"""

from __future__ import annotations

import hashlib
import ipaddress
import itertools
import uuid
from collections.abc import Callable, Iterable, Iterator
from functools import partial

from google.cloud import compute_v1

from rubberband.cloud.gcp.compute_api import ComputeApi, Doomed
from rubberband.cloud.gcp.names import firewall_name, marked_run, owner_marker, router_name, subnet_name
from rubberband.errors import CloudError, Location


def network_tag(run_id: str) -> str:
    """The network tag every VM of the run carries (its firewall rules select them by it)."""
    return f"rubberband-{run_id}"


#: NAT source options that claim every subnetwork of a region and network: there may be no other NAT beside one.
_ALL_SUBNETWORKS = ("ALL_SUBNETWORKS_ALL_IP_RANGES", "ALL_SUBNETWORKS_ALL_PRIMARY_IP_RANGES")


def serves_all(router: compute_v1.Router) -> bool:
    """Whether a router holds a NAT of every subnetwork of its region and network."""
    return any(n.source_subnetwork_ip_ranges_to_nat in _ALL_SUBNETWORKS for n in router.nats)


#: Where runs' subnetworks take their ranges from: 10.64.0.0/10, beside the 10.128.0.0/9 an auto-mode network (such as
#: ``default``) keeps for its own subnetworks; each run a /20 (4,092 addresses) that no subnetwork of the network holds.
SUBNET_POOL = "10.64.0.0/10"
SUBNET_PREFIX = 20
#: How many free blocks a run tries before it gives up (Compute Engine refuses one a peered network holds).
SUBNET_TRIES = 4


def free_blocks(run_id: str, taken: Iterable[str], pool: str = SUBNET_POOL) -> Iterator[str]:
    """The /:data:`SUBNET_PREFIX` blocks of ``pool`` that overlap none of the ``taken`` ranges, starting at one drawn
    from the run id (runs starting at once seldom try the same block) and wrapping around."""
    blocks: list[ipaddress.IPv4Network | ipaddress.IPv6Network] = list(
        ipaddress.ip_network(pool).subnets(new_prefix=SUBNET_PREFIX)
    )
    used: list[ipaddress.IPv4Network | ipaddress.IPv6Network] = [ipaddress.ip_network(t, strict=False) for t in taken]
    start = int(hashlib.sha256(run_id.encode()).hexdigest(), 16) % len(blocks)
    for block in blocks[start:] + blocks[:start]:
        if not any(block.overlaps(u) for u in used if u.version == block.version):  # type: ignore[arg-type]
            yield str(block)


def head_tag(run_id: str) -> str:
    """The network tag only the run's head carries (SSH is opened to it alone)."""
    return f"rubberband-{run_id}-head"


#: Firewall priorities (lower wins): the run's allows, then its deny-everything-else, then the default network's.
ALLOW_PRIORITY = 900
DENY_PRIORITY = 1000


class RunNetwork:
    """The network resources of runs in ``api``'s region, on the VPC network ``network``: firewall rules (SSH to a
    head from ``ssh_cidr`` only; None: from nowhere) and, where ``worker_egress`` is ``nat``, a run's subnetwork and
    Cloud NAT."""

    def __init__(self, api: ComputeApi, *, network: str, ssh_cidr: str | None, worker_egress: str) -> None:
        self.api = api
        self.region = api.region
        self.project = api.project
        self.network = network
        self.ssh_cidr = ssh_cidr
        self.worker_egress = worker_egress
        self._firewalls: set[str] = set()  # the rules made (or found) in this process: not inserted again

    # -- firewall ---------------------------------------------------------------------------

    def ensure_firewall(self, run_id: str) -> list[str]:
        """The run's rules: everything to its VMs denied, but TCP between them and SSH from ``ssh_cidr`` to its head.

        The deny (priority :data:`DENY_PRIORITY`) outranks the network's own allow rules (the ``default``
        network's ``default-allow-internal`` and ``default-allow-ssh`` sit at 65534), so no other VM of the
        project and nothing on the internet reaches a Ray port; the run's allows (:data:`ALLOW_PRIORITY`)
        outrank the deny. The deny goes in first: there is never a moment with only the allows."""
        tag = network_tag(run_id)
        network = f"global/networks/{self.network}"
        rules = [
            compute_v1.Firewall(
                name=firewall_name(run_id, "deny"),
                network=network,
                direction="INGRESS",
                priority=DENY_PRIORITY,
                description=f"rubberband run {run_id}: nothing reaches its VMs but what the run's other rules allow "
                f"{owner_marker(run_id)}",
                source_ranges=["0.0.0.0/0"],
                target_tags=[tag],
                denied=[compute_v1.Denied(I_p_protocol="all")],
            ),
            compute_v1.Firewall(
                name=firewall_name(run_id),
                network=network,
                direction="INGRESS",
                priority=ALLOW_PRIORITY,
                description=f"rubberband run {run_id}: Ray and torch DDP between its VMs {owner_marker(run_id)}",
                source_tags=[tag],
                target_tags=[tag],
                allowed=[compute_v1.Allowed(I_p_protocol="tcp", ports=["0-65535"])],
            ),
        ]
        if self.ssh_cidr:
            rules.append(
                compute_v1.Firewall(
                    name=firewall_name(run_id, "ssh"),
                    network=network,
                    direction="INGRESS",
                    priority=ALLOW_PRIORITY,
                    description=f"rubberband run {run_id}: SSH from the user to its head {owner_marker(run_id)}",
                    source_ranges=[self.ssh_cidr],
                    target_tags=[head_tag(run_id)],
                    allowed=[compute_v1.Allowed(I_p_protocol="tcp", ports=["22"])],
                )
            )
        names = []
        for rule in rules:
            if rule.name not in self._firewalls:
                insert = compute_v1.InsertFirewallRequest(
                    project=self.project, firewall_resource=rule, request_id=str(uuid.uuid4())
                )
                try:
                    op = self.api.call(lambda: self.api.firewalls.insert_unary(request=insert))
                    self.api.wait_global_op(op)
                except CloudError as exc:  # made by another process of the run (the CLI before its head)
                    if exc.code != "alreadyExists" and "already exists" not in exc.message:  # message: cut short
                        raise
                    self._check_owned(rule.name, run_id)
                self._firewalls.add(rule.name)
            names.append(rule.name)
        return names

    def _check_owned(self, name: str, run_id: str) -> None:
        """A firewall rule of the run's name that exists already is the run's (its marker) or a fatal error."""
        rule = self.api.call(lambda: self.api.firewalls.get(project=self.project, firewall=name))
        if marked_run(rule.description) != run_id:
            raise CloudError(
                f"gcp: a firewall rule named {name} exists but rubberband did not create it for run "
                f"{run_id} (no {owner_marker(run_id)} in its description); rename or delete it, or use "
                f"another run id",
                kind="fatal",
                code="alreadyExists",
                where=Location(region=self.region),
            )

    def owned_firewalls(self) -> list[compute_v1.Firewall]:
        """Every firewall rule of the project that carries a run's ownership marker (never matched by name)."""
        rules = self.api.call(lambda: list(self.api.firewalls.list(project=self.project)))
        return [r for r in rules if marked_run(r.description) is not None]

    # -- egress: the run's Cloud NAT ---------------------------------------------------------

    def on_network(self, network: str) -> bool:
        """Whether a router's ``network`` (a full or partial URL) is this provider's network."""
        return network.rstrip("/") == f"global/networks/{self.network}" or network.rstrip("/").endswith(
            f"/global/networks/{self.network}"
        )

    def ensure_worker_egress(self, run_id: str) -> str | None:
        """What the run's workers need to reach the internet in this region (``worker_egress``): with ``nat`` the
        run's subnetwork and a Cloud NAT serving it (:meth:`ensure_nat`, whose router's name is returned);
        otherwise nothing (None)."""
        return self.ensure_nat(run_id) if self.worker_egress == "nat" else None

    def ensure_nat(self, run_id: str) -> str:
        """The run's subnetwork in this region (:meth:`ensure_subnetwork`) and a Cloud NAT that serves it; returns the
        name of the router that holds the NAT. Looked up afresh on every call (before each provisioning), so what
        went in between is made again before the next worker boots.

        Normally the run's own router (:func:`router_name`) with one NAT of the run's subnetwork alone
        (``LIST_OF_SUBNETWORKS``, addresses allocated by Google, marked with the run's ownership marker): no other VM
        of the project gets egress through it. Compute Engine allows no NAT beside one that serves every subnetwork of
        a region and network; where there is one (yours, or a run's of an earlier rubberband) it serves the run's
        subnetwork too and is used as it is. NATs of chosen subnetworks (yours) stand beside the run's."""
        self.ensure_subnetwork(run_id)
        name = router_name(run_id)
        for attempt in range(2):
            routers = self.api.call(lambda: list(self.api.routers.list(project=self.project, region=self.region)))
            if any(r.name == name and marked_run(r.description) == run_id for r in routers):
                return name
            every = [r for r in routers if r.name != name and self.on_network(r.network) and serves_all(r)]
            if every:
                return every[0].name  # serves the run's subnetwork too; Compute Engine allows no NAT beside it
            try:
                self._create_router(name, run_id)
                return name
            except CloudError as exc:  # a NAT of every subnetwork may have come in between: look again
                if attempt == 1 or exc.kind != "fatal" or exc.code == "alreadyExists":
                    raise
        raise AssertionError("unreachable")  # pragma: no cover

    def _create_router(self, name: str, run_id: str) -> None:
        subnetwork = f"projects/{self.project}/regions/{self.region}/subnetworks/{subnet_name(run_id)}"
        router = compute_v1.Router(
            name=name,
            network=f"global/networks/{self.network}",
            description=f"rubberband run {run_id}: outbound internet for its workers (its subnetwork alone), which "
            f"have no external address {owner_marker(run_id)}",
            nats=[
                compute_v1.RouterNat(
                    name=name,
                    source_subnetwork_ip_ranges_to_nat="LIST_OF_SUBNETWORKS",
                    subnetworks=[
                        compute_v1.RouterNatSubnetworkToNat(name=subnetwork, source_ip_ranges_to_nat=["ALL_IP_RANGES"])
                    ],
                    nat_ip_allocate_option="AUTO_ONLY",
                )
            ],
        )
        insert = compute_v1.InsertRouterRequest(
            project=self.project, region=self.region, router_resource=router, request_id=str(uuid.uuid4())
        )
        try:
            op = self.api.call(lambda: self.api.routers.insert_unary(request=insert))
            self.api.wait_region_op(op, self.region)
        except CloudError as exc:  # made in between by another process of the run, or a look-alike of the user's
            if exc.code != "alreadyExists" and "already exists" not in exc.message:
                raise
            found = self.api.call(lambda: self.api.routers.get(project=self.project, region=self.region, router=name))
            if marked_run(found.description) != run_id:
                raise CloudError(
                    f"gcp: a Cloud Router named {name} exists in {self.region} but rubberband did not "
                    f"create it for run {run_id} (no {owner_marker(run_id)} in its description); "
                    f"rename or delete it, or use another run id",
                    kind="fatal",
                    code="alreadyExists",
                    where=Location(region=self.region),
                ) from None

    # -- the run's subnetwork (its private workers) --------------------------------------------

    def ensure_subnetwork(self, run_id: str) -> str:
        """The run's own subnetwork in this region (:func:`subnet_name`, marked as the run's), made on first use with
        a /20 of :data:`SUBNET_POOL` that no subnetwork of the network holds; returns its name. Its private workers go
        there, so the run's NAT serves them and nothing else. A subnetwork of that name without the run's marker is a
        fatal error (never taken for the run's)."""
        name = subnet_name(run_id)
        found = self._subnetwork_or_none(name)
        if found is None:
            found = self._create_subnetwork(name, run_id)
        if marked_run(found.description) != run_id:
            raise CloudError(
                f"gcp: a subnetwork named {name} exists in {self.region} but rubberband did not create it for run "
                f"{run_id} (no {owner_marker(run_id)} in its description); rename or delete it, or use another run id",
                kind="fatal",
                code="alreadyExists",
                where=Location(region=self.region),
            )
        return name

    def _subnetwork_or_none(self, name: str) -> compute_v1.Subnetwork | None:
        try:
            return self.api.call(
                lambda: self.api.subnetworks.get(project=self.project, region=self.region, subnetwork=name)
            )
        except CloudError as exc:
            if exc.code != "notFound":
                raise
            return None

    def _create_subnetwork(self, name: str, run_id: str) -> compute_v1.Subnetwork:
        """Insert the run's subnetwork with the first free block that Compute Engine takes (another run may take a
        block in between, a peered network may hold it: the next one is tried, at most :data:`SUBNET_TRIES`)."""
        refused: CloudError | None = None
        for cidr in itertools.islice(free_blocks(run_id, self._taken_ranges()), SUBNET_TRIES):
            body = compute_v1.Subnetwork(
                name=name,
                network=f"global/networks/{self.network}",
                ip_cidr_range=cidr,
                private_ip_google_access=True,
                description=f"rubberband run {run_id}: its private workers, the only VMs its Cloud NAT serves "
                f"{owner_marker(run_id)}",
            )
            try:
                self._insert_subnetwork(body)
            except CloudError as exc:
                if exc.code == "alreadyExists" or "already exists" in exc.message:
                    break  # another process of the run made it: read below (its marker is checked by the caller)
                if "conflict" not in exc.message.lower() and "overlap" not in exc.message.lower():
                    raise
                refused = exc
                continue
            break
        else:
            raise CloudError(
                f"gcp: no free /{SUBNET_PREFIX} of {SUBNET_POOL} for run {run_id}'s subnetwork in network "
                f"{self.network} ({refused.message if refused else 'every block is taken'}); pass --worker-egress "
                f"existing or public",
                kind="fatal",
                code="NoFreeRange",
                where=Location(region=self.region),
            )
        return self.api.call(
            lambda: self.api.subnetworks.get(project=self.project, region=self.region, subnetwork=name)
        )

    def _insert_subnetwork(self, body: compute_v1.Subnetwork) -> None:
        insert = compute_v1.InsertSubnetworkRequest(
            project=self.project, region=self.region, subnetwork_resource=body, request_id=str(uuid.uuid4())
        )
        op = self.api.call(lambda: self.api.subnetworks.insert_unary(request=insert))
        self.api.wait_region_op(op, self.region)

    def _taken_ranges(self) -> list[str]:
        """Every IPv4 range a subnetwork of this network holds, in any region (primary and secondary)."""
        pager = self.api.call(
            lambda: list(
                self.api.subnetworks.aggregated_list(
                    request=compute_v1.AggregatedListSubnetworksRequest(project=self.project)
                )
            )
        )
        taken = []
        for _, scoped in pager:
            for subnet in scoped.subnetworks:
                if self.on_network(subnet.network):
                    taken += [subnet.ip_cidr_range, *(r.ip_cidr_range for r in subnet.secondary_ip_ranges)]
        return [t for t in taken if t]

    def owned_subnetworks(self) -> list[tuple[str, compute_v1.Subnetwork]]:
        """(region, subnetwork) of every subnetwork of the project carrying a run's ownership marker (never matched
        by name), in any region."""
        pager = self.api.call(
            lambda: list(
                self.api.subnetworks.aggregated_list(
                    request=compute_v1.AggregatedListSubnetworksRequest(project=self.project)
                )
            )
        )
        return [
            (scope.rsplit("/", 1)[-1], subnet)
            for scope, scoped in pager
            for subnet in scoped.subnetworks
            if marked_run(subnet.description) is not None
        ]

    def owned_routers(self) -> list[tuple[str, compute_v1.Router]]:
        """(region, router) of every Cloud Router of the project carrying a run's ownership marker (never matched
        by name), in any region: a run that failed over made one in each region it put workers in."""
        pager = self.api.call(
            lambda: list(
                self.api.routers.aggregated_list(request=compute_v1.AggregatedListRoutersRequest(project=self.project))
            )
        )
        return [
            (scope.rsplit("/", 1)[-1], router)
            for scope, scoped in pager
            for router in scoped.routers
            if marked_run(router.description) is not None
        ]

    def delete_firewalls(self, run_id: str, timeout_s: float) -> list[str]:
        doomed = [
            Doomed(
                f"firewall/{rule.name}",
                partial(
                    self.api.firewalls.delete_unary,
                    request=compute_v1.DeleteFirewallRequest(
                        project=self.project, firewall=rule.name, request_id=str(uuid.uuid4())
                    ),
                ),
                partial(self.api.wait_global_op, timeout_s=timeout_s),
            )
            for rule in self.owned_firewalls()
            if marked_run(rule.description) == run_id
        ]
        deleted = self.api.delete_each(doomed)
        self._firewalls.difference_update(label.split("/", 1)[1] for label in deleted)
        return deleted

    def delete_routers(self, run_id: str, timeout_s: float, regions_in_use: Callable[[str], set[str]]) -> list[str]:
        routers = [(region, r) for region, r in self.owned_routers() if marked_run(r.description) == run_id]
        served = regions_in_use(run_id) if any(serves_all(r) for _, r in routers) else set()
        # one that serves all of a region's subnetworks stays while other runs' workers there may go out through it
        # (the sweep deletes it after the last of them)
        return self.api.delete_each(
            Doomed(
                f"router/{router.name}",
                partial(
                    self.api.routers.delete_unary,
                    request=compute_v1.DeleteRouterRequest(
                        project=self.project, region=region, router=router.name, request_id=str(uuid.uuid4())
                    ),
                ),
                partial(self.api.wait_region_op, region=region, timeout_s=timeout_s),
            )
            for region, router in routers
            if not (serves_all(router) and region in served)
        )

    def delete_subnetworks(self, run_id: str, timeout_s: float) -> list[str]:
        return self.api.delete_each(
            (
                Doomed(
                    f"subnetwork/{subnet.name}",
                    partial(
                        self.api.subnetworks.delete_unary,
                        request=compute_v1.DeleteSubnetworkRequest(
                            project=self.project, region=region, subnetwork=subnet.name, request_id=str(uuid.uuid4())
                        ),
                    ),
                    partial(self.api.wait_region_op, region=region, timeout_s=timeout_s),
                )
                for region, subnet in self.owned_subnetworks()
                if marked_run(subnet.description) == run_id
            ),
            tolerate=("notFound", "resourceInUseByAnotherResource"),  # still in use: later
        )
