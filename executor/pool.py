"""Warm worker processes per instance, so a resize costs a process-group re-init, not a new process.

Starting a worker actor costs ~2 s (process start + torch import); reusing one and
re-initialising the process group with the new world size costs ~0.04 s. A
:class:`WorkerPool` keeps idle :class:`~rubberband.executor.worker.TrialWorker` actors per
instance (per ``rb-node-<id>`` custom resource). ``TrialRun.start(spec, pool=pool)`` takes its
workers from the pool (starting any that are missing) and gives healthy ones back when the run
ends; workers of a failed or stopped run are killed, never reused.

Each worker asks Ray for what its :class:`~rubberband.devices.WorkerDevice` says (one
CPU on CPU types; one GPU and the instance's vCPUs per GPU on GPU types). An idle pooled worker
keeps holding its slot (those CPUs / that GPU and one unit of the instance's ``rb-node-<id>``
resource), exactly like a worker in a placement group: use the pool for every
trial of an instance, or size it so that placement groups of other trials still fit.
"""

from __future__ import annotations

import time
from typing import Any

from rubberband.errors import ExecutionError
from rubberband.devices import CPU_WORKER, WorkerDevice
from rubberband.executor.worker import actor_class, actor_options


class WorkerPool:
    """Idle warm workers keyed by the instance resource they are pinned to.

    ``device`` is the default :class:`WorkerDevice` of workers it starts; :meth:`take` and
    :meth:`warm` accept the device of the trial (every worker of one instance has the same one).
    """

    def __init__(self, *, device: WorkerDevice = CPU_WORKER, warm_torch: bool = True) -> None:
        """``warm_torch``: its workers import torch as they start (the job has trials of several workers, or GPU
        types); False: a job of one-worker CPU trials, whose workers import torch only if the training does."""
        self.device = device
        self.warm_torch = warm_torch
        self._idle: dict[str, list[Any]] = {}
        self._devices: dict[str, WorkerDevice] = {}  # the device the idle workers of a resource were started for
        self._cls = actor_class()

    def _start(self, resource: str, device: WorkerDevice | None = None) -> Any:
        device = device or self.device
        if self._devices.get(resource, device) != device:
            self.shrink(resource, 0)  # idle workers started for another device hold the wrong Ray resources
        self._devices[resource] = device
        return self._cls.options(**actor_options(resource, device)).remote(self.warm_torch or device.use_gpu)

    def warm(
        self,
        resource: str,
        count: int = 1,
        *,
        timeout_s: float = 60.0,
        wait: bool = True,
        device: WorkerDevice | None = None,
    ) -> list[Any]:
        """Make sure ``count`` idle workers are up on ``resource``.

        ``wait=True`` blocks until they answer (bounded by ``timeout_s``); ``wait=False`` only starts
        them, e.g. on a new instance before the stage boundary, so the next run finds them ready, and
        returns their ``ping`` refs: they are up once those are ready.
        """
        import ray

        if self._devices.get(resource, device or self.device) != (device or self.device):
            self.shrink(resource, 0)
        missing = max(0, count - len(self._idle.get(resource, [])))
        fresh = [self._start(resource, device) for _ in range(missing)]
        if not fresh:
            return []
        if not wait:
            self._idle.setdefault(resource, []).extend(fresh)
            return [a.ping.remote() for a in fresh]
        deadline = time.monotonic() + timeout_s
        refs = [a.ping.remote() for a in fresh]
        ready, pending = ray.wait(refs, num_returns=len(refs), timeout=timeout_s)
        if pending or time.monotonic() > deadline:
            for actor in fresh:
                ray.kill(actor, no_restart=True)
            raise ExecutionError(
                f"could not start {missing} warm worker(s) on {resource} within {timeout_s:.0f} s; "
                f"check that the instance is up and has free slots"
            )
        ray.get(ready, timeout=timeout_s)
        self._idle.setdefault(resource, []).extend(fresh)
        return []

    @staticmethod
    def started(refs: list[Any]) -> bool:
        """Whether the workers whose ``ping`` refs :meth:`warm` returned (``wait=False``) all answer now; a failed
        ping counts as answered (the trial placed there, and loss detection, will tell)."""
        if not refs:
            return True
        import ray

        try:
            done, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
        except Exception:  # noqa: BLE001 - see the docstring
            return True
        return len(done) == len(refs)

    def take(self, resource: str, device: WorkerDevice | None = None) -> tuple[Any, bool]:
        """An idle worker on ``resource`` (``warm=True``) or a freshly started one (``warm=False``)."""
        idle = self._idle.get(resource)
        if idle and self._devices.get(resource) == (device or self.device):
            return idle.pop(), True
        return self._start(resource, device), False

    def give(self, resource: str, actor: Any) -> None:
        """Return a healthy worker after its run finished."""
        self._idle.setdefault(resource, []).append(actor)

    def idle(self) -> dict[str, int]:
        return {r: len(a) for r, a in self._idle.items() if a}

    def shrink(self, resource: str, keep: int = 0) -> None:
        """Kill idle workers on ``resource`` beyond ``keep`` (e.g. before its instance goes away)."""
        import ray

        idle = self._idle.get(resource, [])
        while len(idle) > keep:
            ray.kill(idle.pop(), no_restart=True)

    def close(self) -> None:
        """Kill every idle worker; idempotent."""
        for resource in list(self._idle):
            self.shrink(resource, 0)
        self._idle.clear()

    def __enter__(self) -> "WorkerPool":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
