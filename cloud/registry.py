"""Build the provider for a cloud and region (lazy imports: boto3 / google-cloud-compute load on use)."""

from __future__ import annotations

from typing import Any

from rubberband.cloud.provider import Provider
from rubberband.errors import InputError

CLOUD_PROVIDERS = ("aws", "gcp")


def make_provider(cloud: str, region: str, **options: Any) -> Provider:
    """``AwsProvider(region, **options)`` or ``GcpProvider(region, **options)``.

    Credentials come from each cloud's standard chain; endpoints from ``AWS_ENDPOINT_URL`` /
    ``RUBBERBAND_GCE_ENDPOINT`` when set (tests). The local backend is built by the executor.
    """
    if cloud == "aws":
        from rubberband.cloud.aws import AwsProvider

        return AwsProvider(region, **options)
    if cloud == "gcp":
        from rubberband.cloud.gcp import GcpProvider

        return GcpProvider(region, **options)
    raise InputError(f"--cloud {cloud!r} is not a cloud provider; use one of {', '.join(CLOUD_PROVIDERS)}")
