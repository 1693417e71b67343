"""The planner's gap to the exact optimum over a seeded population of workloads (issue 32).

    python bench/bench_planner_gap.py [--cases N] [--quick] [--seed S] [--max-nodes N]

Draws ``N`` workloads (default 200) from :func:`workloads`: SHA and Hyperband (brackets one after another, and
side by side), 1-4 instance types of the AWS catalog (their real prices, the quickstart profile's device speeds),
worker-scaling curves from linear (no sync cost) to flat (sync as long as compute), start-ups from 10 s to 5 min
and deadlines 1.05x to 3x the shortest feasible JCT. Each is planned by the greedy planner (``plan_stages``, and
the greedy descent alone from maximum useful parallelism, as ``tests/test_planner_honesty.py`` checks it) and by
the exact optimiser (:func:`~rubberband.planner.baselines.exact_optimum`, started from nothing; its node cap
``--max-nodes``: a case whose search hit the cap is reported apart, never counted in the gap). Parallel brackets
have no exact optimiser over offsets: their cases are compared with the sequential exact optimum and the
deadline-aware bound only, and reported apart.

Prints the gap distribution (median, p95, max of cost / exact), planning times, and the slack of the work
lower bound and of the deadline-aware bound (:mod:`~rubberband.planner.bounds`) where the optimum is known.
No assertions: the targets (gap ≤ 2 % at p95, ≤ 5 % worst) are read off the table.

Last measured (plan / exact over the cases whose optimum is proven; median, p95, max): seed 0, 146 cases
(1 exact unfinished, 53 parallel apart): before issue 32's changes 1.0000, 1.0150, 1.4485; after 1.0000,
1.0047, 1.0079 (where the planner did not prefer the best static plan within its 1 % tie: p95 1.0000, max
1.0016). Seed 1 (not used while tuning), 151 cases (49 parallel apart): before 1.0000, 1.0075, 1.1073; after
1.0000, 1.0054, 1.0749 (two sequential Hyperband cases stay 7.5 % and 6.4 % above: their optimum changes two or
three stages at once, each alone costlier). With the descent's climbs (search.DescentLimits: a step up paired with
a step down, in neighbourhoods of <= 64 plans) seed 1 is 1.0000, 1.0051, 1.0638 (where the static plan was not
preferred: p95 1.0084 -> 1.0023; the descent alone: p95 1.0056 -> 1.0000, max 1.1712 -> 1.0638); the 7.5 % case
reaches its optimum, the 6.4 % one (#93) is three steps away (a step up, another up, then down). Seed 0 unchanged.
Planning CPU median 0.018 -> 0.024 s, p95 0.05 -> 0.07 s. With the walk up from the cheapest plan (search.ascend;
a slower machine, before -> after): seed 1 1.0000, 1.0051, 1.0638 -> 1.0000, 1.0043, 1.0073 (#93 reaches its
optimum, #145 drops 1.8 %; where the static plan was not preferred p95 1.0000, max 1.0039); seed 0 unchanged
(1.0000, 1.0047, 1.0079). Planning CPU seed 0 median 0.035 -> 0.035 s, p95 0.091 -> 0.095 s; seed 1 0.032 s,
p95 0.099 s, max 0.26 s.
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from rubberband.catalog import InstanceType, load_catalog
from rubberband.errors import InfeasibleError
from rubberband.planner.api import SearchOptions, plan_stages
from rubberband.planner.baselines import exact_optimum
from rubberband.planner.bounds import Accounting, deadline_bound, work_bound
from rubberband.planner.brackets import BracketSetup
from rubberband.planner.model import DeviceModel, PerformanceModel, StartupModel, fit_performance_model
from rubberband.planner.schedule import Stage, hyperband_brackets, sha_stages
from rubberband.planner.search import Evaluator, Goal, PlanSearch, PlanSpace, descend, local_moves
from rubberband.planner.simulator import SimSettings, Simulator
from rubberband.profile import load_profile

ROOT = Path(__file__).resolve().parents[1]
PROFILE = ROOT / "examples/profiles/resnet50_cifar10_v100.json"
#: AWS types whose devices the quickstart profile covers (one, four or eight GPUs; their catalog prices).
TYPE_NAMES = (
    "g4dn.xlarge",
    "g5.xlarge",
    "p3.2xlarge",
    "g4dn.12xlarge",
    "g5.12xlarge",
    "p3.8xlarge",
)
#: (trials, η, max epochs) of the SHA workloads: small enough for the exact optimiser.
SHA_SHAPES = ((8, 2, 8), (9, 3, 9), (12, 3, 16), (16, 2, 4), (27, 3, 9), (6, 2, 8), (18, 3, 6))
#: (η, max epochs) of the Hyperband workloads.
HYPERBAND_SHAPES = ((2, 2), (3, 3), (2, 4))
SAMPLES = 200
CONFIDENCE = 0.9
SCREEN = 32


@dataclass(frozen=True)
class Workload:
    """One drawn planning problem, all but its deadline factor fixed: ``label`` says how it was drawn."""

    label: str
    stages: tuple[Stage, ...]
    types: tuple[InstanceType, ...]
    model: PerformanceModel
    max_workers: int
    brackets: str  # sequential | parallel
    factor: float  # deadline / shortest feasible JCT

    def space(self) -> PlanSpace:
        return PlanSpace(list(self.stages), self.types, self.model, self.max_workers)

    def options(self) -> SearchOptions:
        return SearchOptions(brackets=BracketSetup() if self.brackets == "parallel" else None)


def scaled_model(base: PerformanceModel, sync: float, startup_s: float) -> PerformanceModel:
    """``base`` with every device's sync cost ``sync`` times its compute time (0: linear scaling; 1: a second
    worker barely helps) and start-ups spread ±30 % around ``startup_s``."""
    devices = {}
    for name, d in base.devices.items():
        g = d.alpha_grad
        devices[name] = DeviceModel(
            alpha_grad=g,
            beta_grad=d.beta_grad,
            alpha_sync_node=sync * g,
            beta_sync_node=0.1 * sync * g,
            alpha_sync_cross=3 * sync * g + 0.01 * g,
            beta_sync_cross=0.3 * sync * g,
            gamma=1.0 if sync > 0.5 else 1.5,
            source="bench_planner_gap",
        )
    startup = StartupModel(tuple(startup_s * f for f in (0.7, 0.85, 1.0, 1.15, 1.3)), "bench_planner_gap")
    return replace(base, devices=devices, startup_by_cloud={**base.startup_by_cloud, "aws": startup})


def workloads(count: int, seed: int = 0) -> list[Workload]:
    """``count`` workloads drawn with ``seed`` (the same list for the same arguments)."""
    rng = np.random.default_rng(seed)
    base = fit_performance_model(load_profile(PROFILE))
    catalog = load_catalog(["aws"])
    pool = [catalog.find(n, region="us-east-1") for n in TYPE_NAMES]
    out = []
    for k in range(count):
        kind = rng.choice(["sha", "sha", "hyperband", "hyperband-parallel"])
        if kind == "sha":
            n, eta, big_r = SHA_SHAPES[rng.integers(len(SHA_SHAPES))]
            stages = sha_stages(int(n), int(eta), 1, int(big_r))
            shape = f"SHA n={n} eta={eta} R={big_r}"
        else:
            eta, big_r = HYPERBAND_SHAPES[rng.integers(len(HYPERBAND_SHAPES))]
            stages = [s for b in hyperband_brackets(int(eta), 1, int(big_r)) for s in b]
            shape = f"HB eta={eta} R={big_r}"
        picked = rng.choice(len(pool), size=int(rng.integers(1, 5)), replace=False)
        types = tuple(pool[i] for i in sorted(picked))
        sync = float(rng.choice([0.0, 0.05, 0.2, 0.5, 1.0]))
        startup = float(math.exp(rng.uniform(math.log(10), math.log(300))))
        factor = float(math.exp(rng.uniform(math.log(1.05), math.log(3.0))))
        max_workers = int(rng.choice([1, 2]))
        parallel = kind == "hyperband-parallel"
        label = (
            f"#{k} {shape}{' parallel' if parallel else ''}, {'+'.join(t.name for t in types)}, sync {sync:g}, "
            f"start-up {startup:.0f} s, w<={max_workers}, {factor:.2f}x"
        )
        out.append(
            Workload(
                label=label,
                stages=tuple(stages),
                types=types,
                model=scaled_model(base, sync, startup),
                max_workers=max_workers,
                brackets="parallel" if parallel else "sequential",
                factor=factor,
            )
        )
    return out


@dataclass
class Gap:
    """What one workload measured: costs (mean $), planning seconds, and the exact search's extent."""

    workload: Workload
    deadline_s: float
    plan: float
    descent: float
    plan_s: float
    exact: float | None
    exact_s: float
    capped: bool
    work_bound: float
    deadline_bound: float
    #: The deadline-aware bound of the expected cost (median compute, mean start-up): the slack that stragglers and
    #: the start-up spread do not explain (not rigorous for a finite sample).
    deadline_bound_median: float
    #: The planner chose the best static plan over a cheaper elastic one within its 1 % tie (api.STATIC_TIE).
    static_preferred: bool = False

    @property
    def known(self) -> bool:
        """The exact optimum is proven (search finished) and the plan space is the same (sequential brackets)."""
        return self.exact is not None and not self.capped and self.workload.brackets == "sequential"

    @property
    def ratio(self) -> float:
        return self.plan / self.exact if self.exact else math.nan

    @property
    def descent_ratio(self) -> float:
        return self.descent / self.exact if self.exact else math.nan


