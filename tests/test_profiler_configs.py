"""The profiler's configuration sampling and epoch timing (pure parts), and the synthetic workload's truth."""

from __future__ import annotations


import numpy as np
import pytest

from rubberband.profiler.runner import epoch_times, profiling_config, profiling_configs
from rubberband.spec import load_spec
from conftest import EXAMPLES


def test_epoch_times_are_start_to_start_without_the_warm_up_epoch():
    passes = ((0.0, 0.9), (1.0, 1.8), (2.1, 3.0), (3.3, 4.0), (4.6, 5.0))
    assert epoch_times(passes) == pytest.approx([1.1, 1.2, 1.3])
    assert epoch_times(passes[:2]) == []


def test_profiled_configurations_are_the_reference_and_seeded_samples():
    spec = load_spec(EXAMPLES / "synthetic.yaml")
    configs = profiling_configs(spec, 5)
    assert configs[0] == profiling_config(spec)
    assert len({c["lr"] for c in configs}) == 5
    assert profiling_configs(spec, 5) == configs  # seeded
    assert all(c["iteration_s"] == spec.config["iteration_s"] for c in configs)


def test_synthetic_config_speed_is_stable_per_config_and_lognormal(synthetic):
    base = {"config_speed_sigma": 0.2, "epoch_sigma": 0.1}
    speeds = np.array([synthetic.config_speed({**base, "lr": 10**-x}) for x in np.linspace(0.5, 3.5, 400)])
    assert synthetic.config_speed({**base, "lr": 0.01}) == synthetic.config_speed({**base, "lr": 0.01})
    assert np.log(speeds).std() == pytest.approx(0.2, rel=0.15)
    assert abs(np.log(speeds).mean()) < 0.04
    assert synthetic.config_speed({"lr": 0.01}) == 1.0 and synthetic.epoch_factor({"lr": 0.01}, "t", 0) == 1.0
    factors = np.array([synthetic.epoch_factor(base, "t1", e) for e in range(400)])
    assert np.log(factors).std() == pytest.approx(0.1, rel=0.15)
