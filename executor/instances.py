"""The run's instances as the executor holds them: requested, provisioning, ready, released, terminated.

:class:`InstancePool` is the edge between the executor and the cloud for instances. It sends requests
(side by side on a cloud, one after another where instances must come up in turn), gathers the ones that
came up and journals each (``instance_requested`` with the type and market failover actually obtained,
``instance_ready`` with its start-up), and terminates released ones off the loop's thread, journaling when
each stopped billing. Which instance to request, keep or release is the executor's decision (its
policies); this module only does it and keeps the record.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from rubberband.catalog import InstanceType
from rubberband.cloud.backend import ExecutorBackend
from rubberband.cloud.provider import InstanceRequest
from rubberband.errors import CatalogError, CloudError, ExecutionError
from rubberband.executor import journal as J
from rubberband.executor.cluster import SideCall
from rubberband.executor.decisions import price_hr
from rubberband.executor.services import Services

#: Instance requests in flight at once on a cloud (each waits for its instance's boot and Ray join on a thread):
#: a stage's instances start together, as the simulator has them; the cloud SDKs retry what the API throttles.
PARALLEL_REQUESTS = 128


@dataclass
class PoolInstance:
    """An instance the run asked for: pending (provisioning), ready, or released."""

    token: str
    itype: InstanceType
    spot: bool
    assigned_stage: int
    future: SideCall | None = None
    id: str | None = None
    ready: bool = False
    released: bool = False
    requested_at: float | None = None
    ready_at: float | None = None
    terminated_at: float | None = None
    warming: list = field(default_factory=list)  # ping refs of its warm workers, while they start
    replaces: str | None = None  # the noticed instance it replaces (kept while that one's trials move over)
    on_demand_type: InstanceType | None = None  # a spot request's fall-back type, if it falls over to on-demand
    unwanted: bool = False  # released while it was starting: let go the moment it is up


@dataclass(frozen=True)
class Arrival:
    """An instance that came up: what was asked, what failover obtained, and its start-up."""

    entry: PoolInstance
    requested: InstanceType
    startup_s: float
    moved_to_on_demand: bool  # a spot request that found no spot capacity anywhere: on-demand

    @property
    def substituted(self) -> bool:
        """Failover took another type (not the plan's fall-back type of a spot request bought on-demand)."""
        fallback = self.entry.on_demand_type
        planned = self.moved_to_on_demand and fallback is not None and self.entry.itype.key == fallback.key
        return self.entry.itype.key != self.requested.key and not planned


@dataclass(frozen=True)
class Got:
    """What a request obtained: the type, zone and market, and failover's tries (one line each)."""

    itype: InstanceType
    zone: str | None
    attempts: list[str]
    spot: bool


@dataclass(frozen=True)
class Order:
    """One instance to request for stage ``stage``: its type and market, and what a spot request that finds no spot
    capacity may buy on-demand instead (``on_demand_type``, default the same type; none without
    ``on_demand_fallback``)."""

    stage: int
    itype: InstanceType
    spot: bool
    on_demand_fallback: bool = False
    on_demand_type: InstanceType | None = None


class InstancePool:
    """Requests, arrivals and terminations of one executor's instances (see the module docstring).

    ``serial``: requests one after another (instances that must come up in turn); ``wake``: called (from the
    provisioner's thread) whenever a request is done, so the loop wakes at once rather than at its next timer.
    """

    def __init__(self, services: Services, *, serial: bool, wake: Callable[[], None] | None = None) -> None:
        self.run_id = services.run_id
        self.services = services
        self.catalog = services.catalog
        self.journal = services.journal
        self.clock = services.clock
        self.entries: dict[str, PoolInstance] = {}
        self._tokens = 0
        self._wake = wake
        self.provisioner = services.cluster.executor(1 if serial else PARALLEL_REQUESTS, "rb-provision")
        self.terminator = services.cluster.executor(4, "rb-terminate")
        self.terminations: list[tuple[PoolInstance, str, Any, str]] = []  # entry, its id, the call, why

    @property
    def backend(self) -> ExecutorBackend:
        return self.services.backend

    # -- lookups -------------------------------------------------------------------------------
    def entry(self, instance_id: str) -> PoolInstance | None:
        """The entry of a provisioned instance (None: not one of this run's, or not up yet)."""
        return next((p for p in self.entries.values() if p.id == instance_id), None)

    def of_stage(self, g: int) -> list[PoolInstance]:
        """The unreleased instances assigned to stage ``g``."""
        return [p for p in self.entries.values() if p.assigned_stage == g and not p.released]

    # -- effects -------------------------------------------------------------------------------
    def request(self, order: Order) -> PoolInstance:
        """Send one request (it runs until the instance is up and joined)."""
        self._tokens += 1
        entry = PoolInstance(
            token=f"req{self._tokens}",
            itype=order.itype,
            spot=order.spot,
            assigned_stage=order.stage,
            on_demand_type=order.on_demand_type,
        )
        request = InstanceRequest(
            run_id=self.run_id,
            stage=order.stage,
            instance_type=order.itype,
            count=1,
            spot=order.spot,
            on_demand_fallback=order.on_demand_fallback,
            on_demand_type=order.on_demand_type,
        )
        entry.future = self.provisioner.submit(self.backend.provision, request)
        if self._wake is not None:
            wake = self._wake
            entry.future.add_done_callback(lambda _: wake())
        self.entries[entry.token] = entry
        return entry

    def collect(self) -> list[Arrival]:
        """The instances that came up since the last call, each journaled; a failed request raises."""
        arrivals = []
        for entry in list(self.entries.values()):
            if entry.future is None or not entry.future.done():
                continue
            future, entry.future = entry.future, None
            if future.cancelled():  # teardown cancelled it before it started: nothing to stop
                entry.released = True
                continue
            try:
                instance = future.result()[0]
            except CloudError as exc:
                entry.released = True
                raise ExecutionError(f"could not provision a {entry.itype.name}: {exc}") from None
            arrivals.append(self._arrived(entry, instance))
        return arrivals

    def _arrived(self, entry: PoolInstance, instance: Any) -> Arrival:
        entry.id, entry.ready = instance.id, True
        entry.requested_at = instance.launched_at or self.clock.time()
        now = self.clock.time()
        entry.ready_at = now
        requested = entry.itype
        got = self._obtained(entry, instance)
        obtained, zone, spot = got.itype, got.zone, got.spot
        moved = spot != entry.spot
        if obtained.key != requested.key or moved:  # failover gave another type or market
            self.journal.record(self._failover(entry, instance.id, requested, got))
            entry.itype = obtained  # billed as the type obtained; the stage runs on it
            entry.spot = spot  # a spot stage on on-demand: its instances carry over as the stage's
        extra: dict[str, Any] = {"requested_type": requested.name} if obtained.key != requested.key else {}
        self.journal.record(
            J.InstanceRequested(
                t=entry.requested_at,
                id=instance.id,
                instance_type=obtained.name,
                cloud=obtained.cloud,
                region=obtained.region,
                price_hr=price_hr(obtained, entry.spot, zone or instance.zone or None),
                spot=entry.spot,
                stage=entry.assigned_stage,
                zone=zone or instance.zone or None,
                **extra,
            )
        )
        self.journal.record(J.InstanceReady(t=now, id=instance.id, startup_s=now - entry.requested_at))
        return Arrival(entry, requested, now - entry.requested_at, moved)

    @staticmethod
    def _failover(entry: PoolInstance, ident: str, requested: InstanceType, got: Got) -> J.Failover:
        """The ``failover`` decision of an instance obtained as another type or market than requested."""
        obtained, zone, attempts, spot = got.itype, got.zone, got.attempts, got.spot
        moved = spot != entry.spot
        planned = moved and entry.on_demand_type is not None and obtained.key == entry.on_demand_type.key
        substituted = obtained.key != requested.key and not planned
        why = f"{requested.name} unavailable in every zone; failover took {obtained.name}" if substituted else ""
        markets: dict[str, Any] = {}
        if moved:
            markets = dict(requested_market="spot", obtained_market="on_demand")
            why = (why + "; " if why else "") + "no spot capacity in any zone: on-demand"
            why += f" on the plan's fall-back type {obtained.name}" if planned else ""
        return J.Failover(
            id=ident,
            stage=entry.assigned_stage,
            requested=requested.name,
            obtained=obtained.name,
            requested_key=requested.key,
            obtained_key=obtained.key,
            substituted=substituted,
            zone=zone,
            requested_price_hr=price_hr(requested, entry.spot),
            obtained_price_hr=price_hr(obtained, spot, zone),
            attempts=attempts,
            reason=why,
            **markets,
        )

    def _obtained(self, entry: PoolInstance, instance: Any) -> Got:
        """The catalog type (and zone, failover tries and market) the backend actually got for a request."""
        got = self.backend.obtained(instance.id)
        if got is not None:
            tries = [
                f"{a.instance_type}@{a.zone or a.region}{' ' + a.market if a.market else ''}: {a.outcome}"
                for a in got.attempts
            ]
            return Got(got.instance_type, got.zone, tries, bool(getattr(got, "spot", entry.spot)))
        if instance.instance_type and instance.instance_type != entry.itype.name:
            try:
                itype = self.catalog.find(instance.instance_type, cloud=entry.itype.cloud, region=entry.itype.region)
                return Got(itype, instance.zone, [], entry.spot)
            except CatalogError:
                pass
        return Got(entry.itype, None, [], entry.spot)

    def terminate(self, entry: PoolInstance, why: str) -> None:
        """Terminate a released instance off the loop's thread; journaled by :meth:`collect_terminations`."""
        if entry.id is None:
            raise ValueError(f"instance request {entry.token} has no instance to terminate yet")
        future = self.terminator.submit(self.terminate_now, entry.id)
        self.terminations.append((entry, entry.id, future, why))

    def terminate_now(self, instance_id: str) -> float:
        """Terminate one instance (blocking); when it was done."""
        self.backend.terminate([instance_id])
        return self.clock.time()

    def collect_terminations(self, wait: bool = False) -> None:
        """Journal the terminations that are done (all of them with ``wait``)."""
        left = []
        for entry, ident, future, why in self.terminations:
            if wait or future.done():
                try:
                    t = future.result(timeout=60)
                except Exception:  # noqa: BLE001 - journal it anyway; teardown lists what is still alive
                    t = self.clock.time()
                self.journal.record(J.InstanceTerminated(t=t, id=ident, reason=why))
                entry.terminated_at = t
            else:
                left.append((entry, ident, future, why))
        self.terminations = left
