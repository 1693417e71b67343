"""Elastic ASHA against the best fixed ASHA cluster, and against elastic SHA, on the quickstart profile.

    python bench/bench_asha_elastic.py [--seeds 50] [--trials 81] [--eta 3] [--min-epochs 1] [--max-epochs 27]
        [--executor] [--real]

Prints figures and ratios (no assertions). The job is ``scheduler.kind: asha`` with the quickstart's
profile and instance types (examples/quickstart.yaml: p3.2xlarge, g4dn.xlarge, g5.xlarge, 1 worker per
trial, 95% confidence, its head instance billed); the deadlines are 1.2×, 1.5× and 2× the shortest
feasible one (the planner's InfeasibleError at a 1 s deadline names it).

* Planning time of the ASHA plan (target: a few seconds at most for 81 trials on 2 cores).
* Elastic ASHA (``plan_job``'s plan: the rung ladder's phases, AshaPhasePolicy) versus the best fixed ASHA
  cluster (its ``baselines.static``), each planned with seed 0 and then replayed out of sample with the
  simulator's seeds 1..``--seeds`` (ASHA_SAMPLES samples each, pooled): cost mean, JCT p50 / p95, P(meet)
  pooled, and the share of seeds whose own P(meet) reaches the confidence.
* Elastic SHA (the same trials, η and epochs planned as ``kind: sha``) beside elastic ASHA at the same
  deadlines, replayed the same way (the stage simulator, 1000 samples per seed). SHA waits at each rung's
  barrier and promotes exactly the top 1/η; ASHA never waits and promotes more (its rule continues any trial
  above the (1 − 1/η) percentile of the results in so far), so it trains more trial-epochs.
* ``--executor``: the executor itself (its ASHA and SHA schedulers) run on the same plans on virtual time
  (``rubberband run --cloud sim``'s simulated cloud and cluster), one run per seed: elastic ASHA vs the best
  fixed ASHA cluster, and elastic SHA beside them.
* ``--real``: one real local run (Ray nodes on this machine) of examples/asha_local.yaml's elastic ASHA plan
  and of its best fixed cluster.
"""

from __future__ import annotations

import argparse
import os
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from rubberband.catalog import load_catalog
from rubberband.errors import InfeasibleError
from rubberband.plan import Plan
from rubberband.planner.job import PlanOptions, plan_job
from rubberband.planner.replay import Replay, replay_plan
from rubberband.planner.asha_plan import replay_asha_plan
from rubberband.planner.asha import ASHA_SAMPLES
from rubberband.planning import billed_heads
from rubberband.profile import load_profile
from rubberband.spec import JobSpec, load_spec

ROOT = Path(__file__).resolve().parents[1]
FACTORS = (1.2, 1.5, 2.0)
SHA_SAMPLES = 1000


@dataclass(frozen=True)
class Figures:
    """Pooled out-of-sample figures of one plan: cost mean, JCT p50 / p95, P(meet), share of seeds meeting."""

    cost_mean: float
    jct_p50: float
    jct_p95: float
    p_meet: float
    seeds_meeting: float

    def row(self) -> str:
        return (
            f"{'$' + format(self.cost_mean, '.2f'):>8}  {self.jct_p50 / 60:7.1f}  {self.jct_p95 / 60:7.1f}  "
            f"{self.p_meet:7.1%}  {self.seeds_meeting:7.0%}"
        )


#: The table's columns: the plan's label and shape, then Figures.row's.
HEADER = (
    f"{'plan':<13} {'instances by stage':<26}  {'cost':>8}  {'p50 min':>7}  {'p95 min':>7}  {'P(meet)':>7}  "
    f"{'seeds≥p':>7}"
)


