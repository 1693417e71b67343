"""Planner entry points: plan a job, re-plan remaining stages, re-simulate a plan.

``plan_job`` turns (spec, profile, catalog) into a full :class:`rubberband.plan.Plan` (its knobs:
:class:`PlanOptions`); ``plan_stages`` is the lower-level call the executor uses mid-run (the remaining
stages' :class:`~rubberband.planner.search.PlanSpace`, the remaining deadline as a
:class:`~rubberband.planner.search.Goal`, the instances already running in its
:class:`~rubberband.planner.simulator.SimSettings`); ``simulate_plan`` re-simulates an existing plan (what
a replay changes: :class:`Replay`). All pure: the caller times the planner and fills ``plan.planner.seconds``.

ASHA jobs are planned in :mod:`~rubberband.planner.asha_plan`, which also gives a SHA or Hyperband plan its ASHA
baseline; what a plan records beside its stages is built in :mod:`~rubberband.planner.plan_record`, and the types
a job may use come from :mod:`~rubberband.planner.offerings`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Literal, Mapping, Sequence

import numpy as np

from rubberband.catalog import Catalog
from rubberband.errors import InfeasibleError, PlanFileError
from rubberband.plan import (
    Alternative,
    CatalogInfo,
    Handoff,
    Plan,
    PlannerInfo,
    SpotInfo,
    SpotZoneInfo,
    StagePlan,
    Timeline,
    TriedZone,
)
from rubberband.planner.asha_plan import AshaJob, asha_info, plan_asha
from rubberband.planner.beside import Beside, in_turn
from rubberband.planner.baselines import (
    BaselineResult,
    cheapest_feasible,
    exact_optimum,
    lower_bounds,
    shrink,
    static_plans,
)
from rubberband.planner.brackets import (
    BracketSetup,
    ParallelSimulator,
    bracket_ranges,
    optimise_offsets,
    parallel_knapsack_plans,
)
from rubberband.planner.model import PerformanceModel, fit_performance_model
from rubberband.planner.offerings import allowed_types, region_twins_merged
from rubberband.planner.plan_record import (
    configs_of,
    head_info,
    head_start_s,
    heads_of,
    job_info,
    prediction,
    profile_sha256,
    survivor_info,
    variation_notes,
)
from rubberband.planner.schedule import Stage, stages_for
from rubberband.planner.policies import SpotPolicy
from rubberband.planner.search import (
    Evaluator,
    Goal,
    PlanSearch,
    PlanSimulator,
    PlanSpace,
    DescentResult,
    ascend,
    descend,
    knapsack_plans,
    local_moves,
    simple_moves,
    with_markets,
)
from rubberband.planner.spot import (
    ModelScenario,
    SpotMarketModel,
    SpotScenario,
    SpotSetup,
    ZoneModel,
    cheapest_fallbacks,
)
from rubberband.planner.spotzones import model_setup, offer_of, why_not_spot
from rubberband.planner.plan_space import HeadSpec, StageConfig, normalise
from rubberband.planner.simulator import SimResult, SimSettings, Simulator
from rubberband.profile import Profile
from rubberband.spec import JobSpec
from rubberband.units import format_duration, format_usd

DEFAULT_SAMPLES = 1000
SCREEN_SAMPLES = 32
SCREEN_SLACK = 4  # pool plans with fewer than ceil(p·32) − 4 screening samples in time are not simulated fully
#: ... nor pool plans whose screening samples say they cost this share more than the best found (baselines.
#: clearly_costlier: beyond three standard errors of the paired difference too). Screened and full mean costs of
#: pool plans agreed within 0.2 % on SHA n=729 and Hyperband R=243, where near-ties within 1 % were most fulls.
SCREEN_COST_MARGIN = 0.003
SHORTEST_CONFIRMED = 8  # when no plan meets the deadline: pool plans confirmed in the search for the shortest JCT
#: The best static plan is "as cheap" as the elastic one when it costs at most this fraction more (mean).
STATIC_TIE = 0.01


@dataclass
class StagesPlan:
    """Outcome of planning a sequence of stages."""

    stages: list[Stage]
    configs: tuple[StageConfig, ...]
    result: SimResult
    timeline: Timeline
    static: tuple[tuple[StageConfig, ...], SimResult, Timeline] | None
    exact: tuple[tuple[StageConfig, ...], SimResult, Timeline] | None
    candidates_evaluated: int
    iterations: int
    samples: int
    seed: int
    notes: list[str] = field(default_factory=list)
    head: HeadSpec | None = None  # the billed head the predictions include (boot resolved)
    brackets: Literal["sequential", "parallel"] = "sequential"  # how Hyperband brackets run
    offsets: tuple[float, ...] = ()  # parallel: each bracket's start offset (s)
    handoffs: list = field(default_factory=list)  # parallel: brackets.Handoff of the representative sample
    #: How far the exact search got ("proven optimal (N nodes searched)" or "capped after N nodes, ...").
    exact_note: str | None = None


def stage_plans(
    stages: Sequence[Stage],
    configs: Sequence[StageConfig],
    result: SimResult | None = None,
    model: PerformanceModel | None = None,
    settings: SimSettings | None = None,
) -> list[StagePlan]:
    """The plan's stages, as simulated with ``settings`` (its ``spot``: every stage bought at spot, the old
    reading of ``resources.spot``; its ``spot_setup``: spot per stage) with ``result``'s predictions.

    With ``model``, each says its median task time (``predicted_task_s``), from which the executor times the next
    stage's prefetch before a trial has finished, as the simulator does. With a spot setup too, a spot stage says
    its zone (the first its requests try), its zone-weighted spot price, whether its spot model is a prior, and
    its trials' fall-back type (and how much slower it is)."""
    out = []
    tasks: list[float | None] = [None] * len(configs)
    spot = settings is not None and settings.spot
    spot_setup = None if settings is None else settings.spot_setup
    sim = None
    if model is not None:
        sim = Simulator(stages, model, SimSettings(samples=1, spot_setup=spot_setup))
        normal = [normalise(c, s.trials) for c, s in zip(configs, stages)]
        tasks = [sum(sim.task_time(i, c, normal[i - 1] if i else None)) for i, c in enumerate(normal)]
    zones = {} if spot_setup is None else spot_setup.zones
    offers = {} if spot_setup is None else spot_setup.offers
    for i, (st, c) in enumerate(zip(stages, configs)):
        moved_to = None if spot_setup is None or not c.spot else spot_setup.fallback(c.instance_type)
        if moved_to is not None and moved_to.key == c.instance_type.key:
            moved_to = None
        offer = offers.get((c.instance_type.cloud, c.instance_type.region, c.instance_type.name)) if c.spot else None
        out.append(
            StagePlan(
                bracket=st.bracket,
                stage=st.index,
                trials=st.trials,
                epochs=st.epochs,
                epochs_this_stage=st.epochs_this_stage,
                cloud=c.instance_type.cloud,
                region=c.instance_type.region,
                instance_type=c.instance_type.name,
                instances=c.instances,
                workers_per_trial=c.workers,
                spot=spot or c.spot,
                zone=zones.get((c.instance_type.cloud, c.instance_type.region, c.instance_type.name))
                if c.spot
                else None,
                spot_price_hr=None if offer is None else round(offer.price_hr, 6),
                spot_prior=offer is not None and offer.prior,
                fallback_instance_type=None if moved_to is None else moved_to.name,
                fallback_slowdown=None
                if moved_to is None or sim is None
                else round(sim.spots.fallback_slowdown(normalise(c, st.trials)), 6),
                predicted_duration_s=None if result is None else float(np.quantile(result.stage_durations[i], 0.5)),
                predicted_cost_usd=None if result is None else float(result.stage_costs[i].mean()),
                predicted_task_s=tasks[i],
            )
        )
    return out


