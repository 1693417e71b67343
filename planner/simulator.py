"""Monte Carlo DAG simulator of an elastic SHA / Hyperband plan.

A plan gives every stage an instance type, an instance count and a trial width (workers per
trial). The simulator plays the job out over many samples of start-up latency and straggler
slowdown, vectorised with numpy across samples, and returns the distributions of job completion
time (JCT) and cost. ``docs/simulator.md`` states the semantics; in short:

* **Slots.** Type capacity ``c`` (workers per instance), ``N`` instances, ``w`` workers per trial:
  ``w ≤ c`` packs ``floor(c/w)`` trial slots per instance; ``w > c`` makes each slot span
  ``ceil(w/c)`` instances. Trials are dispatched in order to the slot that frees first (list
  scheduling); more trials than slots run in waves.
* **Barriers.** A stage starts when the previous stage has finished completely (promotion needs
  every result). Hyperband brackets run one after another.
* **Instances.** Instances of the same type carry over to the next stage (``min(N_s, N_s+1)``, the
  ones that free last). Additional instances of the next stage are requested ahead, at the moment
  the current stage is predicted to end minus the start-up quantile, so start-up overlaps the
  tail (lead time and carry-over: :class:`~rubberband.planner.policies.PrefetchPolicy`, which the
  executor calls too). Every instance is released as soon as no remaining task of its stage needs it (with
  ``SimOptions.hold_to_end``, a static cluster's, not before the stage's barrier: held to the end).
* **Variation.** With a fitted :class:`~rubberband.planner.noise.Variation`, each trial has a speed
  factor for its life and each task the mean of its epochs' factors; they scale the task's
  iterations, and tasks of unequal length are list-scheduled (:func:`noise.schedule_tasks`).
* **Transitions.** A trial whose placement (instance type or width) changes at a promotion pays
  ``restart_overhead_s`` plus the checkpoint transfer time, and the transfer's price.
* **Billing.** ``clouds.billing_rule``: per second with a minimum, lifetime from request to
  release.
* **Head.** With ``heads`` (head mode on AWS/GCP: the run's own small CPU head instance, which
  runs the executor), every sample also pays the head of the plan's first stage's cloud, billed
  under that cloud's rule for ``boot + JCT + grace`` (:class:`HeadSpec`): a fixed per-run
  overhead that grows with the JCT. It is its own breakdown category, ``head``, outside the stages.

Samples use common random numbers: stage ``s``'s draws come from a stream keyed by (seed, s) and
instance index, so every candidate plan sees the same start-ups and stragglers, and a run with
fewer samples (screening) sees a prefix of the full run's samples. The representative sample's
timeline is rebuilt as an explicit task DAG (networkx) whose critical path is the JCT.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass, field, replace
from typing import Iterable, Mapping, Sequence

import networkx as nx
import numpy as np

from rubberband.catalog import (
    SERIAL_PROVISIONING,
    TRANSFER_USD_PER_GB,
    BillingRule,
    InstanceType,
)
from rubberband.clouds import billing_rule
from rubberband.plan import Timeline
from rubberband.planner.model import PerformanceModel, StartupModel
from rubberband.planner.list_schedule import list_schedule
from rubberband.planner.plan_space import (
    HeadSpec,
    Layout,
    StageConfig,
    layout,
    normalise,
    plan_key,
    prepare_plan,
)
from rubberband.planner.policies import PrefetchPolicy
from rubberband.planner.provisioning import ProvisionQueue
from rubberband.planner.spot import SpotSetup
from rubberband.planner.noise import KnownTrials, VariationDraws, bracket_log_speeds, epoch_factors, schedule_tasks
from rubberband.planner.schedule import Stage
from rubberband.planner.spot_stage import SpotPlay
from rubberband.planner.stage_state import StageInstances, StageOpening, StagePlay, StagePrefix, StageRecord
from rubberband.planner.timeline_dag import build_timeline

#: Cost categories of the workers' instances, accumulated stage by stage.
WORKER_CATEGORIES = ("training", "startup", "idle", "billing_minimum", "transfer")
#: Every category of :attr:`SimResult.breakdown`: the workers' plus the run's head instance.
CATEGORIES = WORKER_CATEGORIES + ("head",)


# -- random streams -----------------------------------------------------------------------------


class RandomStreams:
    """Common random numbers: per stage, standard normals (stragglers) and uniforms (start-up).

    Columns (instance indices) come in blocks drawn from a stream keyed by (seed, stage, block),
    so a wider plan sees the same draws for its first instances as a narrower one.
    """

    BLOCK = 32

    def __init__(self, seed: int, samples: int) -> None:
        self.seed = seed
        self.samples = samples
        self._cache: dict[int, tuple[np.ndarray, np.ndarray]] = {}

    def stage(self, index: int, width: int) -> tuple[np.ndarray, np.ndarray]:
        have = self._cache.get(index)
        if have is None or have[0].shape[1] < width:
            start = 0 if have is None else have[0].shape[1] // self.BLOCK
            blocks_z, blocks_u = ([] if have is None else [have[0]]), ([] if have is None else [have[1]])
            for block in range(start, -(-width // self.BLOCK)):
                seq = np.random.SeedSequence(self.seed, spawn_key=(index, block))
                gen = np.random.Generator(np.random.PCG64(seq))
                blocks_z.append(gen.standard_normal((self.samples, self.BLOCK)))
                blocks_u.append(gen.random((self.samples, self.BLOCK)))
            have = (np.concatenate(blocks_z, axis=1), np.concatenate(blocks_u, axis=1))
            self._cache[index] = have
        return have


def _slots(lay: Layout, ready: np.ndarray, factor: np.ndarray, start: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per trial slot (samples × slots): when it can take its first task (every instance it runs on ready, and not
    before the stage's ``start``) and its straggler factor (its slowest instance's)."""
    if lay.span == 1:
        p = lay.per_instance
        slot_ready = ready if p == 1 else np.repeat(ready, p, axis=1)
        slot_factor = factor if p == 1 else np.repeat(factor, p, axis=1)
    else:
        S, k = ready.shape[0], lay.span
        used = lay.slots * k
        slot_ready = ready[:, :used].reshape(S, lay.slots, k).max(axis=2)
        slot_factor = factor[:, :used].reshape(S, lay.slots, k).max(axis=2)
    return np.maximum(slot_ready, start[:, None]), slot_factor


