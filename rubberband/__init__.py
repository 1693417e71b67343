"""rubberband: cheapest elastic hyperparameter tuning that still meets a deadline.

The top-level package holds the shared domain models (job spec, profile, catalog, plan),
the error hierarchy and the command-line interface. The engines live in the sibling
namespaces ``rubberband.planner``, ``rubberband.profiler``, ``rubberband.cloud`` and
``rubberband.executor``.
"""

__version__ = "0.1.0"
