"""The variation model: fitting per-epoch noise and configuration speed, and sampling them."""

import dataclasses
import json
import math

import numpy as np
import pytest

from rubberband.planner.model import fit_performance_model
from rubberband.planner.noise import (
    Variation,
    bracket_log_speeds,
    fit_speed_quality,
    fit_variation,
    schedule_tasks,
    task_factors,
)
from rubberband.planner.schedule import Stage, sha_stages
from rubberband.planner.plan_space import StageConfig
from rubberband.planner.simulator import SimSettings, Simulator
from rubberband.profile import load_profile, parse_profile
from conftest import EXAMPLES
from planner_helpers import ideal_model, itype, synthetic_profile


@dataclasses.dataclass(frozen=True)
class Spread:
    """The true variation of epoch times: each configuration's speed lognormal (``config_sigma`` around
    ``log_mean``), each epoch's around it (``epoch_sigma``), relative to a ``predicted`` epoch time."""

    config_sigma: float
    epoch_sigma: float
    log_mean: float = 0.0
    predicted: float = 10.0


def samples(rng, spread: Spread, *, configs, epochs):
    speeds = np.exp(spread.log_mean + spread.config_sigma * rng.standard_normal(configs))
    return [list(spread.predicted * s * np.exp(spread.epoch_sigma * rng.standard_normal(epochs))) for s in speeds]


def test_fit_recovers_known_sigmas_from_many_configurations():
    rng = np.random.default_rng(1)
    times = samples(rng, Spread(0.2, 0.1, log_mean=0.3), configs=200, epochs=8)
    v = fit_variation(times, [10.0] * len(times))
    assert v.epoch_sigma_fit == pytest.approx(0.1, rel=0.05)
    assert v.config_sigma_fit == pytest.approx(0.2, rel=0.12)
    assert v.config_log_mean == pytest.approx(0.3, abs=0.04)
    # planned σs are upper bounds: above the point estimates, by little with this much data
    assert v.epoch_sigma_fit <= v.epoch_sigma <= 1.05 * v.epoch_sigma_fit
    assert v.config_sigma_fit <= v.config_sigma <= 1.15 * v.config_sigma_fit
    assert v.configs == 200 and v.epochs == 1600 and v.source.startswith("measured")


def test_fit_is_relative_to_the_predicted_epoch_time():
    v = fit_variation([[20.0, 20.0], [40.0, 40.0]], [10.0, 20.0])  # both twice the prediction
    assert v.config_log_mean == pytest.approx(math.log(2.0))
    assert v.config_sigma == 0.0 and v.epoch_sigma == 0.0


@pytest.mark.parametrize("configs, epochs", [(3, 3), (5, 2), (8, 4)])
def test_the_planned_sigmas_cover_the_truth_at_the_bound_level(configs, epochs):
    """With few configurations the bound is wide; it covers the true σ in ≥ ~90 % of fits."""
    rng = np.random.default_rng(configs * 100 + epochs)
    covered_c = covered_e = 0
    runs = 1500
    for _ in range(runs):
        times = samples(rng, Spread(0.15, 0.05), configs=configs, epochs=epochs)
        v = fit_variation(times, [10.0] * configs)
        covered_c += v.config_sigma >= 0.15
        covered_e += v.epoch_sigma >= 0.05
    assert covered_e / runs >= 0.88
    assert covered_c / runs >= 0.88


def test_a_bound_is_capped_but_a_measured_spread_above_the_cap_is_planned_as_measured():
    """Configurations that really differ more than the cap (conv width tuned 16-128 channels: σ ≈ 0.8) are
    planned at their measured σ, not cut to the cap below it; a few samples' bound beyond it is capped."""
    from rubberband.planner.noise import MAX_SIGMA

    rng = np.random.default_rng(7)
    wide = fit_variation(samples(rng, Spread(0.8, 0.05), configs=8, epochs=3), [10.0] * 8)
    assert wide.config_sigma_fit > MAX_SIGMA and wide.config_sigma == wide.config_sigma_fit
    narrow = fit_variation(samples(rng, Spread(0.35, 0.05), configs=3, epochs=3), [10.0] * 3)
    assert narrow.config_sigma_fit < MAX_SIGMA and narrow.config_sigma == MAX_SIGMA  # its bound, capped


def test_one_configuration_leaves_config_speed_unmeasured():
    v = fit_variation([[1.0, 1.1, 0.9]], [1.0])
    assert v.config_sigma == 0.0 and v.epoch_sigma > 0 and "not measured" in v.source
    assert not Variation().active and fit_variation([], []) == Variation()


