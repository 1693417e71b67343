"""The executor's backend contract (:class:`ExecutorBackend`) and its cloud half (:class:`CloudBackend`).

The executor (branch ``executor``, ``executor/backends.py``) drives a backend that looks like a
:class:`~rubberband.cloud.provider.Provider` and also starts / stops the run's Ray head, and it
treats an instance returned by ``provision`` as ready to take trials. :class:`CloudBackend`
gives it that on AWS / GCP, with the executor running on the run's head instance
(docs/clouds.md, "Where the head runs"):

* ``start_head`` returns the head's Ray address (the head's startup script started Ray);
  ``stop_head`` is a no-op — the head's watchdog ends the machine;
* ``provision`` adds the worker startup script (joins this head) and the worker role tag, goes
  through :func:`~rubberband.cloud.failover.provision_with_failover` (zones, alternatives, blocks
  kept for the whole run), waits until the instance runs and its Ray node has joined, and
  terminates it if any of that fails. Every attempt is kept in ``attempts`` for the journal;
* ``list`` never returns the head (the executor terminates "orphans" it lists; the head is the
  machine it runs on); ``terminate`` routes each id to the provider of its region;
* for the executor's failover and loss handling: ``obtained(id)`` says which type (and zone) failover
  actually got for an instance, ``unavailable(itype)`` whether the run's failover policy has blocked
  every zone of a type, and ``check_lost(ids)`` which instances the cloud no longer runs and why
  (``spot-interruption`` when the cloud says so, else ``lost``).
"""

from __future__ import annotations

import builtins
import dataclasses
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from rubberband.catalog import InstanceType
from rubberband.cloud.bootstrap import BOOT_FAILED, RAY_PORT
from rubberband.cloud.failover import Attempt, FailoverPolicy, provision_with_failover
from rubberband.cloud.boot_dialect import BootDialect, dialect_of
from rubberband.cloud.boots import BootPlayer
from rubberband.cloud.head import WorkerBoot, worker_startup_script
from rubberband.cloud.provider import (
    TAG_ROLE,
    DescribesInstances,
    Instance,
    InstanceRequest,
    Provider,
    ReadsConsoles,
    loss_reason,
    node_resource,
)
from rubberband.clouds import cloud as cloud_descriptor
from rubberband.devices import DevicePolicy
from rubberband.errors import CloudError, Location


class TokenPush(Protocol):
    """How the run's Ray token reaches a worker (cloud/ray_token.py)."""

    @property
    def public_key(self) -> str:
        """The OpenSSH public key a worker's drop account trusts (in its user-data)."""

    def push(self, instance: Instance, timeout_s: float) -> None: ...


#: The shortest cap a worker gets, however close the run's end: time to boot and be terminated by the executor.
MIN_WORKER_LIFETIME_S = 1200.0

JoinCheck = Callable[[Instance, float], None]


@dataclass(frozen=True)
class BilledHead:
    """The run's head instance as the run pays for it (head mode: the executor runs on it).

    The executor journals it so ``result.json`` bills it under its cloud's billing rule, from
    ``launched_at`` until ``grace_s`` (the watchdog's results grace) after the run ends.
    """

    id: str
    instance_type: str
    cloud: str
    price_hr: float
    launched_at: float  # POSIX seconds, from the provider
    grace_s: float = 0.0


@dataclass(frozen=True)
class HeadHandle:
    """What the executor needs of the head: where Ray listens (and no local process id).

    ``billed``: the head instance when the run pays for it (None: the CLI machine or a local node).
    ``requested_at``: when its start began (POSIX time), where it began before the executor asked for it (a local
    head started while planning: ``LocalProvider.begin_head``); None: when the executor asked."""

    address: str
    id: str
    pid: int | None = None
    billed: BilledHead | None = None
    requested_at: float | None = None


def ray_join_check(instance: Instance, timeout_s: float) -> None:
    """Block until the instance's Ray node offers ``rb-node-<id>`` (the driver is connected)."""
    import ray

    resource = node_resource(instance.id)
    deadline = time.monotonic() + timeout_s
    while resource not in ray.cluster_resources():
        if time.monotonic() >= deadline:
            raise CloudError(
                f"{instance.cloud}: instance {instance.id} runs but its Ray node did not join the head "
                f"within {timeout_s:g}s (see /var/log/rubberband-boot.log on it)",
                kind="transient",
                code="JoinTimeout",
                where=Location(zone=instance.zone),
            )
        time.sleep(2.0)


