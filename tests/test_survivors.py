"""Who survives a promotion: the speed–quality correlation the planner fits (or bounds), and the measured survivors
the boundary re-plan predicts from (issue 30, item 1).

Pure parts on their own (the fit, the ordering, the simulator with known trials, the journal's survivors); then the
real executor on virtual time (``rubberband run --cloud sim``), whose world plays configurations that differ in
speed and whose quality goes with slowness as the profile says: the re-plan at the last boundary predicts the last
stage from the survivors' own speeds.
"""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest
from executor_helpers import make_plan, write_job
from sim_helpers import boundary_prediction, write_cpu_profile, write_spread_profile

from rubberband.cli import run as cli
from rubberband.executor import journal as J
from rubberband.executor.runstate import fold
from rubberband.executor.runtime import ReplanRequest, known_trials, planner_replanner
from rubberband.executor.survivors import EpochTime, TrialTimes, measured_survivors
from rubberband.planner.model import fit_performance_model
from rubberband.planner.noise import (
    RHO_MIN_CONFIGS,
    KnownTrials,
    Variation,
    bracket_log_speeds,
    fit_speed_quality,
)
from rubberband.planner.schedule import sha_stages
from rubberband.planner.plan_space import StageConfig
from rubberband.planner.simulator import SimSettings, Simulator
from rubberband.profile import load_profile
from rubberband.spec import load_spec
from planner_helpers import ideal_model, itype

# -- the fit ----------------------------------------------------------------------------------------------------


def test_enough_scored_configurations_give_the_fitted_rank_correlation():
    slowness = list(np.linspace(-1, 1, RHO_MIN_CONFIGS))
    fitted = fit_speed_quality(slowness, [2 * s for s in slowness])  # the slow ones score best
    assert not fitted.bound and fitted.fit == pytest.approx(1.0) and fitted.rho == pytest.approx(1.0)
    assert fitted.source.startswith("fitted")
    against = fit_speed_quality(slowness, [-s for s in slowness])
    assert against.rho == pytest.approx(-1.0)


@pytest.mark.parametrize("scored", [0, 2, 3])
def test_three_or_fewer_scored_configurations_plan_the_slowest_promoted(scored):
    qualities = [float(i) for i in range(scored)] + [None] * (5 - scored)
    out = fit_speed_quality([0.1, 0.2, 0.3, 0.4, 0.5], qualities)
    assert out.bound and out.rho == pytest.approx(1.0)
    assert "bound" in out.source and "--configs" in out.source


def test_a_few_configurations_plan_an_upper_bound_above_their_fit():
    slowness = [0.0, 0.4, -0.3, 0.1, 0.6, -0.5]
    quality = [0.2, -0.1, 0.5, 0.0, 0.3, -0.4]
    out = fit_speed_quality(slowness, quality)
    assert out.bound and out.fit is not None
    assert 2 * math.sin(math.pi * out.fit / 6) < out.rho < 1.0  # the bound lies above the fit (on the Gaussian scale)


def test_the_profile_fit_carries_the_correlation_only_where_configurations_differ_in_speed(tmp_path):
    profile = write_spread_profile(tmp_path / "p.json", rho=0.9)
    variation = fit_performance_model(load_profile(profile)).variation
    assert variation.config_sigma > 0 and not variation.speed_quality_bound
    assert variation.speed_quality_fit is not None and variation.speed_quality_fit > 0.5
    flat = fit_performance_model(load_profile(write_cpu_profile(tmp_path / "flat.json"))).variation
    assert flat.speed_quality_rho == 0.0


# -- who the simulator lets survive ------------------------------------------------------------------------------


def test_a_positive_correlation_promotes_the_slow_draws_and_known_trials_come_first():
    rng = np.random.default_rng(0)
    z, q = rng.standard_normal((4000, 9)), rng.standard_normal((4000, 9))
    v = Variation(config_sigma=0.5, speed_quality_rho=0.9)
    survivors = bracket_log_speeds(v, z, q)[:, :3].mean()  # the three a stage of 3 runs
    assert survivors > 0.3  # slower than the population (mean 0)
    assert bracket_log_speeds(dataclasses.replace(v, speed_quality_rho=-0.9), z, q)[:, :3].mean() < -0.3
    assert np.array_equal(bracket_log_speeds(dataclasses.replace(v, speed_quality_rho=0.0), z, q), 0.5 * z)
    known = bracket_log_speeds(v, z, q, KnownTrials((0.7, -0.2), (4, 4)))
    assert known[:, 0].mean() == pytest.approx(0.7, abs=0.01) and known[:, 1].mean() == pytest.approx(-0.2, abs=0.01)
    assert np.array_equal(known[:, 2:], 0.5 * z[:, 2:])


