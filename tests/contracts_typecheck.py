"""Checked by mypy in CI (``.ci/typecheck``), never run: every backend the executor is given satisfies
:class:`~rubberband.cloud.backend.ExecutorBackend`, every real cloud's provider
:class:`~rubberband.cloud.provider.CloudProvider`, every cluster :class:`~rubberband.executor.cluster.Cluster`,
the real and the simulated side calls :class:`~rubberband.executor.cluster.SideCall` and notice watchers
:class:`~rubberband.executor.cluster.NoticeWatching`, member by member and signature by signature."""

from __future__ import annotations

from concurrent.futures import Future
from pathlib import Path

from rubberband.cloud.aws.provider import AwsProvider
from rubberband.cloud.backend import ExecutorBackend
from rubberband.cloud.gcp.provider import GcpProvider
from rubberband.cloud.head_run import OnHeadCloudBackend
from rubberband.cloud.local.provider import LocalProvider
from rubberband.cloud.local_head import LocalHeadCloudBackend
from rubberband.cloud.provider import CloudProvider, ReapsFromItsHead
from rubberband.executor.backends import make_backend
from rubberband.executor.cluster import Cluster, NoticeWatching, RayCluster, SideCall
from rubberband.executor.notices import NoticeWatchers
from rubberband.executor.simulated import SimBackend, SimCluster, SimFuture, SimNotices, SimWorld


def every_backend(run_dir: Path) -> list[ExecutorBackend]:
    return [
        LocalProvider(run_dir),
        LocalHeadCloudBackend(cloud="aws", run_dir=run_dir, regions=["us-east-1"]),
        OnHeadCloudBackend(cloud="aws", run_dir=run_dir, regions=["us-east-1"]),
        make_backend("local", run_dir),
    ]


def every_cloud_provider() -> list[CloudProvider]:
    """The real clouds' providers declare every capability beyond the four calls (``CloudProvider``)."""
    return [AwsProvider("us-east-1"), GcpProvider("us-central1")]


def every_head_reaper() -> list[ReapsFromItsHead]:
    """The providers whose heads end what only they can (issue 29: the run's security group, the head's role)."""
    return [AwsProvider("us-east-1")]


def the_simulated_backend(world: SimWorld, backend: SimBackend) -> ExecutorBackend:
    return backend


def every_cluster(world: SimWorld) -> list[Cluster]:
    return [RayCluster(), SimCluster(world)]


def every_side_call(world: SimWorld) -> list[SideCall]:
    """A provisioning call on a thread pool, and one on virtual time: one interface (``running`` included)."""
    return [Future(), SimFuture(world, (0.0, 0.0))]


def every_notice_watching(world: SimWorld) -> list[NoticeWatching]:
    return [NoticeWatchers("aws"), SimNotices(world)]
