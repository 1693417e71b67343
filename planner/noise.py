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
:data:`FIT_CONFIDENCE`). The point estimates are kept for inspection.

**How fast the population is.** The log-mean of eight profiled configurations is known to about σ/√8 (0.2 at
σ 0.6: every configuration of a run 20 % faster or slower than planned, together). A run's configurations are
new draws from the same population, so that error does not average out over a run's 27 trials as a new
configuration's own spread does: it moves them all. The simulator draws it once per Monte Carlo sample
(``config_mean_se``, the standard error of ``config_log_mean``) and adds it to every trial of that sample, so
a prediction from few configurations is as wide as what is not known. Profiling more configurations, or
folding real runs in (``rubberband profile --from-run``), narrows it.

**Who survives.** Promotion picks by metric, so when quality goes with speed (bigger models are better and
slower) a stage's survivors are not a random sample of its trials. :func:`fit_speed_quality` fits the rank
correlation of the profiled configurations' slowness with their score (Spearman, turned into the Gaussian
correlation ``speed_quality_rho`` the simulator samples with); where the sample is too small to support it, the
planned value is a conservative (upper) bound, and ``speed_quality_source`` says which. Mid-run, the survivors
themselves are measured: :class:`KnownTrials` carries each one's measured speed (best ranked first), which the
simulator uses in place of population draws for that bracket.