def test_known_trials_are_their_measurements_only_as_far_as_configurations_differ_beyond_the_noise():
    """A survivor's measured speed is its own speed times its instance's straggler factor and epoch noise. Where
    configurations differ far more than that noise (the profile says so, or the survivors show it), the measurement
    is the answer; where neither says they differ, a survivor that measured slow was on a slow instance and is
    planned as the population (a --cloud sim run of the quickstart, whose configurations are alike, took one epoch
    at +3.7 % for a life at +3.7 %, saw P(meet) fall from 0.99 to 0.93 at a boundary it reached on time and bought
    speed for 28 % more)."""
    z = np.random.default_rng(0).standard_normal((4000, 3))
    # no further apart than stragglers of σ 0.026 make them
    alike = KnownTrials((0.02, -0.03, 0.01), (1, 1, 4), straggler_sigma=0.026)
    assert np.array_equal(bracket_log_speeds(Variation(), z, None, alike), np.zeros_like(z))
    differ = KnownTrials((0.05, -0.04, 0.7), (1, 1, 4), straggler_sigma=0.026)
    for profiled in (Variation(config_sigma=0.8), Variation()):  # the profile says so, or the survivors show it
        speeds = bracket_log_speeds(profiled, z, None, differ)
        assert speeds.mean(axis=0) == pytest.approx([0.05, -0.04, 0.7], abs=0.02)
    mean, sd = alike.posterior(Variation(config_sigma=0.026, epoch_sigma=0.03), 3)
    # as much noise as spread: part way to the population, trials of one epoch further than the one of four
    shrunk = mean / np.array(alike.log_speeds)
    assert np.all((0 < shrunk) & (shrunk < 1)) and shrunk[0] < shrunk[2] and np.all((0 < sd) & (sd < 0.026))


def test_the_simulator_plays_the_later_stages_at_the_survivors_speed():
    stages = sha_stages(9, 3, 1, 9)
    model = dataclasses.replace(ideal_model(t_iter=0.1, dataset=100, batch=10), variation=Variation(config_sigma=0.5))
    plan = [StageConfig(itype(), 9, 1), StageConfig(itype(), 3, 1), StageConfig(itype(), 1, 1)]

    def last_stage(variation: Variation | None = None, known: dict | None = None) -> float:
        m = model if variation is None else dataclasses.replace(model, variation=variation)
        sim = Simulator(stages, m, SimSettings(samples=2000, seed=1, known_trials=known))
        return float(np.median(sim.simulate(plan).stage_durations[2]))

    random = last_stage()
    assert last_stage(Variation(config_sigma=0.5, speed_quality_rho=0.9)) > 1.5 * random
    assert last_stage(Variation(config_sigma=0.5, speed_quality_rho=-0.9)) < random / 1.5
    # measured survivors: the last stage's trial is the best ranked one, at its own speed (6 epochs of 1 s × e^0.8)
    known = last_stage(known={0: KnownTrials((0.8, 0.0, -0.5), (3, 3, 3))})
    assert known == pytest.approx(6.0 * math.exp(0.8), rel=0.02)

    # a bracket's first stage runs its trials in the order they were sampled (the executor's), whatever their
    # quality: ranked best first, slower-is-better trials would all go first and pack the stage short
    def first_stage(rho: float) -> np.ndarray:
        m = dataclasses.replace(model, variation=Variation(config_sigma=0.5, speed_quality_rho=rho))
        narrow = [StageConfig(itype(), 2, 1), *plan[1:]]  # 9 trials on 2 slots: the dispatch order matters
        return Simulator(stages, m, SimSettings(samples=500, seed=1)).simulate(narrow).stage_durations[0]

    assert np.array_equal(first_stage(0.9), first_stage(0.0))
    # and the simulator's lower bound of a task's factor still holds below a fast measured survivor
    fast = Simulator(stages, model, SimSettings(known_trials={0: KnownTrials((-3.0,), (1,))}))
    assert fast.min_factor() <= math.exp(-3.0)


# -- the run's survivors -------------------------------------------------------------------------------------------


