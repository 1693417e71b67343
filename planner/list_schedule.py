"""List scheduling of a stage's trials onto its slots, vectorised over Monte Carlo samples.

Every trial of a stage is one task; slot ``j`` is free at ``ready_j`` and runs its tasks one after another, each
``dur_j`` long; a task goes to the slot that frees first. :func:`list_schedule` returns, per sample and slot, how
many tasks the slot ran and when its last one ended. Three exact methods give the same answer, chosen by the
case's size: counting a few starts around a Newton guess of the last start (the usual case), a partition of every
start, and a bisection on the count of starts (memory linear in the slots, for the largest cases).
"""

from __future__ import annotations

import math

import numpy as np


def list_schedule(ready: np.ndarray, dur: np.ndarray, trials: int) -> tuple[np.ndarray, np.ndarray]:
    """List scheduling of ``trials`` identical tasks onto slots, vectorised over samples.

    Slot ``j`` is free at ``ready_j`` and each task on it takes ``dur_j``, so its task start times
    form the sequence ``ready_j, ready_j + dur_j, ...``. Dispatching each task to the slot that
    frees first merges these sequences: the tasks start at the ``trials`` smallest values of their
    union (ties go to the lower slot index). Returns per-slot task counts and last end times.

    The ``trials`` smallest are found by counting: each slot's starts up to a guess of the last
    start (where ``Σ_j (t − ready_j)/dur_j + ½ = trials``), then, one start at a time per sample,
    the largest counted start is dropped (ties: the higher slot) or the smallest uncounted one added
    (ties: the lower slot) until ``trials`` are counted. That is the same set, compared on the same
    start values, as :func:`list_schedule_partition` selects (a few steps instead of a partition of
    every start); where the guess is far off it falls back to the partition.
    """
    S, slots = ready.shape
    if slots == 1 and S * trials <= DENSE_STARTS_LIMIT:  # every task on the one slot, one after another
        return np.full((S, 1), trials, dtype=np.int64), slot_starts(ready, dur, trials, trials)[:, -1, :] + dur
    if slots == trials:
        # one task per slot unless some slot finishes its first task before another slot is ready
        if np.all((ready + dur).min(axis=1) > ready.max(axis=1)):
            return np.ones((S, slots), dtype=np.int64), ready + dur
    if not float(dur.min()) > 0:
        return list_schedule_partition(ready, dur, trials)
    K = start_rows(ready, dur, trials)
    if S * K * slots > DENSE_STARTS_LIMIT:
        return list_schedule_bisect(ready, dur, trials)
    starts = slot_starts(ready, dur, trials, K)
    inv = 1.0 / dur
    # the last start t where Σ_j max(0, (t − ready_j)/dur_j + ½) = trials: the root counting every slot
    # (late ones negatively) lies above it; Newton steps from there (the sum is convex) go down to it
    guess = (trials - 0.5 * slots + (ready * inv).sum(axis=1)) / inv.sum(axis=1)
    for _ in range(4):
        active = ready < guess[:, None]
        slope = np.where(active, inv, 0.0).sum(axis=1)
        if not np.all(slope > 0):
            break
        value = np.where(active, (guess[:, None] - ready) * inv + 0.5, 0.0).sum(axis=1)
        step = (value - trials) / slope
        if not np.any(step > 1e-9 * np.abs(guess)):
            break
        guess = guess - np.maximum(step, 0.0)
    counts = (starts <= guess[:, None, None]).sum(axis=1)
    off = counts.sum(axis=1) - trials
    limit = slots // 2 + 4  # one start per step; further off, the partition is quicker
    if int(np.abs(off).max()) > limit:
        return list_schedule_partition(ready, dur, trials, starts)
    rows = np.arange(S)
    columns = np.arange(slots)
    for _ in range(limit + 1):
        over, under = off > 0, off < 0
        if not (over.any() or under.any()):
            break
        if over.any():  # drop the latest counted start (ties: the higher slot)
            r = rows[over]
            c = counts[r]
            last = np.where(c > 0, starts[r[:, None], np.maximum(c - 1, 0), columns], -np.inf)
            j = slots - 1 - np.argmax(last[:, ::-1], axis=1)
            counts[r, j] -= 1
            off[r] -= 1
        if under.any():  # add the earliest uncounted start (ties: the lower slot)
            r = rows[under]
            c = counts[r]
            nxt = np.where(c < K, starts[r[:, None], np.minimum(c, K - 1), columns], np.inf)
            j = np.argmin(nxt, axis=1)
            counts[r, j] += 1
            off[r] += 1
    else:
        return list_schedule_partition(ready, dur, trials, starts)
    last_start = np.take_along_axis(starts, np.maximum(counts - 1, 0)[:, None, :], axis=1)[:, 0, :]
    return counts, last_start + dur


