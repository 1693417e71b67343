"""A throw-away Ray cluster on this machine: one Ray node per local "instance".

Each node binds 127.0.0.1, has ``num_cpus`` = its worker slots (or what ``num_cpus`` /
``num_gpus`` say: a node of a GPU type advertises *logical* GPUs, see
:func:`rubberband.devices.node_resources`) and the custom resource ``rb-node-<id>``
with one unit per worker slot (the trial contract), and keeps its temp files under a
directory of this run. :class:`LocalCluster` is a context manager: every node it started is
torn down on exit, whatever happened. It also measures local start-up latency: request →
node registered → a worker process running on it.

``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` must be in the environment before ``ray`` is imported
for a driver to reach loopback-only nodes; this module sets it on import (and, if ``ray`` was
imported first, applies the same setting to Ray's constant).

(The executor's local cloud provider builds the full version of this; this one serves the
profiler and the tests.)
"""

from __future__ import annotations

import os

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

import shutil  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from dataclasses import dataclass, field  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

from rubberband.cloud.provider import node_resource  # noqa: E402
from rubberband.errors import ExecutionError  # noqa: E402
from rubberband.net import free_port  # noqa: E402
from rubberband.paths import short_tmp_root  # noqa: E402


def force_loopback() -> None:
    """Apply ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` even if ray was imported before this module."""
    constants = sys.modules.get("ray._private.ray_constants")
    if constants is not None:
        constants.ENABLE_RAY_CLUSTER = False


@dataclass(frozen=True)
class NodeStart:
    """How long one node took: request → registered with the cluster → a worker answering on it."""

    instance_id: str
    registered_s: float
    ready_s: float | None = None


@dataclass
class LocalCluster:
    """Ray nodes on this machine; use as ``with LocalCluster() as cluster: ...``."""

    temp_root: Path | None = None
    connect: bool = True
    nodes: dict[str, Any] = field(default_factory=dict)
    starts: list[NodeStart] = field(default_factory=list)
    _cluster: Any = None
    _temp_dir: Path | None = None
    _owns_temp: bool = False
    _saved_tmpdir: str | None = None

    # -- lifecycle -------------------------------------------------------------------------
    def __enter__(self) -> "LocalCluster":
        force_loopback()
        from ray.cluster_utils import Cluster

        # Ray's unix socket paths must fit in 107 bytes: keep the temp dir short.
        if self.temp_root is None:
            self._temp_dir = Path(tempfile.mkdtemp(prefix="rb-ray-", dir=short_tmp_root()))
            self._owns_temp = True
        else:
            self._temp_dir = Path(self.temp_root)
            self._temp_dir.mkdir(parents=True, exist_ok=True)
        (self._temp_dir / "ray").mkdir(exist_ok=True)
        self._saved_tmpdir = os.environ.get("RAY_TMPDIR")
        os.environ["RAY_TMPDIR"] = str(self._temp_dir)
        self._cluster = Cluster(initialize_head=False, connect=False, shutdown_at_exit=True)
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Disconnect and stop every node started here (idempotent)."""
        import ray

        try:
            if ray.is_initialized():
                ray.shutdown()
        finally:
            if self._cluster is not None:
                self._cluster.shutdown()
                self._cluster = None
            self.nodes.clear()
            if self._saved_tmpdir is None:
                os.environ.pop("RAY_TMPDIR", None)
            else:
                os.environ["RAY_TMPDIR"] = self._saved_tmpdir
            if self._owns_temp and self._temp_dir is not None:
                shutil.rmtree(self._temp_dir, ignore_errors=True)

    @property
    def address(self) -> str:
        return self._cluster.address

    # -- nodes -----------------------------------------------------------------------------
    def add_instance(
        self,
        instance_id: str,
        slots: int,
        *,
        ready_timeout_s: float | None = None,
        num_gpus: int = 0,
        num_cpus: int | None = None,
    ) -> NodeStart:
        """Start one node for ``instance_id`` with ``slots`` worker slots; the first one is the head.

        ``num_gpus`` GPUs (logical ones where the machine has none, as ``ray start --num-gpus``) and
        ``num_cpus`` CPUs (default: ``slots``) are what the node advertises. With ``ready_timeout_s``
        also start a worker process pinned to it and time until it answers (waiting that long at most).
        """
        import ray

        if self._cluster is None:
            raise ExecutionError("LocalCluster is not started; use it as a context manager")
        if instance_id in self.nodes:
            raise ExecutionError(f"local instance {instance_id!r} already exists")
        args: dict[str, Any] = dict(
            num_cpus=slots if num_cpus is None else num_cpus,
            num_gpus=num_gpus,
            resources={node_resource(instance_id): slots},
            node_ip_address="127.0.0.1",
            object_store_memory=80 * 1024 * 1024,
            # each node's dashboard agent binds 52365 by default: on one machine all but the first would retry it
            # for ~3.4 s at start, then run without it
            dashboard_agent_listen_port=free_port(),
        )
        head = self._cluster.head_node is None
        if head:
            args.update(temp_dir=str(self._temp_dir / "ray"), include_dashboard=False)
        began = time.monotonic()
        self.nodes[instance_id] = self._cluster.add_node(wait=True, **args)
        registered = time.monotonic() - began
        if head and self.connect:
            ray.init(address=self._cluster.address, logging_level="ERROR", log_to_driver=False, configure_logging=True)
        ready = None
        if ready_timeout_s is not None:
            ready = self._time_worker(instance_id, began, ready_timeout_s)
        start = NodeStart(instance_id, registered, ready)
        self.starts.append(start)
        return start

    def _time_worker(self, instance_id: str, began: float, timeout_s: float) -> float:
        import ray

        from rubberband.executor.worker import actor_class, actor_options

        actor = actor_class().options(**actor_options(node_resource(instance_id))).remote()
        try:
            ray.get(actor.ping.remote(), timeout=timeout_s)
        except Exception as exc:  # noqa: BLE001 - GetTimeoutError or a dead actor
            raise ExecutionError(
                f"local instance {instance_id} did not run a worker within {timeout_s:.0f} s ({type(exc).__name__})"
            ) from None
        finally:
            ray.kill(actor, no_restart=True)
        return time.monotonic() - began

    def remove_instance(self, instance_id: str) -> None:
        """Take one instance away (its node's processes are killed)."""
        node = self.nodes.pop(instance_id)
        self._cluster.remove_node(node, allow_graceful=False)
