"""The run's Ray head on the cloud, and the watchdog that makes it clean up after itself.

Decision (docs/clouds.md, "Where the head runs"): each cloud run gets one small on-demand
CPU instance in the same region/zone and network as its workers. It runs the Ray head
(no trial work on it) and the executor; the CLI submits the run and streams progress, so
the user may close the laptop. A watchdog on the head (``python -m rubberband.cloud.head
watchdog ...``, started by the head's startup script) terminates every worker of the run
and then the head itself when

* no run was submitted ``submit_timeout_s`` after boot,
* the run's directory has not changed for ``stall_timeout_s`` (stalled executor),
* the run finished ``done_grace_s`` ago (time for the CLI to fetch results), or
* the head has lived ``max_lifetime_s`` (hard cap).

:func:`decide` is a pure function of an :class:`Observation`; :func:`self_terminate` does the
calls (on EC2 the head also leaves and deletes the run's security group and ends its own per-run role before it
powers off: :meth:`~rubberband.cloud.aws.provider.AwsProvider.reap_from_head`); :func:`watch` loops them. Workers
add their own safety net (bootstrap.py): one that
cannot reach its head for a while shuts down, and an instance-initiated shutdown terminates
an EC2 instance.
"""

from __future__ import annotations

import builtins

import dataclasses
import logging
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from rubberband import __version__
from rubberband.catalog import InstanceType
from rubberband.cloud.bootstrap import (
    POWEROFF_MARKER,
    BootstrapConfig,
    WatchdogSettings,
    client_versions,
    render_startup_script,
)
from rubberband.cloud.boot_dialect import BootDialect, ScriptBooted
from rubberband.cloud.failover import provision_with_failover
from rubberband import catalog
from rubberband.clouds import cloud as cloud_facts
from rubberband.cloud.provider import (
    TAG_ROLE,
    CleansUpRuns,
    Instance,
    InstanceRequest,
    Provider,
    ReapsFromItsHead,
)
from rubberband.errors import CloudError, InputError
from rubberband.devices import node_resources

log = logging.getLogger("rubberband.cloud.head")

DONE_MARKER = "DONE"


def head_type(cloud: str, region: str, zones: Sequence[str]) -> InstanceType:
    """The head's type placed in ``region`` (zones: where the run's workers go, first preferred)."""
    shape = catalog.head_type(cloud)
    if shape is None:
        raise InputError(f"{cloud} runs no head instance")
    return dataclasses.replace(shape, region=region, zones=tuple(zones))


def ray_version() -> str:
    return str(client_versions()["ray_version"])


def head_startup_script(
    dialect: BootDialect, region: str, run_id: str, settings: WatchdogSettings | None = None
) -> str:
    """The head's startup script: the image's own Python (its workers follow the head's minor), the client's
    Ray and pinned runtime packages, no torch (the head trains nothing)."""
    versions = client_versions()
    return render_startup_script(
        BootstrapConfig(
            run_id=run_id,
            dialect=dialect,
            role="head",
            region=region,  # type: ignore[arg-type]
            rubberband_version=__version__,
            ray_version=str(versions["ray_version"]),
            python_version=None,
            runtime_requirements=tuple(versions["requirements"]),
            use_gpu=False,
            max_lifetime_s=(settings or WatchdogSettings()).max_lifetime_s,
            watchdog=settings or WatchdogSettings(),
        )
    )


@dataclass(frozen=True)
class WorkerBoot:
    """What every worker of a run boots with, beside its head and its type.

    ``max_lifetime_s``: the cap after which the worker ends itself; ``requirements``: the spec's extra packages;
    ``token_push_key``: the head's public push key: the worker's Ray then runs with the run's token, which the
    head pushes over SSH (cloud/ray_token.py); without one (a head outside the cloud) Ray auth is disabled."""

    max_lifetime_s: float | None = None
    requirements: tuple[str, ...] = ()
    token_push_key: str | None = None


def worker_startup_script(
    dialect: BootDialect, run_id: str, head: Instance, itype: InstanceType, boot: WorkerBoot = WorkerBoot()
) -> str:
    """The startup script of a worker of ``itype`` that joins ``head``, booted as ``boot`` says.

    The worker is rendered where the executor runs (the head, in head mode; the CLI with ``--head local``):
    it needs that machine's Python minor, and the CLI's Ray, torch and pinned runtime packages
    (:func:`~rubberband.cloud.bootstrap.client_versions`)."""
    if not head.address:
        raise CloudError(
            f"{dialect.cloud}: head {head.id} has no private address yet; wait for it first", kind="transient"
        )
    node = node_resources(itype)  # one GPU (and its CPU share) per trial worker on GPU types
    versions = client_versions()
    return render_startup_script(
        BootstrapConfig(
            run_id=run_id,
            dialect=dialect,
            role="worker",
            region=itype.region,  # type: ignore[arg-type]
            rubberband_version=__version__,
            ray_version=str(versions["ray_version"]),
            python_version=str(versions["python_version"]),
            torch_version=versions["torch_version"],
            runtime_requirements=tuple(versions["requirements"]),
            head_address=head.address,
            workers=node.slots,
            use_gpu=node.num_gpus > 0,
            cpus=node.num_cpus,
            max_lifetime_s=boot.max_lifetime_s,
            requirements=tuple(boot.requirements),
            ray_auth="token" if boot.token_push_key else "disabled",
            token_push_key=boot.token_push_key,
        )
    )


