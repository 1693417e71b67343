"""Which Compute Engine quota stops a launch (GCE names it in its error), so that the error names the one to raise."""

from __future__ import annotations

import re
from dataclasses import dataclass

_QUOTA_RE = re.compile(r"Quota '([A-Z0-9_]+)' exceeded")


def gcp_quota_name(message: str, metric: str | None = None) -> str | None:
    """The GCE quota named in an error (``NVIDIA_V100_GPUS``, ``GPUS_ALL_REGIONS``, ``CPUS``)."""
    if metric:
        return metric.rsplit("/", 1)[-1].upper()
    match = _QUOTA_RE.search(message or "")
    return match.group(1) if match else None


@dataclass(frozen=True)
class GcpQuotas:
    """:class:`~rubberband.cloud.failover.QuotaGuide` of Compute Engine."""

    console: str = "IAM & Admin > Quotas"

    def quota_name(self, instance_type: str, spot: bool, message: str) -> str:
        return gcp_quota_name(message) or "GPUS_ALL_REGIONS / the GPU quota of the region"


GCP_QUOTAS = GcpQuotas()
