"""The training API: the one interface between the user's code and rubberband.

The user writes ``def train(config: dict, ctx: TrainContext) -> None``. The profiler and the
executor both call it, inside each data-parallel worker (a Ray actor), with a ready
``torch.distributed`` process group (gloo on CPU, nccl on GPU):

.. code-block:: python

    def train(config, ctx):
        model = DDP(make_model(config).to(ctx.device))          # ctx.process_group is ready
        opt = torch.optim.SGD(model.parameters(), lr=config["lr"])
        state = ctx.load_checkpoint()                             # None on a fresh trial
        if state:
            model.module.load_state_dict(state["model"]); opt.load_state_dict(state["opt"])
        for epoch in range(ctx.start_epoch, ctx.end_epoch):
            for x, y in ctx.batches(loader_for(ctx.rank, ctx.world_size)):   # timed; may stop early
                ...
            ctx.report(epoch, val_acc=evaluate(model))             # rank 0's report is recorded
            ctx.save_checkpoint({"model": model.module.state_dict(), "opt": opt.state_dict()})

Checkpoints must be independent of the number of workers (save the unwrapped module), so a
trial can resume with a different world size after a resize.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, Iterable, Iterator


class TrainContext(ABC):
    """What a worker knows and can do; implemented by the profiler's and executor's runtimes."""

    #: Stable id of the trial ("b0-t017"), the same across stages and resizes.
    trial_id: str
    #: First epoch to run (0-based), i.e. the epochs already done by earlier stages.
    start_epoch: int
    #: One past the last epoch to run in this call.
    end_epoch: int
    #: This worker's rank and the number of data-parallel workers of the trial.
    rank: int
    world_size: int
    #: Rank within the instance, and the torch device to train on (``cuda:<local_rank>`` or ``cpu``).
    local_rank: int
    device: Any
    #: The ready torch.distributed process group (``None`` only when torch.distributed is unavailable).
    process_group: Any

    @abstractmethod
    def batches(self, iterable: Iterable) -> Iterator:
        """Yield from ``iterable``, timing each iteration; stops early when profiling has enough."""

    @abstractmethod
    def report(self, epoch: int, /, **metrics: float) -> None:
        """Record metrics for a finished epoch (only rank 0's call is recorded); a metric may be named ``epoch``."""

    @abstractmethod
    def save_checkpoint(self, state: dict) -> None:
        """Persist the trial's state after an epoch (only rank 0 writes; all ranks may call)."""

    @abstractmethod
    def load_checkpoint(self) -> dict | None:
        """The latest state saved for this trial, or ``None`` for a fresh trial."""

    @property
    def is_chief(self) -> bool:
        return self.rank == 0