def pooled(runs: list[tuple[np.ndarray, np.ndarray]], deadline_s: float, confidence: float) -> Figures:
    """Figures of (jct, cost) sample arrays, one pair per seed."""
    jct = np.concatenate([j for j, _ in runs])
    cost = np.concatenate([c for _, c in runs])
    meeting = [float(np.mean(j <= deadline_s)) >= confidence for j, _ in runs]
    return Figures(
        cost_mean=float(cost.mean()),
        jct_p50=float(np.quantile(jct, 0.5)),
        jct_p95=float(np.quantile(jct, 0.95)),
        p_meet=float(np.mean(jct <= deadline_s)),
        seeds_meeting=float(np.mean(meeting)),
    )


def job_spec(kind: str, args: argparse.Namespace) -> JobSpec:
    """The quickstart spec with the bench's schedule, as ``kind`` (``asha`` or ``sha``)."""
    spec = load_spec(ROOT / "examples/quickstart.yaml")
    scheduler = spec.scheduler.model_copy(
        update={
            "kind": kind,
            "trials": args.trials,
            "eta": args.eta,
            "min_epochs": args.min_epochs,
            "max_epochs": args.max_epochs,
        }
    )
    return spec.model_copy(update={"scheduler": scheduler})


def shortest_jct(spec: JobSpec, profile, catalog, heads) -> float:
    try:
        plan_job(spec, profile, catalog, PlanOptions(deadline_s=1.0, heads=heads, asha=False))
    except InfeasibleError as exc:
        return float(exc.shortest_jct_s)
    raise RuntimeError("a 1-second deadline was feasible")


def fixed_of(plan: Plan) -> Plan:
    """The ASHA plan's static baseline (the best fixed ASHA cluster) as a plan of its own, to replay."""
    static = plan.baselines["static"]
    return plan.model_copy(update={"stages": static.stages, "predicted": static.predicted})


def replay_asha(plan: Plan, profile, catalog, seeds: int) -> Figures:
    runs = []
    for seed in range(1, seeds + 1):
        res = replay_asha_plan(plan, profile, catalog, samples=ASHA_SAMPLES, seed=seed)
        runs.append((res.jct, res.cost))
    return pooled(runs, plan.deadline_s, plan.confidence)


def replay_sha(plan: Plan, profile, catalog, seeds: int) -> Figures:
    runs = []
    for seed in range(1, seeds + 1):
        res = replay_plan(plan, profile, catalog, samples=SHA_SAMPLES, replay=Replay(seed=seed))
        runs.append((res.jct, res.cost))
    return pooled(runs, plan.deadline_s, plan.confidence)


def phases_text(plan: Plan) -> str:
    """Instances by stage (phase), ``23/1/1/1 × g5.xlarge`` when one type runs them all."""
    types = {s.instance_type for s in plan.stages}
    if len(types) == 1:
        return f"{'/'.join(str(s.instances) for s in plan.stages)} × {plan.stages[0].instance_type}"
    return "/".join(f"{s.instances}×{s.instance_type}" for s in plan.stages)


def line(label: str, plan: Plan, figures: Figures) -> str:
    return f"{label:<13} {phases_text(plan):<26}  {figures.row()}"


# -- the executor's part ---------------------------------------------------------------------------------------


def executor_runs(plan: Plan, profile, catalog, *, seeds: int) -> Figures:
    """The executor (ASHA or SHA scheduler, as the plan says) run on ``plan`` on virtual time, one run per seed
    (0 .. ``seeds`` − 1: the simulated cloud and cluster of ``rubberband run --cloud sim``), pooled: each run is
    one sample, so P(meet) is the share of runs meeting the deadline."""
    import tempfile

    from rubberband.executor.journal import Journal
    from rubberband.executor.run import Executor, Job, Target
    from rubberband.executor.simulated import simulated_for

    spec = JobSpec.model_validate(plan.spec)
    job = Job(spec, plan, catalog, profile)
    jcts, costs = [], []
    with tempfile.TemporaryDirectory(prefix="bench-asha-") as base:
        for seed in range(seeds):
            run_dir = Path(base) / f"run-{seed}"
            sim = simulated_for(job, seed=seed, start=1_800_000_000.0)
            journal = Journal(run_dir, clock=sim.clock, durable=False)
            target = Target(f"bench-{seed}", run_dir, sim.backend, sim.runtime, sim.cluster, sim.clock, journal)
            actual = Executor(job, target).run().result["actual"]
            jcts.append(actual["jct_s"])
            costs.append(actual["cost_usd"])
    runs = [(np.array(jcts), np.array(costs))]
    figures = pooled(runs, plan.deadline_s, plan.confidence)
    return Figures(figures.cost_mean, figures.jct_p50, figures.jct_p95, figures.p_meet, figures.p_meet)


