"""A lane's stage boundary: the barrier, the ranking and the promotion of the top trials.

:class:`Boundaries` is handed the lane whose stage reached its barrier (every trial reported: the top 1/η is
known only then, :meth:`~rubberband.planner.policies.PrefetchPolicy.may_promote`). It ranks the stage's results
by the spec's metric, promotes the best to the bracket's next stage (each journaled ``trial_promoted``),
closes the stage (``stage_finished``; the search hears the rung's results) and says what comes next: the
bracket's next stage with the promoted trials — re-planned first, at the boundary — or the bracket's end.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Generator

from rubberband.errors import ExecutionError
from rubberband.executor.actions import Action, CloseStage, Promote
from rubberband.executor.decisions import promote
from rubberband.executor.lanes import Lane
from rubberband.executor.scheduling import RunView


@dataclass(frozen=True)
class Crossing:
    """What follows a closed stage: the bracket's next stage and the trials promoted to it (None: the bracket
    ended, with ``finals`` its last rung's results)."""

    next_stage: int | None
    promoted: tuple[str, ...]
    finals: dict[str, float | None]


class Boundaries:
    """Stage barriers and promotion (see the module docstring)."""

    def __init__(self, mode: str) -> None:
        self.mode = mode  # the spec's metric mode: min or max

    def cross(self, lane: Lane, view: RunView) -> Generator[Action, None, Crossing]:
        """Generator returning the :class:`Crossing` of the lane's stage once its barrier is reached: its ranking,
        promotions and close; a stage whose every trial failed fails the run."""
        g = lane.g
        assert g is not None
        trials = lane.trials
        if trials and all(lane.metrics.get(t) is None for t in trials) and lane.failures:
            raise ExecutionError(f"all {len(trials)} trials of stage {g} failed; first error: {lane.failures[0]}")
        metrics = {t: lane.metrics.get(t) for t in trials}
        last = view.plan.last_of_bracket(g)
        keep = None if last else view.plan.stage(g + 1).trials
        ranking, promoted = promote(metrics, self.mode, trials, keep)
        for position, trial_id in enumerate(promoted):
            yield Promote(trial_id=trial_id, from_stage=g, to_stage=g + 1, metric=metrics[trial_id], rank=position)
        yield CloseStage(stage=g, metrics=metrics, promoted=tuple(promoted), ranking=tuple(ranking), last=last)
        return Crossing(None if last else g + 1, tuple(promoted), metrics if last else {})
