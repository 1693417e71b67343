"""Which backend runs a plan's instances: the local Ray-node provider, or a cloud's.

A backend is a :class:`~rubberband.cloud.provider.Provider` plus ``start_head(run_id)`` /
``stop_head()`` for the run's Ray head (and optionally ``ray_auth_mode``, the head's Ray auth
mode the driver must use; ``token`` when absent). Optional, used when present: ``check_lost(ids)``
(which instances are gone: id → ``spot-interruption`` | ``lost``), ``obtained(id)`` (the catalog type
failover actually got), ``unavailable(itype, spot)`` (every zone of a type blocked by failover, in that market) and
``device_policy`` (an :class:`~rubberband.devices.DevicePolicy`; test boots' stand-in nodes
have logical GPUs only).

* ``local``: :class:`~rubberband.cloud.local.LocalProvider` (Ray nodes on this machine).
* ``aws`` / ``gcp``: :class:`~rubberband.cloud.local_head.LocalHeadCloudBackend` — the Ray head
  is this machine's (the executor's machine must be inside the cloud network, reachable by the
  run's instances); workers are cloud instances in the plan's ``regions``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rubberband.errors import InputError

SUPPORTED = ("local", "aws", "gcp")


def make_backend(cloud: str, run_dir: str | Path, regions: Sequence[str] = (), *,
                 lifetime_cap_s: float | None = None) -> Any:
    """The executor's backend; ``lifetime_cap_s``: how long a cloud run's workers may live at most."""
    if cloud == "local":
        from rubberband.cloud.local import LocalProvider

        return LocalProvider(run_dir)
    if cloud in ("aws", "gcp"):
        from rubberband.cloud.local_head import make_cloud_backend

        if not regions:
            raise InputError(f"--cloud {cloud}: the plan names no {cloud} region; re-plan for {cloud}")
        return make_cloud_backend(cloud, run_dir, list(regions), lifetime_cap_s=lifetime_cap_s)
    raise InputError(f"cloud {cloud!r} is not supported by this executor; use --cloud "
                     f"{' or '.join(SUPPORTED)}")
