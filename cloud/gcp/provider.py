"""Google Compute Engine behind the :class:`~rubberband.cloud.provider.Provider` interface.

* Credentials: Google application default credentials. ``endpoint`` (or
  ``RUBBERBAND_GCE_ENDPOINT``) points every client at another server — for tests — and only
  then are anonymous credentials used.
* Catalog types are hosts (``a2-highgpu-1g``, GPUs included) or composed names
  ``n1-standard-8+V100x1`` (host + guest accelerators). GPU VMs get
  ``onHostMaintenance=TERMINATE``; spot VMs the SPOT provisioning model and
  ``instanceTerminationAction=DELETE`` (a preempted VM is deleted, not left with a billed disk).
* Labels: run id, stage, version, managed marker (cloud/provider.py keys); network tag ``rubberband-<run>``.
* The run's network (:mod:`~rubberband.cloud.gcp.run_network`): firewall rules that deny by default and open TCP
  between the run's VMs and SSH from a user-given CIDR to its head alone; for private workers (``worker_egress``,
  :data:`WORKER_EGRESS`: ``nat`` by default) the run's own subnetwork and Cloud NAT. Only the head gets an external
  address (the user's SSH); with ``public`` the workers get an ephemeral one (no rule lets anything in through
  it). :meth:`GcpProvider.cleanup_run` deletes them, by the run's ownership marker, never by name alone.
* Calls go through :class:`~rubberband.cloud.gcp.compute_api.ComputeApi`: retried, their errors mapped to
  rubberband's vocabulary, operations waited on with the ``*_unary`` calls and its own operations clients.
* An instance's id is its name (unique: ``rb-<run>-<stage>-<random>``); its zone is
  remembered, or found by an aggregated list.
* Preemption: Compute Engine records it as a zone operation of type
  ``compute.instances.preempted`` targeting the VM (kept for a while after the VM is gone). A
  stopped spot VM, or one that vanished, with such an operation gets the state reason
  ``preempted`` (:data:`PREEMPTED`, a spot interruption in cloud/provider.py): :meth:`list`,
  :meth:`describe` (which also reports the deleted ones: ``instanceTerminationAction=DELETE``)
  and :meth:`wait` (code ``InstancePreempted``) say so; anything else gone is just gone.
"""

from __future__ import annotations

import builtins

import dataclasses
import os
import re
import secrets
import time
import uuid
from datetime import datetime
from functools import partial
from typing import TYPE_CHECKING, TypedDict, TypeVar

import google.auth
import google.auth.exceptions
from google.auth.credentials import AnonymousCredentials, Credentials
from google.cloud import compute_v1

from rubberband import __version__
from rubberband.cloud.bootstrap import check_request, check_ssh_cidr
from rubberband.cloud.gcp import WORKER_EGRESS
from rubberband.cloud.gcp.boot import GCP_BOOT
from rubberband.clouds import chosen_image
from rubberband.cloud.gcp.session import ENDPOINT_ENV, PROJECT_ENV
from rubberband.credentials import assert_no_credentials, redact
from rubberband.cloud.failover import (
    CallContext,
    RetryPolicy,
    classify,
)
from rubberband.cloud.gcp.compute_api import ComputeApi, Doomed
from rubberband.cloud.gcp.run_network import RunNetwork, head_tag, network_tag
from rubberband.cloud.gcp.names import (
    instance_prefix,
    marked_run,
    subnet_name,
)
from rubberband.cloud.provider import (
    PermissionCheck,
    TAG_MANAGED,
    TAG_ROLE,
    TAG_RUN_ID,
    TAG_STAGE,
    Instance,
    InstanceRequest,
    check_option_names,
)
from rubberband.errors import CloudError, InputError, Location

if TYPE_CHECKING:
    from typing_extensions import Unpack

T = TypeVar("T")