Sampling (:class:`VariationDraws`, :func:`task_factors`, :func:`schedule_tasks`) is what the
simulator calls: per trial one speed factor for its life, per task (one trial's run in one stage)
the average of its epochs' factors, and list scheduling of tasks of unequal duration. Random
numbers are common across plans: keyed by (seed, bracket) for trials and (seed, stage) for epochs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist
from typing import Sequence

import numpy as np

#: Level of the one-sided upper confidence bounds on the fitted σs.
FIT_CONFIDENCE = 0.9
#: An upper confidence bound above this is not planned with (the slowest configuration 3× the median at
#: 2.3σ): a few samples' bound runs far above what they measured. The measured σ itself is never cut: configurations
#: that really differ more (conv width tuned 16–128 channels: σ ≈ 0.8) are planned at what was measured.
MAX_SIGMA = 0.5
#: Configurations with a score it takes before the fitted speed–quality rank correlation is planned with (below:
#: its upper confidence bound, 1 with three or fewer).
RHO_MIN_CONFIGS = 8


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
    #: Correlation of a trial's slowness with its quality (the Gaussian one the simulator samples; > 0: the slow
    #: configurations tend to be promoted), as planned: fitted, or a conservative bound (``speed_quality_source``).
    speed_quality_rho: float = 0.0
    #: The configurations' Spearman rank correlation of slowness and score (None: no scores to fit it from).
    speed_quality_fit: float | None = None
    speed_quality_source: str = "default: survivors a random sample (no configuration speed spread)"
    #: Whether ``speed_quality_rho`` is a conservative bound (too few scored configurations to fit it).
    speed_quality_bound: bool = False
    #: Standard error of ``config_log_mean`` (the configurations' spread over √configurations): how far the whole
    #: population's speed may be from the profiled configurations' mean; one draw per simulated run.
    config_mean_se: float = 0.0

    @property
    def active(self) -> bool:
        return self.epoch_sigma > 0 or self.config_sigma > 0 or self.config_log_mean != 0.0

    def min_factor(self) -> float:
        """A lower bound of a task's speed factor (6σ below the median of each part)."""
        return math.exp(self.config_log_mean - 6.0 * (self.config_sigma + self.config_mean_se + self.epoch_sigma))

    def describe(self) -> dict:
        return {
            "epoch_sigma": round(self.epoch_sigma, 6),
            "epoch_sigma_fit": round(self.epoch_sigma_fit, 6),
            "config_sigma": round(self.config_sigma, 6),
            "config_sigma_fit": round(self.config_sigma_fit, 6),
            "config_log_mean": round(self.config_log_mean, 6),
            "config_mean_se": round(self.config_mean_se, 6),
            "configs": self.configs,
            "epochs": self.epochs,
            "fit_confidence": FIT_CONFIDENCE,
            "source": self.source,
            "speed_quality_rho": round(self.speed_quality_rho, 6),
            "speed_quality_fit": None if self.speed_quality_fit is None else round(self.speed_quality_fit, 6),
            "speed_quality_source": self.speed_quality_source,
        }


def _upper(variance: float, dof: int, level: float) -> float:
    """One-sided upper confidence bound of a variance estimated with ``dof`` degrees of freedom."""
    if dof <= 0:
        return variance
    # chi2.ppf(q, k) = chdtri(k, 1 - q), imported here: scipy.special takes ~0.15 s, and a profile without
    # sampled configurations never needs it (scipy.stats, ~0.5 s, is not used at all)
    from scipy.special import chdtri

    return variance * dof / float(chdtri(dof, level))  # the (1 - level) quantile of χ²(dof)


def fit_variation(
    epoch_times: Sequence[Sequence[float]],
    predicted_s: Sequence[float],
    qualities: Sequence[float | None] | None = None,
    *,
    level: float = FIT_CONFIDENCE,
    groups: Sequence[str] | None = None,
) -> Variation:
    """Fit per-epoch and per-configuration variation from whole-epoch times (pure).

    ``epoch_times[c]`` are the epoch times of configuration ``c``; ``predicted_s[c]`` what the
    performance model predicts for one such epoch (its shape and iterations), the scale the
    configuration's speed is relative to. Estimates, in log space (``l = log(t / predicted)``):

    * ``epoch_sigma``: pooled within-configuration standard deviation (ddof 1 per configuration);
    * ``config_sigma``: between-configuration variance of the means minus what the epoch noise
      contributes to them (``σ_e² · mean(1/n)``), floored at 0;
    * ``config_log_mean``: the mean of the configuration means.

    ``groups`` (one label per configuration, e.g. the run that timed it) keeps scores ranked within their group
    (:func:`fit_speed_quality`).

    Planned σs are upper confidence bounds at ``level`` (at most :data:`MAX_SIGMA`, and never below the
    estimate itself). The log-mean's own uncertainty (``s_b²/k``) is ``config_mean_se``: the simulator moves all
    of a sample's configurations by one draw of it. Fewer than two configurations leave ``config_sigma`` and
    ``config_mean_se`` at 0 (marked in ``source``).
    """
    labels = [g for t, g in zip(epoch_times, groups) if len(t)] if groups is not None else None
    logs = [np.log(np.asarray(t, dtype=float) / float(p)) for t, p in zip(epoch_times, predicted_s) if len(t)]
    if not logs:
        return Variation()
    if any(not np.all(np.isfinite(g)) for g in logs):
        raise ValueError("epoch times and predictions must be positive")
    dof_w = sum(len(g) - 1 for g in logs)
    ss_w = sum(float(np.sum((g - g.mean()) ** 2)) for g in logs)
    var_w = ss_w / dof_w if dof_w > 0 else 0.0
    means = np.array([g.mean() for g in logs])
    k = len(logs)
    inv_n = float(np.mean([1.0 / len(g) for g in logs]))
    epoch_fit = math.sqrt(var_w)
    epoch_plan = math.sqrt(_upper(var_w, dof_w, level))
    notes = [f"{k} configuration{'s' if k != 1 else ''}, {sum(len(g) for g in logs)} epochs"]
    if k >= 2:
        var_b = float(np.var(means, ddof=1))
        config_fit = math.sqrt(max(0.0, var_b - var_w * inv_n))
        config_plan = math.sqrt(max(0.0, _upper(var_b, k - 1, level) - var_w * inv_n))
        mean_se = math.sqrt(var_b / k)
    else:
        config_fit = config_plan = mean_se = 0.0
        notes.append("per-configuration speed not measured (one configuration): 0")
    config_sigma = max(config_fit, min(MAX_SIGMA, config_plan))
    kept = [q for t, q in zip(epoch_times, qualities or [None] * len(epoch_times)) if len(t)]
    survivors = (
        fit_speed_quality([float(m) for m in means], kept, level=level, groups=labels)
        if config_sigma > 0
        else SpeedQuality(0.0, None, "no configuration speed spread measured: survivors as fast as any", False)
    )
    return Variation(
        epoch_sigma=max(epoch_fit, min(MAX_SIGMA, epoch_plan)),
        config_sigma=config_sigma,
        config_log_mean=float(means.mean()),
        epoch_sigma_fit=epoch_fit,
        config_sigma_fit=config_fit,
        configs=k,
        epochs=sum(len(g) for g in logs),
        source=f"measured: whole epochs of sampled configurations ({'; '.join(notes)}); planned σs "
        f"are {level:.0%} upper confidence bounds",
        speed_quality_rho=survivors.rho,
        speed_quality_fit=survivors.fit,
        speed_quality_source=survivors.source,
        speed_quality_bound=survivors.bound,
        config_mean_se=mean_se if config_sigma > 0 else 0.0,
    )


@dataclass(frozen=True)
class SpeedQuality:
    """How survivors are modelled: ``rho`` (the Gaussian correlation of slowness and quality planned with), the
    configurations' Spearman rank correlation (``fit``, None without scores), and ``source`` (fitted or bound)."""

    rho: float
    fit: float | None
    source: str
    bound: bool


def fit_speed_quality(
    log_speeds: Sequence[float],
    qualities: Sequence[float | None],
    *,
    level: float = FIT_CONFIDENCE,
    groups: Sequence[str] | None = None,
) -> SpeedQuality:
    """The speed–quality correlation to plan with, from the profiled configurations (pure).

    ``log_speeds[c]``: configuration ``c``'s log epoch time relative to the model (larger: slower);
    ``qualities[c]``: its score oriented so that higher is better (None: not recorded). With at least
    :data:`RHO_MIN_CONFIGS` scored configurations the fitted Spearman correlation is planned with; with fewer, its
    one-sided upper confidence bound at ``level`` (Fisher's z with the Spearman variance 1.06/(k−3); 1 with three or
    fewer): slow survivors are the conservative side. The planned Spearman ρ_s becomes the Gaussian correlation
    ``2·sin(π·ρ_s/6)`` the simulator draws with.

    ``groups`` (one label per configuration): scores are comparable only within a group (a run's first stage,
    the profiler's configurations after more epochs), so each group of more than 3 is ranked on its own and the
    correlations are pooled (Fisher's z, weighted by k − 3)."""
    labels = list(groups) if groups is not None else [""] * len(log_speeds)
    pairs = [(s, q, g) for s, q, g in zip(log_speeds, qualities, labels) if q is not None and math.isfinite(q)]
    fit, k = _pooled_spearman(pairs) if len(pairs) >= 2 else (None, len(pairs))
    if fit is not None and k >= RHO_MIN_CONFIGS:
        planned, bound = fit, False
        source = f"fitted: rank correlation {fit:+.2f} of slowness and score over {k} configurations"
    else:
        planned, bound = _rho_upper(fit, k, level), True
        if not pairs:
            source = (
                "bound: the profile holds no scores of its configurations, so how speed goes with quality is "
                f"unknown; planned at {planned:+.2f} (the slowest configurations promoted); re-run `rubberband "
                f"profile` with --configs {RHO_MIN_CONFIGS} to fit it"
            )
        else:
            seen = f"{k} scored configuration{'s' if k != 1 else ''}" + (
                f" (rank correlation {fit:+.2f})" if fit is not None else ""
            )
            source = (
                f"bound: {seen} cannot support a fit (it takes {RHO_MIN_CONFIGS}); planned at its {level:.0%} "
                f"upper bound {planned:+.2f} (slow configurations promoted); profile with --configs "
                f"{RHO_MIN_CONFIGS} to fit it"
            )
    rho = 2.0 * math.sin(math.pi * planned / 6.0)
    return SpeedQuality(rho=float(min(1.0, max(-1.0, rho))), fit=fit, source=source, bound=bound)


def _pooled_spearman(pairs: Sequence[tuple[float, float, str]]) -> tuple[float | None, int]:
    """Spearman's correlation of (speed, quality) pairs ranked within their group, pooled over groups; and how many
    configurations it rests on (those of the groups ranked: a group of 3 or fewer, or one whose speeds or scores
    are all alike, says nothing and does not count toward :data:`RHO_MIN_CONFIGS`)."""
    by_group: dict[str, list[tuple[float, float]]] = {}
    for s, q, g in pairs:
        by_group.setdefault(g, []).append((s, q))
    if len(by_group) == 1:
        (only,) = by_group.values()
        return _spearman([s for s, _ in only], [q for _, q in only]), len(only)
    zs, weights, counted = [], [], 0
    for members in by_group.values():
        fit = _spearman([s for s, _ in members], [q for _, q in members]) if len(members) > 3 else None
        if fit is not None:
            zs.append(math.atanh(max(-0.999, min(0.999, fit))))
            weights.append(len(members) - 3)
            counted += len(members)
    if not zs:
        return None, 0
    return math.tanh(float(np.average(zs, weights=weights))), counted


def _spearman(x: Sequence[float], y: Sequence[float]) -> float | None:
    """Spearman's rank correlation (average ranks for ties); None when either side is constant."""
    rx, ry = _ranks(x), _ranks(y)
    if np.std(rx) == 0 or np.std(ry) == 0:
        return None
    return float(np.corrcoef(rx, ry)[0, 1])


def _ranks(values: Sequence[float]) -> np.ndarray:
    a = np.asarray(values, dtype=float)
    order = np.argsort(a, kind="stable")
    ranks = np.empty(len(a))
    ranks[order] = np.arange(len(a), dtype=float)
    for v in np.unique(a):  # ties share their mean rank
        tied = a == v
        ranks[tied] = ranks[tied].mean()
    return ranks


def _rho_upper(fit: float | None, k: int, level: float) -> float:
    """The one-sided upper confidence bound of a Spearman correlation from ``k`` pairs (1 when k ≤ 3)."""
    if k <= 3:
        return 1.0
    z = math.atanh(max(-0.999, min(0.999, fit or 0.0))) + NormalDist().inv_cdf(level) * math.sqrt(1.06 / (k - 3))
    return math.tanh(z)


@dataclass(frozen=True)
class KnownTrials:
    """A bracket's trials whose speed the run has measured, best ranked first (the order promotion will most
    likely keep): each one's mean log epoch time relative to the model (``log_speeds``) over ``epochs`` epochs.
    The simulator plays them in place of population draws, each as its measurement and the population together say
    (:meth:`posterior`)."""

    log_speeds: tuple[float, ...]
    epochs: tuple[int, ...]
    #: The straggler σ of the model the speeds were measured against: each measured mean carries its instance's
    #: straggler factor (:meth:`posterior`).
    straggler_sigma: float = 0.0

    def __post_init__(self) -> None:
        if len(self.log_speeds) != len(self.epochs) or any(n < 1 for n in self.epochs):
            raise ValueError("one measured epoch count ≥ 1 per known trial")

    def posterior(self, variation: Variation, n: int) -> tuple[np.ndarray, np.ndarray]:
        """The first ``n`` trials' log speeds as their measurements and how much configurations differ together
        say: each one's mean and standard deviation (normal prior about ``config_log_mean``, normal measurement).

        A measured epoch is the trial's own speed times its instance's straggler factor and the epoch's noise, so
        a measured mean is its speed give or take ``√(straggler_sigma² + epoch_sigma²/epochs)``. How much
        configurations differ is the larger of the profile's word (``config_sigma² + config_mean_se²``) and the
        run's own: the known trials' mean squared distance from ``config_log_mean`` less that noise (a method of
        moments estimate; a profile that never measured a second configuration says 0 and is not believed over a
        run that shows otherwise). Where configurations differ far more than the noise, each measurement is the
        answer; where neither source sees them differ, a trial that measured a little slow was on a slow instance
        and is planned as the population, not slow for life (its next stages draw stragglers of their own)."""
        measured = np.asarray(self.log_speeds, dtype=float)
        noise = self.straggler_sigma**2 + variation.epoch_sigma**2 / np.asarray(self.epochs, dtype=float)
        seen = float(np.mean((measured - variation.config_log_mean) ** 2 - noise))
        prior = max(variation.config_sigma**2 + variation.config_mean_se**2, seen, 0.0)
        weight = prior / (prior + noise[:n]) if prior > 0 else np.zeros(n)
        mean = variation.config_log_mean + weight * (measured[:n] - variation.config_log_mean)
        return mean, np.sqrt(weight * noise[:n])


def bracket_log_speeds(
    variation: Variation,
    trial_z: np.ndarray,
    quality_z: np.ndarray | None,
    known: KnownTrials | None = None,
    mean_z: np.ndarray | None = None,
) -> np.ndarray:
    """Each trial's log speed factor for its life (samples × trials), in promotion order: stage ``i`` runs the
    first ``n_i`` columns.

    Known trials (measured mid-run) come first in their given order, each drawn from what its measurement and the
    population say of it (:meth:`KnownTrials.posterior`: measurements that differ by no more than stragglers and
    epoch noise make them are not taken for speeds); the bracket's other trials are population draws. Without
    known trials, the draws are ordered by a quality correlated with slowness at ``variation.speed_quality_rho``
    (``quality_z``: its independent part; 0 or None: the draws' own order, which is exchangeable). ``mean_z`` (one standard normal per sample)
    moves a sample's drawn trials together by ``variation.config_mean_se``: the population's speed as uncertain
    as the profile leaves it."""
    drawn = variation.config_log_mean + variation.config_sigma * trial_z
    if mean_z is not None and variation.config_mean_se > 0:
        drawn = drawn + variation.config_mean_se * mean_z[:, None]
    if known is not None and known.log_speeds:
        n = min(len(known.log_speeds), trial_z.shape[1])
        mean, sd = known.posterior(variation, n)
        return np.concatenate([mean + sd * trial_z[:, :n], drawn[:, n:]], axis=1)
    rho = variation.speed_quality_rho
    if rho == 0.0 or variation.config_sigma == 0.0 or quality_z is None:
        return drawn
    quality = rho * trial_z + math.sqrt(max(0.0, 1.0 - rho * rho)) * quality_z
    order = np.argsort(-quality, axis=1, kind="stable")
    return np.take_along_axis(drawn, order, axis=1)


# -- sampling ---------------------------------------------------------------------------------


class VariationDraws:
    """Common random numbers for the variation: standard normals per (bracket, trial) and per (stage, task).

    Streams are keyed apart from the simulator's straggler and start-up streams, so a model without
    variation sees exactly the draws it saw before. Columns are cached and only ever extended.
    """

    TRIAL_KEY = 1_000_003
    EPOCH_KEY = 2_000_003
    QUALITY_KEY = 3_000_003
    MEAN_KEY = 4_000_003

    def __init__(self, seed: int, samples: int, population_seed: int | None = None) -> None:
        self.seed = seed
        self.samples = samples
        self.population_seed = seed if population_seed is None else population_seed
        self._cache: dict[tuple[int, int], np.ndarray] = {}

    def _normals(self, key: int, index: int, width: int) -> np.ndarray:
        have = self._cache.get((key, index))
        if have is None or have.shape[1] < width:
            seed = self.population_seed if key == self.MEAN_KEY else self.seed
            gen = np.random.Generator(np.random.PCG64(np.random.SeedSequence(seed, spawn_key=(key, index))))
            # drawn column by column (the transpose of a row-major draw): a wider draw extends a narrower one
            have = np.ascontiguousarray(gen.standard_normal((max(width, 1), self.samples)).T)
            self._cache[(key, index)] = have
        return have[:, :width]

    def trials(self, bracket: int, width: int) -> np.ndarray:
        return self._normals(self.TRIAL_KEY, bracket, width)

    def epochs(self, stage: int, width: int) -> np.ndarray:
        return self._normals(self.EPOCH_KEY, stage, width)

    def qualities(self, bracket: int, width: int) -> np.ndarray:
        return self._normals(self.QUALITY_KEY, bracket, width)

    def population_means(self) -> np.ndarray:
        """One standard normal per sample for the population's log-mean (from ``population_seed``: a Hyperband
        job's brackets draw the same one)."""
        return self._normals(self.MEAN_KEY, 0, 1)[:, 0]


def task_factors(variation: Variation, trial_z: np.ndarray, epoch_z: np.ndarray, epochs: int) -> np.ndarray:
    """Speed factor of each task: its trial's speed × the mean of its ``epochs`` epoch factors.

    ``trial_z`` / ``epoch_z``: standard normals, one per task in dispatch order (see :func:`epoch_factors`)."""
    return epoch_factors(variation, variation.config_log_mean + variation.config_sigma * trial_z, epoch_z, epochs)


def epoch_factors(variation: Variation, trial_log: np.ndarray, epoch_z: np.ndarray, epochs: int) -> np.ndarray:
    """Speed factor of each task from its trial's log speed (``trial_log``) × the mean of its ``epochs`` epoch
    factors. The mean of ``epochs`` i.i.d. lognormal(0, σ_e) factors is drawn as one lognormal with the same mean and
    variance (Fenton–Wilkinson), exact for one epoch."""
    log = trial_log
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
