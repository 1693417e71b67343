"""Plan a sequence of stages: the search for the cheapest elastic plan meeting a deadline at a confidence.

:func:`plan_stages` is the planner's core and the call the executor re-plans with mid-run (the remaining stages'
:class:`~rubberband.planner.search.PlanSpace`, the remaining deadline as a :class:`~rubberband.planner.search.Goal`,
the instances already running in its :class:`~rubberband.planner.simulator.SimSettings`): the best static plan
and a deadline-independent pool searched by branch and bound, RubberBand's greedy descent from the pool's best,
bracket offsets and hand-overs with parallel brackets, spot as one more move. Pure.

A whole job (spec, profile, catalog → plan file) is planned by :func:`~rubberband.planner.job.plan_job` on top of
it; an existing plan is replayed by :mod:`~rubberband.planner.replay`; ASHA jobs are planned in
:mod:`~rubberband.planner.asha_plan`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Literal

from rubberband.errors import InfeasibleError
from rubberband.plan import Timeline
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
from rubberband.planner.schedule import Stage
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
from rubberband.planner.spot import SpotSetup
from rubberband.planner.plan_space import HeadSpec, StageConfig
from rubberband.planner.simulator import SimResult, SimSettings, Simulator
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


def timeline_of(sim: PlanSimulator, configs: tuple[StageConfig, ...], result: SimResult) -> Timeline:
    """The timeline of ``result``'s representative sample of ``configs``, as ``sim`` plays it."""
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
        return (ex.plan, ex.result, timeline_of(self.sim, ex.plan, ex.result)), note

    def _outcome(self, configs: tuple[StageConfig, ...], result: SimResult) -> StagesPlan:
        exact, exact_note = self._exact()
        static, static_out = self.static, None
        if static.plan is not None and static.result is not None:
            static_out = (static.plan, static.result, timeline_of(self.static_sim, static.plan, static.result))
        sim = self.sim
        return StagesPlan(
            stages=list(self.space.stages),
            configs=configs,
            result=result,
            timeline=timeline_of(sim, configs, result),
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