def _timeline(sim: PlanSimulator, configs: tuple[StageConfig, ...], result: SimResult) -> Timeline:
    timeline, _, _ = sim.trace(configs, result.representative_index())
    return timeline


@dataclass(frozen=True)
class SearchOptions:
    """How :func:`plan_stages` searches beyond the plan space, the goal and the simulation settings.

    ``brackets``: None runs Hyperband's brackets one after another; a :class:`~rubberband.planner.brackets.
    BracketSetup` runs them side by side (:mod:`~rubberband.planner.brackets`), the search picking the bracket
    start offsets unless the setup fixes them (the remainder of a parallel run re-planned mid-run, where each
    bracket's next stage starts when its running stage ends or its start offset comes: :func:`~rubberband.planner.
    brackets.parallel_remainder`; its ``states``: the instances already running for each bracket's next stage).
    ``include_exact``: also search the whole plan space exactly (small jobs; sequential brackets only).
    ``screen_samples``: the samples a candidate is screened with before it is confirmed with all."""

    brackets: BracketSetup | None = None
    include_exact: bool = False
    screen_samples: int = SCREEN_SAMPLES


def plan_stages(
    space: PlanSpace, goal: Goal, settings: SimSettings | None = None, options: SearchOptions | None = None
) -> StagesPlan:
    """Cheapest plan of ``space`` (its stages, allowed types, performance model and trial width cap) meeting
    ``goal``: its deadline (seconds from now) at its confidence, within its budget.

    ``settings`` says how every candidate is simulated: samples and seed; ``start_state``, the instances already
    up (re-planning mid-run: the first stage reuses them when it keeps their type); ``heads`` (cloud →
    :class:`HeadSpec`), the run's billed head in every candidate whose first stage runs on that cloud, the static
    baseline included; ``spot``, the old all-spot pricing; ``spot_setup``, spot allowed per stage.
    ``options`` (:class:`SearchOptions`): parallel or sequential brackets, the exact search, the screening.

    With parallel brackets (``options.brackets``) the search also picks bracket start offsets (unless fixed) and
    whether one bracket after another is cheaper; the static baseline is a fixed cluster running the brackets one
    after another either way. Raises InfeasibleError with the shortest achievable JCT (and its cost) when no
    plan meets the deadline, or with the cheapest plan's cost when over budget.

    With a ``spot_setup`` (spot allowed per stage, types it has a scenario for) the search first finds the
    cheapest on-demand plan, then descends with the market as one more move dimension
    (:func:`~rubberband.planner.search.with_markets`) from it, from it all on spot and from the fastest
    plan all on spot; every candidate is simulated with preemptions and the SpotPolicy fall-back, so
    P(meet) and cost include them. The static baseline stays on-demand.
    """
    if not space.stages:
        raise ValueError("plan_stages needs at least one stage")
    return _StagesSearch(space, goal, settings or SimSettings(), options or SearchOptions()).run()


