"""The simulated cloud: instances up after a drawn start-up, spot preemptions and sold-out requests from the plan's
spot model, scripted losses and sold-out types — and the side calls that reach it, done on virtual time.

:class:`SimBackend` is the executor backend of ``--cloud sim`` (:mod:`rubberband.executor.simulated` has the
rest). Its provisioning runs inline in :class:`SimExecutor`, which queues calls as a thread pool of the same size
would; each returns a :class:`SimFuture`, done once virtual time reaches the call's end, with the interface of
``concurrent.futures.Future`` the executor relies on (:class:`~rubberband.executor.cluster.SideCall`).
"""

from __future__ import annotations

import builtins
from concurrent.futures import Executor
from typing import Any, Callable

from rubberband.catalog import Catalog, InstanceType
from rubberband.cloud.backend import BilledHead, HeadHandle, Obtained
from rubberband.cloud.failover import Attempt, FailoverExhausted, alternatives_for
from rubberband.cloud.provider import Instance, InstanceRequest, node_resource
from rubberband.executor.backends import SIM_CLOUD
from rubberband.executor.sim_world import SimInstance, SimWorld
from rubberband.plan import HeadInfo

#: The cloud's error code when a request finds no capacity (AWS's; only its kind, ``capacity``, matters).
NO_CAPACITY = "InsufficientInstanceCapacity"


class SimFuture:
    """A side call's result, done once virtual time reaches its end; cancelled (and its instance never started)
    while it still waits for a free thread, as a queued call of a thread pool."""

    def __init__(self, world: SimWorld, span: tuple[float, float], value: Any = None, error: Any = None) -> None:
        self._world = world
        self._start, self._due = span
        self._value = value
        self._error = error
        self._cancelled = False
        self._callbacks: list[Callable[[Any], object]] = []
        world.pending[id(self)] = self._due

    def done(self) -> bool:
        if self._cancelled or self._world.clock.time() >= self._due:
            self._settle()
            return True
        return False

    def running(self) -> bool:
        now = self._world.clock.time()
        return not self._cancelled and self._start <= now < self._due

    def cancelled(self) -> bool:
        return self._cancelled

    def cancel(self) -> bool:
        """Cancel a call that has not started (its instance is discarded, never billed); False once it runs."""
        if self._cancelled:
            return True
        if self._world.clock.time() >= self._start:
            return False
        self._cancelled = True
        for instance in self._value or []:
            sim = self._world.instances.get(getattr(instance, "id", ""))
            if sim is not None:
                sim.ended_at = self._start
        self._settle()
        return True

    def result(self, timeout: float | None = None) -> Any:
        if self._cancelled:
            raise RuntimeError("the call was cancelled")
        self._world.clock.advance_to(self._due)  # a blocking wait for it: time passes until it is done
        self._settle()
        if self._error is not None:
            raise self._error
        return self._value

    def add_done_callback(self, fn: Callable[[Any], object]) -> None:
        self._callbacks.append(fn)

    def _settle(self) -> None:
        self._world.pending.pop(id(self), None)
        callbacks, self._callbacks = self._callbacks, []
        for fn in callbacks:
            fn(self)


class SimExecutor(Executor):
    """Runs each submitted call inline; the call takes from when one of ``workers`` is free until the end it
    sets (``world.call_due``: an instance's start-up), so calls queue as on a thread pool of that size."""

    def __init__(self, world: SimWorld, workers: int) -> None:
        self._world = world
        self._free_at = [0.0] * max(1, workers)

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:  # type: ignore[override]
        world = self._world
        slot = min(range(len(self._free_at)), key=self._free_at.__getitem__)
        start = max(world.clock.time(), self._free_at[slot])
        world.call_start, world.call_due = start, None
        value, error = None, None
        try:
            value = fn(*args, **kwargs)
        except Exception as exc:  # noqa: BLE001 - handed to whoever reads the future, as a thread pool does
            error = exc
        due = max(start, world.call_due or start)
        world.call_start = world.call_due = None
        self._free_at[slot] = due
        return SimFuture(world, (start, due), value, error)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        return None