def shortest_jct(w: Workload) -> float:
    """The shortest feasible JCT (at the confidence) the planner finds for ``w``."""
    try:
        plan_stages(w.space(), Goal(1.0, CONFIDENCE), SimSettings(samples=SAMPLES), w.options())
    except InfeasibleError as exc:
        return float(exc.shortest_jct_s)
    raise RuntimeError("a 1-second deadline was feasible")


def measure(w: Workload, max_nodes: int = 50_000) -> Gap:
    """Plan ``w`` at its deadline with the planner, the descent alone and the exact optimiser."""
    deadline = shortest_jct(w) * w.factor
    goal = Goal(deadline, CONFIDENCE)
    started = time.process_time()
    planned = plan_stages(w.space(), goal, SimSettings(samples=SAMPLES), w.options())
    plan_s = time.process_time() - started
    space = w.space()
    evaluator = Evaluator(Simulator(list(w.stages), w.model, SimSettings(samples=SAMPLES, seed=0)), SCREEN)
    search = PlanSearch(space, evaluator, goal)
    alone = descend(search, space.fastest(), local_moves)
    started = time.process_time()
    exact = exact_optimum(search, max_nodes=max_nodes)
    exact_s = time.process_time() - started
    parallel = w.brackets == "parallel"
    return Gap(
        workload=w,
        deadline_s=deadline,
        plan=planned.result.cost_mean,
        descent=alone.result.cost_mean if search.meets(alone.result) else math.inf,
        plan_s=plan_s,
        exact=None if exact.result is None else exact.result.cost_mean,
        exact_s=exact_s,
        capped=exact.capped,
        work_bound=work_bound(space),
        deadline_bound=deadline_bound(space, deadline, Accounting(evaluator.sim.min_factor()), parallel=parallel),
        deadline_bound_median=deadline_bound(space, deadline, Accounting(expected=True), parallel=parallel),
        static_preferred=any(n.startswith("the best static plan is as cheap") for n in planned.notes),
    )


