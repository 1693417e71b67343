"""ResNet-18 or ResNet-50 on CIFAR-10 for GPU clouds (torchvision), the HyperSched / RubberBand style workload.

Needs ``torchvision`` and the CIFAR-10 dataset under ``data_dir`` (set ``download: true`` in
the config to fetch it on first use, where the instances can reach the internet). Without
either it raises a :class:`~rubberband.errors.TrainingError` that says what is missing.

Config keys: ``arch`` (``resnet18``, the default, or ``resnet50``), ``lr``, ``momentum``, ``weight_decay``,
``batch_size`` (per worker), ``data_dir``, ``download``, ``workers`` (data-loader processes), ``seed``.
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler

from rubberband.errors import TrainingError

BATCH_SIZE = 128
ARCHES = ("resnet18", "resnet50")
MEAN, STD = (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)


def _torchvision():
    try:
        import torchvision
        from torchvision import transforms
    except ImportError:
        raise TrainingError(
            "examples/cifar_resnet.py needs torchvision: pip install torchvision "
            "(matching your torch build) on every instance"
        ) from None
    return torchvision, transforms


def datasets(data_dir: str, download: bool):
    torchvision, transforms = _torchvision()
    train_tf = transforms.Compose(
        [
            transforms.RandomCrop(32, padding=4),
            transforms.RandomHorizontalFlip(),
            transforms.ToTensor(),
            transforms.Normalize(MEAN, STD),
        ]
    )
    test_tf = transforms.Compose([transforms.ToTensor(), transforms.Normalize(MEAN, STD)])
    try:
        train_set = torchvision.datasets.CIFAR10(data_dir, train=True, transform=train_tf, download=download)
        val_set = torchvision.datasets.CIFAR10(data_dir, train=False, transform=test_tf, download=download)
    except RuntimeError as exc:  # torchvision: "Dataset not found or corrupted..."
        raise TrainingError(
            f"CIFAR-10 is not under {data_dir!r} ({' '.join(str(exc).split())}); "
            f"put it there or set config download: true"
        ) from None
    return train_set, val_set


def resnet_cifar(arch: str = "resnet18", num_classes: int = 10) -> torch.nn.Module:
    """torchvision's ResNet-18 or ResNet-50 (``arch``) with the CIFAR stem (3×3 conv, no max-pool)."""
    if arch not in ARCHES:
        raise TrainingError(f"config arch {arch!r} is not one of {', '.join(ARCHES)}; set arch to one of them")
    torchvision, _ = _torchvision()
    model = getattr(torchvision.models, arch)(num_classes=num_classes)
    model.conv1 = torch.nn.Conv2d(3, 64, 3, stride=1, padding=1, bias=False)
    model.maxpool = torch.nn.Identity()
    return model


def train(config: dict, ctx) -> None:
    torch.manual_seed(int(config.get("seed", 0)))
    net = resnet_cifar(str(config.get("arch", "resnet18")))  # before the data: a wrong arch fails at once
    data_dir = os.path.expanduser(str(config.get("data_dir", "~/data/cifar10")))
    train_set, val_set = datasets(data_dir, bool(config.get("download", False)))
    batch = int(config.get("batch_size", BATCH_SIZE))
    sampler = DistributedSampler(train_set, num_replicas=ctx.world_size, rank=ctx.rank, shuffle=True)
    loader = DataLoader(
        train_set,
        batch_size=batch,
        sampler=sampler,
        num_workers=int(config.get("workers", 4)),
        pin_memory=ctx.device.type == "cuda",
        drop_last=True,
    )
    model = DDP(net.to(ctx.device), device_ids=[ctx.device] if ctx.device.type == "cuda" else None)
    opt = torch.optim.SGD(
        model.parameters(),
        lr=float(config.get("lr", 0.1)),
        momentum=float(config.get("momentum", 0.9)),
        weight_decay=float(config.get("weight_decay", 5e-4)),
    )
    state = ctx.load_checkpoint()
    if state is not None:
        model.module.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
    for epoch in range(ctx.start_epoch, ctx.end_epoch):
        model.train()
        sampler.set_epoch(epoch)
        for x, y in ctx.batches(loader):
            x, y = x.to(ctx.device, non_blocking=True), y.to(ctx.device, non_blocking=True)
            opt.zero_grad(set_to_none=True)
            F.cross_entropy(model(x), y).backward()
            opt.step()
        ctx.report(epoch, val_acc=evaluate(model.module, val_set, ctx))
        ctx.save_checkpoint({"model": model.module.state_dict(), "opt": opt.state_dict()})


@torch.no_grad()
def evaluate(model: torch.nn.Module, val_set, ctx) -> float:
    model.eval()
    sampler = DistributedSampler(val_set, num_replicas=ctx.world_size, rank=ctx.rank, shuffle=False)
    counts = torch.zeros(2, device=ctx.device)
    for x, y in DataLoader(val_set, batch_size=512, sampler=sampler):
        pred = model(x.to(ctx.device)).argmax(1)
        counts += torch.tensor([float((pred.cpu() == y).sum()), float(len(y))], device=ctx.device)
    if ctx.world_size > 1:
        dist.all_reduce(counts)
    return float(counts[0] / counts[1])
