"""Spot stages as the simulator plays them: the market at the request, preemptions, the fall-back and the bill.

A spot stage (:attr:`StageConfig.spot <rubberband.planner.plan_space.StageConfig.spot>`) is played with the
:class:`~rubberband.planner.spot.SpotSetup` of the simulator's settings: at its request the policy decides, per
sample, whether it starts on spot (:meth:`SpotPlay.start`); its tasks are preempted at the scenario's rates and
the policy decides at each preemption whether the replacement stays on spot (:meth:`SpotPlay.preemptions`); its
bill counts what ran on-demand at that price and leaves the waits for capacity unbilled (:meth:`SpotPlay.bill`).
The :class:`~rubberband.planner.simulator.Simulator` owns one :class:`SpotPlay` and calls it from its stage step;
it reads the simulator's job, model and prices.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Sequence

import numpy as np

from rubberband.catalog import InstanceType
from rubberband.planner.model import PerformanceModel, StartupModel
from rubberband.planner.plan_space import StageConfig, layout
from rubberband.planner.schedule import Stage
from rubberband.planner.spot import MAX_PREEMPTIONS, REQUEST_EVENT, SpotScenario, SpotSetup, stay_on_spot
from rubberband.planner.stage_state import StageInstances, StagePlay, StageRecord


class SpotJob(Protocol):
    """What a spot stage's play reads of its simulator: the job, its model and spot set-up, the simulator's
    predictions of a stage's time and its prices."""

    @property
    def stages(self) -> Sequence[Stage]: ...

    @property
    def model(self) -> PerformanceModel: ...

    @property
    def spot_setup(self) -> SpotSetup | None: ...

    def predicted_duration(self, index: int, config: StageConfig, previous: StageConfig | None) -> float: ...

    def task_time(self, index: int, config: StageConfig, previous: StageConfig | None) -> tuple[float, float]: ...

    def price_hr(self, itype: InstanceType, market: str | None = None) -> float: ...

    def startup_model(self, itype: InstanceType) -> StartupModel: ...

    def lead_s(self, itype: InstanceType) -> float: ...

    def epoch_s(self, device: str, workers: int, nodes: int) -> float: ...


@dataclass(frozen=True, eq=False)
class SpotStage:
    """A spot stage being played: its market's ``scenario``, the stage, the samples ``rows``, the samples in which
    the stage is bought on-demand from its start (``fallback``) and how much slower its trials train on their
    fall-back type (``slow``: :meth:`SpotPlay.fallback_slowdown`)."""

    scenario: SpotScenario
    play: StagePlay
    rows: slice
    fallback: np.ndarray
    slow: float


@dataclass(frozen=True, eq=False)
class Preempted:
    """A spot stage's preemptions per task (samples × trials, dispatch order): the seconds they add on the lane
    (``extra``), the seconds run on-demand after the policy moved the trial (``on_demand``) and the seconds waited
    for spot capacity (``waited``, unbilled); per sample the counts of preemptions and of trials moved to
    on-demand (``counts``, 2 × samples)."""

    extra: np.ndarray
    on_demand: np.ndarray
    waited: np.ndarray
    counts: np.ndarray

    def events(self, fallback: np.ndarray) -> dict[str, np.ndarray]:
        """The stage's :data:`~rubberband.planner.simulator.SPOT_EVENTS` per sample (``fallback``: the samples
        bought on-demand at the request)."""
        return {
            "preemptions": self.counts[0],
            "moved_to_on_demand": self.counts[1],
            "stages_on_demand": fallback.astype(float),
            "wait_s": self.waited.sum(axis=1),
        }