class SimBackend:
    """The simulated cloud (see the module docstring). ``catalog``: where failover finds an alternative to a
    sold-out type."""

    cloud = SIM_CLOUD
    ray_auth_mode = "disabled"
    ray_auth_token_path = None
    device_policy = None
    metadata_url = None

    def __init__(
        self, world: SimWorld, catalog: Catalog, head_type: InstanceType, head: HeadInfo | None = None
    ) -> None:
        self.world = world
        self.catalog = catalog
        self.head_type = head_type
        self.head = head
        self._count = 0

    def start_head(self, run_id: str) -> HeadHandle:
        """A local run's head is a node that boots first (the median start-up); a head instance (head mode on a
        cloud, when the plan bills one) booted before the job started and is billed as the plan has it."""
        clock = self.world.clock
        clock.sleep(self.world.model.head_wait_s(self.head_type.cloud, self.head_type.name))
        billed = None
        if self.head is not None:
            billed = BilledHead(
                id="sim-head",
                instance_type=self.head.instance_type,
                cloud=self.head.cloud,
                price_hr=self.head.price_hr,
                launched_at=clock.time() - self.head.boot_s,
                grace_s=self.head.grace_s,
            )
        return HeadHandle(address="sim", id="sim-head", billed=billed)

    def stop_head(self) -> bool:
        return False

    def provision(self, request: InstanceRequest) -> list[Instance]:
        world = self.world
        start = world.call_start if world.call_start is not None else world.clock.time()
        itype, spot, obtained = self._obtain(request, start)
        zones = itype.zones_to_try(spot)  # the first zone the real failover tries
        zone_name = zones[0] if zones else itype.region
        up_at = start + world.startup_s(itype)
        world.call_due = up_at
        self._count += 1
        ident = f"sim-{self._count}"
        instance = Instance(
            id=ident,
            cloud=itype.cloud,
            instance_type=itype.name,
            zone=zone_name,
            state="running",
            run_id=request.run_id,
            stage=request.stage,
            launched_at=start,
        )
        zone = world.spot_zone(itype) if spot else None
        preempted_after = None if zone is None else world.preemption_after_s(zone)
        world.add(SimInstance(instance, itype, up_at, spot=spot, obtained=obtained), preempted_after)
        world.by_resource[node_resource(ident)] = ident
        return [instance]

    def _obtain(self, request: InstanceRequest, start: float) -> tuple[InstanceType, bool, Obtained | None]:
        """The type and market a request gets: a sold-out type's alternative (failover), on-demand where a spot
        request finds no capacity and may fall over (else the cloud's capacity error)."""
        world, itype, spot = self.world, request.instance_type, request.spot
        tried: list[Attempt] = []
        if world.sold_out(itype):
            tried.append(self._attempt(itype, "sold out in every zone", spot))
            alt = next(
                (
                    a
                    for a in alternatives_for(itype, self.catalog, spot=spot, clouds=[itype.cloud])
                    if not world.sold_out(a)
                ),
                None,
            )
            if alt is None:
                raise FailoverExhausted(
                    f"no capacity for {itype.name} nor any alternative", kind="capacity", attempts=tried
                )
            itype = alt
        zone = world.spot_zone(itype) if spot else None
        if zone is not None and not world.spot_capacity(zone, start):
            tried.append(self._attempt(itype, f"no spot capacity for {itype.name} in {zone.zone}", True))
            if not request.on_demand_fallback:
                raise FailoverExhausted(
                    f"could not provision {request.count}x {itype.name} for run {request.run_id} (tried "
                    f"{itype.name}: capacity) — no spot capacity and no on-demand fall-back allowed",
                    kind="capacity",
                    attempts=tried,
                )
            spot = False
            itype = request.on_demand_type or itype  # the plan's fall-back type, where it names one
        if not tried:
            return itype, spot, None
        zones = itype.zones_to_try(spot)  # the first zone the real failover tries
        zone_name = zones[0] if zones else itype.region
        ok = Attempt(itype.cloud, itype.region, zone_name, itype.name, "ok", market="spot" if spot else "on_demand")
        return itype, spot, Obtained(itype, zone_name, (*tried, ok), spot=spot)

    @staticmethod
    def _attempt(itype: InstanceType, why: str, spot: bool) -> Attempt:
        zones = itype.zones_to_try(spot)  # the first zone the real failover tries
        zone = zones[0] if zones else itype.region
        market = "spot" if spot else "on_demand"
        return Attempt(itype.cloud, itype.region, zone, itype.name, "capacity", NO_CAPACITY, why, market=market)

    def wait(self, instance_ids: builtins.list[str], timeout_s: float) -> builtins.list[Instance]:
        return [self.world.instances[i].instance for i in instance_ids if i in self.world.instances]

    def list(self, run_id: str | None = None) -> list[Instance]:
        now = self.world.clock.time()
        return [
            s.instance
            for s in self.world.instances.values()
            if s.running(now) and (run_id is None or s.instance.run_id == run_id)
        ]

    def terminate(self, instance_ids: builtins.list[str]) -> None:
        now = self.world.clock.time()
        for ident in instance_ids:
            sim = self.world.instances.get(ident)
            if sim is not None and sim.ended_at is None:  # one taken back ended when the cloud took it
                sim.ended_at = sim.taken_at if sim.taken_at is not None and sim.taken(now) else now

    def check_lost(self, instance_ids: builtins.list[str]) -> dict[str, str]:
        """The instances the cloud has taken back (``spot-interruption``; a scripted loss of an on-demand one:
        ``lost``)."""
        now = self.world.clock.time()
        instances = self.world.instances
        return {i: instances[i].taken_why for i in instance_ids if i in instances and instances[i].taken(now)}

    def obtained(self, instance_id: str) -> Obtained | None:
        """What failover obtained where it is not what was asked (None: what was asked)."""
        sim = self.world.instances.get(instance_id)
        return None if sim is None else sim.obtained

    def unavailable(self, itype: InstanceType, spot: bool = False) -> bool:
        """A scripted sold-out type, or one whose stock a request found launched (every zone blocked)."""
        return self.world.unavailable(itype)

    def runtime_env(self, code_dir: str) -> dict | None:
        return None