#: Most task starts (samples × starts per slot × slots) the counting and partition schedulers hold at once
#: (160 MB of float64). A larger case (tens of thousands of trials over thousands of slots that start one
#: after another) is scheduled by :func:`list_schedule_bisect`, in memory linear in the slots.
DENSE_STARTS_LIMIT = 20_000_000


def start_rows(ready: np.ndarray, dur: np.ndarray, trials: int) -> int:
    """K: how many starts per slot hold every start among the ``trials`` earliest."""
    slots = ready.shape[1]
    waves = -(-trials // slots)
    dmin = float(dur.min())
    dmax = float(dur.max())
    spread = float((ready.max(axis=1) - ready.min(axis=1)).max())
    return int(min(trials, math.ceil((spread + (waves - 1) * dmax) / dmin) + 1)) if dmin > 0 else trials


def slot_starts(ready: np.ndarray, dur: np.ndarray, trials: int, K: int | None = None) -> np.ndarray:
    """(samples, K, slots): each slot's first K task starts (repeated additions), K enough for every start
    among the ``trials`` earliest (all slots' starts up to the last of them; computed when not given)."""
    S, slots = ready.shape
    K = start_rows(ready, dur, trials) if K is None else K
    starts = np.empty((S, K, slots))
    starts[:, 0, :] = ready
    starts[:, 1:, :] = dur[:, None, :]
    # an accumulation adds one term after another: the same values as adding ``dur`` K − 1 times, in one call
    np.add.accumulate(starts, axis=1, out=starts)
    return starts


def list_schedule_bisect(ready: np.ndarray, dur: np.ndarray, trials: int) -> tuple[np.ndarray, np.ndarray]:
    """:func:`list_schedule` without holding every start: the ``trials``-th earliest start is found by
    bisection on the count of starts up to ``t`` (per slot ``⌊(t − ready_j)/dur_j⌋ + 1``, monotone in ``t``),
    then the starts that fall at it go to the lower slots. Memory linear in the slots; starts are
    ``ready_j + k·dur_j`` (a product, not repeated additions: equal to the other schedulers' within
    rounding)."""
    S, slots = ready.shape

    def count(t: np.ndarray) -> np.ndarray:
        """Per slot, its starts ``ready + k·dur`` at or before ``t``: the quotient's floor, corrected by
        comparing the starts themselves (so slots tied at ``t`` are counted alike, whatever the rounding)."""
        t = t[:, None]
        k = np.floor((t - ready) / dur)
        k = np.where(ready + k * dur > t, k - 1, k)
        k = np.where(ready + (k + 1) * dur <= t, k + 1, k)
        return np.where(t >= ready, k + 1, 0.0)

    lo = ready.min(axis=1) - 1.0  # nothing has started: count 0 < trials
    hi = ready.max(axis=1) + trials * dur.max(axis=1)  # every slot has ≥ trials starts by then
    for _ in range(200):  # halves the bracket until it stops shrinking (float resolution)
        mid = 0.5 * (lo + hi)
        if not np.any((mid > lo) & (mid < hi)):
            break
        enough = count(mid).sum(axis=1) >= trials
        hi = np.where(enough, mid, hi)
        lo = np.where(enough, lo, mid)
    below = count(lo).astype(np.int64)  # fewer than `trials` starts
    at = count(hi).astype(np.int64) - below  # starts in (lo, hi]: at the threshold, to within rounding
    need = trials - below.sum(axis=1)
    take = np.minimum(at, np.maximum(need[:, None] - (np.cumsum(at, axis=1) - at), 0))  # lower slots first
    counts = below + take
    last_start = ready + np.maximum(counts - 1, 0) * dur
    return counts, last_start + dur


def list_schedule_partition(
    ready: np.ndarray, dur: np.ndarray, trials: int, starts: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """:func:`list_schedule` by a partition of every slot's starts: the ``trials``-th smallest start is the
    threshold, ties at it go to the lower slots."""
    S, slots = ready.shape
    if starts is None:
        starts = slot_starts(ready, dur, trials)
    K = starts.shape[1]
    threshold = np.partition(starts.reshape(S, K * slots), trials - 1, axis=1)[:, trials - 1]
    counts = (starts <= threshold[:, None, None]).sum(axis=1)
    excess = counts.sum(axis=1) - trials
    if np.any(excess > 0):
        last_start = np.take_along_axis(starts, np.maximum(counts - 1, 0)[:, None, :], axis=1)[:, 0, :]
        tie = (counts > 0) & (last_start == threshold[:, None])
        rank_from_end = np.cumsum(tie[:, ::-1], axis=1)[:, ::-1]
        counts = counts - (tie & (rank_from_end <= excess[:, None]))
    last_start = np.take_along_axis(starts, np.maximum(counts - 1, 0)[:, None, :], axis=1)[:, 0, :]
    return counts, last_start + dur
