"""The provider interface every backend implements: provision / wait / list / terminate.

A provider turns "n instances of type T for run R, stage s" into real machines (EC2
instances, GCE VMs, or Ray nodes on this machine for the local backend), tags each with
the run id so nothing is ever left behind, and maps its cloud's error codes onto the
shared failover vocabulary of :class:`~rubberband.errors.CloudError`
(capacity, quota, transient, fatal).
"""

from __future__ import annotations

import builtins
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from rubberband.catalog import InstanceType

#: Tag / label keys put on every instance (GCP label keys allow only [a-z0-9_-]).
TAG_RUN_ID = "rubberband-run-id"
TAG_STAGE = "rubberband-stage"
TAG_VERSION = "rubberband-version"
TAG_MANAGED = "rubberband-managed"
TAG_ROLE = "rubberband-role"  # head | worker (added by the cloud providers; optional)
#: POSIX seconds (an integer) of the run's last sign of life, rewritten by the executor (cloud/heartbeat.py).
TAG_HEARTBEAT = "rubberband-heartbeat"
#: POSIX seconds (an integer) at which a run-level resource without a creation time of its own was created
#: (an EC2 security group): the orphan sweep leaves young ones to the run that is creating them.
TAG_CREATED = "rubberband-created"


@dataclass(frozen=True)
class PermissionCheck:
    """One permission probed without side effects. ``allowed`` is None when it could not be checked."""

    cloud: str
    region: str
    action: str
    allowed: bool | None
    detail: str = ""
    #: "allow": the run needs it (denied fails the dry run); "deny": least privilege — the identity must NOT be
    #: able to do it (``allowed`` True means it is broader than rubberband needs: reported, not fatal)
    expect: str = "allow"


def check_option_names(owner: str, options: Mapping[str, object], known: Collection[str]) -> None:
    """Refuse a provider option ``owner`` does not know, as a misspelt keyword argument is refused."""
    for name in options:
        if name not in known:
            raise TypeError(f"{owner}() got an unexpected keyword argument {name!r}")


def node_resource(instance_id: str) -> str:
    """The custom Ray resource an instance's node offers (one unit per trial worker it holds).

    Trial workers ask for one unit of it, which pins them to that instance; every backend's
    node (local, AWS, GCP bootstrap) is started with it.
    """
    return f"rb-node-{instance_id}"


@dataclass(frozen=True)
class InstanceRequest:
    """Ask for ``count`` instances of one type for one run and stage."""

    run_id: str
    stage: int
    instance_type: InstanceType
    count: int = 1
    spot: bool = False
    zone: str | None = None
    startup_script: str | None = None
    extra_tags: dict[str, str] = field(default_factory=dict)
    max_lifetime_s: float | None = None  # hard cap enforced by the cloud where it can (GCE maxRunDuration)
    on_demand_fallback: bool = False  # a spot request may fall over to on-demand when no zone has spot capacity
    # the type that fall-over tries first (the plan's fall-back type for the stage); None: ``instance_type``
    on_demand_type: InstanceType | None = None

    def tags(self, version: str) -> dict[str, str]:
        return {
            TAG_MANAGED: "true",
            TAG_RUN_ID: self.run_id,
            TAG_STAGE: str(self.stage),
            TAG_VERSION: version.replace(".", "-"),
            **self.extra_tags,
        }


@dataclass(frozen=True)
class Instance:
    """A provisioned instance as the provider last saw it."""

    id: str
    cloud: str
    instance_type: str
    zone: str
    state: str  # pending | running | stopping | stopped | terminated
    run_id: str
    stage: int = 0
    address: str | None = None  # private address (what Ray nodes of the run use)
    launched_at: float | None = None  # POSIX seconds, from the provider
    tags: dict[str, str] = field(default_factory=dict)
    public_address: str | None = None  # for SSH from the user's machine, when the instance has one
    #: Why the cloud says it last changed state, when it says (AWS ``StateReason.Code``, e.g.
    #: ``Server.SpotInstanceTermination``; GCP ``preempted``); empty otherwise.
    state_reason: str = ""
    #: The cloud identity the instance acts with: its IAM instance profile ARN (AWS) or service account email
    #: (GCP); empty when it has none (then it cannot call the cloud API at all).
    identity: str = ""

    @property
    def role(self) -> str:
        return self.tags.get(TAG_ROLE, "worker")

    @property
    def alive(self) -> bool:
        return self.state in ("pending", "running")


#: Cloud state reasons that mean "the cloud took a spot / preemptible instance back".
SPOT_INTERRUPTION_REASONS = frozenset(
    {
        "Server.SpotInstanceTermination",  # AWS: spot interruption (terminate behaviour)
        "Server.SpotInstanceShutdown",  # AWS: spot interruption (stop behaviour)
        "Server.SpotInstanceHibernate",  # AWS: spot interruption (hibernate behaviour)
        "preempted",  # GCP: a spot / preemptible VM was preempted
    }
)


