"""Compute Engine's API as rubberband calls it: one project's REST clients, every call retried with its errors
mapped to rubberband's vocabulary (:func:`~rubberband.cloud.failover.classify`), and the waits for operations.

The ``*_unary`` calls and this module's own operations clients are used to wait: ``.result()`` on an extended
operation would poll through an internal client built without the endpoint override.
"""

from __future__ import annotations

import dataclasses
import re
import time
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

import google.auth.exceptions
import requests
from google.api_core import exceptions as api_exceptions
from google.api_core.client_options import ClientOptions
from google.auth.credentials import Credentials
from google.cloud import compute_v1

from rubberband.cloud.failover import ERROR_TABLE, CallContext, RetryPolicy, call_with_retry, classify
from rubberband.cloud.gcp.quotas import GCP_QUOTAS, gcp_quota_name
from rubberband.errors import CloudError, Location

T = TypeVar("T")

_QUOTA_RE = re.compile(r"Quota '[A-Z0-9_]+' exceeded")


@dataclasses.dataclass(frozen=True)
class Doomed:
    """One of a run's resources to delete: its name for the user, the delete call, the wait for its operation."""

    label: str
    call: Callable[[], compute_v1.Operation]
    wait: Callable[[compute_v1.Operation], object]
    zone: str | None = None


