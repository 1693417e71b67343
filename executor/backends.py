"""Which backend runs a plan's instances: the local Ray-node provider, or a cloud's (branch ``clouds``).

A backend is a :class:`~rubberband.cloud.provider.Provider` plus ``start_head(run_id)`` /
``stop_head()`` for the run's Ray head. ``down`` uses the same lookup to stop what a run left.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rubberband.errors import InputError

SUPPORTED = ("local",)


def make_backend(cloud: str, run_dir: str | Path) -> Any:
    if cloud == "local":
        from rubberband.cloud.local import LocalProvider

        return LocalProvider(run_dir)
    raise InputError(f"cloud {cloud!r} is not supported by this executor yet; use --cloud local "
                     f"(supported: {', '.join(SUPPORTED)})")
