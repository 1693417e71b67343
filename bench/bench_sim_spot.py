"""Spot plans run by the real executor on a simulated cloud that preempts (``rubberband run --cloud sim``).

The spot counterpart of ``bench/bench_sim_executor.py``: the planner plans the quickstart with
``resources.spot: true`` (the shipped spot model, or ``--spot-model``), then the unchanged executor runs that
plan ``--seeds`` times on a simulated cloud (executor/simulated.py) that draws preemptions and sold-out requests
from the plan's own spot model (``plan.spot.zones``: the zone model the planner's simulator sampled), one seed per
run, with the re-planner a real run has. Printed per workload:

* the plan's stages (market × instances) and its spot-aware prediction: median JCT, P(meet), mean cost;
* the runs: median JCT, P(meet deadline) (a failed run — more instance losses than the executor tolerates —
  misses it), mean cost;
* per run on average: instances lost to preemption, spot requests that fell over to on-demand (no capacity),
  the executor's moves to on-demand (its ``SpotPolicy``: slack after one more restart at most the margin), and
  the share of instance-hours bought on-demand.

    python bench/bench_sim_spot.py [--seeds 20] [--workloads spot60,spot90,spot120] [--spot-model FILE]

Workloads: the quickstart (81-trial SHA, 1–27 epochs, AWS) with ``resources.spot: true`` and 60, 90 or 120
minutes to its deadline (the shipped model puts every stage on spot p3.2xlarge in us-east-1 there).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))

from bench_sim_executor import run_named  # noqa: E402  (workload selection and the scratch folder, shared)

QUICKSTART = REPO / "examples" / "quickstart.yaml"
START = 1_800_000_000.0  # virtual start of every run: far from today's wall clock

#: name → deadline of the quickstart on spot.
WORKLOADS = {"spot60": "60m", "spot90": "90m", "spot120": "120m"}


def write_spec(directory: Path, name: str) -> Path:
    data = yaml.safe_load(QUICKSTART.read_text())
    data["profile"] = str((QUICKSTART.parent / data["profile"]).resolve())
    data["name"] = f"sim-{name}"
    data["deadline"] = WORKLOADS[name]
    data["resources"] = {**data["resources"], "spot": True}
    path = directory / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def spot_figures(events: list[dict]) -> dict[str, float]:
    """One run's spot figures from its journal: instances lost, spot requests that got on-demand (no capacity),
    the executor's moves to on-demand, and the share of instance-hours bought on-demand."""
    from rubberband.executor import journal as J

    requested = {e["id"]: e for e in events if e["type"] == J.INSTANCE_REQUESTED}
    ended = {e["id"]: e["t"] for e in events if e["type"] == J.INSTANCE_TERMINATED}
    hours = {True: 0.0, False: 0.0}
    for ident, e in requested.items():
        hours[bool(e["spot"])] += max(0.0, ended.get(ident, e["t"]) - e["t"])
    decisions = [e for e in events if e["type"] == J.DECISION]
    return {
        "lost": sum(1 for e in events if e["type"] == J.INSTANCE_LOST),
        "no_capacity": sum(
            1 for e in decisions if e.get("kind") == "failover" and e.get("obtained_market") == "on_demand"
        ),
        "moved": sum(
            1
            for e in decisions
            if e.get("kind") == "spot" and e.get("market") == "on_demand" and e.get("previous") == "spot"
        ),
        "od_share": hours[False] / max(hours[True] + hours[False], 1e-9),
    }


def run_workload(name: str, seeds: int, base: Path, spot_model: str | None) -> dict:
    from rubberband.errors import ExecutionError
    from rubberband.executor import journal as J
    from rubberband.executor.run import Executor, Job, Target
    from rubberband.executor.runtime import planner_replanner
    from rubberband.executor.simulated import simulated_for
    from rubberband.inputs import load_job_inputs
    from rubberband.planning import PlanningOptions, plan_from_inputs

    inputs = load_job_inputs(write_spec(base, name))
    plan = plan_from_inputs(inputs, options=PlanningOptions(spot_model=spot_model))
    spec, catalog, profile = inputs.spec, inputs.catalog, inputs.profile
    replanner = planner_replanner(catalog, profile)
    job = Job(spec, plan, catalog, profile)
    jcts, costs, outcomes, figures, walls = [], [], [], [], []
    for seed in range(seeds):
        run_dir = Path(tempfile.mkdtemp(prefix=f"{name}-{seed}-", dir=base))
        sim = simulated_for(job, seed=seed, start=START)
        began = time.perf_counter()
        target = Target(f"sim-{name}-{seed}", run_dir, sim.backend, sim.runtime, cluster=sim.cluster, clock=sim.clock)
        try:
            result = Executor(job, target, replanner=replanner).run().result
        except ExecutionError:  # too many instances lost: result.json says how far it got
            result = json.loads((run_dir / "result.json").read_text())
        walls.append(time.perf_counter() - began)
        jcts.append(result["actual"]["jct_s"])
        costs.append(result["actual"]["cost_usd"])
        outcomes.append(result["outcome"])
        figures.append(spot_figures(list(J.iter_events(run_dir / J.JOURNAL_NAME))))
        shutil.rmtree(run_dir, ignore_errors=True)
    met = [j <= plan.deadline_s and o != "failed" for j, o in zip(jcts, outcomes)]
    return {
        "name": name,
        "deadline_s": plan.deadline_s,
        "seeds": seeds,
        "markets": " / ".join(f"{'spot' if s.spot else 'od'}×{s.instances}" for s in plan.stages),
        "pred_p50": plan.predicted.jct_s.p50,
        "pred_meet": plan.predicted.p_meet_deadline,
        "pred_cost": plan.predicted.cost_usd.mean,
        "run_p50": statistics.median(jcts),
        "run_meet": sum(met) / len(met),
        "run_cost": statistics.fmean(costs),
        "outcomes": {o: outcomes.count(o) for o in sorted(set(outcomes))},
        "spot": {k: statistics.fmean(f[k] for f in figures) for k in figures[0]},
        "wall_median": statistics.median(walls),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    parser.add_argument("--spot-model", default=None, help="spot model file (default: the shipped one)")
    args = parser.parse_args(argv)
    rows = run_named(
        parser,
        args.workloads,
        WORKLOADS,
        "bench-sim-spot-",
        lambda name, base: run_workload(name, args.seeds, base, args.spot_model),
    )
    print(
        "| workload | stages | runs | JCT p50 run / predicted | P(meet) run − predicted | cost run / predicted | "
        "outcomes | wall s/run |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['name']} | {r['markets']} | {r['seeds']} | {r['run_p50']:.0f} / {r['pred_p50']:.0f} s = "
            f"**{r['run_p50'] / r['pred_p50']:.3f}** | {r['run_meet']:.2f} − {r['pred_meet']:.3f} = "
            f"**{r['run_meet'] - r['pred_meet']:+.3f}** | ${r['run_cost']:.2f} / ${r['pred_cost']:.2f} = "
            f"**{r['run_cost'] / r['pred_cost']:.3f}** | {r['outcomes']} | {r['wall_median']:.2f} |"
        )
    print()
    print(
        "| workload | lost / run | no capacity → on-demand / run | moved to on-demand / run | "
        "on-demand share of instance-hours |"
    )
    print("|---|---|---|---|---|")
    for r in rows:
        s = r["spot"]
        print(f"| {r['name']} | {s['lost']:.2f} | {s['no_capacity']:.2f} | {s['moved']:.2f} | {s['od_share']:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