def test_task_factors_keep_trial_speed_and_average_epochs():
    rng = np.random.default_rng(0)
    z_t, z_e = rng.standard_normal((200_000, 1)), rng.standard_normal((200_000, 1))
    one = task_factors(Variation(epoch_sigma=0.2, config_sigma=0.1, config_log_mean=0.05), z_t, z_e, 1)
    assert np.log(one).mean() == pytest.approx(0.05, abs=0.003)
    assert np.log(one).std() == pytest.approx(math.hypot(0.1, 0.2), rel=0.01)
    # the mean of 9 epochs' factors: same mean, a ninth of the variance (of the epoch part)
    v = Variation(epoch_sigma=0.2)
    nine = task_factors(v, z_t, z_e, 9)
    exact = np.exp(0.2 * rng.standard_normal((200_000, 9))).mean(axis=1)
    assert nine.mean() == pytest.approx(exact.mean(), rel=0.002)
    assert nine.std() == pytest.approx(exact.std(), rel=0.02)


def brute_schedule(ready, base, factor, overhead):
    slots, free = len(ready), list(ready)
    counts, busy = [0] * slots, [0.0] * slots
    for m in range(len(factor)):
        j = min(range(slots), key=lambda k: (free[k], k))
        d = base[j] * factor[m] + overhead
        free[j] += d
        counts[j] += 1
        busy[j] += d
    return counts, free, busy


@pytest.mark.parametrize("slots, trials", [(3, 7), (4, 4), (5, 2), (1, 3)])
def test_schedule_tasks_matches_a_per_sample_event_loop(slots, trials):
    rng = np.random.default_rng(slots * 10 + trials)
    S = 50
    ready = rng.uniform(0, 5, (S, slots))
    base = rng.uniform(5, 10, (S, slots))
    factor = np.exp(0.3 * rng.standard_normal((S, trials)))
    counts, last, busy = schedule_tasks(ready, base, factor, 1.5)
    for s in range(S):
        c, f, b = brute_schedule(ready[s], base[s], factor[s], 1.5)
        if slots == trials and counts[s].tolist() == [1] * slots:
            # one wave: every slot runs one task; which task goes where is exchangeable (i.i.d. factors)
            assert c == [1] * slots
            continue
        assert counts[s].tolist() == c
        assert last[s] == pytest.approx(f)
        assert busy[s] == pytest.approx(b)


def model_with(variation: Variation):
    return dataclasses.replace(ideal_model(t_iter=0.1, dataset=100, batch=10), variation=variation)


def test_the_simulator_samples_trial_speed_and_epoch_noise():
    # one trial, one slot, one stage of 4 epochs: JCT = 4 s × trial factor × mean epoch factor
    stages = [Stage(0, 0, 1, 4, 4)]
    v = Variation(epoch_sigma=0.2, config_sigma=0.1, config_log_mean=0.1)
    sim = Simulator(stages, model_with(v), SimSettings(samples=20_000, seed=3))
    jct = sim.simulate([StageConfig(itype(), 1, 1)]).jct
    a2 = math.log1p(math.expm1(0.04) / 4)
    assert np.log(jct / 4.0).mean() == pytest.approx(0.1 + 0.5 * (0.04 - a2), abs=0.005)
    assert np.log(jct / 4.0).std() == pytest.approx(math.sqrt(0.01 + a2), rel=0.03)
    # without variation the job takes exactly its median time
    assert np.allclose(
        Simulator(stages, model_with(Variation()), SimSettings(samples=10)).simulate([StageConfig(itype(), 1, 1)]).jct,
        4.0,
    )


def test_the_population_mean_is_as_uncertain_as_its_configurations_leave_it():
    """Eight configurations know their population's log-mean to s/√8; the fit says so and no longer widens each
    configuration's own σ by it."""
    rng = np.random.default_rng(4)
    times = samples(rng, Spread(0.6, 0.05), configs=8, epochs=3)
    v = fit_variation(times, [10.0] * 8)
    means = np.array([np.log(np.asarray(t) / 10.0).mean() for t in times])
    assert v.config_mean_se == pytest.approx(means.std(ddof=1) / math.sqrt(8))
    assert v.describe()["config_mean_se"] == pytest.approx(v.config_mean_se, abs=1e-6)
    many = fit_variation(samples(rng, Spread(0.6, 0.05), configs=200, epochs=3), [10.0] * 200)
    assert many.config_mean_se == pytest.approx(0.6 / math.sqrt(200), rel=0.15)
    assert fit_variation([[10.0, 11.0]], [10.0]).config_mean_se == 0.0  # one configuration: no spread at all


