"""A small local stand-in for the Compute Engine REST API (stdlib HTTP), for google-cloud-compute.

Serves what rubberband's GcpProvider calls: instances insert / get / list / aggregatedList /
delete / setLabels, zoneOperations get / wait / list (``operationType`` / ``targetLink`` filters),
firewalls insert / get / list / delete and globalOperations get / wait. State lives in memory;
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
* :meth:`GceFake.preempt`: what Compute Engine does to a spot VM it takes back — a
  ``compute.instances.preempted`` zone operation targeting it, then the VM deleted (its
  ``instanceTerminationAction`` is DELETE) or TERMINATED (STOP).

There is no GCE emulator in any registry reachable here; this fake implements only the
fields rubberband reads and writes.
"""

from __future__ import annotations

import json
import re
import threading
import uuid
from collections.abc import Iterator
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
    ("GET", re.compile(_PREFIX + r"/global/operations/(?P<op>[^/]+)$"), "op_get"),
    ("POST", re.compile(_PREFIX + r"/global/operations/(?P<op>[^/]+)/wait$"), "op_wait"),
]
_LABEL_TERM = re.compile(r'labels\.([a-z0-9_-]+)\s*=\s*"([^"]*)"')
_OP_TERM = re.compile(r'(operationType|targetLink|status)\s*=\s*"([^"]*)"')


class HttpError(Exception):
    def __init__(self, status: int, message: str, reason: str) -> None:
        super().__init__(message)
        self.status, self.message, self.reason = status, message, reason