def boot_report(provider: Provider, instance_id: str, *, lines: int = 4) -> str:
    """Why a node's boot failed, from its serial console: the startup script's failure line with the lines
    before it, else its last ``lines`` lines; "" where the provider cannot read consoles or nothing was there."""
    text = provider.console_output(instance_id) if isinstance(provider, ReadsConsoles) else ""
    rows = [row.strip() for row in (text or "").splitlines() if row.strip()]
    failed = [i for i, row in enumerate(rows) if BOOT_FAILED in row]
    if failed:
        end = failed[-1] + 1
        return " | ".join(rows[max(0, end - lines) : end])
    return " | ".join(rows[-lines:])


@dataclass(frozen=True)
class Obtained:
    """What failover actually provisioned for one instance: its catalog type and zone, and every try."""

    instance_type: InstanceType
    zone: str | None
    attempts: tuple[Attempt, ...] = ()
    spot: bool = False  # the market obtained (on-demand when a spot request fell over to it)


class ProviderSource(Protocol):
    """Where a backend gets its providers: one per (cloud, region), built on first use
    (:class:`~rubberband.cloud.registry.ProviderPool`)."""

    def __call__(self, cloud: str, region: str) -> Provider: ...

    def for_type(self, itype: Any) -> Provider: ...

    def providers(self) -> list[Provider]: ...


@dataclass(frozen=True)
class BackendSeams:
    """What tests put in place of a cloud backend's real parts; each None (the real thing) in a real run, and
    always passed in, never read from the environment.

    ``boots``: who plays the instances' boots on this machine (cloud/boots.py; the test suite's player).
    ``metadata_url``: the metadata server the instances' notice watchers read instead of the cloud's
    (executor/notices.py; ``{instance}`` in it: the instance id)."""

    boots: BootPlayer | None = None
    metadata_url: str | None = None


@runtime_checkable
class ExecutorBackend(Provider, Protocol):
    """Everything the executor asks of a backend: a :class:`Provider` plus the run's Ray head and what the
    executor's failover, loss and spot decisions read. Every backend implements every member (the local
    provider, :class:`~rubberband.cloud.local_head.LocalHeadCloudBackend`, the on-head backend): the executor
    calls them directly, never probing for what is there; a backend without a capability answers the neutral
    value (no loss seen, nothing substituted, nothing blocked, nothing shipped).
    """

    #: ``ray_auth_mode``: the Ray auth mode of the run's head, which the driver must speak: ``token`` on every
    #: real backend (``disabled`` only where there is no token to speak: the simulated cloud, a played head)
    @property
    def ray_auth_mode(self) -> str:
        """``token`` or ``disabled``."""

    @property
    def ray_auth_token_path(self) -> str | None:
        """The file holding the run's own Ray token, which the driver presents (``RAY_AUTH_TOKEN_PATH``); None:
        Ray's default (``~/.ray/auth_token`` locally; on a head instance, what its boot exported)."""

    @property
    def device_policy(self) -> DevicePolicy | None:
        """How trials use an instance type's devices; None: the executor's default (GPU types on their GPUs)."""

    @property
    def metadata_url(self) -> str | None:
        """The base URL of the metadata server its instances' preemption-notice watchers read (``{instance}`` in
        it: the instance id; executor/notices.py); None: the cloud's own. Passed in, never read from the
        environment: tests serve notices from a local endpoint. A backend without notices answers None."""

    def start_head(self, run_id: str) -> HeadHandle:
        """Start (or find) the run's Ray head; where the driver connects."""

    def stop_head(self) -> bool:
        """Stop the run's head if this backend started it here; True when a running head was stopped."""

    def check_lost(self, instance_ids: list[str]) -> dict[str, str]:
        """Which of these instances are gone: id → ``spot-interruption`` | ``lost``."""

    def obtained(self, instance_id: str) -> Obtained | None:
        """The catalog type, zone and market failover actually got for an instance (None: as requested)."""

    def unavailable(self, itype: InstanceType, spot: bool = False) -> bool:
        """True when failover has blocked every zone of ``itype`` in that market for this run."""

    def runtime_env(self, code_dir: str) -> dict | None:
        """The Ray runtime_env the driver's job ships to the workers (None: they share this machine's files)."""


