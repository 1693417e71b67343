"""Planning as the commands use it: load-once inputs in, a timed plan out.

The planner itself is pure (no clock); this is the one place that measures how long it took.
"""

from __future__ import annotations

import time

from rubberband.inputs import JobInputs
from rubberband.plan import Plan


def plan_from_inputs(inputs: JobInputs, *, deadline_s: float | None = None, confidence: float | None = None,
                     cloud: str | None = None, samples: int = 1000, seed: int | None = None) -> Plan:
    """Run the planner on a spec's inputs; fill in ``planner.seconds`` and ``profile_path``."""
    from rubberband.planner import plan_job  # heavy imports only when planning

    started = time.perf_counter()
    plan = plan_job(inputs.spec, inputs.profile, inputs.catalog, deadline_s=deadline_s, confidence=confidence,
                    cloud=cloud, samples=samples, seed=seed)
    plan.planner.seconds = round(time.perf_counter() - started, 4)
    plan.profile_path = str(inputs.profile_path)
    return plan
