"""Tiny training functions for the trial-runtime tests (real DDP on CPU, a few iterations)."""

from __future__ import annotations

import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def _data(rank: int, world_size: int, n: int = 64):
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(n, 4, generator=gen)
    y = x @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]])
    idx = list(range(rank, n, world_size))  # DistributedSampler-style sharding
    xs, ys = x[idx], y[idx]
    return [(xs[j : j + 4], ys[j : j + 4]) for j in range(0, len(idx), 4)]


def train(config, ctx):
    torch.manual_seed(config.get("seed", 0) + ctx.rank)  # different init per rank: DDP must sync it
    model = DDP(torch.nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=config.get("lr", 0.05))
    state = ctx.load_checkpoint()
    if state is not None:
        model.module.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
    for epoch in range(ctx.start_epoch, ctx.end_epoch):
        total = 0.0
        for x, y in ctx.batches(_data(ctx.rank, ctx.world_size)):
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            total += float(loss)
            time.sleep(config.get("sleep", 0.0))
        ctx.report(epoch, loss=total, world_size=ctx.world_size, resumed=float(state is not None))
        ctx.save_checkpoint({"model": model.module.state_dict(), "opt": opt.state_dict()})
    # Every rank returns its parameters through a file so the test can compare them.
    out = config.get("params_out")
    if out:
        torch.save(model.module.state_dict(), f"{out}.rank{ctx.rank}")
    dist.barrier()


def train_raises(config, ctx):
    if ctx.rank == config.get("bad_rank", 0):
        raise ValueError("learning rate exploded")
    for _ in ctx.batches(range(1000)):
        dist.all_reduce(torch.ones(1))


def train_sleeps(config, ctx):
    for _ in ctx.batches(range(10_000)):
        time.sleep(0.05)


def train_allreduce(config, ctx):
    """Like a DDP loop: a collective every iteration, for as long as the test lets it run."""
    if config.get("pid_dir"):
        import os

        path = f"{config['pid_dir']}/rank{ctx.rank}.pid"
        with open(path + ".tmp", "w") as fh:
            fh.write(str(os.getpid()))
        os.replace(path + ".tmp", path)  # the test polls for the file: never show it half-written
    for _ in ctx.batches(range(10_000)):
        time.sleep(0.05)
        dist.all_reduce(torch.ones(1))
