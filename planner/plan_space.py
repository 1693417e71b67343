"""What a plan is made of: each stage's resources (:class:`StageConfig`), how its trials map onto them
(:class:`Layout`), and the run's billed head (:class:`HeadSpec`).

Pure values and the arithmetic of slots and waves that the simulators, the search, the bounds and the baselines
share; nothing here simulates.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property, lru_cache
from operator import attrgetter
from typing import Sequence

from rubberband.catalog import InstanceType
from rubberband.planner.schedule import Stage


@dataclass(frozen=True)
class HeadSpec:
    """The run's billed head instance on one cloud: a fixed per-run overhead of every plan there.

    Billed (the cloud's :func:`~rubberband.clouds.billing_rule`) at ``price_hr`` for
    ``boot_s + JCT + grace_s``: it is requested ``boot_s`` before the job starts (its boot, Ray
    head, submission; None: the performance model's median start-up of ``instance_type`` on
    ``cloud``) and stays ``grace_s`` after the job ends (the watchdog's results grace).
    """

    cloud: str
    instance_type: str
    price_hr: float
    grace_s: float = 0.0
    boot_s: float | None = None

    @classmethod
    def of(cls, itype: InstanceType, *, grace_s: float = 0.0, boot_s: float | None = None) -> "HeadSpec":
        """The head of ``itype`` (on-demand)."""
        return cls(cloud=itype.cloud, instance_type=itype.name, price_hr=itype.price_hr, grace_s=grace_s, boot_s=boot_s)


@dataclass(frozen=True)
class StageConfig:
    """Resources of one stage: ``instances`` × ``instance_type``, ``workers`` per trial, bought on ``market``
    (``on_demand`` or ``spot``: :class:`~rubberband.planner.policies.Market` values)."""

    instance_type: InstanceType
    instances: int
    workers: int
    market: str = "on_demand"

    @cached_property  # read millions of times while planning
    def key(self) -> tuple:
        if self.market == "on_demand":
            return (self.instance_type.key, self.instances, self.workers)
        return (self.instance_type.key, self.instances, self.workers, self.market)

    @property
    def spot(self) -> bool:
        return self.market == "spot"

    def on(self, market: str) -> "StageConfig":
        """The same resources bought on ``market``."""
        return self if market == self.market else StageConfig(self.instance_type, self.instances, self.workers, market)

    @property
    def placement(self) -> tuple:
        """Where a trial runs: a change of type, width or market at a promotion moves it (checkpoint restore)."""
        return (self.instance_type.key, self.workers, self.market)


def plan_key(configs: Sequence[StageConfig]) -> tuple:
    """A plan's identity (its stages' :attr:`StageConfig.key`), the key of every cache of the simulators and the
    search: computed for every candidate, so in one C-level pass."""
    return tuple(map(_config_key, configs))


_config_key = attrgetter("key")


@dataclass(frozen=True)
class Layout:
    """How trials map onto instances: ``per_instance`` slots per instance or ``span`` instances per slot."""

    per_instance: int
    span: int
    slots: int

    @property
    def nodes(self) -> int:
        return self.span


@lru_cache(maxsize=65536)  # a pure function of three ints, called for every candidate's every stage
def layout(capacity: int, instances: int, workers: int) -> Layout:
    if workers <= capacity:
        p = capacity // workers
        return Layout(per_instance=p, span=1, slots=instances * p)
    k = -(-workers // capacity)
    return Layout(per_instance=0, span=k, slots=instances // k)


def useful_instances(trials: int, capacity: int, workers: int) -> int:
    """Instances that run every trial of a stage in one wave."""
    if workers <= capacity:
        return -(-trials // (capacity // workers))
    return trials * -(-workers // capacity)


def efficient_counts(trials: int, capacity: int, workers: int) -> list[int]:
    """Instance counts at which the number of waves changes (others only add idle instances)."""
    counts = set()
    for waves in range(1, trials + 1):
        slots = -(-trials // waves)
        if workers <= capacity:
            counts.add(-(-slots // (capacity // workers)))
        else:
            counts.add(slots * -(-workers // capacity))
    return sorted(counts)


def normalise(config: StageConfig, trials: int) -> StageConfig:
    """Round the instance count of spanning trials to whole spans (at least one span).

    Counts above what the stage can use are kept: those instances idle (a static cluster).
    """
    cap = config.instance_type.workers
    n = config.instances
    if config.workers > cap:
        k = -(-config.workers // cap)
        n = max(k, n // k * k)
    return config if n == config.instances else StageConfig(config.instance_type, n, config.workers, config.market)


def prepare_plan(
    stages: Sequence[Stage], configs: Sequence[StageConfig], samples: int | None, available: int
) -> tuple[tuple[StageConfig, ...], int]:
    """A full plan (one StageConfig per stage) normalised, and the number of samples to use (``samples``, at
    most ``available``; None: all)."""
    if len(configs) != len(stages):
        raise ValueError("one StageConfig per stage is required")
    return (
        tuple(normalise(c, s.trials) for c, s in zip(configs, stages)),
        available if samples is None else min(samples, available),
    )
