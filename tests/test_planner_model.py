import dataclasses
import math

import numpy as np
import pytest

from rubberband.errors import ProfileError
from rubberband.planner.model import fit_performance_model
from rubberband.profile import load_profile
from conftest import EXAMPLES
from planner_helpers import TRUE, synthetic_profile

SHAPES = [(1, 1), (2, 1), (4, 1), (8, 1), (2, 2), (4, 2), (8, 4)]


def test_fit_recovers_known_parameters_and_predicts_held_out_shapes():
    model = fit_performance_model(synthetic_profile(SHAPES))
    dev = model.devices["V100"]
    assert dev.alpha_grad == pytest.approx(TRUE.alpha_grad, rel=0.01)
    assert dev.rms_log_error < 0.01
    for workers, nodes in [(3, 1), (6, 1), (8, 2), (16, 2), (16, 4)]:  # never measured
        assert model.iteration_time("V100", workers, nodes) == pytest.approx(
            TRUE.t_iter(64, workers, nodes), rel=0.03
        ), (workers, nodes)


def test_fit_with_noise_and_warmup_is_robust():
    profile = synthetic_profile(SHAPES, noise=0.03, n=40, seed=3)
    for m in profile.measurements:  # slow warm-up iterations must be dropped
        m.iteration_latencies_s[:3] = [x * 5 for x in m.iteration_latencies_s[:3]]
    model = fit_performance_model(profile)
    assert model.iteration_time("V100", 8, 2) == pytest.approx(TRUE.t_iter(64, 8, 2), rel=0.05)
    assert model.straggler_sigma == pytest.approx(0.03, rel=0.35)


def test_single_shape_profile_gives_stable_sensible_model():
    model = fit_performance_model(synthetic_profile([(1, 1)]))
    t1 = model.iteration_time("V100", 1, 1)
    assert t1 == pytest.approx(TRUE.alpha_grad, rel=1e-3)
    # priors: sync adds a little inside a node, more across nodes; scaling still helps
    assert t1 < model.iteration_time("V100", 4, 1) < model.iteration_time("V100", 4, 2) < 2 * t1
    assert model.epoch_time("V100", 4, 1) < model.epoch_time("V100", 1, 1)
    assert model.straggler_sigma == 0.0


def test_device_speed_scales_reference_and_unknown_devices_are_not_plannable():
    model = fit_performance_model(synthetic_profile(SHAPES, device_speed={"A100": 2.0}))
    assert model.plannable("A100") and not model.plannable("T4")
    assert model.iteration_time("A100", 1, 1) == pytest.approx(model.iteration_time("V100", 1, 1) / 2)
    with pytest.raises(ProfileError, match="device_speed.T4"):
        model.epoch_time("T4", 1, 1)


def test_startup_model_falls_back_per_type_cloud_default():
    profile = synthetic_profile(
        [(1, 1)],
        startup=[
            {"cloud": "aws", "instance_type": "p3.2xlarge", "samples_s": [10, 20]},
            {"cloud": "aws", "samples_s": [100, 200, 300]},
        ],
    )
    model = fit_performance_model(profile)
    assert model.startup("aws", "p3.2xlarge").samples_s == (10.0, 20.0)
    assert model.startup("aws", "g5.xlarge").quantile(0.5) == 200.0
    gcp = model.startup("gcp", "n1")
    assert gcp.source.startswith("default") and 40 <= gcp.quantile(0.5) <= 100
    draws = model.startup("aws", "x").sample(np.array([0.0, 0.5, 0.999]))
    assert list(draws) == [100.0, 200.0, 300.0]