class GceFake:
    """In-memory Compute Engine with fault switches; ``url`` once started."""

    def __init__(self) -> None:
        self.instances: dict[tuple[str, str], dict[str, Any]] = {}  # (zone, name) -> instance JSON
        self.firewalls: dict[str, dict[str, Any]] = {}
        self.operations: dict[str, dict[str, Any]] = {}
        self.stockout_zones: set[str] = set()
        self.stockout_sync = False  # answer stockouts as HTTP 503 on the insert itself (words only)
        self.quota: str | None = None
        self.quota_sync = False
        self.pending_polls = 0
        self.capacity_left: int | None = None  # VMs the fake still has room for (None: unlimited)
        self.wait_errors = 0  # answer this many operation reads with HTTP 503 backendError
        self.inserts: list[tuple[str, str]] = []  # (zone, machine type) of every insert call
        self.requests: list[str] = []  # "METHOD path" of every request (tests grep it)
        self.bodies: list[str] = []  # raw request bodies (tests grep them for credentials)
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

    def dispatch(self, method: str, path: str, raw: str) -> tuple[int, dict[str, Any]]:
        url = urlparse(path)
        query = {k: v[0] for k, v in parse_qs(url.query).items()}
        with self._lock:
            self.requests.append(f"{method} {url.path}")
            self.bodies.append(raw)
            for route_method, pattern, handler in _ROUTES:
                match = pattern.match(url.path)
                if match and route_method == method:
                    try:
                        body = json.loads(raw) if raw else {}
                        return 200, getattr(self, f"_{handler}")(query=query, body=body, **match.groupdict())
                    except HttpError as exc:
                        return exc.status, {"error": {"code": exc.status, "message": exc.message, "errors": [
                            {"message": exc.message, "domain": "global", "reason": exc.reason}]}}
        return 404, {"error": {"code": 404, "message": f"no route {method} {url.path}",
                               "errors": [{"reason": "notFound", "message": "no route"}]}}

    # -- operations -----------------------------------------------------------------------------

    def _operation(self, project: str, kind: str, target: str, zone: str | None, *,
                   error: dict[str, Any] | None = None, http_status: int | None = None) -> dict[str, Any]:
        name = f"operation-{uuid.uuid4().hex[:12]}"
        op: dict[str, Any] = {"kind": "compute#operation", "id": str(abs(hash(name)) % 10**12), "name": name,
                              "operationType": kind, "targetLink": target, "progress": 0,
                              "status": "RUNNING" if self.pending_polls > 0 else "DONE",
                              "insertTime": _now(), "_polls": self.pending_polls}
        if zone:
            op["zone"] = f"{self.url}/compute/v1/projects/{project}/zones/{zone}"
            op["selfLink"] = f"{op['zone']}/operations/{name}"
        else:
            op["selfLink"] = f"{self.url}/compute/v1/projects/{project}/global/operations/{name}"
        if error is not None:
            op["error"] = {"errors": [error]}
            op["httpErrorStatusCode"] = http_status
            op["httpErrorMessage"] = "SERVICE UNAVAILABLE" if http_status == 503 else "FORBIDDEN"
        self.operations[name] = op
        return _public(op)

    def _op_get(self, project: str, op: str, query: dict, body: dict, zone: str | None = None) -> dict:
        found = self.operations.get(op)
        if found is None:
            raise HttpError(404, f"The resource 'operations/{op}' was not found", "notFound")
        if found["status"] != "DONE":
            found["_polls"] -= 1
            if found["_polls"] <= 0:
                found["status"] = "DONE"
        return _public(found)

    def _op_list(self, project: str, zone: str, query: dict, body: dict) -> dict:
        terms = _OP_TERM.findall(query.get("filter", ""))
        items = [_public(op) for op in self.operations.values() if op.get("zone", "").endswith(f"/zones/{zone}")
                 and all(op.get(key) == value for key, value in terms)]
        return {"kind": "compute#operationList", "items": items}

    def _op_wait(self, project: str, op: str, query: dict, body: dict, zone: str | None = None) -> dict:
        if self.wait_errors > 0:
            self.wait_errors -= 1
            raise HttpError(503, "Internal error. Please try again.", "backendError")
        found = self.operations.get(op)
        if found is None:
            raise HttpError(404, f"The resource 'operations/{op}' was not found", "notFound")
        found["status"] = "DONE"
        return _public(found)

    # -- instances ------------------------------------------------------------------------------

    def _insert(self, project: str, zone: str, query: dict, body: dict) -> dict:
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
            return self._operation(project, "insert", target, zone, http_status=403, error={
                "code": "QUOTA_EXCEEDED", "message": message, "errorDetails": [{"quotaInfo": {
                    "metricName": f"compute.googleapis.com/{self.quota.lower()}", "limitName": f"{self.quota}-limit",
                    "dimensions": {"region": region}}}]})
        if (zone in self.stockout_zones or self.capacity_left == 0) and self.stockout_sync:
            raise HttpError(503, f"The zone 'projects/{project}/zones/{zone}' does not have enough resources "
                                 f"available to fulfill the request.", "")
        if zone in self.stockout_zones or self.capacity_left == 0:
            return self._operation(project, "insert", target, zone, http_status=503, error={
                "code": "ZONE_RESOURCE_POOL_EXHAUSTED",
                "message": f"The zone 'projects/{project}/zones/{zone}' does not have enough resources available "
                           f"to fulfill the request.  Try a different zone, or try again later."})
        if (zone, name) in self.instances:
            raise HttpError(409, f"The resource '{target}' already exists", "alreadyExists")
        if self.capacity_left is not None:
            self.capacity_left -= 1
        self._ip += 1
        instance = dict(body)
        instance.update({"kind": "compute#instance", "id": str(10**12 + self._ip), "status": "STAGING",
                         "zone": f"{self.url}/compute/v1/projects/{project}/zones/{zone}", "selfLink": target,
                         "creationTimestamp": _now(), "labelFingerprint": uuid.uuid4().hex[:8]})
        for nic in instance.get("networkInterfaces", []):
            nic["networkIP"] = f"10.128.0.{self._ip % 250 + 2}"
            for access in nic.get("accessConfigs", []):
                access["natIP"] = f"34.1.0.{self._ip % 250 + 2}"
        self.instances[(zone, name)] = instance
        return self._operation(project, "insert", target, zone)

    def _find(self, zone: str, name: str) -> dict:
        found = self.instances.get((zone, name))
        if found is None:
            raise HttpError(404, f"The resource 'projects/p/zones/{zone}/instances/{name}' was not found",
                            "notFound")
        return found

    def _get(self, project: str, zone: str, name: str, query: dict, body: dict) -> dict:
        instance = self._find(zone, name)
        result = dict(instance)
        if instance["status"] == "STAGING":
            instance["status"] = "RUNNING"  # boots between two reads
        return result

    def _matches(self, instance: dict, query: dict) -> bool:
        terms = _LABEL_TERM.findall(query.get("filter", ""))
        labels = instance.get("labels", {})
        return all(labels.get(key) == value for key, value in terms)

    def _list(self, project: str, zone: str, query: dict, body: dict) -> dict:
        items = [i for (z, _), i in self.instances.items() if z == zone and self._matches(i, query)]
        return {"kind": "compute#instanceList", "items": items}

    def _aggregated(self, project: str, query: dict, body: dict) -> dict:
        scoped: dict[str, Any] = {}
        for (zone, _), instance in self.instances.items():
            if self._matches(instance, query):
                scoped.setdefault(f"zones/{zone}", {"instances": []})["instances"].append(instance)
        return {"kind": "compute#instanceAggregatedList", "items": scoped}

    def _delete(self, project: str, zone: str, name: str, query: dict, body: dict) -> dict:
        instance = self._find(zone, name)
        del self.instances[(zone, name)]
        return self._operation(project, "delete", instance["selfLink"], zone)

    def _set_labels(self, project: str, zone: str, name: str, query: dict, body: dict) -> dict:
        instance = self._find(zone, name)
        if body.get("labelFingerprint") != instance["labelFingerprint"]:
            raise HttpError(412, "Labels fingerprint either invalid or resource labels have changed",
                            "conditionNotMet")
        instance["labels"] = body.get("labels", {})
        instance["labelFingerprint"] = uuid.uuid4().hex[:8]
        return self._operation(project, "setLabels", instance["selfLink"], zone)

    def inserted(self) -> list[dict[str, Any]]:
        """The request body of every instance insert so far (VMs deleted since included)."""
        with self._lock:
            return [json.loads(raw) for request, raw in zip(self.requests, self.bodies)
                    if request.startswith("POST") and request.endswith("/instances")]

    def preempt(self, name: str) -> None:
        """Take a spot VM back as Compute Engine does: record a ``compute.instances.preempted`` operation (done,
        by the system), then delete the VM (``instanceTerminationAction`` DELETE) or leave it TERMINATED."""
        with self._lock:
            (zone, instance), = [(z, i) for (z, n), i in self.instances.items() if n == name]
            project = instance["selfLink"].split("/projects/", 1)[1].split("/", 1)[0]
            pending, self.pending_polls = self.pending_polls, 0
            try:
                op = self._operation(project, "compute.instances.preempted", instance["selfLink"], zone)
            finally:
                self.pending_polls = pending
            self.operations[op["name"]].update(user="system", statusMessage="Instance was preempted.")
            if instance.get("scheduling", {}).get("instanceTerminationAction") == "DELETE":
                del self.instances[(zone, name)]
            else:
                instance["status"] = "TERMINATED"

    # -- firewalls ------------------------------------------------------------------------------

    def _fw_insert(self, project: str, query: dict, body: dict) -> dict:
        name = body.get("name", "")
        if name in self.firewalls:
            raise HttpError(409, f"The resource 'projects/{project}/global/firewalls/{name}' already exists",
                            "alreadyExists")
        self.firewalls[name] = {**body, "kind": "compute#firewall", "id": str(len(self.firewalls) + 1),
                                "creationTimestamp": _now()}
        return self._operation(project, "insert", name, None)

    def _fw_list(self, project: str, query: dict, body: dict) -> dict:
        return {"kind": "compute#firewallList", "items": list(self.firewalls.values())}

    def _fw_get(self, project: str, name: str, query: dict, body: dict) -> dict:
        if name not in self.firewalls:
            raise HttpError(404, f"The resource 'projects/{project}/global/firewalls/{name}' was not found",
                            "notFound")
        return self.firewalls[name]

    def _fw_delete(self, project: str, name: str, query: dict, body: dict) -> dict:
        self._fw_get(project, name, query, body)
        del self.firewalls[name]
        return self._operation(project, "delete", name, None)


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


def _public(op: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in op.items() if not k.startswith("_")}


@pytest.fixture
def gce_fake() -> Iterator[GceFake]:
    fake = GceFake().start()
    try:
        yield fake
    finally:
        fake.stop()