def quantiles(values: list[float]) -> tuple[float, float, float]:
    """(median, p95, max) of ``values`` (NaN for none)."""
    if not values:
        return math.nan, math.nan, math.nan
    return float(np.median(values)), float(np.quantile(values, 0.95)), max(values)


def table(gaps: list[Gap]) -> list[str]:
    """The gap distribution, planning times and bound slacks, as printed lines."""
    known = [g for g in gaps if g.known]
    unfinished = [g for g in gaps if g.workload.brackets == "sequential" and (g.exact is None or g.capped)]
    parallel = [g for g in gaps if g.workload.brackets == "parallel"]
    lines = [
        f"cases {len(gaps)}: exact optimum known {len(known)}, exact unfinished (node cap) {len(unfinished)}, "
        f"parallel brackets (no exact over offsets) {len(parallel)}",
        f"static plan preferred within its 1 % tie (a gap by choice): {sum(g.static_preferred for g in known)}",
        f"{'ratio':<34} {'median':>8} {'p95':>8} {'max':>8} {'n':>5}",
    ]

    def row(name: str, values: list[float]) -> None:
        med, p95, top = quantiles(values)
        lines.append(f"{name:<34} {med:8.4f} {p95:8.4f} {top:8.4f} {len(values):5d}")

    row("plan / exact", [g.ratio for g in known])
    row("plan / exact, static not preferred", [g.ratio for g in known if not g.static_preferred])
    row("descent alone / exact", [g.descent_ratio for g in known])
    row("plan / exact, factor <= 1.3", [g.ratio for g in known if g.workload.factor <= 1.3])
    row("exact / deadline-aware bound", [g.exact / g.deadline_bound for g in known if g.exact])
    row("exact / deadline bound, expected", [g.exact / g.deadline_bound_median for g in known if g.exact])
    row("exact / work bound", [g.exact / g.work_bound for g in known if g.exact])
    row("plan / deadline-aware bound (all)", [g.plan / g.deadline_bound for g in gaps])
    row("parallel plan / sequential exact", [g.ratio for g in parallel if g.exact and not g.capped])
    row("planning CPU s", [g.plan_s for g in gaps])
    row("exact CPU s", [g.exact_s for g in gaps])
    worst = sorted(known, key=lambda g: g.ratio, reverse=True)[:5]
    lines.append("worst cases (plan / exact): " + "; ".join(f"{g.ratio:.4f} {g.workload.label}" for g in worst))
    return lines


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cases", type=int, default=200, help="workloads drawn (default 200)")
    parser.add_argument("--quick", action="store_true", help="12 cases")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-nodes", type=int, default=50_000, help="the exact search's node cap")
    parser.add_argument("--verbose", action="store_true", help="one line per case")
    args = parser.parse_args()
    count = 12 if args.quick else args.cases
    started = time.perf_counter()
    gaps = []
    for w in workloads(count, args.seed):
        g = measure(w, args.max_nodes)
        gaps.append(g)
        if args.verbose:
            print(
                f"{g.ratio:.4f} descent {g.descent_ratio:.4f} plan {g.plan_s:.2f} s exact {g.exact_s:.2f} s "
                f"exact/bound {(g.exact or math.nan) / g.deadline_bound:.3f}"
                f"{' capped' if g.capped else ''}{' static' if g.static_preferred else ''}: {w.label}",
                flush=True,
            )
    print(
        f"== planner gap over {count} seeded workloads (seed {args.seed}, {SAMPLES} samples, p{CONFIDENCE * 100:.0f}; "
        f"wall {time.perf_counter() - started:.0f} s)"
    )
    print("\n".join(table(gaps)))
    print(f"mean planning CPU {statistics.mean(g.plan_s for g in gaps):.2f} s")


if __name__ == "__main__":
    main()
