"""A real local multi-node Ray cluster for tests: one Ray node per "instance".

Each node gets the custom resource ``rb-node-<id>`` (amount = its worker slots) and
``num_cpus`` = the same, as the trial contract requires; every node binds 127.0.0.1 and keeps
its temp files under a temp dir of its own. Import this module before anything imports ``ray``
(``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` must be set first for the driver to reach loopback nodes).

Use in a test module::

    from ray_helpers import local_ray_cluster   # noqa: F401  (module-scoped fixture)

    def test_x(local_ray_cluster):
        local_ray_cluster.resource("a")  # -> "rb-node-a"
"""

from __future__ import annotations

import os

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

import shutil  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
from dataclasses import dataclass, field  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any, Iterator  # noqa: E402

import pytest  # noqa: E402

#: Instances of the shared test cluster: id -> worker slots. "a" is the head node.
DEFAULT_INSTANCES = {"a": 2, "b": 1}


def _force_loopback() -> None:
    """If ray was imported before the env var was set, apply the same setting directly."""
    constants = sys.modules.get("ray._private.ray_constants")
    if constants is not None:
        constants.ENABLE_RAY_CLUSTER = False


@dataclass
class LocalRayCluster:
    """A running ``ray.cluster_utils.Cluster`` plus which node is which instance."""

    cluster: Any
    temp_dir: Path
    nodes: dict[str, Any] = field(default_factory=dict)

    @property
    def address(self) -> str:
        return self.cluster.address

    @staticmethod
    def resource(instance_id: str) -> str:
        return f"rb-node-{instance_id}"

    def add_instance(self, instance_id: str, slots: int) -> None:
        args: dict[str, Any] = dict(num_cpus=slots, resources={self.resource(instance_id): slots},
                                    node_ip_address="127.0.0.1", object_store_memory=80 * 1024 * 1024)
        if self.cluster.head_node is None:
            (self.temp_dir / "ray").mkdir(parents=True, exist_ok=True)
            args.update(temp_dir=str(self.temp_dir / "ray"), include_dashboard=False)
        self.nodes[instance_id] = self.cluster.add_node(wait=True, **args)

    def remove_instance(self, instance_id: str) -> None:
        self.cluster.remove_node(self.nodes.pop(instance_id), allow_graceful=False)

    def shutdown(self) -> None:
        import ray

        if ray.is_initialized():
            ray.shutdown()
        self.cluster.shutdown()


def start_local_ray_cluster(temp_dir: Path, instances: dict[str, int] | None = None,
                            connect: bool = True) -> LocalRayCluster:
    """Start one Ray node per instance (the first is the head) and connect this process as driver."""
    os.environ["RAY_TMPDIR"] = str(temp_dir)
    _force_loopback()
    import ray
    from ray.cluster_utils import Cluster

    cluster = LocalRayCluster(Cluster(initialize_head=False, connect=False, shutdown_at_exit=True), Path(temp_dir))
    try:
        for instance_id, slots in (instances or DEFAULT_INSTANCES).items():
            cluster.add_instance(instance_id, slots)
        if connect:
            ray.init(address=cluster.address, logging_level="ERROR", log_to_driver=False)
    except BaseException:
        cluster.shutdown()
        raise
    return cluster


def busy_resources() -> dict[str, float]:
    """CPU / GPU / instance slots currently held (by actors or placement groups): {} when idle."""
    import ray

    total, free = ray.cluster_resources(), ray.available_resources()
    return {k: v - free.get(k, 0.0) for k, v in total.items()
            if (k in ("CPU", "GPU") or k.startswith("rb-node-")) and v - free.get(k, 0.0) > 1e-9}


def live_placement_groups() -> list[str]:
    from ray.util.placement_group import placement_group_table

    return [pg_id for pg_id, info in placement_group_table().items() if info.get("state") != "REMOVED"]


def wait_until_idle(timeout_s: float = 10.0) -> dict[str, float]:
    """Poll until no slot is held and no placement group is live; return what is still busy."""
    import time

    deadline = time.monotonic() + timeout_s
    while True:
        busy = busy_resources()
        groups = live_placement_groups()
        if (not busy and not groups) or time.monotonic() > deadline:
            return {**busy, **{f"pg:{g}": 1.0 for g in groups}}
        time.sleep(0.1)


@pytest.fixture(scope="module")
def local_ray_cluster() -> Iterator[LocalRayCluster]:
    """One cluster per test module (head "a" with 2 slots, "b" with 1), always torn down."""
    # A short path under /tmp: Ray's unix socket paths must fit in 107 bytes.
    temp_dir = Path(tempfile.mkdtemp(prefix="rbray-", dir="/tmp"))
    previous = os.environ.get("RAY_TMPDIR")
    cluster = start_local_ray_cluster(temp_dir)
    try:
        yield cluster
    finally:
        cluster.shutdown()
        if previous is None:
            os.environ.pop("RAY_TMPDIR", None)
        else:
            os.environ["RAY_TMPDIR"] = previous
        shutil.rmtree(temp_dir, ignore_errors=True)
