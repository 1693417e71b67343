"""How the executor reaches the cluster its trials run on: Ray for a real run, a simulated one on virtual time.

The executor asks the cluster these things, and nothing else of Ray (the warm worker pool is the default trial
runtime's, and stays Ray's):

* ``connect`` to the run's head, and ``close`` at teardown;
* ``start_sink``: where trial workers send their epoch and checkpoint events (a journal sink);
* ``wait`` until one of ``refs`` is ready (a trial's ``done_ref``, a notice watcher's pending answer), ``wake``
  is called (a side call finished on its thread), or ``timeout_s`` passes — the loop's one blocking call;
* ``node_resources``: what the cluster's nodes offer now (``rb-node-<id>`` per live instance), for loss detection;
* ``executor``: where the side calls to the cloud (provisioning, termination) run — threads on wall time — each
  returning a :class:`SideCall`;
* ``watchers``: the preemption-notice watchers of the run's spot instances (Ray actors on their nodes).

:class:`RayCluster` is the real one. :class:`rubberband.executor.simulated.SimCluster` plays a cluster on a
:class:`~rubberband.executor.clock.VirtualClock` (``rubberband run --cloud sim``): the same executor, no Ray.
"""

from __future__ import annotations

import logging
import os
import threading
from concurrent.futures import Executor, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, Protocol, runtime_checkable

from rubberband.executor.clock import WALL_CLOCK, Clock, WallClock

#: While trials run, how often a wait on Ray looks whether a side call woke it (Ray's wait cannot be woken from
#: another thread; a wait with nothing running blocks on the wake alone).
WAKE_SLICE_S = 0.5
#: Where Ray reads the token a driver presents to a token-auth head (the run's own token file).
TOKEN_PATH_ENV = "RAY_AUTH_TOKEN_PATH"


@runtime_checkable
class SideCall(Protocol):
    """A call running beside the loop (provisioning, termination): what ``concurrent.futures.Future`` offers, and
    what the simulated cluster's calls implement too, so the executor treats both alike."""

    def done(self) -> bool: ...

    def running(self) -> bool: ...

    def cancel(self) -> bool: ...

    def cancelled(self) -> bool: ...

    def result(self, timeout: float | None = None) -> Any: ...

    def add_done_callback(self, fn: Callable[[Any], object]) -> None: ...


@runtime_checkable
class NoticeWatching(Protocol):
    """The run's preemption-notice watchers (:class:`~rubberband.executor.notices.NoticeWatchers` on Ray)."""

    def watching(self, instance_id: str) -> bool: ...

    def watch(self, instance_id: str, resource: str) -> str | None: ...

    def unwatch(self, instance_id: str) -> None: ...

    def taken(self, instance_id: str) -> None: ...

    def names(self, instance_ids: tuple[str, ...] | list[str]) -> list[str]: ...

    def found(self, ask: tuple[str, ...] = ()) -> dict[str, Any]: ...

    def refs(self) -> list[Any]: ...


@runtime_checkable
class Cluster(Protocol):
    """What the executor needs of the cluster its trials run on (see the module docstring). ``idle_tick_s``: how
    often the loop refreshes the progress display while nothing happens; ``liveness_every_s``: how often it asks
    whether the nodes are still there (0: at every turn — a cluster whose wait returns when a node goes away)."""

    @property
    def idle_tick_s(self) -> float: ...

    @property
    def liveness_every_s(self) -> float: ...

    def connect(
        self,
        address: str,
        *,
        namespace: str,
        runtime_env: dict | None,
        auth_mode: str,
        auth_token_path: str | None = None,
    ) -> None: ...

    def start_sink(self, run_dir: str | Path) -> Any: ...

    def wait(self, refs: list[Any], timeout_s: float) -> list[Any]: ...

    def wake(self) -> None: ...

    def node_resources(self) -> dict[str, float]: ...

    def executor(self, workers: int, name: str) -> Executor: ...

    def watchers(self, cloud: str, metadata_url: str | None) -> NoticeWatching: ...

    def close(self) -> None: ...


