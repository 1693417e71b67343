"""Take a run's cloud resources down, and find what was left behind.

``rubberband down RUN_ID --cloud aws|gcp`` calls :func:`terminate_run`;
``rubberband down --all-orphans [--older-than 1h]`` calls :func:`find_orphans` and then
:func:`terminate_instances` (plus :func:`cleanup_leftovers` for security groups / firewall
rules, detached disks that outlived their instances). Everything is found by rubberband's exact
tags / labels (a firewall rule, which has none, by the ownership marker in its description), never by
a name pattern, and a run is called orphaned from the cloud's own record — its instances' launch times
and heartbeat (:mod:`rubberband.cloud.heartbeat`) — never from local files: a crashed CLI or a lost
journal still leaves nothing billing.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field

from rubberband.cloud.heartbeat import orphaned_runs
from rubberband.cloud.provider import CleansUpRuns, FindsLeftoverRuns, Instance, Provider
from rubberband.errors import CleanupIncomplete


@dataclass(frozen=True)
class TeardownResult:
    """What one teardown terminated and which run-level resources it deleted."""

    instances: list[Instance]
    resources: list[str] = field(default_factory=list)


def _cleanup(provider: Provider, run_id: str, timeout_s: float, echo: Callable[[str], None] | None) -> list[str]:
    """The run's run-level resources deleted, one ``echo`` line each: also those that went before a kind that could
    not be deleted stopped it (:class:`~rubberband.errors.CleanupIncomplete`, raised on after its lines)."""
    if not isinstance(provider, CleansUpRuns):
        return []
    try:
        resources = list(provider.cleanup_run(run_id, timeout_s))
    except CleanupIncomplete as exc:
        _echo_deleted(provider, run_id, exc.deleted, echo)
        raise
    _echo_deleted(provider, run_id, resources, echo)
    return resources


def _echo_deleted(provider: Provider, run_id: str, resources: list[str], echo: Callable[[str], None] | None) -> None:
    """One ``echo`` line per deleted run-level resource (none without ``echo``)."""
    if echo is None:
        return
    for resource in resources:
        echo(f"deleted {provider.cloud} {resource} (run {run_id})")


def terminate_run(
    provider: Provider, run_id: str, *, timeout_s: float = 600.0, echo: Callable[[str], None] | None = None
) -> list[Instance]:
    """Terminate every instance of ``run_id`` (head included) and delete its run-level resources.

    Returns the instances it terminated; ``echo`` (e.g. ``print``) gets one line per instance
    and per deleted resource. Idempotent: a second call finds nothing and returns ``[]``.
    """
    return terminate_run_detailed(provider, run_id, timeout_s=timeout_s, echo=echo).instances


def terminate_run_detailed(
    provider: Provider, run_id: str, *, timeout_s: float = 600.0, echo: Callable[[str], None] | None = None
) -> TeardownResult:
    instances = provider.list(run_id)
    if instances:
        provider.terminate([i.id for i in instances])
    if echo:
        for inst in instances:
            echo(
                f"terminated {provider.cloud} {inst.id} ({inst.instance_type}, {inst.zone}, run {inst.run_id}, "
                f"{inst.role})"
            )
    return TeardownResult(instances, _cleanup(provider, run_id, timeout_s, echo))


def find_orphans(
    provider: Provider, older_than_s: float, *, active_runs: Collection[str] = (), now: float | None = None
) -> list[Instance]:
    """Every instance of the runs that showed no sign of life for ``older_than_s`` (the cloud's truth).

    A run is alive while one of its instances was launched, or carries a heartbeat
    (:mod:`rubberband.cloud.heartbeat`, written by the run's executor), less than ``older_than_s``
    before ``now``. Nothing local decides; ``active_runs`` only adds runs the caller protects.
    """
    now = time.time() if now is None else now
    instances = provider.list()
    dead = orphaned_runs(instances, now=now, older_than_s=older_than_s, protected=active_runs)
    return [i for i in instances if i.run_id in dead]


def terminate_instances(
    provider: Provider,
    instances: list[Instance],
    *,
    timeout_s: float = 600.0,
    echo: Callable[[str], None] | None = None,
) -> TeardownResult:
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
            resources += _cleanup(provider, run_id, timeout_s, echo)
    return TeardownResult(list(instances), resources)


def cleanup_leftovers(
    provider: Provider,
    *,
    older_than_s: float = 0.0,
    now: float | None = None,
    timeout_s: float = 600.0,
    echo: Callable[[str], None] | None = None,
) -> list[str]:
    """Delete run-level resources (security groups, firewall rules, detached disks) of runs with no instance
    left, created at least ``older_than_s`` before ``now`` (a run being started keeps its young group)."""
    deleted: list[str] = []
    now = time.time() if now is None else now
    for run_id in (
        provider.leftover_runs(older_than_s=older_than_s, now=now) if isinstance(provider, FindsLeftoverRuns) else []
    ):
        deleted += _cleanup(provider, run_id, timeout_s, echo)
    return deleted
