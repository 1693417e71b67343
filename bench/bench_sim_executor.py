"""The real executor on simulated time (``rubberband run --cloud sim``) against the planner's prediction.

For each workload the planner plans the spec as ``rubberband run`` would; then the unchanged executor runs that
plan ``--seeds`` times on a simulated cluster (executor/simulated.py: start-ups, stragglers and trial speeds
drawn from the same fitted model, one seed per run), with the re-planner a real run has. Printed per workload:

* JCT: the median of the runs against the plan's predicted median (target: within 3%), and p10 / p90;
* P(meet deadline): the share of runs that met it against the plan's prediction (target: within 0.03);
* cost: the runs' mean against the predicted mean;
* wall seconds per run (targets: an 81-trial plan in seconds, a 729-trial one in under a minute, on 2 cores).

    python bench/bench_sim_executor.py [--seeds 50] [--workloads quickstart,hyperband,sha729,hyperband729]

Workloads: ``quickstart`` (examples/quickstart.yaml: 81-trial SHA on AWS with its head instance),
``hyperband`` (the same job as Hyperband, η = 3, 1–27 epochs: 49 trials in 4 brackets, side by side),
``sha729`` (729-trial SHA, 1–243 epochs) and ``hyperband729`` (Hyperband, 1–243 epochs: 415 trials in 6
brackets; with ``--seeds`` ≥ 2 it is timed on the first seeds only, see ``--scale-seeds``).

The third leg, the same plan run for real on the local backend beside these simulated runs and the prediction,
is ``bench/bench_sim_vs_local.py`` (it reuses :func:`simulate`).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import yaml

REPO = Path(__file__).resolve().parents[1]
QUICKSTART = REPO / "examples" / "quickstart.yaml"
START = 1_800_000_000.0  # virtual start of every run (2027-01-15): far from today's wall clock

#: name → (scheduler, deadline, confidence); None: the spec's own.
WORKLOADS = {
    "quickstart": (None, None, None),
    "hyperband": ({"kind": "hyperband", "eta": 3, "min_epochs": 1, "max_epochs": 27}, "66m", 0.9),
    "sha729": ({"kind": "sha", "trials": 729, "eta": 3, "min_epochs": 1, "max_epochs": 243}, "12h", 0.9),
    "hyperband729": ({"kind": "hyperband", "eta": 3, "min_epochs": 1, "max_epochs": 243}, "30h", 0.9),
}
SCALE = ("sha729", "hyperband729")


def write_spec(directory: Path, name: str) -> Path:
    scheduler, deadline, confidence = WORKLOADS[name]
    data = yaml.safe_load(QUICKSTART.read_text())
    data["profile"] = str((QUICKSTART.parent / data["profile"]).resolve())
    data["name"] = f"sim-{name}"
    if scheduler is not None:
        data["scheduler"] = scheduler
    if deadline is not None:
        data["deadline"] = deadline
    if confidence is not None:
        data["confidence"] = confidence
    path = directory / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@dataclass(frozen=True)
class Planned:
    """A workload as planned: its ``name`` (in run ids and scratch folders), its loaded ``inputs`` (spec, catalog,
    profile) and the ``plan`` made of them."""

    name: str
    inputs: Any
    plan: Any


def run_simulated(job: Any, seed: int, run_dir: Path, *, settings=None, curve=None) -> dict:
    """One run of ``job`` by the unchanged executor on a simulated cluster drawn with ``seed`` (its metrics from
    ``curve(config, epoch)`` where given), with the re-planner a real run has, journaled in ``run_dir``; returns
    the run's result."""
    from rubberband.executor.journal import Journal
    from rubberband.executor.run import Executor, Settings, Target
    from rubberband.executor.runtime import planner_replanner
    from rubberband.executor.simulated import simulated_for

    replanner = planner_replanner(job.catalog, job.profile)
    sim = simulated_for(job, seed=seed, start=START, curve=curve)
    journal = Journal(run_dir, clock=sim.clock, durable=False)
    target = Target(f"sim-{run_dir.name}", run_dir, sim.backend, sim.runtime, sim.cluster, sim.clock, journal)
    return Executor(job, target, settings or Settings(), replanner=replanner).run().result