class ComputeApi:
    """The Compute Engine clients of ``project`` (at ``endpoint``, None: Google's) for calls in ``region``."""

    def __init__(
        self, *, region: str, project: str, endpoint: str | None, credentials: Credentials, retry: RetryPolicy
    ) -> None:
        self.region = region
        self.project = project
        self.retry = retry
        client_options = ClientOptions(api_endpoint=endpoint) if endpoint else None
        kwargs: dict[str, Any] = {"credentials": credentials, "client_options": client_options, "transport": "rest"}
        self.instances = compute_v1.InstancesClient(**kwargs)
        self.zone_operations = compute_v1.ZoneOperationsClient(**kwargs)
        self.firewalls = compute_v1.FirewallsClient(**kwargs)
        self.global_operations = compute_v1.GlobalOperationsClient(**kwargs)
        self.disks = compute_v1.DisksClient(**kwargs)
        self.routers = compute_v1.RoutersClient(**kwargs)
        self.subnetworks = compute_v1.SubnetworksClient(**kwargs)
        self.region_operations = compute_v1.RegionOperationsClient(**kwargs)

    def error(
        self, exc: api_exceptions.GoogleAPICallError, *, zone: str | None, instance_type: str | None, spot: bool
    ) -> CloudError:
        reasons = [e.get("reason", "") for e in (exc.errors or []) if isinstance(e, dict)]
        code = next((r for r in reasons if r), "") or (exc.reason or "")
        message = exc.message or ""
        if code not in ERROR_TABLE:  # a synchronous answer may only say it in words
            if "ZONE_RESOURCE_POOL_EXHAUSTED" in message or "does not have enough resources" in message:
                code = "ZONE_RESOURCE_POOL_EXHAUSTED"
            elif _QUOTA_RE.search(message):
                code = "QUOTA_EXCEEDED"
        status = int(exc.code) if exc.code is not None else None
        quota = gcp_quota_name(exc.message) if code in ("quotaExceeded", "QUOTA_EXCEEDED") else None
        context = CallContext(
            "gcp", region=self.region, zone=zone, instance_type=instance_type, spot=spot, quotas=GCP_QUOTAS
        )
        return classify(code, exc.message, context, http_status=status, quota=quota)

    def call(
        self, fn: Callable[[], T], *, zone: str | None = None, instance_type: str | None = None, spot: bool = False
    ) -> T:
        def once() -> T:
            try:
                return fn()
            except api_exceptions.GoogleAPICallError as exc:
                raise self.error(exc, zone=zone, instance_type=instance_type, spot=spot) from None
            except google.auth.exceptions.RefreshError as exc:
                raise classify("UNAUTHENTICATED", str(exc), CallContext("gcp", region=self.region)) from None
            except requests.exceptions.RequestException as exc:
                raise CloudError(
                    f"gcp: cannot reach Compute Engine: {exc}",
                    kind="transient",
                    code="ConnectionError",
                    where=Location(region=self.region),
                ) from None

        return call_with_retry(once, self.retry)

    def delete(
        self, fn: Callable[[], T], *, zone: str | None = None, tolerate: tuple[str, ...] = ("notFound",)
    ) -> T | None:
        """A delete call through :meth:`_call`; None when Compute Engine answers one of the ``tolerate`` codes
        (by default: the resource is already gone; deleting what is not there is no error, as every teardown
        path may run twice)."""
        try:
            return self.call(fn, zone=zone)
        except CloudError as exc:
            if exc.code not in tolerate:
                raise
            return None

    def operation_error(
        self, op: compute_v1.Operation, *, zone: str | None, instance_type: str | None, spot: bool
    ) -> CloudError | None:
        if not op.error or not op.error.errors:
            return None
        first = op.error.errors[0]
        metric = None
        for detail in first.error_details:
            if detail.quota_info and detail.quota_info.metric_name:
                metric = detail.quota_info.metric_name
        quota = gcp_quota_name(first.message, metric) if first.code == "QUOTA_EXCEEDED" else None
        context = CallContext(
            "gcp", region=self.region, zone=zone, instance_type=instance_type, spot=spot, quotas=GCP_QUOTAS
        )
        return classify(first.code, first.message, context, http_status=op.http_error_status_code or None, quota=quota)

    def _wait(
        self,
        op: compute_v1.Operation,
        poll: Callable[[str], compute_v1.Operation],
        timeout_s: float,
        *,
        zone: str | None = None,
        region: str | None = None,
    ) -> compute_v1.Operation:
        """``op`` once DONE, asking ``poll`` (its operations client's ``wait``) until then; a timeout raises."""
        deadline = time.monotonic() + timeout_s
        while op.status != compute_v1.Operation.Status.DONE:
            if time.monotonic() >= deadline:
                place = f" in {zone or region}" if zone or region else ""
                raise CloudError(
                    f"gcp: operation {op.name}{place} not done after {timeout_s:g}s",
                    kind="transient",
                    code="WaitTimeout",
                    where=Location(region=region or self.region, zone=zone),
                )
            name = op.name
            op = self.call(lambda: poll(name))
        return op

    def _raise_failed(self, op: compute_v1.Operation) -> compute_v1.Operation:
        """``op``, unless it ended in an error: then that error, in rubberband's vocabulary."""
        error = self.operation_error(op, zone=None, instance_type=None, spot=False)
        if error is not None:
            raise error
        return op

    def wait_zone_op(self, op: compute_v1.Operation, zone: str, timeout_s: float = 600.0) -> compute_v1.Operation:
        """Wait until a zone operation (VMs, disks) is DONE; a timeout raises, its own error is the caller's to read
        (:meth:`operation_error`: a VM's insert knows its type and market)."""
        return self._wait(
            op,
            lambda name: self.zone_operations.wait(project=self.project, zone=zone, operation=name),
            timeout_s,
            zone=zone,
        )

    def wait_global_op(self, op: compute_v1.Operation, timeout_s: float = 300.0) -> compute_v1.Operation:
        """Wait until a global operation (firewall rules) is DONE; raise its error, or a timeout, if any."""
        return self._raise_failed(
            self._wait(op, lambda name: self.global_operations.wait(project=self.project, operation=name), timeout_s)
        )

    def wait_region_op(self, op: compute_v1.Operation, region: str, timeout_s: float = 300.0) -> compute_v1.Operation:
        """Wait until a region operation (routers, subnetworks) is DONE; raise its error, or a timeout, if any."""
        return self._raise_failed(
            self._wait(
                op,
                lambda name: self.region_operations.wait(project=self.project, region=region, operation=name),
                timeout_s,
                region=region,
            )
        )

    def delete_each(self, doomed: Iterable[Doomed], *, tolerate: tuple[str, ...] = ("notFound",)) -> list[str]:
        """Delete each resource and wait for its operation; what went (a resource already gone, or one of
        ``tolerate``, is skipped: every teardown path may run twice)."""
        deleted = []
        for item in doomed:
            op = self.delete(item.call, zone=item.zone, tolerate=tolerate)
            if op is not None:
                item.wait(op)
                deleted.append(item.label)
        return deleted
