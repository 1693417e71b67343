"""ComputeApi's operation waits: a DONE operation's error raised in rubberband's vocabulary, polls until DONE, and a
timeout that names the operation and where it runs. (Every wait against Compute Engine's REST API itself runs in the
GCE fake's tests: tests/test_cloud_gcp.py and the drills.)"""

from __future__ import annotations

import pytest
from google.auth.credentials import AnonymousCredentials
from google.cloud import compute_v1

from rubberband.cloud.failover import RetryPolicy
from rubberband.cloud.gcp.compute_api import ComputeApi
from rubberband.errors import CloudError

DONE = compute_v1.Operation.Status.DONE
RUNNING = compute_v1.Operation.Status.RUNNING


def _api() -> ComputeApi:
    return ComputeApi(
        region="us-central1",
        project="p",
        endpoint="http://127.0.0.1:9",  # never reached: the clients' waits are replaced below
        credentials=AnonymousCredentials(),
        retry=RetryPolicy(),
    )


@pytest.mark.parametrize(
    "wait, place, region",
    [
        (lambda api, op: api.wait_zone_op(op, "us-central1-a", timeout_s=0), " in us-central1-a", "us-central1"),
        (lambda api, op: api.wait_region_op(op, "us-east1", timeout_s=0), " in us-east1", "us-east1"),
        (lambda api, op: api.wait_global_op(op, timeout_s=0), "", "us-central1"),
    ],
)
def test_an_operation_not_done_in_time_is_a_transient_timeout_saying_where(wait, place, region):
    with pytest.raises(CloudError) as info:
        wait(_api(), compute_v1.Operation(name="op-1", status=RUNNING))
    error = info.value
    assert error.code == "WaitTimeout" and error.kind == "transient"
    assert error.message.startswith(f"gcp: operation op-1{place} not done after 0s")
    assert error.where.region == region


def test_a_wait_polls_until_done_and_a_failed_global_operation_raises_its_error(monkeypatch):
    api = _api()
    polled = []
    failed = compute_v1.Operation(
        name="op-2",
        status=DONE,
        error=compute_v1.Error(errors=[compute_v1.Errors(code="QUOTA_EXCEEDED", message="Quota 'FIREWALLS' exceeded")]),
    )

    def wait(**kwargs):
        polled.append(kwargs)
        return failed

    monkeypatch.setattr(api.global_operations, "wait", wait)
    with pytest.raises(CloudError) as info:
        api.wait_global_op(compute_v1.Operation(name="op-2", status=RUNNING))
    assert polled == [{"project": "p", "operation": "op-2"}]
    assert info.value.code == "QUOTA_EXCEEDED"


def test_a_zone_wait_leaves_the_operations_error_to_its_caller(monkeypatch):
    api = _api()
    done = compute_v1.Operation(
        name="op-3",
        status=DONE,
        error=compute_v1.Error(errors=[compute_v1.Errors(code="ZONE_RESOURCE_POOL_EXHAUSTED")]),
    )
    monkeypatch.setattr(api.zone_operations, "wait", lambda **kwargs: done)
    assert api.wait_zone_op(compute_v1.Operation(name="op-3", status=RUNNING), "us-central1-a") is done
    error = api.operation_error(done, zone="us-central1-a", instance_type="n1-standard-8", spot=True)
    assert error is not None and error.code == "ZONE_RESOURCE_POOL_EXHAUSTED"
