"""A local run's head start, measured by the profiler and put on the critical path (issue 30, item 2)."""

from __future__ import annotations

import json

import pytest
from sim_helpers import write_cpu_profile

from rubberband.catalog import load_catalog
from rubberband.planner.model import fit_performance_model
from rubberband.planner.schedule import sha_stages
from rubberband.planner.plan_space import StageConfig
from rubberband.planner.simulator import SimSettings, Simulator
from rubberband.profile import load_profile


def _profile(tmp_path, head: list[float] | None):
    path = write_cpu_profile(tmp_path / "profile.json", epoch_s=1.0, startup_s=2.0)
    if head is not None:
        data = json.loads(path.read_text())
        data["head_startup"] = [{"cloud": "local", "samples_s": head}]
        path.write_text(json.dumps(data))
    return load_profile(path)


def test_the_measured_head_start_is_what_a_local_run_waits_before_its_first_request(tmp_path):
    catalog = load_catalog(["local"])
    cpu2 = catalog.find("local.cpu2")
    stages = sha_stages(3, 3, 1, 3)
    plan = [StageConfig(cpu2, 1, 1), StageConfig(cpu2, 1, 1)]

    def first_request(model) -> float:
        sim = Simulator(stages, model, SimSettings(samples=20))
        timeline, _, _ = sim.trace(sim.simulate(plan).configs, 0)
        return min(i.requested_s for i in timeline.instances)

    measured = fit_performance_model(_profile(tmp_path / "a", [4.5, 5.5]))
    assert measured.head_start("local", "local.cpu2").quantile(0.5) == pytest.approx(5.0)
    assert first_request(measured) == pytest.approx(5.0)
    assert measured.describe()["head_startup"]["local"]["median_s"] == pytest.approx(5.0)
    # without a measurement, one node's start-up stands in (the profile's 2 s)
    standin = fit_performance_model(_profile(tmp_path / "b", None))
    assert standin.head_start("local", "local.cpu2").quantile(0.5) == pytest.approx(2.0)
    assert first_request(standin) == pytest.approx(2.0)
