"""The state a simulated run's stand-ins share: a virtual clock, the performance model, seeded draws, the
simulated instances and what is due when — and a script of events a test plays on top of the draws.

:class:`SimWorld` draws what a real run meets (start-ups from the model's start-up samples, stragglers per
instance and stage, each configuration's speed, spot preemptions and sold-out spot requests from the plan's spot
model) and keeps the simulated instances. :class:`SimScript` adds scripted events, counted by the order in which
instances come into being: a preemption notice or a loss some seconds after an instance is up, and instance
types that failover finds sold out in every zone. See :mod:`rubberband.executor.simulated` for what the
stand-ins do with it.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import numpy as np
from scipy.special import ndtr, ndtri

from rubberband.catalog import InstanceType
from rubberband.cloud.backend import Obtained
from rubberband.cloud.provider import Instance
from rubberband.executor.clock import VirtualClock
from rubberband.planner.model import PerformanceModel
from rubberband.planner.noise import task_factors
from rubberband.planner.spot import ZoneModel

#: The stream of spot draws (preemptions, capacity): its own, keyed by the run's seed.
_SPOT_STREAM = 0x5B07
#: What a scripted loss of an on-demand instance is reported as (``check_lost``).
LOST = "lost"
#: What the cloud reports for a spot instance it took back.
SPOT_INTERRUPTION = "spot-interruption"


class SimWorkerDied(RuntimeError):
    """A trial's workers died with their (lost) instance: what Ray raises then (a dead actor / node), an ordinary
    error for the executor, which asks the cloud whether the instance is gone."""


@dataclass(frozen=True)
class SimScript:
    """Scripted events on top of the draws. Instances are counted as they come into being (1: the run's first);
    times are seconds after that instance is up.

    ``notices``: when an instance's preemption notice is posted (its trials stop after their next checkpoint);
    ``losses``: when an instance is taken away (spot: a spot interruption; else lost, as a dead node);
    ``sold_out``: instance type names with no capacity in any zone for the whole run (failover obtains an
    alternative for every request of them, and the cloud reports them unavailable throughout);
    ``stock``: instance type names of which only so many instances can be launched: after that the type is sold
    out in every zone, reported unavailable from the first request that found none (a stockout mid-run).
    """

    notices: Mapping[int, float] = field(default_factory=dict)
    losses: Mapping[int, float] = field(default_factory=dict)
    sold_out: frozenset[str] = frozenset()
    stock: Mapping[str, int] = field(default_factory=dict)


@dataclass
class SimInstance:
    instance: Instance
    itype: InstanceType
    up_at: float
    ended_at: float | None = None
    ran_trial: bool = False
    spot: bool = False  # the market it runs on (on-demand after a spot request fell over)
    taken_at: float | None = None  # when the cloud takes it back (spot preemption, scripted loss; None: never)
    taken_why: str = SPOT_INTERRUPTION
    notice_at: float | None = None  # when its preemption notice is posted (scripted)
    obtained: Obtained | None = None  # what failover reports for it, when it is not what was asked

    def taken(self, now: float) -> bool:
        """Whether the cloud has taken it back by ``now`` (before the executor terminated it)."""
        return (
            self.taken_at is not None
            and self.taken_at <= now
            and (self.ended_at is None or self.ended_at >= self.taken_at)
        )

    def running(self, now: float) -> bool:
        return self.ended_at is None and not self.taken(now)


@dataclass(frozen=True)
class SimSettings:
    """How a simulated run is drawn: its seed, the longest stretch one wait may skip, the spec's metric (the
    stand-in learning curves), the plan's spot model per (cloud, region, type), and a script. ``curve``: the
    metric a configuration reports after a (0-based) epoch — a recorded table replayed
    (``bench/bench_search_regret.py``) — instead of the stand-in."""

    seed: int = 0
    max_step_s: float = 1.0
    metric_name: str = "loss"
    metric_mode: str = "min"
    spot_zones: Mapping[tuple[str, str, str], ZoneModel] = field(default_factory=dict)
    script: SimScript = field(default_factory=SimScript)
    curve: Callable[[dict[str, Any], int], float] | None = None


class SimWorld:
    """The state the stand-ins share (see the module docstring)."""

    def __init__(self, model: PerformanceModel, clock: VirtualClock, settings: SimSettings) -> None:
        if not settings.max_step_s > 0 or not math.isfinite(settings.max_step_s):
            raise ValueError(f"max_step_s must be a positive number of seconds, got {settings.max_step_s!r}")
        self.model = model
        self.clock = clock
        self.settings = settings
        self.seed = settings.seed
        self.max_step_s = settings.max_step_s
        self.metric_name, self.metric_mode = settings.metric_name, settings.metric_mode
        self.script = settings.script
        self.rng = np.random.default_rng(settings.seed)
        self.spot_zones = dict(settings.spot_zones)
        self.spot_rng = np.random.Generator(
            np.random.PCG64(np.random.SeedSequence(self.seed, spawn_key=(_SPOT_STREAM,)))
        )
        self._no_capacity_until: dict[tuple[str, str, str], float] = {}
        self._capacity_drawn: dict[tuple[str, str, str], tuple[float, bool]] = {}  # key -> (at, had capacity)
        self._found_none: set[str] = set()  # type keys a request found sold out (a stock launched)
        self.interrupted: set[str] = set()  # trials whose last task died with its instance: the next one restores
        self.instances: dict[str, SimInstance] = {}
        self.by_resource: dict[str, str] = {}
        self.pending: dict[int, float] = {}  # id(side call) -> when it is done
        self.due: dict[int, float] = {}  # id(trial or notice ref) -> when it is ready
        self._stragglers: dict[tuple[str, int], float] = {}
        self._speeds: dict[str, float] = {}
        self._placements: dict[str, tuple[str, int]] = {}
        self.call_start: float | None = None  # when the side call being run inline starts (its thread is free)
        self.call_due: float | None = None  # when it ends, if later than its start (set by the call)

    # -- draws -----------------------------------------------------------------------------
    def startup_s(self, itype: InstanceType) -> float:
        return float(self.model.startup(itype.cloud, itype.name).sample(np.array([self.rng.random()]))[0])

    def spot_zone(self, itype: InstanceType) -> ZoneModel | None:
        """The spot model of a type's (cloud, region, type); None: spot there is never preempted nor sold out."""
        return self.spot_zones.get((itype.cloud, itype.region, itype.name))

    def preemption_after_s(self, zone: ZoneModel) -> float:
        """How long a spot instance runs before the cloud takes it back: exponential at the zone's rate (the
        simulator's ``time_to_preemption``, ``-log(1 - u) / rate``)."""
        rate_s = zone.preemption_rate_per_h / 3600.0
        if rate_s <= 0:
            return math.inf
        return float(-math.log1p(-self.spot_rng.random()) / rate_s)

    def spot_capacity(self, zone: ZoneModel, at: float) -> bool:
        """Whether a spot request at ``at`` finds capacity in the zone: none while an earlier draw's unavailability
        lasts; else none with ``p_unavailable``, for a duration drawn from ``unavailable_s``. Requests at the same
        moment share one draw."""
        key = zone.key
        drawn = self._capacity_drawn.get(key)
        if drawn is not None and drawn[0] == at:
            return drawn[1]
        if at < self._no_capacity_until.get(key, -math.inf):
            found = False
        else:
            hit, u = self.spot_rng.random(2)
            found = not hit < zone.p_unavailable
            if not found:
                wait = float(zone.sample_unavailable(np.array([u]))[0])
                self._no_capacity_until[key] = at + max(wait, 1.0)
        self._capacity_drawn[key] = (at, found)
        return found

    def straggler(self, instance_id: str, stage_key: int) -> float:
        """The instance's straggler factor for one stage (drawn anew each stage, as the simulator does)."""
        key = (instance_id, stage_key)
        if key not in self._stragglers:
            sigma = self.model.straggler_sigma
            self._stragglers[key] = math.exp(sigma * self.rng.standard_normal()) if sigma > 0 else 1.0
        return self._stragglers[key]

    def speed(self, trial_id: str, epochs: int) -> float:
        """A task's speed factor: its configuration's (drawn once per trial) × the mean of its epochs'."""
        variation = self.model.variation
        if not variation.active:
            return 1.0
        z_trial = np.array([self._speed_z(trial_id)])
        return float(task_factors(variation, z_trial, np.array([self.rng.standard_normal()]), epochs)[0])

    def _speed_z(self, trial_id: str) -> float:
        """The trial's configuration speed as a standard normal (larger: slower), drawn once."""
        if trial_id not in self._speeds:
            self._speeds[trial_id] = float(self.rng.standard_normal())
        return self._speeds[trial_id]

    def quality(self, trial_id: str) -> float:
        """The stand-in quality of a trial's configuration in (0, 1), lower better: seeded by the run's seed and its
        id, and as correlated with its slowness as the model says (``variation.speed_quality_rho`` > 0: the slow
        configurations are the good ones), where configurations differ in speed."""
        digest = hashlib.sha256(f"{self.seed}:{trial_id}".encode()).digest()
        u = int.from_bytes(digest[:8], "big") / 2**64
        variation = self.model.variation
        rho = variation.speed_quality_rho
        if rho == 0.0 or variation.config_sigma == 0.0:
            return u
        own = float(ndtri(u + 0.5 / 2**64))  # the part independent of speed, as a standard normal
        latent = rho * self._speed_z(trial_id) + math.sqrt(max(0.0, 1.0 - rho * rho)) * own
        return float(ndtr(-latent))

    def metric(self, trial_id: str, epoch: int, config: dict[str, Any] | None = None) -> float:
        """The settings' curve for ``config``, else a learning curve that falls with epochs and ranks trials by
        quality (``max``: mirrored)."""
        curve = self.settings.curve
        if curve is not None and config is not None:
            return float(curve(config, epoch))
        loss = self.quality(trial_id) + 1.0 / (epoch + 1)  # in (0, 2)
        return loss if self.metric_mode == "min" else 1.0 - loss / 2.0

    def moved(self, trial_id: str, placement: tuple[str, int]) -> bool:
        """Whether a trial restarts elsewhere (another type or width than its last task's): restart + transfer."""
        before = self._placements.get(trial_id)
        self._placements[trial_id] = placement
        return before is not None and before != placement

    # -- instances ---------------------------------------------------------------------------
    def add(self, sim: SimInstance, preempted_after_s: float | None) -> None:
        """A new simulated instance: its spot preemption (drawn) and its scripted notice and loss."""
        count = len(self.instances) + 1
        if preempted_after_s is not None and math.isfinite(preempted_after_s):
            sim.taken_at = sim.up_at + preempted_after_s
        loss = self.script.losses.get(count)
        if loss is not None and (sim.taken_at is None or sim.up_at + loss < sim.taken_at):
            sim.taken_at, sim.taken_why = sim.up_at + loss, SPOT_INTERRUPTION if sim.spot else LOST
        notice = self.script.notices.get(count)
        if notice is not None:
            sim.notice_at = sim.up_at + notice
        self.instances[sim.instance.id] = sim

    def sold_out(self, itype: InstanceType) -> bool:
        """Whether a request of ``itype`` finds no capacity in any zone now (scripted, or its stock launched)."""
        if itype.name in self.script.sold_out or itype.key in self.script.sold_out:
            return True
        stock = self.script.stock.get(itype.name)
        if stock is not None and sum(1 for s in self.instances.values() if s.itype.key == itype.key) >= stock:
            self._found_none.add(itype.key)
            return True
        return False

    def unavailable(self, itype: InstanceType) -> bool:
        """Whether the cloud reports ``itype`` unavailable: scripted sold out, or a request found none of it."""
        return itype.name in self.script.sold_out or itype.key in self.script.sold_out or itype.key in self._found_none

    # -- time ------------------------------------------------------------------------------
    def next_event(self, refs: list[Any]) -> float | None:
        """The earliest virtual time after now at which one of ``refs`` is ready (a trial ends, a notice comes),
        a side call is done or an instance is taken back."""
        now = self.clock.time()
        times = [self.due[id(r)] for r in refs if id(r) in self.due]
        times += [t for t in self.pending.values() if t > now]
        times += [
            s.taken_at
            for s in self.instances.values()  # an idle instance's loss is seen then
            if s.ended_at is None and s.taken_at is not None and s.taken_at > now
        ]
        return min(times) if times else None
