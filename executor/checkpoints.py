"""Trial checkpoints on disk: ``<dir>/epoch-<k>.pt`` written atomically, plus a ``latest`` pointer.

Only rank 0 writes. A checkpoint holds the user's state dict (which must not depend on the
number of workers) wrapped with the epoch it was taken after, so a trial can resume at any
world size. Older checkpoints are pruned, keeping the newest ``keep``.

The file is ``torch.save``'s when the worker uses torch (the state may hold tensors), else a plain pickle (a
scikit-learn or XGBoost model: the trial never imports torch); loading tells them apart by their content.
"""

from __future__ import annotations

import os
import pickle
import re
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from rubberband.files import write_text_atomic

LATEST = "latest"
CHECKPOINT_FORMAT = 1
_NAME = re.compile(r"^epoch-(\d+)\.pt$")


def due(epoch: int, end_epoch: int, every: int) -> bool:
    """Whether the checkpoint after ``epoch`` (0-based, cumulative) is written when the plan checkpoints every
    ``every`` epochs: after each ``every``-th epoch, and always after the task's last (``end_epoch`` − 1), which
    the next stage resumes from."""
    return every <= 1 or (epoch + 1) % every == 0 or epoch >= end_epoch - 1


def checkpoint_path(directory: str | Path, epoch: int) -> Path:
    return Path(directory) / f"epoch-{epoch}.pt"


@dataclass(frozen=True)
class Checkpoint:
    """One loaded checkpoint: the epoch it was saved after and the user's state."""

    epoch: int
    state: dict
    path: Path


def save_checkpoint(directory: str | Path, epoch: int, state: dict, *, trial_id: str = "", keep: int = 2) -> Path:
    """Write ``state`` as the checkpoint after ``epoch``; never leaves a half-written file in place."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    path = checkpoint_path(directory, epoch)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    payload = {"rubberband_checkpoint": CHECKPOINT_FORMAT, "trial_id": trial_id, "epoch": epoch, "state": state}
    with open(tmp, "wb") as fh:
        torch = sys.modules.get("torch")  # a worker that never imported torch holds no tensors: pickle it
        if torch is not None:
            torch.save(payload, fh)
        else:
            pickle.dump(payload, fh, protocol=pickle.HIGHEST_PROTOCOL)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    write_text_atomic(directory / LATEST, f"{path.name}\n")
    _prune(directory, keep=keep, newest=epoch)
    return path


def _prune(directory: Path, *, keep: int, newest: int) -> None:
    epochs = sorted(int(m.group(1)) for p in directory.iterdir() if (m := _NAME.match(p.name)))
    kept = set(epochs[-max(keep, 1) :]) | {newest}
    for epoch in epochs:
        if epoch not in kept:
            checkpoint_path(directory, epoch).unlink(missing_ok=True)


def latest_epoch(directory: str | Path) -> int | None:
    """Epoch of the newest complete checkpoint, or ``None`` when there is none."""
    pointer = Path(directory) / LATEST
    try:
        name = pointer.read_text().strip()
    except (FileNotFoundError, NotADirectoryError):
        return None
    match = _NAME.match(name)
    if match is None or not (Path(directory) / name).exists():
        return None
    return int(match.group(1))


def load_latest(directory: str | Path) -> Checkpoint | None:
    """Load the newest checkpoint (tensors on CPU) or return ``None``."""
    epoch = latest_epoch(directory)
    if epoch is None:
        return None
    path = checkpoint_path(directory, epoch)
    payload: Any
    if zipfile.is_zipfile(path):  # torch.save's archive
        import torch

        payload = torch.load(path, map_location="cpu", weights_only=False)
    else:
        with open(path, "rb") as fh:
            payload = pickle.load(fh)  # noqa: S301 - the run's own checkpoint, written by save_checkpoint
    if not isinstance(payload, dict) or payload.get("rubberband_checkpoint") != CHECKPOINT_FORMAT:
        raise ValueError(f"{path} is not a rubberband checkpoint")
    return Checkpoint(epoch=int(payload["epoch"]), state=payload["state"], path=path)
