"""Successive halving and Hyperband schedules: how many trials run to how many epochs.

SHA with n trials, reduction factor η, minimum r and maximum R epochs runs stage i with
n_i = floor(n·η^-i) trials to r_i = min(r·η^i, R) cumulative epochs, until R is reached or
a single trial is left. Hyperband (Li et al.) runs brackets s = s_max..0 with
s_max = floor(log_η(R/r)), B = (s_max+1)·R, n = ceil(B/R · η^s/(s+1)) trials starting at
R·η^-s epochs. ASHA (asynchronous SHA, Ray Tune's ``ASHAScheduler``) has no stages, only rungs at
r·η^k < R and R (:func:`rungs`); :func:`asha_stages` gives one stage per rung so that an ASHA plan
has the shape of a SHA plan (its stages are the rungs, the phases of :mod:`~rubberband.planner.asha`).
Pure functions; integer arithmetic so R=81, η=3 matches the paper exactly. No imports from the rest
of the planner: the spec loads this module, and the planner's modules import it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Stage:
    """One rung: ``trials`` trials each trained to ``epochs`` cumulative epochs."""

    bracket: int
    index: int
    trials: int
    epochs: int
    epochs_this_stage: int


def _floor_log(ratio_num: int, ratio_den: int, eta: int) -> int:
    """Largest s with den·η^s ≤ num (exact, no floating point)."""
    s = 0
    while ratio_den * eta ** (s + 1) <= ratio_num:
        s += 1
    return s


def sha_default_trials(eta: int, min_epochs: int, max_epochs: int) -> int:
    """Trials for SHA when none are given: n = η^s_max, s_max = floor(log_η(R/r)), as Hyperband's bracket s_max.

    That many trials halve (by η) down to exactly one survivor at the last rung.
    """
    if eta < 2 or min_epochs < 1 or max_epochs < min_epochs:
        raise ValueError("need eta ≥ 2 and 1 ≤ min_epochs ≤ max_epochs")
    return eta ** _floor_log(max_epochs, min_epochs, eta)


def sha_stages(trials: int, eta: int, min_epochs: int, max_epochs: int, *, bracket: int = 0) -> list[Stage]:
    """Stages of one successive-halving run."""
    if trials < 1 or eta < 2 or min_epochs < 1 or max_epochs < min_epochs:
        raise ValueError("need trials ≥ 1, eta ≥ 2 and 1 ≤ min_epochs ≤ max_epochs")
    stages: list[Stage] = []
    previous_epochs = 0
    i = 0
    while True:
        n_i = trials // eta**i
        if n_i < 1:
            break
        r_i = min(min_epochs * eta**i, max_epochs)
        stages.append(Stage(bracket, i, n_i, r_i, r_i - previous_epochs))
        previous_epochs = r_i
        if r_i >= max_epochs or n_i == 1:
            break
        i += 1
    return stages


def hyperband_brackets(eta: int, min_epochs: int, max_epochs: int) -> list[list[Stage]]:
    """Every Hyperband bracket, most exploratory (s = s_max) first."""
    if eta < 2 or min_epochs < 1 or max_epochs < min_epochs:
        raise ValueError("need eta ≥ 2 and 1 ≤ min_epochs ≤ max_epochs")
    s_max = _floor_log(max_epochs, min_epochs, eta)
    brackets = []
    for b, s in enumerate(range(s_max, -1, -1)):
        # n = ceil((s_max+1)/(s+1) · η^s), exactly
        n = -(-((s_max + 1) * eta**s) // (s + 1))
        stages: list[Stage] = []
        previous = 0
        for i in range(s + 1):
            n_i = n // eta**i
            r_i = max_epochs * eta**i // eta**s
            stages.append(Stage(b, i, n_i, r_i, r_i - previous))
            previous = r_i
        brackets.append(stages)
    return brackets


def rungs(eta: int, min_epochs: int, max_epochs: int) -> list[int]:
    """Cumulative epochs at which a trial reports (Ray Tune's milestones), ending with ``max_epochs``."""
    out = []
    r = min_epochs
    while r < max_epochs:
        out.append(r)
        r *= eta
    return out + [max_epochs]


def asha_stages(trials: int, eta: int, min_epochs: int, max_epochs: int) -> list[Stage]:
    """One stage per ASHA rung (bracket 0, stage ``k`` = rung ``k``), trained to the rung's cumulative epochs.

    ``trials`` of stage ``k`` is ``max(1, trials // η^k)``, the survivors synchronous SHA would promote: ASHA's
    own count varies from run to run (a trial continues when its result is in the top 1/η of those reported
    so far), so it serves for display and per-rung figures only. Unlike :func:`sha_stages` the rungs go on to
    ``max_epochs`` even where that figure reaches 1 (ASHA has no "one trial left" stop)."""
    if trials < 1 or eta < 2 or min_epochs < 1 or max_epochs < min_epochs:
        raise ValueError("need trials ≥ 1, eta ≥ 2 and 1 ≤ min_epochs ≤ max_epochs")
    stages: list[Stage] = []
    previous = 0
    for k, epochs in enumerate(rungs(eta, min_epochs, max_epochs)):
        stages.append(Stage(0, k, max(1, trials // eta**k), epochs, epochs - previous))
        previous = epochs
    return stages


def stages_for(kind: str, *, trials: int | None, eta: int, min_epochs: int, max_epochs: int) -> list[Stage]:
    """All stages of a job in execution order (Hyperband brackets run one after another; ASHA: its rungs)."""
    if kind in ("sha", "asha"):
        if trials is None:
            raise ValueError(f"{kind.upper()} needs a number of trials")
        if kind == "asha":
            return asha_stages(trials, eta, min_epochs, max_epochs)
        return sha_stages(trials, eta, min_epochs, max_epochs)
    if kind != "hyperband":
        raise ValueError(f"unknown scheduler kind {kind!r}: use sha, hyperband or asha")
    return [stage for bracket in hyperband_brackets(eta, min_epochs, max_epochs) for stage in bracket]