class _StagesSearch:
    """One :func:`plan_stages` search: its simulators, the plan chosen so far, and what it has counted."""

    def __init__(self, space: PlanSpace, goal: Goal, settings: SimSettings, options: SearchOptions) -> None:
        self.space, self.goal, self.settings, self.options = space, goal, settings, options
        stages, model, brackets = space.stages, space.model, options.brackets
        self.parallel = brackets is not None and len(bracket_ranges(stages)) > 1
        self.fixed = brackets is not None and brackets.offsets is not None
        self.sim: PlanSimulator
        if self.parallel:
            self.sim = ParallelSimulator(stages, model, settings, brackets)
        else:
            self.sim = Simulator(stages, model, settings)
        self.search = PlanSearch(space, Evaluator(self.sim, options.screen_samples), goal)
        # the static baseline is a fixed cluster: simulated with every instance held to the end, on-demand
        held = replace(settings, options=replace(settings.options, hold_to_end=True), spot_setup=None)
        self.static_sim = Simulator(stages, model, held)
        self.notes: list[str] = []
        self.candidates = 0
        self.iterations = 0
        self.chosen: tuple[tuple[StageConfig, ...], SimResult] | None = None
        self.incumbent: tuple[tuple[StageConfig, ...], SimResult] | None = None
        self.fastest = space.fastest()
        self.pool: list[tuple[StageConfig, ...]] = []
        self.static = BaselineResult(None, None, 0)  # the best static plan (:meth:`_pool_search`)

    def run(self) -> StagesPlan:
        self._pool_search()
        self._descend()
        if self.parallel and self.chosen is not None and not self.fixed:
            self._move_offsets()
            self._try_sequential()
        self._prefer_static()
        setup = self.settings.spot_setup
        if self.chosen is not None and setup is not None and setup.scenarios:
            self.chosen, tried, steps = _spot_descent(self.search, setup, self.chosen, self.pool)
            self.candidates += tried
            self.iterations += steps
        chosen = self.chosen or self._rescue()
        configs, result = chosen
        budget = self.goal.budget_usd
        if budget is not None and result.cost_mean > budget:
            raise InfeasibleError(
                f"the cheapest plan meeting the deadline costs {format_usd(result.cost_mean)} (mean), above the "
                f"budget of {format_usd(budget)}; raise budget_usd or loosen the deadline",
                shortest_jct_s=result.jct_quantile(self.goal.confidence),
                cost_usd=result.cost_mean,
            )
        return self._outcome(tuple(configs), result)

    def _pool_search(self) -> None:
        """The best static plan (the baseline), then the cheapest plan of the deadline-independent pool, searched
        exactly with the static plan as the incumbent (run elastically, it releases what its last stages leave
        idle: the answer is never costlier than the best static plan)."""
        space, search = self.space, self.search
        statics = static_plans(space)
        static_search = search.judged_by(Evaluator(self.static_sim, self.options.screen_samples))
        self.static = cheapest_feasible(
            static_search, statics, screen_slack=SCREEN_SLACK, cost_margin=SCREEN_COST_MARGIN
        )
        if space.skipped:
            self.notes.append(f"not plannable (device not in profile): {', '.join(space.skipped)}")
        self.pool = [self.fastest] + knapsack_plans(space) + [shrink(space, p) for p in statics]
        if self.parallel:
            self.pool += parallel_knapsack_plans(space)
        static_plan = self.static.plan
        if static_plan is not None and search.meets(search.evaluator.full(static_plan)):
            self.incumbent = (static_plan, search.evaluator.full(static_plan))
        best = cheapest_feasible(
            search, self.pool, incumbent=self.incumbent, screen_slack=SCREEN_SLACK, cost_margin=SCREEN_COST_MARGIN
        )
        self.candidates = self.static.evaluated + best.evaluated
        if best.plan is not None and best.result is not None:
            self.chosen = (best.plan, best.result)

    def _descend(self) -> None:
        """RubberBand's greedy from the pool's best plan, and from maximum useful parallelism (the paper's start)
        only when the pool has no feasible plan. The walk down from the fastest plan ended cheaper than the descent
        from the pool's best in none of the 200 workloads of bench_planner_gap.py (seed 0) and in 3 of another 200
        (seed 1: by 1.9 %, 0.35 % and 0.26 %), yet it was most of the planning time (SHA n=729 at 2x the shortest
        deadline: 56 steps, 1,306 of 1,816 candidates; 0.7 s of planning without it, 2.6 s with).

        Then, in jobs of a few stages whose brackets run one after another, the walk up from the cheapest plan
        (:func:`ascend`) and a descent from where it meets the deadline: the optimum of a job whose instances start
        slowly can be the cheapest plan with an instance added to its first stage, which every walk down from a
        faster plan misses (each plan between is costlier or late)."""
        # both starts are fixed before either descent: the second is the pool's best plan, not the first's answer
        starts = ((self.fastest, simple_moves), (None if self.chosen is None else self.chosen[0], local_moves))
        for start, moves in starts:
            if start is None or (moves is simple_moves and self.chosen is not None):
                continue
            self._keep_if_cheaper(descend(self.search, start, moves))
        if self.parallel:  # over both seeds' 102 parallel-bracket cases it found nothing; R=243 planned 1.5x slower
            return
        ceiling = math.inf if self.chosen is None else self.chosen[1].cost_mean
        climbed = ascend(self.search, self.space.cheapest(), below_usd=ceiling)
        self.iterations += climbed.iterations
        self.candidates += climbed.candidates_evaluated
        if climbed.met and climbed.result.cost_mean < ceiling:
            self._keep_if_cheaper(descend(self.search, climbed.plan, local_moves))

    def _keep_if_cheaper(self, refined: DescentResult) -> None:
        """Count a descent's work, and choose its plan when it meets the goal and is cheaper than the one chosen."""
        self.iterations += refined.iterations
        self.candidates += refined.candidates_evaluated
        if self.search.meets(refined.result) and (
            self.chosen is None or refined.result.cost_mean < self.chosen[1].cost_mean
        ):
            self.chosen = (refined.plan, refined.result)

    def _move_offsets(self) -> None:
        """Start shorter brackets later where that hands them instances another bracket releases, then let the
        greedy adapt the stages to the new offsets."""
        if self.chosen is None or not isinstance(self.sim, ParallelSimulator):
            return
        plan, result = self.chosen
        self.sim, moved, tried = optimise_offsets(self.sim, plan, result, self.goal.deadline_s, self.goal.confidence)
        self.candidates += tried
        if moved is not result:
            self.search = self.search.judged_by(Evaluator(self.sim, self.options.screen_samples))
            refined = descend(self.search, plan, local_moves)
            self.iterations += refined.iterations
            self.candidates += refined.candidates_evaluated
            self.chosen = (refined.plan, refined.result)

    def _try_sequential(self) -> None:
        """One bracket after another can still be cheapest (loose deadlines: instances carry over between
        brackets): the static plan and the chosen stages, run sequentially and elastically, compete. One whose
        rigorous bounds say it is late in every sample, or no cheaper, is not simulated."""
        if self.chosen is None:
            return
        seq = Evaluator(Simulator(self.space.stages, self.space.model, self.settings), self.options.screen_samples)
        static_plan = self.static.plan
        for option in ([] if static_plan is None else [static_plan]) + [self.chosen[0]]:
            cost_lb, jct_lb = lower_bounds(self.space, seq, option)
            if jct_lb > self.goal.deadline_s or cost_lb >= self.chosen[1].cost_mean:
                continue
            res = seq.full(option)
            self.candidates += 1
            if self.search.meets(res) and res.cost_mean < self.chosen[1].cost_mean - 1e-12:
                self.sim, self.parallel, self.chosen = seq.sim, False, (option, res)
        if not self.parallel:
            self.search = self.search.judged_by(seq)
            self.notes.append("running the brackets one after another is cheapest here")

    def _prefer_static(self) -> None:
        """An elastic plan a hair cheaper but not faster than the best static plan is no saving worth its
        resizes: say so, run static."""
        chosen, incumbent, static_plan = self.chosen, self.incumbent, self.static.plan
        if (
            chosen is not None
            and incumbent is not None
            and chosen[0] != static_plan
            and static_is_as_good(incumbent[1], chosen[1], self.goal.confidence)
        ):
            self.chosen = chosen = incumbent
        if chosen is not None and static_plan is not None and chosen[0] == static_plan:
            self.notes.append(
                f"the best static plan is as cheap (within {STATIC_TIE:.0%}) and at least as fast as any "
                f"elastic plan found; using the static plan"
            )

    def _rescue(self) -> tuple[tuple[StageConfig, ...], SimResult]:
        """No plan met the deadline in the search. The quickest plan is not always the widest (serial start-ups,
        spanning trials): screen the whole pool by its JCT quantile and confirm the quickest few with every sample;
        one of them (or any plan confirmed before) that meets the deadline is taken (the screens rejected it: never
        call a feasible deadline infeasible), else InfeasibleError names the shortest JCT found."""
        evaluator, confidence, deadline_s = self.search.evaluator, self.goal.confidence, self.goal.deadline_s
        screened = sorted(self.pool, key=lambda p: evaluator.screen(p).jct_quantile(confidence))[:SHORTEST_CONFIRMED]
        evaluated = evaluator.evaluated_full() + [evaluator.full(p) for p in [self.fastest, *screened]]
        feasible = [r for r in evaluated if self.search.meets(r)]
        if feasible:
            found = min(feasible, key=lambda r: r.cost_mean)
            self.notes.append("a plan the screening samples rejected met the deadline in the full evaluation")
            self.chosen = (tuple(found.configs), found)
            return self.chosen
        quickest = min(evaluated, key=lambda r: (r.jct_quantile(confidence), r.cost_mean))
        shortest = quickest.jct_quantile(confidence)
        raise InfeasibleError(
            f"no plan meets the deadline of {format_duration(deadline_s)} with {confidence:.0%} confidence; the "
            f"shortest feasible JCT is {format_duration(shortest)} ({shortest:.0f} s at p{confidence * 100:.0f}) "
            f"costing {format_usd(quickest.cost_mean)}; set the deadline to at least {shortest:.0f} s or lower "
            f"the confidence",
            shortest_jct_s=shortest,
            cost_usd=quickest.cost_mean,
        )

    def _exact(self) -> tuple[tuple[tuple[StageConfig, ...], SimResult, Timeline] | None, str | None]:
        """The exact optimum (with its timeline) and how far its search got, when asked for; independent of the plan
        under test: no incumbent from it, so a wrong plan cannot prune the search."""
        if not self.options.include_exact:
            return None, None
        if self.parallel:
            self.notes.append("the exact optimum is searched for sequential brackets only")
            return None, None
        ex = exact_optimum(self.search)
        note = ex.optimality()
        if ex.plan is None or ex.result is None:
            self.notes.append(f"exact search: no feasible plan found ({note})")
            return None, note
        return (ex.plan, ex.result, _timeline(self.sim, ex.plan, ex.result)), note

    def _outcome(self, configs: tuple[StageConfig, ...], result: SimResult) -> StagesPlan:
        exact, exact_note = self._exact()
        static, static_out = self.static, None
        if static.plan is not None and static.result is not None:
            static_out = (static.plan, static.result, _timeline(self.static_sim, static.plan, static.result))
        sim = self.sim
        return StagesPlan(
            stages=list(self.space.stages),
            configs=configs,
            result=result,
            timeline=_timeline(sim, configs, result),
            static=static_out,
            exact=exact,
            candidates_evaluated=self.candidates,
            iterations=self.iterations,
            samples=self.settings.samples,
            seed=self.settings.seed,
            notes=self.notes,
            head=sim.head_for(configs),
            brackets="parallel" if self.parallel else "sequential",
            offsets=tuple(sim.offsets) if isinstance(sim, ParallelSimulator) else (),
            handoffs=list(getattr(sim, "last_handoffs", [])) if self.parallel else [],
            exact_note=exact_note,
        )


