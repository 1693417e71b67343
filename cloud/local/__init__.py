"""local: Ray nodes on this machine, priced like instances (the package's provider; its descriptor is below).

The local cloud's head is this machine's Ray head: it has no head mode, no identity and no notices, and its provider
(:class:`~rubberband.cloud.local.provider.LocalProvider`) is the executor's backend itself.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rubberband.cloud.descriptor import HeadMode
from rubberband.cloud.provider import Provider
from rubberband.clouds import CloudFacts, cloud


@dataclass(frozen=True)
class LocalCloud:
    """The local descriptor (:class:`~rubberband.cloud.descriptor.CloudDescriptor`)."""

    facts: CloudFacts = field(default_factory=lambda: cloud("local"))
    head: HeadMode | None = None
    refresh_catalog: None = None  # a local node's price is its share of this machine: it ships with rubberband

    def provider(self, region: str, **options: Any) -> Provider:
        """The run's local nodes (``run_dir``: where their records go; ``region`` is the catalog's one)."""
        from rubberband.cloud.local.provider import LocalProvider

        return LocalProvider(**options)

    def notice_reader(self, base_url: str, timeout_s: float) -> None:
        return None


DESCRIPTOR = LocalCloud()
