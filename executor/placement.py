"""Trial slots on a stage's instances, the way the simulator lays them out.

With ``c`` workers per instance and ``w`` workers per trial: when ``w ≤ c`` every instance
holds ``floor(c / w)`` trials side by side; when ``w > c`` one trial spans ``ceil(w / c)``
instances (the fewest that hold it), ``c`` workers on each and the remainder on the last.
Trials are dispatched in order to the first free slot, so they run in waves.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from rubberband.cloud.provider import node_resource


@dataclass
class Slot:
    """Room for one trial: the instances it uses and one Ray resource name per worker."""

    instance_ids: tuple[str, ...]
    placement: tuple[str, ...]
    trial_id: str | None = None

    @property
    def free(self) -> bool:
        return self.trial_id is None


def slots_per_instance(workers_per_instance: int, workers_per_trial: int) -> float:
    """Trials per instance (a fraction when a trial spans several instances)."""
    if workers_per_trial <= workers_per_instance:
        return float(workers_per_instance // workers_per_trial)
    return 1.0 / math.ceil(workers_per_trial / workers_per_instance)


def make_slots(instance_ids: list[str], workers_per_instance: int, workers_per_trial: int) -> list[Slot]:
    """Slots over ``instance_ids`` (in order); instances too few to hold a spanning trial stay unused."""
    c, w = workers_per_instance, workers_per_trial
    slots: list[Slot] = []
    if w <= c:
        for instance_id in instance_ids:
            for _ in range(c // w):
                slots.append(Slot((instance_id,), (node_resource(instance_id),) * w))
        return slots
    span = math.ceil(w / c)
    for start in range(0, len(instance_ids) - span + 1, span):
        group = tuple(instance_ids[start : start + span])
        placement: list[str] = []
        left = w
        for instance_id in group:
            take = min(c, left)
            placement.extend([node_resource(instance_id)] * take)
            left -= take
        slots.append(Slot(group, tuple(placement)))
    return slots


def slot_count(instances: int, workers_per_instance: int, workers_per_trial: int) -> int:
    """How many trials ``instances`` instances hold at once (:func:`make_slots` over that many)."""
    return len(make_slots([f"x{i}" for i in range(instances)], workers_per_instance, workers_per_trial))


def waves(trials: int, instances: int, workers_per_instance: int, workers_per_trial: int) -> int:
    """How many rounds ``trials`` need on ``instances`` (0 slots → raises ValueError)."""
    n_slots = slot_count(instances, workers_per_instance, workers_per_trial)
    if n_slots == 0:
        raise ValueError(
            f"{instances} instances of {workers_per_instance} workers cannot hold a trial of "
            f"{workers_per_trial} workers"
        )
    return math.ceil(trials / n_slots)