def test_a_samples_drawn_trials_move_together_by_the_population_means_draw():
    v = Variation(config_sigma=0.5, config_mean_se=0.2)
    trial_z = np.zeros((3, 4))
    mean_z = np.array([-1.0, 0.0, 2.0])
    drawn = bracket_log_speeds(v, trial_z, None, None, mean_z)
    assert np.allclose(drawn, np.array([[-0.2] * 4, [0.0] * 4, [0.4] * 4]))
    assert np.allclose(bracket_log_speeds(dataclasses.replace(v, config_mean_se=0.0), trial_z, None, None, mean_z), 0)


def test_the_population_means_uncertainty_widens_a_runs_prediction_not_its_centre():
    """27 trials average their own speeds out; a shared shift of all of them does not average out."""
    stages = sha_stages(27, 3, 1, 9)
    configs = [StageConfig(itype(), 9, 1), StageConfig(itype(), 3, 1), StageConfig(itype(), 1, 1)]
    known = Variation(config_sigma=0.6)
    unsure = dataclasses.replace(known, config_mean_se=0.2)
    a = Simulator(stages, model_with(known), SimSettings(samples=4000, seed=2)).simulate(configs).jct
    b = Simulator(stages, model_with(unsure), SimSettings(samples=4000, seed=2)).simulate(configs).jct
    assert np.median(b) == pytest.approx(np.median(a), rel=0.04)
    # every trial's time scales with the sample's shift: its variance adds to the run's
    assert np.log(b).std() == pytest.approx(math.hypot(np.log(a).std(), 0.2), rel=0.05)


def test_the_asha_baseline_draws_the_populations_mean_speed_once_per_sample():
    """As the elastic plans' simulator does: one shift of every trial's speed per sample, so a run's trials move
    together and the baseline's JCT spreads by the mean's uncertainty, its centre unmoved."""
    from rubberband.planner.asha import AshaCluster, AshaSchedule, AshaSettings, AshaSimulator

    schedule = AshaSchedule(trials=9, eta=3, min_epochs=1, max_epochs=9)
    known = Variation(config_sigma=0.6)
    unsure = dataclasses.replace(known, config_mean_se=0.2)
    cluster = AshaCluster(itype(), 3, 1)
    a = AshaSimulator(model_with(known), schedule, AshaSettings(samples=3000, seed=4)).simulate(cluster).jct
    b = AshaSimulator(model_with(unsure), schedule, AshaSettings(samples=3000, seed=4)).simulate(cluster).jct
    assert np.median(b) == pytest.approx(np.median(a), rel=0.05)
    assert np.log(b).std() == pytest.approx(math.hypot(np.log(a).std(), 0.2), rel=0.1)


def test_scores_are_ranked_within_their_own_group():
    """A run's first-stage scores and the profiler's later ones are on different scales: ranked within each."""
    slow = [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0]
    score = [1.0, 2.0, 3.0, 4.0, 5.0, 11.0, 12.0, 13.0, 14.0, 15.0]  # perfectly rank-correlated within each half
    shifted = score[:5] + [s - 20.0 for s in score[5:]]  # the second group scored after fewer epochs: lower
    groups = ["profiler"] * 5 + ["run-1"] * 5
    assert fit_speed_quality(slow, shifted, groups=groups).fit == pytest.approx(1.0, abs=2e-3)  # z clipped at 0.999
    assert fit_speed_quality(slow, shifted).fit < 0.0  # pooled across scales, the order is lost
    assert fit_speed_quality(slow, score, groups=["one"] * 10).fit == pytest.approx(1.0)


def test_configurations_in_groups_too_small_to_rank_do_not_count_toward_a_fit():
    """Five configurations ranked in one group and three runs of one scored trial each: five support the
    correlation, not eight, so it is planned at its upper bound (RHO_MIN_CONFIGS is 8)."""
    from rubberband.planner.noise import RHO_MIN_CONFIGS

    slow = [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8]
    score = [1.0, 2.0, 3.0, 4.0, 5.0, 9.0, 1.0, 3.0]
    groups = ["profiler"] * 5 + ["run-1", "run-2", "run-3"]
    assert RHO_MIN_CONFIGS == 8
    small = fit_speed_quality(slow, score, groups=groups)
    assert small.bound and "5 scored configurations" in small.source
    assert not fit_speed_quality(slow, score, groups=["one"] * 8).bound  # the same eight in one group: fitted