def real_local_runs() -> None:
    """One real local run (Ray nodes on this machine, the real trial runtime) of examples/asha_local.yaml's
    elastic ASHA plan and of its best fixed cluster, as ``rubberband run`` makes them."""
    import tempfile

    from rubberband.cloud.local.provider import LocalProvider
    from rubberband.executor.run import Executor, Job, Settings, Target
    from rubberband.executor.runtime import TrialRuntime
    from rubberband.inputs import load_job_inputs
    from rubberband.planning import plan_from_inputs

    inputs = load_job_inputs(ROOT / "examples/asha_local.yaml")
    plan = plan_from_inputs(inputs)
    print(f"{'plan':<13} {'instances by stage':<26}  {'cost':>8}  {'JCT s':>7}  predicted cost / JCT p50")
    with tempfile.TemporaryDirectory(prefix="bench-asha-real-") as base:
        for label, ran in (("elastic ASHA", plan), ("fixed ASHA", fixed_of(plan))):
            run_dir = Path(base) / label.replace(" ", "-")
            target = Target(run_dir.name, run_dir, LocalProvider(run_dir), TrialRuntime.load())
            executor = Executor(Job(inputs.spec, ran, inputs.catalog, inputs.profile), target, Settings())
            actual = executor.run().result["actual"]
            print(
                f"{label:<13} {phases_text(ran):<26}  {'$' + format(actual['cost_usd'], '.4f'):>8}  "
                f"{actual['jct_s']:7.1f}  ${ran.predicted.cost_usd.mean:.4f} / {ran.predicted.jct_s.p50:.1f} s"
            )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seeds", type=int, default=50, help="simulator seeds each plan is replayed with (≥ 1)")
    parser.add_argument("--trials", type=int, default=81)
    parser.add_argument("--eta", type=int, default=3)
    parser.add_argument("--min-epochs", type=int, default=1)
    parser.add_argument("--max-epochs", type=int, default=27)
    parser.add_argument(
        "--executor", action="store_true", help="also run the executor on virtual time on each plan (--seeds runs)"
    )
    parser.add_argument("--real", action="store_true", help="also one real local run of elastic and fixed ASHA")
    args = parser.parse_args()
    if args.seeds < 1:
        parser.error("--seeds must be at least 1")
    profile = load_profile(ROOT / "examples/profiles/resnet50_cifar10_v100.json")
    catalog = load_catalog(["aws"])
    heads = billed_heads("instance")
    asha_spec, sha_spec = job_spec("asha", args), job_spec("sha", args)
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs (other jobs inflate wall times)")
    print(
        f"job: {args.trials} trials, eta={args.eta}, epochs {args.min_epochs}-{args.max_epochs}; quickstart profile "
        f"and types, 1 worker/trial, confidence {asha_spec.confidence:.0%}, head billed; {args.seeds} seeds"
    )
    j_asha = shortest_jct(asha_spec, profile, catalog, heads)
    j_sha = shortest_jct(sha_spec, profile, catalog, heads)
    print(f"shortest feasible JCT (p95): ASHA {j_asha / 60:.1f} min, SHA {j_sha / 60:.1f} min")

    print("\n== planning time of the ASHA plan (wall, CPU)")
    plans: dict[float, Plan] = {}
    for factor in FACTORS:
        started, cpu = time.perf_counter(), time.process_time()
        plans[factor] = plan_job(asha_spec, profile, catalog, PlanOptions(deadline_s=j_asha * factor, heads=heads))
        print(
            f"deadline {factor}x ({j_asha * factor / 60:.1f} min): wall {time.perf_counter() - started:.2f} s, "
            f"CPU {time.process_time() - cpu:.2f} s, {plans[factor].planner.candidates_evaluated} candidates, "
            f"phases {phases_text(plans[factor])}"
        )

    print(f"\n== elastic ASHA vs the best fixed ASHA cluster (planned with seed 0, replayed on seeds 1..{args.seeds})")
    elastic: dict[float, Figures] = {}
    for factor, plan in plans.items():
        fixed = fixed_of(plan)
        e, f = replay_asha(plan, profile, catalog, args.seeds), replay_asha(fixed, profile, catalog, args.seeds)
        elastic[factor] = e
        print(f"deadline {factor}x ({plan.deadline_s / 60:.1f} min)\n{HEADER}")
        print(line("elastic ASHA", plan, e))
        print(line("fixed ASHA", fixed, f))
        print(
            f"fixed/elastic cost {f.cost_mean / e.cost_mean:.2f}x (predicted {fixed.predicted.cost_usd.mean:.2f} / "
            f"{plan.predicted.cost_usd.mean:.2f} = "
            f"{fixed.predicted.cost_usd.mean / plan.predicted.cost_usd.mean:.2f}x); JCT p95 elastic/fixed "
            f"{e.jct_p95 / f.jct_p95:.3f}"
        )

    print(f"\n== elastic SHA vs elastic ASHA at the same deadlines (replayed on seeds 1..{args.seeds})")
    for factor, plan in plans.items():
        e = elastic[factor]
        print(f"deadline {factor}x ASHA's shortest ({plan.deadline_s / 60:.1f} min)\n{HEADER}")
        print(line("elastic ASHA", plan, e))
        try:
            sha = plan_job(sha_spec, profile, catalog, PlanOptions(deadline_s=plan.deadline_s, heads=heads, asha=False))
        except InfeasibleError as exc:
            print(f"{'elastic SHA':<13} infeasible (shortest {exc.shortest_jct_s / 60:.1f} min)")
            continue
        s = replay_sha(sha, profile, catalog, args.seeds)
        print(line("elastic SHA", sha, s))
        print(f"SHA/ASHA cost {s.cost_mean / e.cost_mean:.2f}x, JCT p95 {s.jct_p95 / e.jct_p95:.2f}x")

    if args.executor:
        print(f"\n== the executor on virtual time (--cloud sim), {args.seeds} runs each (seeds 0..{args.seeds - 1})")
        for factor, plan in plans.items():
            print(f"deadline {factor}x ({plan.deadline_s / 60:.1f} min)\n{HEADER}")
            e = executor_runs(plan, profile, catalog, seeds=args.seeds)
            f = executor_runs(fixed_of(plan), profile, catalog, seeds=args.seeds)
            print(line("elastic ASHA", plan, e))
            print(line("fixed ASHA", fixed_of(plan), f))
            print(
                f"fixed/elastic cost {f.cost_mean / e.cost_mean:.2f}x, JCT p95 elastic/fixed {e.jct_p95 / f.jct_p95:.3f}"
            )
            try:
                sha = plan_job(
                    sha_spec, profile, catalog, PlanOptions(deadline_s=plan.deadline_s, heads=heads, asha=False)
                )
            except InfeasibleError as exc:
                print(f"{'elastic SHA':<13} infeasible (shortest {exc.shortest_jct_s / 60:.1f} min)")
                continue
            s = executor_runs(sha, profile, catalog, seeds=args.seeds)
            print(line("elastic SHA", sha, s))
            print(f"SHA/ASHA cost {s.cost_mean / e.cost_mean:.2f}x, JCT p95 {s.jct_p95 / e.jct_p95:.2f}x")
    if args.real:
        print("\n== one real local run each (examples/asha_local.yaml: Ray nodes on this machine)")
        real_local_runs()


if __name__ == "__main__":
    main()
