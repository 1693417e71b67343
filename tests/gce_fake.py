"""A small local stand-in for the Compute Engine REST API (stdlib HTTP), for google-cloud-compute.

Serves what rubberband's GcpProvider calls: instances insert / get / list / aggregatedList /
delete / setLabels, zoneOperations get / wait / list (``operationType`` / ``targetLink`` filters),
firewalls insert / get / list / delete and globalOperations get / wait, routers (the workers' Cloud NAT)
insert / get / list / aggregatedList / delete and regionOperations get / wait. State lives in memory;
faults are plain attributes the test sets (the server runs in a thread of the test process, so a
CLI subprocess pointed at it with ``RUBBERBAND_GCE_ENDPOINT`` sees them too):

* ``stockout_zones``: inserts there end in an operation error ZONE_RESOURCE_POOL_EXHAUSTED
  (HTTP 503 on the operation), as real stockouts do;
* ``quota``: a quota metric (``NVIDIA_V100_GPUS``, ``GPUS_ALL_REGIONS``): inserts fail with
  QUOTA_EXCEEDED — in the operation (default) or, with ``quota_sync``, as an HTTP 403
  ``quotaExceeded`` answer to the insert itself;
* ``capacity_left``: after this many VMs every zone is sold out (a partial gang);
* ``wait_errors``: this many operation waits answer HTTP 503 (transient, then retried);
* ``pending_polls``: operations stay RUNNING for this many reads, so waiting is exercised;
* ``stockout_types``: machine types (host names) sold out in every zone, from whenever the test sets it;
  ``stock``: how many more VMs of a machine type there are before it sells out everywhere (a capacity
  error in the middle of a run, at a known request); ``stockout_spot_only``: those stockouts hit SPOT VMs
  only (a zone out of spot capacity still sells STANDARD VMs);
* :meth:`GceFake.preempt`: what Compute Engine does to a spot VM it takes back — a
  ``compute.instances.preempted`` zone operation targeting it, then the VM deleted (its
  ``instanceTerminationAction`` is DELETE) or TERMINATED (STOP).

Where rubberband's client depends on it, the fake is as strict as the real API:

* request bodies with an unknown field (anywhere in the resource) or without a required one are
  refused with HTTP 400 and the API's message (``Invalid JSON payload received. Unknown name ...``);
* operations go PENDING → RUNNING → DONE over ``op_delay_s`` seconds (and ``pending_polls`` reads);
  their effect lands when they are DONE (an inserted VM is PROVISIONING until then, a deleted one
  STOPPING), ``operations.wait`` blocks until DONE or ``wait_cap_s``, as the real one does for 2 minutes;
* a repeated ``requestId`` answers the first request's operation and does nothing again;
* list calls page their results: ``maxResults`` (default ``page_size``; the fixture makes it 2, so
  every listing in the tests spans pages) and ``pageToken`` / ``nextPageToken``;
* ``scheduling``: ``maxRunDuration`` must be a Duration (``{"seconds": "N"}``, 30 s to 120 days) and
  needs ``instanceTerminationAction`` (DELETE or STOP), which in turn is accepted only with a
  ``maxRunDuration`` / ``terminationTime`` or the SPOT model;
* firewall rules: a priority in 0..65535, ``allowed`` or ``denied`` (not both), source ranges that are networks;
* routers: a name and a network reference (full or partial URL of this project), a body region that is the
  request's, NAT sections with their source and allocation options (no addresses with AUTO_ONLY, some with
  MANUAL_ONLY, subnetworks with LIST_OF_SUBNETWORKS), and no NAT beside one that serves every subnetwork of the
  region and network (as the API documents); an operation is found only in its own scope (zone, region, global).

:meth:`GceFake.ingress_allowed` evaluates the stored rules plus the ``default`` network's own
(:data:`DEFAULT_NETWORK_RULES`) as the VPC does — lowest priority number first, a deny winning a tie,
everything else denied — so tests can ask who reaches which port of which VM.

It also serves the few IAM / Resource Manager calls the dry run makes about a head's service
account (:meth:`GceFake.add_service_account`).

There is no GCE emulator in any registry reachable here; this fake implements only the
fields rubberband reads and writes.
"""

from __future__ import annotations

import base64
import json
import random
import re
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlparse

import pytest

