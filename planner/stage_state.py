"""The per-sample state of a plan's stages as the simulator plays them, one stage after another.

A stage is played (:class:`StagePlay`) from what the stages before left (:class:`StageOpening`): its instances
(:class:`StageInstances`) come up, its tasks run, and its outcome per sample is kept (:class:`StageRecord`) for the
next stage, the result and the representative timeline. A plan's played prefix (:class:`StagePrefix`) is what the
simulator caches and shares between candidate plans.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rubberband.planner.plan_space import StageConfig


@dataclass(frozen=True)
class StageRecord:
    """Per-sample outcome of one stage, kept for the final result and for the next stage."""

    config: StageConfig
    start: np.ndarray  # (S,) previous barrier
    anchor: np.ndarray  # (S,) first task start (ahead-of-time requests are timed from it)
    barrier: np.ndarray  # (S,) last task end
    predicted_s: float  # deterministic duration estimate (waves × median task)
    release: np.ndarray  # (S, N) release time per instance
    request: np.ndarray  # (S, N) request time per instance
    cost: np.ndarray  # (S,) open cost (before carry / billing-minimum finalisation)
    parts: dict[str, np.ndarray]
    # recorded only for the representative trace (1 sample)
    trace: dict | None = None
    ready: np.ndarray | None = None  # (S, N) when each instance can take its first trial (bracket hand-overs)
    fallback: np.ndarray | None = None  # (S,) spot stage bought on-demand (no capacity at its request)
    # (S,) of ``cost``, what trials the policy moved to a fall-back type other than the stage's own paid there
    # (0 where the whole stage was bought on-demand: all of its cost is the fall-back type's)
    fallback_usd: np.ndarray | None = None
    events: dict[str, np.ndarray] | None = None  # spot stages: per-sample counts (SimResult.spot_events)
    # serial-provisioning clouds: (submitted, busy) per sample: when the stage's new instances were asked
    # for and how long the provisioner is busy starting them one after another (the provisioning queue)
    provision: tuple[np.ndarray, np.ndarray] | None = None
    # serial-provisioning clouds: when the provisioner has started every new instance of this stage and the
    # stages before (a later stage's first new instance starts no earlier: one provisioner, first come first
    # served); None while no stage had new instances there
    provisioned: np.ndarray | None = None


@dataclass(frozen=True)
class StagePrefix:
    """Finalised accounting of stages before the open one, plus the open stage record."""

    stage_costs: tuple[np.ndarray, ...]
    parts: dict[str, np.ndarray]
    by_type: dict[str, np.ndarray]
    durations: tuple[np.ndarray, ...]
    open: StageRecord
    events: dict[str, np.ndarray] | None = None  # spot events of the finalised stages (summed)


@dataclass(frozen=True, eq=False)
class StagePlay:
    """One stage of a plan as the simulator plays it: its position ``index`` in the job, its ``config``, the
    predicted time of the stages after it (``tail_s``: what a spot fall-back decision counts as still to come; 0
    off spot) and, on a serial-provisioning cloud, when the provisioner is free for its new instances (``free_at``,
    per sample: another bracket's requests before them; None: at once)."""

    index: int
    config: StageConfig
    tail_s: float = 0.0
    free_at: np.ndarray | None = None


@dataclass(frozen=True, eq=False)
class StageOpening:
    """What a stage starts from: the finalised accounting of the stages before it (costs, cost parts, cost by type,
    durations), its ``start`` (the previous stage's barrier; 0 for the job's first), the ``carry`` instances it
    takes over from the previous stage (their request times, their indices there, when they free or come up) and
    the checkpoint transfers its promotion pays (``transfer_usd``: where the trials move)."""

    stage_costs: tuple
    parts: dict[str, np.ndarray]
    by_type: dict[str, np.ndarray]
    durations: tuple
    start: np.ndarray
    carry: int
    carried_request: np.ndarray
    carried_free: np.ndarray
    carried_idx: np.ndarray | None = None
    transfer_usd: float = 0.0


@dataclass(eq=False)
class StageInstances:
    """A stage's instances per sample (samples × instances): when each is requested (billed from) and when it can
    take its first trial; ``t_req``: when its new ones were asked for (None: all carried over); ``provision`` /
    ``provisioned``: a serial-provisioning cloud's queue, as :class:`StageRecord` keeps them."""

    request: np.ndarray
    ready: np.ndarray
    t_req: np.ndarray | None = None
    provision: tuple[np.ndarray, np.ndarray] | None = None
    provisioned: np.ndarray | None = None
