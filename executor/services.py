"""What every part of one executor shares: the run's identity, its journal, its clock, its cluster and its cloud."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rubberband.catalog import Catalog
from rubberband.cloud.backend import ExecutorBackend
from rubberband.executor.clock import Clock
from rubberband.executor.cluster import Cluster
from rubberband.executor.journal import Journal
from rubberband.spec import JobSpec


@dataclass
class Services:
    """The run's shared edges, handed to each part of the executor instead of a long list of parameters.

    ``backend``: the cloud side (provider + head); ``cluster``: where trials run (Ray, or a simulated one);
    ``clock``: every reading of time (wall or virtual); ``journal``: the run's record, whose fold is its state.
    """

    run_id: str
    run_dir: Path
    spec: JobSpec
    catalog: Catalog
    journal: Journal
    clock: Clock
    cluster: Cluster
    backend: ExecutorBackend

    def elapsed(self) -> float:
        """Seconds since the run first started (the deadline's clock)."""
        return self.clock.time() - self.journal.current.first_started_at
