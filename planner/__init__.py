"""Planning: schedules, the fitted performance model, the DAG simulator and the greedy planner.

Everything here is a pure function of its inputs (spec, profile, catalog): no I/O, no
clock, no cloud calls.
"""
