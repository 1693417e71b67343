"""What rubberband knows about each cloud, as data: one descriptor per cloud in one table.

Every fact that differs between clouds and is not an SDK call lives here — how a zone names its region, the
metadata server a node reads (its instance id at boot, its preemption notice while it trains), the head's
instance shape, whether spot instances exist — so that the boot script, the notice watchers, the planner's head
cost, the spot model and the backends ask one place instead of branching on ``"aws"``/``"gcp"`` each in its own
way. The SDK half of a cloud (its provider, identity set-up and checks) is reached through
:mod:`rubberband.cloud.registry`. A cloud this table does not know is an :class:`~rubberband.errors.InputError`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from rubberband.catalog import InstanceType
from rubberband.errors import InputError


@dataclass(frozen=True)
class CloudDescriptor:
    """One cloud's facts (see the module docstring)."""

    name: str
    #: the metadata server's base URL (a node's instance id at boot; ``notice_path`` below it for notices)
    metadata_url: str | None
    #: below ``metadata_url``: where the preemption-notice watchers read (None: the cloud posts no notices)
    notice_path: str | None
    #: the run's head instance shape (2 vCPUs, 8 GiB, on demand; $/h of the cheapest region); None: no head
    head_type: InstanceType | None
    #: how a zone's name extends its region's: the part this pattern matches at the end is cut off
    zone_suffix: str
    spot: bool = False  # the cloud sells preemptible capacity rubberband can plan with

    def region_of(self, zone: str) -> str:
        """The region a zone lies in (``us-east-1a`` → ``us-east-1``, ``us-central1-a`` → ``us-central1``);
        a name that is no zone (a region, an aggregate like ``us-east-1*``) comes back as it is."""
        return re.sub(self.zone_suffix, "", zone) or zone

    @property
    def notice_url(self) -> str | None:
        """The base URL the preemption-notice watchers read, ending in ``/``; None: no notices on this cloud."""
        if self.metadata_url is None or self.notice_path is None:
            return None
        return f"{self.metadata_url.rstrip('/')}/{self.notice_path}"


CLOUDS: dict[str, CloudDescriptor] = {
    "aws": CloudDescriptor(
        name="aws",
        metadata_url="http://169.254.169.254",
        notice_path="",
        head_type=InstanceType("aws", "m6i.large", "", (), "CPU", 0, 2, 8, 0.096, None, host_type="m6i.large"),
        zone_suffix=r"(?<=\d)[a-z]$",
        spot=True,
    ),
    "gcp": CloudDescriptor(
        name="gcp",
        metadata_url="http://metadata.google.internal",
        notice_path="computeMetadata/v1/",
        head_type=InstanceType(
            "gcp", "e2-standard-2", "", (), "CPU", 0, 2, 8, 0.067006, None, host_type="e2-standard-2"
        ),
        zone_suffix=r"(?<=\d)-[a-z]$",
        spot=True,
    ),
    "local": CloudDescriptor(name="local", metadata_url=None, notice_path=None, head_type=None, zone_suffix=r"$^"),
}


def cloud(name: str) -> CloudDescriptor:
    """The descriptor of the cloud ``name``; an unknown one is an InputError naming the known ones."""
    try:
        return CLOUDS[name]
    except KeyError:
        raise InputError(f"unknown cloud {name!r}; rubberband knows {', '.join(sorted(CLOUDS))}") from None


def head_types() -> dict[str, InstanceType]:
    """Each cloud's head shape (clouds that run a head instance only)."""
    return {name: d.head_type for name, d in CLOUDS.items() if d.head_type is not None}
