"""The seams the controller is built on: how it launches trials and how it re-plans.

* :class:`TrialRuntime` wraps a trial-runtime module that defines ``TrialSpec`` and
  ``TrialRun`` as in CONTRACT_TRIALS.md (``rubberband.executor.trials`` by default; tests
  pass their own small one). Swapping runtimes is one name.
* :data:`Replanner` is any callable taking a :class:`ReplanRequest` and returning a plan for
  the remaining stages (or ``None``); :func:`planner_replanner` adapts
  ``rubberband.planner.plan_stages`` when the planner is installed.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

from rubberband.errors import InputError
from rubberband.plan import Plan
from rubberband.spec import JobSpec

DEFAULT_TRIAL_RUNTIME = "rubberband.executor.trials"


class TrialHandle(Protocol):
    """What ``TrialRun.start`` returns (CONTRACT_TRIALS.md)."""

    done_ref: Any

    def result(self, timeout_s: float | None = None) -> Any: ...

    def stop(self) -> None: ...


@dataclass(frozen=True)
class TrialRuntime:
    """A trial runtime: its ``TrialSpec`` dataclass and its ``TrialRun`` class."""

    spec_cls: Any
    run_cls: Any
    module: str = ""

    @classmethod
    def load(cls, module: str = DEFAULT_TRIAL_RUNTIME) -> "TrialRuntime":
        try:
            mod = importlib.import_module(module)
        except ImportError as exc:
            raise InputError(f"trial runtime module {module!r} cannot be imported ({exc}); "
                             f"install rubberband with its executor.trials module") from None
        try:
            return cls(spec_cls=mod.TrialSpec, run_cls=mod.TrialRun, module=module)
        except AttributeError:
            raise InputError(f"trial runtime module {module!r} lacks TrialSpec or TrialRun") from None

    def start(self, *, event_sink: Any = None, **spec_fields: Any) -> TrialHandle:
        return self.run_cls.start(self.spec_cls(**spec_fields), event_sink=event_sink)


@dataclass(frozen=True)
class ReplanRequest:
    """What the executor knows at a stage boundary, for re-planning the stages after it.

    ``next_stage`` is the index (in ``plan.stages``) of the first stage not yet run;
    ``epoch_seconds`` maps ``"<instance type>/<workers per trial>"`` to measured epoch
    times; ``startup_s`` maps an instance type to measured request→ready latencies.
    """

    spec: JobSpec
    plan: Plan
    next_stage: int
    elapsed_s: float
    spent_usd: float
    remaining_deadline_s: float
    epoch_seconds: dict[str, list[float]] = field(default_factory=dict)
    setup_seconds: list[float] = field(default_factory=list)
    startup_s: dict[str, list[float]] = field(default_factory=dict)
    at_risk: bool = False


#: Returns a plan whose ``stages`` are the remaining stages (same trials and epochs, possibly other
#: instances), with predictions for the remaining part under ``remaining_deadline_s``; or None.
Replanner = Callable[[ReplanRequest], "Plan | None"]


def planner_replanner(catalog: Any, profile: Any) -> Replanner | None:
    """Adapter over ``rubberband.planner.plan_stages`` (None when the planner is not installed)."""
    try:
        planner = importlib.import_module("rubberband.planner")
        plan_stages = planner.plan_stages
    except (ImportError, AttributeError):
        return None

    def replan(request: ReplanRequest) -> Plan | None:
        return plan_stages(request.spec, profile, catalog, plan=request.plan, first_stage=request.next_stage,
                           deadline_s=request.remaining_deadline_s, measured=request)

    return replan