_PREFIX = "/compute/v1/projects/(?P<project>[^/]+)"
_ROUTES: list[tuple[str, re.Pattern[str], str]] = [
    ("POST", re.compile(_PREFIX + r"/zones/(?P<zone>[^/]+)/instances$"), "insert"),
    ("GET", re.compile(_PREFIX + r"/zones/(?P<zone>[^/]+)/instances$"), "list"),
    ("GET", re.compile(_PREFIX + r"/aggregated/instances$"), "aggregated"),
    ("GET", re.compile(_PREFIX + r"/zones/(?P<zone>[^/]+)/instances/(?P<name>[^/]+)$"), "get"),
    ("DELETE", re.compile(_PREFIX + r"/zones/(?P<zone>[^/]+)/instances/(?P<name>[^/]+)$"), "delete"),
    ("POST", re.compile(_PREFIX + r"/zones/(?P<zone>[^/]+)/instances/(?P<name>[^/]+)/setLabels$"), "set_labels"),
    ("GET", re.compile(_PREFIX + r"/zones/(?P<zone>[^/]+)/operations$"), "op_list"),
    ("GET", re.compile(_PREFIX + r"/zones/(?P<zone>[^/]+)/operations/(?P<op>[^/]+)$"), "op_get"),
    ("POST", re.compile(_PREFIX + r"/zones/(?P<zone>[^/]+)/operations/(?P<op>[^/]+)/wait$"), "op_wait"),
    ("POST", re.compile(_PREFIX + r"/global/firewalls$"), "fw_insert"),
    ("GET", re.compile(_PREFIX + r"/global/firewalls$"), "fw_list"),
    ("GET", re.compile(_PREFIX + r"/global/firewalls/(?P<name>[^/]+)$"), "fw_get"),
    ("DELETE", re.compile(_PREFIX + r"/global/firewalls/(?P<name>[^/]+)$"), "fw_delete"),
    ("GET", re.compile(_PREFIX + r"/zones/(?P<zone>[^/]+)/disks$"), "disk_list"),
    ("GET", re.compile(_PREFIX + r"/aggregated/disks$"), "disk_aggregated"),
    ("DELETE", re.compile(_PREFIX + r"/zones/(?P<zone>[^/]+)/disks/(?P<name>[^/]+)$"), "disk_delete"),
    ("GET", re.compile(_PREFIX + r"/global/operations/(?P<op>[^/]+)$"), "op_get"),
    ("POST", re.compile(_PREFIX + r"/regions/(?P<region>[^/]+)/routers$"), "router_insert"),
    ("GET", re.compile(_PREFIX + r"/regions/(?P<region>[^/]+)/routers$"), "router_list"),
    ("GET", re.compile(_PREFIX + r"/aggregated/routers$"), "router_aggregated"),
    ("GET", re.compile(_PREFIX + r"/regions/(?P<region>[^/]+)/routers/(?P<name>[^/]+)$"), "router_get"),
    ("DELETE", re.compile(_PREFIX + r"/regions/(?P<region>[^/]+)/routers/(?P<name>[^/]+)$"), "router_delete"),
    ("POST", re.compile(_PREFIX + r"/regions/(?P<region>[^/]+)/subnetworks$"), "subnet_insert"),
    ("GET", re.compile(_PREFIX + r"/regions/(?P<region>[^/]+)/subnetworks$"), "subnet_list"),
    ("GET", re.compile(_PREFIX + r"/aggregated/subnetworks$"), "subnet_aggregated"),
    ("GET", re.compile(_PREFIX + r"/regions/(?P<region>[^/]+)/subnetworks/(?P<name>[^/]+)$"), "subnet_get"),
    ("DELETE", re.compile(_PREFIX + r"/regions/(?P<region>[^/]+)/subnetworks/(?P<name>[^/]+)$"), "subnet_delete"),
    ("GET", re.compile(_PREFIX + r"/regions/(?P<region>[^/]+)/operations/(?P<op>[^/]+)$"), "op_get"),
    ("POST", re.compile(_PREFIX + r"/regions/(?P<region>[^/]+)/operations/(?P<op>[^/]+)/wait$"), "op_wait"),
    ("POST", re.compile(_PREFIX + r"/global/operations/(?P<op>[^/]+)/wait$"), "op_wait"),
    # IAM and Resource Manager (the dry run's service-account checks)
    ("GET", re.compile(r"/v1/projects/(?P<project>[^/]+)/serviceAccounts/(?P<email>[^/:]+)$"), "sa_get"),
    (
        "POST",
        re.compile(r"/v1/projects/(?P<project>[^/]+)/serviceAccounts/(?P<email>[^/:]+):testIamPermissions$"),
        "sa_test",
    ),
    ("POST", re.compile(r"/v1/projects/(?P<project>[^/:]+):getIamPolicy$"), "get_iam_policy"),
    ("POST", re.compile(r"/v1/projects/(?P<project>[^/:]+):setIamPolicy$"), "set_iam_policy"),
    ("POST", re.compile(r"/v1/projects/(?P<project>[^/:]+):testIamPermissions$"), "test_iam_permissions"),
    ("GET", re.compile(r"/v1/(?P<role>(?:projects/[^/]+/)?roles/[^/]+)$"), "role_get"),
]
#: Fields of the request bodies the real API knows (the subset of the discovery schema rubberband could send);
#: anything else is refused, as the real API refuses unknown names. ``None``: a scalar / map, not checked inside.
_SCHEMA: dict[str, dict[str, object]] = {
    "instance": {
        k: None
        for k in (
            "name",
            "description",
            "machineType",
            "labels",
            "minCpuPlatform",
            "canIpForward",
            "deletionProtection",
            "hostname",
            "resourcePolicies",
            "sourceMachineImage",
            "privateIpv6GoogleAccess",
            "keyRevocationActionType",
            "id",
            "kind",
            "status",
            "zone",
            "selfLink",
            "creationTimestamp",
            "labelFingerprint",
        )
    }
    | {
        "tags": "tags",
        "metadata": "metadata",
        "disks": "disk",
        "networkInterfaces": "nic",
        "serviceAccounts": "serviceAccount",
        "scheduling": "scheduling",
        "guestAccelerators": "accelerator",
    },
    "tags": {"items": None, "fingerprint": None},
    "metadata": {"items": "item", "fingerprint": None, "kind": None},
    "item": {"key": None, "value": None},
    "disk": {
        k: None
        for k in (
            "boot",
            "autoDelete",
            "type",
            "mode",
            "deviceName",
            "source",
            "interface",
            "diskSizeGb",
            "index",
            "kind",
        )
    }
    | {"initializeParams": "initializeParams"},
    "initializeParams": {
        k: None
        for k in ("sourceImage", "diskSizeGb", "diskType", "labels", "diskName", "description", "resourcePolicies")
    },
    "nic": {k: None for k in ("network", "subnetwork", "networkIP", "name", "stackType", "nicType", "kind")}
    | {"accessConfigs": "accessConfig"},
    "accessConfig": {k: None for k in ("name", "type", "natIP", "networkTier", "kind")},
    "serviceAccount": {"email": None, "scopes": None},
    "scheduling": {
        k: None
        for k in (
            "onHostMaintenance",
            "automaticRestart",
            "preemptible",
            "provisioningModel",
            "instanceTerminationAction",
            "maxRunDuration",
            "terminationTime",
            "minNodeCpus",
            "nodeAffinities",
        )
    },
    "accelerator": {"acceleratorType": None, "acceleratorCount": None},
    "firewall": {
        k: None
        for k in (
            "name",
            "description",
            "network",
            "direction",
            "priority",
            "sourceRanges",
            "destinationRanges",
            "sourceTags",
            "targetTags",
            "sourceServiceAccounts",
            "targetServiceAccounts",
            "disabled",
            "logConfig",
            "id",
            "kind",
            "creationTimestamp",
            "selfLink",
        )
    }
    | {"allowed": "rule", "denied": "rule"},
    "rule": {"IPProtocol": None, "ports": None},
    "router": {
        k: None
        for k in (
            "name",
            "description",
            "region",
            "network",
            "interfaces",
            "bgpPeers",
            "bgp",
            "encryptedInterconnectRouter",
            "md5AuthenticationKeys",
            "id",
            "kind",
            "creationTimestamp",
            "selfLink",
        )
    }
    | {"nats": "nat"},
    "nat": {
        k: None
        for k in (
            "name",
            "type",
            "sourceSubnetworkIpRangesToNat",
            "natIpAllocateOption",
            "natIps",
            "drainNatIps",
            "minPortsPerVm",
            "maxPortsPerVm",
            "enableDynamicPortAllocation",
            "enableEndpointIndependentMapping",
            "endpointTypes",
            "autoNetworkTier",
            "udpIdleTimeoutSec",
            "icmpIdleTimeoutSec",
            "tcpEstablishedIdleTimeoutSec",
            "tcpTransitoryIdleTimeoutSec",
            "tcpTimeWaitTimeoutSec",
            "logConfig",
            "rules",
        )
    }
    | {"subnetworks": "natSubnet"},
    "natSubnet": {"name": None, "sourceIpRangesToNat": None, "secondaryIpRangeNames": None},
    "subnetwork": {
        k: None
        for k in (
            "name",
            "description",
            "network",
            "ipCidrRange",
            "region",
            "privateIpGoogleAccess",
            "purpose",
            "role",
            "stackType",
            "logConfig",
            "id",
            "kind",
            "creationTimestamp",
            "selfLink",
            "gatewayAddress",
            "fingerprint",
        )
    }
    | {"secondaryIpRanges": "secondaryRange"},
    "secondaryRange": {"rangeName": None, "ipCidrRange": None},
    "setLabels": {"labels": None, "labelFingerprint": None},
}
#: (field, why) the real API insists on, per body.
_REQUIRED = {
    "instance": [
        ("name", "Required field 'resource.name' not specified"),
        ("machineType", "Invalid value for field 'resource.machineType': ''. Required field not specified"),
        ("disks", "Invalid value for field 'resource.disks': ''. No disks are specified."),
        (
            "networkInterfaces",
            "Invalid value for field 'resource.networkInterfaces': ''. At least one network interface is required.",
        ),
    ],
    "firewall": [("name", "Required field 'resource.name' not specified")],
    "subnetwork": [
        ("name", "Required field 'resource.name' not specified"),
        ("network", "Invalid value for field 'resource.network': ''. The network of a subnetwork must be specified."),
        ("ipCidrRange", "Invalid value for field 'resource.ipCidrRange': ''. Required field not specified"),
    ],
    "router": [
        ("name", "Required field 'resource.name' not specified"),
        ("network", "Invalid value for field 'resource.network': ''. The network of a router must be specified."),
    ],
    "nat": [
        ("name", "Required field 'resource.nats[0].name' not specified"),
        (
            "sourceSubnetworkIpRangesToNat",
            "Invalid value for field 'resource.nats[0].sourceSubnetworkIpRangesToNat'"
            ": ''. Required field not specified",
        ),
        (
            "natIpAllocateOption",
            "Invalid value for field 'resource.nats[0].natIpAllocateOption': ''. Required field not specified",
        ),
    ],
    "setLabels": [("labelFingerprint", "Required field 'labelFingerprint' not specified")],
}
_LABEL_VALUE = re.compile(r"^[a-z0-9_-]{0,63}$")
_LABEL_TERM = re.compile(r'labels\.([a-z0-9_-]+)\s*=\s*"([^"]*)"')
_PERMISSION = re.compile(r"^(compute|iam|resourcemanager)\.[a-zA-Z]+\.[a-zA-Z]+$")
#: A resource name (RFC 1035, at most 63 characters), a region name, and a network reference as the API takes it:
#: a full URL, ``projects/P/global/networks/N`` or ``global/networks/N``.
_NAME = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")
_REGION = re.compile(r"^[a-z]+-[a-z]+[0-9]+$")
_NETWORK = re.compile(
    r"^(?:https://[^/]+/compute/v1/)?(?:projects/(?P<project>[^/]+)/)?global/networks/"
    r"(?P<name>[a-z]([-a-z0-9]{0,61}[a-z0-9])?)$"
)
_NAT_SOURCES = ("ALL_SUBNETWORKS_ALL_IP_RANGES", "ALL_SUBNETWORKS_ALL_PRIMARY_IP_RANGES", "LIST_OF_SUBNETWORKS")
#: The ``default`` network is in auto mode: a subnetwork ``default`` in every region, of these ranges, and the whole
#: 10.128.0.0/9 kept for them (a subnetwork of the user's or of a run must lie elsewhere).
AUTO_SUBNETS = {
    "us-central1": "10.128.0.0/20",
    "europe-west1": "10.132.0.0/20",
    "us-west1": "10.138.0.0/20",
    "asia-east1": "10.140.0.0/20",
    "us-east1": "10.142.0.0/20",
    "asia-northeast1": "10.146.0.0/20",
    "asia-southeast1": "10.148.0.0/20",
    "us-east4": "10.150.0.0/20",
    "europe-west2": "10.154.0.0/20",
    "europe-west3": "10.156.0.0/20",
    "europe-west4": "10.164.0.0/20",
    "us-west2": "10.168.0.0/20",
}
AUTO_MODE_RANGE = "10.128.0.0/9"
_SUBNETWORK = re.compile(
    r"^(?:https?://[^/]+/compute/v1/)?(?:projects/(?P<project>[^/]+)/)?regions/(?P<region>[^/]+)/subnetworks/"
    r"(?P<name>[a-z]([-a-z0-9]{0,61}[a-z0-9])?)$"
)
_OP_TERM = re.compile(r'(operationType|targetLink|status)\s*=\s*"([^"]*)"')


#: The ``default`` network's own ingress rules (every project has them unless removed): internal traffic from the
#: whole internal range and SSH / RDP / ICMP from anywhere, at priority 65534.
DEFAULT_NETWORK_RULES = [
    {
        "name": "default-allow-internal",
        "priority": 65534,
        "sourceRanges": ["10.128.0.0/9"],
        "allowed": [
            {"IPProtocol": "tcp", "ports": ["0-65535"]},
            {"IPProtocol": "udp", "ports": ["0-65535"]},
            {"IPProtocol": "icmp"},
        ],
    },
    {
        "name": "default-allow-ssh",
        "priority": 65534,
        "sourceRanges": ["0.0.0.0/0"],
        "allowed": [{"IPProtocol": "tcp", "ports": ["22"]}],
    },
    {
        "name": "default-allow-rdp",
        "priority": 65534,
        "sourceRanges": ["0.0.0.0/0"],
        "allowed": [{"IPProtocol": "tcp", "ports": ["3389"]}],
    },
]


@dataclass(frozen=True)
class _Connection:
    """One connection a firewall rule judges: from ``source_ip`` (a VM with ``source_tags``, or an outside address)
    to ``port`` over ``protocol`` of a VM with ``target_tags``."""

    source_ip: str
    source_tags: frozenset[str]
    target_tags: frozenset[str]
    protocol: str
    port: int


