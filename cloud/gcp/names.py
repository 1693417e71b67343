"""What rubberband names its GCP resources for a run, and how it marks the ones that carry no labels: pure data,
below both the provider (cloud/gcp/provider.py), which makes and finds them, and the head's identity (cloud/identity.py),
whose per-run binding names them."""

from __future__ import annotations

import re

from rubberband.cloud.provider import TAG_MANAGED, TAG_RUN_ID

#: The run's firewall rules (``GcpProvider.ensure_firewall``): deny everything, allow the run's VMs to each other,
#: allow SSH to the head.
FIREWALL_KINDS = ("deny", "internal", "ssh")


def firewall_name(run_id: str, suffix: str = "internal") -> str:
    return f"rubberband-{run_id}-{suffix}"


def instance_prefix(run_id: str) -> str:
    """How the names of a run's VMs (``rb-<run>-<stage>-<random>``) and of their boot disks begin."""
    return f"rb-{run_id}-"


def router_name(run_id: str) -> str:
    """The Cloud Router (with its one Cloud NAT of the same name) rubberband makes for a run's private workers."""
    return f"rubberband-{run_id}-nat"


def subnet_name(run_id: str) -> str:
    """The subnetwork a run's private workers go into, in each region it puts workers in: the run's Cloud NAT serves
    it alone (``GcpProvider.ensure_nat``)."""
    return f"rubberband-{run_id}-workers"


_MARKER_RE = re.compile(rf"\[{TAG_MANAGED}=true {TAG_RUN_ID}=([a-z0-9-]+)\]$")


def owner_marker(run_id: str) -> str:
    """What ends the description of every firewall rule (or other label-less resource) rubberband creates for a
    run: Compute Engine firewall rules carry no labels, so this exact marker is their run tag."""
    return f"[{TAG_MANAGED}=true {TAG_RUN_ID}={run_id}]"


def marked_run(description: str | None) -> str | None:
    """The run a resource's description marks it as created for (:func:`owner_marker`), else None."""
    match = _MARKER_RE.search(description or "")
    return match.group(1) if match else None
