"""Planning: schedules, the fitted performance model, the DAG simulator and the greedy planner.

Everything here is a pure function of its inputs (spec, profile, catalog): no I/O, no
clock, no cloud calls.
"""

import importlib

# Exports resolve lazily so that light users (``rubberband schedule``) do not import scipy/networkx.
_EXPORTS = {
    "PlanOptions": "job",
    "Replay": "replay",
    "SearchOptions": "api",
    "SpotMarket": "job",
    "StagesPlan": "api",
    "allowed_types": "offerings",
    "configs_of": "plan_record",
    "plan_job": "job",
    "plan_stages": "api",
    "prediction": "plan_record",
    "simulate_plan": "replay",
    "stage_plans": "plan_record",
    "heads_of": "plan_record",
    "replay_plan": "replay",
    "plan_simulator": "replay",
    "BracketSetup": "brackets",
    "ParallelSimulator": "brackets",
    "PerformanceModel": "model",
    "fit_performance_model": "model",
    "Goal": "search",
    "PlanSpace": "search",
    "HeadSpec": "plan_space",
    "RunningState": "simulator",
    "SimResult": "simulator",
    "SimSettings": "simulator",
    "Simulator": "simulator",
    "StageConfig": "plan_space",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