def test_a_trial_keeps_its_speed_through_the_stages():
    stages = sha_stages(3, 3, 1, 3)  # 3 trials × 1 epoch, then 1 trial × 2 more epochs
    sim = Simulator(stages, model_with(Variation(config_sigma=0.3)), SimSettings(samples=5000, seed=1))
    res = sim.simulate([StageConfig(itype(), 3, 1), StageConfig(itype(), 1, 1)])
    d0, d1 = np.log(res.stage_durations[0]), np.log(res.stage_durations[1])
    # stage 1's trial is one of stage 0's: its speed is correlated with stage 0's slowest
    assert np.corrcoef(d0, d1)[0, 1] > 0.3
    # the trace rebuilds the same critical path as the sample
    _, _, critical = sim.trace(res.configs, 7)
    assert critical == pytest.approx(res.jct[7])


def test_common_random_numbers_across_plans_and_sample_prefixes():
    stages = sha_stages(9, 3, 1, 9)
    v = Variation(epoch_sigma=0.1, config_sigma=0.2)
    sim = Simulator(stages, model_with(v), SimSettings(samples=400, seed=5))
    plan = [StageConfig(itype(), 9, 1), StageConfig(itype(), 3, 1), StageConfig(itype(), 1, 1)]
    full = sim.simulate(plan).jct
    prefix = Simulator(stages, model_with(v), SimSettings(samples=400, seed=5)).simulate(plan, samples=32).jct
    assert np.array_equal(full[:32], prefix)
    # fewer instances (waves) never finish sooner on the same draws
    slower = sim.simulate([StageConfig(itype(), 3, 1), StageConfig(itype(), 1, 1), StageConfig(itype(), 1, 1)]).jct
    assert np.all(slower >= full - 1e-9)


def test_v1_profiles_load_without_variation_and_v2_profiles_fit_it():
    old = load_profile(EXAMPLES / "profiles" / "quickstart_local.json")
    assert old.schema_version == 1 and old.epoch_measurements == []
    model = fit_performance_model(old)
    assert not model.variation.active and "not measured" in model.variation.source
    data = json.loads(synthetic_profile([(1, 1), (2, 1)]).model_dump_json())
    data["schema_version"] = 2
    t = 100 * 0.10  # 6400 / 64 iterations × 0.1 s
    data["epoch_measurements"] = [
        {
            "config": {"lr": i},
            "device": "V100",
            "workers": 1,
            "iterations_per_epoch": 100,
            "epoch_times_s": [t * s * e for e in (0.95, 1.0, 1.05)],
        }
        for i, s in enumerate((0.8, 1.0, 1.25))
    ]
    model = fit_performance_model(parse_profile(data))
    v = model.variation
    assert v.active and v.configs == 3 and v.config_sigma > v.config_sigma_fit > 0.1
    assert model.describe()["variation"]["configs"] == 3
    with pytest.raises(Exception, match="schema_version 3"):
        parse_profile({**data, "schema_version": 3})


def test_branch_and_bound_stays_exact_and_its_bounds_valid_with_variation():
    import itertools

    from rubberband.catalog import load_catalog
    from rubberband.planner.baselines import cheapest_feasible, exact_optimum, lower_bounds
    from rubberband.planner.search import Evaluator, Goal, PlanSearch, PlanSpace

    base = fit_performance_model(load_profile(EXAMPLES / "profiles" / "resnet50_cifar10_v100.json"))
    model = dataclasses.replace(base, variation=Variation(epoch_sigma=0.15, config_sigma=0.25, config_log_mean=-0.1))
    catalog = load_catalog(["aws"])
    types = [catalog.find(n) for n in ("p3.2xlarge", "g4dn.xlarge")]
    stages = sha_stages(4, 2, 1, 4)
    space = PlanSpace(stages, types, model, 2)
    ev = Evaluator(Simulator(stages, model, SimSettings(samples=100, seed=2)), 32)
    plans = list(itertools.product(*[space.options(i) for i in range(len(stages))]))
    results = {p: ev.full(p) for p in plans}
    for plan, res in results.items():
        cost_lb, jct_lb = lower_bounds(space, ev, plan)
        assert cost_lb <= res.cost_mean + 1e-12 and jct_lb <= res.jct.min() + 1e-9
    deadline = sorted(r.jct_quantile(0.9) for r in results.values())[len(results) // 3]
    best_cost = min(r.cost_mean for r in results.values() if r.meets(deadline, 0.9))
    assert exact_optimum(PlanSearch(space, ev, Goal(deadline, 0.9))).result.cost_mean == pytest.approx(best_cost)
    assert cheapest_feasible(PlanSearch(space, ev, Goal(deadline, 0.9)), plans).result.cost_mean == pytest.approx(
        best_cost
    )
