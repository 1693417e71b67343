"""Every shipped example spec loads with its profile and catalog and plans at its own deadline (or, when it
ships no profile, says to run ``rubberband profile``).

The examples are what a new user runs first; a spec or profile that drifted from the schema, or a
deadline its own profile cannot meet, would greet them with an error. (Running them is e2e:
test_trials_examples.py, test_readme_commands.py, test_recorded.py, test_raytune_adapter.py.)
"""

from __future__ import annotations

from pathlib import Path

import pytest

from rubberband.errors import ProfileError
from rubberband.inputs import load_job_inputs, resolve_profile_path
from rubberband.planner import PlanOptions, plan_job
from rubberband.spec import load_spec

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
SPECS = sorted(p.name for p in EXAMPLES.glob("*.yaml"))


def test_the_examples_are_all_here():
    assert {"quickstart_local.yaml", "digits_spread.yaml", "raytune_spread.yaml", "nasbench201.yaml"} <= set(SPECS)


@pytest.mark.parametrize("name", SPECS)
def test_an_example_spec_plans_at_its_own_deadline(name):
    if not resolve_profile_path(load_spec(EXAMPLES / name), None).exists():  # a workload the user profiles first
        with pytest.raises(ProfileError, match="run `rubberband profile`"):
            load_job_inputs(EXAMPLES / name)
        return
    inputs = load_job_inputs(EXAMPLES / name)
    plan = plan_job(inputs.spec, inputs.profile, inputs.catalog, PlanOptions(samples=200, seed=0))
    assert plan.stages and plan.predicted.p_meet_deadline >= inputs.spec.confidence
