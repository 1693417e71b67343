"""Where a report's facts come from: a plan alone now, a plan plus what actually happened later.

A :class:`ReportSource` hands the report a :class:`~rubberband.plan.Plan` and, when it knows
them, the actual outcome of running it (:class:`ActualOutcome`). :class:`PlanSource` is the
plan-only source; a run directory's source (``RunSource``, written with the executor) returns
the plan it ran plus an ``ActualOutcome``, and the report then adds its predicted-vs-actual
overlay (actual Gantt beside the planned one, actual JCT and cost marked on the predicted
distributions) without any other change.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, runtime_checkable

from rubberband.plan import Plan, Timeline, load_plan


@dataclass(frozen=True)
class ActualOutcome:
    """What a finished (or stopped) run measured, in the plan's units."""

    jct_s: float
    cost_usd: float
    timeline: Timeline
    stage_duration_s: tuple[float, ...] = ()
    stage_cost_usd: tuple[float, ...] = ()
    completed: bool = True


@runtime_checkable
class ReportSource(Protocol):
    """Anything a report can be made from."""

    @property
    def plan(self) -> Plan: ...

    @property
    def label(self) -> str: ...

    def actual(self) -> ActualOutcome | None: ...


@dataclass(frozen=True)
class PlanSource:
    """A plan on its own: the report shows predictions only."""

    plan: Plan
    label: str = "plan"

    @classmethod
    def from_path(cls, path: str | Path) -> "PlanSource":
        """Load and validate a plan JSON file (PlanFileError on anything wrong)."""
        path = Path(path)
        return cls(plan=load_plan(path), label=str(path))

    def actual(self) -> ActualOutcome | None:
        return None


def as_source(source: "ReportSource | Plan | str | Path") -> ReportSource:
    """Accept a source, a Plan or the path of a plan JSON file."""
    if isinstance(source, Plan):
        return PlanSource(plan=source, label=source.job.name)
    if isinstance(source, (str, Path)):
        return PlanSource.from_path(source)
    return source
