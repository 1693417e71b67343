"""Take a run's cloud resources down, and find what was left behind.

``rubberband down RUN_ID --cloud aws|gcp`` calls :func:`terminate_run`;
``rubberband down --all-orphans [--older-than 1h]`` calls :func:`find_orphans` and then
:func:`terminate_instances` (plus :func:`cleanup_leftovers` for security groups / firewall
rules that outlived their instances). Everything is found by rubberband's tags / labels,
never by name, so a crashed CLI or a lost journal still leaves nothing billing.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field

from rubberband.cloud.provider import Instance, Provider


@dataclass(frozen=True)
class TeardownResult:
    """What one teardown terminated and which run-level resources it deleted."""

    instances: list[Instance]
    resources: list[str] = field(default_factory=list)


def _cleanup(provider: Provider, run_id: str, timeout_s: float) -> list[str]:
    cleanup = getattr(provider, "cleanup_run", None)
    return list(cleanup(run_id, timeout_s)) if cleanup is not None else []


def terminate_run(provider: Provider, run_id: str, *, timeout_s: float = 600.0,
                  echo: Callable[[str], None] | None = None) -> list[Instance]:
    """Terminate every instance of ``run_id`` (head included) and delete its run-level resources.

    Returns the instances it terminated; ``echo`` (e.g. ``print``) gets one line per instance
    and per deleted resource. Idempotent: a second call finds nothing and returns ``[]``.
    """
    return terminate_run_detailed(provider, run_id, timeout_s=timeout_s, echo=echo).instances


def terminate_run_detailed(provider: Provider, run_id: str, *, timeout_s: float = 600.0,
                           echo: Callable[[str], None] | None = None) -> TeardownResult:
    instances = provider.list(run_id)
    if instances:
        provider.terminate([i.id for i in instances])
    if echo:
        for inst in instances:
            echo(f"terminated {provider.cloud} {inst.id} ({inst.instance_type}, {inst.zone}, run {inst.run_id}, "
                 f"{inst.role})")
    resources = _cleanup(provider, run_id, timeout_s)
    if echo:
        for resource in resources:
            echo(f"deleted {provider.cloud} {resource} (run {run_id})")
    return TeardownResult(instances, resources)


def find_orphans(provider: Provider, older_than_s: float, *, active_runs: Collection[str] = (),
                 now: float | None = None) -> list[Instance]:
    """Rubberband instances older than ``older_than_s`` whose run is not alive.

    A run is alive when it is in ``active_runs`` (runs the local journal knows to be in
    progress) or when its head instance is still running and younger than the threshold
    (a head terminates its run itself; one older than the threshold is overdue).
    """
    now = time.time() if now is None else now
    instances = provider.list()

    def old(inst: Instance) -> bool:
        return inst.launched_at is None or now - inst.launched_at >= older_than_s

    live_heads = {i.run_id for i in instances if i.role == "head" and i.alive and not old(i)}
    alive = set(active_runs) | live_heads
    return [i for i in instances if old(i) and i.run_id not in alive]


def terminate_instances(provider: Provider, instances: list[Instance], *, timeout_s: float = 600.0,
                        echo: Callable[[str], None] | None = None) -> TeardownResult:
    """Terminate these instances; clean up each run that has nothing left afterwards."""
    if not instances:
        return TeardownResult([])
    provider.terminate([i.id for i in instances])
    if echo:
        for inst in instances:
            echo(f"terminated {provider.cloud} {inst.id} ({inst.instance_type}, {inst.zone}, run {inst.run_id})")
    resources: list[str] = []
    for run_id in sorted({i.run_id for i in instances}):
        if not [i for i in provider.list(run_id) if i.id not in {x.id for x in instances}]:
            deleted = _cleanup(provider, run_id, timeout_s)
            resources += deleted
            if echo:
                for resource in deleted:
                    echo(f"deleted {provider.cloud} {resource} (run {run_id})")
    return TeardownResult(list(instances), resources)


def cleanup_leftovers(provider: Provider, *, timeout_s: float = 600.0,
                      echo: Callable[[str], None] | None = None) -> list[str]:
    """Delete run-level resources (security groups, firewall rules) of runs with no instance left."""
    leftover = getattr(provider, "leftover_runs", None)
    deleted: list[str] = []
    for run_id in (leftover() if leftover is not None else []):
        for resource in _cleanup(provider, run_id, timeout_s):
            deleted.append(resource)
            if echo:
                echo(f"deleted {provider.cloud} {resource} (run {run_id})")
    return deleted
