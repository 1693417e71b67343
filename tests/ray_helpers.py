"""A real local multi-node Ray cluster for tests: one Ray node per "instance".

Built on :class:`rubberband.profiler.local_cluster.LocalCluster`: each node binds 127.0.0.1,
has ``num_cpus`` = its worker slots and the custom resource ``rb-node-<id>`` (the trial
contract), and keeps its temp files in a temp dir of its own. Importing this module sets
``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``; import it before anything imports ``ray``.

Use in a test module::

    from ray_helpers import local_ray_cluster, wait_until_idle   # noqa: F401  (module-scoped fixture)

    def test_x(local_ray_cluster):
        local_ray_cluster.resource("a")  # -> "rb-node-a"
"""

from __future__ import annotations

import time
from typing import Iterator

import pytest

from rubberband.cloud.provider import node_resource
from rubberband.profiler.local_cluster import LocalCluster

#: Instances of the shared test cluster: id -> worker slots. "a" is the head node.
DEFAULT_INSTANCES = {"a": 2, "b": 1}


class TestCluster(LocalCluster):
    """LocalCluster plus the helpers the tests use."""

    __test__ = False  # not a test class

    @staticmethod
    def resource(instance_id: str) -> str:
        return node_resource(instance_id)


def busy_resources() -> dict[str, float]:
    """CPU / GPU / instance slots currently held (by actors or placement groups): {} when idle."""
    import ray

    total, free = ray.cluster_resources(), ray.available_resources()
    return {
        k: v - free.get(k, 0.0)
        for k, v in total.items()
        if (k in ("CPU", "GPU") or k.startswith("rb-node-")) and v - free.get(k, 0.0) > 1e-9
    }


def live_placement_groups() -> list[str]:
    from ray.util.placement_group import placement_group_table

    return [pg_id for pg_id, info in placement_group_table().items() if info.get("state") != "REMOVED"]


def wait_until_idle(timeout_s: float = 10.0) -> dict[str, float]:
    """Poll until no slot is held and no placement group is live; return what is still busy."""
    deadline = time.monotonic() + timeout_s
    while True:
        busy = busy_resources()
        groups = live_placement_groups()
        if (not busy and not groups) or time.monotonic() > deadline:
            return {**busy, **{f"pg:{g}": 1.0 for g in groups}}
        time.sleep(0.1)


def start_cluster(instances: dict[str, int] | None = None) -> TestCluster:
    cluster = TestCluster().__enter__()
    try:
        for instance_id, slots in (instances or DEFAULT_INSTANCES).items():
            cluster.add_instance(instance_id, slots)
    except BaseException:
        cluster.close()
        raise
    return cluster


@pytest.fixture(scope="module")
def local_ray_cluster() -> Iterator[TestCluster]:
    """One cluster per test module (head "a" with 2 slots, "b" with 1), always torn down."""
    cluster = start_cluster()
    try:
        yield cluster
    finally:
        cluster.close()
