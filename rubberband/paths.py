"""Where short-lived local temp directories go (Ray's sockets need short paths).

``$RUBBERBAND_TMP_ROOT`` (default ``/tmp``) holds the Ray temp dirs of local clusters, played
heads and profiling runs. Tests point it at a directory of their own, so that what a test leaves
behind is found there and nowhere else on a shared machine.
"""

from __future__ import annotations

import os
from pathlib import Path

TMP_ROOT_ENV = "RUBBERBAND_TMP_ROOT"


def short_tmp_root() -> Path:
    """The root for short temp dirs: ``$RUBBERBAND_TMP_ROOT`` or ``/tmp`` (created if missing)."""
    root = Path(os.environ.get(TMP_ROOT_ENV) or "/tmp")
    root.mkdir(parents=True, exist_ok=True)
    return root