def _provision_serially(
    play: StagePlay, inst: StageInstances, t_req: np.ndarray, boot: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """A serial-provisioning cloud starts a stage's new instances (the last ``boot.shape[1]`` of ``inst``) one after
    another: each is requested (and billed) when the one before is up, the first once the provisioner has finished
    the requests before it (an earlier stage's still starting, or another bracket's: ``play.free_at``). Records
    the queue in ``inst``; returns the first new instance's request time and each new one's boot counted from it."""
    carry = inst.request.shape[1] - boot.shape[1]
    submitted = t_req
    if inst.provisioned is not None:
        t_req = np.maximum(t_req, inst.provisioned)
    if play.free_at is not None:
        t_req = np.maximum(t_req, play.free_at)
    if t_req is not submitted:
        inst.request[:, carry:] = t_req[:, None]
    boot = np.cumsum(boot, axis=1)
    inst.request[:, carry + 1 :] = t_req[:, None] + boot[:, :-1]
    inst.provision = (submitted, boot[:, -1])
    inst.provisioned = t_req + boot[:, -1]
    return t_req, boot


def _add_events(a: dict[str, np.ndarray] | None, b: dict[str, np.ndarray] | None) -> dict[str, np.ndarray] | None:
    if a is None or b is None:
        return a if b is None else b
    return {k: a[k] + b.get(k, 0) if k in a else b[k].copy() for k in {*a, *b}}


def sum_samples(arrays: Iterable[np.ndarray]) -> np.ndarray:
    """Per-sample sum of arrays (as ``sum``, which starts from 0; here a 0-d zero, so the result is an array)."""
    return sum(arrays, np.zeros(()))


#: What :attr:`SimResult.spot_events` counts per sample (spot stages only).
SPOT_EVENTS = ("preemptions", "moved_to_on_demand", "stages_on_demand", "wait_s")


def needed_on_time(samples: int, confidence: float) -> int:
    """How many of ``samples`` Monte Carlo samples must meet the deadline for it to be met at ``confidence``:
    count-based, so the same samples always give the same answer (no float quantile drift)."""
    return math.ceil(confidence * samples - 1e-9)


@dataclass
class SimResult:
    """Distributions over samples (arrays of length ``samples``) and summary statistics."""

    configs: tuple[StageConfig, ...]
    jct: np.ndarray
    cost: np.ndarray
    stage_durations: list[np.ndarray]
    stage_costs: list[np.ndarray]
    breakdown: dict[str, np.ndarray]
    by_type: dict[str, np.ndarray]
    samples: int
    #: Spot stages' per-sample counts (:data:`SPOT_EVENTS`): preemptions, trials the policy moved to
    #: on-demand, spot stages bought on-demand at their request, seconds waited for capacity. Empty
    #: without spot stages.
    spot_events: dict[str, np.ndarray] = field(default_factory=dict)

    @property
    def cost_mean(self) -> float:
        return float(self.cost.mean())

    @property
    def jct_mean(self) -> float:
        return float(self.jct.mean())

    def jct_quantile(self, q: float) -> float:
        return float(np.quantile(self.jct, q))

    def p_meet(self, deadline_s: float) -> float:
        return float(np.mean(self.jct <= deadline_s))

    def meets(self, deadline_s: float, confidence: float) -> bool:
        return int(np.count_nonzero(self.jct <= deadline_s)) >= needed_on_time(len(self.jct), confidence)

    def representative_index(self) -> int:
        return int(np.argmin(np.abs(self.jct - np.median(self.jct))))


@dataclass(frozen=True)
class RunningState:
    """Instances already running when re-planning mid-run (the executor's view)."""

    instance_type_key: str
    instances: int
    now_s: float = 0.0


@dataclass(frozen=True)
class SimOptions:
    """Knobs of the simulated executor."""

    #: When next-stage instances are requested and how many carry over: the executor's own policy object.
    prefetch: PrefetchPolicy = PrefetchPolicy()
    #: A static cluster: no instance is released before its stage's barrier, so every instance of a
    #: plan whose stages share one configuration lives until the job ends (the best-static baseline,
    #: as the executor runs it with ``elastic=False``).
    hold_to_end: bool = False


@dataclass(frozen=True)
class SimSettings:
    """How a simulator plays a job's plans: everything but the job itself (its stages and performance model).

    ``samples`` Monte Carlo samples drawn from the common random streams of ``seed``; ``spot``: every stage
    priced at spot and never preempted (the old reading of ``resources.spot: true``); ``options``: the
    simulated executor's knobs; ``start_state``: instances already running (re-planning mid-run); ``heads``
    (cloud → :class:`HeadSpec`): the run's billed head per cloud; ``spot_setup``: spot stages' preemptions and
    fall-back (None: a spot stage is priced at spot and never fails); ``known_trials`` (bracket → its trials the
    run has measured, best ranked first): played with their measured speeds in place of population draws;
    ``population_seed``: the stream of each sample's draw of the configurations' population mean (None: ``seed``;
    a Hyperband job's brackets, each on its own ``seed``, share their job's: one population).

    One value for all of them, so that a simulator derived from another (a bracket's, a screening one) says
    what it changes (``dataclasses.replace``) and inherits the rest."""

    samples: int = 1000
    seed: int = 0
    spot: bool = False
    options: SimOptions = SimOptions()
    start_state: RunningState | None = None
    heads: Mapping[str, HeadSpec] | None = None
    spot_setup: SpotSetup | None = None
    known_trials: Mapping[int, KnownTrials] | None = None
    population_seed: int | None = None


class ReadsSettings:
    """The :class:`SimSettings` a simulator was made with, read as its own attributes (``sim.samples``, ...)."""

    settings: SimSettings

    @property
    def samples(self) -> int:
        return self.settings.samples

    @property
    def seed(self) -> int:
        return self.settings.seed

    @property
    def population_seed(self) -> int:
        """The stream of each sample's population-mean draw: the settings', else :attr:`seed`."""
        population = self.settings.population_seed
        return self.seed if population is None else population

    @property
    def spot(self) -> bool:
        return self.settings.spot

    @property
    def options(self) -> SimOptions:
        return self.settings.options

    @property
    def start_state(self) -> RunningState | None:
        return self.settings.start_state

    @property
    def spot_setup(self) -> SpotSetup | None:
        """Spot stages' preemptions and fall-back (None: a spot stage is priced at spot and never fails)."""
        return self.settings.spot_setup


class Simulator(ReadsSettings):
    """Simulates plans for one job (stages, model) under ``settings``; caches shared plan prefixes."""

    #: Most plan prefixes cached, and most bytes their arrays hold (the least recently used go first).
    CACHE_SIZE = 4096
    CACHE_BYTES = 256 << 20

    def __init__(self, stages: Sequence[Stage], model: PerformanceModel, settings: SimSettings | None = None) -> None:
        self.settings = settings or SimSettings()
        self.stages = list(stages)
        #: The billed head per cloud (as given: its boot may be unresolved; :meth:`head_for` resolves it).
        self.heads: dict[str, HeadSpec] = dict(self.settings.heads or {})
        self._heads: dict[str, HeadSpec | None] = {}  # per cloud, boot resolved
        self.model = model
        self.streams = RandomStreams(self.seed, self.samples)
        self._cache: OrderedDict[tuple, StagePrefix] = OrderedDict()
        self._cached_bytes = 0
        self._epoch_cache: dict[tuple[str, int, int], float] = {}
        self._startup_cache: dict[tuple[str, str], tuple[StartupModel, float]] = {}  # (model, prefetch lead)
        self._termination_cache: dict[tuple[str, str], float] = {}
        self._factor_cache: dict[int, np.ndarray] = {}
        self._startup_draws: dict[tuple, np.ndarray] = {}
        self._variation = VariationDraws(self.seed, self.samples, self.population_seed)
        self._trial_speeds: dict[tuple[int, int, int, bool], np.ndarray] = {}
        #: How its spot stages fare (market at the request, preemptions, fall-back, bill).
        self.spots = SpotPlay(self)
        self.evaluations = 0

    # -- public -----------------------------------------------------------------------------
    def prepare(self, configs: Sequence[StageConfig], samples: int | None) -> tuple[tuple[StageConfig, ...], int]:
        """Check a full plan (one StageConfig per stage), normalise it and count the evaluation; with the
        number of samples to use (``samples``, at most all, None: all)."""
        prepared = prepare_plan(self.stages, configs, samples, self.samples)
        self.evaluations += 1
        return prepared

    def simulate(
        self, configs: Sequence[StageConfig], samples: int | None = None, queue: ProvisionQueue | None = None
    ) -> SimResult:
        """Simulate a full plan with the first ``samples`` samples (all by default).

        ``queue``: when the provisioner is free for each stage's new instances on a serial-provisioning
        cloud (:class:`ProvisionQueue`, arrays over the ``samples``); None: free at once."""
        configs, n = self.prepare(configs, samples)
        prefix = self._prefix(configs, len(configs), n, self._tails(configs), queue)
        return self._finish(configs, prefix, n)

    def _tails(self, configs: tuple[StageConfig, ...]) -> tuple[float, ...]:
        """Per stage, the predicted (median) time of the later stages this simulator plays (one after
        another: with several Hyperband brackets here, the later brackets' too; a parallel bracket's
        simulator holds its own bracket only): the work a spot fall-back decision counts as still to come
        after the stage (0 where the stage is not on spot), each spot stage on its fall-back type (Uniform Progress
        measures the work left on the market it would fall back to)."""
        if self.spot_setup is None or not any(c.spot for c in configs):
            return (0.0,) * len(configs)
        durations = [self.predicted_duration(i, c, configs[i - 1] if i else None) for i, c in enumerate(configs)]
        tails = [0.0] * len(configs)
        acc = 0.0
        for i in range(len(configs) - 1, -1, -1):
            tails[i] = acc if configs[i].spot else 0.0
            # measured on the fall-back, as the policy does
            acc += durations[i] * self.spots.fallback_slowdown(configs[i])
        return tuple(round(t, 3) for t in tails)

    def prefix_bounds(self, configs: Sequence[StageConfig]) -> tuple[float, np.ndarray]:
        """Lower bound on the mean cost of any plan starting with ``configs``, and the barrier times.

        Later stages and the open stage's finalisation only add cost, so the cost so far is a bound.
        """
        configs = tuple(normalise(c, s.trials) for c, s in zip(configs, self.stages))
        prefix = self._prefix(configs, len(configs), self.samples, (0.0,) * len(configs))
        so_far = sum(prefix.parts[k] for k in WORKER_CATEGORIES) + prefix.open.cost
        # the job ends no earlier than this prefix's barrier, and the head's bill only grows with the JCT
        so_far = so_far + self.head_cost(configs, prefix.open.barrier)
        return float(so_far.mean()), prefix.open.barrier

    def head_for(self, configs: Sequence[StageConfig]) -> HeadSpec | None:
        """The billed head of a plan (that of its first stage's cloud), its boot resolved; None: no head."""
        if not configs:
            return None
        cloud = configs[0].instance_type.cloud
        if cloud not in self._heads:
            head = self.heads.get(cloud)
            if head is not None and head.boot_s is None:
                boot = self.model.startup(head.cloud, head.instance_type).quantile(0.5)
                head = replace(head, boot_s=boot)
            self._heads[cloud] = head
        return self._heads[cloud]

    def head_cost(self, configs: Sequence[StageConfig], jct: np.ndarray) -> np.ndarray:
        """Per-sample cost of the plan's head for job completion times ``jct`` (zeros without a head)."""
        head = self.head_for(configs)
        if head is None:
            return np.zeros(np.shape(jct))
        billed = self.rule(head.cloud).billed_seconds(head.boot_s + np.asarray(jct, dtype=float) + head.grace_s)
        return billed * (head.price_hr / 3600.0)

    def min_factor(self) -> float:
        """A lower bound of a task's compute factor: stragglers and variation, each 6σ below its median (measured
        survivors at their own speeds, 6σ of their mean's uncertainty below it)."""
        variation = self.model.variation
        lowest = min(1.0, variation.min_factor())
        for known in (self.settings.known_trials or {}).values():
            for log_speed, epochs in zip(known.log_speeds, known.epochs):
                lowest = min(
                    lowest, math.exp(log_speed - 6.0 * variation.epoch_sigma * (1.0 + 1.0 / math.sqrt(epochs)))
                )
        return math.exp(-6.0 * self.model.straggler_sigma) * lowest

    def task_time(self, index: int, config: StageConfig, previous: StageConfig | None) -> tuple[float, float]:
        """(median compute, overhead) seconds of one task of stage ``index`` after ``previous``."""
        stage = self.stages[index]
        lay = layout(config.instance_type.workers, config.instances, config.workers)
        base = stage.epochs_this_stage * self.epoch_s(config.instance_type.device, config.workers, lay.nodes)
        every = self.spot_setup.checkpoint_epochs if config.spot and self.spot_setup is not None else 1
        return base, self.model.task_overhead(stage.epochs_this_stage, self._moved(index, config, previous), every)

    def _moved(self, index: int, config: StageConfig, previous: StageConfig | None) -> bool:
        """Whether the trials of stage ``index`` change placement (restart from a checkpoint elsewhere)."""
        return previous is not None and self.stages[index].index > 0 and previous.placement != config.placement

    def _transition(self, index: int, config: StageConfig, previous: StageConfig | None) -> float:
        """The start of one task: restart + transfer when the placement changed, else the warm start."""
        model = self.model
        if self._moved(index, config, previous):
            return model.restart_overhead_s + model.transfer_time()
        return model.task_start_s

    def predicted_duration(self, index: int, config: StageConfig, previous: StageConfig | None) -> float:
        """Deterministic stage duration (waves × median task), from which requests are timed."""
        base, overhead = self.task_time(index, config, previous)
        slots = layout(config.instance_type.workers, config.instances, config.workers).slots
        return -(-self.stages[index].trials // max(1, slots)) * (base + overhead)

    def request_offsets(self, configs: Sequence[StageConfig]) -> list[float | None]:
        """When the executor requests each stage's additional instances: seconds after the first
        task of the previous stage started (None for the first stage: at once)."""
        configs = tuple(normalise(c, s.trials) for c, s in zip(configs, self.stages))
        out: list[float | None] = [None]
        for i in range(1, len(configs)):
            predicted = self.predicted_duration(i - 1, configs[i - 1], configs[i - 2] if i >= 2 else None)
            out.append(self.options.prefetch.request_offset_s(predicted, self.lead_s(configs[i].instance_type)))
        return out

    def trace(
        self, configs: Sequence[StageConfig], sample: int, queue: ProvisionQueue | None = None
    ) -> tuple[Timeline, nx.DiGraph, float]:
        """Timeline of one sample, rebuilt as an explicit DAG; returns (timeline, dag, critical path).
        ``queue``: as for :meth:`simulate` (arrays over all samples)."""
        configs = tuple(normalise(c, s.trials) for c, s in zip(configs, self.stages))
        prefix = None
        records: list[StageRecord] = []
        tails = self._tails(configs)
        rows = slice(sample, sample + 1)
        for i in range(len(configs)):
            play = StagePlay(i, configs[i], tails[i], None if queue is None else queue.at(i, rows))
            prefix = self._step(prefix, play, rows, record=True)
            records.append(prefix.open)
        return build_timeline(self, configs, records)

    # -- internals --------------------------------------------------------------------------
    def _factors(self, index: int, width: int) -> np.ndarray:
        """Straggler factors of stage ``index``'s first ``width`` instances or more (all samples).

        Derived once per stage from the common random streams and cached.
        """
        z, _ = self.streams.stage(index, width)
        have = self._factor_cache.get(index)
        if have is None or have.shape[1] < z.shape[1]:
            sigma = self.model.straggler_sigma
            have = np.exp(sigma * z) if sigma > 0 else np.ones_like(z)
            self._factor_cache[index] = have
        return have

    def _boots(self, index: int, width: int, itype: InstanceType) -> np.ndarray:
        """Start-up latencies of stage ``index``'s first ``width`` instances or more of ``itype`` (all samples).

        Derived once per stage and type from the common random streams and cached.
        """
        _, u = self.streams.stage(index, width)
        key = (index, itype.cloud, itype.name)
        startup = self._startup_draws.get(key)
        if startup is None or startup.shape[1] < u.shape[1]:
            startup = self.startup_model(itype).sample(u)
            self._startup_draws[key] = startup
        return startup

    def _task_factors(self, index: int, rows: slice) -> np.ndarray:
        """Variation factors of stage ``index``'s tasks in dispatch order (samples ``rows``).

        A bracket's trials keep their speed through its stages: stage ``i`` runs the first ``n_i`` of the
        bracket's trials in promotion order (:func:`~rubberband.planner.noise.bracket_log_speeds`: measured
        survivors first when the run knows them, else draws ordered by a quality as correlated with slowness as
        the model says), each with a fresh draw for the mean of this stage's epochs. The executor dispatches a
        promoted stage best first, but a bracket's first stage in the order its trials were sampled: there the
        draws keep their own order (ranked by quality, slower-is-better trials would all go first, which packs the
        stage like longest-first and predicts it short).
        """
        stage = self.stages[index]
        speeds = self._bracket_speeds(stage.bracket, rows, sampled_order=stage.index == 0)[:, : stage.trials]
        epoch_z = self._variation.epochs(index, stage.trials)[rows]
        return epoch_factors(self.model.variation, speeds, epoch_z, stage.epochs_this_stage)

    @property
    def _varies(self) -> bool:
        """Whether tasks differ in speed: the model's variation, or survivors measured at their own speeds."""
        return self.model.variation.active or bool(self.settings.known_trials)

    def _bracket_speeds(self, bracket: int, rows: slice, *, sampled_order: bool = False) -> np.ndarray:
        """The bracket's trials' log speeds in promotion order (samples ``rows``; ``sampled_order``: the draws in
        the order they were drawn, measured survivors still first), cached per bracket, rows and order."""
        key = (bracket, rows.start or 0, rows.stop if rows.stop is not None else self.samples, sampled_order)
        speeds = self._trial_speeds.get(key)
        if speeds is None:
            width = max(s.trials for s in self.stages if s.bracket == bracket)
            known = (self.settings.known_trials or {}).get(bracket)
            ranked = known is None and not sampled_order and self.model.variation.speed_quality_rho != 0.0
            speeds = bracket_log_speeds(
                self.model.variation,
                self._variation.trials(bracket, width)[rows],
                self._variation.qualities(bracket, width)[rows] if ranked else None,
                known,
                self._variation.population_means()[rows],
            )
            self._trial_speeds[key] = speeds
        return speeds

    def startup_model(self, itype: InstanceType) -> StartupModel:
        key = (itype.cloud, itype.name)
        if key not in self._startup_cache:
            model = self.model.startup(itype.cloud, itype.name)
            self._startup_cache[key] = (model, self.options.prefetch.lead_s(model.samples_s))
        return self._startup_cache[key][0]

    def lead_s(self, itype: InstanceType) -> float:
        self.startup_model(itype)
        return self._startup_cache[(itype.cloud, itype.name)][1]

    def epoch_s(self, device: str, workers: int, nodes: int) -> float:
        key = (device, workers, nodes)
        if key not in self._epoch_cache:
            self._epoch_cache[key] = self.model.epoch_time(device, workers, nodes)
        return self._epoch_cache[key]

    def _prefix(
        self,
        configs: tuple[StageConfig, ...],
        upto: int,
        n: int,
        tails: tuple[float, ...],
        queue: ProvisionQueue | None = None,
    ) -> StagePrefix:
        """The first ``upto`` (≥ 1) stages of ``configs`` played (samples ``n``), from the prefix cache."""
        if upto < 1:
            raise ValueError("a plan prefix has at least one stage")
        key: tuple = (n, plan_key(configs[:upto]), tails[:upto])
        if queue is not None and queue.waits_before(upto):
            key += (queue.digest(upto),)
        hit = self._cache.get(key)
        if hit is not None:
            self._cache.move_to_end(key)
            return hit
        previous = self._prefix(configs, upto - 1, n, tails, queue) if upto > 1 else None
        rows = slice(0, n)
        play = StagePlay(
            upto - 1, configs[upto - 1], tails[upto - 1], None if queue is None else queue.at(upto - 1, rows)
        )
        result = self._step(previous, play, rows)
        self._cache[key] = result
        self._cached_bytes += _nbytes(result)
        while self._cache and (len(self._cache) > self.CACHE_SIZE or self._cached_bytes > self.CACHE_BYTES):
            _, evicted = self._cache.popitem(last=False)
            self._cached_bytes -= _nbytes(evicted)
        return result

    def rule(self, cloud: str) -> BillingRule:
        """How ``cloud`` bills an instance's lifetime."""
        return billing_rule(cloud)

    def termination_s(self, itype: InstanceType) -> float:
        """Median seconds an instance stays billed after its release (terminate request → gone)."""
        key = (itype.cloud, itype.name)
        if key not in self._termination_cache:
            self._termination_cache[key] = self.model.termination(itype.cloud, itype.name).quantile(0.5)
        return self._termination_cache[key]

    def price_hr(self, itype: InstanceType, market: str | None = None) -> float:
        """$/h of ``itype`` in ``market``: a spot stage at its offer's zone-weighted price
        (:meth:`SpotSetup.spot_price`), the old all-spot reading at the catalog's spot price."""
        if market == "spot" and self.spot_setup is not None:
            return self.spot_setup.spot_price(itype)
        return itype.price(self.spot or market == "spot")

    def _finalise(self, prefix: StagePrefix, carry: int) -> tuple:
        """Close the open stage: carried instances idle until the barrier; others pay billing minimums.

        The ``carry`` instances that free last go on to the next stage. Returns the finalised
        stage costs, cost parts, cost by type, the carried instances' request times and their
        indices (within the open stage) and the times they free (or come up, if still starting).
        """
        rec = prefix.open
        itype = rec.config.instance_type
        price: float | np.ndarray = self.price_hr(itype, rec.config.market) / 3600.0
        moved_to = None if rec.fallback is None else self.spots.setup.fallback(itype)
        if moved_to is not None and rec.fallback is not None and rec.fallback.any():
            # samples whose spot stage was bought on-demand: on the fall-back type, at its price
            price = np.where(rec.fallback, moved_to.price(False) / 3600.0, price)
        rule = self.rule(itype.cloud)
        n = rec.release.shape[1]
        release, request = rec.release, rec.request
        carried_idx = None
        if 0 < carry < n:
            idx = np.argpartition(release, n - carry - 1, axis=1)
            carried_idx = idx[:, n - carry :]
            kept_idx = idx[:, : n - carry]
            c_release = np.take_along_axis(release, carried_idx, axis=1)
            c_request = np.take_along_axis(request, carried_idx, axis=1)
            o_release = np.take_along_axis(release, kept_idx, axis=1)
            o_request = np.take_along_axis(request, kept_idx, axis=1)
        elif carry == n:
            carried_idx = np.broadcast_to(np.arange(n), release.shape)
            c_release, c_request = release, request
            o_release = o_request = release[:, :0]
        else:
            c_release = c_request = release[:, :0]
            o_release, o_request = release, request
        stage_cost = rec.cost
        parts = dict(rec.parts)
        if carry:
            extra = (rec.barrier[:, None] - c_release).sum(axis=1) * price
            stage_cost = stage_cost + extra
            parts["idle"] = parts["idle"] + extra
        if carry < n:
            # released instances: billed (as accounting bills the journal) from the request until
            # they are gone, the termination latency after the release; the tail counts as idle
            life = o_release - o_request
            gone = self.termination_s(itype)
            billed = rule.billed_seconds(life + gone)
            tail = gone * life.shape[1] * price
            extra = (billed - life).sum(axis=1) * price - tail
            stage_cost = stage_cost + extra + tail
            parts["idle"] = parts["idle"] + tail
            parts["billing_minimum"] = parts["billing_minimum"] + extra
        total = {k: prefix.parts[k] + parts[k] for k in WORKER_CATEGORIES}
        by_type = dict(prefix.by_type)
        moved_usd: float | np.ndarray = 0.0
        if moved_to is not None and rec.fallback is not None and moved_to.key != itype.key:
            # what the fall-back type was paid: whole stages bought on-demand, and moved trials' rest
            moved_usd = np.where(rec.fallback, stage_cost, 0.0 if rec.fallback_usd is None else rec.fallback_usd)
            by_type[moved_to.name] = by_type.get(moved_to.name, 0.0) + moved_usd
        by_type[itype.name] = by_type.get(itype.name, 0.0) + stage_cost - moved_usd
        return prefix.stage_costs + (stage_cost,), total, by_type, c_request, carried_idx, c_release

    def _step(self, prefix: StagePrefix | None, play: StagePlay, rows: slice, record: bool = False) -> StagePrefix:
        """Play one stage (``play``) after ``prefix`` (None: the job's first stage) over the samples ``rows``.

        Closes the stage before (:meth:`_open`), brings up this stage's instances (:meth:`_instances`, with spot's
        request and the instances kept from a re-plan), runs its tasks on its slots (with a spot stage's
        preemptions) and bills what it has used so far; the next stage finalises it. ``record``: keep the trace
        the timeline is rebuilt from (:func:`build_timeline`)."""
        config = play.config
        stage = self.stages[play.index]
        lay = layout(config.instance_type.workers, config.instances, config.workers)
        factor = self._factors(play.index, config.instances)[rows, : config.instances]
        prev = prefix.open if prefix is not None else None
        opening = self._open(prefix, play, factor.shape[0])
        inst = self._instances(play, prev, opening, rows)
        spot = self.spots.start(play, prev, inst, opening.carry, rows)
        self._keep_running(prev, config, inst)

        slot_ready, slot_factor = _slots(lay, inst.ready, factor, opening.start)
        if spot is not None and spot.fallback.any():  # a stage bought on-demand runs on the fall-back type
            slot_factor = slot_factor * np.where(spot.fallback, spot.slow, 1.0)[:, None]
        base, overhead = self.task_time(play.index, config, None if prev is None else prev.config)
        preempted = None if spot is None else self.spots.preemptions(spot, slot_ready, (base, overhead))
        counts, last_end, busy, dur = self._schedule(
            play, rows, (slot_ready, slot_factor), (base, overhead), None if preempted is None else preempted.extra
        )
        used_slot = counts > 0
        end_or_ready = np.where(used_slot, last_end, -np.inf)
        barrier = end_or_ready.max(axis=1)
        anchor = np.where(used_slot, slot_ready, np.inf).min(axis=1)
        release = self._release(lay, end_or_ready, inst.ready, barrier)

        stage_parts, seg = self._stage_parts(config, opening, inst, release, busy)
        events = fallback_usd = None
        if spot is not None and preempted is not None:
            stage_parts, seg, fallback_usd = self.spots.bill(spot, preempted, stage_parts, seg)
            events = preempted.events(spot.fallback)
        trace = None
        if record:
            trace = {
                "carried_from_prev": None if opening.carried_idx is None else [int(x) for x in opening.carried_idx[0]],
                "transition": self._transition(play.index, config, None if prev is None else prev.config),
                "request": inst.request[0],
                "ready": inst.ready[0],
                "release": release[0],
                "slot_ready": slot_ready[0],
                "dur": dur[0],
                "counts": counts[0],
                "carry": opening.carry,
                "start": float(opening.start[0]),
                "barrier": float(barrier[0]),
                "layout": lay,
                "anchor": float(anchor[0]),
                "prev_anchor": None if prev is None else float(prev.anchor[0]),
            }
        rec = StageRecord(
            config=config,
            start=opening.start,
            anchor=anchor,
            barrier=barrier,
            predicted_s=-(-stage.trials // max(1, lay.slots)) * (base + overhead),
            release=release,
            request=inst.request,
            cost=seg + opening.transfer_usd,
            parts=stage_parts,
            trace=trace,
            ready=inst.ready,
            fallback=None if spot is None else spot.fallback,
            fallback_usd=fallback_usd,
            events=events,
            provision=inst.provision,
            provisioned=inst.provisioned,
        )
        return StagePrefix(
            stage_costs=opening.stage_costs,
            parts=opening.parts,
            by_type=opening.by_type,
            durations=opening.durations,
            open=rec,
            events=None if prefix is None else _add_events(prefix.events, prefix.open.events),
        )

    def _open(self, prefix: StagePrefix | None, play: StagePlay, samples: int) -> StageOpening:
        """What stage ``play`` starts from: the stage before closed (:meth:`_finalise`, its ``carry`` instances that
        free last taken over), its barrier as the start, and the checkpoint transfers a promotion that moves the
        trials pays. The job's first stage starts from nothing at 0."""
        if prefix is None:
            nothing = np.empty((samples, 0))
            zero = np.zeros(samples)
            return StageOpening(
                (), {k: np.zeros(samples) for k in WORKER_CATEGORIES}, {}, (), zero, 0, nothing, nothing
            )
        prev, config = prefix.open, play.config
        same = prev.config.instance_type.key == config.instance_type.key and prev.config.market == config.market
        carry = self.options.prefetch.carried(same, prev.release.shape[1], config.instances)
        stage_costs, parts, by_type, carried_request, carried_idx, carried_free = self._finalise(prefix, carry)
        stage = self.stages[play.index]
        transfer_usd = 0.0
        if stage.index > 0 and prev.config.placement != config.placement:
            transfer_usd = (
                stage.trials
                * self.model.checkpoint_size_gb
                * TRANSFER_USD_PER_GB.get(prev.config.instance_type.cloud, 0.0)
            )
        return StageOpening(
            stage_costs=stage_costs,
            parts=parts,
            by_type=by_type,
            durations=prefix.durations + (prev.barrier - prev.start,),
            start=prev.barrier,
            carry=carry,
            carried_request=carried_request,
            carried_free=carried_free,
            carried_idx=carried_idx,
            transfer_usd=transfer_usd,
        )

    def _instances(
        self, play: StagePlay, prev: StageRecord | None, opening: StageOpening, rows: slice
    ) -> StageInstances:
        """When the stage's instances are requested (billed from) and ready for a first trial, per sample. Carried ones
        are free at the stage's start, or when they are up if still starting. New ones are requested ahead of time
        (:class:`~rubberband.planner.policies.PrefetchPolicy`), timed from the previous stage's first task; the
        job's first stage requests them at once, after its head on a cloud whose head boots first, or from "now"
        when re-planning. Their first trial waits for the new instance's worker processes."""
        config = play.config
        itype, n_inst, carry, start = config.instance_type, config.instances, opening.carry, opening.start
        inst = StageInstances(
            request=np.empty((start.shape[0], n_inst)),
            ready=np.empty((start.shape[0], n_inst)),
            provisioned=None if prev is None else prev.provisioned,
        )
        if carry:
            inst.request[:, :carry] = opening.carried_request
            inst.ready[:, :carry] = np.maximum(start[:, None], opening.carried_free)
        if carry < n_inst:
            if prev is None:
                # A fresh local run first brings up its Ray head (its measured start, median; else one node's),
                # then requests the first stage's instances; a re-plan starts from "now".
                head = self.model.head_wait_s(itype.cloud, itype.name)
                t_req = np.full(start.shape[0], head if self.start_state is None else self.start_state.now_s)
            else:
                t_req = prev.anchor + self.options.prefetch.request_offset_s(prev.predicted_s, self.lead_s(itype))
            inst.request[:, carry:] = t_req[:, None]
            boot = self._boots(play.index, n_inst, itype)[rows, carry:n_inst]
            gained: np.ndarray | float = 0.0
            if itype.cloud in SERIAL_PROVISIONING:
                overlap = self.model.start_overlap(itype.cloud)  # a shared host: the starts contend (profiled)
                if overlap is not None:
                    boot, gained = overlap.serial(boot, itype.workers)
                t_req, boot = _provision_serially(play, inst, t_req, boot)
            inst.ready[:, carry:] = t_req[:, None] + boot + self.model.worker_start_s + gained
            inst.t_req = t_req
        return inst

    def _keep_running(self, prev: StageRecord | None, config: StageConfig, inst: StageInstances) -> None:
        """Instances already running when re-planning mid-run (:class:`RunningState`, the first stage on their type):
        ready now, billed from now (the past is sunk)."""
        state = self.start_state
        if prev is None and state is not None and state.instance_type_key == config.instance_type.key:
            kept = min(state.instances, config.instances)
            inst.request[:, :kept] = state.now_s
            inst.ready[:, :kept] = state.now_s

    def _schedule(
        self,
        play: StagePlay,
        rows: slice,
        slots: tuple[np.ndarray, np.ndarray],
        task: tuple[float, float],
        extra: np.ndarray | None,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """The stage's tasks list-scheduled onto its slots (``slots``: when each is free, its straggler factor),
        each ``task`` = (median compute, overhead) seconds, compute scaled by the slot's factor, the trial's
        variation (when fitted) and ``extra`` seconds per task (a spot stage's preemptions). Returns per slot
        its tasks, its last task's end, its busy time and its mean task duration (what the trace shows)."""
        slot_ready, slot_factor = slots
        base, overhead = task
        trials = self.stages[play.index].trials
        if self._varies or extra is not None:
            active = self._varies
            factors = self._task_factors(play.index, rows) if active else np.ones((slot_ready.shape[0], trials))
            counts, last_end, busy = schedule_tasks(slot_ready, base * slot_factor, factors, overhead, extra=extra)
            dur = np.where(counts > 0, busy / np.maximum(counts, 1), base * slot_factor + overhead)  # trace: mean
        else:
            dur = base * slot_factor + overhead
            counts, last_end = list_schedule(slot_ready, dur, trials)
            busy = counts * dur
        return counts, last_end, busy, dur

    def _release(self, lay: Layout, end_or_ready: np.ndarray, ready: np.ndarray, barrier: np.ndarray) -> np.ndarray:
        """When each instance is released: once no slot on it has a task left (never before it is up); a static
        cluster's (``SimOptions.hold_to_end``) not before the stage's barrier."""
        S, n_inst = ready.shape
        if lay.span == 1:
            per = lay.per_instance
            inst_end = end_or_ready if per == 1 else end_or_ready.reshape(S, n_inst, per).max(axis=2)
        else:
            inst_end = np.full((S, n_inst), -np.inf)
            inst_end[:, : lay.slots * lay.span] = np.repeat(end_or_ready, lay.span, axis=1)
        release = np.maximum(inst_end, ready)
        if self.options.hold_to_end:
            release = np.maximum(release, barrier[:, None])
        return release

    def _stage_parts(
        self, config: StageConfig, opening: StageOpening, inst: StageInstances, release: np.ndarray, busy: np.ndarray
    ) -> tuple[dict[str, np.ndarray], np.ndarray]:
        """The stage's open cost per sample by part, and its instances' bill so far (``seg``): each instance from its
        request (a carried one from the stage's start) until its release. Training is the slots' busy time at a
        trial's share of an instance, start-up the new instances' boots, the rest idle; the billing minimums come
        when the stage is finalised."""
        carry = opening.carry
        own_start = inst.request.copy()
        if carry:
            own_start[:, :carry] = opening.start[:, None]
        price = self.price_hr(config.instance_type, config.market) / 3600.0
        S = release.shape[0]
        seg = (release - own_start).sum(axis=1) * price
        train = busy.sum(axis=1) * (config.workers / config.instance_type.workers) * price
        start_cost = (inst.ready - inst.request)[:, carry:].sum(axis=1) * price
        parts = {
            "training": train,
            "startup": start_cost,
            "idle": seg - train - start_cost,
            "billing_minimum": np.zeros(S),
            "transfer": np.full(S, opening.transfer_usd),
        }
        return parts, seg

    def _finish(self, configs: tuple[StageConfig, ...], prefix: StagePrefix, n: int) -> SimResult:
        stage_costs, parts, by_type, *_ = self._finalise(prefix, 0)
        durations = prefix.durations + (prefix.open.barrier - prefix.open.start,)
        jct = prefix.open.barrier
        parts = dict(parts)
        parts["head"] = self.head_cost(configs, jct)
        head = self.head_for(configs)
        if head is not None:
            by_type = dict(by_type)
            by_type[head.instance_type] = by_type.get(head.instance_type, 0.0) + parts["head"]
        cost = sum(parts[k] for k in CATEGORIES)
        events = _add_events(prefix.events, prefix.open.events) or {}
        return SimResult(
            configs=configs,
            jct=jct,
            cost=cost,
            stage_durations=list(durations),
            stage_costs=list(stage_costs),
            breakdown=parts,
            by_type=by_type,
            samples=n,
            spot_events=events,
        )


def _nbytes(prefix: StagePrefix) -> int:
    """Approximate memory held by a cached prefix (its per-instance and per-sample arrays)."""
    rec = prefix.open
    return rec.release.nbytes + rec.request.nbytes + rec.barrier.nbytes * (8 + len(prefix.stage_costs))