@dataclass
class CloudBackend:
    """Provider + head handling for one cloud run, as the executor expects of a backend."""

    pool: ProviderSource
    head: Instance
    alternatives: Callable[[InstanceType], Sequence[InstanceType]] = lambda itype: ()
    policy: FailoverPolicy = field(default_factory=FailoverPolicy)
    boot_timeout_s: float = 900.0
    join_timeout_s: float = 600.0
    join_check: JoinCheck = ray_join_check
    max_lifetime_s: float | None = None
    requirements: tuple[str, ...] = ()  # the spec's own packages, installed by each worker's boot
    #: POSIX time by which every worker of the run must be gone (the run's start + :func:`lifetime_cap_s`):
    #: each worker's cap (``shutdown +N``, GCP ``maxRunDuration``) is what is left of it when it is requested
    expires_at: float | None = None
    clock: Callable[[], float] = time.time
    #: the run's Ray token for each worker (cloud/ray_token.py: ``SshTokenPush`` on a head instance); None: the
    #: head is outside the cloud (``--head local``) and workers run Ray without authentication
    token_push: TokenPush | None = None
    attempts: list[Attempt] = field(default_factory=list)
    _where: dict[str, Provider] = field(default_factory=dict, init=False, repr=False)
    _obtained: dict[str, Obtained] = field(default_factory=dict, init=False, repr=False)

    @property
    def cloud(self) -> str:
        return self.head.cloud

    # -- head --------------------------------------------------------------------------------

    def start_head(self, run_id: str) -> HeadHandle:
        if run_id != self.head.run_id:
            raise CloudError(f"this head belongs to run {self.head.run_id}, not {run_id}", kind="fatal")
        return HeadHandle(address=f"{self.head.address}:{RAY_PORT}", id=self.head.id)

    def stop_head(self) -> bool:
        return False  # the head's watchdog terminates the machine once the run is over

    # -- Provider ----------------------------------------------------------------------------

    def worker_lifetime_s(self) -> float | None:
        """A worker's hard lifetime cap if requested now: ``max_lifetime_s`` and what is left until ``expires_at``
        (at least :data:`MIN_WORKER_LIFETIME_S`, so that a late request still boots)."""
        caps = [
            c
            for c in (
                self.max_lifetime_s,
                None if self.expires_at is None else max(MIN_WORKER_LIFETIME_S, self.expires_at - self.clock()),
            )
            if c
        ]
        return min(caps) if caps else None

    def provision(self, request: InstanceRequest) -> list[Instance]:
        cap = request.max_lifetime_s or self.worker_lifetime_s()
        worker = dataclasses.replace(request, extra_tags={**request.extra_tags, TAG_ROLE: "worker"}, max_lifetime_s=cap)

        def render(candidate: InstanceType) -> _ScriptFor:  # the script depends on the type actually tried
            boot = WorkerBoot(
                max_lifetime_s=cap,
                requirements=tuple(self.requirements),
                token_push_key=self.token_push.public_key if self.token_push is not None else None,
            )
            provider = self.pool.for_type(candidate)
            return _ScriptFor(provider, dialect_of(provider), self.head, boot)

        try:
            result = provision_with_failover(
                worker,
                render,
                alternatives=list(self.alternatives(request.instance_type)),  # on spot: those with a spot offer
                policy=self.policy,
                on_demand_fallback=request.on_demand_fallback,
            )
        except CloudError as exc:
            self.attempts.extend(getattr(exc, "attempts", []))
            raise
        self.attempts.extend(result.attempts)
        provider = self.pool.for_type(result.instance_type)
        for inst in result.instances:
            self._where[inst.id] = provider
        ids = [i.id for i in result.instances]
        try:
            running = provider.wait(ids, self.boot_timeout_s)
            for inst in running:
                if self.token_push is not None:  # its boot waits for the token before `ray start`
                    self.token_push.push(inst, self.join_timeout_s)
                self.join_check(inst, self.join_timeout_s)
        except CloudError as exc:
            why = {ident: boot_report(provider, ident) for ident in ids}  # before the console goes with the instance
            provider.terminate(ids)
            failed = {ident: text for ident, text in why.items() if BOOT_FAILED in text}
            if failed:  # the boot itself failed (e.g. a version skew): another zone or type would fail alike
                ident, text = next(iter(failed.items()))
                raise CloudError(
                    f"{self.cloud}: instance {ident} failed to boot: {text}",
                    kind="fatal",
                    code="BootFailed",
                    where=Location(zone=exc.zone),
                ) from None
            shown = next((f"{ident}: {text}" for ident, text in why.items() if text), "")
            if shown:
                raise CloudError(
                    f"{exc}; its console said: {shown}",
                    kind=exc.kind,
                    code=exc.code,
                    where=exc.where,
                    quota=exc.quota,
                ) from None
            raise
        except BaseException:
            provider.terminate(ids)
            raise
        for inst in running:
            self._obtained[inst.id] = Obtained(
                result.instance_type, result.zone, tuple(result.attempts), spot=result.spot
            )
        return running

    def obtained(self, instance_id: str) -> Obtained | None:
        """The catalog type failover got for ``instance_id`` (it may differ from the type requested)."""
        return self._obtained.get(instance_id)

    def unavailable(self, itype: InstanceType, spot: bool = False) -> bool:
        """True when this run's failover policy has blocked every zone of ``itype`` (or its region / cloud) in
        that market (spot and on-demand capacity are blocked separately)."""
        zones: list[str | None] = list(itype.zones) or [None]
        return all(self.policy.is_blocked(itype, zone, spot=spot) for zone in zones)

    def check_lost(self, instance_ids: list[str]) -> dict[str, str]:
        """Which of these instances the cloud no longer runs: id → ``spot-interruption`` or ``lost``."""
        lost: dict[str, str] = {}
        for provider, ids in self._group(instance_ids).items():
            try:
                listed = provider.describe(ids) if isinstance(provider, DescribesInstances) else provider.list()
                seen = {i.id: i for i in listed}
            except CloudError as exc:
                if not exc.code.startswith("InvalidInstanceID"):
                    raise
                seen = {}
            for ident in ids:
                inst = seen.get(ident)
                if inst is None or not inst.alive:
                    lost[ident] = loss_reason(inst)
        for ident in instance_ids:  # not found in any region: gone
            if ident not in self._where:
                lost[ident] = "lost"
        return lost

    def wait(self, instance_ids: list[str], timeout_s: float) -> list[Instance]:
        found: list[Instance] = []
        for provider, ids in self._group(instance_ids).items():
            found += provider.wait(ids, timeout_s)
        return found

    def list(self, run_id: str | None = None) -> list[Instance]:
        seen: dict[str, Instance] = {}
        for provider in self._providers():
            for inst in provider.list(run_id):
                if inst.id != self.head.id and inst.role != "head":
                    seen[inst.id] = inst
                    self._where.setdefault(inst.id, provider)
        return list(seen.values())

    def terminate(self, instance_ids: builtins.list[str]) -> None:
        ids = [i for i in instance_ids if i != self.head.id]
        for provider, group in self._group(ids).items():
            provider.terminate(group)

    # -- helpers -----------------------------------------------------------------------------

    def _providers(self) -> builtins.list[Provider]:
        """Providers built so far (build the plan's regions up front to see instances of an earlier executor)."""
        providers = self.pool.providers()
        return providers or [self.pool(self.head.cloud, cloud_descriptor(self.head.cloud).region_of(self.head.zone))]

    def _group(self, instance_ids: builtins.list[str]) -> dict[Provider, builtins.list[str]]:
        groups: dict[Provider, builtins.list[str]] = {}
        missing = [i for i in instance_ids if i not in self._where]
        if missing:
            self.list()  # learn where they are
        for ident in instance_ids:
            provider = self._where.get(ident)
            if provider is not None:
                groups.setdefault(provider, []).append(ident)
        return groups


@dataclass(frozen=True)
class _ScriptFor:
    """A provider view that re-renders the worker script for the type actually tried (failover)."""

    provider: Provider
    dialect: BootDialect
    head: Instance
    boot: WorkerBoot

    @property
    def cloud(self) -> str:
        return self.provider.cloud

    def provision(self, request: InstanceRequest) -> list[Instance]:
        script = worker_startup_script(self.dialect, request.run_id, self.head, request.instance_type, self.boot)
        return self.provider.provision(dataclasses.replace(request, startup_script=script))
