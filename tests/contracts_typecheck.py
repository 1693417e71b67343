"""Checked by mypy in CI (``.ci/typecheck``), never run: every backend the executor is given satisfies
:class:`~rubberband.cloud.backend.ExecutorBackend`, member by member and signature by signature."""

from __future__ import annotations

from pathlib import Path

from rubberband.cloud.backend import ExecutorBackend
from rubberband.cloud.head_run import OnHeadCloudBackend
from rubberband.cloud.local import LocalProvider
from rubberband.cloud.local_head import LocalHeadCloudBackend
from rubberband.executor.backends import make_backend


def every_backend(run_dir: Path) -> list[ExecutorBackend]:
    return [LocalProvider(run_dir), LocalHeadCloudBackend(cloud="aws", run_dir=run_dir, regions=["us-east-1"]),
            OnHeadCloudBackend(cloud="aws", run_dir=run_dir, regions=["us-east-1"]),
            make_backend("local", run_dir)]
