"""A sleep-based workload whose speed, scaling, stragglers and metric are set by its config.

Nothing is learned: each iteration every rank sleeps, then all ranks all-reduce one small
tensor through the real DDP process group, so the runtime, the process group and the
profiler's timing are exercised exactly as for real training, while the figures are known:

* per-iteration time with ``w`` workers (fixed per-worker batch):
  ``t_iter(w) = iteration_s + sync_s · (w − 1)``, each rank's sleep multiplied by a lognormal
  straggler factor ``exp(N(0, straggler_sigma))``; the iteration ends when the slowest rank
  arrives (the all-reduce waits for it), as with real DDP;
* per epoch, every rank's sleeps are multiplied by one factor ``exp(N(0, epoch_sigma))`` drawn
  per (trial, epoch) (the same on every rank): per-epoch noise;
* per configuration, a speed factor ``exp(N(0, config_speed_sigma))`` seeded by the config itself
  (:func:`config_speed`), so a configuration is equally fast whenever and wherever it runs and
  configurations differ in speed as when width or depth are hyperparameters; with ``speed_quality_rho``
  ≠ 0 the normal is correlated with the configuration's quality (> 0: the better configurations are the
  slower ones, as bigger models are);
* iterations per epoch: ``ceil(dataset_size / (batch_size · w))``;
* metric ``score`` (maximise): ``1 − (log10(lr) − log10(best_lr))² − decay / (epoch + 1)``:
  the best trial is the one whose ``lr`` is closest to ``best_lr`` (in log space) at every
  epoch, so the winners of successive halving are known from the sampled configs.

Config keys: ``lr`` (sampled), ``best_lr``, ``iteration_s``, ``sync_s``, ``straggler_sigma``,
``epoch_sigma``, ``config_speed_sigma``, ``speed_quality_rho``, ``dataset_size``, ``batch_size``, ``decay``,
``seed``.
"""

from __future__ import annotations

import json
import math
import time
import zlib

import numpy as np
import torch
import torch.distributed as dist

DEFAULTS = {
    "best_lr": 0.01,
    "iteration_s": 0.02,
    "sync_s": 0.002,
    "straggler_sigma": 0.05,
    "epoch_sigma": 0.0,
    "config_speed_sigma": 0.0,
    "speed_quality_rho": 0.0,
    "dataset_size": 640,
    "batch_size": 32,
    "decay": 0.05,
    "seed": 0,
}


def settings(config: dict) -> dict:
    return {**DEFAULTS, **{k: v for k, v in config.items() if k in DEFAULTS or k == "lr"}}


def score(lr: float, epoch: int, best_lr: float, decay: float) -> float:
    """The metric after ``epoch`` (0-based): known optimum at ``best_lr``, slowly improving."""
    return 1.0 - (math.log10(lr) - math.log10(best_lr)) ** 2 - decay / (epoch + 1)


def iteration_seconds(workers: int, iteration_s: float, sync_s: float) -> float:
    """The noise-free per-iteration time with ``workers`` workers."""
    return iteration_s + sync_s * (workers - 1)


def config_speed(config: dict) -> float:
    """The configuration's slowdown factor (1 = as fast as the noise-free figures), stable per config."""
    cfg = settings(config)
    sigma = float(cfg["config_speed_sigma"])
    if sigma <= 0:
        return 1.0
    rho = float(cfg.pop("speed_quality_rho"))  # not in the key: a configuration's own draw is the same for any ρ
    key = zlib.crc32(json.dumps(cfg, sort_keys=True, default=str).encode())
    z = float(np.random.default_rng(key).standard_normal())
    if rho:
        z = rho * quality_z(float(cfg.get("lr", cfg["best_lr"])), float(cfg["best_lr"])) + math.sqrt(1 - rho * rho) * z
    return float(math.exp(sigma * z))


def quality_z(lr: float, best_lr: float) -> float:
    """The configuration's quality as a standard score (higher better): its distance from ``best_lr`` in decades,
    standardised for ``lr`` log-uniform over the two decades either side of ``best_lr`` (uniform on [0, 2])."""
    distance = abs(math.log10(lr) - math.log10(best_lr))
    return (1.0 - distance) / math.sqrt(1.0 / 3.0)


def epoch_factor(config: dict, trial_id: str, epoch: int) -> float:
    """The per-epoch factor of ``trial_id``'s epoch ``epoch`` (the same on every rank)."""
    cfg = settings(config)
    sigma = float(cfg["epoch_sigma"])
    if sigma <= 0:
        return 1.0
    key = zlib.crc32(f"{cfg['seed']}/{trial_id}/epoch/{epoch}".encode())
    return float(math.exp(sigma * np.random.default_rng(key).standard_normal()))


def iterations_per_epoch(workers: int, dataset_size: int, batch_size: int) -> int:
    return max(1, -(-dataset_size // (batch_size * workers)))


def train(config: dict, ctx) -> None:
    cfg = settings(config)
    lr = float(cfg.get("lr", cfg["best_lr"]))
    w = ctx.world_size
    base = iteration_seconds(w, float(cfg["iteration_s"]), float(cfg["sync_s"])) * config_speed(config)
    iters = iterations_per_epoch(w, int(cfg["dataset_size"]), int(cfg["batch_size"]))
    seed = zlib.crc32(f"{cfg['seed']}/{ctx.trial_id}/{ctx.rank}/{ctx.start_epoch}/{w}".encode())
    rng = np.random.default_rng(seed)
    state = ctx.load_checkpoint()
    done = int(state["epochs_done"]) if state else 0
    token = torch.ones(1)
    for epoch in range(ctx.start_epoch, ctx.end_epoch):
        this_epoch = base * epoch_factor(config, ctx.trial_id, epoch)
        for _ in ctx.batches(range(iters)):
            time.sleep(this_epoch * float(rng.lognormal(0.0, float(cfg["straggler_sigma"]))))
            dist.all_reduce(token)  # the synchronisation point of a DDP step
            token.fill_(1.0)
        done += 1
        ctx.report(epoch, score=score(lr, epoch, float(cfg["best_lr"]), float(cfg["decay"])), epochs_done=float(done))
        ctx.save_checkpoint({"epochs_done": done, "lr": lr})