def simulate(planned: Planned, seeds: int, base: Path, *, inspect=None, settings=None) -> dict:
    """Run ``planned.plan`` with the unchanged executor on ``seeds`` simulated clusters (seed 0, 1, ...) in scratch
    folders under ``base``, as ``rubberband run --cloud sim`` does; returns the figures ``main`` prints, the runs'
    ``results`` and, with ``inspect(run_dir, result)``, what it returned for each run (before its run directory is
    removed)."""
    from rubberband.executor.run import Job

    name, inputs, plan = planned.name, planned.inputs, planned.plan
    job = Job(inputs.spec, plan, inputs.catalog, inputs.profile)
    jcts, costs, walls, statuses, results, inspected = [], [], [], [], [], []
    for seed in range(seeds):
        run_dir = Path(tempfile.mkdtemp(prefix=f"{name}-{seed}-", dir=base))
        began = time.perf_counter()
        result = run_simulated(job, seed, run_dir, settings=settings)
        walls.append(time.perf_counter() - began)
        jcts.append(result["actual"]["jct_s"])
        costs.append(result["actual"]["cost_usd"])
        statuses.append(result["outcome"])
        results.append(result)
        if inspect is not None:
            inspected.append(inspect(run_dir, result))
        shutil.rmtree(run_dir, ignore_errors=True)
    predicted = plan.predicted
    trials = sum(s.trials for s in plan.stages if s.stage == 0)
    met = [j <= plan.deadline_s for j in jcts]
    return {
        "name": name,
        "trials": trials,
        "stages": len(plan.stages),
        "seeds": seeds,
        "pred_p50": predicted.jct_s.p50,
        "pred_p10": float(np.quantile(predicted.jct_samples_s, 0.1)),
        "pred_p90": float(np.quantile(predicted.jct_samples_s, 0.9)),
        "run_p50": statistics.median(jcts),
        "run_p10": float(np.quantile(jcts, 0.1)),
        "run_p90": float(np.quantile(jcts, 0.9)),
        "pred_meet": predicted.p_meet_deadline,
        "run_meet": sum(met) / len(met),
        "pred_cost": predicted.cost_usd.mean,
        "run_cost": statistics.fmean(costs),
        "wall_median": statistics.median(walls),
        "wall_max": max(walls),
        "outcomes": {o: statuses.count(o) for o in sorted(set(statuses))},
        "results": results,
        "inspected": inspected,
    }


def run_workload(name: str, seeds: int, base: Path) -> dict:
    from rubberband.inputs import load_job_inputs
    from rubberband.planning import plan_from_inputs

    inputs = load_job_inputs(write_spec(base, name))
    began = time.perf_counter()
    plan = plan_from_inputs(inputs)
    plan_s = time.perf_counter() - began
    return {**simulate(Planned(name, inputs, plan), seeds, base), "plan_s": plan_s}


def run_named(
    parser: argparse.ArgumentParser, names: str, known: dict, prefix: str, run_one: Callable[[str, Path], dict]
) -> list[dict]:
    """Run the comma-separated workloads ``names`` (each one of ``known``) in one temporary folder, in order."""
    picked = [n.strip() for n in names.split(",") if n.strip()]
    unknown = [n for n in picked if n not in known]
    if unknown:
        parser.error(f"unknown workload(s) {unknown}; pick from {', '.join(known)}")
    base = Path(tempfile.mkdtemp(prefix=prefix))
    rows = []
    try:
        for name in picked:
            rows.append(run_one(name, base))
            print(f"... {name} done", file=sys.stderr)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=50)
    parser.add_argument("--scale-seeds", type=int, default=3, help="runs of the 729-trial workloads (timing)")
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    args = parser.parse_args(argv)
    rows = run_named(
        parser,
        args.workloads,
        WORKLOADS,
        "bench-sim-",
        lambda name, base: run_workload(name, args.scale_seeds if name in SCALE else args.seeds, base),
    )
    print(
        "| workload | trials | runs | JCT p50 run / predicted | p10 | p90 | P(meet) run − predicted | "
        "cost run / predicted | wall s/run (median, max) | outcomes |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['name']} | {r['trials']} | {r['seeds']} | {r['run_p50']:.0f} / {r['pred_p50']:.0f} s = "
            f"**{r['run_p50'] / r['pred_p50']:.3f}** | {r['run_p10'] / r['pred_p10']:.3f} | "
            f"{r['run_p90'] / r['pred_p90']:.3f} | {r['run_meet']:.2f} − {r['pred_meet']:.3f} = "
            f"**{r['run_meet'] - r['pred_meet']:+.3f}** | ${r['run_cost']:.2f} / ${r['pred_cost']:.2f} = "
            f"{r['run_cost'] / r['pred_cost']:.3f} | {r['wall_median']:.2f}, {r['wall_max']:.2f} | "
            f"{r['outcomes']} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