def _rule_matches(rule: dict[str, Any], conn: _Connection) -> bool:
    import ipaddress

    if rule.get("disabled") or rule.get("direction", "INGRESS") != "INGRESS":
        return False
    if rule.get("targetTags") and not conn.target_tags & set(rule["targetTags"]):
        return False
    by_range = any(
        ipaddress.ip_address(conn.source_ip) in ipaddress.ip_network(r, strict=False)
        for r in rule.get("sourceRanges", [])
        if ipaddress.ip_network(r, strict=False).version == ipaddress.ip_address(conn.source_ip).version
    )
    by_tag = bool(conn.source_tags & set(rule.get("sourceTags", [])))
    if not (by_range or by_tag):
        return False
    for entry in rule.get("allowed", []) or rule.get("denied", []):
        if entry["IPProtocol"] not in ("all", conn.protocol):
            continue
        ports = entry.get("ports") or ["0-65535"]
        for spec in ports:
            low, _, high = spec.partition("-")
            if int(low) <= conn.port <= int(high or low):
                return True
    return False


@dataclass(frozen=True)
class _Scope:
    """Where an operation lives: a zone's collection, a region's, or (neither) the project's global one."""

    project: str
    zone: str | None = None
    region: str | None = None


@dataclass(frozen=True)
class _OpError:
    """How an operation fails once it is DONE: its HTTP status and its error entry."""

    http_status: int
    error: dict[str, Any]


class HttpError(Exception):
    def __init__(self, status: int, message: str, reason: str) -> None:
        super().__init__(message)
        self.status, self.message, self.reason = status, message, reason


def _check_nat_sections(nats: list[dict[str, Any]]) -> None:
    """A router's NAT sections as strict as the real API: the required fields, a valid name, a source option and
    an allocation option each, no addresses with AUTO_ONLY, addresses with MANUAL_ONLY, subnetworks with
    LIST_OF_SUBNETWORKS."""
    for index, nat in enumerate(nats):
        for field_name, message in _REQUIRED["nat"]:
            if not nat.get(field_name):
                raise HttpError(400, message.replace("nats[0]", f"nats[{index}]"), "required")
        if not _NAME.match(nat["name"]):
            raise HttpError(400, f"Invalid value for field 'resource.nats[{index}].name': '{nat['name']}'.", "invalid")
        source, allocate = nat["sourceSubnetworkIpRangesToNat"], nat["natIpAllocateOption"]
        if source not in _NAT_SOURCES or allocate not in ("AUTO_ONLY", "MANUAL_ONLY"):
            raise HttpError(
                400,
                f"Invalid value for field 'resource.nats[{index}]': '{source}' / '{allocate}'. Unknown enum value.",
                "invalid",
            )
        if allocate == "AUTO_ONLY" and nat.get("natIps"):
            raise HttpError(
                400,
                f"Invalid value for field 'resource.nats[{index}].natIps': NAT IPs must not be "
                f"specified with AUTO_ONLY.",
                "invalid",
            )
        if allocate == "MANUAL_ONLY" and not nat.get("natIps"):
            raise HttpError(
                400,
                f"Invalid value for field 'resource.nats[{index}].natIps': MANUAL_ONLY needs at least one NAT IP.",
                "invalid",
            )
        if source == "LIST_OF_SUBNETWORKS" and not nat.get("subnetworks"):
            raise HttpError(
                400,
                f"Invalid value for field 'resource.nats[{index}].subnetworks': "
                f"LIST_OF_SUBNETWORKS needs at least one subnetwork.",
                "invalid",
            )


def _existing(table: dict, key: Any, path: str) -> dict:
    """``table[key]``, or the API's 404 naming the resource's ``path``."""
    found = table.get(key)
    if found is None:
        raise HttpError(404, f"The resource '{path}' was not found", "notFound")
    return found