def test_the_survivors_are_the_finished_stages_promotions_best_first_with_their_epochs(tmp_path):
    spec = load_spec(write_job(tmp_path / "job", trials=3, eta=3, min_epochs=1, max_epochs=3))
    plan = make_plan(spec, [("local.cpu2", 1, 1), ("local.cpu4", 1, 2)])
    events = [J.RunStarted(t=0.0, run_id="r", spec_sha256="x", spec={}, plan={}, cloud="local", deadline_s=60.0)]
    for i in range(3):
        events.append(J.TrialCreated(t=0.0, trial_id=f"t{i}", bracket=0, index=i, config={}))
        events.append(J.Epoch(t=1.0, trial_id=f"t{i}", epoch=0, metrics={"loss": 1.0 - i / 10}, seconds=1.0 + i))
    events.append(J.StageFinished(t=4.0, stage=0, bracket=0, metrics={}, promoted=["t2"], ranking=["t2", "t1", "t0"]))
    state = fold(events)
    from rubberband.catalog import load_catalog

    catalog = load_catalog(["local"])
    survivors = measured_survivors(state, plan.stages, [1], ("loss", "min"), lambda s: catalog.find(s.instance_type))
    assert survivors == {0: (TrialTimes("t2", (EpochTime("CPU", 1, 1, 3.0),)),)}
    # while stage 0 still runs, its trials by their latest metric (best first)
    running = fold(events[:-1])
    ranked = measured_survivors(running, plan.stages, [1], ("loss", "min"), lambda s: catalog.find(s.instance_type))
    assert [t.trial_id for t in ranked[0]] == ["t2", "t1", "t0"]
    # a bracket that has not started yet has no survivors
    assert measured_survivors(state, plan.stages, [0], ("loss", "min"), lambda s: catalog.find(s.instance_type)) == {}


def test_the_replanner_predicts_from_the_survivors_measured_speed(tmp_path):
    spec = load_spec(write_job(tmp_path / "job", trials=3, eta=3, min_epochs=1, max_epochs=3))
    profile = load_profile(write_cpu_profile(tmp_path / "p.json", epoch_s=1.0))
    from rubberband.catalog import load_catalog
    from rubberband.planner import simulate_plan

    catalog = load_catalog(["local"])
    plan = simulate_plan(make_plan(spec, [("local.cpu2", 1, 1), ("local.cpu1", 1, 1)]), profile, catalog, samples=200)
    request = ReplanRequest(
        spec=spec,
        plan=plan,
        next_stage=1,
        elapsed_s=5.0,
        spent_usd=0.0,
        remaining_deadline_s=60.0,
        running={"local:local:local.cpu1": 1},
    )
    replan = planner_replanner(catalog, profile)
    drawn = replan(request).current_jct_p50_s
    slow = TrialTimes("t0", (EpochTime("CPU", 1, 1, 3.0),))  # three times the profile's epoch
    measured = replan(dataclasses.replace(request, survivors={0: (slow,)})).current_jct_p50_s
    assert measured == pytest.approx(3.0 * drawn, rel=0.1)
    assert known_trials(fit_performance_model(profile), {0: (slow,)})[0].log_speeds == pytest.approx((math.log(3.0),))


def test_where_configurations_differ_the_survivors_latencies_do_not_reshape_the_model(tmp_path):
    """A later stage's iteration latencies are its survivors': slow ones where slow configurations score best. Folded
    into the device fit they made that stage's worker count look slow, so survivors measured there looked fast and
    a re-plan to another worker count predicted their next stage 25-28 % short (real runs, slow-better workload).
    Their own measured speed carries the run's truth; the latencies no longer move the prediction."""
    from rubberband.catalog import load_catalog
    from rubberband.planner import simulate_plan

    spec = load_spec(write_job(tmp_path / "job", trials=3, eta=3, min_epochs=1, max_epochs=3))
    profile = load_profile(write_spread_profile(tmp_path / "p.json", rho=0.8))
    catalog = load_catalog(["local"])
    plan = simulate_plan(make_plan(spec, [("local.cpu2", 1, 2), ("local.cpu1", 1, 1)]), profile, catalog, samples=200)
    model = fit_performance_model(profile)
    two = model.epoch_time("CPU", 2, 1) + model.epoch_overhead_s
    slow = TrialTimes("t0", (EpochTime("CPU", 2, 1, 3.0 * two),))  # 3x the model's epoch at 2 workers
    t_iter = model.devices["CPU"].t_iter(model.batch_size_per_worker, 2, 1)
    request = ReplanRequest(
        spec=spec,
        plan=plan,
        next_stage=1,
        elapsed_s=5.0,
        spent_usd=0.0,
        remaining_deadline_s=600.0,
        running={"local:local:local.cpu1": 1},
        survivors={0: (slow,)},
        iteration_latencies={"CPU/2/1": [3.0 * t_iter] * 50},  # the slow survivor's own iterations
    )
    replan = planner_replanner(catalog, profile)
    with_latencies = replan(request).current_jct_p50_s
    without = replan(dataclasses.replace(request, iteration_latencies={})).current_jct_p50_s
    assert with_latencies == pytest.approx(without, rel=0.01)