class RayCluster:
    """The run's Ray cluster, reached from this process (the driver).

    ``connect`` sets the driver's Ray auth mode (``RAY_AUTH_MODE``: what the head speaks) for the run and
    ``close`` puts the process's own setting back, so nothing of one run's Ray leaks into the next one started
    from the same process.
    """

    def __init__(self, clock: Clock = WALL_CLOCK) -> None:
        self.clock = clock
        self._saved_auth: tuple[str | None, str | None] = (None, None)
        self._connected = False
        self._woken = threading.Event()

    @property
    def idle_tick_s(self) -> float:
        return 1.0

    @property
    def liveness_every_s(self) -> float:
        return 2.0  # Ray marks a dead node within ~2 s on the run's head

    def connect(
        self,
        address: str,
        *,
        namespace: str,
        runtime_env: dict | None,
        auth_mode: str,
        auth_token_path: str | None = None,
    ) -> None:
        os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
        self._saved_auth = (os.environ.get("RAY_AUTH_MODE"), os.environ.get(TOKEN_PATH_ENV))
        self._connected = True
        if auth_token_path is not None:  # else the token Ray finds already (a head's env, ~/.ray/auth_token)
            _set_env(TOKEN_PATH_ENV, auth_token_path)
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
        """The refs ready once one is, :meth:`wake` was called, or ``timeout_s`` passed (then [])."""
        if not refs:
            self._pause(timeout_s)
            return []
        import ray

        end = self.clock.monotonic() + max(0.0, timeout_s)
        while True:
            left = end - self.clock.monotonic()
            ready, _ = ray.wait(refs, num_returns=1, timeout=max(0.0, min(left, WAKE_SLICE_S)))
            if ready:
                return ray.wait(refs, num_returns=len(refs), timeout=0)[0]
            if self._woken.is_set() or left <= WAKE_SLICE_S:
                self._woken.clear()
                return []

    def _pause(self, seconds: float) -> None:
        """Nothing to wait on but time and a wake: block on the wake (wall time), or let the clock move."""
        if isinstance(self.clock, WallClock):
            self._woken.wait(max(0.0, seconds))
        else:
            self.clock.sleep(seconds)
        self._woken.clear()

    def wake(self) -> None:
        """End a :meth:`wait` in progress (thread-safe): a side call finished."""
        self._woken.set()

    def node_resources(self) -> dict[str, float]:
        import ray

        return ray.cluster_resources()

    def executor(self, workers: int, name: str) -> Executor:
        return ThreadPoolExecutor(max_workers=workers, thread_name_prefix=name)

    def watchers(self, cloud: str, metadata_url: str | None) -> NoticeWatching:
        from rubberband.executor.notices import NoticeWatchers

        return NoticeWatchers(cloud, metadata_url)

    def close(self) -> None:
        import sys

        ray = sys.modules.get("ray")
        try:
            if ray is not None and ray.is_initialized():
                ray.shutdown()
        finally:
            if self._connected:
                self._connected = False
                mode, token_path = self._saved_auth
                _set_env(TOKEN_PATH_ENV, token_path)
                _set_auth_mode(mode)


def _set_env(name: str, value: str | None) -> None:
    """Set (None: unset) an environment variable of this process."""
    if value is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = value


def _set_auth_mode(mode: str | None) -> None:
    """Set (None: unset) ``RAY_AUTH_MODE`` and make an already imported Ray read it (and the token path) again."""
    _set_env("RAY_AUTH_MODE", mode)
    try:  # ray may have been imported (and its config cached) before the mode was set
        from ray._raylet import Config  # type: ignore[attr-defined]

        Config.initialize("")  # what ray's _enable_token_auth does after setting the variable
    except ImportError:  # pragma: no cover - other ray versions read the variable at init
        pass