def loss_reason(instance: Instance | None) -> str:
    """Why an instance that should be running is gone: ``spot-interruption`` when its cloud says so, else ``lost``."""
    if instance is not None and instance.state_reason in SPOT_INTERRUPTION_REASONS:
        return "spot-interruption"
    return "lost"


class Provisioner(Protocol):
    """What failover needs of a provider: one call that requests instances (a :class:`Provider` is one)."""

    def provision(self, request: InstanceRequest) -> list[Instance]:
        """Request instances; raise CloudError(kind=capacity|quota|transient|fatal) on failure."""


@runtime_checkable
class Provider(Protocol):
    """One cloud (or the local backend) behind four calls."""

    cloud: str

    def provision(self, request: InstanceRequest) -> list[Instance]:
        """Request instances; raise CloudError(kind=capacity|quota|transient|fatal) on failure."""

    def wait(self, instance_ids: list[str], timeout_s: float) -> list[Instance]:
        """Block until every instance is running (or raise CloudError); return their latest state."""

    def list(self, run_id: str | None = None) -> list[Instance]:
        """Every live rubberband-managed instance, optionally only those of one run."""

    def terminate(self, instance_ids: builtins.list[str]) -> None:
        """Terminate instances; idempotent (terminating a gone instance is not an error)."""


@runtime_checkable
class DescribesInstances(Protocol):
    """Capability: instances' current state by id (else a provider's ``list`` answers)."""

    def describe(self, instance_ids: builtins.list[str]) -> builtins.list[Instance]:
        """These instances' current state, terminated ones included while the cloud still lists them."""


@runtime_checkable
class ReadsConsoles(Protocol):
    """Capability: an instance's serial console, where a failed boot says why."""

    def console_output(self, instance_id: str, *, lines: int = 20) -> str:
        """The last ``lines`` of an instance's serial console (its boot log), secrets redacted; "" if none."""


@runtime_checkable
class ProbesPermissions(Protocol):
    """Capability: a dry run of the calls a run makes (``rubberband run --dry-run``)."""

    def check_permissions(self, request: InstanceRequest) -> builtins.list[PermissionCheck]:
        """Probe, creating nothing, whether these credentials may make the calls a run makes."""


@runtime_checkable
class CleansUpRuns(Protocol):
    """Capability: run-level resources beside the instances (security group, firewall rules, volumes, secrets)."""

    def cleanup_run(self, run_id: str, timeout_s: float = 600.0) -> builtins.list[str]:
        """Delete a run's run-level resources; what went."""


@runtime_checkable
class FindsLeftoverRuns(Protocol):
    """Capability: the runs whose run-level resources outlived their instances (``rubberband down --all``)."""

    def leftover_runs(self, *, older_than_s: float = 0.0, now: float | None = None) -> builtins.list[str]:
        """Runs whose run-level resources outlived their instances (to ``cleanup_run``)."""


@dataclass(frozen=True)
class HeadReap:
    """What a head's own end of its run (:class:`ReapsFromItsHead`) deleted, and whether the head may still call its
    cloud's API afterwards (``powerless``: it deleted its own rights, so it can only power off)."""

    deleted: builtins.list[str] = field(default_factory=builtins.list)
    powerless: bool = False
    problems: builtins.list[str] = field(default_factory=builtins.list)  # what it could not delete, and why


@runtime_checkable
class ReapsFromItsHead(Protocol):
    """Capability: the run-level resources only the run's head can end, because they can go only once the head has
    left them or once nothing else of the run is left to delete them (EC2: the run's security group, which cannot
    go while the head's own interface is in it, and the head's per-run role). The head's watchdog calls it after
    terminating the workers; a ``powerless`` head then powers off instead of terminating itself through the API."""

    def reap_from_head(self, run_id: str, head_id: str, timeout_s: float = 300.0) -> HeadReap:
        """Leave and delete the run's resources that outlive the workers, from the head ``head_id``; never raises
        for a cloud error (it says what it could not do in :attr:`HeadReap.problems`)."""


@runtime_checkable
class CloudProvider(
    Provider, DescribesInstances, ReadsConsoles, ProbesPermissions, CleansUpRuns, FindsLeftoverRuns, Protocol
):
    """A real cloud's provider: the four calls and every capability above (AWS and GCP implement them all).

    The capabilities are declared here, one protocol each, and type-checked (``tests/contracts_typecheck.py``);
    code that uses one asks ``isinstance(provider, <capability>)``, never probes for an attribute, and falls back
    where the provider lacks it (the local backend: no console, no permission probe, no run-level resources; its
    ``list`` answers for ``describe``).
    """
