"""What varies besides stragglers: per-epoch noise and per-configuration speed (fit and sampling).

Two sources of variance that timing one configuration's iterations back to back cannot see:

* **Per-epoch noise.** One epoch's time, around its configuration's median, is lognormal with σ
  ``epoch_sigma`` (data loading, evaluation, checkpointing, a noisy neighbour for a while).
* **Per-configuration speed.** Configurations differ in speed (width, depth, batch size are
  hyperparameters): a configuration's median epoch time relative to the performance model's
  (which is the profiled reference configuration's) is lognormal with log-mean ``config_log_mean``
  and σ ``config_sigma``, fixed for the trial's life.

:func:`fit_variation` estimates both from whole-epoch times of several configurations (pure, no
I/O). With few configurations the sample σ is very uncertain (three configurations leave two
degrees of freedom), so the σ the planner uses is an upper confidence bound (chi-square, level
:data:`FIT_CONFIDENCE`) widened for the uncertainty of the log-mean: the predictive spread of a
configuration not yet seen. The point estimates are kept for inspection.

Sampling (:class:`VariationDraws`, :func:`task_factors`, :func:`schedule_tasks`) is what the
simulator calls: per trial one speed factor for its life, per task (one trial's run in one stage)
the average of its epochs' factors, and list scheduling of tasks of unequal duration. Random
numbers are common across plans: keyed by (seed, bracket) for trials and (seed, stage) for epochs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np
from scipy.special import chdtri  # chi2.ppf(q, k) = chdtri(k, 1 - q), without importing scipy.stats (~0.5 s)

#: Level of the one-sided upper confidence bounds on the fitted σs.
FIT_CONFIDENCE = 0.9
#: An upper confidence bound above this is not planned with (the slowest configuration 3× the median at
#: 2.3σ): a few samples' bound runs far above what they measured. The measured σ itself is never cut: configurations
#: that really differ more (conv width tuned 16–128 channels: σ ≈ 0.8) are planned at what was measured.
MAX_SIGMA = 0.5


@dataclass(frozen=True)
class Variation:
    """Per-epoch and per-configuration variation of epoch time, as the simulator samples it.

    ``epoch_sigma`` and ``config_sigma`` are what is planned with (upper bounds when fitted);
    ``*_fit`` are the point estimates. ``source`` says whence (measured, or not measured: 0).
    """

    epoch_sigma: float = 0.0
    config_sigma: float = 0.0
    config_log_mean: float = 0.0
    epoch_sigma_fit: float = 0.0
    config_sigma_fit: float = 0.0
    configs: int = 0
    epochs: int = 0
    source: str = "default: not measured (configurations assumed as fast as the profiled one, epochs alike)"

    @property
    def active(self) -> bool:
        return self.epoch_sigma > 0 or self.config_sigma > 0 or self.config_log_mean != 0.0

    def min_factor(self) -> float:
        """A lower bound of a task's speed factor (6σ below the median of each part)."""
        return math.exp(self.config_log_mean - 6.0 * self.config_sigma - 6.0 * self.epoch_sigma)

    def describe(self) -> dict:
        return {
            "epoch_sigma": round(self.epoch_sigma, 6),
            "epoch_sigma_fit": round(self.epoch_sigma_fit, 6),
            "config_sigma": round(self.config_sigma, 6),
            "config_sigma_fit": round(self.config_sigma_fit, 6),
            "config_log_mean": round(self.config_log_mean, 6),
            "configs": self.configs,
            "epochs": self.epochs,
            "fit_confidence": FIT_CONFIDENCE,
            "source": self.source,
        }


def _upper(variance: float, dof: int, level: float) -> float:
    """One-sided upper confidence bound of a variance estimated with ``dof`` degrees of freedom."""
    if dof <= 0:
        return variance
    return variance * dof / float(chdtri(dof, level))  # the (1 - level) quantile of χ²(dof)


