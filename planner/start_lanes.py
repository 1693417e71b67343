"""Trial starts that contend for an instance's cores, played by processor sharing: how the ASHA simulator
(:mod:`rubberband.planner.asha`) starts Ray Tune's trials, each a new worker process (``reuse_actors=False``).

Pure and event-driven: the simulator adds a start when a slot takes a trial and asks when the next start
completes; nothing here knows rungs, slots' layouts or clocks."""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["StartLanes", "TrialStart"]


@dataclass(slots=True, eq=False)
class TrialStart:
    """One trial start in progress: the work it has left (seconds alone), when it began, whose it is and where."""

    remaining: float
    began: float
    trial: int
    slot: int
    instance: int

    @property
    def done(self) -> bool:
        return self.remaining <= 1e-9


class StartLanes:
    """Trial starts in progress when they contend: each needs ``work`` seconds alone
    (``task_start_s``); the starts in progress on one instance (``domain``; every instance on a shared host) share
    ``concurrency`` start lanes by processor sharing, each progressing at min(1, concurrency / n) while n are in
    progress. That is how Ray Tune's trial actors start (``reuse_actors=False``, its default: a new
    worker process per trial, whose interpreter and imports start on the node's few cores).

    An instance's starts complete in the order they began: its raylet starts the worker processes of Ray Tune's
    trials in the order their leases came, and of two trials starting together on one node the first queued
    reported first in 6 of 7 real passes of bench/bench_asha_ray.py's workload B, whatever their starts' spread.
    A start whose work is done before an earlier one's on its instance waits for it (holding no start lane) and
    completes with it. Across instances nothing orders them."""

    def __init__(self, concurrency: float, work: float) -> None:
        self.concurrency = concurrency
        self.work = work
        self._queued: dict[int, list[TrialStart]] = {}  # domain -> its starts not yet complete, in the order they began
        self._updated: dict[int, float] = {}

    def _rate(self, running: int) -> float:
        return min(1.0, self.concurrency / running)

    def _advance(self, domain: int, t: float) -> None:
        running = [a for a in self._queued.get(domain, []) if not a.done]
        if running:
            done = (t - self._updated[domain]) * self._rate(len(running))
            for a in running:
                a.remaining -= done
        self._updated[domain] = t

    def add(self, domain: int, start: TrialStart) -> None:
        """``start`` begins (at ``start.began``) among ``domain``'s."""
        self._advance(domain, start.began)
        self._queued.setdefault(domain, []).append(start)

    @staticmethod
    def _ready(queued: list[TrialStart]) -> list[TrialStart]:
        """The starts whose work is done and after which no start that began earlier on their instance is still in
        progress."""
        waiting: set[int] = set()
        out = []
        for a in queued:
            if not a.done:
                waiting.add(a.instance)
            elif a.instance not in waiting:
                out.append(a)
        return out

    def _domain_next(self, domain: int) -> float:
        """When the domain's next start completes (now, where one is ready)."""
        queued = self._queued[domain]
        if self._ready(queued):
            return self._updated[domain]
        running = [a for a in queued if not a.done]
        return self._updated[domain] + min(a.remaining for a in running) / self._rate(len(running))

    def next_time(self) -> float:
        return min((self._domain_next(d) for d, q in self._queued.items() if q), default=math.inf)

    def pop_done(self) -> list[tuple[float, float, int, int]]:
        """The starts completing at :meth:`next_time` (time, began, trial, slot), in trial order: those whose work
        is then done and that no earlier start on their instance still holds back."""
        t = self.next_time()
        out: list[TrialStart] = []
        for domain, queued in self._queued.items():
            if not queued or self._domain_next(domain) > t + 1e-9:
                continue
            self._advance(domain, t)
            ready = self._ready(queued)
            out += ready
            self._queued[domain] = [a for a in queued if a not in ready]
        return sorted(((t, a.began, a.trial, a.slot) for a in out), key=lambda x: x[2])