def _spot_descent(
    search: PlanSearch,
    setup: SpotSetup,
    chosen: tuple[tuple[StageConfig, ...], SimResult],
    pool: list[tuple[StageConfig, ...]],
) -> tuple[tuple[tuple[StageConfig, ...], SimResult], int, int]:
    """The greedy again with the market as a move dimension: from the on-demand plan, from it all on spot,
    and from the cheapest plan of the deadline-independent pool (its spot-capable plans, all on spot) that
    meets the deadline with preemptions (branch and bound, as for the on-demand pool)."""

    def allowed(c: StageConfig) -> bool:
        t = c.instance_type
        return t.spot_price_hr is not None and setup.allows(t.cloud, t.region, t.name)

    def all_spot(plan: tuple) -> tuple:
        return tuple(c.on("spot") if allowed(c) else c for c in plan)

    moves = with_markets(local_moves, allowed)
    tried = steps = 0
    spot_pool = [all_spot(p) for p in pool if all(allowed(c) for c in p)]
    best_spot = cheapest_feasible(search, spot_pool, screen_slack=SCREEN_SLACK, cost_margin=SCREEN_COST_MARGIN)
    tried += best_spot.evaluated
    starts = [chosen[0], all_spot(chosen[0])] + ([best_spot.plan] if best_spot.plan is not None else [])
    for start in starts:
        refined = descend(search, start, moves)
        tried += refined.candidates_evaluated + 1
        steps += refined.iterations
        if search.meets(refined.result) and refined.result.cost_mean < chosen[1].cost_mean - 1e-12:
            chosen = (refined.plan, refined.result)
    return chosen, tried, steps


