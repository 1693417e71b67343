"""Which AWS Service Quota stops a launch, so that a quota error names the one to raise and where."""

from __future__ import annotations

from dataclasses import dataclass

# AWS Service Quotas that gate instances, by instance family letter (on-demand, spot); "" for the standard families.
_QUOTAS = {
    "p": ("Running On-Demand P instances (L-417A185B)", "All P Spot Instance Requests (L-7212CCBC)"),
    "g": ("Running On-Demand G and VT instances (L-DB2E81BA)", "All G and VT Spot Instance Requests (L-3819A6DF)"),
    "": (
        "Running On-Demand Standard (A, C, D, H, I, M, R, T, Z) instances (L-1216C47A)",
        "All Standard (A, C, D, H, I, M, R, T, Z) Spot Instance Requests (L-34B43A08)",
    ),
}


def aws_quota_name(instance_type: str, spot: bool) -> str:
    """The Service Quotas entry that limits ``instance_type`` (on-demand or spot)."""
    family = instance_type[:1].lower()
    on_demand, spot_quota = _QUOTAS.get(family if family in ("p", "g") else "", _QUOTAS[""])
    return spot_quota if spot else on_demand


@dataclass(frozen=True)
class AwsQuotas:
    """:class:`~rubberband.cloud.failover.QuotaGuide` of EC2."""

    console: str = "Service Quotas console"

    def quota_name(self, instance_type: str, spot: bool, message: str) -> str:
        return aws_quota_name(instance_type, spot)


AWS_QUOTAS = AwsQuotas()
