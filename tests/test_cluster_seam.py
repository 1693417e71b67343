"""The executor's cluster seam (executor/cluster.py): what the real one leaves in the process after a run."""

from __future__ import annotations

import os

import pytest

from rubberband.executor.clock import VirtualClock
from rubberband.executor.cluster import Cluster, RayCluster


@pytest.mark.parametrize("before", [None, "disabled"])
def test_closing_the_ray_cluster_puts_the_processs_auth_mode_back(monkeypatch, before):
    """A run connects in token mode; once it is closed, whatever this process starts next (another run, a test's
    Ray cluster) sees the process's own setting again, not the run's (CI failed on exactly that leak)."""
    import ray

    if before is None:
        monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
    else:
        monkeypatch.setenv("RAY_AUTH_MODE", before)
    seen = {}
    monkeypatch.setattr(ray, "init", lambda **kwargs: seen.update(kwargs, mode=os.environ.get("RAY_AUTH_MODE")))
    cluster = RayCluster()
    assert isinstance(cluster, Cluster)
    cluster.connect("127.0.0.1:1", namespace="run-1", runtime_env=None, auth_mode="token")
    assert seen["mode"] == "token" and seen["namespace"] == "run-1"
    cluster.close()
    assert os.environ.get("RAY_AUTH_MODE") == before
    cluster.close()  # idempotent
    assert os.environ.get("RAY_AUTH_MODE") == before


def test_the_ray_clusters_wait_without_trials_sleeps_on_the_runs_clock():
    clock = VirtualClock(100.0)
    assert RayCluster(clock).wait([], 0.2) == [] and clock.time() == pytest.approx(100.2)