def static_is_as_good(static: SimResult, elastic: SimResult, confidence: float) -> bool:
    """Whether a static plan is as cheap (within :data:`STATIC_TIE`) and at least as fast (JCT at the
    confidence) as an elastic one, so that the elastic plan's resizes buy nothing worth having."""
    return static.cost_mean <= elastic.cost_mean * (1 + STATIC_TIE) and static.jct_quantile(
        confidence
    ) <= elastic.jct_quantile(confidence)


@dataclass(frozen=True)
class SpotMarket:
    """The spot market a ``resources.spot: true`` spec is planned with: the fitted ``model`` of preemptions and
    unavailability, its name in ``plan.spot`` (``source``) and the fall-back ``policy`` (None: SpotPolicy with
    the spec's ``resources.spot_margin_s``)."""

    model: SpotMarketModel
    source: str = ""
    policy: SpotPolicy | None = None


@dataclass(frozen=True)
class PlanOptions:
    """How :func:`plan_job` plans a job, beyond its spec, profile and catalog.

    Overrides of the spec (None: the spec's): ``deadline_s``, ``confidence``, ``seed``, ``cloud`` (aws, gcp,
    local or ``any``) and ``brackets`` (``parallel`` | ``sequential``: its ``scheduler.brackets``).
    ``samples``: Monte Carlo samples per candidate. ``include_exact``: also search the whole plan space exactly
    (``baselines["exact"]``); ``asha``: also simulate ASHA on the cheapest fixed cluster meeting the deadline
    (``plan.asha``). ``heads`` (cloud → :class:`HeadSpec`): the run's billed head instance per cloud, chosen by
    the caller for head mode on AWS/GCP; the plan's first stage's cloud picks one, and every prediction (the
    chosen plan's and the baselines') includes it; None or no entry for the cloud: no head is billed (local runs,
    ``--head local``). ``spot``: with ``resources.spot: true``, spot is allowed per stage and simulated with this
    market's preemptions and unavailability (:class:`SpotMarket`); None keeps the old reading of ``spot: true``
    (every stage at spot prices, never preempted). ``beside``: runs a part of planning that does not depend on
    the search (the ASHA baseline) beside it (:class:`Beside`); the default runs it in turn, in this process."""

    deadline_s: float | None = None
    confidence: float | None = None
    cloud: str | None = None
    samples: int = DEFAULT_SAMPLES
    seed: int | None = None
    include_exact: bool = False
    heads: Mapping[str, HeadSpec] | None = None
    brackets: str | None = None
    asha: bool = True
    spot: SpotMarket | None = None
    beside: Beside = in_turn


