"""Lanes: a plan's brackets as chains of stages, and how they follow one another. Pure: no I/O, no clock.

A *lane* is one bracket's chain of stages with the trials, slots and results of the stage it runs (a SHA plan
is one lane). How lanes relate is the plan's :class:`LaneLayout`:

* **sequential** (SHA, Hyperband with ``brackets: sequential``): lanes start one after another, each when the
  one before has finished, and the stage after a bracket's last is the next bracket's first: it may keep the
  last stage's instances and have its extra ones requested ahead, as any next stage;
* **parallel** (Hyperband with ``brackets: parallel``): lane ``b`` starts ``offsets_s[b]`` seconds after the
  job, as :class:`~rubberband.planner.brackets.ParallelSimulator` predicts, and a stage's successor is the next
  stage of its own bracket; an instance one lane releases may be handed to another lane's waiting request of
  the same type (:meth:`LaneLayout.receiver`).

The remaining work at a re-plan (:meth:`LaneLayout.parts`) follows the same layout: one chain from the
boundary to the end, or each bracket's stages not started yet from when they can start.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from rubberband.executor.placement import Slot
from rubberband.plan import Plan
from rubberband.planner.bracket_ranges import bracket_ranges
from rubberband.planner.policies import bracket_start_order


@dataclass
class Lane:
    """One bracket's progress: the stage it runs (``g``, a plan position) and that stage's trials and slots."""

    bracket: int
    first: int
    end: int
    started: bool = False
    g: int | None = None  # None before its start and after its end
    done: bool = False
    trials: list[str] = field(default_factory=list)
    pending: list[tuple[str, int]] = field(default_factory=list)  # (trial, first epoch to run), in order
    slots: list[Slot] = field(default_factory=list)
    metrics: dict[str, float | None] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)
    trial_seconds: list[float] = field(default_factory=list)  # task times of the stage (not cold)

    def open(self, g: int, trials: list[str]) -> None:
        """Start stage ``g`` with ``trials``: nothing pending, no slots, no results yet."""
        self.g, self.trials = g, list(trials)
        self.pending, self.slots, self.metrics, self.failures, self.trial_seconds = [], [], {}, [], []

    def busy_instances(self) -> set[str]:
        return {i for s in self.slots if not s.free for i in s.instance_ids}

    def drop_instances(self, ids: set[str]) -> None:
        """No more slots on these instances (lost, noticed, released or handed over)."""
        self.slots[:] = [s for s in self.slots if not ids & set(s.instance_ids)]


@dataclass(frozen=True)
class Waiting:
    """A request for an instance that is not up yet: who asked, and whether it has gone out."""

    token: str
    bracket: int
    stage: int  # plan position of the stage it is for
    order: int  # request order (earlier requests would be up first)
    queued: bool  # not yet sent to the provider: cancelling it costs nothing


@dataclass(frozen=True)
class LaneLayout:
    """When lanes start, which stage follows which, and which waiting request a released instance serves.

    ``ranges``: (first, end) plan positions of each bracket's stages; ``offsets_s``: each bracket's start after
    the job's (parallel); ``durations_s``: each bracket's predicted duration; ``parallel``: side by side.
    """

    ranges: tuple[tuple[int, int], ...]
    offsets_s: tuple[float, ...]
    durations_s: tuple[float, ...] = ()
    parallel: bool = False

    @classmethod
    def for_plan(cls, plan: Plan) -> "LaneLayout":
        ranges = bracket_ranges(plan.stages)
        parallel = plan.parallel_brackets
        offsets = list(plan.bracket_offsets_s) if parallel else []
        offsets = (offsets + [0.0] * len(ranges))[: len(ranges)]
        durations = [sum(s.predicted_duration_s or 0.0 for s in plan.stages[lo:hi]) for lo, hi in ranges]
        return cls(tuple(ranges), tuple(float(o) for o in offsets), tuple(durations), parallel)

    @property
    def stages(self) -> int:
        return self.ranges[-1][1] if self.ranges else 0

    def lanes(self, first_bracket_of: Sequence[int]) -> list[Lane]:
        """A fresh lane per bracket (``first_bracket_of[b]``: the bracket number of range ``b``)."""
        return [Lane(bracket=first_bracket_of[b], first=lo, end=hi) for b, (lo, hi) in enumerate(self.ranges)]

    def lane_of(self, g: int) -> int:
        """The lane (its position) stage ``g`` belongs to."""
        return next(b for b, (lo, hi) in enumerate(self.ranges) if lo <= g < hi)

    def next_stage(self, g: int) -> int | None:
        """The stage after ``g`` that may keep its instances: the next of its bracket (parallel) or of the plan."""
        if self.parallel:
            lo, hi = self.ranges[self.lane_of(g)]
            return g + 1 if g + 1 < hi else None
        return g + 1 if g + 1 < self.stages else None

    def due(self, elapsed_s: float, started: Sequence[bool], done: Sequence[bool]) -> list[int]:
        """Lanes not started yet that may start now (``elapsed_s`` since the job started): parallel, those whose
        offset has passed, in the order their instances are requested (:meth:`start_order`); sequential, the
        first not started once every lane before it is done."""
        if self.parallel:
            return self.start_order(
                [b for b, (off, on) in enumerate(zip(self.offsets_s, started)) if not on and elapsed_s >= off]
            )
        for b, (on, finished) in enumerate(zip(started, done)):
            if not finished:
                return [] if on else [b]
        return []

    def start_order(self, lanes: Sequence[int]) -> list[int]:
        """Lanes that start together, the one predicted to end last first: where instances come up one after
        another (the local backend), the critical path gets the first one."""
        return bracket_start_order(
            {b: self.offsets_s[b] + (self.durations_s[b] if b < len(self.durations_s) else 0.0) for b in lanes}
        )

    def receiver(self, giver: int, waiting: Sequence[Waiting]) -> Waiting | None:
        """The request of another lane a released instance of the same type serves, if any (parallel only).

        A request that has not gone out is served first (cancelling it saves its whole bill, as the simulator
        counts a hand-over); among equals the earliest request (it would be up first).
        """
        others = [w for w in waiting if w.bracket != giver] if self.parallel else []
        if not others:
            return None
        return min(others, key=lambda w: (not w.queued, w.order))

    def parts(self, lanes: Sequence[Lane], done_stages: set[int], boundary: tuple[Lane, int] | None) -> list[Part]:
        """Each chain of the remaining work (for :func:`~rubberband.planner.brackets.parallel_remainder`): the
        stages not started yet, where the chain waits (``wait``: ``at_boundary`` — it starts now —, ``running`` —
        after its lane's current stage —, or ``offset`` — at its bracket's offset) and which lane it is.

        Sequential: one chain, every stage from the boundary (or after the stage running) to the end.
        """
        if not self.parallel:
            return [self._sequential_part(lanes, done_stages, boundary)]
        out: list[Part] = []
        for b, lane in enumerate(lanes):
            lo, hi = self.ranges[b]
            if boundary is not None and lane is boundary[0]:
                out.append(Part(b, tuple(range(boundary[1], hi)), "at_boundary"))
            elif lane.done:
                continue
            elif lane.g is not None:
                out.append(Part(b, tuple(range(lane.g + 1, hi)), "running"))
            else:
                first = next((i for i in range(lo, hi) if i not in done_stages), None)
                if first is not None:
                    out.append(Part(b, tuple(range(first, hi)), "offset"))
        return out

    def _sequential_part(self, lanes: Sequence[Lane], done_stages: set[int], boundary: tuple[Lane, int] | None) -> Part:
        if boundary is not None:
            return Part(self.lane_of(boundary[1]), tuple(range(boundary[1], self.stages)), "at_boundary")
        running = next((lane for lane in lanes if lane.g is not None), None)
        if running is not None and running.g is not None:
            return Part(self.lane_of(running.g), tuple(range(running.g + 1, self.stages)), "running")
        first = next((i for i in range(self.stages) if i not in done_stages), self.stages)
        return Part(self.lane_of(first) if first < self.stages else 0, tuple(range(first, self.stages)), "offset")


@dataclass(frozen=True)
class Part:
    """One chain of the remaining work: its lane, the plan positions of its stages not started yet, and what it
    waits for before the first of them (``at_boundary``, ``running``, ``offset``)."""

    lane: int
    positions: tuple[int, ...]
    waits_for: str


__all__ = ["Lane", "LaneLayout", "Part", "Waiting"]