def fit_variation(
    epoch_times: Sequence[Sequence[float]], predicted_s: Sequence[float], *, level: float = FIT_CONFIDENCE
) -> Variation:
    """Fit per-epoch and per-configuration variation from whole-epoch times (pure).

    ``epoch_times[c]`` are the epoch times of configuration ``c``; ``predicted_s[c]`` what the
    performance model predicts for one such epoch (its shape and iterations), the scale the
    configuration's speed is relative to. Estimates, in log space (``l = log(t / predicted)``):

    * ``epoch_sigma``: pooled within-configuration standard deviation (ddof 1 per configuration);
    * ``config_sigma``: between-configuration variance of the means minus what the epoch noise
      contributes to them (``σ_e² · mean(1/n)``), floored at 0;
    * ``config_log_mean``: the mean of the configuration means.

    Planned σs are upper confidence bounds at ``level`` (at most :data:`MAX_SIGMA`, and never below the
    estimate itself); ``config_sigma`` also adds the variance
    of the estimated log-mean (``s_b²/k``), so a new configuration is drawn from the predictive
    spread. Fewer than two configurations leave ``config_sigma`` at 0 (marked in ``source``).
    """
    groups = [np.log(np.asarray(t, dtype=float) / float(p)) for t, p in zip(epoch_times, predicted_s) if len(t)]
    if not groups:
        return Variation()
    if any(not np.all(np.isfinite(g)) for g in groups):
        raise ValueError("epoch times and predictions must be positive")
    dof_w = sum(len(g) - 1 for g in groups)
    ss_w = sum(float(np.sum((g - g.mean()) ** 2)) for g in groups)
    var_w = ss_w / dof_w if dof_w > 0 else 0.0
    means = np.array([g.mean() for g in groups])
    k = len(groups)
    inv_n = float(np.mean([1.0 / len(g) for g in groups]))
    epoch_fit = math.sqrt(var_w)
    epoch_plan = math.sqrt(_upper(var_w, dof_w, level))
    notes = [f"{k} configuration{'s' if k != 1 else ''}, {sum(len(g) for g in groups)} epochs"]
    if k >= 2:
        var_b = float(np.var(means, ddof=1))
        config_fit = math.sqrt(max(0.0, var_b - var_w * inv_n))
        config_plan = math.sqrt(max(0.0, _upper(var_b, k - 1, level) - var_w * inv_n) + var_b / k)
    else:
        config_fit = config_plan = 0.0
        notes.append("per-configuration speed not measured (one configuration): 0")
    return Variation(
        epoch_sigma=max(epoch_fit, min(MAX_SIGMA, epoch_plan)),
        config_sigma=max(config_fit, min(MAX_SIGMA, config_plan)),
        config_log_mean=float(means.mean()),
        epoch_sigma_fit=epoch_fit,
        config_sigma_fit=config_fit,
        configs=k,
        epochs=sum(len(g) for g in groups),
        source=f"measured: whole epochs of sampled configurations ({'; '.join(notes)}); planned σs "
        f"are {level:.0%} upper confidence bounds",
    )


# -- sampling ---------------------------------------------------------------------------------


class VariationDraws:
    """Common random numbers for the variation: standard normals per (bracket, trial) and per (stage, task).

    Streams are keyed apart from the simulator's straggler and start-up streams, so a model without
    variation sees exactly the draws it saw before. Columns are cached and only ever extended.
    """

    TRIAL_KEY = 1_000_003
    EPOCH_KEY = 2_000_003

    def __init__(self, seed: int, samples: int) -> None:
        self.seed = seed
        self.samples = samples
        self._cache: dict[tuple[int, int], np.ndarray] = {}

    def _normals(self, key: int, index: int, width: int) -> np.ndarray:
        have = self._cache.get((key, index))
        if have is None or have.shape[1] < width:
            gen = np.random.Generator(np.random.PCG64(np.random.SeedSequence(self.seed, spawn_key=(key, index))))
            # drawn column by column (the transpose of a row-major draw): a wider draw extends a narrower one
            have = np.ascontiguousarray(gen.standard_normal((max(width, 1), self.samples)).T)
            self._cache[(key, index)] = have
        return have[:, :width]

    def trials(self, bracket: int, width: int) -> np.ndarray:
        return self._normals(self.TRIAL_KEY, bracket, width)

    def epochs(self, stage: int, width: int) -> np.ndarray:
        return self._normals(self.EPOCH_KEY, stage, width)


def task_factors(variation: Variation, trial_z: np.ndarray, epoch_z: np.ndarray, epochs: int) -> np.ndarray:
    """Speed factor of each task: its trial's speed × the mean of its ``epochs`` epoch factors.

    ``trial_z`` / ``epoch_z``: standard normals, one per task in dispatch order. The mean of
    ``epochs`` i.i.d. lognormal(0, σ_e) factors is drawn as one lognormal with the same mean and
    variance (Fenton–Wilkinson), exact for one epoch.
    """
    log = variation.config_log_mean + variation.config_sigma * trial_z
    s2 = variation.epoch_sigma**2
    if s2 > 0:
        a2 = math.log1p(math.expm1(s2) / max(1, epochs))
        log = log + (0.5 * (s2 - a2)) + math.sqrt(a2) * epoch_z
    return np.exp(log)


def schedule_tasks(
    ready: np.ndarray, base: np.ndarray, factor: np.ndarray, overhead: float, extra: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """List scheduling of tasks of unequal duration onto slots, vectorised over samples.

    Slot ``j`` is free at ``ready[:, j]``; task ``m`` (in dispatch order) on slot ``j`` takes
    ``base[:, j] · factor[:, m] + overhead``; each task goes to the slot that frees first (ties to
    the lower index), plus ``extra[:, m]`` seconds where given (spot preemptions: lost work, restarts).
    Returns per-slot task counts, last end times (the ready time of an unused slot) and busy seconds.
    """
    S, slots = ready.shape
    trials = factor.shape[1]
    if slots == trials:
        # one task per slot when no slot finishes its task before every slot is ready; which task
        # goes to which slot does not matter then (the factors are exchangeable)
        dur = base * factor + overhead + (0.0 if extra is None else extra)
        if np.all((ready + dur).min(axis=1) > ready.max(axis=1)):
            return np.ones((S, slots), dtype=np.int64), ready + dur, dur
    free = ready.copy()
    counts = np.zeros((S, slots), dtype=np.int64)
    busy = np.zeros((S, slots))
    rows = np.arange(S)
    for m in range(trials):
        j = np.argmin(free, axis=1)
        d = base[rows, j] * factor[:, m] + overhead + (0.0 if extra is None else extra[:, m])
        free[rows, j] += d
        counts[rows, j] += 1
        busy[rows, j] += d
    return counts, free, busy
