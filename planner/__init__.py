"""Planning: schedules, the fitted performance model, the DAG simulator and the greedy planner.

Everything here is a pure function of its inputs (spec, profile, catalog): no I/O, no
clock, no cloud calls.
"""

from rubberband.planner.api import (StagesPlan, allowed_types, configs_of, plan_job, plan_stages, prediction,
                                    simulate_plan, stage_plans)
from rubberband.planner.model import PerformanceModel, fit_performance_model
from rubberband.planner.simulator import RunningState, SimResult, Simulator, StageConfig

__all__ = ["PerformanceModel", "RunningState", "SimResult", "Simulator", "StageConfig", "StagesPlan",
           "allowed_types", "configs_of", "fit_performance_model", "plan_job", "plan_stages", "prediction",
           "simulate_plan", "stage_plans"]