class SpotPlay:
    """The spot side of one :class:`~rubberband.planner.simulator.Simulator` (``sim``): its job's stages, model,
    prices and :class:`~rubberband.planner.spot.SpotSetup`."""

    def __init__(self, sim: SpotJob) -> None:
        self.sim = sim

    def start(
        self, play: StagePlay, prev: StageRecord | None, inst: StageInstances, carry: int, rows: slice
    ) -> SpotStage | None:
        """A spot stage's market as it starts (None off spot): the samples in which it runs on-demand on its
        fall-back type (those the stage before fell back in, carried over as on-demand, and those the policy buys
        on-demand at the new instances' request: :meth:`_request`), and the waits for capacity added to the
        new instances' request and ready times (nothing is billed while no capacity is found)."""
        config = play.config
        if not config.spot or self.sim.spot_setup is None:
            return None
        itype = config.instance_type
        scenario = self.sim.spot_setup.scenario(itype.cloud, itype.region, itype.name)
        if scenario is None:
            return None
        fallback = np.zeros(inst.request.shape[0], dtype=bool)
        if carry and prev is not None and prev.fallback is not None:
            fallback = prev.fallback.copy()  # the on-demand instances it fell back to carry over (as on-demand)
        if carry < config.instances and inst.t_req is not None:
            new_fallback, waited = self._request(scenario, play, prev, rows, inst.t_req)
            fallback |= new_fallback
            inst.request[:, carry:] += waited[:, None]
            inst.ready[:, carry:] += waited[:, None]
        return SpotStage(scenario, play, rows, fallback, self.fallback_slowdown(config))

    @property
    def setup(self) -> SpotSetup:
        """The setup a spot stage is played with (a stage has a spot scenario only from one)."""
        if self.sim.spot_setup is None:
            raise AssertionError("a spot stage is played without a SpotSetup")
        return self.sim.spot_setup

    def _replacement_s(self, itype: InstanceType) -> float:
        """Seconds until a replacement ``itype`` trains again: its start-up (median), workers, checkpoint restore."""
        m = self.sim.model
        return self.sim.startup_model(itype).quantile(0.5) + m.worker_start_s + m.restart_overhead_s + m.transfer_time()

    def fallback_slowdown(self, config: StageConfig) -> float:
        """A spot stage's trial on its fall-back type: epoch time there over epoch time on the stage's type."""
        itype = config.instance_type
        moved_to = itype if self.sim.spot_setup is None or not config.spot else self.sim.spot_setup.fallback(itype)
        if moved_to.key == itype.key:
            return 1.0
        span = layout(itype.workers, config.instances, config.workers).span
        epoch = self.sim.epoch_s
        return epoch(moved_to.device, config.workers, span) / epoch(itype.device, config.workers, span)

    def _restart_s(self, itype: InstanceType, checkpoint_s: float) -> float:
        """What the policy counts one more preemption to cost: a replacement's start-up (the prefetch
        quantile), its workers' start, the checkpoint restore, and half a checkpoint interval of lost work."""
        m = self.sim.model
        return self.sim.lead_s(itype) + m.worker_start_s + m.restart_overhead_s + m.transfer_time() + checkpoint_s / 2

    def _request(
        self, scenario: SpotScenario, play: StagePlay, prev: StageRecord | None, rows: slice, t_req: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """A spot stage's request, where the policy decides for the stage's trials (as the executor does
        before it starts them): on-demand when the slack (time left − the stage's predicted time on its
        fall-back type − its bracket's later stages' predicted time, ``play.tail_s`` − one restart) is already
        short (``fallback``: the stage is bought on-demand, on the fall-back type); where the request finds no
        capacity, the policy waits for it (the wait) or buys the stage on-demand. Returns (fallback, wait)
        per sample."""
        setup = self.setup
        index, config = play.index, play.config
        predicted = self.sim.predicted_duration(index, config, None if prev is None else prev.config)
        # the stage as it would run bought on-demand (on the fall-back type), and the later stages
        work = np.full_like(t_req, predicted * self.fallback_slowdown(config) + play.tail_s)
        base, _ = self.sim.task_time(index, config, None if prev is None else prev.config)
        restart = self._restart_s(
            config.instance_type, base / self.sim.stages[index].epochs_this_stage * setup.checkpoint_epochs
        )
        start = stay_on_spot(setup.policy, setup.deadline_s - t_req, work, restart)
        wait = scenario.unavailable_for(index, REQUEST_EVENT, rows, t_req[:, None])[:, 0]
        none = wait > 0
        if not none.any():
            return ~start, np.zeros_like(wait)
        stay = stay_on_spot(setup.policy, setup.deadline_s - t_req, work, restart + scenario.typical_wait_s)
        return ~start | (none & ~stay), np.where(start & none & stay, wait, 0.0)

    def preemptions(self, spot: SpotStage, slot_ready: np.ndarray, task: tuple[float, float]) -> Preempted:
        """A spot stage's preemptions (:class:`Preempted`), its tasks starting on slots free at ``slot_ready``,
        each ``task`` = (``base`` seconds of training, ``overhead``).

        Tasks are played wave by wave on lanes (the first wave starts as the slots come up, each later
        task when its lane's previous task ends, preemptions included), each running ``base`` seconds of
        training after ``overhead``. A preemption at progress ``p`` loses the work since the last
        checkpoint (every ``checkpoint_epochs`` epochs), and the replacement costs its start-up, worker
        start and the checkpoint restore. At each preemption
        :class:`~rubberband.planner.policies.SpotPolicy` decides, with the slack of the whole remaining
        run (this task, the stage's waves after it, the bracket's later stages), whether the replacement
        is spot (it may then find no capacity: wait, or on-demand, decided again) or on-demand (no more
        preemptions for that trial). Whether a trial starts on spot at all is decided for the stage, at
        its request (:meth:`_request`).
        """
        config = spot.play.config
        base, overhead = task
        slots = layout(config.instance_type.workers, config.instances, config.workers).slots
        S, T = slot_ready.shape[0], self.sim.stages[spot.play.index].trials
        lanes = max(1, min(slots, T))
        lane_free = np.sort(slot_ready, axis=1)[:, :lanes].copy()
        waves = -(-T // lanes)
        extra = np.zeros((S, T))
        od = np.zeros((S, T))
        waited = np.zeros((S, T))
        counts = np.zeros((2, S))
        for w in range(waves):
            lo, hi = w * lanes, min(T, (w + 1) * lanes)
            width = hi - lo
            # the stage's later waves on the fall-back, and the later stages
            after = (waves - 1 - w) * (base + overhead) * spot.slow + spot.play.tail_s
            e, o, wt, c = self._wave(spot, w, lane_free[:, :width] + overhead, base, after)
            extra[:, lo:hi], od[:, lo:hi], waited[:, lo:hi] = e, o, wt
            counts += c
            lane_free[:, :width] += base + overhead + e
        return Preempted(extra, od, waited, counts)

    def _wave(
        self, spot: SpotStage, wave: int, now: np.ndarray, base: float, after: float
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """One wave of :meth:`preemptions`: tasks whose training (``base`` seconds) starts at ``now`` (samples ×
        tasks), ``after`` seconds of the run's work predicted after them; returns its per-task (extra, on-demand,
        waited) seconds and per-sample counts, as :class:`Preempted` holds them."""
        setup = self.setup
        scenario, index, config, rows, slow = spot.scenario, spot.play.index, spot.play.config, spot.rows, spot.slow
        stage = self.sim.stages[index]
        itype = config.instance_type
        span = layout(itype.workers, config.instances, config.workers).span
        checkpoint = max(base / stage.epochs_this_stage * setup.checkpoint_epochs, 1e-9)
        decide_restart = self._restart_s(itype, checkpoint)
        restart = self._replacement_s(itype)
        moved_to = setup.fallback(itype)  # where the policy moves a trial: its own type on-demand, or a cheaper one
        restart_moved = self._replacement_s(moved_to)
        shape = now.shape
        progress = np.zeros(shape)
        remaining = np.full(shape, base)
        on_spot = np.broadcast_to(~spot.fallback[:, None], shape).copy()
        extra = np.zeros(shape)
        od = np.zeros(shape)
        waited = np.zeros(shape)
        counts = np.zeros((2, shape[0]))  # preemptions, trials moved to on-demand (per sample)
        for k in range(MAX_PREEMPTIONS):
            active = on_spot & (remaining > 0)
            if not active.any():
                break
            event = wave * MAX_PREEMPTIONS + k
            dt = scenario.time_to_preemption(index, event, rows, now, span)
            hit = active & (dt < remaining)
            remaining = np.where(active & ~hit, 0.0, remaining)
            if not hit.any():
                break
            at = progress + np.where(hit, dt, 0.0)
            saved = np.floor(at / checkpoint + 1e-9) * checkpoint
            t_hit = now + np.where(hit, dt, 0.0)
            work_left = (base - saved) * slow + after  # the trial's rest as it would run on the fall-back
            time_left = setup.deadline_s - t_hit
            stay = stay_on_spot(setup.policy, time_left, work_left, decide_restart)
            none = scenario.unavailable_for(index, event, rows, t_hit) if (hit & stay).any() else np.zeros(shape)
            wait_ok = stay_on_spot(setup.policy, time_left, work_left, decide_restart + scenario.typical_wait_s)
            spot_again = stay & ((none <= 0) | wait_ok)
            w = np.where(hit & spot_again, np.maximum(none, 0.0), 0.0)
            moved = hit & ~spot_again
            # on the lane: the lost work and the replacement's start; a moved trial's rest runs at the
            # fall-back's speed (its extra time here, the rest is in ``base`` already)
            extra += np.where(hit & ~moved, (at - saved) + restart + w, 0.0)
            extra += np.where(moved, (at - saved) + restart_moved + (base - saved) * (slow - 1.0), 0.0)
            waited += w
            counts[0] += hit.sum(axis=1)
            counts[1] += moved.sum(axis=1)
            od += np.where(moved, (base - saved) * slow + restart_moved, 0.0)
            on_spot &= ~moved
            progress = np.where(hit, saved, progress)
            remaining = np.where(hit, base - saved, remaining)
            remaining = np.where(moved, 0.0, remaining)
            now = np.where(hit, t_hit + restart + w, now)
        return extra, od, waited, counts

    def bill(
        self, spot: SpotStage, preempted: Preempted, parts: dict[str, np.ndarray], seg: np.ndarray
    ) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray | None]:
        """A spot stage's open cost parts and bill adjusted for its market: on-demand where it fell back (the whole
        stage, no capacity at its request; or a trial's rest after the policy moved it, its replacement bought
        on-demand), and the waits for spot capacity after a preemption not billed. Returns the parts, the bill and
        (where trials fall back to another type) what was paid on the fall-back type per sample (cost by type)."""
        config, fallback = spot.play.config, spot.fallback
        itype = config.instance_type
        price = self.sim.price_hr(itype, config.market) / 3600.0
        moved_to = self.setup.fallback(itype)
        od_price = moved_to.price(False) / 3600.0
        per_trial = config.workers / itype.workers
        adjust = (
            preempted.on_demand.sum(axis=1) * (od_price - price) - preempted.waited.sum(axis=1) * price
        ) * per_trial
        ratio = np.where(fallback, od_price / price if price > 0 else 1.0, 1.0)
        parts = {k: v * ratio for k, v in parts.items()}
        parts["training"] = parts["training"] + np.where(fallback, 0.0, adjust)
        seg = seg * ratio + np.where(fallback, 0.0, adjust)
        fallback_usd = None
        if moved_to.key != itype.key:  # what moved trials paid on the fall-back type (cost by type)
            fallback_usd = np.where(fallback, 0.0, preempted.on_demand.sum(axis=1) * od_price * per_trial)
        return parts, seg, fallback_usd
