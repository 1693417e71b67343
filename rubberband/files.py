"""Writing files so that a reader never sees half of one.

Plans, profiles, spot models, results and checkpoint markers are read by other processes (and by the
user) while a run goes on; an interrupted write must leave the old file or the new one, never a torn one.
"""

from __future__ import annotations

import os
from pathlib import Path

from rubberband.errors import InputError


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


def check_writable(flag: str, path: str | Path, *, new_folder: bool = False) -> None:
    """Refuse an output path before any work is done (InputError naming ``flag``), so that a bad second output never
    leaves the first written: its nearest existing folder must be a folder that may be written (the missing ones
    below it are created), and the path must not be a folder (a file to write) or must not exist at all
    (``new_folder``: a folder this command creates)."""
    path = Path(path)
    if new_folder and path.exists():
        raise InputError(f"{flag} {path} already exists; remove it or choose another folder")
    if not new_folder and path.is_dir():
        raise InputError(f"{flag} {path} is a folder; give a file name")
    base = path.parent
    while not base.exists() and base != base.parent:
        base = base.parent
    if not base.is_dir():
        raise InputError(f"{flag} {path}: {base} is a file, not a folder; choose another path")
    if not os.access(base, os.W_OK | os.X_OK):
        raise InputError(f"{flag} {path}: {base} is not writable; choose a folder you may write to")
