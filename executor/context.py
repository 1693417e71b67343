"""The concrete :class:`~rubberband.training.TrainContext` a worker hands to the user's ``train``.

It times every iteration of ``ctx.batches`` (rank 0's latencies become the profile and the
executor's online introspection), stops a pass after ``max_iterations`` when profiling,
records rank 0's epoch reports, and saves / loads world-size independent checkpoints
(rank 0 writes; loading is collective: rank 0 reads and broadcasts to every rank, so only
rank 0 needs to reach the checkpoint directory).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator, Mapping

from rubberband.devices import CPU_WORKER, WorkerDevice
from rubberband.executor import checkpoints, events, notices
from rubberband.training import TrainContext


@dataclass(frozen=True)
class WorkerTask:
    """Everything one worker needs for one run of a trial."""

    trial_id: str
    config: dict
    entry_point: str
    code_dir: str
    start_epoch: int
    end_epoch: int
    rank: int
    world_size: int
    local_rank: int
    checkpoint_dir: str
    device: WorkerDevice = CPU_WORKER
    max_iterations: int | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    timeout_s: float = 600.0
    event_sink: Any = None
    checkpoint_every: int = 1


@dataclass(frozen=True)
class ReportRecord:
    """What rank 0 reported after one epoch (a plain record; the driver builds EpochReport)."""

    epoch: int
    metrics: dict[str, float]
    seconds: float
    finished_at: float


def _leading_dim(item: Any) -> int | None:
    """Batch size of one batch: the first dimension of its first tensor, if any."""
    if isinstance(item, dict):
        item = next(iter(item.values()), None)
    if isinstance(item, (tuple, list)) and item:
        item = item[0]
    shape = getattr(item, "shape", None)
    if shape is not None and len(shape) >= 1:
        return int(shape[0])
    return None


class WorkerContext(TrainContext):
    """One worker's view of its trial; created fresh for every ``TrialRun``."""

    def __init__(self, task: WorkerTask, *, device: Any, process_group: Any) -> None:
        """``task``: the worker's share of the trial; ``device``: the torch device it trains on (None: the CPU, made
        a torch device only when the training function asks for it, so a trial that does not use torch never imports
        it); ``process_group``: the trial's (None: a single worker, or outside a run)."""
        self.trial_id = task.trial_id
        self.checkpoint_every = max(1, int(task.checkpoint_every))
        self.start_epoch = task.start_epoch
        self.end_epoch = task.end_epoch
        self.rank = rank = task.rank
        self.world_size = task.world_size
        self.local_rank = task.local_rank
        self._device = device
        self.process_group = process_group
        self.checkpoint_dir = checkpoint_dir = task.checkpoint_dir
        self.max_iterations = task.max_iterations
        self._event_sink = task.event_sink
        self.iteration_latencies_s: list[float] = []
        self.reports: list[ReportRecord] = []
        self.checkpoint_epoch: int | None = checkpoints.latest_epoch(checkpoint_dir) if rank == 0 else None
        self.checkpoint_saved_s: list[float] = []
        #: len() of each iterable given to batches() (None when it has no length): iterations per pass.
        self.pass_lengths: list[int | None] = []
        #: Leading dimension of the first batch, when it is a tensor (or a tuple/list/dict of them).
        self.batch_size_seen: int | None = None
        #: Wall-clock time when the first iteration began (resize cost = this − the run's start).
        self.first_iteration_at: float | None = None
        #: (start, end) wall-clock times of every pass over ``batches``: the gaps between passes are
        #: the per-epoch time outside the timed iterations (evaluation, data loading, checkpoints).
        self.pass_times: list[tuple[float, float]] = []
        self._passes = 0
        self._last_reported: int | None = None
        self._mark = time.perf_counter()
        # the watchers of this trial's spot instances (executor.notices): asked at every checkpoint
        self._watchers = [n for n in os.environ.get(notices.WATCHERS_ENV, "").split(",") if n]
        self._watcher_cache: dict[str, Any] = {}
        #: The preemption notice of one of this trial's instances, once one was seen (None before).
        self.preemption_notice: dict | None = None

    # -- timing ----------------------------------------------------------------------------

    @property
    def device(self) -> Any:
        """The torch device to train on; a CPU worker's is made (importing torch) the first time it is asked for."""
        if self._device is None:
            import torch

            self._device = torch.device("cpu")
        return self._device

    @device.setter
    def device(self, value: Any) -> None:
        self._device = value

    def batches(self, iterable: Iterable) -> Iterator:
        """Yield items, timing each iteration (fetch + the caller's loop body)."""
        count = 0
        try:
            self.pass_lengths.append(len(iterable))  # type: ignore[arg-type]
        except TypeError:
            self.pass_lengths.append(None)
        began = time.time()
        if self.first_iteration_at is None:
            self.first_iteration_at = began
        start = time.perf_counter()
        try:
            for item in iterable:
                if self.batch_size_seen is None:
                    self.batch_size_seen = _leading_dim(item)
                yield item
                now = time.perf_counter()
                self.iteration_latencies_s.append(now - start)
                start = now
                count += 1
                if self.max_iterations is not None and count >= self.max_iterations:
                    return
        finally:
            self._passes += 1
            self.pass_times.append((began, time.time()))

    # -- metrics ---------------------------------------------------------------------------
    def report(self, epoch: int, /, **metrics: float) -> None:
        now = time.perf_counter()
        seconds, self._mark = now - self._mark, now
        self._last_reported = int(epoch)
        if self.rank != 0:
            return
        clean = {str(k): float(v) for k, v in metrics.items()}
        record = ReportRecord(epoch=int(epoch), metrics=clean, seconds=seconds, finished_at=time.time())
        self.reports.append(record)
        self._emit(
            events.Epoch(
                trial_id=self.trial_id, epoch=record.epoch, metrics=dict(clean), seconds=seconds, t=record.finished_at
            )
        )

    # -- checkpoints -----------------------------------------------------------------------
    def _checkpoint_label(self) -> int:
        if self._last_reported is not None:
            return self._last_reported
        return max(self.start_epoch + self._passes - 1, 0)

    def save_checkpoint(self, state: dict) -> None:
        """Save the trial's state after this epoch (rank 0 writes it) — when it is due: the plan may checkpoint a
        spot stage every few epochs (:func:`~rubberband.executor.checkpoints.due`), and always after the task's
        last epoch and when one of the trial's instances got a preemption notice, after which the trial stops
        here (every rank asks; the executor restarts it from this checkpoint on the replacement)."""
        notice = notices.check_watchers(self._watchers, self._watcher_cache) if self._watchers else None
        if self.rank == 0 and (
            notice is not None or checkpoints.due(self._checkpoint_label(), self.end_epoch, self.checkpoint_every)
        ):
            self._save(state)
        if notice is not None:
            self.preemption_notice = notice
            raise notices.PreemptionNotice(
                f"preemption notice ({notice.get('cloud')} {notice.get('action')}): "
                f"stopped after the checkpoint of epoch {self._checkpoint_label()}"
            )

    def _save(self, state: dict) -> None:
        epoch = self._checkpoint_label()
        began = time.perf_counter()
        path = checkpoints.save_checkpoint(self.checkpoint_dir, epoch, state, trial_id=self.trial_id)
        self.checkpoint_saved_s.append(time.perf_counter() - began)
        self.checkpoint_epoch = epoch
        self._emit(events.Checkpoint(trial_id=self.trial_id, epoch=epoch, path=str(path), t=time.time()))

    def load_checkpoint(self) -> dict | None:
        """Collective: every rank must call it; rank 0 reads the file and broadcasts the state."""
        loaded = checkpoints.load_latest(self.checkpoint_dir) if self.rank == 0 else None
        state = loaded.state if loaded is not None else None
        if self.world_size > 1 and self.process_group is not None:
            import torch.distributed as dist

            box = [state]
            dist.broadcast_object_list(box, src=0, group=self.process_group)
            state = box[0]
        return state

    # -- events ----------------------------------------------------------------------------
    def _emit(self, event: events.Epoch | events.Checkpoint) -> None:
        """Send a typed journal event (validated here, on the worker) to the run's journal sink."""
        if self._event_sink is not None:
            self._event_sink.record.remote(event)
