"""The plan's ASHA baseline starts its trials as Ray Tune does: from the profiler's measurement of Ray Tune's own
trial starts (profile ``tune_trial_start``), never from a bench's fit.

The measurement itself is real in the profiler's end-to-end test (``tests/test_profiler_cli.py``: Ray Tune's
trials started on a profiling node) and, against whole Ray Tune ASHA runs, in ``bench/bench_asha_ray.py``.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from pydantic import ValidationError

from conftest import EXAMPLES
from planner_helpers import ideal_model, itype
from rubberband.catalog import load_catalog
from rubberband.commands.plan import asha_line
from rubberband.planner.job import PlanOptions, plan_job
from rubberband.planner.asha import (
    AshaCluster,
    AshaSchedule,
    AshaSettings,
    AshaSimulator,
    TrialStarts,
    ray_tune_starts,
)
from rubberband.planner.model import StartupModel, TuneStart, fit_performance_model, tune_start_model
from rubberband.profile import TuneTrialStart, load_profile
from rubberband.spec import parse_spec

#: Alone 2 s; four at once took 4 s each: 4 × 2 / 4 = 2 start lanes on the 2 cores measured, one per core.
MEASURED = TuneTrialStart(
    serial_s=[2.0, 2.0, 2.0], concurrent=4, concurrent_s=[4.0] * 4, host_cores=2, ray_version="2.60.0"
)


def test_the_profiles_measurement_becomes_start_lanes_per_core():
    start = tune_start_model(MEASURED)
    assert (start.start_s, start.sigma, start.lanes_per_core, start.host_cores) == (2.0, 0.0, 1.0, 2)
    assert start.lanes(8) == 8.0 and start.lanes(0.5) == 1.0  # never below one lane
    # starts that did not slow each other down: as many lanes as were started, never more
    quick = tune_start_model(MEASURED.model_copy(update={"concurrent_s": [1.0] * 4}))
    assert quick.lanes_per_core * 2 == 4.0
    # much slower than alone: one lane at least
    slow = tune_start_model(MEASURED.model_copy(update={"concurrent_s": [40.0] * 4}))
    assert slow.lanes_per_core * 2 == 1.0
    uneven = tune_start_model(MEASURED.model_copy(update={"serial_s": [1.0, 2.0, 4.0]}))
    assert uneven.sigma == pytest.approx(np.std(np.log([1.0, 2.0, 4.0])))


def test_a_start_amid_training_trials_takes_what_the_lanes_do_not_explain_on_top():
    """The busy stream (trials that train a moment before they report): its mean gap less what its starts take on
    the lanes alone is what a start takes on top amid other trials' results and ends (never below 0)."""
    assert tune_start_model(MEASURED).busy_s == 0.0  # profiles before the busy stream: nothing on top
    busy = MEASURED.model_copy(update={"busy_concurrent": 2, "busy_concurrent_s": [2.4, 2.6, 2.5, 2.5]})
    assert tune_start_model(busy).busy_s == pytest.approx(0.5)  # 2 lanes: 2 at once start as alone, in 2.0 s
    one_lane = busy.model_copy(update={"concurrent_s": [8.0] * 4, "busy_concurrent_s": [4.3] * 4})
    assert tune_start_model(one_lane).busy_s == pytest.approx(0.3)  # 1 lane: 2 at once take 4.0 s on it
    quick = busy.model_copy(update={"busy_concurrent_s": [1.8] * 4})
    assert tune_start_model(quick).busy_s == 0.0


def test_bad_measurements_are_refused():
    with pytest.raises(ValidationError, match="positive"):
        TuneTrialStart.model_validate(MEASURED.model_dump() | {"serial_s": [0.0]})
    with pytest.raises(ValidationError):
        TuneTrialStart.model_validate(MEASURED.model_dump() | {"concurrent": 1})
    with pytest.raises(ValidationError, match="go together"):
        TuneTrialStart.model_validate(MEASURED.model_dump() | {"busy_concurrent": 2})
    with pytest.raises(ValidationError, match="positive"):
        TuneTrialStart.model_validate(MEASURED.model_dump() | {"busy_concurrent": 2, "busy_concurrent_s": [-1.0]})


def test_ray_tune_starts_share_the_host_locally_and_the_instances_vcpus_on_a_cloud():
    model = ideal_model(task_start=0.5)
    assert ray_tune_starts(model, itype()) is None  # not measured: trials start as this executor's do
    measured = replace(model, tune_start=TuneStart(start_s=2.0, sigma=0.1, lanes_per_core=1.5, host_cores=2))
    aws = ray_tune_starts(measured, itype(gpus=1))  # 8 vCPUs
    assert aws == TrialStarts(concurrency=12.0, start_s=2.5, sigma=0.1, shared_host=False)
    local = ray_tune_starts(measured, itype(cloud="local"))
    assert local == TrialStarts(concurrency=3.0, start_s=2.5, sigma=0.1, shared_host=True)
    busy = replace(measured, tune_start=replace(measured.tune_start, busy_s=0.4))
    assert ray_tune_starts(busy, itype(cloud="local")) == replace(local, busy_s=0.4)