#: Deep Learning VM image family with PyTorch (CUDA 12.9, NVIDIA driver 580, Ubuntu 22.04): the boot reuses its
#: torch and its Python (a head boots on it, its workers follow), so no node downloads a CUDA build.
DEFAULT_IMAGE = "projects/deeplearning-platform-release/global/images/family/pytorch-2-9-cu129-ubuntu-2204-nvidia-580"
ACCELERATOR_TYPES = {
    "V100": "nvidia-tesla-v100",
    "T4": "nvidia-tesla-t4",
    "P100": "nvidia-tesla-p100",
    "P4": "nvidia-tesla-p4",
    "K80": "nvidia-tesla-k80",
    "A100": "nvidia-tesla-a100",
    "A100-80GB": "nvidia-a100-80gb",
    "L4": "nvidia-l4",
    "H100": "nvidia-h100-80gb",
}
_STATES = {
    "PROVISIONING": "pending",
    "STAGING": "pending",
    "RUNNING": "running",
    "STOPPING": "stopping",
    "SUSPENDING": "stopping",
    "SUSPENDED": "stopped",
    "TERMINATED": "stopped",
    "REPAIRING": "pending",
}
#: The zone operation Compute Engine records when it preempts a spot / preemptible VM, and the state reason
#: rubberband gives such a VM (one of cloud/provider.py's SPOT_INTERRUPTION_REASONS).
PREEMPTED_OPERATION = "compute.instances.preempted"
PREEMPTED = "preempted"
_QUOTA_RE = re.compile(r"Quota '[A-Z0-9_]+' exceeded")
#: Public Compute Engine regions (2025); an unknown name is refused before any call.
GCP_REGIONS = frozenset(
    "africa-south1 asia-east1 asia-east2 asia-northeast1 asia-northeast2 asia-northeast3 asia-south1 asia-south2 "
    "asia-southeast1 asia-southeast2 australia-southeast1 australia-southeast2 europe-central2 europe-north1 "
    "europe-north2 europe-southwest1 europe-west1 europe-west2 europe-west3 europe-west4 europe-west6 "
    "europe-west8 europe-west9 europe-west10 europe-west12 me-central1 me-central2 me-west1 "
    "northamerica-northeast1 northamerica-northeast2 northamerica-south1 southamerica-east1 southamerica-west1 "
    "us-central1 us-east1 us-east4 us-east5 us-south1 us-west1 us-west2 us-west3 us-west4".split()
)


class GcpOptions(TypedDict, total=False):
    """:class:`GcpProvider`'s options, each optional (for ``gcp``, :class:`~rubberband.cloud.registry.ProviderPool`
    passes these as keywords)."""

    project: str | None  # default: ``RUBBERBAND_GCP_PROJECT``, else the credentials' project
    endpoint: str | None  # Compute Engine's endpoint (default: ``RUBBERBAND_GCE_ENDPOINT``, else Google's)
    credentials: Credentials | None  # default: anonymous with an endpoint, else application default credentials
    network: str  # the VPC network of the run's VMs (default ``default``)
    image: str | None  # the boot image (default: ``RUBBERBAND_GCP_IMAGE``, else :data:`DEFAULT_IMAGE`)
    ssh_cidr: str | None  # the run's firewall admits SSH to its head from this CIDR only (default: from nowhere)
    service_account: str | None  # the service account VMs start with
    disk_gb: int  # each VM's boot disk (default 100 GB)
    worker_egress: str  # how workers reach the internet: one of :data:`WORKER_EGRESS` (default ``nat``)
    retry: RetryPolicy | None  # backoff for transient errors (default: ``RetryPolicy()``)
    poll_s: float  # how often :meth:`GcpProvider.wait` looks (default 5 s)
    version: str  # the rubberband version in labels (default: this one)


