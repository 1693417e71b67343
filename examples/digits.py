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
        raise ImportError("examples/digits.py needs scikit-learn: pip install 'rubberband-hpo[examples]'") from None
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


def setup(config: dict, device: str = "cpu") -> tuple[nn.Module, torch.optim.Optimizer]:
    """The configuration's model (on ``device``) and its SGD optimizer, seeded by the config's ``seed``."""
    torch.manual_seed(int(config.get("seed", 0)))
    model = DigitsCNN(int(config.get("channels", 32)), int(config.get("hidden", 64))).to(device)
    opt = torch.optim.SGD(
        model.parameters(), lr=float(config.get("lr", 0.05)), momentum=float(config.get("momentum", 0.9))
    )
    return model, opt


def epoch_steps(config: dict, n: int, epoch: int, rank: int, world_size: int) -> list[torch.Tensor]:
    """This rank's mini-batches of sample indices for one epoch over ``n`` training samples."""
    batch = int(config.get("batch_size", BATCH_SIZE))
    idx = shard(n, rank, world_size, epoch, int(config.get("seed", 0)))
    return [idx[i : i + batch] for i in range(0, len(idx), batch)]


def train_epoch(model, opt, data, steps, device="cpu") -> float:
    """One epoch: an SGD step on each of ``steps`` (this rank's mini-batches of training-set indices,
    :func:`epoch_steps`; rubberband's ``ctx.batches`` wrapping them times each); the last step's loss."""
    x_train, y_train = data[0], data[1]
    loss = torch.zeros(())
    for step in steps:
        opt.zero_grad()
        loss = F.cross_entropy(model(x_train[step].to(device)), y_train[step].to(device))
        loss.backward()
        opt.step()
    return float(loss.detach())


def train(config: dict, ctx) -> None:
    """The rubberband training function: data-parallel over the trial's workers (DDP)."""
    data = load_data(int(config.get("seed", 0)))
    module, opt = setup(config, ctx.device)
    model = DDP(module)  # the optimizer's parameters are the module's: DDP wraps, it does not copy
    state = ctx.load_checkpoint()
    if state is not None:
        module.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
    for epoch in range(ctx.start_epoch, ctx.end_epoch):
        model.train()
        steps = epoch_steps(config, len(data[1]), epoch, ctx.rank, ctx.world_size)
        loss = train_epoch(model, opt, data, ctx.batches(steps), ctx.device)
        val_acc = evaluate(module, data, ctx.rank, ctx.world_size, ctx.device)
        ctx.report(epoch, val_acc=val_acc, loss=loss)
        ctx.save_checkpoint({"model": module.state_dict(), "opt": opt.state_dict()})


def train_fn(config: dict) -> None:
    """The same training written as a Ray Tune function trainable (one process per trial): what a Ray Tune user
    has, and what ``bench/bench_vs_raytune.py --workload digits`` gives Ray Tune. Epochs up to ``max_epochs``."""
    import os
    import tempfile

    from ray import tune

    data = load_data(int(config.get("seed", 0)))
    model, opt = setup(config)
    start = 0
    checkpoint = tune.get_checkpoint()
    if checkpoint:
        with checkpoint.as_directory() as directory:
            state = torch.load(os.path.join(directory, "state.pt"))
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        start = state["epoch"] + 1
    for epoch in range(start, int(config.get("max_epochs", 9))):
        model.train()
        loss = train_epoch(model, opt, data, epoch_steps(config, len(data[1]), epoch, 0, 1))
        val_acc = evaluate(model, data, 0, 1)
        with tempfile.TemporaryDirectory() as directory:
            torch.save(
                {"model": model.state_dict(), "opt": opt.state_dict(), "epoch": epoch},
                os.path.join(directory, "state.pt"),
            )
            tune.report({"val_acc": val_acc, "loss": loss}, checkpoint=tune.Checkpoint.from_directory(directory))


@torch.no_grad()
def evaluate(model: nn.Module, data, rank: int, world_size: int, device="cpu") -> float:
    """Accuracy on the whole validation set (``data``'s last two tensors): each rank scores its shard, counts are
    summed."""
    x, y = data[2], data[3]
    model.eval()
    mine = torch.arange(rank, len(y), world_size)
    pred = model(x[mine].to(device)).argmax(1).cpu()
    counts = torch.tensor([float((pred == y[mine]).sum()), float(len(mine))])
    if world_size > 1:
        dist.all_reduce(counts)
    return float(counts[0] / counts[1])
