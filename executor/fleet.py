"""The run's instances as one executor holds them: requests, arrivals, keeps, releases, hand-overs, teardown.

:class:`Fleet` is the edge between the executor and the cloud for instances. It carries out what a scheduler
decided (request, keep, release, hand over) and journals each; on an arrival it notes failover's substitutes
and the start-up time, starts the instance's warm worker processes off the critical path and its
preemption-notice watcher. *Which* instance to request, keep or release is never decided here: that is the
scheduler's (:mod:`rubberband.executor.scheduling`) and its policies'.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rubberband.catalog import SERIAL_PROVISIONING, InstanceType
from rubberband.cloud.provider import node_resource
from rubberband.devices import DevicePolicy
from rubberband.errors import ExecutionError
from rubberband.executor import journal as J
from rubberband.executor import spot as S
from rubberband.executor.cluster import NoticeWatching
from rubberband.executor.decisions import price_hr, startup_samples
from rubberband.executor.instances import InstancePool, Order, PoolInstance
from rubberband.executor.runplan import RunPlan
from rubberband.executor.services import Services
from rubberband.planner.policies import PrefetchPolicy
from rubberband.profile import Profile


@dataclass
class Measurements:
    """What this run measured so far, for the re-planner and the estimates its decisions are fed."""

    epoch_seconds: dict[str, list[float]] = field(default_factory=dict)  # "<type>/<workers per trial>" -> seconds
    setup_seconds: list[float] = field(default_factory=list)
    iteration_latencies: dict[str, list[float]] = field(default_factory=dict)  # "<device>/<workers>/<nodes>"
    startup_seconds: dict[str, list[float]] = field(default_factory=dict)  # instance type -> request to ready


@dataclass(frozen=True)
class Waiter:
    """A request not up yet that an instance of the same type could serve instead (a hand-over)."""

    entry: PoolInstance
    order: int
    queued: bool  # not sent to the provider yet: cancelling it costs nothing


class Fleet:
    """Every instance this executor asked for (see the module docstring).

    ``devices``: the worker device of each type; ``prefetch``: the lead-time policy (a start-up quantile);
    ``profile``: start-up samples before the run measured its own.
    """

    def __init__(
        self, services: Services, runplan: RunPlan, *, devices: DevicePolicy, prefetch: PrefetchPolicy
    ) -> None:
        self.services = services
        self.runplan = runplan
        self.journal = services.journal
        self.devices = devices
        self.prefetch = prefetch
        self.profile: Profile | None = None
        self.measured = Measurements()
        serial = runplan.stages[0].cloud in SERIAL_PROVISIONING
        self.pool = InstancePool(services, serial=serial, wake=services.cluster.wake)
        self.watchers: NoticeWatching = services.cluster.watchers(services.backend.cloud, services.backend.metadata_url)
        self.workers: Any = None  # WorkerPool: warm worker processes per instance, reused across trials
        self.ran_on: set[str] = set()  # instances that have run a trial (their workers are warm)

    # -- lookups ----------------------------------------------------------------------------------
    @property
    def entries(self) -> dict[str, PoolInstance]:
        return self.pool.entries

    def entry(self, instance_id: str) -> PoolInstance | None:
        """The entry of a provisioned instance (None: not one of this run's, or not up yet)."""
        return self.pool.entry(instance_id)

    def of_stage(self, g: int) -> list[PoolInstance]:
        """The unreleased instances (up or coming) assigned to stage ``g``."""
        return self.pool.of_stage(g)

    def arrived(self) -> bool:
        """Whether a request is done that :meth:`collect` has not taken yet."""
        return any(p.future is not None and p.future.done() for p in self.entries.values())

    def alive(self) -> list[PoolInstance]:
        return [p for p in self.entries.values() if not p.released]

    def usable(self, g: int) -> list[PoolInstance]:
        """Stage ``g``'s instances that are up, whose worker processes answer and that got no preemption notice."""
        noticed = self.journal.current.choices.noticed
        return [p for p in self.of_stage(g) if p.ready and p.id not in noticed and self.workers_up(p)]

    def workers_up(self, entry: PoolInstance) -> bool:
        """Whether a ready instance's worker processes answer: only then does it take trials, as the simulator
        has it (an instance is ready after its start-up plus the worker start)."""
        if entry.warming and (self.workers is None or self.workers.started(entry.warming)):
            entry.warming = []
        return not entry.warming

    def waiting_for(self, entry: PoolInstance) -> list[Waiter]:
        """Requests not up yet of ``entry``'s type and market (what a hand-over of it could serve)."""
        out = []
        for order, p in enumerate(self.entries.values()):
            if p is entry or p.released or p.id is not None or p.future is None or p.future.done():
                continue
            if p.itype.key == entry.itype.key and p.spot == entry.spot:
                out.append(Waiter(p, order, not (p.future.running() or p.future.done())))
        return out

    def lead_s(self, itype: InstanceType) -> float:
        """The prefetch lead time for ``itype``: its start-up quantile over what this run measured, else the
        profile's samples, else the planner model's documented per-cloud defaults."""
        return self.prefetch.lead_s(startup_samples(itype, self.measured.startup_seconds, self.profile))

    # -- requests and arrivals --------------------------------------------------------------------
    def request(self, g: int, spot: bool) -> PoolInstance:
        """Request one instance for stage ``g`` on this market: the stage's type (a spot stage bought on-demand:
        its fall-back type)."""
        stage = self.runplan.stage(g)
        itype, fallback = self.runplan.request_type(stage, spot)
        allowed = spot and S.on_demand_allowed(stage)
        return self.pool.request(Order(g, itype, spot, on_demand_fallback=allowed, on_demand_type=fallback))

    def collect(self) -> list[PoolInstance]:
        """The instances that came up since the last call: journaled (with failover's substitutes), their
        start-up measured, their workers warming and their notice watcher started. One released while it was
        starting comes back ``unwanted`` (the scheduler lets it go)."""
        up = []
        for arrival in self.pool.collect():
            entry = arrival.entry
            self.runplan.learn(entry.itype)
            self.measured.startup_seconds.setdefault(entry.itype.name, []).append(arrival.startup_s)
            entry.unwanted, entry.released = entry.released, False
            assert entry.id is not None  # up: it has its id
            if not entry.unwanted and self.workers is not None:  # start its worker processes now
                device = self.devices.for_type(entry.itype)
                entry.warming = self.workers.warm(
                    node_resource(entry.id), self.workers_wanted(entry), wait=False, device=device
                )
            if not entry.unwanted:
                self.watch(entry)
            up.append(entry)
        return up

    def workers_wanted(self, entry: PoolInstance) -> int:
        """How many worker processes to start on an instance that came up: one per slot, but no more than its
        stage's trials can use at once (two one-worker trials on a 4-GPU instance warm two workers, not four;
        a wider later stage starts the rest when it places its trials)."""
        stage = self.runplan.stage(entry.assigned_stage)
        return max(1, min(entry.itype.workers, stage.trials * stage.workers_per_trial))

    def watch(self, entry: PoolInstance) -> None:
        """Start the preemption-notice watcher of a ready spot instance (when its cloud posts notices)."""
        if not entry.spot or entry.id is None or self.watchers.watching(entry.id):
            return
        error = self.watchers.watch(entry.id, node_resource(entry.id))
        if error is not None:
            self.journal.record(J.NoticeWatcherFailed(id=entry.id, started=False, error=error))

    def watch_ready(self) -> None:
        """A watcher on every ready spot instance that has none yet (Ray may show a node late)."""
        for entry in self.entries.values():
            if entry.ready and not entry.released and entry.spot:
                self.watch(entry)

    # -- keeps, releases, hand-overs ----------------------------------------------------------------
    def keep(self, entry: PoolInstance, g: int) -> None:
        entry.assigned_stage = g
        self.journal.record(J.Keep(id=entry.id or entry.token, stage=g))

    def release(self, entry: PoolInstance, why: str, stage: int) -> None:
        """Release now: terminated off the loop's thread; one still booting is released the moment it is up."""
        if entry.released:
            return
        entry.released = True
        if entry.id is None:  # not sent yet: cancelled, nothing boots; else released the moment it is up
            if entry.future is not None:
                entry.future.cancel()
            return
        self.journal.record(J.Release(id=entry.id, stage=stage, reason=why))
        self.forget(entry.id)
        self.pool.terminate(entry, why)

    def forget(self, ident: str) -> None:
        """Stop watching an instance that goes away and let its idle workers go."""
        self.watchers.unwatch(ident)
        if self.workers is not None:
            try:
                self.workers.shrink(node_resource(ident))
            except Exception:  # noqa: BLE001 - its idle workers died with it
                pass

    def hand_over(self, entry: PoolInstance, request: str, lanes: tuple[int, int]) -> None:
        """Give ``entry`` (up, released by its lane) to the waiting ``request``'s stage; the request is cancelled
        when not sent yet, else released as soon as its instance is up. ``lanes``: (from, to) brackets."""
        target = self.entries[request]
        cancelled = target.future is not None and target.future.cancel()
        target.released = True
        from_stage, entry.assigned_stage = entry.assigned_stage, target.assigned_stage
        self.journal.record(
            J.Handoff(
                id=entry.id or entry.token,
                instance_type=entry.itype.name,
                from_stage=from_stage,
                to_stage=target.assigned_stage,
                from_bracket=lanes[0],
                to_bracket=lanes[1],
                request=target.token,
                request_outcome="cancelled" if cancelled else "released when up",
            )
        )

    def collect_terminations(self, wait: bool = False) -> None:
        self.pool.collect_terminations(wait)

    def lost(self, ident: str, now: float) -> PoolInstance | None:
        """An instance the cloud took: stop billing it (terminate to be sure) and drop it; its entry, if any."""
        entry = self.entry(ident)
        if entry is not None:
            entry.terminated_at = now
            entry.released = True
        self.forget(ident)
        self.pool.terminator.submit(self.pool.terminate_now, ident)  # make sure the cloud stops billing it
        return entry

    # -- money ----------------------------------------------------------------------------------------
    def spent(self, now: float, earlier_usd: float) -> float:
        """Cost so far (cheap estimate, no billing minimums): earlier executors' bill plus this one's instances,
        plus the billed head's time since its launch."""
        total = earlier_usd
        head = self.journal.current.head
        if head is not None:
            total += head.price_hr * max(0.0, now - head.launched_at) / 3600.0
        for p in self.entries.values():
            if p.requested_at is not None:
                total += price_hr(p.itype, p.spot) * ((p.terminated_at or now) - p.requested_at) / 3600.0
        return total

    # -- teardown ---------------------------------------------------------------------------------------
    def teardown(self) -> None:
        """Terminate every instance of the run (those still booting once they are up), and the head."""
        pool, backend = self.pool, self.services.backend
        pool.provisioner.shutdown(wait=True, cancel_futures=True)
        for _ in range(len(self.entries) + 1):  # gather what came up (a failed request raises: go on)
            try:
                pool.collect()
                break
            except ExecutionError:
                continue
        pool.collect_terminations(wait=True)
        live: dict[str, PoolInstance | None] = {p.id: p for p in self.entries.values() if p.id and not p.released}
        journaled = self.journal.state.instances
        for instance in backend.list(self.services.run_id):
            live.setdefault(instance.id, None)
            if instance.id not in journaled:  # started but never journaled (failed mid-provisioning)
                journal_unrecorded(self.services, instance)
        for instance_id, entry in live.items():
            backend.terminate([instance_id])
            self.journal.record(J.InstanceTerminated(id=instance_id, reason="teardown"))
            if entry is not None:
                entry.released = True
        pool.terminator.shutdown(wait=True)
        backend.stop_head()


def stop_orphans(services: Services) -> None:
    """A resumed run: stop every node (and the head) an earlier executor of this run left running, and bill the
    instances that died without a termination record up to now."""
    backend, journal = services.backend, services.journal
    known = journal.state.instances
    for instance in backend.list(services.run_id):
        if instance.id not in known:
            journal_unrecorded(services, instance)
        backend.terminate([instance.id])
        journal.record(J.InstanceTerminated(id=instance.id, reason="orphan"))
    for life in known.values():
        if life.terminated_at is None:
            journal.record(J.InstanceTerminated(id=life.id, reason="lost"))
    if backend.stop_head():
        journal.record(J.OrphanHeadStopped())


def journal_unrecorded(services: Services, instance: Any) -> None:
    """Journal the request of an instance the provider lists but the journal never saw, so it is billed."""
    try:
        price = services.catalog.find(instance.instance_type, cloud=instance.cloud).price_hr
    except Exception:  # noqa: BLE001 - unknown type: bill nothing rather than crash cleanup
        price = 0.0
    services.journal.record(
        J.InstanceRequested(
            t=instance.launched_at or services.clock.time(),
            id=instance.id,
            instance_type=instance.instance_type,
            cloud=instance.cloud,
            price_hr=price,
            spot=False,
            stage=instance.stage,
        )
    )
