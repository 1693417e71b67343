"""Tune a small CNN on scikit-learn's bundled digits dataset (8×8 images, 10 classes), on CPU.

A real, small workload for the local backend: every worker trains on its own shard of the
training set (DistributedSampler-style, by rank), DDP averages the gradients, and after each
epoch every rank scores its shard of the validation set; the counts are all-reduced so
``val_acc`` is the accuracy on the whole validation set. Needs the ``examples`` extra
(scikit-learn). An epoch takes about a second on one CPU core.

Config keys (search space or ``config:`` in digits.yaml): ``lr``, ``momentum``, ``hidden``
(width of the hidden layer), ``channels`` (conv width), ``batch_size`` (per worker), ``seed``.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

#: Samples per worker per iteration unless the config says otherwise (the profile records it).
BATCH_SIZE = 32
VAL_FRACTION = 0.2


def load_data(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Digits as (N, 1, 8, 8) float tensors in [0, 1], split once with a fixed permutation."""
    try:
        from sklearn.datasets import load_digits
    except ImportError:  # pragma: no cover - depends on the installed extras
        raise ImportError("examples/digits.py needs scikit-learn: pip install 'rubberband[examples]'") from None
    digits = load_digits()
    x = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16.0
    y = torch.tensor(digits.target, dtype=torch.long)
    order = torch.randperm(len(y), generator=torch.Generator().manual_seed(seed))
    cut = int(len(y) * (1 - VAL_FRACTION))
    return x[order[:cut]], y[order[:cut]], x[order[cut:]], y[order[cut:]]


def dataset_size() -> int:
    """Training samples per epoch (what the profiler records)."""
    return len(load_data()[1])


class DigitsCNN(nn.Module):
    def __init__(self, channels: int = 32, hidden: int = 64) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, channels, 3, padding=1)
        self.conv2 = nn.Conv2d(channels, 2 * channels, 3, padding=1)
        self.fc1 = nn.Linear(2 * channels * 4 * 4, hidden)
        self.fc2 = nn.Linear(hidden, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.conv1(x))
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc2(F.relu(self.fc1(x.flatten(1))))


def shard(n: int, rank: int, world_size: int, epoch: int, seed: int) -> torch.Tensor:
    """This rank's sample indices for one epoch: one shared shuffle, every world_size-th index."""
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed * 1000 + epoch))
    return order[rank::world_size]


def train(config: dict, ctx) -> None:
    seed = int(config.get("seed", 0))
    batch = int(config.get("batch_size", BATCH_SIZE))
    torch.manual_seed(seed)
    x_train, y_train, x_val, y_val = load_data(seed)
    model = DDP(DigitsCNN(int(config.get("channels", 32)), int(config.get("hidden", 64))).to(ctx.device))
    opt = torch.optim.SGD(
        model.parameters(), lr=float(config.get("lr", 0.05)), momentum=float(config.get("momentum", 0.9))
    )
    state = ctx.load_checkpoint()
    if state is not None:
        model.module.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
    for epoch in range(ctx.start_epoch, ctx.end_epoch):
        model.train()
        idx = shard(len(y_train), ctx.rank, ctx.world_size, epoch, seed)
        steps = [idx[i : i + batch] for i in range(0, len(idx), batch)]
        for step in ctx.batches(steps):
            opt.zero_grad()
            loss = F.cross_entropy(model(x_train[step].to(ctx.device)), y_train[step].to(ctx.device))
            loss.backward()
            opt.step()
        ctx.report(epoch, val_acc=evaluate(model.module, x_val, y_val, ctx), loss=float(loss.detach()))
        ctx.save_checkpoint({"model": model.module.state_dict(), "opt": opt.state_dict()})


@torch.no_grad()
def evaluate(model: nn.Module, x: torch.Tensor, y: torch.Tensor, ctx) -> float:
    """Accuracy on the whole validation set: each rank scores its shard, counts are summed."""
    model.eval()
    mine = torch.arange(ctx.rank, len(y), ctx.world_size)
    pred = model(x[mine].to(ctx.device)).argmax(1).cpu()
    counts = torch.tensor([float((pred == y[mine]).sum()), float(len(mine))])
    if ctx.world_size > 1:
        dist.all_reduce(counts)
    return float(counts[0] / counts[1])