@dataclass(frozen=True)
class HeadBoot:
    """How a run's head boots: the ``watchdog`` its startup script starts (whose ``max_lifetime_s`` also caps the
    instance), and how long :func:`provision_head` waits for it to run (``timeout_s``)."""

    watchdog: WatchdogSettings = WatchdogSettings()
    timeout_s: float = 600.0


class HeadProvider(Provider, ScriptBooted, Protocol):
    """A provider that can start a run's head: its instances boot from a startup script in its cloud's dialect."""


def provision_head(
    provider: HeadProvider, run_id: str, region: str, zones: Sequence[str], boot: HeadBoot = HeadBoot()
) -> Instance:
    """Start the run's head in ``region`` (``zones``: where its workers go, first preferred; zone failover as for
    workers) and wait until it runs.

    On any failure the head is terminated before the error propagates: nothing is left billing.
    """
    itype = head_type(provider.cloud, region, zones)
    request = InstanceRequest(
        run_id=run_id,
        stage=0,
        instance_type=itype,
        extra_tags={TAG_ROLE: "head"},
        startup_script=head_startup_script(provider.boot_dialect, region, run_id, boot.watchdog),
        max_lifetime_s=boot.watchdog.max_lifetime_s,
    )
    result = provision_with_failover(request, lambda t: provider)
    try:
        (head,) = provider.wait([i.id for i in result.instances], boot.timeout_s)
    except BaseException:
        provider.terminate([i.id for i in result.instances])
        raise
    return head


# -- watchdog ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Observation:
    """What the watchdog sees at one moment (POSIX seconds)."""

    now: float
    booted_at: float
    submitted: bool  # the run directory holds anything
    last_progress_at: float | None  # newest modification in the run directory
    done_at: float | None  # when the executor wrote the DONE marker


@dataclass(frozen=True)
class Decision:
    terminate: bool
    reason: str


def decide(obs: Observation, settings: WatchdogSettings) -> Decision:
    """Keep the head or end the run — a pure function of what was observed."""
    age = obs.now - obs.booted_at
    if age >= settings.max_lifetime_s:
        return Decision(True, f"the head reached its maximum lifetime of {settings.max_lifetime_s:g}s")
    if obs.done_at is not None:
        if obs.now - obs.done_at >= settings.done_grace_s:
            return Decision(True, f"the run finished {obs.now - obs.done_at:.0f}s ago")
        return Decision(False, "finished; waiting for the CLI to fetch results")
    if not obs.submitted:
        if age >= settings.submit_timeout_s:
            return Decision(True, f"no run was submitted within {settings.submit_timeout_s:g}s of boot")
        return Decision(False, "waiting for the run to be submitted")
    last = obs.last_progress_at if obs.last_progress_at is not None else obs.booted_at
    if obs.now - last >= settings.stall_timeout_s:
        return Decision(
            True, f"the run made no progress for {obs.now - last:.0f}s (stall timeout {settings.stall_timeout_s:g}s)"
        )
    return Decision(False, "running")


def observe(run_dir: Path, booted_at: float, now: float) -> Observation:
    """Read the run directory: anything in it means submitted; newest mtime is progress."""
    files = [p for p in run_dir.rglob("*") if p.is_file()] if run_dir.is_dir() else []
    marker = run_dir / DONE_MARKER
    return Observation(
        now=now,
        booted_at=booted_at,
        submitted=bool(files),
        last_progress_at=max((p.stat().st_mtime for p in files), default=None),
        done_at=marker.stat().st_mtime if marker.is_file() else None,
    )


def power_off_now() -> None:  # pragma: no cover - powers the machine off
    subprocess.run(["shutdown", "-h", "now"], check=False)


