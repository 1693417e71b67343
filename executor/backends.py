"""Which backend runs a plan's instances: the local Ray-node provider, or a cloud's.

A backend is a :class:`~rubberband.cloud.backend.ExecutorBackend`: a
:class:`~rubberband.cloud.provider.Provider` plus the run's Ray head (``start_head`` / ``stop_head``,
``ray_auth_mode``) and what the executor's failover, loss and spot decisions read (``check_lost``,
``obtained``, ``unavailable``, ``device_policy``, ``metadata_url``, ``runtime_env``). Every backend implements
all of it.

* a cloud without head mode (``local``): its provider (:class:`~rubberband.cloud.local.provider.LocalProvider`:
  Ray nodes on this machine) is the backend;
* a cloud with one (``aws``, ``gcp``): :class:`~rubberband.cloud.local_head.LocalHeadCloudBackend` — the Ray head
  is this machine's (the executor's machine must be inside the cloud network, reachable by the
  run's instances); workers are cloud instances in the plan's ``regions``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, cast

from rubberband.errors import InputError

if TYPE_CHECKING:
    from rubberband.cloud.backend import BackendSeams, ExecutorBackend

#: ``--cloud sim``: not a backend of its own but the plan's cloud played on virtual time (executor/simulated.py).
SIM_CLOUD = "sim"
#: The trial runtime a simulated run journals (``run_started.trial_runtime``): such a run is not resumed.
SIM_RUNTIME = "rubberband.executor.simulated"


def make_backend(
    cloud: str,
    run_dir: str | Path,
    regions: Sequence[str] = (),
    *,
    lifetime_cap_s: float | None = None,
    seams: "BackendSeams | None" = None,
) -> "ExecutorBackend":
    """The executor's backend; ``lifetime_cap_s``: how long a cloud run's workers may live at most; ``seams``
    (tests only, passed in by the caller; cloud/backend.py :class:`~rubberband.cloud.backend.BackendSeams`): a cloud
    run's instance boots played on this machine (a BootPlayer: cloud/boots.py) and the metadata server its notice watchers
    read instead of the cloud's (executor/notices.py; the local backend has no notices). None: neither."""
    from rubberband.cloud.registry import DESCRIPTORS

    if cloud not in DESCRIPTORS:
        raise InputError(
            f"cloud {cloud!r} is not supported by this executor; use --cloud {', '.join(DESCRIPTORS)} or {SIM_CLOUD}"
        )
    if DESCRIPTORS[cloud].head is None:  # its nodes are this machine's: its provider is the backend
        return cast("ExecutorBackend", DESCRIPTORS[cloud].provider("", run_dir=run_dir))
    from rubberband.cloud.backend import BackendSeams
    from rubberband.cloud.local_head import make_cloud_backend

    if not regions:
        raise InputError(f"--cloud {cloud}: the plan names no {cloud} region; re-plan for {cloud}")
    return make_cloud_backend(
        cloud, run_dir, list(regions), lifetime_cap_s=lifetime_cap_s, seams=seams or BackendSeams()
    )