def test_example_profile_fits_and_describes():
    profile = load_profile(EXAMPLES / "profiles" / "resnet50_cifar10_v100.json")
    model = fit_performance_model(profile)
    assert model.iteration_time("V100", 1, 1) == pytest.approx(0.13, rel=0.03)
    # ~90% efficiency inside a node, clearly worse across nodes, for a shape never measured
    assert 0.85 < 0.13 / model.iteration_time("V100", 8, 1) < 0.95
    assert 0.13 / model.iteration_time("V100", 8, 2) < 0.8
    described = model.describe()
    assert set(described["devices"]) >= {"V100", "T4", "A10G", "A100", "H100", "L4"}
    assert described["startup"]["aws"]["source"] == "default"
    assert math.isfinite(described["devices"]["V100"]["gamma"])


def same_fit(a, b, rel: float = 1e-4) -> bool:
    """Whether two fitted values (dataclasses, dicts, lists, numbers, strings) agree: numbers within ``rel``,
    everything else exactly."""
    if dataclasses.is_dataclass(a) and dataclasses.is_dataclass(b):
        return type(a) is type(b) and same_fit(dataclasses.asdict(a), dataclasses.asdict(b), rel)
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same_fit(a[k], b[k], rel) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(same_fit(x, y, rel) for x, y in zip(a, b))
    if isinstance(a, float) or isinstance(b, float):
        return a == pytest.approx(b, rel=rel, abs=1e-12)
    return a == b


def test_a_profiles_stored_fit_is_reused_while_its_measurements_are_unchanged(monkeypatch):
    """A profile rubberband wrote carries its fit under a key of what it was fitted from: planning from it does not
    fit again, and gets the model a fresh fit gives (to the optimiser's tolerance: the stored fit was made with the
    SciPy of the day, and another release's least squares can land up to a few parts in 10^5 apart)."""
    import copy

    import scipy.optimize

    profile = load_profile(EXAMPLES / "profiles" / "resnet50_cifar10_v100.json")
    fresh = fit_performance_model(profile.model_copy(update={"fitted": None}))
    assert fresh.devices["V100"].fit_key

    def no_fit(*args, **kwargs):
        raise AssertionError("fitted again")

    monkeypatch.setattr(scipy.optimize, "least_squares", no_fit)
    stored = fit_performance_model(profile)
    assert same_fit(stored.devices, fresh.devices) and same_fit(stored.variation, fresh.variation)
    # new measurements (another key), or a stored entry that is not a fit, are fitted afresh
    changed = profile.model_copy(deep=True)
    changed.measurements[0].iteration_latencies_s[:] = [x * 1.1 for x in changed.measurements[0].iteration_latencies_s]
    with pytest.raises(AssertionError, match="fitted again"):
        fit_performance_model(changed)
    broken = copy.deepcopy(profile.fitted)
    broken["devices"]["V100"]["gamma"] = "not a number"
    with pytest.raises(AssertionError, match="fitted again"):
        fit_performance_model(profile.model_copy(update={"fitted": broken}))


@pytest.mark.e2e
def test_planning_from_a_profile_with_its_fit_never_imports_scipy_optimize():
    """What the stored fit is for: ~0.4 s of every `rubberband plan` / `run` (a fresh interpreter, as a user's)."""
    import subprocess
    import sys

    code = (
        "import sys; from rubberband.profile import load_profile; from rubberband.planner.model import "
        "fit_performance_model; fit_performance_model(load_profile(sys.argv[1])); print('scipy.optimize' in sys.modules)"
    )
    path = str(EXAMPLES / "profiles" / "resnet50_cifar10_v100.json")
    done = subprocess.run([sys.executable, "-c", code, path], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"


def test_every_example_profile_carries_the_fit_its_measurements_give():
    """Stale stored fits would plan from another model: the examples' are current (refresh them with
    `rubberband profile --from-run` or by writing ``fit_performance_model(p).describe()`` into ``fitted``)."""
    for path in sorted((EXAMPLES / "profiles").glob("*.json")):
        profile = load_profile(path)
        fitted = fit_performance_model(profile.model_copy(update={"fitted": None}))
        assert all(
            profile.fitted["devices"][name].get("fit_key") == d.fit_key
            for name, d in fitted.devices.items()
            if d.fit_key
        ), path.name