# -- end to end on virtual time -------------------------------------------------------------------------------------


def test_the_last_boundary_predicts_the_last_stage_from_its_survivors_on_virtual_time(tmp_path, capsys):
    spec = write_job(tmp_path / "job", trials=27, eta=3, min_epochs=1, max_epochs=9, epoch_s=1.0)
    data = json.loads(spec.read_text())
    data["profile"] = str(write_spread_profile(tmp_path / "profile.json", rho=0.9))
    spec.write_text(json.dumps(data))
    errors = []
    for seed in range(3):
        data["seed"] = seed
        spec.write_text(json.dumps(data))
        run_dir = tmp_path / f"run-{seed}"
        assert cli(["run", str(spec), "--deadline", "40s", "--cloud", "sim", "--yes", "--run-dir", str(run_dir)]) == 0
        events = list(J.iter_events(run_dir / J.JOURNAL_NAME))
        last = max(e["stage"] for e in events if e["type"] == J.STAGE_FINISHED)
        started = [e for e in events if e["type"] == J.STAGE_STARTED and e["stage"] == last][-1]
        (finished,) = [e for e in events if e["type"] == J.STAGE_FINISHED and e["stage"] == last]
        actual = finished["t"] - started["t"]
        errors.append(abs(boundary_prediction(events, last) - actual) / actual)
    capsys.readouterr()
    # the boundary's prediction of the last stage (the survivors' own speeds) lands within 15 % of what it took
    assert max(errors) < 0.15, errors


def test_the_profiler_scores_a_configuration_by_its_last_epoch_higher_better():
    from rubberband.executor.context import ReportRecord
    from rubberband.profiler.runner import configuration_quality

    reports = [ReportRecord(epoch=e, metrics={"loss": 1.0 / (e + 1)}, seconds=1.0, finished_at=0.0) for e in range(3)]
    assert configuration_quality(reports, "loss", "min") == pytest.approx(-1.0 / 3)
    assert configuration_quality(reports, "loss", "max") == pytest.approx(1.0 / 3)
    assert (
        configuration_quality(reports, "accuracy", "max") is None and configuration_quality([], "loss", "min") is None
    )


def test_a_replay_of_a_runs_own_trials_lands_on_its_jct_on_virtual_time(tmp_path, capsys):
    """bench/bench_real_runs.py's replay: the plan simulated with every trial at the speed the journal measured,
    in the order its promotions put them. On virtual time the world plays the model, so the replay must land on
    the run's own JCT: what is left between the two on a real run is the model's form, not the population."""
    from rubberband.catalog import load_catalog
    from rubberband.executor.survivors import bracket_history
    from rubberband.inputs import load_job_inputs
    from rubberband.plan import Plan
    from rubberband.planner.plan_record import configs_of

    spec_path = write_job(tmp_path / "job", trials=27, eta=3, min_epochs=1, max_epochs=9, epoch_s=1.0)
    data = json.loads(spec_path.read_text())
    data["profile"] = str(write_spread_profile(tmp_path / "profile.json", rho=0.0))
    spec_path.write_text(json.dumps(data))
    run_dir = tmp_path / "run"
    assert cli(["run", str(spec_path), "--deadline", "60s", "--cloud", "sim", "--yes", "--run-dir", str(run_dir)]) == 0
    capsys.readouterr()
    state = J.read_state(run_dir)
    plan = Plan.model_validate(state.plan)
    catalog = load_catalog(["local"])
    history = bracket_history(state, list(plan.stages), ("loss", "min"), lambda s: catalog.find(s.instance_type))
    order = [t.trial_id for t in history[0]]
    assert len(order) == 27 and order[:3] == sorted(state.stages[2].metrics, key=state.stages[2].metrics.get)
    inputs = load_job_inputs(spec_path)
    model = fit_performance_model(inputs.profile)
    stages, configs = configs_of(plan, catalog)
    known = known_trials(model, history)
    replayed = Simulator(stages, model, SimSettings(samples=200, known_trials=known)).simulate(configs)
    jct = json.loads((run_dir / "result.json").read_text())["actual"]["jct_s"]
    assert replayed.jct_quantile(0.5) == pytest.approx(jct, rel=0.05)