def plan_job(spec: JobSpec, profile: Profile, catalog: Catalog, options: PlanOptions | None = None) -> Plan:
    """Plan a whole job: the cheapest elastic plan meeting the deadline, with baselines (``options``:
    :class:`PlanOptions`).

    ``scheduler.kind: asha`` is planned by :func:`~rubberband.planner.asha_plan.plan_asha` (an elastic ASHA
    cluster, its stages the rungs; ``samples`` capped at :data:`~rubberband.planner.asha.ASHA_SAMPLES`);
    ``include_exact``, ``brackets`` and ``spot`` do not apply to it.
    """
    options = options or PlanOptions()
    deadline = float(options.deadline_s if options.deadline_s is not None else spec.deadline_s)
    conf = float(options.confidence if options.confidence is not None else spec.confidence)
    seed = int(options.seed if options.seed is not None else spec.seed)
    sched = spec.scheduler
    if sched.kind == "asha":  # one elastic cluster shrinking by phase of the rung ladder, not stages
        job = AshaJob(spec, deadline, conf, seed, samples=options.samples, heads=options.heads, baseline=options.asha)
        return plan_asha(job, profile, catalog, options.cloud)
    stages = stages_for(
        sched.kind, trials=sched.trials, eta=sched.eta, min_epochs=sched.min_epochs, max_epochs=sched.max_epochs
    )
    market = options.spot if spec.resources.spot else None  # spot per stage, with this market's model
    types = allowed_types(catalog, spec, options.cloud, spot_required=False if market is not None else None)
    model = fit_performance_model(profile)
    settings = SimSettings(
        samples=options.samples, seed=seed, spot=spec.resources.spot and market is None, heads=options.heads
    )
    if market is not None:
        policy = market.policy or SpotPolicy(margin_s=spec.resources.spot_margin_s)
        fallbacks = cheapest_fallbacks(
            types, lambda t: model.epoch_time(t.device, 1, 1) if model.plannable(t.device) else None
        )
        setup = model_setup(
            market.model,
            SpotSetup(deadline_s=deadline, scenarios={}, policy=policy, fallbacks=fallbacks),
            seed=seed,
            samples=options.samples,
            types=[t for t in types if t.spot_price_hr is not None],
        )
        settings = replace(settings, spot_setup=setup)
    on_demand = market is None and not settings.spot
    space = PlanSpace(
        stages, region_twins_merged(types) if on_demand else types, model, spec.resources.max_workers_per_trial
    )
    goal = Goal(deadline, conf, spec.budget_usd)
    brackets = BracketSetup() if (options.brackets or sched.brackets) == "parallel" else None
    search = SearchOptions(brackets=brackets, include_exact=options.include_exact)
    # the ASHA baseline reads the seed, the spot pricing and the heads, none of which the search changes
    asha_pending = options.beside(lambda: asha_info(space, spec, goal, settings)) if options.asha else None
    try:
        out = plan_stages(space, goal, settings, search)
        if settings.spot_setup is not None:
            out, settings = _sparser_checkpoints(space, goal, settings, search, out)
        asha_out = asha_pending.result() if asha_pending is not None else None
    finally:
        if asha_pending is not None:
            asha_pending.cancel()  # nothing once its result is in
    market_only = SimSettings(spot=settings.spot)  # the baselines' stages: on-demand, or all at spot prices
    baselines = {}
    if out.static is not None:
        plan_s, res_s, tl_s = out.static
        baselines["static"] = Alternative(
            name="static",
            stages=stage_plans(stages, plan_s, res_s, settings=market_only),
            predicted=prediction(res_s, deadline),
            timeline=tl_s,
        )
    if out.exact is not None:
        plan_e, res_e, tl_e = out.exact
        baselines["exact"] = Alternative(
            name="exact",
            stages=stage_plans(stages, plan_e, res_e, settings=market_only),
            predicted=prediction(res_e, deadline),
            timeline=tl_e,
            note=out.exact_note,
        )
    used = {c.instance_type for c in out.configs}
    why_not = None
    if market is not None and settings.spot_setup is not None and out.result is not None:
        sim: PlanSimulator = (
            ParallelSimulator(stages, model, settings, BracketSetup(offsets=out.offsets or None))
            if out.brackets == "parallel"
            else Simulator(stages, model, settings)
        )
        why_not = why_not_spot(sim, out.configs, out.result, goal, settings.spot_setup)
    return Plan(
        job=job_info(spec),
        catalog=CatalogInfo(
            clouds=sorted({t.cloud for t in types}),
            regions=sorted({t.region for t in types}),
            dates={c: d for c, d in catalog.dates.items() if any(t.cloud == c for t in types)},
        ),
        deadline_s=deadline,
        confidence=conf,
        budget_usd=spec.budget_usd,
        stages=[
            s if why_not is None else s.model_copy(update={"why_not_spot": why_not[i]})
            for i, s in enumerate(stage_plans(stages, out.configs, out.result, model, settings))
        ],
        predicted=prediction(out.result, deadline),
        timeline=out.timeline,
        baselines=baselines,
        planner=PlannerInfo(
            candidates_evaluated=out.candidates_evaluated,
            iterations=out.iterations,
            samples=options.samples,
            seed=seed,
            notes=out.notes
            + variation_notes(model)
            + [f"instance types used: {', '.join(sorted(t.name for t in used))}"],
        ),
        profile_sha256=profile_sha256(profile),
        spec=spec.model_dump(mode="json"),
        head=head_info(out.head),
        head_start_s=head_start_s(model, out.configs[0].instance_type),
        asha=asha_out,
        survivors=survivor_info(model),
        brackets=out.brackets,
        bracket_offsets_s=[round(o, 3) for o in out.offsets],
        handoffs=[
            Handoff(
                instance_type=h.instance_type,
                from_stage=h.from_stage,
                to_stage=h.to_stage,
                at_s=round(h.at_s, 3),
                instance_id=h.instance_id,
            )
            for h in out.handoffs
        ],
        spot=None
        if settings.spot_setup is None or market is None
        else spot_info(settings.spot_setup, market.source or "spot model"),
    )


