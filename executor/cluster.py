"""How the executor reaches the cluster its trials run on: Ray for a real run, a simulated one on virtual time.

The controller asks the cluster five things, and nothing else of Ray (the warm worker pool and the spot-notice
watchers are the default trial runtime's and a cloud's, and stay Ray's):

* ``connect`` to the run's head, and ``close`` at teardown;
* ``start_sink``: where trial workers send their epoch and checkpoint events (a journal sink);
* ``wait`` until some of the running trials are done (their handles' ``done_ref``), or ``timeout_s`` passes;
* ``node_resources``: what the cluster's nodes offer now (``rb-node-<id>`` per live instance), for loss detection;
* ``executor``: where the side calls to the cloud (provisioning, termination) run — threads on wall time.

:class:`RayCluster` is the real one. :class:`rubberband.executor.simulated.SimCluster` plays a cluster on a
:class:`~rubberband.executor.clock.VirtualClock` (``rubberband run --cloud sim``): the same controller, no Ray.
"""

from __future__ import annotations

import logging
import os
from concurrent.futures import Executor, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from rubberband.executor.clock import WALL_CLOCK, Clock


@runtime_checkable
class Cluster(Protocol):
    """What the controller needs of the cluster its trials run on (see the module docstring)."""

    def connect(self, address: str, *, namespace: str, runtime_env: dict | None, auth_mode: str) -> None: ...

    def start_sink(self, run_dir: str | Path) -> Any: ...

    def wait(self, refs: list[Any], timeout_s: float) -> list[Any]: ...

    def node_resources(self) -> dict[str, float]: ...

    def executor(self, workers: int, name: str) -> Executor: ...

    def close(self) -> None: ...


class RayCluster:
    """The run's Ray cluster, reached from this process (the driver).

    ``connect`` sets the driver's Ray auth mode (``RAY_AUTH_MODE``: what the head speaks) for the run and
    ``close`` puts the process's own setting back, so nothing of one run's Ray leaks into the next one started
    from the same process.
    """

    def __init__(self, clock: Clock = WALL_CLOCK) -> None:
        self.clock = clock
        self._saved_auth: str | None = None
        self._connected = False

    def connect(self, address: str, *, namespace: str, runtime_env: dict | None, auth_mode: str) -> None:
        os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
        self._saved_auth = os.environ.get("RAY_AUTH_MODE")
        self._connected = True
        _set_auth_mode(auth_mode)
        import ray

        ray.init(
            address=address,
            namespace=namespace,
            log_to_driver=False,
            logging_level=logging.ERROR,
            runtime_env=runtime_env,
        )

    def start_sink(self, run_dir: str | Path) -> Any:
        from rubberband.executor.journal import start_sink

        return start_sink(run_dir)

    def wait(self, refs: list[Any], timeout_s: float) -> list[Any]:
        if not refs:
            self.clock.sleep(timeout_s)
            return []
        import ray

        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=timeout_s)
        return ready

    def node_resources(self) -> dict[str, float]:
        import ray

        return ray.cluster_resources()

    def executor(self, workers: int, name: str) -> Executor:
        return ThreadPoolExecutor(max_workers=workers, thread_name_prefix=name)

    def close(self) -> None:
        import sys

        ray = sys.modules.get("ray")
        try:
            if ray is not None and ray.is_initialized():
                ray.shutdown()
        finally:
            if self._connected:
                self._connected = False
                _set_auth_mode(self._saved_auth)


def _set_auth_mode(mode: str | None) -> None:
    """Set (None: unset) ``RAY_AUTH_MODE`` and make an already imported Ray read it again."""
    if mode is None:
        os.environ.pop("RAY_AUTH_MODE", None)
    else:
        os.environ["RAY_AUTH_MODE"] = mode
    try:  # ray may have been imported (and its config cached) before the mode was set
        from ray._raylet import Config  # type: ignore[attr-defined]

        Config.initialize("")  # what ray's _enable_token_auth does after setting the variable
    except ImportError:  # pragma: no cover - other ray versions read the variable at init
        pass
