"""The executor's provisioning queue on clouds that start instances one after another.

The executor hands every instance request to one provisioner (a single thread, first come first
served); on a cloud in :data:`~rubberband.catalog.SERIAL_PROVISIONING` (the local backend: two
``ray start`` at once race for ports) a request occupies it until its instance is up. Parallel
Hyperband brackets share that queue: brackets that start together come up one after another, and a
bracket's ahead-of-time request waits behind another bracket's start-ups.

The simulator plays each stage's new instances as a *batch*: submitted at ``t`` (its request time),
it occupies the provisioner for the sum of its instances' start-ups. :func:`fifo_starts` serves the
batches of one job in the executor's order (submission time, ties in the order the executor sends
them), vectorised over Monte Carlo samples; :class:`ProvisionQueue` carries the result (when each
stage's first instance may start) into a :class:`~rubberband.planner.simulator.Simulator`. Pure: no
I/O, no clock.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np


def fifo_starts(submitted: np.ndarray, busy: np.ndarray, rank: Sequence[int]) -> np.ndarray:
    """When each batch's first instance starts on a single first-come-first-served provisioner.

    ``submitted`` and ``busy`` are (samples, batches): when a batch is asked for and how long it keeps
    the provisioner busy; ``rank`` (batches,) breaks ties between batches submitted at the same moment
    (lower first: the order the executor sends them in). Returns (samples, batches):
    ``max(submitted, when the batches served before it are done)``.
    """
    submitted = np.asarray(submitted, dtype=float)
    busy = np.asarray(busy, dtype=float)
    S, m = submitted.shape
    ranks = np.broadcast_to(np.asarray(rank, dtype=float), (S, m))
    order = np.lexsort((ranks, submitted), axis=-1)
    sub = np.take_along_axis(submitted, order, axis=1)
    dur = np.take_along_axis(busy, order, axis=1)
    starts = np.empty_like(sub)
    free = np.full(S, -np.inf)
    for j in range(m):
        starts[:, j] = np.maximum(sub[:, j], free)
        free = starts[:, j] + dur[:, j]
    out = np.empty_like(starts)
    np.put_along_axis(out, order, starts, axis=1)
    return out


@dataclass(frozen=True)
class ProvisionQueue:
    """Per stage of one simulator: when the provisioner is free for the stage's new instances (per sample,
    in that simulator's clock), or None where the stage waits for nobody.

    A stage's first new instance starts at ``max(its request, free_at)``; the rest follow one after
    another as before. :meth:`digest` keys the simulator's prefix cache.
    """

    free_at: tuple[np.ndarray | None, ...]
    _digests: dict = field(default_factory=dict, compare=False, repr=False)

    def at(self, stage: int, rows: slice) -> np.ndarray | None:
        """Stage ``stage``'s free times for samples ``rows`` (None: no wait)."""
        free = self.free_at[stage] if stage < len(self.free_at) else None
        return None if free is None else free[rows]

    def waits_before(self, upto: int) -> bool:
        """Whether any of the first ``upto`` stages waits."""
        return any(f is not None for f in self.free_at[:upto])

    def digest(self, upto: int) -> tuple:
        """A hashable key of the first ``upto`` stages' free times."""
        key = self._digests.get(upto)
        if key is None:
            key = tuple(
                None if f is None else hashlib.blake2b(np.ascontiguousarray(f).tobytes(), digest_size=16).digest()
                for f in self.free_at[:upto]
            )
            self._digests[upto] = key
        return key

    @staticmethod
    def same(a: "ProvisionQueue | None", b: "ProvisionQueue | None") -> bool:
        """Whether two queues make the same waits (None: no waits)."""
        fa = () if a is None else a.free_at
        fb = () if b is None else b.free_at
        n = max(len(fa), len(fb))
        fa = tuple(fa) + (None,) * (n - len(fa))
        fb = tuple(fb) + (None,) * (n - len(fb))
        return all(
            (x is None and y is None) or (x is not None and y is not None and np.array_equal(x, y))
            for x, y in zip(fa, fb)
        )


__all__ = ["ProvisionQueue", "fifo_starts"]
