"""rubberband: cheapest elastic hyperparameter tuning that still meets a deadline.

The top-level package holds the shared domain models (job spec, profile, catalog, plan),
the error hierarchy and the command-line interface. The engines live in the sibling
namespaces ``rubberband.planner``, ``rubberband.profiler``, ``rubberband.cloud`` and
``rubberband.executor``.
"""

__version__ = "0.1.0"
#: The distribution's name (pyproject's ``[project] name``): ``rubberband`` on the public index is an unrelated
#: audio library, so every message that tells a user what to install names this one (the import name stays).
DIST_NAME = "rubberband-hpo"


def install_hint(extra: str | None = None) -> str:
    """The pip command that installs rubberband (with ``extra``): from a checkout, or by this distribution's name."""
    what = f"{DIST_NAME}[{extra}]" if extra else DIST_NAME
    local = f"pip install -e '.[{extra}]'" if extra else "pip install -e ."
    return f"pip install '{what}' (from a checkout: {local})"
