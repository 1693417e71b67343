"""The clouds rubberband can run on, each by its one descriptor (cloud/descriptor.py), and the one router to them.

This module sits at the top of ``cloud/``: the clouds' packages never import it (nor anything that does), so no
import cycle runs through it; the executor, the CLI, head mode and the docs ask it. Providers are built on first use
(boto3 / google-cloud-compute load then).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from rubberband.cloud import aws, gcp, local
from rubberband.cloud.descriptor import CloudDescriptor, HeadMode
from rubberband.cloud.provider import Provider
from rubberband.clouds import rented_clouds
from rubberband.errors import InputError

#: Every cloud, by name (catalogs/clouds.yaml names the same ones).
DESCRIPTORS: dict[str, CloudDescriptor] = {d.facts.name: d for d in (aws.DESCRIPTOR, gcp.DESCRIPTOR, local.DESCRIPTOR)}
#: The clouds whose runs rent instances and can run their executor on a head instance (head mode): their facts say
#: so (a head shape), and their descriptors have a head mode (tests/test_cloud_layout.py checks the two agree).
CLOUD_PROVIDERS: tuple[str, ...] = tuple(rented_clouds())


def descriptor(cloud: str) -> CloudDescriptor:
    """The descriptor of ``cloud``; an unknown one is an InputError naming the known ones."""
    try:
        return DESCRIPTORS[cloud]
    except KeyError:
        raise InputError(f"unknown cloud {cloud!r}; use one of {', '.join(DESCRIPTORS)}") from None


def head_mode(cloud: str) -> HeadMode:
    """``cloud``'s head mode; a cloud without one (local) is an InputError."""
    head = descriptor(cloud).head
    if head is None:
        raise InputError(f"--cloud {cloud!r} runs no head instance; use one of {', '.join(CLOUD_PROVIDERS)}")
    return head


def make_provider(cloud: str, region: str, **options: Any) -> Provider:
    """The provider of ``cloud`` in ``region``. Credentials come from each cloud's standard chain; endpoints from
    ``AWS_ENDPOINT_URL`` / ``RUBBERBAND_GCE_ENDPOINT`` when set (tests). The local backend is built by the
    executor (``executor/backends.py``)."""
    if cloud not in CLOUD_PROVIDERS:
        raise InputError(f"--cloud {cloud!r} is not a cloud provider; use one of {', '.join(CLOUD_PROVIDERS)}")
    return descriptor(cloud).provider(region, **options)


class ProviderPool:
    """One provider per (cloud, region), built on first use and reused (clients, security-group cache).

    ``pool(cloud, region)`` fits :func:`rubberband.cloud.dryrun.dry_run`'s ``provider_factory``;
    ``pool.for_type`` fits :func:`rubberband.cloud.failover.provision_with_failover`'s ``provider_for``.
    ``options`` maps a cloud to its constructor options, e.g. ``{"aws": {"ssh_cidr": "203.0.113.7/32"}}``.
    """

    def __init__(
        self, options: dict[str, dict[str, Any]] | None = None, factory: Callable[..., Provider] = make_provider
    ) -> None:
        self._options = options or {}
        self._factory = factory
        self._providers: dict[tuple[str, str], Provider] = {}
        # the run's launches ask from several threads: two first asks of one region must not build two providers
        # (each would keep its own security-group cache and lock); reentrant, should a factory ask the pool
        self._lock = threading.RLock()

    def __call__(self, cloud: str, region: str) -> Provider:
        key = (cloud, region)
        with self._lock:
            if key not in self._providers:
                self._providers[key] = self._factory(cloud, region, **self._options.get(cloud, {}))
            return self._providers[key]

    def for_type(self, itype: Any) -> Provider:
        return self(itype.cloud, itype.region)

    def providers(self) -> list[Provider]:
        """Every provider built so far (to tear a run down wherever it went)."""
        with self._lock:
            return list(self._providers.values())