def _sparser_checkpoints(
    space: PlanSpace, goal: Goal, settings: SimSettings, search: SearchOptions, out: StagesPlan
) -> tuple[StagesPlan, SimSettings]:
    """Where a checkpoint save takes time, a longer interval on spot stages may pay: the job planned again with the
    interval at which ``out``'s stages cost least (:func:`checkpoint_interval`), taken (with its settings) when it
    meets the goal for less; else ``out`` and ``settings``."""
    setup = settings.spot_setup
    if setup is None or out.result is None:
        return out, settings
    every = checkpoint_interval(Simulator(space.stages, space.model, settings), out.configs, goal)
    if every == setup.checkpoint_epochs:
        return out, settings
    sparser = replace(settings, spot_setup=replace(setup, checkpoint_epochs=every))
    again = plan_stages(space, goal, sparser, search)
    if again.result is not None and goal.met_by(again.result) and again.result.cost_mean < out.result.cost_mean - 1e-12:
        return again, sparser
    return out, settings


#: Checkpoint intervals (epochs) tried for a plan with spot stages whose checkpoint save takes time.
CHECKPOINT_INTERVALS = (1, 2, 3, 5, 10)
#: A longer interval is taken only when it makes the plan at least this much cheaper (else planning again
#: for it costs more time than it can save money).
CHECKPOINT_GAIN = 0.01


def checkpoint_interval(sim: Simulator, configs: Sequence[StageConfig], goal: Goal) -> int:
    """The checkpoint interval on spot stages (:data:`CHECKPOINT_INTERVALS`) at which ``configs``, played one stage
    after another by ``sim`` (its job and settings, its spot setup's interval varied), cost least while meeting
    ``goal``: each save skipped saves its time (``model.checkpoint_save_s``), each epoch between saves is work a
    preemption loses. 1 where saves take no time, ``sim`` has no spot setup or no stage is on spot, or where no
    interval meets the deadline, or none saves :data:`CHECKPOINT_GAIN`."""
    setup = sim.spot_setup
    if setup is None or sim.model.checkpoint_save_s <= 0 or not any(c.spot for c in configs):
        return 1
    best, best_cost, every_epoch = 1, math.inf, math.inf
    for every in CHECKPOINT_INTERVALS:
        trial = Simulator(
            sim.stages, sim.model, replace(sim.settings, spot_setup=replace(setup, checkpoint_epochs=every))
        )
        result = trial.simulate(configs)
        if every == 1:
            every_epoch = result.cost_mean
        if goal.met_by(result) and result.cost_mean < best_cost - 1e-12:
            best, best_cost = every, result.cost_mean
    return best if best_cost < every_epoch * (1 - CHECKPOINT_GAIN) else 1


def spot_info(setup: SpotSetup, source: str) -> SpotInfo:
    """The plan's record of the spot model and policy its predictions include, and per type the zones tried."""
    zones = []
    for key in sorted(setup.scenarios):
        offer = setup.offers.get(key)
        z: ZoneModel | None = offer.model if offer is not None else getattr(setup.scenarios[key], "zone", None)
        if z is not None:
            zones.append(
                SpotZoneInfo(
                    cloud=z.cloud,
                    instance_type=z.instance_type,
                    region=z.region,
                    zone=z.zone,
                    preemption_rate_per_h=z.preemption_rate_per_h,
                    p_unavailable=z.p_unavailable,
                    unavailable_s=list(z.unavailable_s),
                    rate_source=z.rate_source,
                    tried=[]
                    if offer is None
                    else [
                        TriedZone(zone=o.zone, price_hr=o.price_hr, p_first=round(o.p_first, 6)) for o in offer.zones
                    ],
                    price_hr=None if offer is None else round(offer.price_hr, 6),
                    prior=z.prior,
                )
            )
    return SpotInfo(
        model_source=source, zones=zones, margin_s=setup.policy.margin_s, checkpoint_epochs=setup.checkpoint_epochs
    )


