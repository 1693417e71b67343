"""Build the provider for a cloud and region (lazy imports: boto3 / google-cloud-compute load on use)."""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping
from typing import Any

from rubberband.cloud.provider import Provider
from rubberband.errors import InputError

CLOUD_PROVIDERS = ("aws", "gcp")
#: Where the user names the machine image nodes boot on, per cloud (an AMI id / an image or family URL)...
IMAGE_ENV = {"aws": "RUBBERBAND_AWS_AMI", "gcp": "RUBBERBAND_GCP_IMAGE"}
#: ...and the provider option that takes it (``AwsProvider(image_id=)``, ``GcpProvider(image=)``).
IMAGE_OPTION = {"aws": "image_id", "gcp": "image"}


def image_override(cloud: str, environ: Mapping[str, str] | None = None) -> str | None:
    """The machine image the user chose for ``cloud`` in this process's environment (:data:`IMAGE_ENV`), or None.

    Read on the CLI machine only: the head's jobs run without the CLI's environment, so head mode carries the
    choice to its head on the run job's command line (``head_job run --image``)."""
    value = (os.environ if environ is None else environ).get(IMAGE_ENV.get(cloud, ""), "").strip()
    return value or None


def image_options(cloud: str, image: str | None) -> dict[str, str]:
    """``cloud``'s provider options that boot its nodes on ``image`` (none for None: the provider's default)."""
    return {IMAGE_OPTION[cloud]: image} if image and cloud in IMAGE_OPTION else {}


def make_provider(cloud: str, region: str, **options: Any) -> Provider:
    """``AwsProvider(region, **options)`` or ``GcpProvider(region, **options)``.

    Credentials come from each cloud's standard chain; endpoints from ``AWS_ENDPOINT_URL`` /
    ``RUBBERBAND_GCE_ENDPOINT`` when set (tests). The local backend is built by the executor.
    """
    if cloud == "aws":
        from rubberband.cloud.aws.provider import AwsProvider

        return AwsProvider(region, **options)
    if cloud == "gcp":
        from rubberband.cloud.gcp.provider import GcpProvider

        return GcpProvider(region, **options)
    raise InputError(f"--cloud {cloud!r} is not a cloud provider; use one of {', '.join(CLOUD_PROVIDERS)}")


class ProviderPool:
    """One provider per (cloud, region), built on first use and reused (clients, security-group cache).

    ``pool(cloud, region)`` fits :func:`rubberband.cloud.dryrun.dry_run`'s ``provider_factory``;
    ``pool.for_type`` fits :func:`rubberband.cloud.failover.provision_with_failover`'s ``provider_for``.
    ``options`` maps a cloud to its constructor options, e.g. ``{"aws": {"ssh_cidr": "203.0.113.7/32"}}``.
    """

    def __init__(self, options: dict[str, dict[str, Any]] | None = None, factory: Any = make_provider) -> None:
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