def self_terminate(
    provider: RunEnder, run_id: str, head_id: str, *, shutdown: Callable[[], None] = power_off_now
) -> list[Instance]:
    """Terminate every worker of the run, its run-level resources where possible, then the head.

    Where the provider :class:`~rubberband.cloud.provider.ReapsFromItsHead` (EC2), the head then leaves and deletes
    what only it can (the run's security group; its own per-run role's profile and policy, as its very last API
    calls) and, with its rights gone, powers off instead of terminating itself through the API.

    Every API call has a fallback: a failed listing or worker termination is logged and the head
    still ends itself (its workers then power off on their own: their node watchdog loses the head);
    if the head cannot terminate itself through the API, it shuts down (on AWS an
    instance-initiated shutdown terminates it; on GCP the node watchdog tries ``instances.delete`` once more
    with the head's own token, and a head that still only powers off stays stopped until ``down``). The
    run's workers are listed whatever their state: a stopped GCP worker is deleted too. Returns the workers
    terminated.
    """
    workers: list[Instance] = []
    try:
        workers = [i for i in provider.list(run_id) if i.id != head_id]
    except Exception as exc:  # noqa: BLE001 - any failure: the head must still end
        log.warning("could not list the instances of run %s (%s); ending the head anyway", run_id, exc)
    if workers:
        try:
            provider.terminate([w.id for w in workers])
            log.info("terminated %d workers of run %s: %s", len(workers), run_id, ", ".join(w.id for w in workers))
        except Exception as exc:  # noqa: BLE001
            log.warning(
                "could not terminate the workers of run %s (%s); they power off once the head is gone", run_id, exc
            )
            workers = []
    if isinstance(provider, ReapsFromItsHead):
        try:
            reaped = provider.reap_from_head(run_id, head_id)
        except Exception as exc:  # noqa: BLE001 - the head must still end
            log.warning("could not end the resources of run %s from its head: %s", run_id, exc)
        else:
            if reaped.deleted:
                log.info("the head deleted run %s's %s", run_id, ", ".join(reaped.deleted))
            for problem in reaped.problems:
                log.warning("run %s: %s (left to `rubberband down`)", run_id, problem)
            if reaped.powerless:  # its own rights are gone: no API call is left to it, only the power-off
                log.info("powering the head %s off (its shutdown behaviour terminates it)", head_id)
                shutdown()
                return workers
    elif isinstance(provider, CleansUpRuns) and not cloud_facts(provider.cloud).resources_after_head:
        try:
            provider.cleanup_run(run_id, 60.0)
        except Exception as exc:  # noqa: BLE001
            log.warning("could not delete run resources of %s: %s", run_id, exc)
    try:
        provider.terminate([head_id])
    except Exception as exc:  # noqa: BLE001
        log.warning("could not terminate the head %s through the API (%s); shutting down", head_id, exc)
        shutdown()
    return workers


class RunEnder(Protocol):
    """What a watchdog needs of a provider to end its run: list the run's instances, terminate them."""

    cloud: str

    def list(self, run_id: str | None = None) -> builtins.list[Instance]: ...

    def terminate(self, instance_ids: builtins.list[str]) -> None: ...


class NoApi:
    """The provider of a watchdog that could not build one (no credentials, no endpoint): every call fails, so
    :func:`self_terminate` falls back to shutting the head down."""

    def __init__(self, cloud: str, reason: str) -> None:
        self.cloud = cloud
        self.reason = reason

    def list(self, run_id: str | None = None) -> builtins.list[Instance]:
        raise CloudError(f"{self.cloud}: no API access ({self.reason})", kind="fatal")

    def terminate(self, instance_ids: builtins.list[str]) -> None:
        raise CloudError(f"{self.cloud}: no API access ({self.reason})", kind="fatal")


@dataclass(frozen=True)
class WatchedRun:
    """The run a watchdog looks after: its head (``head_id``), the provider that ends it, its run directory."""

    provider: RunEnder
    run_id: str
    head_id: str
    run_dir: Path


def watch(
    run: WatchedRun,
    settings: WatchdogSettings,
    *,
    clock: Callable[[], float] = time.time,
    sleep: Callable[[float], None] = time.sleep,
    shutdown: Callable[[], None] = power_off_now,
) -> Decision:
    """Poll until :func:`decide` says terminate, then :func:`self_terminate`; return the decision."""
    booted_at = clock()
    while True:
        decision = decide(observe(run.run_dir, booted_at, clock()), settings)
        if decision.terminate:
            log.warning("ending run %s: %s", run.run_id, decision.reason)
            self_terminate(run.provider, run.run_id, run.head_id, shutdown=shutdown)
            return decision
        sleep(poll_interval(settings))


def poll_interval(settings: WatchdogSettings) -> float:
    """How often the watchdog looks: its ``poll_s``, but at least ten times within its shortest timeout."""
    shortest = min(settings.submit_timeout_s, settings.stall_timeout_s, settings.done_grace_s)
    return max(0.05, min(settings.poll_s, shortest / 10))


def request_poweroff(run_dir: Path) -> Callable[[], None]:
    """The watchdog's power-off when it runs as a Ray job: a marker the head's boot script acts on.

    The job runs shipped code without the boot's rights or knowledge of how this machine powers
    off; the startup script (which does) watches for :data:`POWEROFF_MARKER`."""

    def shutdown() -> None:
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / POWEROFF_MARKER).write_text("the watchdog could not terminate this head through the API\n")

    return shutdown