def plan_spot_setup(
    plan: Plan, replay: Replay | None = None, *, samples: int = DEFAULT_SAMPLES, catalog: Catalog | None = None
) -> SpotSetup | None:
    """The spot setup a plan was made with (its own fitted zones, sampled ``samples`` times), or as ``replay``
    changes it: its seed and deadline, its ``spot_scenarios`` (e.g. trace replays) in place of the zones and
    another fall-back ``spot_policy``; None for a plan without a spot model. ``catalog`` resolves the stages'
    fall-back types (without it, every trial falls back to its own type)."""
    info = plan.spot
    if info is None:
        return None
    replay = replay or Replay()
    seed = replay.seed_for(plan)
    policy = replay.spot_policy or SpotPolicy(margin_s=info.margin_s)
    scenarios = replay.spot_scenarios
    offers = {}
    zones = {}
    fitted: dict[tuple[str, str, str], SpotScenario] = {}
    for z in info.zones:
        zone = ZoneModel(
            cloud=z.cloud,
            instance_type=z.instance_type,
            region=z.region,
            zone=z.zone,
            preemption_rate_per_h=z.preemption_rate_per_h,
            p_unavailable=z.p_unavailable,
            unavailable_s=tuple(z.unavailable_s),
            rate_source=z.rate_source,
            prior=z.prior,
        )
        fitted[zone.key] = ModelScenario(zone, seed=seed, samples=samples)
        zones[zone.key] = z.tried[0].zone if z.tried else z.zone
        if z.tried:  # priced at the zones tried (a v3 plan without them: at the catalog's spot price)
            offers[zone.key] = offer_of(zone, [(t.zone, t.price_hr, t.p_first) for t in z.tried])
    if scenarios is None:
        scenarios = fitted
    fallbacks = {}
    for sp in plan.stages:
        if sp.spot and sp.fallback_instance_type and catalog is not None:
            own = catalog.find(sp.instance_type, cloud=sp.cloud, region=sp.region)
            fallbacks[own.key] = catalog.find(sp.fallback_instance_type, cloud=sp.cloud, region=sp.region)
    return SpotSetup(
        deadline_s=replay.deadline_for(plan),
        scenarios=dict(scenarios),
        policy=policy,
        checkpoint_epochs=info.checkpoint_epochs,
        zones=zones,
        fallbacks=fallbacks,
        offers=offers,
    )


@dataclass(frozen=True)
class Replay:
    """What a replay of an existing plan changes about how it was planned (None: as planned): the ``seed`` of its
    random streams, the ``deadline_s`` its spot fall-back decisions aim at (and its P(meet) is read against),
    ``spot_scenarios`` in place of its own spot model for its spot stages (e.g. trace replays, ``rubberband
    simulate --preemption-traces``) and the fall-back ``spot_policy`` (anything with SpotPolicy's ``decide``:
    baselines)."""

    seed: int | None = None
    deadline_s: float | None = None
    spot_scenarios: Mapping[tuple[str, str, str], SpotScenario] | None = None
    spot_policy: SpotPolicy | None = None

    def seed_for(self, plan: Plan) -> int:
        return plan.planner.seed if self.seed is None else self.seed

    def deadline_for(self, plan: Plan) -> float:
        return plan.deadline_s if self.deadline_s is None else self.deadline_s


def plan_simulator(
    plan: Plan, profile: Profile, catalog: Catalog, *, samples: int = DEFAULT_SAMPLES, replay: Replay | None = None
) -> tuple[PlanSimulator, list[Stage], tuple[StageConfig, ...], PerformanceModel]:
    """(simulator, stages, configs, model) that replay an existing plan as it was planned (``samples`` samples),
    or as ``replay`` changes it."""
    if not plan.stages:
        raise PlanFileError("the plan has no stages; regenerate it with `rubberband plan`")
    if plan.is_asha:
        raise PlanFileError(
            "an ASHA plan's stages are phases of one ASHA run, not SHA stages: replay it with replay_asha_plan"
        )
    replay = replay or Replay()
    stages, configs = configs_of(plan, catalog)
    model = fit_performance_model(profile)
    for c in configs:
        model.require(c.instance_type.device)
    setup = plan_spot_setup(plan, replay, samples=samples, catalog=catalog)
    settings = SimSettings(
        samples=samples,
        seed=replay.seed_for(plan),
        spot=setup is None and any(s.spot for s in plan.stages),
        heads=heads_of(plan),
        spot_setup=setup,
    )
    sim: PlanSimulator
    if plan.parallel_brackets:
        sim = ParallelSimulator(stages, model, settings, BracketSetup(offsets=plan.bracket_offsets_s or None))
    else:
        sim = Simulator(stages, model, settings)
    return sim, stages, configs, model


def replay_plan(
    plan: Plan, profile: Profile, catalog: Catalog, *, samples: int = DEFAULT_SAMPLES, replay: Replay | None = None
) -> SimResult:
    """The Monte Carlo distributions of an existing plan (``samples``, ``replay``: :func:`plan_simulator`'s)."""
    sim, _, configs, _ = plan_simulator(plan, profile, catalog, samples=samples, replay=replay)
    return sim.simulate(configs)


def simulate_plan(
    plan: Plan, profile: Profile, catalog: Catalog, *, samples: int = DEFAULT_SAMPLES, replay: Replay | None = None
) -> Plan:
    """Re-simulate an existing plan (e.g. with a new profile; ``samples``, ``replay``: :func:`plan_simulator`'s);
    returns a copy with new predictions (against ``replay``'s deadline, if it sets one)."""
    replay = replay or Replay()
    deadline = replay.deadline_for(plan)
    sim, stages, configs, model = plan_simulator(plan, profile, catalog, samples=samples, replay=replay)
    result = sim.simulate(configs)
    update = {
        "stages": stage_plans(stages, configs, result, model, sim.settings),
        "predicted": prediction(result, deadline),
        "timeline": _timeline(sim, configs, result),
        "deadline_s": deadline,
    }
    if plan.parallel_brackets and isinstance(sim, ParallelSimulator):
        update["handoffs"] = [
            Handoff(
                instance_type=h.instance_type,
                from_stage=h.from_stage,
                to_stage=h.to_stage,
                at_s=round(h.at_s, 3),
                instance_id=h.instance_id,
            )
            for h in sim.last_handoffs
        ]
    return plan.model_copy(update=update)


# -- ASHA: the rung ladder's phases on one elastic cluster ----------------------------------------------------