class GceFake:
    """In-memory Compute Engine with fault switches; ``url`` once started."""

    def __init__(self) -> None:
        self.instances: dict[tuple[str, str], dict[str, Any]] = {}  # (zone, name) -> instance JSON
        self.firewalls: dict[str, dict[str, Any]] = {}
        self.disks: dict[tuple[str, str], dict[str, Any]] = {}  # (zone, name) -> disk JSON (boot disks of VMs)
        self.routers: dict[tuple[str, str], dict[str, Any]] = {}  # (region, name) -> Cloud Router JSON
        #: (region, name) -> subnetwork JSON, beside the default network's own (AUTO_SUBNETS, never stored here)
        self.subnetworks: dict[tuple[str, str], dict[str, Any]] = {}
        self.peered_ranges: list[str] = []  # ranges a peered network holds: a subnetwork overlapping one is refused
        self.operations: dict[str, dict[str, Any]] = {}
        self.stockout_zones: set[str] = set()
        self.stockout_sync = False  # answer stockouts as HTTP 503 on the insert itself (words only)
        self.quota: str | None = None
        self.quota_sync = False
        self.pending_polls = 0
        self.capacity_left: int | None = None  # VMs the fake still has room for (None: unlimited)
        self.wait_errors = 0  # answer this many operation reads with HTTP 503 backendError
        self.stockout_types: set[str] = set()  # machine types sold out in every zone
        self.stockout_spot_only = False  # the stockouts above hit SPOT VMs only (STANDARD ones still sell)
        self.stock: dict[str, int] = {}  # machine type -> VMs of it left; then sold out in every zone
        self.op_delay_s = 0.0  # an operation is PENDING, then RUNNING, and DONE after this long
        self.wait_cap_s = 2.0  # operations.wait returns after this long even if not DONE (the real cap: 2 min)
        self.page_size = 500  # maxResults when a list call gives none (the real default)
        self.request_ids: dict[str, str] = {}  # requestId -> the operation it started
        self.rejected: list[str] = []  # the messages of the 400s the fake answered (tests assert none)
        self.service_accounts: set[str] = set()
        self.iam_bindings: list[dict[str, Any]] = []  # the project's IAM policy bindings
        self.iam_version = 1  # the policy's etag counter (every write moves it)
        self.iam_races = 0  # this many setIamPolicy calls find the policy changed in between (HTTP 409)
        self.iam_forbidden: set[str] = set()  # "getIamPolicy" / "setIamPolicy": the caller may not (HTTP 403)
        self.tokens: dict[str, str] = {}  # access token -> service account (handed out by GceMetadata)
        self.authorized: list[tuple[str, str, str]] = []  # (method, path, service account) of calls with a token
        self.roles: dict[str, list[str]] = {}  # role name -> included permissions
        self.act_as = True  # the caller may attach service accounts (iam.serviceAccounts.actAs)
        #: what projects.testIamPermissions says the caller holds (None: every permission it knows)
        self.caller_permissions: set[str] | None = None
        #: the share of Compute Engine calls answered HTTP 503 backendError (drills), half of them after the
        #: call took effect (the answer lost on the way back); ``rng`` draws them
        self.error_rate = 0.0
        self.rng = random.Random(0)
        self.injected = 0  # errors injected so far
        self.inserts: list[tuple[str, str]] = []  # (zone, machine type) of every insert call
        self.requests: list[str] = []  # "METHOD path" of every request (tests grep it)
        self.bodies: list[str] = []  # raw request bodies (tests grep them for credentials)
        self._fw_pending: set[str] = set()
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._ip = 0
        self.url = ""

    # -- lifecycle ------------------------------------------------------------------------------

    def start(self) -> "GceFake":
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:  # quiet
                pass

            def _handle(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length).decode() if length else ""
                status, payload = fake.authorize(self.command, self.path, self.headers.get("Authorization"))
                if status == 200:
                    status, payload = fake.dispatch(self.command, self.path, raw)
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_DELETE = _handle

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    # -- dispatch -------------------------------------------------------------------------------

    def authorize(self, method: str, path: str, authorization: str | None) -> tuple[int, dict[str, Any]]:
        """A call that brings a bearer token must bring one a VM's metadata server handed out (:class:`GceMetadata`;
        HTTP 401 otherwise, as Google's APIs answer); such calls are recorded in ``authorized`` with the service
        account the token is for. Calls without one (the tests' anonymous clients) go on as before."""
        if not authorization:
            return 200, {}
        token = authorization.removeprefix("Bearer ").strip()
        with self._lock:
            email = self.tokens.get(token)
            if email is None:
                return 401, {
                    "error": {
                        "code": 401,
                        "message": "Request had invalid authentication credentials.",
                        "status": "UNAUTHENTICATED",
                    }
                }
            self.authorized.append((method, urlparse(path).path, email))
        return 200, {}

    def dispatch(self, method: str, path: str, raw: str) -> tuple[int, dict[str, Any]]:
        url = urlparse(path)
        query = {k: v[0] for k, v in parse_qs(url.query).items()}
        for route_method, pattern, handler in _ROUTES:
            match = pattern.match(url.path)
            if match and route_method == method:
                break
        else:
            with self._lock:
                self.requests.append(f"{method} {url.path}")
                self.bodies.append(raw)
            return 404, {
                "error": {
                    "code": 404,
                    "message": f"no route {method} {url.path}",
                    "errors": [{"reason": "notFound", "message": "no route"}],
                }
            }
        if handler == "op_wait":  # blocks (outside the lock) until the operation is due, as the real wait does
            with self._lock:
                found = self.operations.get(match["op"])
                due = found["_due"] if found else 0.0
            time.sleep(max(0.0, min(due - time.monotonic(), self.wait_cap_s)))
        with self._lock:
            self.requests.append(f"{method} {url.path}")
            self.bodies.append(raw)
            self._tick()
            request_id = query.get("requestId")
            inject = self.error_rate > 0 and url.path.startswith("/compute/") and self.rng.random() < self.error_rate
            after = inject and self.rng.random() < 0.5
            if inject and not after:
                self.injected += 1
                return 503, _backend_error()
            if request_id and request_id in self.request_ids:  # a retried request: the same operation, nothing redone
                return 200, _public(self.operations[self.request_ids[request_id]])
            try:
                body = json.loads(raw) if raw else {}
                result = getattr(self, f"_{handler}")(query=query, body=body, **match.groupdict())
                if request_id and result.get("kind") == "compute#operation":
                    self.request_ids[request_id] = result["name"]
                if after:  # it happened, but the caller hears an error (and retries with the same requestId)
                    self.injected += 1
                    return 503, _backend_error()
                return 200, result
            except HttpError as exc:
                if exc.status == 400:
                    self.rejected.append(exc.message)
                return exc.status, {
                    "error": {
                        "code": exc.status,
                        "message": exc.message,
                        "errors": [{"message": exc.message, "domain": "global", "reason": exc.reason}],
                    }
                }

    # -- strictness -----------------------------------------------------------------------------

    def _validate(self, body: dict[str, Any], kind: str) -> None:
        """Refuse what the real API refuses: unknown field names anywhere, required fields missing, bad labels."""

        def walk(value: Any, schema: str, where: str) -> None:
            fields = _SCHEMA[schema]
            if isinstance(value, list):
                for index, item in enumerate(value):
                    walk(item, schema, f"{where}[{index}]")
                return
            if not isinstance(value, dict):
                raise HttpError(400, f"Invalid JSON payload received. Expected an object at '{where}'.", "invalid")
            for key, item in value.items():
                if key not in fields:
                    raise HttpError(
                        400,
                        f"Invalid JSON payload received. Unknown name \"{key}\" at '{where}': Cannot find field.",
                        "invalid",
                    )
                if fields[key] is not None:
                    walk(item, str(fields[key]), f"{where}.{key}")

        walk(body, kind, "resource")
        for name, message in _REQUIRED.get(kind, []):
            if not body.get(name):
                raise HttpError(400, message, "required")
        for key, value in (body.get("labels") or {}).items():
            if not _LABEL_VALUE.match(str(value)) or not re.match(r"^[a-z][a-z0-9_-]{0,62}$", key):
                raise HttpError(
                    400,
                    f"Invalid value for field 'resource.labels': label {key}={value!r} does not match the pattern",
                    "invalid",
                )

    def _tick(self) -> None:
        """Move every operation along by the clock (PENDING → RUNNING → DONE); land the effects of those done."""
        now = time.monotonic()
        for op in self.operations.values():
            if op["status"] == "DONE":
                continue
            if op["_polls"] <= 0 and now >= op["_due"]:
                self._finish(op)
            elif now >= op["_started"] + (op["_due"] - op["_started"]) / 2 and op["status"] == "PENDING":
                op["status"] = "RUNNING"

    def _finish(self, op: dict[str, Any]) -> None:
        op["status"], op["progress"], op["endTime"] = "DONE", 100, _now()
        if op.get("_error") is not None:
            op["error"] = {"errors": [op["_error"]]}
            op["httpErrorStatusCode"] = op["_http_status"]
            op["httpErrorMessage"] = "SERVICE UNAVAILABLE" if op["_http_status"] == 503 else "FORBIDDEN"
        effect = op.pop("_effect", None)
        if effect is not None:
            effect()

    def _page(self, items: list[Any], query: dict[str, str]) -> tuple[list[Any], dict[str, str]]:
        """One page of ``items`` (maxResults, pageToken) and the nextPageToken field when more follow."""
        size = int(query.get("maxResults") or self.page_size)
        if not 0 < size <= 500:
            raise HttpError(400, "Invalid value for field 'maxResults': must be between 0 and 500", "invalid")
        token = query.get("pageToken")
        start = int(base64.urlsafe_b64decode(token).decode()) if token else 0
        page = items[start : start + size]
        more = (
            {"nextPageToken": base64.urlsafe_b64encode(str(start + size).encode()).decode()}
            if start + size < len(items)
            else {}
        )
        return page, more

    # -- operations -----------------------------------------------------------------------------

    def _operation(
        self, scope: _Scope, kind: str, target: str, *, effect: Any = None, failure: _OpError | None = None
    ) -> dict[str, Any]:
        """A new operation; ``effect`` (a callable) lands when it is DONE, ``failure`` shows only then."""
        project, zone, region = scope.project, scope.zone, scope.region
        name = f"operation-{uuid.uuid4().hex[:12]}"
        now = time.monotonic()
        op: dict[str, Any] = {
            "kind": "compute#operation",
            "id": str(abs(hash(name)) % 10**12),
            "name": name,
            "operationType": kind,
            "targetLink": target,
            "progress": 0,
            "status": "PENDING",
            "insertTime": _now(),
            "_polls": self.pending_polls,
            "_started": now,
            "_due": now + self.op_delay_s,
            "_effect": effect,
            "_error": failure.error if failure is not None else None,
            "_http_status": failure.http_status if failure is not None else None,
        }
        if zone:
            op["zone"] = f"{self.url}/compute/v1/projects/{project}/zones/{zone}"
            op["selfLink"] = f"{op['zone']}/operations/{name}"
        elif region:
            op["region"] = f"{self.url}/compute/v1/projects/{project}/regions/{region}"
            op["selfLink"] = f"{op['region']}/operations/{name}"
        else:
            op["selfLink"] = f"{self.url}/compute/v1/projects/{project}/global/operations/{name}"
        self.operations[name] = op
        if self.pending_polls <= 0 and self.op_delay_s <= 0:
            self._finish(op)
        return _public(op)

    def _op_get(self, project: str, op: str, query: dict, body: dict, **where: str) -> dict:
        """operations.get of a zone's or a region's operation (``where``: its route's ``zone`` or ``region``) or,
        neither given, a global one."""
        found = self._scoped_op(op, _Scope(project, **where))
        if found is None:
            raise HttpError(404, f"The resource 'operations/{op}' was not found", "notFound")
        if found["status"] != "DONE":
            found["_polls"] -= 1
            found["status"] = "RUNNING"
            self._tick()
        return _public(found)

    def _scoped_op(self, op: str, scope: _Scope) -> dict[str, Any] | None:
        """The operation, looked up where the caller asked: a zone's, a region's or a global one is found only in
        its own collection (as on Compute Engine, where asking the wrong one answers 404)."""
        zone, region = scope.zone, scope.region
        found = self.operations.get(op)
        if found is None:
            return None
        scope = (f"/zones/{zone}" if zone else None, f"/regions/{region}" if region else None)
        if not (found.get("zone", "").endswith(scope[0]) if zone else "zone" not in found) or not (
            found.get("region", "").endswith(scope[1]) if region else "region" not in found
        ):
            return None
        return found

    def _op_list(self, project: str, zone: str, query: dict, body: dict) -> dict:
        terms = _OP_TERM.findall(query.get("filter", ""))
        items = [
            _public(op)
            for op in self.operations.values()
            if op.get("zone", "").endswith(f"/zones/{zone}") and all(op.get(key) == value for key, value in terms)
        ]
        page, more = self._page(items, query)
        return {"kind": "compute#operationList", "items": page, **more}

    def _op_wait(self, project: str, op: str, query: dict, body: dict, **where: str) -> dict:
        """operations.wait, scoped as :meth:`_op_get`."""
        if self.wait_errors > 0:
            self.wait_errors -= 1
            raise HttpError(503, "Internal error. Please try again.", "backendError")
        found = self._scoped_op(op, _Scope(project, **where))
        if found is None:
            raise HttpError(404, f"The resource 'operations/{op}' was not found", "notFound")
        if found["status"] != "DONE":  # waited until due (or the cap): done unless reads are still owed
            found["_polls"] = min(found["_polls"], 0) if time.monotonic() >= found["_due"] else found["_polls"]
            found["status"] = "RUNNING"
            self._tick()
        return _public(found)

    # -- instances ------------------------------------------------------------------------------

    def _check_scheduling(self, scheduling: dict[str, Any]) -> None:
        """What Compute Engine insists on about a VM's lifetime fields."""
        action = scheduling.get("instanceTerminationAction")
        duration = scheduling.get("maxRunDuration")
        if duration is not None:
            seconds = duration.get("seconds") if isinstance(duration, dict) else None
            if not isinstance(seconds, str) or not seconds.isdigit() or not 30 <= int(seconds) <= 120 * 86400:
                raise HttpError(
                    400,
                    f"Invalid value for field 'resource.scheduling.maxRunDuration': {duration!r}. "
                    f"Must be a duration between 30 seconds and 120 days.",
                    "invalid",
                )
            if action not in ("DELETE", "STOP"):
                raise HttpError(
                    400,
                    "Invalid value for field 'resource.scheduling.instanceTerminationAction': "
                    f"{action!r}. It must be set when maxRunDuration is set.",
                    "invalid",
                )
        elif (
            action is not None
            and scheduling.get("provisioningModel") != "SPOT"
            and not scheduling.get("terminationTime")
        ):
            raise HttpError(
                400,
                "Invalid value for field 'resource.scheduling.instanceTerminationAction': "
                f"{action!r}. It can be set only for SPOT VMs or VMs with a maxRunDuration or "
                f"terminationTime.",
                "invalid",
            )
        if action not in (None, "DELETE", "STOP"):
            raise HttpError(
                400, f"Invalid value for field 'resource.scheduling.instanceTerminationAction': {action!r}.", "invalid"
            )

    def ingress_allowed(
        self,
        source_ip: str,
        target: str,
        port: int,
        *,
        source_tags: tuple[str, ...] = (),
        protocol: str = "tcp",
    ) -> bool:
        """Would the network let ``source_ip`` (a VM with ``source_tags``, or an outside address) reach ``port``
        of the VM named ``target``? The stored rules plus the default network's, lowest priority number first, a
        deny winning a tie; nothing matching: denied (the VPC's implied deny)."""
        (instance,) = [i for (zone, name), i in self.instances.items() if name == target]
        target_tags = set(instance.get("tags", {}).get("items", []))
        rules = [*self.firewalls.values(), *DEFAULT_NETWORK_RULES]
        conn = _Connection(source_ip, frozenset(source_tags), frozenset(target_tags), protocol, port)
        matching = [r for r in rules if _rule_matches(r, conn)]
        if not matching:
            return False
        best = min(r.get("priority", 1000) for r in matching)
        return not any("denied" in r for r in matching if r.get("priority", 1000) == best)

    def _insert(self, project: str, zone: str, query: dict, body: dict) -> dict:
        self._validate(body, "instance")
        self._check_scheduling(body.get("scheduling", {}))
        subnets = [self._nic_subnetwork(project, zone, nic) for nic in body.get("networkInterfaces", [])]
        name = body.get("name", "")
        machine = body.get("machineType", "").rsplit("/", 1)[-1]
        self.inserts.append((zone, machine))
        target = f"{self.url}/compute/v1/projects/{project}/zones/{zone}/instances/{name}"
        if self.quota:
            region = zone.rsplit("-", 1)[0]
            where = "globally" if self.quota == "GPUS_ALL_REGIONS" else f"in region {region}"
            message = f"Quota '{self.quota}' exceeded.  Limit: 0.0 {where}."
            if self.quota_sync:
                raise HttpError(403, message, "quotaExceeded")
            return self._operation(
                _Scope(project, zone=zone),
                "insert",
                target,
                failure=_OpError(
                    403,
                    {
                        "code": "QUOTA_EXCEEDED",
                        "message": message,
                        "errorDetails": [
                            {
                                "quotaInfo": {
                                    "metricName": f"compute.googleapis.com/{self.quota.lower()}",
                                    "limitName": f"{self.quota}-limit",
                                    "dimensions": {"region": region},
                                }
                            }
                        ],
                    },
                ),
            )
        sold_out = (
            zone in self.stockout_zones
            or self.capacity_left == 0
            or machine in self.stockout_types
            or self.stock.get(machine, 1) <= 0
        )
        if self.stockout_spot_only and body.get("scheduling", {}).get("provisioningModel") != "SPOT":
            sold_out = False
        if sold_out and self.stockout_sync:
            raise HttpError(
                503,
                f"The zone 'projects/{project}/zones/{zone}' does not have enough resources "
                f"available to fulfill the request.",
                "",
            )
        if sold_out:
            return self._operation(
                _Scope(project, zone=zone),
                "insert",
                target,
                failure=_OpError(
                    503,
                    {
                        "code": "ZONE_RESOURCE_POOL_EXHAUSTED",
                        "message": f"The zone 'projects/{project}/zones/{zone}' does not have enough resources "
                        f"available to fulfill the request.  Try a different zone, or try again later.",
                    },
                ),
            )
        if (zone, name) in self.instances:
            raise HttpError(409, f"The resource '{target}' already exists", "alreadyExists")
        if self.capacity_left is not None:
            self.capacity_left -= 1
        if machine in self.stock:
            self.stock[machine] -= 1
        self._ip += 1
        instance = json.loads(json.dumps(body))
        instance.update(
            {
                "kind": "compute#instance",
                "id": str(10**12 + self._ip),
                "status": "PROVISIONING",
                "zone": f"{self.url}/compute/v1/projects/{project}/zones/{zone}",
                "selfLink": target,
                "creationTimestamp": _now(),
                "labelFingerprint": uuid.uuid4().hex[:8],
            }
        )
        for nic, subnet in zip(instance.get("networkInterfaces", []), subnets):
            nic["subnetwork"] = subnet["selfLink"]
            nic["networkIP"] = _address_in(subnet["ipCidrRange"], self._ip)
            for access in nic.get("accessConfigs", []):
                access["natIP"] = f"34.1.0.{self._ip % 250 + 2}"
        self.instances[(zone, name)] = instance  # visible (PROVISIONING) while its insert runs, as on GCE
        for disk in instance.get("disks", []):  # the boot disk, created from its initializeParams
            params = disk.get("initializeParams") or {}
            disk_name = params.get("diskName") or name
            self.disks[(zone, disk_name)] = {
                "kind": "compute#disk",
                "id": str(10**13 + self._ip),
                "name": disk_name,
                "zone": instance["zone"],
                "sizeGb": str(params.get("diskSizeGb") or 10),
                "labels": dict(params.get("labels") or {}),
                "users": [target],
                "creationTimestamp": _now(),
                "selfLink": f"{self.url}/compute/v1/projects/{project}/zones/{zone}/disks/{disk_name}",
            }
            disk["source"] = self.disks[(zone, disk_name)]["selfLink"]

        def booted() -> None:
            if instance.get("status") == "PROVISIONING":
                instance["status"] = "STAGING"

        return self._operation(_Scope(project, zone=zone), "insert", target, effect=booted)

    def _find(self, zone: str, name: str) -> dict:
        return _existing(self.instances, (zone, name), f"projects/p/zones/{zone}/instances/{name}")

    def _get(self, project: str, zone: str, name: str, query: dict, body: dict) -> dict:
        instance = self._find(zone, name)
        result = json.loads(json.dumps(instance))
        if instance["status"] == "STAGING":
            instance["status"] = "RUNNING"  # boots between two reads
        return result

    def _matches(self, instance: dict, query: dict) -> bool:
        terms = _LABEL_TERM.findall(query.get("filter", ""))
        labels = instance.get("labels", {})
        return all(labels.get(key) == value for key, value in terms)

    def _list(self, project: str, zone: str, query: dict, body: dict) -> dict:
        items = [i for (z, _), i in self.instances.items() if z == zone and self._matches(i, query)]
        page, more = self._page(items, query)
        return {"kind": "compute#instanceList", "items": page, **more}

    def _aggregated(self, project: str, query: dict, body: dict) -> dict:
        matching = [(zone, i) for (zone, _), i in self.instances.items() if self._matches(i, query)]
        page, more = self._page(matching, query)
        scoped: dict[str, Any] = {}
        for zone, instance in page:
            scoped.setdefault(f"zones/{zone}", {"instances": []})["instances"].append(instance)
        return {"kind": "compute#instanceAggregatedList", "items": scoped, **more}

    def _delete(self, project: str, zone: str, name: str, query: dict, body: dict) -> dict:
        instance = self._find(zone, name)
        instance["status"] = "STOPPING"  # listed as stopping until its delete is done, as on GCE

        def deleted() -> None:
            if self.instances.get((zone, name)) is instance:
                del self.instances[(zone, name)]
                for attached in instance.get("disks", []):  # autoDelete disks go with it, others are detached
                    key = (zone, attached.get("source", "").rsplit("/", 1)[-1])
                    if key in self.disks:
                        if attached.get("autoDelete"):
                            del self.disks[key]
                        else:
                            self.disks[key]["users"] = []

        return self._operation(_Scope(project, zone=zone), "delete", instance["selfLink"], effect=deleted)

    def _set_labels(self, project: str, zone: str, name: str, query: dict, body: dict) -> dict:
        self._validate(body, "setLabels")
        instance = self._find(zone, name)
        if body.get("labelFingerprint") != instance["labelFingerprint"]:
            raise HttpError(412, "Labels fingerprint either invalid or resource labels have changed", "conditionNotMet")
        instance["labelFingerprint"] = uuid.uuid4().hex[:8]

        def relabelled() -> None:
            instance["labels"] = body.get("labels", {})

        return self._operation(_Scope(project, zone=zone), "setLabels", instance["selfLink"], effect=relabelled)

    def inserted(self) -> list[dict[str, Any]]:
        """The request body of every instance insert so far (VMs deleted since included)."""
        with self._lock:
            return [
                json.loads(raw)
                for request, raw in zip(self.requests, self.bodies)
                if request.startswith("POST") and request.endswith("/instances")
            ]

    def guest_poweroff(self, name: str) -> None:
        """What Compute Engine does when a VM's own OS powers it off (``shutdown -h``): the VM is stopped — TERMINATED,
        not deleted; its disk stays and no ``maxRunDuration`` applies to a stopped VM."""
        with self._lock:
            ((zone, instance),) = [(z, i) for (z, n), i in self.instances.items() if n == name]
            instance["status"] = "TERMINATED"

    def preempt(self, name: str) -> None:
        """Take a spot VM back as Compute Engine does: record a ``compute.instances.preempted`` operation (done,
        by the system), then delete the VM (``instanceTerminationAction`` DELETE) or leave it TERMINATED."""
        with self._lock:
            ((zone, instance),) = [(z, i) for (z, n), i in self.instances.items() if n == name]
            project = instance["selfLink"].split("/projects/", 1)[1].split("/", 1)[0]
            pending, delay, self.pending_polls, self.op_delay_s = self.pending_polls, self.op_delay_s, 0, 0.0
            try:
                op = self._operation(_Scope(project, zone=zone), "compute.instances.preempted", instance["selfLink"])
            finally:
                self.pending_polls, self.op_delay_s = pending, delay
            self.operations[op["name"]].update(user="system", statusMessage="Instance was preempted.")
            if instance.get("scheduling", {}).get("instanceTerminationAction") == "DELETE":
                del self.instances[(zone, name)]
            else:
                instance["status"] = "TERMINATED"

    # -- firewalls ------------------------------------------------------------------------------

    def _fw_insert(self, project: str, query: dict, body: dict) -> dict:
        self._validate(body, "firewall")
        if not body.get("allowed") and not body.get("denied"):
            raise HttpError(
                400,
                "Invalid value for field 'resource.allowed': ''. Must specify at least one allowed or denied rule.",
                "invalid",
            )
        if body.get("allowed") and body.get("denied"):
            raise HttpError(400, "A rule may specify allowed or denied, not both.", "invalid")
        if not 0 <= int(body.get("priority", 1000)) <= 65535:
            raise HttpError(
                400,
                f"Invalid value for field 'resource.priority': '{body.get('priority')}'. Must be between 0 and 65535.",
                "invalid",
            )
        import ipaddress

        for cidr in body.get("sourceRanges", []):
            try:
                ipaddress.ip_network(cidr, strict=False)
            except ValueError:
                raise HttpError(
                    400,
                    f"Invalid value for field 'resource.sourceRanges[0]': '{cidr}'. Must be a CIDR address range.",
                    "invalid",
                ) from None
        name = body.get("name", "")
        if name in self.firewalls or name in self._fw_pending:
            raise HttpError(
                409, f"The resource 'projects/{project}/global/firewalls/{name}' already exists", "alreadyExists"
            )
        self._fw_pending.add(name)

        def created() -> None:
            self._fw_pending.discard(name)
            self.firewalls[name] = {
                **body,
                "kind": "compute#firewall",
                "id": str(len(self.firewalls) + 1),
                "creationTimestamp": _now(),
            }

        return self._operation(_Scope(project), "insert", name, effect=created)

    def _fw_list(self, project: str, query: dict, body: dict) -> dict:
        page, more = self._page(list(self.firewalls.values()), query)
        return {"kind": "compute#firewallList", "items": page, **more}

    def _fw_get(self, project: str, name: str, query: dict, body: dict) -> dict:
        return _existing(self.firewalls, name, f"projects/{project}/global/firewalls/{name}")

    def _fw_delete(self, project: str, name: str, query: dict, body: dict) -> dict:
        self._fw_get(project, name, query, body)
        return self._operation(_Scope(project), "delete", name, effect=lambda: self.firewalls.pop(name, None))

    # -- Cloud Routers (and their NATs) ------------------------------------------------------------------

    def _check_region(self, project: str, region: str) -> None:
        if not _REGION.match(region):
            raise HttpError(400, f"Invalid value for field 'region': '{region}'. Unknown region.", "invalid")

    def _router_insert(self, project: str, region: str, query: dict, body: dict) -> dict:
        """routers.insert as strict as the real API: known fields only, a name and a network reference, a region in
        the body (if any) naming the path's, and NAT sections that make sense — a source option and an allocation
        option each, no addresses with AUTO_ONLY, addresses with MANUAL_ONLY, subnetworks with LIST_OF_SUBNETWORKS —
        and no NAT beside one serving every subnetwork of the region and network."""
        self._check_region(project, region)
        self._validate(body, "router")
        name = body["name"]
        if not _NAME.match(name):
            raise HttpError(
                400,
                f"Invalid value for field 'resource.name': '{name}'. Must be a match of regex "
                f"'(?:[a-z](?:[-a-z0-9]{{0,61}}[a-z0-9])?)'",
                "invalid",
            )
        if body.get("region") and str(body["region"]).rsplit("/", 1)[-1] != region:
            raise HttpError(
                400,
                f"Invalid value for field 'resource.region': '{body['region']}'. The region of the "
                f"router must be the region of the request ({region}).",
                "invalid",
            )
        network = _NETWORK.match(str(body["network"]))
        if network is None or (network["project"] and network["project"] != project):
            raise HttpError(
                400,
                f"Invalid value for field 'resource.network': '{body['network']}'. The URL is malformed.",
                "invalid",
            )
        _check_nat_sections(body.get("nats") or [])
        url = f"https://www.googleapis.com/compute/v1/projects/{project}/global/networks/{network['name']}"
        self._check_nat_subnetworks(region, url, body.get("nats") or [])
        if (region, name) in self.routers:
            raise HttpError(
                409,
                f"The resource 'projects/{project}/regions/{region}/routers/{name}' already exists",
                "alreadyExists",
            )
        nats = body.get("nats") or []
        for other in self.routers.values():
            if other["network"] != url or not other["region"].endswith(f"/regions/{region}") or not other.get("nats"):
                continue
            if nats and any(
                n["sourceSubnetworkIpRangesToNat"] != "LIST_OF_SUBNETWORKS" for n in [*nats, *other["nats"]]
            ):
                raise HttpError(
                    400,
                    f"Invalid value for field 'resource.nats[0]': a NAT that serves every subnetwork "
                    f"of network {network['name']} in {region} excludes any other; router "
                    f"{other['name']} has one.",
                    "invalid",
                )
        target = f"{self.url}/compute/v1/projects/{project}/regions/{region}/routers/{name}"
        router = {
            **json.loads(json.dumps(body)),
            "kind": "compute#router",
            "id": str(10**15 + len(self.routers)),
            "network": url,
            "region": f"{self.url}/compute/v1/projects/{project}/regions/{region}",
            "creationTimestamp": _now(),
            "selfLink": target,
        }
        self.routers[(region, name)] = router  # listed while its insert runs (another insert of it: 409)
        return self._operation(_Scope(project, region=region), "insert", target)

    def _router_find(self, project: str, region: str, name: str) -> dict[str, Any]:
        self._check_region(project, region)
        return _existing(self.routers, (region, name), f"projects/{project}/regions/{region}/routers/{name}")

    def _router_get(self, project: str, region: str, name: str, query: dict, body: dict) -> dict:
        return self._router_find(project, region, name)

    def _router_list(self, project: str, region: str, query: dict, body: dict) -> dict:
        self._check_region(project, region)
        page, more = self._page([r for (g, _), r in self.routers.items() if g == region], query)
        return {"kind": "compute#routerList", "items": page, **more}

    def _router_aggregated(self, project: str, query: dict, body: dict) -> dict:
        page, more = self._page(list(self.routers.items()), query)
        scoped: dict[str, Any] = {}
        for (region, _), router in page:
            scoped.setdefault(f"regions/{region}", {"routers": []})["routers"].append(router)
        return {"kind": "compute#routerAggregatedList", "items": scoped, **more}

    def _router_delete(self, project: str, region: str, name: str, query: dict, body: dict) -> dict:
        router = self._router_find(project, region, name)

        def deleted() -> None:
            if self.routers.get((region, name)) is router:
                del self.routers[(region, name)]

        return self._operation(_Scope(project, region=region), "delete", router["selfLink"], effect=deleted)

    def add_router(
        self,
        region: str,
        name: str,
        *,
        description: str = "",
        nats: list[dict[str, Any]] | None = None,
        network: str = "default",
    ) -> dict[str, Any]:
        """A Cloud Router that is there already (the user's own, with or without a NAT)."""
        with self._lock:
            router = {
                "kind": "compute#router",
                "id": str(10**16 + len(self.routers)),
                "name": name,
                "description": description,
                "nats": list(nats or []),
                "network": f"https://www.googleapis.com/compute/v1/projects/rubberband-test/global/networks/{network}",
                "region": f"{self.url}/compute/v1/projects/rubberband-test/regions/{region}",
                "creationTimestamp": "2020-01-01T00:00:00.000+00:00",
                "selfLink": f"{self.url}/compute/v1/projects/rubberband-test/regions/{region}/routers/{name}",
            }
            self.routers[(region, name)] = router
            return router

    # -- subnetworks ----------------------------------------------------------------------------------

    def _all_subnetworks(self, project: str = "rubberband-test") -> dict[tuple[str, str], dict[str, Any]]:
        """The default network's own subnetworks (:data:`AUTO_SUBNETS`) and those created, by (region, name)."""
        auto = {
            (region, "default"): {
                "kind": "compute#subnetwork",
                "name": "default",
                "network": f"https://www.googleapis.com/compute/v1/projects/{project}/global/networks/default",
                "ipCidrRange": cidr,
                "region": f"{self.url}/compute/v1/projects/{project}/regions/{region}",
                "creationTimestamp": "2020-01-01T00:00:00.000+00:00",
                "selfLink": f"{self.url}/compute/v1/projects/{project}/regions/{region}/subnetworks/default",
                "_auto": True,
            }
            for region, cidr in AUTO_SUBNETS.items()
        }
        return {**auto, **self.subnetworks}

    def _subnet_conflict(self, network_url: str, cidr: str) -> str | None:
        """Why a new subnetwork of ``cidr`` in this network cannot be (the API's words), or None."""
        import ipaddress

        wanted = ipaddress.ip_network(cidr)
        if network_url.endswith("/global/networks/default") and wanted.overlaps(ipaddress.ip_network(AUTO_MODE_RANGE)):
            return f"Invalid IPCidrRange: {cidr} conflicts with the auto mode range {AUTO_MODE_RANGE} of network 'default'."
        for (region, name), other in self._all_subnetworks().items():
            if other["network"] == network_url and wanted.overlaps(ipaddress.ip_network(other["ipCidrRange"])):
                return f"Invalid IPCidrRange: {cidr} conflicts with existing subnetwork '{name}' in region '{region}'."
        for peered in self.peered_ranges:
            if wanted.overlaps(ipaddress.ip_network(peered)):
                return f"Invalid IPCidrRange: {cidr} conflicts with a subnetwork of a peered network ({peered})."
        return None

    def _subnet_insert(self, project: str, region: str, query: dict, body: dict) -> dict:
        """subnetworks.insert as strict as the real API: known fields only, a name, a network of this project, the
        request's region, a canonical IPv4 range of /8 to /29 that overlaps no subnetwork of the network (the default
        network keeps 10.128.0.0/9 for its own) nor a peered network's."""
        import ipaddress

        self._check_region(project, region)
        self._validate(body, "subnetwork")
        name = body["name"]
        if not _NAME.match(name):
            raise HttpError(400, f"Invalid value for field 'resource.name': '{name}'.", "invalid")
        if body.get("region") and str(body["region"]).rsplit("/", 1)[-1] != region:
            raise HttpError(400, f"Invalid value for field 'resource.region': '{body['region']}'.", "invalid")
        network = _NETWORK.match(str(body["network"]))
        if network is None or (network["project"] and network["project"] != project):
            raise HttpError(400, f"Invalid value for field 'resource.network': '{body['network']}'.", "invalid")
        try:
            cidr = ipaddress.ip_network(body["ipCidrRange"])
        except ValueError:
            cidr = None
        if cidr is None or cidr.version != 4 or not 8 <= cidr.prefixlen <= 29:
            raise HttpError(400, f"Invalid IPCidrRange: {body['ipCidrRange']} is not a valid IPv4 range.", "invalid")
        url = f"https://www.googleapis.com/compute/v1/projects/{project}/global/networks/{network['name']}"
        if (region, name) in self._all_subnetworks(project):
            raise HttpError(
                409,
                f"The resource 'projects/{project}/regions/{region}/subnetworks/{name}' already exists",
                "alreadyExists",
            )
        conflict = self._subnet_conflict(url, str(cidr))
        if conflict:
            raise HttpError(400, conflict, "invalid")
        target = f"{self.url}/compute/v1/projects/{project}/regions/{region}/subnetworks/{name}"
        self.subnetworks[(region, name)] = {
            **json.loads(json.dumps(body)),
            "kind": "compute#subnetwork",
            "id": str(10**17 + len(self.subnetworks)),
            "network": url,
            "region": f"{self.url}/compute/v1/projects/{project}/regions/{region}",
            "gatewayAddress": str(cidr.network_address + 1),
            "creationTimestamp": _now(),
            "selfLink": target,
        }
        return self._operation(_Scope(project, region=region), "insert", target)

    def _subnet_find(self, project: str, region: str, name: str) -> dict[str, Any]:
        self._check_region(project, region)
        path = f"projects/{project}/regions/{region}/subnetworks/{name}"
        return _existing(self._all_subnetworks(project), (region, name), path)

    def _subnet_get(self, project: str, region: str, name: str, query: dict, body: dict) -> dict:
        return _public(self._subnet_find(project, region, name))

    def _subnet_list(self, project: str, region: str, query: dict, body: dict) -> dict:
        self._check_region(project, region)
        items = [_public(n) for (g, _), n in self._all_subnetworks(project).items() if g == region]
        page, more = self._page(items, query)
        return {"kind": "compute#subnetworkList", "items": page, **more}

    def _subnet_aggregated(self, project: str, query: dict, body: dict) -> dict:
        page, more = self._page(list(self._all_subnetworks(project).items()), query)
        scoped: dict[str, Any] = {}
        for (region, _), subnet in page:
            scoped.setdefault(f"regions/{region}", {"subnetworks": []})["subnetworks"].append(_public(subnet))
        return {"kind": "compute#subnetworkAggregatedList", "items": scoped, **more}

    def _subnet_users(self, region: str, name: str) -> list[str]:
        """What uses a subnetwork: the VMs with an interface in it and the routers whose NAT names it."""
        users = [
            i["selfLink"]
            for (zone, _), i in self.instances.items()
            if zone.rsplit("-", 1)[0] == region
            and any(_subnet_key(nic.get("subnetwork", "")) == (region, name) for nic in i.get("networkInterfaces", []))
        ]
        users += [
            r["selfLink"]
            for (g, _), r in self.routers.items()
            if g == region
            and any(
                _subnet_key(sn.get("name", "")) == (region, name)
                for n in r.get("nats") or []
                for sn in n.get("subnetworks") or []
            )
        ]
        return users

    def _subnet_delete(self, project: str, region: str, name: str, query: dict, body: dict) -> dict:
        subnet = self._subnet_find(project, region, name)
        if subnet.get("_auto"):
            raise HttpError(400, f"The subnetwork '{name}' of an auto mode network cannot be deleted.", "invalid")
        users = self._subnet_users(region, name)
        if users:
            raise HttpError(
                400,
                f"The subnetwork resource '{subnet['selfLink']}' is already being used by '{users[0]}'",
                "resourceInUseByAnotherResource",
            )

        def deleted() -> None:
            if self.subnetworks.get((region, name)) is subnet:
                del self.subnetworks[(region, name)]

        return self._operation(_Scope(project, region=region), "delete", subnet["selfLink"], effect=deleted)

    def _nic_subnetwork(self, project: str, zone: str, nic: dict[str, Any]) -> dict[str, Any]:
        """The subnetwork a new VM's interface goes into: the one it names (which must exist in the VM's region and
        network), else the network's own in that region (an auto mode network's)."""
        region = zone.rsplit("-", 1)[0]
        network = _NETWORK.match(str(nic.get("network", "global/networks/default")))
        key = _subnet_key(nic["subnetwork"]) if nic.get("subnetwork") else (region, network["name"] if network else "")
        subnet = self._all_subnetworks(project).get(key) if key else None
        if subnet is None or key[0] != region or (network and not subnet["network"].endswith(f"/{network['name']}")):
            raise HttpError(
                400,
                f"Invalid value for field 'resource.networkInterfaces[0].subnetwork': "
                f"'{nic.get('subnetwork', '')}'. The referenced subnetwork resource cannot be found in {region}.",
                "invalid",
            )
        return subnet

    def _check_nat_subnetworks(self, region: str, network_url: str, nats: list[dict[str, Any]]) -> None:
        """The subnetworks a NAT of chosen subnetworks names exist in its region and network, say which ranges, and
        are served by no other NAT (as on Compute Engine)."""
        served = {
            _subnet_key(sn.get("name", ""))
            for (g, _), r in self.routers.items()
            if g == region
            for n in r.get("nats") or []
            for sn in n.get("subnetworks") or []
        }
        for index, nat in enumerate(nats):
            for entry in nat.get("subnetworks") or []:
                key = _subnet_key(entry.get("name", ""))
                subnet = self._all_subnetworks().get(key) if key else None
                if subnet is None or key[0] != region or subnet["network"] != network_url:
                    raise HttpError(
                        400,
                        f"Invalid value for field 'resource.nats[{index}].subnetworks': '{entry.get('name')}'. "
                        f"The subnetwork must exist in region {region} and the router's network.",
                        "invalid",
                    )
                if not entry.get("sourceIpRangesToNat"):
                    raise HttpError(
                        400,
                        f"Invalid value for field 'resource.nats[{index}].subnetworks[0].sourceIpRangesToNat': ''. "
                        f"Required field not specified",
                        "required",
                    )
                if key in served:
                    raise HttpError(
                        400, f"The subnetwork {entry['name']} is already served by another NAT in {region}.", "invalid"
                    )

    def add_subnetwork(self, region: str, name: str, cidr: str, *, description: str = "") -> dict[str, Any]:
        """A subnetwork that is there already (the user's own) in the default network."""
        with self._lock:
            subnet = {
                "kind": "compute#subnetwork",
                "id": str(10**18 + len(self.subnetworks)),
                "name": name,
                "description": description,
                "network": "https://www.googleapis.com/compute/v1/projects/rubberband-test/global/networks/default",
                "ipCidrRange": cidr,
                "region": f"{self.url}/compute/v1/projects/rubberband-test/regions/{region}",
                "creationTimestamp": "2020-01-01T00:00:00.000+00:00",
                "selfLink": f"{self.url}/compute/v1/projects/rubberband-test/regions/{region}/subnetworks/{name}",
            }
            self.subnetworks[(region, name)] = subnet
            return subnet

    def nat_serves(self, name: str) -> bool:
        """Whether a VM without an external address reaches the internet through a Cloud NAT: one of its region and
        network serving every subnetwork, or naming the VM's subnetwork."""
        with self._lock:
            ((zone, vm),) = [(z, i) for (z, n), i in self.instances.items() if n == name]
            region = zone.rsplit("-", 1)[0]
            nic = vm["networkInterfaces"][0]
            if nic.get("accessConfigs"):
                return False  # its own external address, no NAT
            network = _NETWORK.match(str(nic.get("network", "global/networks/default")))
            key = _subnet_key(nic["subnetwork"])
            for (g, _), router in self.routers.items():
                if g != region or not network or not router["network"].endswith(f"/global/networks/{network['name']}"):
                    continue
                for nat in router.get("nats") or []:
                    if nat["sourceSubnetworkIpRangesToNat"] in _NAT_SOURCES[:2]:
                        return True
                    if any(_subnet_key(sn.get("name", "")) == key for sn in nat.get("subnetworks") or []):
                        return True
            return False

    # -- disks --------------------------------------------------------------------------------------

    def add_disk(self, zone: str, name: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
        """A detached disk (a user's own, or one a VM left behind)."""
        with self._lock:
            disk = {
                "kind": "compute#disk",
                "id": str(10**14 + len(self.disks)),
                "name": name,
                "zone": f"{self.url}/compute/v1/projects/rubberband-test/zones/{zone}",
                "sizeGb": "10",
                "labels": dict(labels or {}),
                "users": [],
                "creationTimestamp": _now(),
                "selfLink": f"{self.url}/compute/v1/projects/rubberband-test/zones/{zone}/disks/{name}",
            }
            self.disks[(zone, name)] = disk
            return disk

    def _disk_list(self, project: str, zone: str, query: dict, body: dict) -> dict:
        items = [d for (z, _), d in self.disks.items() if z == zone and self._matches(d, query)]
        page, more = self._page(items, query)
        return {"kind": "compute#diskList", "items": page, **more}

    def _disk_aggregated(self, project: str, query: dict, body: dict) -> dict:
        matching = [(zone, d) for (zone, _), d in self.disks.items() if self._matches(d, query)]
        page, more = self._page(matching, query)
        scoped: dict[str, Any] = {}
        for zone, disk in page:
            scoped.setdefault(f"zones/{zone}", {"disks": []})["disks"].append(disk)
        return {"kind": "compute#diskAggregatedList", "items": scoped, **more}

    def _disk_delete(self, project: str, zone: str, name: str, query: dict, body: dict) -> dict:
        disk = _existing(self.disks, (zone, name), f"projects/{project}/zones/{zone}/disks/{name}")
        if disk["users"]:
            raise HttpError(
                400,
                f"The disk resource '{disk['selfLink']}' is already being used by '{disk['users'][0]}'",
                "resourceInUseByAnotherResource",
            )
        return self._operation(
            _Scope(project, zone=zone), "delete", disk["selfLink"], effect=lambda: self.disks.pop((zone, name), None)
        )

    # -- IAM and Resource Manager (a head's service account, for the dry run) -------------------------

    def _test_iam_permissions(self, project: str, query: dict, body: dict) -> dict:
        """``projects.testIamPermissions``: the subset of ``permissions`` the caller holds. As strict as the real
        API: at most 100 names, no wildcards, only permissions that exist (here: Compute Engine, IAM and Resource
        Manager names of the form service.resource.verb)."""
        wanted = body.get("permissions")
        if not isinstance(wanted, list) or not wanted:
            raise HttpError(400, "Invalid argument: permissions must not be empty", "badRequest")
        if len(wanted) > 100:
            raise HttpError(400, "Invalid argument: at most 100 permissions may be tested at once", "badRequest")
        for permission in wanted:
            if "*" in permission or not _PERMISSION.match(permission):
                raise HttpError(400, f"Permission {permission} is not valid for this resource.", "badRequest")
        held = self.caller_permissions
        return {"permissions": [p for p in wanted if held is None or p in held]}

    def add_service_account(self, email: str, permissions: list[str], *, bound: bool = False) -> None:
        """A service account and the head's custom role (``rubberbandHead``) granting ``permissions`` (replacing
        any earlier one); ``bound``: the role also bound to the account for the whole project, without a condition
        (the one-time binding earlier rubberbands asked for)."""
        with self._lock:
            self.service_accounts.add(email)
            role = "projects/rubberband-test/roles/rubberbandHead"
            self.roles[role] = list(permissions)
            member = f"serviceAccount:{email}"
            if bound:
                self.iam_bindings.append({"role": role, "members": [member]})
                self.iam_version += 1

    def _sa_get(self, project: str, email: str, query: dict, body: dict) -> dict:
        if email not in self.service_accounts:
            raise HttpError(404, f"Unknown service account {email}", "notFound")
        return {"name": f"projects/{project}/serviceAccounts/{email}", "email": email, "projectId": project}

    def _sa_test(self, project: str, email: str, query: dict, body: dict) -> dict:
        self._sa_get(project, email, query, body)
        return {"permissions": [p for p in body.get("permissions", []) if self.act_as]}

    def _etag(self) -> str:
        return base64.b64encode(f"policy-{self.iam_version}".encode()).decode()

    def _get_iam_policy(self, project: str, query: dict, body: dict) -> dict:
        """projects.getIamPolicy: conditional bindings only at the requested version 3; at an older one, as IAM
        does, under a made-up role name (``..._withcond_<hash>``) and without their condition."""
        if "getIamPolicy" in self.iam_forbidden:
            raise HttpError(
                403,
                f"The caller does not have permission resourcemanager.projects.getIamPolicy on {project}",
                "forbidden",
            )
        version = int((body.get("options") or {}).get("requestedPolicyVersion") or 1)
        bindings = json.loads(json.dumps(self.iam_bindings))
        conditional = any(b.get("condition") for b in bindings)
        if conditional and version < 3:
            for b in bindings:
                if b.pop("condition", None) is not None:
                    b["role"] += f"_withcond_{uuid.uuid5(uuid.NAMESPACE_OID, json.dumps(b)).hex[:20]}"
        return {"version": 3 if conditional and version >= 3 else 1, "etag": self._etag(), "bindings": bindings}

    def _set_iam_policy(self, project: str, query: dict, body: dict) -> dict:
        """projects.setIamPolicy as strict as the real API: the etag read must still be the policy's (HTTP 409
        ABORTED when another writer came in between), conditions need version 3 and a title and an expression, roles
        must exist (custom ones in this project) and service accounts too."""
        if "setIamPolicy" in self.iam_forbidden:
            raise HttpError(
                403,
                f"The caller does not have permission resourcemanager.projects.setIamPolicy on {project}",
                "forbidden",
            )
        policy = body.get("policy") or {}
        if self.iam_races > 0:
            self.iam_races -= 1
            self.iam_version += 1  # another writer, just now
        if policy.get("etag") and policy["etag"] != self._etag():
            raise HttpError(409, "There were concurrent policy changes. Please retry the whole read-modify-write.", "")
        bindings = policy.get("bindings") or []
        for binding in bindings:
            condition = binding.get("condition")
            if condition is not None:
                if int(policy.get("version") or 1) < 3:
                    raise HttpError(400, "Policies with conditions must be version 3.", "badRequest")
                if not condition.get("title") or not condition.get("expression"):
                    raise HttpError(400, "A condition needs a title and an expression.", "badRequest")
                expression = condition["expression"]
                if expression.count("(") != expression.count(")") or expression.count('"') % 2:
                    raise HttpError(400, f"Condition expression is malformed: {expression[:80]}", "badRequest")
            role = binding.get("role", "")
            if role.startswith("projects/") and role not in self.roles:
                raise HttpError(400, f"Role ({role}) does not exist in the resource's hierarchy.", "badRequest")
            for member in binding.get("members") or []:
                if member.startswith("serviceAccount:") and member.split(":", 1)[1] not in self.service_accounts:
                    raise HttpError(400, f"Service account {member.split(':', 1)[1]} does not exist.", "badRequest")
        self.iam_bindings = json.loads(json.dumps(bindings))
        self.iam_version += 1
        return self._get_iam_policy(project, query, {"options": {"requestedPolicyVersion": 3}})

    def run_bindings(self) -> dict[str, dict[str, Any]]:
        """The bindings rubberband made for runs, by their condition's title."""
        with self._lock:
            return {b["condition"]["title"]: b for b in self.iam_bindings if (b.get("condition") or {}).get("title")}

    def _role_get(self, role: str, query: dict, body: dict) -> dict:
        if role not in self.roles:
            raise HttpError(404, f"The role named {role} was not found", "notFound")
        return {"name": role, "includedPermissions": self.roles[role]}


class GceMetadata:
    """The metadata server of one VM of the fake (stdlib HTTP; ``url`` once started), as a VM sees it: every request
    needs ``Metadata-Flavor: Google`` (403 without); it serves the VM's name, its zone (``projects/NUMBER/zones/Z``)
    and the project's id, and an access token of the VM's service account — 404 for a VM without one (workers). A
    token it hands out is one the fake then accepts for that account (:meth:`GceFake.authorize`)."""

    def __init__(self, fake: GceFake, name: str) -> None:
        self.fake, self.name = fake, name
        self.requests: list[str] = []
        self._server: ThreadingHTTPServer | None = None
        self.url = ""

    def answer(self, path: str, flavor: str | None) -> tuple[int, str]:
        """(HTTP status, body) of one metadata request of the VM."""
        self.requests.append(path)
        if flavor != "Google":
            return 403, "Missing Metadata-Flavor:Google header."
        with self.fake._lock:
            found = [(z, i) for (z, n), i in self.fake.instances.items() if n == self.name]
        if not found:
            return 404, "not found"
        zone, instance = found[0]
        accounts = instance.get("serviceAccounts") or []
        if path == "/computeMetadata/v1/instance/service-accounts/default/token" and accounts:
            token = f"ya29.fake-{uuid.uuid4().hex}"
            with self.fake._lock:
                self.fake.tokens[token] = accounts[0]["email"]
            return 200, json.dumps({"access_token": token, "expires_in": 3599, "token_type": "Bearer"})
        values = {
            "/computeMetadata/v1/instance/name": self.name,
            "/computeMetadata/v1/instance/zone": f"projects/123456789012/zones/{zone}",
            "/computeMetadata/v1/project/project-id": "rubberband-test",
        }
        return (200, values[path]) if path in values else (404, "not found")

    def start(self) -> "GceMetadata":
        metadata = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:  # quiet
                pass

            def do_GET(self) -> None:
                status, body = metadata.answer(urlparse(self.path).path, self.headers.get("Metadata-Flavor"))
                data = body.encode()
                self.send_response(status)
                self.send_header("Metadata-Flavor", "Google")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()


def _subnet_key(reference: str) -> tuple[str, str] | None:
    """(region, name) of a subnetwork reference (a full or partial URL), or None."""
    match = _SUBNETWORK.match(reference)
    return (match["region"], match["name"]) if match else None


def _address_in(cidr: str, index: int) -> str:
    """The ``index``-th VM address of a subnetwork's range (its first two are the network's and the gateway's)."""
    import ipaddress

    network = ipaddress.ip_network(cidr)
    return str(network.network_address + 2 + index % (network.num_addresses - 4))


def _backend_error() -> dict[str, Any]:
    return {
        "error": {
            "code": 503,
            "message": "Internal error. Please try again or contact Google Support.",
            "errors": [{"message": "Internal error.", "domain": "global", "reason": "backendError"}],
        }
    }


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


def _public(op: dict[str, Any]) -> dict[str, Any]:
    """A stored resource or operation as the API shows it: without the fake's own ``_`` keys."""
    return {k: v for k, v in op.items() if not k.startswith("_")}


@pytest.fixture
def gce_fake() -> Iterator[GceFake]:
    """The fake as strict as the real API where it matters: every operation takes 50 ms (PENDING, RUNNING, DONE),
    list pages hold 2 items (every listing of more spans pages); no 400 may have been needed by the test."""
    fake = GceFake().start()
    fake.page_size, fake.op_delay_s = 2, 0.05
    try:
        yield fake
        assert fake.rejected == [], f"the GCE fake refused request bodies: {fake.rejected}"
    finally:
        fake.stop()