def _access(region: str, options: GcpOptions) -> tuple[str | None, Credentials, str]:
    """The endpoint, credentials and project the options give, or the environment's and the defaults'."""
    endpoint = options.get("endpoint") or os.environ.get(ENDPOINT_ENV) or None
    credentials, project = options.get("credentials"), options.get("project")
    if endpoint:
        credentials = credentials or AnonymousCredentials()
        project = project or os.environ.get(PROJECT_ENV) or "rubberband-test"
    elif credentials is None:
        try:
            credentials, default_project = google.auth.default(
                scopes=["https://www.googleapis.com/auth/cloud-platform"]
            )
        except google.auth.exceptions.DefaultCredentialsError:
            raise classify(
                "UNAUTHENTICATED", "no Google application default credentials found", CallContext("gcp", region=region)
            ) from None
        project = project or os.environ.get(PROJECT_ENV) or default_project
    if not project:
        raise InputError("no GCP project: set RUBBERBAND_GCP_PROJECT or `gcloud config set project`")
    return endpoint, credentials, project


class GcpProvider:
    """Compute Engine VMs of one region (one project) for rubberband runs."""

    cloud = "gcp"
    boot_dialect = GCP_BOOT

    def __init__(self, region: str, **options: Unpack[GcpOptions]) -> None:
        check_option_names("GcpProvider", options, GcpOptions.__optional_keys__)
        if region not in GCP_REGIONS:
            raise InputError(f"GCP region {region!r} is unknown; use one of e.g. us-central1, us-east1, europe-west4")
        endpoint, credentials, project = _access(region, options)
        worker_egress = options.get("worker_egress", "nat")
        if worker_egress not in WORKER_EGRESS:
            raise InputError(f"--worker-egress {worker_egress!r}: use one of {', '.join(WORKER_EGRESS)}")
        ssh_cidr = options.get("ssh_cidr")
        self.region = region
        self.project = project
        self.endpoint = endpoint
        self.network = options.get("network", "default")
        self.image = options.get("image") or chosen_image("gcp") or DEFAULT_IMAGE
        self.service_account = options.get("service_account")
        self.disk_gb = options.get("disk_gb", 100)
        self.worker_egress = worker_egress
        self.retry = options.get("retry") or RetryPolicy()
        self.poll_s = options.get("poll_s", 5.0)
        self.version = options.get("version", __version__)
        self._zones: dict[str, str] = {}  # instance name -> zone
        self._last_seen: dict[str, Instance] = {}  # instance name -> as last seen (for a VM that vanished)
        #: Compute Engine's clients, every call retried and its errors mapped (:mod:`~rubberband.cloud.gcp.compute_api`)
        self.api = ComputeApi(
            region=region, project=project, endpoint=endpoint, credentials=credentials, retry=self.retry
        )
        #: The runs' firewall rules, subnetworks and Cloud NATs here (:mod:`~rubberband.cloud.gcp.run_network`)
        self.run_network = RunNetwork(
            self.api,
            network=self.network,
            ssh_cidr=check_ssh_cidr(ssh_cidr) if ssh_cidr else None,
            worker_egress=self.worker_egress,
        )

    def _disks(self, run_id: str | None = None) -> list[tuple[str, compute_v1.Disk]]:
        """(zone, disk) of the detached disks carrying rubberband's labels (one run's when given): a disk a deleted
        VM left behind, still billing. Attached ones go with their VM (``autoDelete``)."""
        terms = [f'(labels.{TAG_MANAGED} = "true")']
        if run_id is not None:
            terms.append(f'(labels.{TAG_RUN_ID} = "{run_id}")')
        pager = self.api.call(
            lambda: list(
                self.api.disks.aggregated_list(
                    request=compute_v1.AggregatedListDisksRequest(project=self.project, filter=" AND ".join(terms))
                )
            )
        )
        found = []
        for scope, scoped in pager:
            for disk in scoped.disks:
                labels = dict(disk.labels)
                if (
                    labels.get(TAG_MANAGED) == "true"
                    and (run_id is None or labels.get(TAG_RUN_ID) == run_id)
                    and not list(disk.users)
                ):
                    found.append((scope.rsplit("/", 1)[-1], disk))
        return found

    def _regions_of_other_runs(self, run_id: str) -> set[str]:
        """Regions where a rubberband VM of another run without an external address is alive: a NAT of every
        subnetwork there (one an earlier rubberband made) may be its egress."""
        return {
            inst.zone.rsplit("-", 1)[0]
            for inst in self.list()
            if inst.run_id != run_id and inst.alive and not inst.public_address
        }

    # -- the run's network (:class:`~rubberband.cloud.gcp.run_network.RunNetwork`) --------------------------

    def ensure_firewall(self, run_id: str) -> list[str]:
        """The run's firewall rules (:meth:`RunNetwork.ensure_firewall`); their names."""
        return self.run_network.ensure_firewall(run_id)

    def ensure_worker_egress(self, run_id: str) -> str | None:
        """What the run's workers need to reach the internet here (:meth:`RunNetwork.ensure_worker_egress`)."""
        return self.run_network.ensure_worker_egress(run_id)

    def ensure_nat(self, run_id: str) -> str:
        """The run's subnetwork here and a Cloud NAT that serves it (:meth:`RunNetwork.ensure_nat`); the router's
        name."""
        return self.run_network.ensure_nat(run_id)

    # -- Provider ---------------------------------------------------------------------------

    def instance_resource(self, request: InstanceRequest, name: str, zone: str) -> compute_v1.Instance:
        """The Compute Engine instance body for one VM of ``request``."""
        itype = request.instance_type
        host = itype.host_type or itype.name.split("+", 1)[0]
        labels = dict(request.tags(self.version))
        is_head = labels.get(TAG_ROLE) == "head"
        has_gpu = itype.accelerator_count > 0
        accelerators = []
        if has_gpu and "+" in itype.name:  # n1 host + attached GPUs; a2/g2 hosts bring their own
            gce_name = ACCELERATOR_TYPES.get(itype.device)
            if gce_name is None:
                raise InputError(
                    f"accelerator {itype.device!r} has no Compute Engine name; "
                    f"known: {', '.join(sorted(ACCELERATOR_TYPES))}"
                )
            accelerators.append(
                compute_v1.AcceleratorConfig(
                    accelerator_count=itype.accelerator_count,
                    accelerator_type=f"zones/{zone}/acceleratorTypes/{gce_name}",
                )
            )
        scheduling = compute_v1.Scheduling(
            on_host_maintenance="TERMINATE" if has_gpu else "MIGRATE",
            automatic_restart=not request.spot and not has_gpu,
            provisioning_model="SPOT" if request.spot else "STANDARD",
        )
        if request.spot or request.max_lifetime_s:
            scheduling.instance_termination_action = "DELETE"  # preempted / expired: deleted, no billed disk
        if request.max_lifetime_s:
            scheduling.max_run_duration = compute_v1.Duration(seconds=int(request.max_lifetime_s))
        metadata = []
        if has_gpu:  # Deep Learning VM images install the NVIDIA driver at first boot when asked to
            metadata.append(compute_v1.Items(key="install-nvidia-driver", value="True"))
        if request.startup_script:
            metadata.append(
                compute_v1.Items(
                    key="startup-script", value=assert_no_credentials(request.startup_script, what="GCE startup-script")
                )
            )
        resource = compute_v1.Instance(
            name=name,
            machine_type=f"zones/{zone}/machineTypes/{host}",
            labels=labels,
            tags=compute_v1.Tags(items=[network_tag(request.run_id), *([head_tag(request.run_id)] if is_head else [])]),
            metadata=compute_v1.Metadata(items=metadata),
            guest_accelerators=accelerators,
            scheduling=scheduling,
            disks=[
                compute_v1.AttachedDisk(
                    boot=True,
                    auto_delete=True,
                    initialize_params=(
                        compute_v1.AttachedDiskInitializeParams(
                            source_image=self.image, disk_size_gb=self.disk_gb, labels=labels
                        )
                    ),
                )
            ],
            network_interfaces=[self._nic(request.run_id, is_head=is_head)],
        )
        if self.service_account:
            resource.service_accounts = [
                compute_v1.ServiceAccount(
                    email=self.service_account, scopes=["https://www.googleapis.com/auth/cloud-platform"]
                )
            ]
        return resource

    def _nic(self, run_id: str, *, is_head: bool) -> compute_v1.NetworkInterface:
        """A VM's network interface: the head's with an external address (the user's SSH), a worker's in the run's
        subnetwork without one (``nat``: the run's NAT serves that subnetwork alone), or in the network's own
        subnetwork (``existing``; ``public``: with an external address)."""
        nic = compute_v1.NetworkInterface(network=f"global/networks/{self.network}")
        if is_head or self.worker_egress == "public":
            nic.access_configs = [compute_v1.AccessConfig(name="External NAT", type_="ONE_TO_ONE_NAT")]
        elif self.worker_egress == "nat":
            nic.subnetwork = f"regions/{self.region}/subnetworks/{subnet_name(run_id)}"
        return nic

    def _check_request(self, request: InstanceRequest) -> str:
        check_request(request, cloud="gcp", region=self.region, provider="GCP")
        itype = request.instance_type
        zone = request.zone or (itype.zones[0] if itype.zones else "")
        if not zone:
            raise InputError(f"{itype.name} lists no zone in {self.region}; give the request a zone")
        return zone

    def provision(self, request: InstanceRequest) -> list[Instance]:
        """Insert ``count`` VMs (all or nothing: if one fails, the others are deleted)."""
        zone = self._check_request(request)
        self.ensure_firewall(request.run_id)
        if request.extra_tags.get(TAG_ROLE) != "head":
            self.ensure_worker_egress(request.run_id)  # before the first worker: its boot installs packages
        name_of = request.instance_type.name
        names: list[str] = []
        operations: list[compute_v1.Operation] = []
        failure: CloudError | None = None
        created: list[str] = []
        try:
            for _ in range(request.count):
                name = f"{instance_prefix(request.run_id)}{request.stage}-{secrets.token_hex(3)}"
                body = self.instance_resource(request, name, zone)
                insert = compute_v1.InsertInstanceRequest(  # request_id: retries of this insert are idempotent
                    project=self.project, zone=zone, instance_resource=body, request_id=str(uuid.uuid4())
                )
                try:
                    op = self.api.call(
                        lambda: self.api.instances.insert_unary(request=insert),
                        zone=zone,
                        instance_type=name_of,
                        spot=request.spot,
                    )
                except CloudError as exc:
                    failure = exc
                    break
                names.append(name)
                operations.append(op)
                self._zones[name] = zone
            for name, op in zip(names, operations):
                done = self.api.wait_zone_op(op, zone)
                error = self.api.operation_error(done, zone=zone, instance_type=name_of, spot=request.spot)
                if error is None:
                    created.append(name)
                else:
                    self._zones.pop(name, None)
                    failure = failure or error
        except BaseException:
            self.terminate(names)  # all or nothing, even when waiting itself failed
            raise
        if failure is not None:
            self.terminate(created)
            raise failure
        return [self._get(name, zone) for name in created]

    def _get(self, name: str, zone: str) -> Instance:
        raw = self.api.call(lambda: self.api.instances.get(project=self.project, zone=zone, instance=name))
        inst = self._instance(raw, zone)
        self._last_seen[name] = inst
        return inst

    def _get_or_none(self, name: str, zone: str) -> Instance | None:
        """The VM, or None when Compute Engine no longer has it (deleted, or preempted and deleted)."""
        try:
            return self._get(name, zone)
        except CloudError as exc:
            if exc.code != "notFound":
                raise
            return None

    def preempted(self, zone: str) -> set[str]:
        """Names of the VMs in ``zone`` that Compute Engine preempted (its ``compute.instances.preempted``
        operations, which outlive the VMs for a while)."""
        request = compute_v1.ListZoneOperationsRequest(
            project=self.project, zone=zone, filter=f'operationType="{PREEMPTED_OPERATION}"'
        )
        operations = self.api.call(lambda: list(self.api.zone_operations.list(request=request)), zone=zone)
        return {
            op.target_link.rsplit("/", 1)[-1]
            for op in operations
            if op.operation_type == PREEMPTED_OPERATION and "/instances/" in op.target_link
        }

    def _gone_error(self, name: str, zone: str, inst: Instance | None) -> CloudError:
        """Why a VM waited on stopped or vanished before it ran: preempted (spot capacity) or not."""
        if name in self.preempted(zone):
            return CloudError(
                f"gcp: instance {name} in {zone} was preempted before it ran (spot capacity taken back)",
                kind="capacity",
                code="InstancePreempted",
                where=Location(region=self.region, zone=zone),
            )
        what = "was deleted" if inst is None else f"went {inst.state}"
        return CloudError(
            f"gcp: instance {name} in {zone} {what} before it ran",
            kind="capacity",
            code="InstanceGone",
            where=Location(region=self.region, zone=zone),
        )

    def console_output(self, instance_id: str, *, lines: int = 20) -> str:
        """The last ``lines`` of a VM's serial port 1 (its boot log: the startup script writes there); "" if none."""
        zone = self._zone_of(instance_id)
        if zone is None:
            return ""
        try:
            output = self.api.instances.get_serial_port_output(
                request=compute_v1.GetSerialPortOutputInstanceRequest(
                    project=self.project, zone=zone, instance=instance_id, port=1
                )
            )
        except Exception:  # noqa: BLE001 - best effort: an error message must not hide the original one
            return ""
        return redact("\n".join((output.contents or "").splitlines()[-lines:]))

    def _zone_of(self, name: str) -> str | None:
        if name not in self._zones:
            for inst in self.list():
                self._zones[inst.id] = inst.zone
        return self._zones.get(name)

    def wait(self, instance_ids: list[str], timeout_s: float) -> list[Instance]:
        deadline = time.monotonic() + timeout_s
        pending = list(instance_ids)
        ready: dict[str, Instance] = {}
        while pending:
            for name in list(pending):
                zone = self._zone_of(name)
                if zone is None:
                    raise CloudError(
                        f"gcp: instance {name} does not exist (preempted or deleted)",
                        kind="capacity",
                        code="InstanceGone",
                        where=Location(region=self.region),
                    )
                inst = self._get_or_none(name, zone)
                if inst is not None and inst.state == "running":
                    ready[name] = inst
                    pending.remove(name)
                elif inst is None or inst.state in ("stopping", "stopped"):
                    raise self._gone_error(name, zone, inst)
            if pending:
                if time.monotonic() >= deadline:
                    raise CloudError(
                        f"gcp: instances {', '.join(pending[:5])} not running after {timeout_s:g}s",
                        kind="transient",
                        code="WaitTimeout",
                        where=Location(region=self.region),
                    )
                time.sleep(min(self.poll_s, max(0.0, deadline - time.monotonic())))
        return [ready[name] for name in instance_ids]

    def list(self, run_id: str | None = None) -> builtins.list[Instance]:
        terms = [f'(labels.{TAG_MANAGED} = "true")']
        if run_id is not None:
            terms.append(f'(labels.{TAG_RUN_ID} = "{run_id}")')
        pager = self.api.call(
            lambda: self.api.instances.aggregated_list(
                request=compute_v1.AggregatedListInstancesRequest(project=self.project, filter=" AND ".join(terms))
            )
        )
        found: builtins.list[Instance] = []
        stopped_spot: dict[str, list[int]] = {}  # zone -> indices into found
        for scope, scoped in pager:
            zone = scope.rsplit("/", 1)[-1]
            for raw in scoped.instances:
                inst = self._instance(raw, zone)
                if inst.tags.get(TAG_MANAGED) == "true" and (run_id is None or inst.run_id == run_id):
                    self._zones[inst.id] = zone
                    if not inst.alive and (raw.scheduling.provisioning_model == "SPOT" or raw.scheduling.preemptible):
                        stopped_spot.setdefault(zone, []).append(len(found))
                    found.append(inst)
        for zone, indices in stopped_spot.items():  # one operations list per zone, only when a spot VM stopped
            preempted = self.preempted(zone)
            for index in indices:
                if found[index].id in preempted:
                    found[index] = dataclasses.replace(found[index], state_reason=PREEMPTED)
        for inst in found:
            self._last_seen[inst.id] = inst
        return found

    def describe(self, instance_ids: builtins.list[str]) -> builtins.list[Instance]:
        """These VMs as Compute Engine sees them now (as :meth:`list`), plus the ones this provider saw that
        were preempted and deleted since (state ``terminated``, reason ``preempted``); others gone are left out."""
        wanted = builtins.list(dict.fromkeys(instance_ids))
        seen = {i.id: i for i in self.list() if i.id in wanted}
        vanished = [name for name in wanted if name not in seen and name in self._zones]
        preempted: set[str] = set()
        for zone in dict.fromkeys(self._zones[name] for name in vanished):
            preempted |= self.preempted(zone)
        for name in vanished:
            if name in preempted:
                last = self._last_seen.get(name) or Instance(
                    id=name, cloud="gcp", instance_type="", zone=self._zones[name], state="terminated", run_id=""
                )
                seen[name] = dataclasses.replace(last, state="terminated", state_reason=PREEMPTED)
        return [seen[name] for name in wanted if name in seen]

    def terminate(self, instance_ids: builtins.list[str]) -> None:
        operations = []
        for name in dict.fromkeys(instance_ids):
            zone = self._zone_of(name)
            if zone is None:
                continue  # already gone
            delete = compute_v1.DeleteInstanceRequest(
                project=self.project, zone=zone, instance=name, request_id=str(uuid.uuid4())
            )
            op = self.api.delete(lambda: self.api.instances.delete_unary(request=delete), zone=zone)
            if op is None:
                continue
            operations.append((op, zone))
            self._zones.pop(name, None)
            self._last_seen.pop(name, None)
        for op, zone in operations:
            self.api.wait_zone_op(op, zone)

    def set_labels(self, instance_id: str, labels: dict[str, str]) -> None:
        """Merge ``labels`` into a VM's labels (a new stage when an instance is reused, the run's heartbeat).

        The write is conditioned on the labels' fingerprint: when they changed in between (another writer, or a
        retried write that had landed), they are read again and the merge retried."""
        zone = self._zone_of(instance_id)
        if zone is None:
            raise CloudError(f"gcp: instance {instance_id} does not exist", kind="fatal", code="notFound")
        for attempt in range(3):
            raw = self.api.call(lambda: self.api.instances.get(project=self.project, zone=zone, instance=instance_id))
            if all(raw.labels.get(k) == v for k, v in labels.items()):
                return  # already there (a retried write that landed)
            body = compute_v1.InstancesSetLabelsRequest(
                labels={**dict(raw.labels), **labels}, label_fingerprint=raw.label_fingerprint
            )
            try:
                op = self.api.call(
                    lambda: self.api.instances.set_labels_unary(
                        project=self.project,
                        zone=zone,
                        instance=instance_id,
                        instances_set_labels_request_resource=body,
                    )
                )
            except CloudError as exc:
                if exc.code != "conditionNotMet" or attempt == 2:
                    raise
                continue
            self.api.wait_zone_op(op, zone)
            return

    def check_permissions(self, request: InstanceRequest) -> builtins.list[PermissionCheck]:
        """The dry run's probe: Compute Engine has no DryRun, so ask ``projects.testIamPermissions`` whether the
        CLI's credentials hold every permission a run needs (:data:`~rubberband.cloud.gcp.identity.GCP_CLI_PERMISSIONS`);
        nothing is created."""
        from rubberband.cloud.gcp.identity import check_cli_permissions

        self._check_request(request)
        return [
            dataclasses.replace(c, region=self.region)
            for c in check_cli_permissions(self.project, endpoint=self.endpoint)
        ]

    # -- run-level resources ------------------------------------------------------------------

    def cleanup_run(self, run_id: str, timeout_s: float = 600.0) -> builtins.list[str]:
        """Delete the run's firewall rules, Cloud Routers and subnetworks (those carrying its ownership marker,
        :func:`owner_marker`; routers and subnetworks in every region) and its detached disks (by its exact labels);
        return what was deleted. A router of a NAT of every subnetwork (an earlier rubberband's) stays while a private
        VM of another run is alive in its region (it may go out through it); the orphan sweep deletes it once none is.
        A subnetwork still in use (a VM being deleted) stays for the next teardown or the sweep."""
        return [
            *self.run_network.delete_firewalls(run_id, timeout_s),
            *self.run_network.delete_routers(run_id, timeout_s, self._regions_of_other_runs),
            *self.run_network.delete_subnetworks(run_id, timeout_s),  # after the NAT that names it
            *self._delete_disks(run_id, timeout_s),
        ]

    def _delete_disks(self, run_id: str, timeout_s: float) -> builtins.list[str]:
        return self.api.delete_each(
            (
                Doomed(
                    f"disk/{disk.name}",
                    partial(
                        self.api.disks.delete_unary,
                        request=compute_v1.DeleteDiskRequest(
                            project=self.project, zone=zone, disk=disk.name, request_id=str(uuid.uuid4())
                        ),
                    ),
                    partial(self.api.wait_zone_op, zone=zone, timeout_s=timeout_s),
                    zone=zone,
                )
                for zone, disk in self._disks(run_id)
            ),
            tolerate=("notFound", "resourceInUseByAnotherResource"),  # still attached: later
        )

    def leftover_runs(self, *, older_than_s: float = 0.0, now: float | None = None) -> builtins.list[str]:
        """Runs whose firewall rules, Cloud Routers, subnetworks or detached disks outlived their VMs, created at least
        ``older_than_s`` ago; found by ownership marker and labels, never by a name pattern."""
        now = time.time() if now is None else now

        def old(created: str) -> bool:
            return (
                not created or now - datetime.fromisoformat(created.replace("Z", "+00:00")).timestamp() >= older_than_s
            )

        runs = {marked_run(r.description) for r in self.run_network.owned_firewalls() if old(r.creation_timestamp)}
        runs |= {marked_run(r.description) for _, r in self.run_network.owned_routers() if old(r.creation_timestamp)}
        runs |= {
            marked_run(n.description) for _, n in self.run_network.owned_subnetworks() if old(n.creation_timestamp)
        }
        runs |= {dict(d.labels).get(TAG_RUN_ID) for _, d in self._disks() if old(d.creation_timestamp)}
        runs.discard(None)
        runs.discard("")
        return sorted(r for r in runs - {i.run_id for i in self.list()} if r)

    # -- conversion ---------------------------------------------------------------------------

    def _instance(self, raw: compute_v1.Instance, zone: str) -> Instance:
        labels = dict(raw.labels)
        try:
            stage = int(labels.get(TAG_STAGE, "0"))
        except ValueError:
            stage = 0
        nic = raw.network_interfaces[0] if raw.network_interfaces else None
        public = nic.access_configs[0].nat_i_p if nic is not None and nic.access_configs else None
        launched = None
        if raw.creation_timestamp:
            launched = datetime.fromisoformat(raw.creation_timestamp.replace("Z", "+00:00")).timestamp()
        machine = raw.machine_type.rsplit("/", 1)[-1]
        accelerators = [a for a in raw.guest_accelerators]
        if accelerators:
            device = next(
                (k for k, v in ACCELERATOR_TYPES.items() if v == accelerators[0].accelerator_type.rsplit("/", 1)[-1]),
                "GPU",
            )
            machine = f"{machine}+{device}x{accelerators[0].accelerator_count}"
        return Instance(
            id=raw.name,
            cloud="gcp",
            instance_type=machine,
            zone=zone,
            state=_STATES.get(raw.status, "pending"),
            run_id=labels.get(TAG_RUN_ID, ""),
            stage=stage,
            address=nic.network_i_p if nic is not None else None,
            launched_at=launched,
            tags=labels,
            public_address=public or None,
            identity=raw.service_accounts[0].email if raw.service_accounts else "",
        )
