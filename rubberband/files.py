"""Writing files so that a reader never sees half of one.

Plans, profiles, spot models, results and checkpoint markers are read by other processes (and by the
user) while a run goes on; an interrupted write must leave the old file or the new one, never a torn one.
"""

from __future__ import annotations

import os
from pathlib import Path


def write_text_atomic(path: str | Path, text: str, *, make_parents: bool = False) -> Path:
    """Write ``text`` to ``path`` atomically: a temporary file beside it (unique per process), then a rename."""
    path = Path(path)
    if make_parents:
        path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        tmp.write_text(text)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path