def test_on_a_shared_host_every_instances_starts_contend():
    """Four 1-slot instances, four 1-epoch trials starting at once on 2 start lanes: each start takes 3 s × 4 / 2
    where the instances share one host, 3 s where each has its own cores; then 100 iterations × 0.5 s."""
    up = StartupModel((0.0,), "test")  # every instance up at once: only the starts differ
    model = replace(ideal_model(t_iter=0.5, dataset=1000, batch=10), startup_by_cloud={"local": up})
    local = itype("one", cloud="local")  # one GPU: one trial slot per instance
    schedule = AshaSchedule(trials=4, eta=3, min_epochs=1, max_epochs=1)
    for shared, start in ((True, 6.0), (False, 3.0)):
        starts = TrialStarts(concurrency=2.0, start_s=3.0, shared_host=shared)
        sim = AshaSimulator(model, schedule, AshaSettings(samples=2, starts=lambda _t, s=starts: s))
        assert np.allclose(sim.simulate(AshaCluster(local, 4, 1)).jct, start + 50.0)


def test_a_trial_started_as_its_own_process_waits_for_no_worker_pool():
    """Where each trial starts its own process (Ray Tune), an instance is ready when it is up: the executor's
    worker start (its warm pool) is not paid on top."""
    model = ideal_model(t_iter=0.5, dataset=1000, batch=10, worker_start=7.0)
    schedule = AshaSchedule(trials=1, eta=3, min_epochs=1, max_epochs=1)
    pool = AshaSimulator(model, schedule, AshaSettings(samples=2, starts=lambda _t: TrialStarts(concurrency=1.0)))
    own = AshaSimulator(
        model, schedule, AshaSettings(samples=2, starts=lambda _t: TrialStarts(concurrency=1.0, start_s=2.0))
    )
    assert np.allclose(pool.simulate(AshaCluster(itype(), 1, 1)).jct, 7.0 + 50.0)
    assert np.allclose(own.simulate(AshaCluster(itype(), 1, 1)).jct, 2.0 + 50.0)
    # amid other trials a start takes Tune's busy seconds on top, holding no start lane
    busy = AshaSimulator(
        model,
        schedule,
        AshaSettings(samples=2, starts=lambda _t: TrialStarts(concurrency=1.0, start_s=2.0, busy_s=0.5)),
    )
    assert np.allclose(busy.simulate(AshaCluster(itype(), 1, 1)).jct, 2.5 + 50.0)


def _sha_spec():
    return parse_spec(
        {
            "name": "sha-job",
            "train": "m:f",
            "metric": {"name": "val_acc", "mode": "max"},
            "search_space": {"lr": {"type": "loguniform", "low": 0.001, "high": 0.3}},
            "scheduler": {"kind": "sha", "trials": 27, "eta": 3, "min_epochs": 1, "max_epochs": 9},
            "deadline": "3h",
            "resources": {"clouds": ["aws"], "instance_types": ["g4dn.xlarge"], "max_workers_per_trial": 1},
        }
    )


def test_the_plans_asha_baseline_starts_trials_as_ray_tune_does():
    """A profile with Ray Tune's trial starts measured: the plan's ASHA baseline is the simulator with
    :func:`ray_tune_starts`, and slower than the same baseline without them (each trial a new process)."""
    profile = load_profile(EXAMPLES / "profiles" / "resnet50_cifar10_v100.json")
    slow_starts = MEASURED.model_copy(update={"serial_s": [30.0] * 3, "concurrent_s": [60.0] * 4})
    measured = profile.model_copy(update={"tune_trial_start": slow_starts})
    catalog = load_catalog(["aws"])
    options = PlanOptions(deadline_s=3 * 3600.0, samples=200)
    without = plan_job(_sha_spec(), profile, catalog, options).asha
    with_tune = plan_job(_sha_spec(), measured, catalog, options).asha
    assert without is not None and with_tune is not None
    assert (with_tune.instance_type, with_tune.instances) == (without.instance_type, without.instances)
    assert with_tune.predicted.jct_s.p50 > without.predicted.jct_s.p50 + 300  # 27 starts of 30 s on 2 slots
    assert with_tune.predicted.cost_usd.mean > without.predicted.cost_usd.mean
    assert (with_tune.trial_starts, without.trial_starts) == ("ray_tune", "warm_workers")
    model = fit_performance_model(measured)
    g4 = catalog.find(with_tune.instance_type, cloud="aws")
    sim = AshaSimulator(
        model,
        AshaSchedule(trials=27, eta=3, min_epochs=1, max_epochs=9),
        AshaSettings(seed=0, starts=lambda t: ray_tune_starts(model, t)),
    )
    res = sim.simulate(AshaCluster(g4, with_tune.instances, with_tune.workers_per_trial))
    assert with_tune.predicted.jct_s.p50 == pytest.approx(float(np.median(res.jct)), rel=0.02)


def test_the_plan_says_how_its_asha_baseline_starts_trials():
    profile = load_profile(EXAMPLES / "profiles" / "resnet50_cifar10_v100.json")
    catalog = load_catalog(["aws"])
    options = PlanOptions(deadline_s=3 * 3600.0, samples=200)
    plain = plan_job(_sha_spec(), profile, catalog, options)
    assert "Ray Tune's were not profiled" in asha_line(plain)
    measured = plan_job(_sha_spec(), profile.model_copy(update={"tune_trial_start": MEASURED}), catalog, options)
    assert "Ray Tune's trial starts, as profiled" in asha_line(measured)
